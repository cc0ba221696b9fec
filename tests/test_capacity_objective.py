"""tune's capacity objective, piece by piece: the completion rate that tells a server that keeps up
from one whose queue grows, a capacity search as one gate-comparable measurement (its estimate,
its own uncertainty, its gauge), σ between two searches that never claims zero, and the
candidates that cannot differ (no restart for them)."""

from __future__ import annotations

import math

import pytest

from vkit.decide.components import capacity_sigma
from vkit.decide.runs import gauge_of
from vkit.measure.gauge import BenchOptions
from vkit.measure.runsummary import completion_rate
from vkit.state import StateFile, new_state
from vkit.tune import capacity as cap
from vkit.tune import capmeasure, capsearch
from vkit.tune.config import CapacityObjective, Settings, Workload
from vkit.tune.context import Tune, new_tune

pytestmark = pytest.mark.unit


def fifo(rate: float, service_s: float, n: int = 200, servers: int = 1) -> list[tuple[float, float]]:
    """(start, end) of ``n`` requests arriving every 1/rate s at ``servers`` FIFO servers taking
    ``service_s`` each."""
    free = [0.0] * servers
    out = []
    for i in range(n):
        t = i / rate
        j = min(range(servers), key=lambda k: free[k])
        start = max(t, free[j])
        free[j] = start + service_s
        out.append((t, free[j]))
    return out


def test_the_completion_rate_is_the_offered_rate_until_the_server_saturates_then_its_own():
    # 10 servers of 0.1 s: 100 req/s at most
    assert completion_rate(fifo(50.0, 0.1, servers=10)) == pytest.approx(50.0, rel=0.01)
    assert completion_rate(fifo(90.0, 0.1, servers=10)) == pytest.approx(90.0, rel=0.01)
    # offered 150: the queue grows and completions come at the server's 100 req/s, however short the run
    # (100 requests: the first completions, before the queue formed, bias it by 3 %; 1000: by 0.3 %)
    assert completion_rate(fifo(150.0, 0.1, servers=10, n=100)) == pytest.approx(100.0, rel=0.04)
    assert completion_rate(fifo(150.0, 0.1, servers=10, n=1000)) == pytest.approx(100.0, rel=0.004)
    assert completion_rate([(0.0, 1.0)]) is None


def test_an_overloaded_short_run_fails_on_keep_up_whatever_its_latencies():
    slo, plan = cap.Slo({"p95_ttft_ms": 1000.0}), cap.Plan()
    ok = {"completed": 200, "duration": 2.2, "p95_ttft_ms": 300.0, "mean_e2el_ms": 400.0,
          "vkit": {"completion_rate": 99.0, "dispatch_lag_ms": {"p99": 0.3}}}
    assert cap.judge_run(ok, slo, plan, 100.0)["margin"] > 0
    over = dict(ok, vkit={"completion_rate": 80.0, "dispatch_lag_ms": {"p99": 0.3}})
    r = cap.judge_run(over, slo, plan, 100.0)
    assert r["margin"] == pytest.approx(math.log(80.0 / 95.0)) and min(r["margins"], key=r["margins"].get) == "throughput"


def test_a_search_estimate_carries_its_intervals_sd():
    plan = cap.Plan(precision=0.05)
    doc = {"estimate": {"capacity": 84.0, "interval": [80.0, 88.0]}, "curve": []}
    est, sd = capmeasure.estimate(doc, plan)
    assert est == 84.0 and sd == pytest.approx(math.log(88 / 80) / (2 * 1.96), rel=1e-3)
    # every load held: the interval's lower end, with the precision as its sd
    est, sd = capmeasure.estimate({"estimate": {"capacity": None, "interval": [80.0, None]}, "curve": []}, plan)
    assert est == 80.0 and sd == pytest.approx(math.log(1.05))
    est, _ = capmeasure.estimate({"estimate": {"capacity": None, "interval": [None, None]},
                                  "curve": [{"load": 2.0}, {"load": 4.0}]}, plan)
    assert est == 1.0  # nothing held down to 2 req/s: half of it, a bound


def _summary(load: float, ttft: float, seed_name: str = "random") -> dict:
    return {"endpoint_type": "vkit", "backend": "openai", "model_id": "m", "burstiness": 1.0, "completed": int(load * 3),
            "duration": 3.0, "request_throughput": load, "output_throughput": 128 * load, "p95_ttft_ms": ttft,
            "mean_tpot_ms": 10.0, "mean_e2el_ms": 500.0, "max_concurrent_requests": int(load / 2),
            "vkit": {"stream": True, "endpoint": "completions", "ignore_eos": True, "warmups": 0, "goodput_slo_ms": None,
                     "client": {"name": "vkit-bench_stream", "version": "1"}, "exact_rate": True, "completion_rate": load,
                     "dataset": {"name": seed_name, "random_input_len": 512, "num_prompts": int(load * 3)},
                     "dispatch_lag_ms": {"p99": 0.2}}}


def _search(knee: float) -> tuple[cap.Capacity, dict | None]:
    first: list[dict] = []

    def measure(load: float, k: int) -> dict:
        s = _summary(load, 100.0 / max(1e-3, 1 - load / knee) if load < knee else 1e5)
        first.append(s)
        return s

    res = capsearch.search(measure, cap.Slo({"p95_ttft_ms": 400.0}), cap.Plan(start=10.0))
    return res, first[0]


def test_two_searches_that_offered_different_loads_are_one_gauge_and_carry_their_answer():
    opts = BenchOptions(num_prompts=50)
    (a, fa), (b, fb) = _search(100.0), _search(160.0)
    da = capmeasure.capacity_document(a, fa, opts, seed=2, reference=None)
    db = capmeasure.capacity_document(b, fb, opts, seed=2, reference=10.0)
    assert gauge_of(da) == gauge_of(db)  # the number of prompts per point is not part of the gauge
    # P95 TTFT = 400 where 100 / (1 - r/knee) = 400: r = 0.75 knee
    assert da["slo_capacity"] == pytest.approx(75.0, rel=0.02) and db["slo_capacity"] == pytest.approx(120.0, rel=0.02)
    assert da["slo_capacity"] == da["vkit"]["capacity"]["capacity"]
    assert da["capacity_holds"] < da["slo_capacity"] < da["capacity_fails"]
    assert da["reference_load"] == da["vkit"]["capacity"]["holds"]  # a first search is its own reference: its highest hold
    assert db["reference_load"] == 10.0 and db["ref_per_user_output_tok_s"] == pytest.approx(100.0)
    # the peak in flight only over the loads that decide the answer (up to the lowest clear failure)
    assert db["peak_in_flight"] == int(db["vkit"]["capacity"]["fails"] / 2)
    assert da["vkit"]["valid"] and da["vkit"]["seed"] == 2 and da["vkit"]["capacity"]["binding_slo"] == "p95_ttft_ms"


def test_capacity_sigma_never_claims_zero_for_searches_that_landed_on_one_grid_point():
    docs = [{"slo_capacity": 80.0, "slo_capacity_sd": 0.03}, {"slo_capacity": 80.0, "slo_capacity_sd": 0.03}]
    assert capacity_sigma(0.0, docs) == pytest.approx(0.03)
    # from two searches, their spread at least their own sd; from three, their spread alone (it holds their error)
    assert capacity_sigma(0.04, docs) == pytest.approx(0.04)
    assert capacity_sigma(0.02, docs) == pytest.approx(0.03)
    assert capacity_sigma(0.02, docs + docs[:1]) == pytest.approx(0.02)


@pytest.fixture
def runner(state_path, tmp_path):
    sf = StateFile(state_path)
    sf.create(new_state("http://127.0.0.1:9", "m", ["serve", "m"], {"max_num_seqs": 64, "max_num_batched_tokens": 4096}))
    w = Workload(BenchOptions(num_prompts=50, max_concurrency=16))
    objective = CapacityObjective(slo=cap.Slo({"p95_ttft_ms": 1000.0}), plan=cap.Plan())
    return new_tune(sf, Settings(workload=w, capacity=objective), lambda m: None, tool_name="tune")


def _measured(runner: Tune, config: dict, peak: int) -> str:
    import json
    import os

    t = runner.trials.new("3", config, "test")
    path = os.path.join(runner.runs_dir, t["id"], "rep1.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    json.dump({"slo_capacity": 50.0, "peak_in_flight": peak}, open(path, "w"))
    runner.sf.tune.update_trial(t["id"], status="done", valid=True, metrics={"slo_capacity": 50.0},
                        runs=[os.path.relpath(path, runner.sf.dir)])
    return t["id"]


def test_candidates_that_cannot_differ_are_named_with_the_trial_they_equal(runner):
    tid = _measured(runner, {"max_num_seqs": 64, "max_num_batched_tokens": 8192}, peak=40)
    same = runner.trials.cannot_differ({"max_num_seqs": 64, "max_num_batched_tokens": 8192})
    assert same is not None and same[1] == tid and "same configuration" in same[0]
    # 40 requests at most in flight: 48 and 128 sequences bind as little as 64
    for seqs in (48, 128):
        same = runner.trials.cannot_differ({"max_num_seqs": seqs, "max_num_batched_tokens": 8192})
        assert same is not None and same[1] == tid and "never held more than 40" in same[0]
    assert runner.trials.cannot_differ({"max_num_seqs": 32, "max_num_batched_tokens": 8192}) is None  # 32 < 40 may bind
    assert runner.trials.cannot_differ({"max_num_seqs": 128, "max_num_batched_tokens": 2048}) is None  # another budget too
    refused = runner.trials.cannot_differ({"max_num_seqs": 8, "max_num_batched_tokens": 1024, "max_model_len": 4096,
                                    "enable_chunked_prefill": False})
    assert refused is not None and refused[1] is None and "refuses" in refused[0]


def test_a_skipped_candidate_carries_the_measurement_it_equals_and_costs_no_restart(runner):
    tid = _measured(runner, {"max_num_seqs": 64, "max_num_batched_tokens": 8192}, peak=40)
    t = runner.trials.skip("3", {"max_num_seqs": 128, "max_num_batched_tokens": 8192}, "step 3", "why", tid)
    assert t["status"] == "skipped" and t["same_as"] == tid and t["metrics"] == {"slo_capacity": 50.0} and t["runs"] == []
    events = [e["event"] for e in runner.sf.log.read()]
    assert "skip" in events and "applied" not in events


def test_the_capacity_is_the_servers_not_the_clients_ceiling():
    """The knee comes from the server: a search's answer does not move with the most load the client
    may offer, as long as that ceiling lies above the server's capacity (the closed-loop objective's
    client concurrency did move it: the server could never hold more than it)."""
    from tests.test_capacity import fake_server

    slo = cap.Slo({"p95_ttft_ms": 200.0})
    for ceiling in (120.0, 1000.0, 10_000.0):
        measure, _ = fake_server(knee=100.0)
        res = capsearch.search(measure, slo, cap.Plan(start=8.0, hi_limit=ceiling))
        # P95 TTFT = 50 / (1 - r/100) = 200 at r = 75, whatever the ceiling; the interval is the noise's width
        assert res.model.lo <= 75.0 <= res.model.hi and res.model.half_width() < 0.1, (ceiling, res.model)


def test_the_goals_pick_is_a_front_member_confirmed_more_interactive_with_its_capacity_guarded(runner):
    from vkit.tune import steps

    # under the capacity objective an interactivity claim is confirmed with the capacity guarded
    assert steps.claim_guards(runner, "ref_mean_tpot_ms:-") == ["slo_capacity:+:5%"]
    assert steps.claim_guards(runner, "slo_capacity:+") == []
    front = [
        {"trial_id": "kept", "metrics": {"ref_mean_tpot_ms": 5.0}, "confirmation": {"decision": "kept"}},
        {"trial_id": "t004", "metrics": {"ref_mean_tpot_ms": 4.0},
         "confirmation": {"decision": "accept", "claim": "ref_mean_tpot_ms:-"}},
        {"trial_id": "t006", "metrics": {"ref_mean_tpot_ms": 3.0},
         "confirmation": {"decision": "undecided", "claim": "ref_mean_tpot_ms:-"}},
        {"trial_id": "t007", "metrics": {"ref_mean_tpot_ms": 4.5},
         "confirmation": {"decision": "accept", "claim": "ref_mean_tpot_ms:-"}},
    ]
    assert steps.more_interactive(runner, front)["trial_id"] == "t004"  # the lowest TPOT among the accepted
    assert steps.more_interactive(runner, front[:1] + front[2:3]) is None  # an undecided claim picks nothing
