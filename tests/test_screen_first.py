"""Screen first, then plan the confirmation for the winner: a step's candidates are screened before the
power analysis decides anything, and the confirmation is planned for the best screened candidate's
effect less the winner's curse (``vkit.decide.power``), not for the gate's threshold. A noisy primary
(SLO capacity, σ 15 % between restarts on 2 degrees of freedom: threshold about 30 %) no longer refuses
a step whose candidate carries 3x the traffic.

The tune runs for real here (its steps, trials, screening and confirmation gates, keep) on a stubbed
server: ``Sim`` starts a process (its level drawn once per start, σ between restarts) and measures a
capacity search's answer (σ within a process); nothing is started, no process runs."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from types import SimpleNamespace

import numpy as np
import pytest

from tests.test_tune_power import runner_with
from vkit.decide import power
from vkit.decide.components import comparison_sigma, comparison_sigma_low
from vkit.measure.gauge import BenchOptions
from vkit.state import StateFile, new_state
from vkit.tune import capacity as cap
from vkit.tune import steps
from vkit.tune.config import CapacityObjective, Settings, Workload
from vkit.tune.context import Tune, new_tune
from vkit.tune.summaries import aggregate

pytestmark = pytest.mark.unit

W, B = 0.03, 0.15  # SLO capacity's σ within one process and between restarts
# as a baseline of 4 runs on 3 starts measures them: within on 1 df, between on 2 (its 90 % interval's
# low end is B·sqrt(2 / chi2.ppf(0.95, 2)) = 0.58·B)
COMPS = {"slo_capacity": {"within": W, "between": B, "total": math.hypot(W, B), "within_ci": [0.0153, 0.478],
                          "between_ci": [0.087, 0.66], "groups": 3, "runs": 4}}
KEPT = {"max_num_seqs": 64, "max_num_batched_tokens": 4096}


class Sim:
    """A server whose SLO capacity is 10 req/s times ``truth[max_num_seqs]``; each start draws its level
    (σ ``between``), each search its own noise (σ ``within``)."""

    def __init__(self, r: Tune, truth: dict[int, float], seed: int, within: float = W, between: float = B):
        self.r, self.truth, self.rng = r, truth, np.random.default_rng(seed)
        self.within, self.between = within, between
        self.cfg: dict | None = None
        self.level, self.pid, self.clock = 0.0, 0, dt.datetime(2026, 1, 1)
        self.measured: list[str] = []

    def apply(self, config: dict, fresh: bool = False) -> tuple[bool, dict]:
        if fresh or config != self.cfg:
            self.pid += 1
            self.cfg, self.level = dict(config), float(self.rng.normal(0.0, self.between)) if self.between else 0.0
        return True, {}

    def measure(self, label: str, k: int, workload=None) -> tuple[str, dict, dict]:
        self.clock += dt.timedelta(minutes=1)
        noise = float(self.rng.normal(0.0, self.within)) if self.within else 0.0
        value = 10.0 * self.truth.get(self.cfg["max_num_seqs"], 1.0) * math.exp(self.level + noise)
        doc = {"completed": 100, "slo_capacity": value, "ref_mean_tpot_ms": 20.0, "date": self.clock.strftime("%Y%m%d-%H%M%S"),
               "vkit": {"valid": True, "seed": k}}
        path = os.path.join(self.r.runs_dir, label, f"rep{k}.json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(doc, f)
        rel = os.path.relpath(path, self.r.sf.dir)
        self.r.sf.tune.record_run_start(rel, f"{self.pid}:1")
        self.measured.append(label)
        return rel, doc, {"code": 0, "verdict": "valid", "findings": []}

    def keep(self, reason: str, decision: str, decision_id: str | None = None) -> str:
        did = decision_id or "d-test"
        self.r.sf.service.mirror_kept(dict(self.cfg), did, decision)
        return did


def capacity_tune(tmp_path, truth: dict[int, float], seed: int = 1, confirm_blocks: int = 4, **noise) -> tuple[Tune, Sim]:
    """A tune on the capacity objective whose baseline (4 runs on 3 starts of the kept configuration,
    measured on ``Sim``) carries the σ components ``COMPS``."""
    sf = StateFile(str(tmp_path / "st" / "vkit.json"))
    sf.create(new_state("http://127.0.0.1:9", "m", ["serve", "m"], dict(KEPT)))
    w = Workload(BenchOptions(num_prompts=50, max_concurrency=16))
    objective = CapacityObjective(slo=cap.Slo({"p95_ttft_ms": 1000.0}), plan=cap.Plan())
    r = new_tune(sf, Settings(workload=w, capacity=objective, primary="slo_capacity:+", guards=[], confirm_blocks=confirm_blocks),
               lambda m: None, tool_name="tune")
    sim = Sim(r, truth, seed, **noise)
    r.seat.apply, r.measurer.measure, r.seat.keep = sim.apply, sim.measure, sim.keep
    r.seat.settle = lambda: None
    runs = []
    for k, fresh in zip((1, 2, 3, 4), (True, False, True, True), strict=True):
        sim.apply(dict(KEPT), fresh=fresh)
        runs.append(sim.measure("baseline", k)[0])
    docs = [r.ledger.load(p) for p in runs]
    with sf.transaction() as st:
        st["baseline"] = {"config": dict(KEPT), "workload": w.describe(), "runs": runs, "checks": [{"code": 0}] * 4,
                          "metrics": aggregate(docs), "sigma": {"slo_capacity": COMPS["slo_capacity"]["total"]},
                          "components": COMPS, "generation": 1}
        st["sigma_components"] = COMPS
    return r, sim


def proposer(configs: list[dict]):
    """The step's candidates, in order, then done."""
    def nxt(hist):
        done = {json.dumps(h.config, sort_keys=True) for h in hist if h.step == "3"}
        left = [c for c in configs if json.dumps(c, sort_keys=True) not in done]
        return SimpleNamespace(config=left[0], reason="test", audit={}) if left else None
    return nxt


def run_step(r: Tune, seqs: list[int]) -> dict:
    return steps.run_screening_step(r, "3", proposer([dict(KEPT, max_num_seqs=s) for s in seqs]), lambda m: None, 4,
                                    lambda hist: "the candidates are done")


def test_a_threefold_winner_on_a_noisy_primary_is_screened_confirmed_and_kept(tmp_path):
    r, sim = capacity_tune(tmp_path, {128: 1.0, 256: 3.0}, seed=3)
    # the threshold's plan (2·15 % ≈ 31 %, σ on 2 df) cannot decide within 4 blocks: the old rule refused the step here
    assert not r.budget.confirm_plan()["fits"]
    rec = run_step(r, [128, 256])
    winner = rec["confirmed"]["trial_id"]
    assert r.ledger.trial(winner)["config"]["max_num_seqs"] == 256 and rec["confirmed"]["decision"] == "kept"
    assert r.sf.read()["kept"]["config"]["max_num_seqs"] == 256


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_candidate_two_percent_better_on_the_same_noise_is_not_kept(tmp_path, seed):
    r, sim = capacity_tune(tmp_path, {128: 1.02}, seed=seed)
    rec = run_step(r, [128])
    assert r.sf.read()["kept"]["config"] == KEPT and "kept t" not in rec["result"]


def test_a_winner_too_small_for_the_budget_is_underpowered_after_its_screening(tmp_path):
    # three candidates each truly +35 %, measured without noise (the tune's σ is the baseline's 15 %): the
    # best's screened +35 %, less the winner's curse of the best of three (σ_screen 15 %), is +19 %, which
    # 2 blocks cannot confirm even at the low end of σ's interval
    r, sim = capacity_tune(tmp_path, {128: 1.35, 256: 1.35, 512: 1.35}, confirm_blocks=2, within=0.0, between=0.0)
    rec = run_step(r, [128, 256, 512])
    assert len(rec["trials"]) == 3 and all(r.ledger.trial(t)["status"] == "done" for t in rec["trials"])
    assert rec["confirmed"]["decision"] == "underpowered" and not rec["plan"]["fits"]
    assert rec["plan"]["effect"]["k"] == 3 and rec["plan"]["effect"]["corrected"] == pytest.approx(math.log(1.35) - 0.846 * 0.1529, abs=1e-3)
    assert "cannot confirm the best screened candidate within the budget" in rec["result"]
    assert not any(label.startswith("confirm-") for label in sim.measured)  # refused before any confirmation run
    assert any(e.get("event") == "underpowered" and e.get("step") == "3" for e in r.sf.log.read())


def test_the_winners_curse_counts_only_the_candidates_that_could_have_won_by_luck(tmp_path):
    # the rule: observed − σ_screen·E[max of k standard normals], k the candidates within 3 σ_screen of the winner
    assert [round(power.expected_max_normal(k), 3) for k in (1, 2, 3, 5, 10)] == [0.0, 0.564, 0.846, 1.163, 1.539]
    r, sim = capacity_tune(tmp_path, {128: 1.0, 256: 3.0, 512: 2.9}, within=0.0, between=0.0)
    run_step(r, [128, 256, 512])
    trials = [t for t in r.sf.read()["trials"] if t["step"] == "3"]
    best = max(trials, key=lambda t: t["metrics"]["slo_capacity"])
    eff = steps.screened_effect(r, best, trials)
    sd = comparison_sigma(COMPS["slo_capacity"], 1)
    # 2.9x is within 3 σ_screen of 3x (a contender), 1x is not: the best of 2 is corrected, not of 3
    assert eff.k == 2 and eff.sigma == pytest.approx(sd, rel=1e-3)
    assert eff.corrected() == pytest.approx(math.log(3.0) - 0.564 * sd, abs=1e-3)


def test_sigma_on_two_degrees_of_freedom_does_not_veto_a_winner_the_low_end_of_its_interval_confirms(tmp_path):
    # +60 % screened, best of 3: 12 pairs at the measured σ (over 2 blocks), 3 at the low end of its 90 % interval:
    # the budget is run (the sequential rule stops when it decides) rather than the step refused
    r = runner_with(str(tmp_path / "st" / "vkit.json"), COMPS, confirm_blocks=2, primary="slo_capacity:+", guards=[])
    sd = comparison_sigma(COMPS["slo_capacity"], 1)
    plan = r.budget.confirm_plan(effect=power.Effect(observed=math.log(1.6), k=3, sigma=sd, sigma_low=comparison_sigma_low(COMPS["slo_capacity"], 1)))
    assert plan["fits"] and plan["blocks"] == 2 and plan["pairs"] > 4 and "may end undecided" in plan["why"]
