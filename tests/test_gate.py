"""gate: the CLI contract on fixture summaries (tests/golden/gate, see make_fixtures.py) and the
library's refusals. The fixtures are real bench_stream summaries from sim_server, rescaled:
aa_* share one distribution (σ = 2%), gain_c* carry a true +12% throughput."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, call
from vkit.decide import gate as vg
from vkit.decide import rule
from vkit.errors import InvalidData, UsageError
from vkit.state import StateFile, new_state

G = os.path.join(REPO, "tests", "golden", "gate")


def f(name: str) -> str:
    return os.path.join(G, name)


def runs(prefix: str, n: int, start: int = 1) -> list[str]:
    return [f(f"{prefix}{i}.json") for i in range(start, start + n)]


def gate(*argv: str):
    r = call("gate", *argv)
    doc = json.loads(r.out) if r.out.strip().startswith("{") else None
    return r, doc


# --------------------------------------------------------------------------- the contract


def test_aa_is_not_accepted():
    r, d = gate("--baseline", *runs("aa_b", 6), "--candidate", *runs("aa_c", 6))
    assert r.code in (1, 6), r
    assert d["decision"] != "accept"
    p = d["primary"]
    assert p["metric"] == "output_throughput" and p["role"] == "primary"
    for key in ("change", "interval", "p_value", "e_value", "threshold", "sigma", "n_needed", "n_had", "decision", "why"):
        assert key in p
    assert "gate: " in r.err and "output_throughput" in r.err  # the human table on stderr


def test_aa_fixed_is_not_accepted():
    r, d = gate("--fixed", "--baseline", *runs("aa_b", 6), "--candidate", *runs("aa_c", 6))
    assert r.code == 1 and d["decision"] == "reject" and d["mode"] == "fixed"
    assert d["primary"]["method"] == "paired t"


def test_clear_gain_is_accepted():
    r, d = gate("--baseline", *runs("aa_b", 6), "--candidate", *runs("gain_c", 6))
    assert r.code == 0, r
    p = d["primary"]
    assert d["decision"] == "accept" and p["decision"] == "improves"
    assert 0.08 < p["change"] < 0.16
    assert p["interval"][0] > 0 and p["change"] >= p["threshold"]
    assert p["threshold"] == pytest.approx(max(2 * p["sigma"], 0.03))
    assert p["method"].startswith("t-mixture")
    assert "output_throughput" in d["changed"]["metrics"] and d["changed"]["method"] == "e-BH"
    assert d["design"]["layout"] == "interleaved"
    assert all(v["verdict"] == "valid" for v in d["validity"])


def test_clear_gain_fixed_and_with_pooled_sigma():
    r, d = gate("--fixed", "--baseline", *runs("aa_b", 6), "--candidate", *runs("gain_c", 6))
    assert r.code == 0 and d["decision"] == "accept"
    r, d = gate("--sigma", "output_throughput=2%", "--baseline", *runs("aa_b", 6), "--candidate", *runs("gain_c", 6))
    assert r.code == 0 and d["primary"]["method"].startswith("normal-mixture")
    assert d["primary"]["sigma_source"].startswith("pooled")


def test_invalid_input_refused_with_exit_3():
    r, d = gate("--baseline", *runs("aa_b", 3), "--candidate", *runs("aa_c", 2), f("sample_nostream.json"))
    assert r.code == 3 and d is None
    assert "sample_nostream.json" in r.err and "invalid" in r.err and "ttft_e2el_identity" in r.err


def test_different_gauge_refused_naming_the_difference():
    # a candidate run on a request set (seed) the baseline never measured
    r, _ = gate("--baseline", *runs("aa_b", 3), "--candidate", *runs("aa_c", 2), f("gauge_seed_c1.json"))
    assert r.code == 3
    assert "different gauge" in r.err and "seed" in r.err and "no baseline run used" in r.err


def _with_seed(src: str, seed: int, dst) -> str:
    d = json.loads(open(src).read())
    d["vkit"]["seed"] = seed
    dst.write_text(json.dumps(d))
    return str(dst)


def test_repeat_k_may_use_seed_k_on_both_sides(tmp_path):
    base = [_with_seed(p, k, tmp_path / f"b{k}.json") for k, p in enumerate(runs("aa_b", 3), 1)]
    cand = [_with_seed(p, k, tmp_path / f"c{k}.json") for k, p in enumerate(runs("aa_c", 2), 1)]
    r, d = gate("--baseline", *base, "--candidate", *cand)
    assert r.code in (1, 6), r  # judged, not refused
    assert d["design"]["pairs"] == 2
    # a dataset difference other than the seed is still a different gauge
    other = json.loads(open(cand[0]).read())
    other["vkit"]["dataset"]["random_input_len"] += 1
    (tmp_path / "c_other.json").write_text(json.dumps(other))
    r, _ = gate("--baseline", *base, "--candidate", str(tmp_path / "c_other.json"))
    assert r.code == 3 and "random_input_len" in r.err


def test_vkit_and_plain_vllm_results_do_not_mix():
    r, _ = gate("--baseline", *runs("aa_b", 3), "--candidate", *runs("aa_c", 2), f("plain_vllm_c1.json"))
    assert r.code == 3 and "vllm-bench" in r.err
    # what differs is said by name: the client, and what only the vkit summary records
    assert "client (vkit bench_stream 0.1.0 vs vllm bench serve)" in r.err, r.err
    assert "recorded only by the vkit summary: " in r.err and "vkit.stream" in r.err and "vkit.dataset" in r.err
    assert "input tokens per request" not in r.err  # 1024 per request on both sides: not a difference


def test_cross_gauge_differences_name_fields_and_input_lengths(tmp_path):
    vk = json.loads(open(runs("aa_b", 1)[0]).read())
    plain = json.loads(open(f("plain_vllm_c1.json")).read())
    plain["num_prompts"], plain["total_input_tokens"] = 100, plain["total_input_tokens"] + 23
    text = vg.cross_gauge_differences(plain, vg.gauge_of(plain)[1], vk, vg.gauge_of(vk)[1])
    assert text.split("; ")[:3] == ["client (vllm bench serve vs vkit bench_stream 0.1.0)", "num_prompts (100 vs 200)",
                                    "input tokens per request (1024.12 vs 1024)"], text
    assert "recorded only by the vkit summary: vkit.client, vkit.dataset" in text and "by the vllm-bench summary" not in text


def test_too_few_runs_is_undecided_with_the_number_needed():
    r, d = gate("--baseline", *runs("aa_b", 2), "--candidate", *runs("aa_c", 2))
    assert r.code == 6, r
    assert d["decision"] == "undecided"
    p = d["primary"]
    assert p["n_needed"] > p["n_had"]["pairs"] == 2
    assert d["more_runs"]["candidate"] >= p["n_needed"] - 2 and d["more_runs"]["baseline"] >= 1
    assert "needed" in d["why"] and "more run" in d["why"]


def test_fixed_too_few_runs_asks_for_the_planned_n():
    r, d = gate("--fixed", "--baseline", *runs("aa_b", 2), "--candidate", *runs("aa_c", 2))
    assert r.code == 6
    assert d["more_runs"]["candidate"] == d["primary"]["n_needed"] - 2


def test_guards_intersection_union():
    r, d = gate("--baseline", *runs("aa_b", 6), "--candidate", *runs("gain_c", 6), "--guard", "p95_ttft_ms:-:5%,mean_tpot_ms")
    assert r.code == 0, r
    roles = {g["metric"]: g for g in d["guards"]}
    assert roles["p95_ttft_ms"]["threshold"] == 0.05 and roles["p95_ttft_ms"]["decision"] == "ok"
    assert roles["mean_tpot_ms"]["threshold_rule"] == "max(2σ, floor)"
    # A guard the candidate clearly violates (throughput as a lower-is-better guard): rejected.
    r, d = gate("--baseline", *runs("aa_b", 6), "--candidate", *runs("gain_c", 6), "--guard", "request_throughput:-:2%")
    assert r.code == 1 and d["decision"] == "reject" and "request_throughput" in d["why"]


def test_lower_is_better_primary():
    r, d = gate("--primary", "mean_e2el_ms", "--baseline", *runs("aa_b", 6), "--candidate", *runs("gain_c", 6))
    assert r.code == 0 and d["primary"]["direction"] == "-" and d["primary"]["change"] < -0.08


def test_winner_of_a_search_needs_fresh_runs():
    r, d = gate("--selected-from", "16", "--baseline", *runs("aa_b", 6), "--candidate", *runs("gain_c", 6))
    assert r.code == 6 and "fresh" in d["why"] and "winner" in d["why"]
    # Fresh confirmation runs are the only evidence; the screening runs are listed apart.
    r, d = gate("--selected-from", "16", "--baseline", *runs("aa_b", 6), "--candidate", *runs("aa_c", 3),
                "--fresh", *runs("gain_c", 6))
    assert r.code == 0, r
    assert d["design"]["fresh_runs"] == 6 and d["design"]["screening_runs_ignored"] == 3
    assert d["runs"]["screening"] and all("aa_c" in p for p in d["runs"]["screening"])


def test_same_run_twice_is_refused():
    r, _ = gate("--baseline", *runs("aa_b", 3), "--candidate", f("aa_b1.json"), f("aa_c2.json"))
    assert r.code == 3 and "same run" in r.err


def test_usage_errors():
    assert gate("--candidate", f("aa_c1.json"))[0].code == 2
    assert gate("--baseline", f("aa_b1.json"))[0].code == 2
    r, _ = gate("--baseline", f("aa_b1.json"), "--candidate", f("aa_c1.json"), "--primary", "foo")
    assert r.code == 2 and "foo:+" in r.err
    r, _ = gate("--baseline", f("aa_b1.json"), "--candidate", f("aa_c1.json"), "--primary", "output_throughput:+:5%")
    assert r.code == 2
    r, _ = gate("--baseline", f("nope.json"), "--candidate", f("aa_c1.json"))
    assert r.code == 2 and "no such file" in r.err
    r, _ = gate("--baseline", f("aa_b1.json"), "--candidate", f("aa_c1.json"), "--alpha", "0.7")
    assert r.code == 2


def test_human_table_on_stdout():
    r = call("gate", "--human", "--baseline", *runs("aa_b", 6), "--candidate", *runs("gain_c", 6))
    assert r.code == 0 and r.out.startswith("gate: ACCEPT") and "primary" in r.out and not r.out.lstrip().startswith("{")


def test_blocked_runs_are_flagged(tmp_path):
    # Same values, dates rewritten so that all baseline runs come first.
    paths = []
    for i, name in enumerate([f"aa_b{j}.json" for j in range(1, 5)] + [f"gain_c{j}.json" for j in range(1, 5)]):
        with open(f(name)) as fh:
            doc = json.load(fh)
        doc["date"] = f"20260102-10{i:02d}00"
        p = tmp_path / name
        p.write_text(json.dumps(doc))
        paths.append(str(p))
    r, d = gate("--baseline", *paths[:4], "--candidate", *paths[4:])
    assert d["design"]["layout"] == "blocked"
    assert any("blocked" in w and "interleave" in w for w in d["warnings"])
    assert d["primary"]["method"].startswith("t-mixture")


def test_stale_baseline_refused():
    r, _ = gate("--changed-at", "2026-01-01T12:03:30", "--baseline", *runs("aa_b", 6), "--candidate", *runs("aa_c", 6))
    assert r.code == 3 and "predate the change point" in r.err and "--ignore-drift" in r.err
    r, _ = gate("--ignore-drift", "--changed-at", "2026-01-01T12:03:30", "--baseline", *runs("aa_b", 6), "--candidate", *runs("aa_c", 6))
    assert r.code in (1, 6)


# --------------------------------------------------------------------------- library


def _checker(verdicts: dict):
    def check(path: str):
        v = verdicts.get(os.path.basename(path), "valid")
        code = {"valid": 0, "anomaly": 1, "invalid": 3}[v]
        return code, {"verdict": v, "checks": [{"id": "littles_law", "status": "fail"}] if code else []}, ""

    return check


def test_anomaly_refused_unless_allowed():
    inp = vg.GateInput(baseline=runs("aa_b", 6), candidate=runs("gain_c", 6))
    with pytest.raises(InvalidData, match="allow-anomaly"):
        vg.decide(inp, checker=_checker({"gain_c2.json": "anomaly"}))
    inp = vg.GateInput(baseline=runs("aa_b", 6), candidate=runs("gain_c", 6), settings=vg.Settings(allow_anomaly=True))
    res = vg.decide(inp, checker=_checker({"gain_c2.json": "anomaly"}))
    assert res["decision"] == "accept" and any("anomaly" in w for w in res["warnings"])


def test_parse_metric():
    m = vg.parse_metric("p95_ttft_ms:-:5%", "guard")
    assert (m.name, m.direction, m.tolerance) == ("p95_ttft_ms", -1, 0.05)
    assert vg.parse_metric("output_throughput", "primary").direction == 1
    assert vg.parse_metric("mean_e2el_ms", "primary").direction == -1
    assert vg.parse_metric("x:+:0.1", "guard").tolerance == 0.1
    for bad in ("x", "x:*", "x:+:150%", "x:+:abc"):
        with pytest.raises(UsageError):
            vg.parse_metric(bad, "guard")
    assert [g.name for g in vg.parse_guards(["a_ms:-,b_ms", "c_throughput"])] == ["a_ms", "b_ms", "c_throughput"]


def test_thresholds_on_logs():
    # +t means c/b >= 1 + t; for lower-is-better, c/b <= 1 - t.
    assert rule.threshold_log(0.04, 1) == pytest.approx(0.0392207)
    assert rule.threshold_log(0.04, -1) == pytest.approx(0.0408220)
    assert rule.tolerance_log(0.05, -1) == pytest.approx(-0.0487902)


def test_rule_codes_vectorised():
    import numpy as np

    est = np.array([0.10, 0.0, 0.02])
    lo = np.array([0.05, -0.05, -0.01])
    hf = np.array([0.2, 0.02, 0.06])
    hc = np.array([0.15, 0.03, 0.05])
    codes = rule.call_primary(est, lo, hf, hc, np.array([6, 6, 6]), 5, 0.04)
    assert codes.tolist() == [1, -1, 0]


# --------------------------------------------------------------------------- state file


def _state_with_trial(tmp_path, **trial) -> str:
    path = str(tmp_path / "st" / "vkit.json")
    sf = StateFile(path)
    doc = new_state("http://127.0.0.1:8000", "sim-8b", ["vllm", "serve", "x"])
    doc["trials"] = [{"id": "t1", "config": {"max_num_seqs": 64}, **trial}]
    sf.create(doc)
    return path


def test_trial_from_state_and_record(tmp_path):
    st = _state_with_trial(tmp_path, baseline=runs("aa_b", 6), candidate=runs("gain_c", 6))
    r, d = gate("--state", st, "--trial", "t1", "--record")
    assert r.code == 0, r
    assert d["trial"] == "t1" and d["decision_id"]
    s = StateFile(st).read()
    assert s["trials"][0]["verdict"] == "accept" and s["trials"][0]["gate"]["decision_id"] == d["decision_id"]
    events = StateFile(st).log.read()
    assert events[-1]["tool"] == "gate" and events[-1]["trial"] == "t1"


def test_trial_state_pieces(tmp_path):
    st = _state_with_trial(tmp_path, baseline=runs("aa_b", 6), candidate=[{"path": p, "fresh": True} for p in runs("gain_c", 6)],
                           selected_from=8)
    r, d = gate("--state", st, "--trial", "t1")
    assert r.code == 0 and d["design"]["fresh_runs"] == 6 and d["design"]["selected_from"] == 8
    assert gate("--state", st, "--trial", "nope")[0].code == 2
    st2 = _state_with_trial(tmp_path / "b", baseline=runs("aa_b", 2), candidate=runs("aa_c", 2), valid=False)
    assert gate("--state", st2, "--trial", "t1")[0].code == 3
    assert gate("--state", st, "--trial", "t1", "--baseline", f("aa_b1.json"))[0].code == 2
    assert gate("--baseline", f("aa_b1.json"), "--candidate", f("aa_c1.json"), "--record")[0].code == 2


def test_state_sigma_and_change_date(tmp_path):
    st = _state_with_trial(tmp_path, baseline=runs("aa_b", 6), candidate=runs("gain_c", 6))
    sf = StateFile(st)
    with sf.transaction() as s:
        s["sigma_baseline"] = {"output_throughput": {"sigma": 0.02, "n": 16}}
    r, d = gate("--state", st, "--trial", "t1")
    assert r.code == 0 and d["primary"]["method"].startswith("normal-mixture")
    with sf.transaction() as s:
        s["drift"] = {"change_date": "2026-01-01T12:05:30"}
    r, _ = gate("--state", st, "--trial", "t1")
    assert r.code == 3 and "change point" in r.err


@pytest.mark.e2e
def test_real_script_in_a_pipe():
    cmd = (f"'{sys.executable}' bin/gate -q --baseline {' '.join(runs('aa_b', 6))} --candidate {' '.join(runs('gain_c', 6))}"
           f" | '{sys.executable}' -c 'import json,sys; print(json.load(sys.stdin)[\"decision\"])'")
    p = subprocess.run(cmd, shell=True, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "accept", p.stderr


def _policy(tmp_path, monkeypatch, edit) -> None:
    from vkit.apply.policy import DEFAULT_POLICY

    data = json.load(open(DEFAULT_POLICY))
    edit(data)
    p = tmp_path / "params.json"
    p.write_text(json.dumps(data))
    monkeypatch.setenv("VKIT_POLICY", str(p))


def test_gate_reads_the_policy_repeats_rule(tmp_path, monkeypatch):
    r, d = gate("--baseline", *runs("aa_b", 6), "--candidate", *runs("gain_c", 6))
    assert r.code == 0 and d["decision"] == "accept"
    # the same runs under a policy that asks for 8 repeats before a gate: no verdict yet, and why
    _policy(tmp_path, monkeypatch, lambda d: next(r for r in d["must_run"] if r["check"] == "repeats").update(min=8))
    r, d = gate("--baseline", *runs("aa_b", 6), "--candidate", *runs("gain_c", 6))
    assert r.code == 6 and d["decision"] == "undecided" and "rule R3" in d["why"]
    assert d["more_runs"]["baseline"] == 2
    # a σ pooled from earlier repeats satisfies the rule
    r, d = gate("--sigma", "output_throughput=2%", "--baseline", *runs("aa_b", 6), "--candidate", *runs("gain_c", 6))
    assert r.code == 0


def test_gate_refuses_when_a_must_run_check_of_the_policy_was_not_run(tmp_path, monkeypatch):
    rule = {"id": "R9", "check": "soak", "when": "before every gate", "why": "site rule: a soak run first"}
    _policy(tmp_path, monkeypatch, lambda d: d["must_run"].append(rule))
    r, d = gate("--baseline", *runs("aa_b", 6), "--candidate", *runs("gain_c", 6))
    assert r.code == 3 and d is None
    assert "must-run check soak" in r.err and "rule R9" in r.err
    r, d = gate("--ran", "soak", "--baseline", *runs("aa_b", 6), "--candidate", *runs("gain_c", 6))
    assert r.code == 0 and d["must_run"]["declared"] == ["soak"]


def test_one_percentage_parser():
    from vkit.cli._common import fraction_arg
    from vkit.decide.percent import parse_fraction

    assert parse_fraction("3%", "--floor") == pytest.approx(0.03) and parse_fraction(" 0.2 ", "x") == 0.2
    with pytest.raises(UsageError, match="between 0 and 100%"):
        parse_fraction("150%", "--sigma")
    assert parse_fraction("0", "--floor", open_unit=False) == 0.0
    assert fraction_arg(open_unit=False)("0.7") == 0.7
    assert vg.parse_metric("p95_ttft_ms:-:5%", "guard").tolerance == parse_fraction("5%", "t")


def test_the_threshold_takes_the_sigma_of_one_run_and_the_test_the_clustered_sigma():
    # a tune's evidence clusters runs on server processes: the sequential test runs at the clustered
    # σ (sigma_pool), the practical bar max(2σ, floor) at the σ of one run (sigma_threshold)
    base = dict(baseline=runs("aa_b", 6), candidate=runs("gain_c", 6), check_drift=False)
    pooled = vg.decide(vg.GateInput(**base, sigma_pool={"output_throughput": 0.04}))["primary"]
    split = vg.decide(vg.GateInput(**base, sigma_pool={"output_throughput": 0.04},
                                   sigma_threshold={"output_throughput": 0.025}))["primary"]
    assert pooled["threshold"] == pytest.approx(0.08) and split["threshold"] == pytest.approx(0.05)
    assert split["sigma"] == pooled["sigma"] == pytest.approx(0.04)  # the test's σ is unchanged
    assert split["threshold_sigma"] == pytest.approx(0.025) and "threshold_sigma" not in pooled
    # without a pooled σ the test estimates σ from the runs, and the threshold follows it
    alone = vg.decide(vg.GateInput(**base, sigma_threshold={"output_throughput": 0.001}))["primary"]
    assert alone["threshold"] == pytest.approx(max(2 * alone["sigma"], 0.03))
