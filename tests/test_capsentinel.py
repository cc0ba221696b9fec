"""The drift sentinel under the capacity objective (vkit.tune.capsentinel): the kept configuration at
the low end of its capacity's interval, one or two runs. A machine that slowed is caught; an unchanged
one is not. The runs are the virtual-time predictor's (vkit.sim.predict.bench_summary: the simulator's
scheduler and cost model, its run noise), no process started."""

from __future__ import annotations

import json
import math
import os
import time
import types
from dataclasses import replace

import pytest

from vkit.measure.gauge import BenchOptions
from vkit.sim.calibrated import CostParams
from vkit.sim.predict import Scenario, bench_summary
from vkit.tune import capacity as cap
from vkit.tune import capsentinel
from vkit.tune.ledger import Ledger

# bench/bench_capacity_interval.py's "ttft-smooth": 8B on an H200, 2048-token prompts, P95 TTFT <= 500 ms.
# Its noise-free capacity, 11.695 req/s, is that benchmark's truth (bench/results/capacity_interval_truth.json).
SERVE = {"max_model_len": 4096, "max_num_batched_tokens": 8192, "max_num_seqs": 256}
SLO = {"p95_ttft_ms": 500.0, "mean_tpot_ms": 100.0}
TRUTH = 11.695
SIGMA = 0.05  # the baseline's σ of slo_capacity (a fresh start's search)
KEPT = {"max_num_seqs": 256}


def _plan() -> cap.Plan:
    return cap.Plan(mode="rate", keep_up=0.95, point_seconds=20.0, noise=0.05)


def test_the_check_load_is_two_sigma_below_the_kept_capacity():
    load, c, s = capsentinel.check_load({"metrics": {"slo_capacity": 100.0}, "sigma": {"slo_capacity": 0.05}}, _plan())
    assert (c, s) == (100.0, 0.05)
    assert load == pytest.approx(100.0 * math.exp(-0.1), rel=1e-3)
    assert capsentinel.check_load({"metrics": {"slo_capacity": 100.0}}, _plan()) is None  # no σ: nothing to judge by


@pytest.mark.parametrize("margins,verdict", [
    ([0.10], "holds"),                 # one run that holds ends the check
    ([-0.20], None),                   # one failing run: a second before anything is said
    ([-0.20, -0.25], "drift"),         # two clear failures
    ([-0.20, 0.05], "holds"),          # one failing and one holding: the noise the interval allows
    ([-0.02, -0.01], "unclear"),       # two failures inside the margins' noise: no verdict either way
    ([None, None], "unclear"),         # no run could measure the server
    ([-0.01, -0.01, "grew"], "drift"),  # both runs' queues grew: the load is not sustainable, however small the margin
    ([-0.01, 0.02, "grew"], "holds"),  # the second run held
])
def test_the_verdict_of_the_runs_at_the_check_load(margins, verdict):
    grew = margins[-1] == "grew"
    runs = [{"valid": m is not None, "margin": m, "queue_grew": grew} for m in margins if m != "grew"]
    assert capsentinel.judge(cap.Point(10.0, runs), _plan()) == verdict


class _Tune:
    """What the sentinel uses of a Tune: the kept configuration's baseline, the state's drift checks."""

    def __init__(self, tmp_path, baseline: dict):
        self.state = {"baseline": {"config": KEPT, **baseline}, "kept": {"config": KEPT}, "trials": [{"id": "t003"}],
                      "drift_checks": [], "drift": None,
                      "service": {"launch": {"argv": ["vllm", "serve", "m"]}}}
        self.s = types.SimpleNamespace(capacity=types.SimpleNamespace(slo=cap.Slo(dict(SLO)), plan=_plan()),
                                       workload=types.SimpleNamespace(options=BenchOptions(), seed=0))
        self.runs_dir = str(tmp_path / "runs")
        self.svc = types.SimpleNamespace(read=lambda: {"service": {"url": "virtual"}})
        self.interrupts = None
        self.backend = types.SimpleNamespace(now=time.time)  # runs timed on its clock
        # live_measure's own run (replaced here by the predictor's stand-in); runs recorded on the start running now
        self.measurer = types.SimpleNamespace(bench=None, start_key=lambda: f"start-{self.restarts}")
        self.restarts = 0
        self.logged: list[dict] = []
        sf = types.SimpleNamespace(path=str(tmp_path / "vkit.json"), dir=str(tmp_path),
                                   read=lambda: json.loads(json.dumps(self.state)))
        sf.tune = types.SimpleNamespace()
        sf.tune.record_run_start = lambda path, start, seconds=None: self.state.setdefault("run_starts", {}).__setitem__(path, start)

        def record(check: dict, drift: dict | None = None) -> None:
            self.state["drift_checks"].append(check)
            if drift is not None:
                self.state["drift"] = drift
        sf.tune.record_drift_check = record
        self.sf = sf
        self.ledger, self.served = Ledger(sf), Ledger(self.svc)  # the typed reads of both state files
        self.seat = self  # the restart to the kept configuration

    def restore_kept(self, fresh: bool = False) -> None:
        self.restarts += fresh

    def progress(self, msg: str) -> None:
        pass

    def log(self, kind: str, **kw) -> None:
        self.logged.append(dict(kw, kind=kind))


def _virtual(params: CostParams | None, key: str):
    """live_measure's stand-in: each run the predictor's open-loop run at the load, its own arrivals and noise."""
    def live_measure(opts, url, out_dir, plan, **_):
        def run(load: float, k: int, requests: int | None = None) -> dict:
            n = max(opts.num_prompts, math.ceil(load * plan.point_seconds))
            sc = Scenario(model="llama-3.1-8b", gpu="H200", isl=2048, osl=64, rate=load, num_prompts=n, seed=1000 + k,
                          exact_rate=True, serve=dict(SERVE), noise=0.02, noise_seed=f"{key}-{k}")
            return bench_summary(sc, params)
        return run
    return live_measure


def _check(tmp_path, monkeypatch, params: CostParams | None, key: str) -> tuple[dict, _Tune]:
    r = _Tune(tmp_path, {"metrics": {"slo_capacity": TRUTH}, "sigma": {"slo_capacity": SIGMA}})
    monkeypatch.setattr(cap, "live_measure", _virtual(params, key))
    return capsentinel.sentinel(r), r


@pytest.mark.parametrize("key", ["a", "b", "c"])
def test_an_unchanged_machine_holds_at_the_low_end_of_its_interval(tmp_path, monkeypatch, key):
    out, r = _check(tmp_path, monkeypatch, None, key)
    assert out["changed"] is False and r.state["drift"] is None, out
    assert out["load"] == pytest.approx(TRUTH * math.exp(-2 * SIGMA), rel=1e-3)
    assert r.restarts == 1 and out["runs"] == 1  # one fresh start of the kept configuration, one run
    assert list(r.state["run_starts"].values()) == ["start-1"]  # the run is on that start, as any run is
    assert r.state["drift_checks"][-1]["detector"] == "capacity_low_end"


def test_a_machine_that_slowed_by_a_quarter_is_caught_and_the_series_reset(tmp_path, monkeypatch):
    """Compute and memory both 25 % slower (a throttled GPU): its capacity falls well below the low end."""
    slow = CostParams()
    slow = replace(slow, mfu=slow.mfu * 0.75, mbu=slow.mbu * 0.75)
    out, r = _check(tmp_path, monkeypatch, slow, "slow")
    assert out["changed"] is True and out["runs"] == 2, out
    assert all(m < 0 for m in out["margins"])
    assert r.state["drift"]["detector"] == "capacity_low_end" and r.state["drift"]["reset"]
    assert out["why"].startswith("the kept configuration fails its SLO at")


def test_a_keep_with_too_few_runs_to_rebase_on_is_checked_at_its_own_capacity_not_the_old_baselines(tmp_path, monkeypatch):
    # the twin step kept t003 on one screening search and two confirmation searches (fewer than the baseline's
    # four: no rebase); the baseline still measures the 16-sequence start at a third of its capacity
    r = _Tune(tmp_path, {"metrics": {"slo_capacity": TRUTH / 3}, "sigma": {"slo_capacity": SIGMA}})
    r.state["baseline"]["config"] = {"max_num_seqs": 16}
    docs = {"runs/t003/rep1.json": TRUTH * 1.02, "runs/confirm-t003/rep1.json": TRUTH * 0.98, "runs/confirm-t003/rep2.json": TRUTH}
    for rel, c in docs.items():
        os.makedirs(os.path.dirname(tmp_path / rel), exist_ok=True)
        (tmp_path / rel).write_text(json.dumps({"slo_capacity": c}))
    r.state["trials"] = [{"id": "t003", "config": KEPT, "kept": True, "runs": ["runs/t003/rep1.json"]}]
    r.state["confirmations"] = [{"trial_id": "t003", "b_runs": ["runs/confirm-t003/rep1.json", "runs/confirm-t003/rep2.json"]}]
    rec = capsentinel.kept_record(r)
    assert rec["from_trial"] == "t003" and rec["sigma"] == {"slo_capacity": SIGMA}
    assert rec["metrics"]["slo_capacity"] == pytest.approx(TRUTH * (1.02 * 0.98) ** (1 / 3))
    monkeypatch.setattr(cap, "live_measure", _virtual(None, "a"))
    out = capsentinel.sentinel(r, fresh=False)
    assert out["capacity"] == pytest.approx(rec["metrics"]["slo_capacity"]) and out["changed"] is False
    assert r.restarts == 0 and out["fresh_start"] is False  # on the process that runs the kept configuration
