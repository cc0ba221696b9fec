"""Energy as a tune objective: capacity per kW as the primary, J per output token as a front axis, the
refusal when the baseline's runs read no power, and the report's Energy section."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vkit.cli import tune as tune_cli
from vkit.cli._tuneargs import settings, tune_plan, workloads
from vkit.errors import UsageError
from vkit.report import model as report_model
from vkit.report.energysection import energy_section
from vkit.report.view import View
from vkit.tune.baseline import need_energy
from vkit.tune.steps.common import objectives

pytestmark = pytest.mark.unit


def parsed(*flags: str):
    return tune_cli.build_parser().parse_args(["--sandbox", "--slo", "p95_ttft_ms=1000", *flags])


def built(*flags: str):
    args = parsed(*flags)
    main, _ = workloads(args, "m")
    return settings(args, main)


def test_capacity_per_kw_is_searched_as_capacity_and_gated_on_capacity_per_kw():
    s = built("--objective", "capacity-per-kw")
    assert (s.capacity is not None, s.primary, s.objective) == (True, "slo_capacity_per_kw:+", "capacity-per-kw")
    assert s.energy_metrics() == ("slo_capacity_per_kw",)
    assert [(o.name, o.direction) for o in objectives(SimpleNamespace(s=s))] == [
        ("slo_capacity_per_kw", "max"), ("ref_mean_tpot_ms", "min")]


def test_the_energy_axis_adds_j_per_token_to_the_front_of_either_objective():
    s = built("--energy-axis")
    assert [o.name for o in objectives(SimpleNamespace(s=s))] == ["slo_capacity", "ref_mean_tpot_ms", "j_per_output_token"]
    assert s.energy_metrics() == ("j_per_output_token",)
    t = built("--objective", "throughput", "--energy-axis")
    assert [(o.name, o.direction) for o in objectives(SimpleNamespace(s=t))] == [
        ("output_throughput", "max"), ("p95_ttft_ms", "min"), ("j_per_output_token", "min")]
    assert built().energy_metrics() == ()


def test_the_twin_predicts_capacity_only_and_refuses_energy():
    with pytest.raises(UsageError, match="not board power"):
        tune_plan(parsed("--search", "twin", "--energy-axis"))
    with pytest.raises(UsageError, match="not board power"):
        tune_plan(parsed("--search", "twin", "--objective", "capacity-per-kw"))


def test_a_baseline_without_board_power_stops_an_energy_tune_with_the_runs_reason():
    docs = [{"slo_capacity": 10.0, "vkit": {"capacity": {"energy": {"available": False,
                                                                    "why": "no nvidia-smi, npu-smi or rocm-smi"}}}}]
    with pytest.raises(UsageError, match="needs slo_capacity_per_kw.*no nvidia-smi, npu-smi or rocm-smi"):
        need_energy(("slo_capacity_per_kw",), docs)
    need_energy((), docs)  # no energy objective: nothing needed
    need_energy(("j_per_output_token",), [{"j_per_output_token": 0.2}])


def result(trials: list[dict]) -> dict:
    return {"title": "t", "capacity": {"settings": {"accelerators": 4}}, "trials": trials}


def trial(tid: str, cap: float, tok: float, j: float, w: float, tpot: float, seqs: int) -> dict:
    return {"id": tid, "status": "measured", "valid": True, "config": {"max_num_seqs": seqs},
            "metrics": {"slo_capacity": cap, "capacity_output_tok_s": tok, "j_per_output_token": j, "mean_power_w": w,
                        "ref_mean_tpot_ms": tpot, "ref_per_user_output_tok_s": 1000.0 / tpot}}


def test_the_energy_section_names_the_most_capacity_and_the_fewest_joules_and_their_gap():
    v = View(result([trial("t001", 20.0, 5000.0, 0.20, 2400.0, 20.0, 64),
                     trial("t002", 25.0, 6250.0, 0.16, 2600.0, 25.0, 128),
                     trial("t003", 24.0, 6000.0, 0.12, 2200.0, 30.0, 256),
                     {"id": "t004", "status": "start_failed", "metrics": {}},
                     # step 1's single run at one load: another measurement, not in the capacity comparison
                     {"id": "t000", "status": "measured", "metrics": {"output_throughput": 2000.0, "j_per_output_token": 0.3}}]))
    s = energy_section(v)
    assert s.lines[0] == ("the most capacity: t002 (25, 0.16 J/token); the fewest J per output token: t003 (0.12 J/token, "
                          "24): 25% fewer joules per token for 4% less capacity.")
    assert [ln.split(":")[0] for ln in s.lines[1:]] == ["t003", "t002", "t001"]
    fig = next(b for b in s.blocks if getattr(b, "id", None) == "plot-energy")
    pts = {p["id"]: (p["x"], p["y"]) for ser in fig.chart.series for p in ser["points"]}
    assert pts["t002"] == (pytest.approx(40.0), pytest.approx(6250.0 / 4))  # per user: 1000/25; per accelerator: / 4
    assert [ser["label"] for ser in fig.chart.series] == ["0.12–0.12 J/token", "0.16–0.16 J/token", "0.2–0.2 J/token"]


def test_no_energy_no_section_and_the_report_still_builds():
    v = View(result([{"id": "t001", "status": "measured", "metrics": {"slo_capacity": 20.0}}]))
    assert energy_section(v).blocks == [] and energy_section(v).title in (None, "")
    ids = [s.id for s in report_model.build(result([trial("t001", 20.0, 5000.0, 0.2, 2400.0, 20.0, 64)])).sections]
    assert "energy" in ids


def test_each_run_is_judged_against_the_idle_power_measured_at_its_start():
    from vkit.tune.onerun import OneRun

    seen = []
    served = SimpleNamespace(server=lambda: SimpleNamespace(startup={"idle_w": 311.2, "ready_s": 4.0}))
    backend = SimpleNamespace(bench=lambda cfg, rec, out, intr: seen.append(cfg.idle_w) or {})
    tune = SimpleNamespace(f=SimpleNamespace(path="/x/vkit.json", dir="/x"))
    one = OneRun(None, tune, served, "/x/runs", backend, None, lambda m: None)
    one.bench(SimpleNamespace(idle_w=None), "r.jsonl", "r.json")
    one.bench(SimpleNamespace(idle_w=99.0), "r.jsonl", "r.json")  # given by hand (bench_stream --idle-power-w): kept
    assert seen == [311.2, 99.0]


def test_a_price_per_accelerator_hour_without_accelerators_is_refused_before_the_search():
    from tests.conftest import call

    # nothing listens on port 1: refused for the flags (exit 2), not after a search for the server (exit 4)
    r = call("capacity", "--url", "http://127.0.0.1:1", "--slo", "p95_ttft_ms=100", "--price-per-accelerator-hour", "2")
    assert r.code == 2 and "needs --accelerators" in r.err
