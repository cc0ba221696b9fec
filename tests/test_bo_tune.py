"""tune's Bayesian search: every situational parameter in its space, its early stop after k
evaluations in a row without a screened gain, and the acquisition chosen from the command line."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import call
from vkit.measure.gauge import BenchOptions
from vkit.state import StateFile, new_state
from vkit.tune import steps
from vkit.tune.config import Settings, Workload
from vkit.tune.context import Tune, new_tune

pytestmark = pytest.mark.unit


def runner(state_path, workload=None) -> Tune:
    sf = StateFile(state_path)
    sf.create(new_state("http://127.0.0.1:9", "m", ["serve", "m"], {"max_num_seqs": 16, "max_num_batched_tokens": 2048}),
              force=True)
    return new_tune(sf, Settings(workload=workload or Workload(BenchOptions(num_prompts=50))), lambda m: None, tool_name="tune")


def test_the_space_holds_every_situational_parameter(state_path, tmp_path):
    r = runner(state_path)
    space = {p.name: p for p in steps.bo_space(r, r.policy)}
    assert list(space) == ["max_num_batched_tokens", "max_num_seqs", "gpu_memory_utilization", "enable_chunked_prefill",
                           "enable_prefix_caching"]
    gmu = space["gpu_memory_utilization"].levels()
    assert min(gmu) == pytest.approx(0.85) and max(gmu) == pytest.approx(0.98)
    assert space["enable_prefix_caching"].levels() == [False, True]
    # the scheduling policy joins only on a workload with two or more priority classes
    ds = tmp_path / "prio.jsonl"
    ds.write_text("".join(json.dumps({"prompt": f"p{i}", "output_len": 8, "priority": i % 2}) + "\n" for i in range(6)))
    w = Workload(BenchOptions(num_prompts=6, dataset_name="jsonl", dataset_path=str(ds)))
    r2 = runner(state_path, workload=w)
    assert [p.name for p in steps.bo_space(r2, r2.policy)][-1] == "scheduling_policy"


def test_early_stop_counts_the_evaluations_in_a_row_without_a_screened_gain(state_path):
    r = runner(state_path)
    verdicts = ["undecided", "accept", "reject", "undecided", "reject"]
    for i, v in enumerate(verdicts):
        t = r.sf.tune.add_trial("bo", {"max_num_seqs": 32 + i}, "why", {})
        r.sf.tune.update_trial(t["id"], status="done", verdict=v, finished="2026-12-02T00:00:00")
    assert steps.bo_stalled(r, 3) == 3  # reject, undecided, reject after the accept
    assert steps.bo_stalled(r, 4) is None
    assert steps.bo_stalled(r, 0) is None  # 0: never stops early
    t = r.sf.tune.add_trial("bo", {"max_num_seqs": 99}, "why", {})
    r.sf.tune.update_trial(t["id"], status="done", verdict="accept", finished="2026-12-02T00:00:00")
    assert steps.bo_stalled(r, 1) is None


def test_the_acquisition_and_patience_flags_are_checked():
    r = call("tune", "--sandbox", "--mode", "bo", "--acquisition", "pi")
    assert r.code == 2 and "--acquisition" in r.err
    r = call("sweep", "--mode", "bo", "--bo-patience", "-1", "--sandbox")
    assert r.code == 2 and "--bo-patience" in r.err


def test_auto_under_the_capacity_objective_is_the_benchmarked_acquisition(state_path):
    """--acquisition auto: the capacity objective's acquisition is bench_tuner_capacity's choice
    (tune's two capacity objectives carry no SLO, where the library's own auto would be EHVI); the
    throughput objective keeps the library's rule; an explicit choice is never replaced."""
    from vkit import search
    from vkit.tune import capacity as cap
    from vkit.tune.config import CapacityObjective

    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "results",
                           "tuner_capacity.json")) as f:
        decided = json.load(f)["default_acquisition"]["acquisition"]
    assert steps.CAPACITY_ACQUISITION == decided
    plain = runner(state_path)
    assert steps.bo_acquisition(plain, "auto") == "auto"
    r = runner(state_path)
    r.s.capacity = CapacityObjective(slo=cap.Slo({"p95_ttft_ms": 1000.0}), plan=cap.Plan())
    assert steps.bo_acquisition(r, "auto") == decided and steps.bo_acquisition(r, "ucb") == "ucb"
    # the proposer asks for it: past the Sobol start, a non-random proposal's audit names it
    nxt, _ = steps.bo_proposer(r, r.policy, budget=8, seed=3)
    hist: list = []
    names = {"ehvi": "ehvi", "cei": "log_ei", "ei": "log_ei", "ucb": "ucb"}
    for i in range(8):
        p = nxt(hist)
        if p.audit["phase"] == "acquisition":
            assert p.audit["acquisition"]["name"].split("+")[0] == names[decided]
            assert p.audit["replay"]["options"] == {"acquisition": decided}
            break
        seqs = p.config["max_num_seqs"]
        hist.append(search.Observation(config=p.config, objectives={"slo_capacity": float(seqs) ** 0.5, "ref_mean_tpot_ms": 20.0 + seqs / 64},
                                       step="bo", trial_id=f"t{i}"))
    else:
        pytest.fail("no acquisition-phase proposal within 8")
