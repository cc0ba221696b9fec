"""Repeats from the power analysis: the sequential rule's own pairs-to-decide, the confirmation
blocks a tune plans from the measured σ components (and refuses, before any confirmation run,
when its budget cannot decide; a step only after its screening), and the screening runs that
σ's two parts pay for."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from vkit.decide.components import comparison_sigma, comparison_sigma_low
from vkit.decide.rule import Boundaries, pairs_to_decide, seq_bounds
from vkit.decide.specs import Settings as GateSettings
from vkit.measure.gauge import BenchOptions
from vkit.state import StateFile, new_state
from vkit.tune import steps
from vkit.tune.config import Settings, Workload
from vkit.tune.context import Tune, new_tune

pytestmark = pytest.mark.unit

GS = GateSettings()


def test_pairs_to_decide_has_the_documented_answers_and_grows_with_sigma():
    assert pairs_to_decide(0.02, math.log1p(0.04), GS) == 7  # the docstring's case: σ 2 %, t 4 %
    assert pairs_to_decide(0.005, math.log1p(0.03), GS) == 2
    # a guard needs only its lower bound to clear −tolerance: never more pairs than the primary at the same gap
    gap = math.log1p(0.15)
    ns = [pairs_to_decide(s, gap, GS, futility=False) for s in (0.02, 0.04, 0.08, 0.1)]
    assert ns == sorted(ns) and ns[0] < ns[-1]
    assert all(pairs_to_decide(s, gap, GS, futility=False) <= pairs_to_decide(s, gap, GS) for s in (0.02, 0.05, 0.1))
    assert pairs_to_decide(0.3, math.log1p(0.05), GS, futility=False) is None  # beyond 200 pairs
    with pytest.raises(ValueError):
        pairs_to_decide(0.0, 0.1, GS)


def test_at_the_planned_pairs_the_rule_separates_zero_from_the_threshold_with_the_stated_power():
    # Monte Carlo of the gate's own bounds (known σ): at a true +t the efficacy lower bound clears 0,
    # at a true 0 the futility bound falls below t, each in at least 80 % of seeded trials
    sigma, t = 0.02, 0.04
    gap = math.log1p(t)
    k = pairs_to_decide(sigma, gap, GS)
    bnd = Boundaries.build(GS)
    sd = math.sqrt(2) * sigma
    rng = np.random.default_rng(3)
    est_hi = rng.normal(gap, sd / math.sqrt(k), 20000)
    est_0 = rng.normal(0.0, sd / math.sqrt(k), 20000)
    lo, _, _, _ = seq_bounds(bnd, k, est_hi, np.nan, sd)
    _, _, hf, _ = seq_bounds(bnd, k, est_0, np.nan, sd)
    assert float(np.mean(lo > 0)) >= 0.8 and float(np.mean(hf < gap)) >= 0.8
    # one pair fewer does not reach it on the efficacy side (the answer is the smallest such k)
    lo1, _, _, _ = seq_bounds(bnd, k - 1, rng.normal(gap, sd / math.sqrt(k - 1), 20000), np.nan, sd)
    _, _, hf1, _ = seq_bounds(bnd, k - 1, rng.normal(0.0, sd / math.sqrt(k - 1), 20000), np.nan, sd)
    assert min(float(np.mean(lo1 > 0)), float(np.mean(hf1 < gap))) < 0.8


def runner_with(state_path, comps: dict, **settings) -> Tune:
    sf = StateFile(state_path)
    sf.create(new_state("http://127.0.0.1:9", "m", ["serve", "m"], {"max_num_seqs": 64}), force=True)
    with sf.transaction() as st:
        st["baseline"] = {"config": {"max_num_seqs": 64}, "runs": [], "components": comps,
                          "sigma": {m: c.get("total") for m, c in comps.items()}}
        st["sigma_components"] = comps
    return new_tune(sf, Settings(workload=Workload(BenchOptions(num_prompts=50)), **settings), lambda m: None, tool_name="tune")


def comp(w: float, b: float, w_ci=None, b_ci=None) -> dict:
    return {"within": w, "between": b, "total": math.hypot(w, b), "within_ci": w_ci or [w / 2, w * 3],
            "between_ci": b_ci or [0.0, b * 4], "groups": 2, "runs": 4}


def test_the_confirmation_plan_comes_from_sigma_and_refuses_a_budget_that_cannot_decide(state_path):
    comps = {"output_throughput": comp(0.01, 0.005), "p95_ttft_ms": comp(0.03, 0.01)}
    r = runner_with(state_path, comps, confirm_blocks=4)
    plan = r.budget.confirm_plan()
    s = comparison_sigma(comps["output_throughput"], 2)
    one = comparison_sigma(comps["output_throughput"], 1)  # the threshold's σ: one run on a fresh start
    assert plan["fits"] and plan["pairs"] == pairs_to_decide(s, math.log1p(max(2 * one, 0.03)), GS)
    # at the simulator's noise (2 % within a process, 1.5 % between starts) the bar is 2·2.5 % = 5 %,
    # not 2·√(2² + 2·1.5²) % = 5.8 %: the clustering of the design is the test's, not the bar's
    sim = runner_with(state_path, {"output_throughput": comp(0.02, 0.015)}, confirm_blocks=8).budget.confirm_plan()
    row = sim["metrics"][0]
    assert row["threshold"] == pytest.approx(0.05) and row["sigma"] == pytest.approx(math.sqrt(0.02**2 + 2 * 0.015**2), abs=1e-5)
    assert plan["blocks"] == math.ceil(plan["pairs"] / 2) <= 4
    # a guard whose σ is far too large for its tolerance, even at the low end of σ's interval: refused
    comps["p95_ttft_ms"] = comp(0.25, 0.1, w_ci=[0.2, 0.5], b_ci=[0.05, 0.4])
    r = runner_with(state_path, comps, confirm_blocks=4)
    plan = r.budget.confirm_plan()
    assert not plan["fits"] and "p95_ttft_ms" in plan["why"] and "cannot reach a verdict" in plan["why"]
    # --yes grants a larger budget (up to 4x), when that decides
    mid = dict(comps, p95_ttft_ms=comp(0.1, 0.02, w_ci=[0.09, 0.2], b_ci=[0.01, 0.1]))
    short = runner_with(state_path, mid, confirm_blocks=4).budget.confirm_plan()
    granted = runner_with(state_path, mid, confirm_blocks=4, grant_budget=True).budget.confirm_plan()
    assert not short["fits"] and "--confirm-blocks" in short["why"]
    assert granted["fits"] and granted["granted"] and granted["blocks"] > 4


def test_a_budget_within_reach_at_the_low_end_of_sigma_is_run_not_refused(state_path):
    # the point estimate needs more than 4 blocks, the interval's low end fewer: run the budget
    comps = {"output_throughput": comp(0.01, 0.005), "p95_ttft_ms": comp(0.1, 0.02, w_ci=[0.02, 0.3], b_ci=[0.0, 0.1])}
    plan = runner_with(state_path, comps, confirm_blocks=4).budget.confirm_plan()
    assert plan["pairs"] > 8 and plan["fits"] and plan["blocks"] == 4 and "may end undecided" in plan["why"]
    assert comparison_sigma_low(comps["p95_ttft_ms"], 2) == pytest.approx(0.02)


def test_screening_runs_stop_where_the_between_restart_part_dominates(state_path):
    assert runner_with(state_path, {"output_throughput": comp(0.02, 0.015)}, screen_repeats=3).budget.screen_size()[0] == 2
    assert runner_with(state_path, {"output_throughput": comp(0.01, 0.02)}, screen_repeats=3).budget.screen_size()[0] == 1
    assert runner_with(state_path, {"output_throughput": comp(0.03, 0.01)}, screen_repeats=3).budget.screen_size()[0] == 3  # capped
    n, why = runner_with(state_path, {"output_throughput": comp(0.02, 0.0)}, screen_repeats=2).budget.screen_size()
    assert n == 2 and "no between-restart part" in why


def test_an_underpowered_confirmation_measures_nothing_and_an_underpowered_step_is_refused_after_its_screening(state_path):
    comps = {"output_throughput": comp(0.01, 0.005), "p95_ttft_ms": comp(0.25, 0.1, w_ci=[0.2, 0.5], b_ci=[0.05, 0.4])}
    r = runner_with(state_path, comps, confirm_blocks=2)
    calls = []
    r.seat.apply = lambda config, fresh=False: calls.append("apply") or (True, {})
    r.measurer.measure = lambda *a, **k: calls.append("measure")
    t = r.trials.new("2", {"max_num_seqs": 128}, "test")
    conf = r.confirmer.confirm_and_keep(t["id"], selected_from=3)
    assert conf["decision"] == "underpowered" and not conf["a_runs"] and not conf["b_runs"] and calls == []

    # the step screens its candidate first (the power analysis decides nothing before), then its winner's
    # confirmation is refused: the guard's σ is far too large for its tolerance, whatever the winner's effect
    def screened(tid, **kw):
        calls.append("screen")
        return r.sf.tune.update_trial(tid, status="done", valid=True, verdict="accept", metrics={"output_throughput": 150.0},
                              gate={"primary": {"metric": "output_throughput", "estimate_log": math.log(1.5), "sigma": 0.011}})

    r.trials.run, r.seat.settle = screened, lambda: None
    proposals = iter([SimpleNamespace(config={"max_num_seqs": 256}, reason="test", audit={})])
    rec = steps.run_screening_step(r, "3", lambda hist: next(proposals, None), lambda m: None, 3, lambda hist: "done")
    assert calls == ["screen"] and len(rec["trials"]) == 1 and rec["confirmed"]["decision"] == "underpowered"
    assert "cannot reach a verdict" in rec["result"] and "p95_ttft_ms" in rec["result"] and not rec["plan"]["fits"]
    assert any(e.get("event") == "underpowered" and e.get("step") == "3" for e in r.sf.log.read())


def test_a_server_that_measures_the_same_every_time_confirms_a_large_gain_in_the_fewest_pairs(state_path):
    """σ 0 (the simulator with its noise off, on the virtual backend): a +44 % screened gain is confirmed in
    two pairs, not refused as needing 'more than 200 pairs' because the plan read a σ rounded to 0."""
    from vkit.decide import power

    zero = comp(1e-9, 1e-9, w_ci=[1e-10, 1e-8], b_ci=[0.0, 4e-9])  # float noise on identical figures
    r = runner_with(state_path, {"output_throughput": zero, "p95_ttft_ms": zero}, confirm_blocks=6)
    plan = r.budget.confirm_plan(effect=power.Effect(observed=math.log(1.44), k=1, sigma=0.0, sigma_low=0.0))
    assert plan["fits"] and plan["pairs"] == 2 and plan["blocks"] == 1
    assert r.budget.confirm_plan()["fits"]
