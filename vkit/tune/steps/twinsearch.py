"""``tune --search twin`` (capacity objective): the calibrated twin ranks the space, the server confirms.

After the baseline, :class:`vkit.tune.twin.Twin` is fitted to the baseline's load points and predicts
the SLO capacity of every configuration of the space (:func:`twin_space`: max_num_batched_tokens x
max_num_seqs, the policy's candidates, the kept values and max_num_seqs' doublings past its candidates
as step 3 goes on to them). Each proposal is the untried configuration of highest predicted capacity
whose 90 % interval reaches past the best capacity measured so far by the gate's least gain
(:data:`MIN_GAIN`); it is screened on the server like any trial, its measurement corrects the twin
(every prediction re-ranked), and one measured outside its interval at proposal is logged as a
``twin_miss``. The step ends when no untried configuration's interval reaches that far, when its trial
budget is spent, or when a further trial would take the tune past ``--max-restarts`` (the trial's
start, the confirmation's first block and the promise's one reserved: a confirmation that needs more blocks
adds two starts each, never cut short); then the best screened candidate is
confirmed on fresh interleaved runs and kept through the gate, as every step's winner is.

Every proposal's audit holds the twin's evidence: the profile's sha256, the twin's inputs, the
candidate's prediction with its interval and the ranking's head; ``twin_miss`` events hold the
prediction beside the measurement.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Callable

from vkit import search
from vkit.apply.policy import Policy
from vkit.tune.context import Tune, service_logs
from vkit.tune.ledger import Status
from vkit.tune.twin import Prediction, Twin, Uncalibrated, design_profile_path, profile_path
from vkit.tune.twindesign import TwinDesign

STEP = "twin"
MIN_GAIN = 0.03  # the gate's floor: a gain below max(2σ, 3 %) is never kept, so it is never worth a restart
SEQS_PAST = 3  # max_num_seqs' doublings past the policy's largest candidate (step 3 goes on to them)
# a trial's own start; the confirmation's three (the candidate afresh, the kept, the candidate: B A A B on fresh starts);
# the promise's fresh start. Measured on 70b-h100x4 (bench_capacity_tune, seed 11): starts 6-8 the confirmation, 9 the promise.
RESERVED_RESTARTS = 5


def twin_space(policy: Policy, kept: dict, frozen: dict | None = None) -> list[dict]:
    """The configurations the twin ranks: max_num_batched_tokens x max_num_seqs over the policy's
    candidates, the kept values and max_num_seqs doubled SEQS_PAST times past its largest candidate."""
    data = policy.data if hasattr(policy, "data") else policy
    rows = {r["param"]: r for r in data.get("situational", [])}
    axes = {}
    for name in ("max_num_batched_tokens", "max_num_seqs"):
        vals = {int(v) for v in rows[name].get("candidates") or []}
        if isinstance(kept.get(name), int):
            vals.add(int(kept[name]))
        if name == "max_num_seqs" and vals:
            top = max(int(v) for v in rows[name].get("candidates") or [max(vals)])
            vals |= {top * 2 ** k for k in range(1, SEQS_PAST + 1) if top * 2 ** k <= int(rows[name].get("max") or 1 << 30)}
        if name in (frozen or {}):
            vals = {int(frozen[name])}
        axes[name] = sorted(vals)
    return [{"max_num_batched_tokens": t, "max_num_seqs": s} for t in axes["max_num_batched_tokens"] for s in axes["max_num_seqs"]]


def restarts_spent(runner: Tune) -> int:
    """This run's server starts so far: the starts the decision logs hold (applies, rollbacks, failed starts) made under
    the run's owner since it started; a start logged before it (a manual keep, an earlier tune) is not the run's."""
    since = str(runner.ledger.tune().tune.get("started") or "")
    return sum(1 for log in service_logs(runner) for e in log.read() if e.get("event") in ("applied", "rolled_back", "start_failed")
               and e.get("owner") == runner.owner and str(e.get("ts") or "") >= since)


def _key(config: dict) -> str:
    return json.dumps({k: config.get(k) for k in ("max_num_batched_tokens", "max_num_seqs")}, sort_keys=True)


class TwinSearch:
    """The proposer and stop rule of the twin step over one tune (a proposer object: ``next``, ``stop_reason``; ``settle``
    after the step)."""

    def __init__(self, runner: Tune, policy: Policy, max_restarts: int | None, progress: Callable[[str], None],
                 refit: bool = False, prior: dict | None = None, design: str = "off"):
        self.runner, self.policy, self.max_restarts, self.progress = runner, policy, max_restarts, progress
        self.refit = refit  # --twin-refit: refit on every measured trial's load points as they come
        self.prior = prior  # the knowledge base's fit of this environment and workload (prior_twin): the first fit's start
        self.twin: Twin | None = None
        self.fitted_on = 0  # the measured trials the twin's fit saw
        self.predicted: dict[str, Prediction] = {}  # config key -> the prediction it was proposed on
        self.missed: set[str] = set()
        self.why = ""
        self.design = TwinDesign(runner, design, progress)  # --twin-design
        self._designed: tuple[list, list[str]] | None = None  # designed_runs(), once measured
        self._told: set[str] = set()  # the disturbed points already named on stderr (each fit refuses them again)

    def calibrated(self, trials: int = 0) -> Twin:
        """The twin, fitted to the baseline's load points (with --twin-design, refitted at once with the designed runs
        where it asks for them); with --twin-refit, refitted (from the last fit) once ``trials`` measured trials are
        more than its fit saw and they brought load points (a trial skipped as unable to differ brings none), each
        fit its own profile file and log event."""
        from vkit.sim import loadfit

        read = None  # a refit's load points, read once: to decide whether to refit, then to fit
        if self.twin is not None and self.refit and trials > self.fitted_on:
            read = loadfit.points_from_state(self.runner.sf.path, keys=("baseline", "trials"))
            if len(read[0]) <= self.twin.fit["of"]:  # no usable point the last fit did not see (a refused trial brings none)
                read, self.fitted_on = None, trials
        if self.twin is None:
            self._fit(0, None)
            why = self.design.wanted(self.twin.fit)
            if why and self.design.measure(why):
                before = self.twin.fit["table"]
                self._fit(0, None, designed=True)
                self.runner.log("twin_design", runs=self.designed_runs()[1], parameters={
                    n: {"before": {"value": before[n]["value"], "rse": before[n]["rse"], "identified": before[n]["identified"]},
                        "after": {"value": row["value"], "rse": row["rse"], "identified": row["identified"]}}
                    for n, row in self.twin.fit["table"].items()})
        elif read is not None:
            self._fit(trials, read)
        return self.twin

    def designed_runs(self) -> tuple[list, list[str]]:
        """The designed runs the state recorded, as calibration runs, and their paths (none before they are measured):
        read once, when first there (a tune measures them once)."""
        from vkit.sim.designfit import design_runs

        if self._designed is None:
            rec = self.runner.ledger.tune().tune.get("twin_design") or {}
            if not rec.get("runs"):
                return [], []
            runs, refused = design_runs(self.runner.sf.path)
            for why in refused:
                self.progress(f"twin design: refused {why}")
            self._designed = (runs, list(rec["runs"]))
        return self._designed

    def _fit(self, trials: int, read: tuple[list, list] | None, designed: bool = False) -> None:
        """One fit of the twin (the baseline's, a refit once ``trials`` were measured, or the first fit again with the
        designed runs), from the last fit's parameters when there is one; its profile written and logged."""
        from vkit.sim.calibrated import CostParams

        r = self.runner
        opts = r.s.workload.options
        refit = self.twin is not None and not designed
        prior = None if self.twin is not None else self.prior
        self.progress(f"twin: {'refitting' if refit else 'calibrating'} the simulator on the baseline's load points"
                      + (f" and those of {trials} trial(s)" if refit else "") + (" and the designed runs" if designed else "")
                      + (f", starting from run {prior['run_id']}'s fit (knowledge base)" if prior else ""))
        plan = r.s.capacity.plan
        path = design_profile_path(r.runs_dir) if designed else profile_path(r.runs_dir, trials if refit else 0)
        runs = self.designed_runs()[0]
        self.twin = Twin.calibrate(r.sf.path, int(opts.random_input_len), int(opts.random_output_len), r.s.capacity.slo,
                                   plan.crossing_factor * plan.point_seconds, path, progress=lambda s: self.progress(f"twin: {s}"),
                                   trials=refit, keep_up=plan.keep_up, read=read, designed=runs or None,
                                   base=self.twin.params if self.twin is not None else CostParams.from_dict(prior["params"])
                                   if prior else None)
        self.twin.hint, self.fitted_on = self.baseline_capacity(), trials
        f = self.twin.fit
        r.log("twin_profile", profile=path, profile_sha256=self.twin.profile_sha256, trials=trials,
              started_from=prior and {"run_id": prior["run_id"], "profile_sha256": prior.get("profile_sha256")},
              inputs=self.twin.inputs(), load_points=f["load_points"], designed_runs=f["designed_runs"],
              disturbed=f["disturbed"],
              rms_log_error=round(f["rms_log_error"], 4),
              parameters={n: {"value": row["value"], "rse": row["rse"], "identified": row["identified"]}
                          for n, row in f["table"].items()})
        for why in sorted(set(f["disturbed"]) - self._told):
            self.progress(f"twin: refused {why}")
        self._told.update(f["disturbed"])
        self.progress(f"twin: fitted on {f['load_points']} load point(s)"
                      + (f" and {f['designed_runs']} designed run(s)" if f["designed_runs"] else "")
                      + f", rms log error {f['rms_log_error']:.1%} (profile sha256 {self.twin.profile_sha256[:12]})")

    def baseline_capacity(self) -> float | None:
        """The kept configuration's capacity as its baseline measured it (None before one is measured)."""
        base = (self.runner.ledger.record("baseline").get("metrics") or {}).get("slo_capacity")
        return float(base) if isinstance(base, (int, float)) and base > 0 else None

    def measured(self, hist: list[search.Observation]) -> list[tuple[dict, float]]:
        base = self.baseline_capacity()
        return ([(dict(self.runner.ledger.kept_config()), base)] if base is not None else []) + screened(hist)

    def settle(self, hist: list[search.Observation]) -> None:
        """After the step: the misses of the trials measured after its last proposal (its budget spent, ``next`` never
        saw them), logged as every other; against the screens, not a baseline rebased on a keep since."""
        self._misses(screened([h for h in hist if h.step != "pending"]))

    def _misses(self, measured: list[tuple[dict, float]]) -> None:
        for cfg, m in measured:
            k = _key(cfg)
            p = self.predicted.get(k)
            if p is not None and k not in self.missed and not p.lo <= m <= p.hi:
                self.missed.add(k)
                self.runner.log("twin_miss", config=cfg, measured=round(m, 4), prediction=p.as_dict(),
                                profile_sha256=self.calibrated().profile_sha256)
                self.progress(f"twin miss: {cfg} measured {m:.4g} req/s, predicted {p.capacity:.4g} [{p.lo:.4g}, {p.hi:.4g}]")

    def next(self, hist: list[search.Observation]) -> search.Proposal | None:
        running = {_key(h.config) for h in hist if h.step == "pending"}  # on slots: proposed, still measured elsewhere
        hist = [h for h in hist if h.step != "pending"]
        measured = self.measured(hist)
        self._misses(measured)  # against the twin that made each prediction, before any refit
        twin = self.calibrated(trials=len(measured) - (self.baseline_capacity() is not None))
        kept = self.runner.ledger.kept_config()
        tried = {_key(kept)} | running | {_key(h.config) for h in hist if h.step == STEP}
        best = max((m for _, m in measured), default=0.0)
        space = twin_space(self.policy, kept, self.runner.ledger.tune().frozen)
        preds = twin.rank(space, measured, progress=self.progress)
        bar = best * (1 + MIN_GAIN)
        open_ = reaching(preds, tried, best)
        head = [p.as_dict() for p in preds[:5]]
        if not open_:
            top = next((p for p in preds if _key(p.config) not in tried), None)
            self.why = (f"twin: no untried configuration's 90 % interval reaches {bar:.4g} req/s (the best measured, "
                        f"{best:.4g}, + {MIN_GAIN:.0%})" + (f"; the highest upper bound left is {top.hi:.4g} at {top.config}"
                                                            if top else "; every configuration was measured"))
            return None
        spent = restarts_spent(self.runner)
        if self.max_restarts is not None and spent + RESERVED_RESTARTS > self.max_restarts:
            self.why = (f"restart budget: {spent} restart(s) spent, a trial and its confirmation and promise need "
                        f"{RESERVED_RESTARTS} more, --max-restarts {self.max_restarts} ({len(open_)} candidate(s) left)")
            return None
        p = open_[0]
        self.predicted[_key(p.config)] = p
        audit = {"twin": {"profile_sha256": twin.profile_sha256, "inputs": twin.inputs(), "prediction": p.as_dict(),
                          "correction": round(math.log(p.capacity / p.raw), 4) if p.raw > 0 else None,
                          "best_measured": best, "measured": [[c, m] for c, m in measured], "tried": sorted(tried),
                          "space": space, "ranking": head}}
        reason = (f"twin: predicted {p.capacity:.4g} req/s [{p.lo:.4g}, {p.hi:.4g}] (90 %) against the best measured "
                  f"{best:.4g}; {len(open_) - 1} other candidate(s) still reach it")
        # the kept configuration's other parameters (max_model_len, ...) go with it: a candidate never drops one
        return search.Proposal(config={**kept, **p.config}, step=STEP, reason=reason, audit=audit)

    def stop_reason(self, hist: list[search.Observation]) -> str:
        return self.why or f"twin search ended after {len([h for h in hist if h.step == STEP])} trial(s)"


def screened(hist: list[search.Observation]) -> list[tuple[dict, float]]:
    """The twin step's trials' measured capacities: (configuration, req/s)."""
    out = []
    for h in hist:
        v = h.objectives.get("slo_capacity")
        if h.step == STEP and h.feasible and isinstance(v, (int, float)) and v > 0:
            out.append((dict(h.config), float(v)))
    return out


def reaching(preds: list[Prediction], tried: set[str], best: float) -> list[Prediction]:
    """The untried predictions whose interval reaches past ``best`` by MIN_GAIN, best first."""
    return [p for p in preds if _key(p.config) not in tried and p.hi > best * (1 + MIN_GAIN)]


def twin_replay(records: list[dict], base_dir: str) -> dict | None:
    """The twin's proposals of a decision log re-derived without a server (None: the log holds none): each
    from the profile its audit names (its sha256 checked) and the inputs, measurements and tried
    configurations it logged; {proposals, identical, differences}. ``base_dir``: where a relative profile
    path is resolved."""
    from vkit.errors import UsageError
    from vkit.sim.calibrated import load_profile

    profiles = {r.get("profile_sha256"): r.get("profile") for r in records if r.get("event") == "twin_profile"}
    props = [r for r in records if r.get("event") == "propose" and (r.get("audit") or {}).get("twin")]
    if not props:
        return None
    twins: dict[str, Twin] = {}
    rows = []
    for n, r in enumerate(props):
        tw = r["audit"]["twin"]
        sha = tw["profile_sha256"]
        if sha not in twins:
            path = profiles.get(sha)
            if not path:
                raise UsageError(f"the log names profile {sha[:12]} but holds no twin_profile event for it")
            path = path if os.path.isabs(path) else os.path.join(base_dir, path)
            with open(path, "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() != sha:
                    raise UsageError(f"{path} is not the profile the proposals were made with (its sha256 differs)")
            twins[sha] = Twin.from_inputs(tw["inputs"], load_profile(path)["cost_params"], sha)
        preds = twins[sha].rank(tw["space"], [(dict(c), float(m)) for c, m in tw["measured"]])
        got = reaching(preds, set(tw["tried"]), float(tw["best_measured"]))
        again = got[0].config if got else None
        if again is None or _key(again) != _key(r["config"]):
            rows.append({"record": n, "trial": r.get("trial"), "logged": r["config"], "replayed": again})
    return {"proposals": len(props), "identical": len(props) - len(rows), "differences": rows}


def run_twin_step(runner: Tune, policy: Policy, plan, progress: Callable[[str], None], prior: dict | None = None) -> dict | None:
    """The twin step under ``plan`` (a TunePlan: --budget, --max-restarts, --twin-refit, --twin-design): its proposals
    screened and the best confirmed (``run_screening_step``), then the misses of its last trials logged
    (:meth:`TwinSearch.settle`); ``prior``: :func:`prior_twin` of the knowledge base's matching entries. None when, under
    --search auto (``plan.twin_fallback``), the twin cannot calibrate: the reason logged (``twin_fallback``) and said,
    and the caller runs the staged steps instead; --search twin refuses there (a usage error)."""
    from vkit.tune.steps.common import observations
    from vkit.tune.steps.screening import run_screening_step

    ts = TwinSearch(runner, policy, plan.max_restarts, progress, refit=plan.twin_refit, prior=prior, design=plan.twin_design)
    if plan.twin_fallback:
        try:
            ts.calibrated()
        except (Uncalibrated, ValueError, ArithmeticError) as e:  # no usable point; a fit that failed numerically
            why = str(e) if isinstance(e, Uncalibrated) else f"the twin's fit failed ({type(e).__name__}: {e})"
            runner.log("twin_fallback", reason=why, search="staged")
            runner.warn(f"twin: {why}; the staged steps search instead (--search staged asks for them; --search twin "
                        "refuses here)")
            return None
    rec = run_screening_step(runner, STEP, ts.next, progress, plan.budget, ts.stop_reason)
    ts.settle(observations(runner))
    return rec


def run_profile(runner: Tune, log: list[dict] | None = None) -> dict | None:
    """This run's last ``twin_profile`` event whose profile file is still there, None without one (a fit of an earlier
    run in the same decision log, its profile in that run's directory, is not this run's). ``log``: the decision
    log's events when the caller has read them already."""
    mine = os.path.join(os.path.abspath(runner.runs_dir), "")
    prof = next((e for e in reversed(runner.sf.log.read() if log is None else log) if e.get("event") == "twin_profile"
                 and os.path.abspath(e.get("profile") or "").startswith(mine)), None)
    return prof if prof is not None and os.path.exists(prof["profile"]) else None


def kb_twin(runner: Tune) -> dict | None:
    """This run's last twin fit for the knowledge base (its parameters, profile sha256, error), None without one
    (:func:`run_profile`)."""
    from vkit.sim.calibrated import load_profile

    prof = run_profile(runner)
    if prof is None:
        return None
    return {"params": load_profile(prof["profile"])["params"], "profile_sha256": prof.get("profile_sha256"),
            "rms_log_error": prof.get("rms_log_error"), "load_points": prof.get("load_points")}


def prior_twin(entries: list[dict]) -> dict | None:
    """The latest matching knowledge-base entry's twin fit, with its run id (None: no entry carries one)."""
    for e in reversed(entries):
        if isinstance(e.get("twin"), dict) and isinstance(e["twin"].get("params"), dict):
            return dict(e["twin"], run_id=e.get("run_id"))
    return None


def twin_table(runner: Tune) -> dict | None:
    """The twin's predictions beside what the server measured (the result's ``capacity.twin``): the
    profile, every twin proposal (its prediction and interval when proposed, the trial's measured
    capacity, whether it fell inside) and the rank correlation over the measured ones; {fallback: the reason} when
    the default search gave way to the staged steps (``twin_fallback``); None when this run made none (an earlier
    run's fit and proposals in the same decision log are not this run's: :func:`run_profile`)."""
    log = runner.sf.log.read()
    since = str(runner.ledger.tune().tune.get("started") or "")  # this run's fallback, even after an earlier run's twin
    fell = next((e for e in reversed(log) if e.get("event") == "twin_fallback" and str(e.get("ts") or "") >= since), None)
    if fell is not None:
        return {"fallback": fell.get("reason"), "rows": []}
    prof = run_profile(runner, log)  # an earlier run's fit in the same decision log is not this run's
    if prof is None:
        return None
    trials = {t["id"]: t for t in runner.ledger.trials()}
    rows = []
    for e in log:
        tw = (e.get("audit") or {}).get("twin") if e.get("event") == "propose" else None
        if not tw or e.get("trial") not in trials or str(e.get("ts") or "") < since:
            continue
        t, p = trials[e["trial"]], tw["prediction"]
        m = (t.get("metrics") or {}).get("slo_capacity") if t["status"] == Status.DONE else None
        rows.append({"trial_id": t["id"], "config": p["config"], "predicted": p["capacity"], "lo": p["lo"], "hi": p["hi"],
                     "measured": m, "status": t["status"], "inside": None if m is None else bool(p["lo"] <= m <= p["hi"])})
    done = [r for r in rows if r["measured"] is not None]
    rho = None
    if len(done) >= 3:
        from scipy.stats import spearmanr

        rho = float(spearmanr([r["predicted"] for r in done], [r["measured"] for r in done]).statistic)
    return {"profile": prof.get("profile"), "profile_sha256": prof.get("profile_sha256"), "inputs": prof.get("inputs"),
            "rms_log_error": prof.get("rms_log_error"), "parameters": prof.get("parameters"), "rows": rows,
            "misses": sum(r["inside"] is False for r in rows), "spearman": rho}

