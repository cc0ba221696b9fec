"""Seed 000's step semantics in the staged tune: step 1's TTFT stability threshold, step 4's grid
centred on step 3's knee (kept or not), step 5's flips (production flags turned on where they are
off; the priority policy only on a workload with priority classes)."""

from __future__ import annotations

import json

import pytest
from scipy import stats

from vkit import search
from vkit.apply.policy import Policy
from vkit.errors import Rejected, VkitError
from vkit.measure.gauge import BenchOptions
from vkit.state import StateFile, new_state, now_iso
from vkit.tune import steps
from vkit.tune.config import Settings, Workload
from vkit.tune.context import Tune, new_tune
from vkit.tune.steps import ablation

pytestmark = pytest.mark.unit


def test_step1_threshold_is_the_p95_over_mean_of_an_exponential_wait():
    # plain queueing: an exponential wait has P95 = mean * ln 20; a heavier tail is the server stalling
    assert steps.STEP1_TTFT_RATIO == pytest.approx(stats.expon.ppf(0.95) / stats.expon.mean(), rel=1e-12)
    assert steps.STEP1_TTFT_RATIO == pytest.approx(2.9957, abs=1e-4)


@pytest.mark.parametrize("kept, prios, flips, not_run", [
    ({}, [], [], 3),  # vLLM's defaults: both production flags on; no priority classes
    ({"enable_prefix_caching": False}, [], [("enable_prefix_caching", True)], 2),
    ({"enable_chunked_prefill": False, "enable_prefix_caching": False}, [0],
     [("enable_chunked_prefill", True), ("enable_prefix_caching", True)], 1),
    ({}, [0, 5], [("scheduling_policy", "priority")], 2),
    ({"scheduling_policy": "priority"}, [0, 5], [], 3),
    ({"enable_chunked_prefill": True, "enable_prefix_caching": True}, [1, 2, 3], [("scheduling_policy", "priority")], 2),
])
def test_step5_turns_production_flags_on_and_tries_priority_only_with_classes(kept, prios, flips, not_run):
    got, why = steps.step5_flips(kept, prios)
    assert got == flips
    assert len(why) == not_run
    if len(prios) == 1:
        assert any("one priority class (0)" in w for w in why)
    if not prios and kept.get("scheduling_policy", "fcfs") == "fcfs":
        assert any("no priority classes" in w for w in why)


def test_workload_priorities_read_from_the_prompt_file(tmp_path):
    p = tmp_path / "w.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in [
        {"prompt": "a", "output_len": 4, "priority": 2}, {"prompt": "b", "output_len": 4},
        {"prompt": "c", "output_len": 4, "priority": 0}, {"prompt": "d", "output_len": 4, "priority": 2}]))
    w = Workload(BenchOptions(dataset_name="jsonl", dataset_path=str(p), num_prompts=4))
    assert steps.workload_priorities(w) == [0, 2]
    assert steps.workload_priorities(Workload(BenchOptions(num_prompts=4))) == []


def _runner(tmp_path, kept: dict) -> Tune:
    sf = StateFile(str(tmp_path / "st" / "vkit.json"))
    sf.create(new_state("http://127.0.0.1:9", "m", ["serve", "m"], kept))
    return new_tune(sf, Settings(workload=Workload(BenchOptions(num_prompts=50)), slo={"p95_ttft_ms": 2000}),
                  lambda m: None, tool_name="tune")


def _add_step3(runner: Tune, sweep: dict[int, float], tokens: int) -> None:
    with runner.sf.transaction() as st:
        for i, (seqs, thr) in enumerate(sweep.items()):
            st["trials"].append({"id": f"t{i:03d}", "step": "3", "status": "done", "valid": True, "verdict": "undecided",
                                 "config": {"max_num_batched_tokens": tokens, "max_num_seqs": seqs}, "runs": [],
                                 "metrics": {"output_throughput": thr, "p95_ttft_ms": 100.0 + seqs}})
    runner.sf.tune.record_step({"step": "3", "name": "max-num-seqs", "finished": now_iso(), "stop_rule": "x"})


def test_step4_grid_centres_on_the_step3_knee_not_the_kept_value(tmp_path):
    # step 3 swept seqs at 8192 tokens; 128 adds 1.2 % over 64: the knee is 64. Its confirmation
    # was not kept, so the kept configuration still has 16 sequences.
    r = _runner(tmp_path, {"max_num_batched_tokens": 8192, "max_num_seqs": 16})
    _add_step3(r, {8: 100.0, 16: 180.0, 32: 300.0, 64: 400.0, 128: 405.0}, 8192)
    space = search.space_from_policy(Policy.load(), ["max_num_batched_tokens", "max_num_seqs"], frozen={})
    assert steps.step3_knee(r, space, dict(r.sf.read()["kept"]["config"]), None, {}) == 64
    nxt, _ = steps.staged_proposer(r, Policy.load(), "4")
    prop = nxt(steps.observations(r))
    assert prop is not None and prop.step == "4"
    # the geometric midpoints around 64 (45.3 between 32 and 64, 90.5 between 64 and 128), snapped to
    # the parameter's grid: 48 or 96; around the kept 16 they would be 12 or 24
    assert prop.config["max_num_seqs"] in (48, 96)
    assert "max_num_seqs=64" in prop.reason


def test_step4_without_a_finished_step3_centres_on_the_kept_value(tmp_path):
    r = _runner(tmp_path, {"max_num_batched_tokens": 8192, "max_num_seqs": 16})
    space = search.space_from_policy(Policy.load(), ["max_num_batched_tokens", "max_num_seqs"], frozen={})
    assert steps.step3_knee(r, space, dict(r.sf.read()["kept"]["config"]), None, {}) is None
    nxt, _ = steps.staged_proposer(r, Policy.load(), "4")
    prop = nxt(steps.observations(r))
    assert "max_num_seqs=16" in prop.reason
    assert prop.config["max_num_seqs"] in (12, 24)


def test_step5_measures_each_flip_on_its_own_workload_and_nothing_when_none(tmp_path, monkeypatch):
    prompts = tmp_path / "w.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": "p", "output_len": 4, "priority": k % 2}) + "\n" for k in range(6)))
    r = _runner(tmp_path, {"enable_prefix_caching": False})
    r.s.workload = Workload(BenchOptions(dataset_name="jsonl", dataset_path=str(prompts), num_prompts=6))
    mixed = Workload(BenchOptions(dataset_name="mixed", num_prompts=6), name="mixed")
    calls = []

    def run_trial(tid, versus, repeats=None):
        calls.append(("trial", r.ledger.trial(tid)["config"], versus.key, versus.workload.name))
        assert versus.metrics(r.s) == ("p99_ttft_ms:-", ["output_throughput:+:5%"])  # the flips' own metrics, not the tune's
        r.sf.tune.update_trial(tid, status="done", valid=True, verdict="reject", metrics={"p99_ttft_ms": 1.0})
        return r.ledger.trial(tid)

    monkeypatch.setattr(r.baselines, "measure", lambda versus, **kw: calls.append(("baseline", versus.key, versus.workload.name)))
    monkeypatch.setattr(r.budget, "confirm_plan", lambda *a, **kw: {"fits": True})
    monkeypatch.setattr(r.trials, "run", run_trial)
    monkeypatch.setattr(r.seat, "settle", lambda: None)
    rec = steps.run_step5(r, mixed, lambda m: None)
    assert calls == [
        ("baseline", "baseline_mixed", "mixed"),
        ("trial", {"enable_prefix_caching": True}, "baseline_mixed", "mixed"),
        ("baseline", "baseline_priority", "main"),
        ("trial", {"enable_prefix_caching": False, "scheduling_policy": "priority"}, "baseline_priority", "main"),
    ]
    assert rec["not_run"] == ["enable_chunked_prefill is already on"] and len(rec["trials"]) == 2
    # defaults and no priority classes: nothing is measured, and the record says why
    r2 = _runner(tmp_path / "b", {})
    calls.clear()
    monkeypatch.setattr(r2.baselines, "measure", lambda **kw: calls.append("baseline"))
    rec2 = steps.run_step5(r2, mixed, lambda m: None)
    assert calls == [] and rec2["trials"] == [] and rec2["result"].startswith("nothing to validate")


def test_auto_ablation_runs_once_per_multi_parameter_keep_and_only_after_a_keep(tmp_path, monkeypatch):
    r = _runner(tmp_path, {"max_num_batched_tokens": 2048, "max_num_seqs": 4})
    new = {"max_num_batched_tokens": 4096, "max_num_seqs": 32}
    kid = r.sf.log.append("tune", "keep", config=new, previous={"config": {"max_num_batched_tokens": 2048, "max_num_seqs": 4}})
    with r.sf.transaction() as st:
        st["kept"] = {"config": dict(new), "decision_id": kid, "since": now_iso(), "decision": "gate"}
    ran = []

    def fake(runner, progress):
        ran.append(1)
        out = {"decision_id": kid, "previous": {}, "kept": new, "attribution": ["max_num_seqs"],
               "switches": [{"param": "max_num_seqs", "from": 4, "to": 32, "metric": "output_throughput", "change": 0.9, "verdict": "accept"},
                            {"param": "max_num_batched_tokens", "from": 2048, "to": 4096, "metric": "output_throughput",
                             "change": 0.01, "verdict": "reject"}]}
        runner.sf.tune.record_ablation(out)
        return out

    monkeypatch.setattr(ablation, "run_ablation", fake)  # auto_ablate calls it in its own module
    r.sf.tune.record_step({"step": "2", "finished": now_iso(), "stop_rule": "budget spent", "confirmed": {"decision": "reject"}})
    assert steps.auto_ablate(r, "2", lambda m: None) is None and ran == []  # the step kept nothing
    r.sf.tune.record_step({"step": "2", "finished": now_iso(), "stop_rule": "budget spent", "confirmed": {"decision": "kept"}})
    assert steps.auto_ablate(r, "2", lambda m: None)["attribution"] == ["max_num_seqs"] and ran == [1]
    rec = next(s for s in r.sf.read()["steps"] if s["step"] == "2")
    assert rec["stop_rule"].startswith("budget spent; attribution: max_num_seqs paid (max_num_seqs 4→32 alone +90.0%")
    assert steps.auto_ablate(r, "2", lambda m: None) is None and ran == [1]  # once per keep


def test_ablation_refuses_a_keep_that_set_a_parameter_left_at_the_server_default(tmp_path):
    # before the keep, max_num_batched_tokens was the server's own default: no candidate can set it back
    r = _runner(tmp_path, {"max_num_seqs": 8, "max_num_batched_tokens": 16384})
    r.sf.log.append("tune", "keep", config={"max_num_seqs": 8, "max_num_batched_tokens": 16384}, previous={"config": {"max_num_seqs": 2}})
    with pytest.raises(Rejected, match="max_num_batched_tokens at the server's own default"):
        steps.run_ablation(r, lambda m: None)
    assert r.sf.read()["trials"] == []


def test_a_baseline_the_client_could_not_keep_up_with_is_invalid_not_a_serving_anomaly(tmp_path):
    r = _runner(tmp_path, {})
    with r.sf.transaction() as st:
        st["baseline"] = {"checks": [{"code": 1, "findings": ["client_saturation", "littles_law"]}]}
    with pytest.raises(VkitError, match="the client fell behind") as ex:
        steps.guard_anomalies(r)
    assert ex.value.code == 3 and "--restart" in str(ex.value)
    with r.sf.transaction() as st:  # a server-side anomaly is still the serving path's, and blocks steps 2-4
        st["baseline"] = {"checks": [{"code": 1, "findings": ["client_saturation", "phase_order", "prefill_slower_than_decode"]}]}
    with pytest.raises(Rejected, match="fix the serving path") as ex:
        steps.guard_anomalies(r)
    assert ex.value.code == 1
