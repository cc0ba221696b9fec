"""--objective j-per-token: the fewest J per output token while carrying a required load within the SLO.
Every capacity search measures that load (the reference load); the recommendation is a front member the gate
confirmed with fewer J/token there whose every search held the SLO there, else the kept configuration."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from tests.test_energy_tune import built, parsed
from vkit.cli._tuneargs import tune_plan
from vkit.errors import UsageError
from vkit.measure.gauge import BenchOptions
from vkit.report.energysection import energy_section
from vkit.report.view import View
from vkit.state import StateFile, new_state
from vkit.tune import capacity as cap
from vkit.tune import steps
from vkit.tune.assemble import goal
from vkit.tune.config import CapacityObjective, Settings, Workload
from vkit.tune.context import Tune, new_tune
from vkit.tune.steps.common import objectives

pytestmark = pytest.mark.unit


def test_the_objective_needs_its_required_capacity_and_searches_capacity_with_joules_at_that_load():
    s = built("--objective", "j-per-token", "--required-capacity", "20")
    assert (s.capacity is not None, s.objective, s.required_capacity, s.primary) == (True, "j-per-token", 20.0, "slo_capacity:+")
    assert s.energy_metrics() == ("ref_j_per_output_token",)
    assert [(o.name, o.direction) for o in objectives(SimpleNamespace(s=s))] == [
        ("slo_capacity", "max"), ("ref_j_per_output_token", "min")]
    g = goal(s)
    assert (g["minimize"], g["required_capacity"], g["objective"]) == ("ref_j_per_output_token", 20.0, "j-per-token")
    assert g["text"].startswith("fewest J per output token (board power) while carrying 20 req/s with p95_ttft_ms <= 1000")
    with pytest.raises(UsageError, match="needs --required-capacity"):
        built("--objective", "j-per-token")
    with pytest.raises(UsageError, match="belongs to that objective only"):
        built("--required-capacity", "20")
    with pytest.raises(UsageError, match="not board power"):
        tune_plan(parsed("--search", "twin", "--objective", "j-per-token", "--required-capacity", "20"))


@pytest.fixture
def runner(tmp_path):
    sf = StateFile(str(tmp_path / "st" / "vkit.json"))
    sf.create(new_state("http://127.0.0.1:9", "m", ["serve", "m"], {"max_num_seqs": 64}))
    objective = CapacityObjective(slo=cap.Slo({"p95_ttft_ms": 1000.0}), plan=cap.Plan())
    s = Settings(workload=Workload(BenchOptions(num_prompts=50)), capacity=objective, required_capacity=20.0)
    return new_tune(sf, s, lambda m: None, tool_name="tune")


def _doc(runner: Tune, name: str, holds: bool) -> str:
    path = os.path.join(runner.runs_dir, name + ".json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    json.dump({"slo_capacity": 30.0, "reference_load": 20.0, "ref_holds": holds}, open(path, "w"))
    return os.path.relpath(path, runner.sf.dir)


def _trial(runner: Tune, seqs: int, holds: bool, conf_holds: bool | None = None) -> str:
    t = runner.trials.new("3", {"max_num_seqs": seqs}, "test")
    runner.sf.tune.update_trial(t["id"], status="done", valid=True, metrics={"slo_capacity": 30.0},
                        runs=[_doc(runner, f"{t['id']}-s", holds)])
    if conf_holds is not None:
        runner.sf.tune.save_confirmation({"trial_id": t["id"], "against": {"max_num_seqs": 64}, "decision": "accept",
                                          "primary": "ref_j_per_output_token:-",
                                          "b_runs": [_doc(runner, f"{t['id']}-c", conf_holds)]}, "delivery_confirmations")
    return t["id"]


def _row(tid: str, j: float, decision: str = "accept", seqs: int = 64) -> dict:
    return {"trial_id": tid, "config": {"max_num_seqs": seqs}, "metrics": {"ref_j_per_output_token": j},
            "confirmation": {"decision": decision, "claim": "ref_j_per_output_token:-", "why": "fewer"}}


def test_the_pick_is_the_fewest_joules_confirmed_among_the_members_that_carry_the_required_load(runner):
    # a capacity guard relative to the kept one would forbid trading capacity down to the required load
    assert steps.claim_guards(runner, "ref_j_per_output_token:-") == []
    st = runner.ledger.tune()
    a = _trial(runner, 32, holds=True, conf_holds=True)
    b = _trial(runner, 16, holds=True, conf_holds=False)  # its confirmation's search failed the SLO at 20
    c = _trial(runner, 24, holds=True)  # never confirmed
    st = runner.ledger.tune()
    pareto = [_row("kept", 0.25, "kept"), _row(a, 0.22, seqs=32), _row(b, 0.18, seqs=16),
              _row(c, 0.15, "undecided", seqs=24)]
    rec = steps.energy_pick(runner, pareto, st)
    assert (rec["trial_id"], rec["config"], rec["carries_required"]) == (a, {"max_num_seqs": 32}, True)
    assert "0.22 J/token against 0.25" in rec["why"] and rec["kept_config"] == {"max_num_seqs": 64}
    # nothing confirmed: the kept configuration, and whether its own searches held at the required load
    rec = steps.energy_pick(runner, [_row("kept", 0.25, "kept"), _row(c, 0.15, "undecided")], st)
    assert (rec["trial_id"], rec["config"], rec["carries_required"]) == ("kept", {"max_num_seqs": 64}, False)
    assert rec["why"].startswith("no measured configuration carries 20 within the SLO")
    runner.sf.tune.set_baseline("baseline", {"config": {"max_num_seqs": 64}, "runs": [_doc(runner, "b1", True)]})
    rec = steps.energy_pick(runner, [_row("kept", 0.25, "kept")], runner.ledger.tune())
    assert rec["carries_required"] and rec["why"].startswith("the kept configuration: it carries 20")


def test_the_energy_section_gives_the_joules_at_the_required_load():
    trials = [{"id": t, "status": "measured", "valid": True, "config": {"max_num_seqs": n},
               "metrics": {"slo_capacity": c, "capacity_output_tok_s": 100 * c, "j_per_output_token": j,
                           "ref_j_per_output_token": rj, "mean_power_w": 600.0, "ref_mean_tpot_ms": 10.0}}
              for t, n, c, j, rj in (("t001", 64, 37.0, 0.15, 0.24), ("t002", 32, 27.0, 0.19, 0.23))]
    v = View({"title": "t", "goal": {"minimize": "ref_j_per_output_token", "objective": "j-per-token",
                                     "required_capacity": 20.0}, "trials": trials,
              "recommendation": {"trial_id": "t002"}})
    assert (v.y_key, v.x_key) == ("slo_capacity", "ref_j_per_output_token")
    sec = energy_section(v)
    assert "At the required 20 req/s: 0.23 J per output token for the recommendation; 0.23–0.24 over the 2 " \
           "configurations measured there." in sec.lines
    assert sec.blocks[-2].head[-1] == "J/token at 20"
