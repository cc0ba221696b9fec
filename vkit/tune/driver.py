"""The drivers of tune and sweep: a whole tuning run (:func:`tune`) and each of sweep's modes —
one step or a Bayesian search (:func:`sweep_step`), delivery with an optional re-confirmation
(:func:`deliver`), ablation (:func:`ablate`), replay of logged proposals (:func:`replay`).

They take typed inputs — the run's ``Settings`` and workloads, a :class:`TunePlan`, a
:class:`RunContext` (tool, lease owner, policy, callbacks) — and return typed results. The CLI
builds the inputs from its flags (``vkit.cli._tuneargs``), makes one call and prints what comes
back; everything that reads or writes the state or drives trials is here. Library only:
progress and warnings go to the callbacks, nothing is printed.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Callable, Iterator

from vkit import search
from vkit.apply.backend import PROCESS
from vkit.errors import Abnormal, ExitCode, UsageError, VkitError
from vkit.jsonio import load_json_lines
from vkit.state import StateFile, now_iso
from vkit.tune import capsentinel, knowledge
from vkit.tune import steps as tuning
from vkit.tune.assemble import build_result, goal, recommended_capacity, server_info, sigma_text
from vkit.tune.config import Settings, Workload
from vkit.tune.context import Tune, new_tune
from vkit.tune.ledger import Ledger
from vkit.tune.result import TuneResult
from vkit.tune.runplan import Replay, RunContext, StepRun, Tuned, TunePlan
from vkit.tune.slotrun import on_first_slot, slot_leases, stop_other_slots, take_out_failed_slot


@contextlib.contextmanager
def held(sf: StateFile, ctx: RunContext) -> Iterator[StateFile]:
    """The service's lease for ``ctx.owner`` over the block; refused while the environment is ABNORMAL."""
    ab = Ledger(sf).server().abnormal
    if ab.get("flag"):
        raise Abnormal(f"the environment is ABNORMAL since {ab.get('since')}: {ab.get('reason')}; fix the cause, then "
                       "`state --clear-abnormal --reason ...`")
    with sf.leases.hold(ctx.owner, ttl_s=ctx.lease_ttl_s, tool=ctx.tool):
        yield sf


def make_tune(sf: StateFile, s: Settings, ctx: RunContext, run_id: str | None = None) -> Tune:
    """A tune whose measurements go to runs/<run_id>/ beside the state (when given), its restarts
    under ``ctx.owner``'s lease; with slots, on the first slot in service (``on_first_slot``)."""
    r = new_tune(sf, s, ctx.progress, tool_name=ctx.tool, owner=ctx.owner, policy=ctx.policy, interrupts=ctx.interrupts,
                 warn=ctx.warn, backend=ctx.backend)
    if run_id:
        r.runs_dir = os.path.join(sf.dir, "runs", run_id)
        os.makedirs(r.runs_dir, exist_ok=True)
    if ctx.ray:
        if not r.ledger.slots(live=False):
            raise UsageError("--ray serves the state's slots on the cluster's nodes: this state has none (state init --slots N "
                             "or --slots-file FILE, with a node per slot where it matters)")
        from vkit.tune.fleet import Fleet

        r.fleet = Fleet(ctx.ray, sf.path, s, ctx.owner, ctx.tool, ctx.policy, progress=ctx.progress)
    return on_first_slot(r)


def check_drift(runner: Tune, warn: Callable[[str], None], fresh: bool = True) -> dict:
    """The drift sentinel between two steps; on a change the baseline is measured again. Under the capacity
    objective, the kept configuration at the low end of its capacity's interval (``vkit.tune.capsentinel``)."""
    if runner.s.capacity is not None:
        d = capsentinel.sentinel(runner, fresh=fresh)
        what = d["why"]
    else:
        d = runner.sentinel.check()
        what = f"the kept configuration's throughput moved {d.get('shift') or 0:+.1%}"
    if d["changed"]:
        warn(f"drift: {what}; re-measuring the baseline")
        runner.baselines.measure(force=True)
    return d


# -- tune -----------------------------------------------------------------------------------------
def tune(sf: StateFile, settings: Settings, mixed: Workload, plan: TunePlan, ctx: RunContext,
         write_report: Callable[[TuneResult, str], dict] | None = None,
         on_abnormal: Callable[[str | None], None] | None = None,
         advise: Callable[[Tune, Callable], Callable] | None = None) -> Tuned:
    """The whole tuning run under the lease — LEASE → (step 1) → BASELINE → the staged steps or the
    Bayesian search, with a drift check after each → (step 5) → CONVERGE — resumed when the state
    holds an unfinished run with the same settings. ``mixed`` is step 5's workload. The result goes
    to ``write_report(result, out_dir)`` (vkit.report's, which this stage does not import), then the
    run is recorded as finished. ``on_abnormal(reason)`` is told when the run stops on an
    environment that turned ABNORMAL. ``advise(runner, proposer)`` wraps the Bayesian search's
    proposer (``vkit.tune.advisor``, tune --advisor)."""
    t0 = (ctx.backend or PROCESS).now()  # the run's time on its backend's clock (virtual: simulated seconds)
    with held(sf, ctx), slot_leases(sf, ctx):
        run_id = _open_run(sf, settings, plan, ctx)
        runner = make_tune(sf, settings, ctx, run_id=run_id)
        while True:
            try:
                result = _drive(runner, settings, mixed, plan, ctx, run_id, t0, advise)
                break
            except VkitError as e:
                nxt = take_out_failed_slot(runner, e)
                if nxt is not None:
                    runner = nxt
                    continue
                ab = (runner.served.server().abnormal if e.code == ExitCode.UNAVAILABLE else {})
                if ab.get("flag") and on_abnormal is not None:
                    on_abnormal(ab.get("reason") if runner.slot is None else f"slot {runner.slot}: {ab.get('reason')}")
                raise
        stop_other_slots(runner)
    out_dir = plan.report_dir or os.path.join(sf.dir, "reports", run_id)
    paths = write_report(result, out_dir) if write_report is not None else {}
    sf.tune.update(finished=now_iso(), report=paths)
    sf.log.append(ctx.tool, "converge", recommendation=result.recommendation, report=paths)
    return Tuned(result=result, run_id=run_id, report=paths)


def _open_run(sf: StateFile, settings: Settings, plan: TunePlan, ctx: RunContext) -> str:
    """Start a new tuning run (archiving a finished one), or resume the unfinished one the state
    holds when its settings are the same; returns the run's id."""
    st = Ledger(sf).tune()
    cfg: dict[str, Any] = {"mode": plan.mode, "steps": list(plan.steps), "budget": plan.budget, "max_restarts": plan.max_restarts,
                           "workload": settings.workload.describe(), "slo": settings.slo, "guards": settings.guards,
                           "baseline_repeats": settings.baseline_repeats, "baseline_starts": settings.starts(),
                           "screen_repeats": settings.screen_repeats,
                           "objective": settings.objective,
                           "capacity": settings.capacity.describe() if settings.capacity is not None else None}
    prev = st.tune
    if plan.restart or not prev or prev.get("finished"):
        cfg["run_id"] = time.strftime("run-%Y%m%dT%H%M%S", time.gmtime())
        cfg["started"] = now_iso()
        sf.tune.start(cfg, archive=bool(prev))
    else:
        theirs = {k: prev.get(k) for k in cfg}
        if cfg != theirs:
            diff = sorted(k for k in cfg if cfg[k] != theirs[k])
            raise UsageError(f"this state holds an unfinished tuning run with other settings ({', '.join(diff)}); resume it "
                             "with the same flags, or pass --restart")
        ctx.progress(f"resuming tuning run {prev.get('run_id')} ({len(st.trials())} trials recorded)")
    return Ledger(sf).tune().tune["run_id"]


def _drive(runner: Tune, settings: Settings, mixed: Workload, plan: TunePlan, ctx: RunContext, run_id: str,
           t0: float, advise: Callable[[Tune, Callable], Callable] | None = None) -> TuneResult:
    """The run's machine states, from LEASE to CONVERGE, and its knowledge-base entry."""
    sf, steps, main = runner.sf, plan.steps, settings.workload
    sf.service.set_machine_state("LEASE")
    if "1" in steps:
        longest = (mixed.options.mixed_long_len or 4 * main.options.random_input_len) if "5" in steps else main.options.random_input_len
        need = plan.business_len or int((longest + main.options.random_output_len) * 1.25)
        tuning.run_step1(runner, plan.max_model_len_candidates, need, main.options.max_concurrency, ctx.progress)
    sf.service.set_machine_state("BASELINE")
    staged = [x for x in steps if x in ("2", "3", "4m", "4")]
    # with slots, the A/A pass (what a comparison across devices carries) runs beside the baseline
    b = tuning.baseline_beside_aa(runner, ctx.progress) if staged else runner.baselines.measure()
    shown = ("slo_capacity", "ref_mean_tpot_ms") if settings.capacity is not None else ("output_throughput", "p95_ttft_ms", "mean_tpot_ms")
    ctx.progress("baseline: " + ", ".join(f"{k} {v:.4g} (σ {b['sigma'].get(k, 0):.1%})" for k, v in b["metrics"].items()
                                          if k in shown))
    comp = (b.get("components") or {}).get(shown[0]) or {}
    ctx.progress(f"baseline σ of {shown[0]}: {sigma_text(comp)}")
    if staged:
        tuning.guard_anomalies(runner)
    kb = plan.kb_path or knowledge.default_path(sf.dir)
    kb_key = knowledge.fingerprint_key(runner.ledger.raw(), server_info(runner))
    kb_work = {"bench_args": main.options.flags(), "slo": settings.slo}
    matched = _knowledge(sf, kb, kb_key, kb_work, plan.mode, ctx.progress)
    if staged:
        sf.service.set_machine_state("PROPOSE")
    # the twin ranks the space, the server screens and confirms its proposals (None: it cannot calibrate, staged instead)
    if plan.mode == "twin" and staged and tuning.run_twin_step(runner, ctx.policy, plan, ctx.progress,
                                                                 tuning.prior_twin(matched)) is not None:
        check_drift(runner, ctx.warn, fresh=False)  # on the kept process the twin step left: no restart
        if "4m" in staged:  # the twin says first whether more KV cache can pay (no start when it cannot)
            tuning.run_twin_memory_step(runner, ctx.policy, ctx.progress, plan.budget)
    elif plan.mode == "bo" and staged:
        nxt, stop = tuning.bo_proposer(runner, ctx.policy, plan.budget, plan.seed, prior=tuning.prior_observations(matched),
                                       acquisition=plan.acquisition, patience=plan.patience, batch_lie=plan.batch_lie)
        if advise is not None:
            nxt = advise(runner, nxt)
        tuning.run_screening_step(runner, "bo", nxt, ctx.progress, plan.budget, stop)
        check_drift(runner, ctx.warn)
        if "4m" in staged:  # the search tried memory fractions on a lattice; 4m finds the highest that starts
            tuning.run_gpu_memory_step(runner, ctx.policy, ctx.progress, plan.budget)
            check_drift(runner, ctx.warn)
    else:
        for step in staged:
            sf.service.set_machine_state("PROPOSE")
            if step == "4m":  # its own search (bisection on starts, then validation under the load)
                tuning.run_gpu_memory_step(runner, ctx.policy, ctx.progress, plan.budget)
                check_drift(runner, ctx.warn)
                continue
            nxt, stop = tuning.staged_proposer(runner, ctx.policy, step, plan.staged_candidates)
            tuning.run_screening_step(runner, step, nxt, ctx.progress, plan.budget, stop)
            if plan.ablate:
                tuning.auto_ablate(runner, step, ctx.progress)
            check_drift(runner, ctx.warn)
    if "5" in steps:
        tuning.run_step5(runner, mixed, ctx.progress)
    sf.service.set_machine_state("CONVERGE")
    if plan.confirm_front > 0:
        tuning.confirm_front(runner, goal(settings), plan.confirm_front, ctx.progress)
    if settings.capacity is not None and settings.capacity.verify_seconds > 0:
        _verify_promise(runner, settings, ctx)
    runner.seat.restore_kept()  # the tune ends on the kept configuration (a no-op when it already runs)
    result = build_result(runner, settings, t0)
    if not runner.ledger.tune().tune.get("kb_recorded"):
        knowledge.record(kb, kb_key, kb_work, tuning.kb_observations(runner), result.recommendation, run_id, tuning.kb_twin(runner))
        sf.tune.update(kb_recorded=True)
    return result


def _verify_promise(runner: Tune, settings: Settings, ctx: RunContext) -> dict | None:
    """The recommendation's promised capacity run for ``verify_seconds`` (resumed: a verification of
    the same configuration already recorded in this run is kept)."""
    sf = runner.sf
    rec = tuning.deliver(runner, goal(settings)).get("recommendation") or {}
    prev = runner.ledger.tune().tune.get("promise") or {}
    if prev.get("finished") and prev.get("config") == rec.get("config"):
        return prev
    searched = (recommended_capacity(runner, rec) or {}).get("req_s")
    if not rec.get("config") or not isinstance(searched, (int, float)):
        return None
    ctx.progress(f"promise: verifying {searched:g} for the recommendation over {settings.capacity.verify_seconds:g} s")
    out = runner.promise.verify(rec["config"], searched)
    sf.tune.update(promise=out)
    return out


def _knowledge(sf: StateFile, kb: str, key: dict, work: dict, mode: str, progress: Callable[[str], None]) -> list[dict]:
    """The knowledge base's entries of this environment (recorded in the run, said in progress)."""
    matched, ignored = knowledge.match(kb, key, work)
    if matched or ignored:
        progress(f"knowledge base {kb}: {len(matched)} earlier run(s) of this environment"
                 + knowledge.USES.get(mode, knowledge.USES["staged"])
                 + (f"; {len(ignored)} ignored, measured in another environment or workload: " + "; ".join(ignored[:3])
                    if ignored else ""))
    sf.tune.update(knowledge={"path": kb, "matched": [e.get("run_id") for e in matched], "ignored": ignored})
    return matched


# -- sweep ----------------------------------------------------------------------------------------
def sweep_step(sf: StateFile, settings: Settings, ctx: RunContext, step: str | None, mode: str = "staged",
               budget: int = 8, seed: int = 1, staged_candidates: str = "policy",
               advise: Callable[[Tune, Callable], Callable] | None = None, acquisition: str = "auto",
               patience: int = tuning.BO_PATIENCE, batch_lie: str = "kb") -> StepRun:
    """One staged step (``step`` 2, 3 or 4) or, with ``mode`` bo, the Bayesian search, under the
    lease: the baseline first (resumed when measured), then screening, confirmation, KEEP or REVERT.
    ``advise(runner, proposer)`` wraps the Bayesian search's proposer (``vkit.tune.advisor``)."""
    if mode != "bo" and step is None:
        raise UsageError("a staged sweep needs its step (2, 3 or 4)")
    with held(sf, ctx), slot_leases(sf, ctx):
        runner = make_tune(sf, settings, ctx, run_id=Ledger(sf).tune().tune.get("run_id") or "sweep")
        runner.baselines.measure()
        tuning.guard_anomalies(runner)
        if mode == "bo":
            nxt, stop = tuning.bo_proposer(runner, ctx.policy, budget, seed, acquisition=acquisition, patience=patience,
                                           batch_lie=batch_lie)
            if advise is not None:
                nxt = advise(runner, nxt)
            rec = tuning.run_screening_step(runner, "bo", nxt, ctx.progress, budget, stop)
        else:
            nxt, stop = tuning.staged_proposer(runner, ctx.policy, step, staged_candidates)
            rec = tuning.run_screening_step(runner, step, nxt, ctx.progress, budget, stop)
        runner.seat.restore_kept()  # a sweep ends on the kept configuration
    st = Ledger(sf).tune()
    return StepRun(step=rec, trials=st.trials(step=rec["step"]), kept=st.kept)


def deliver(sf: StateFile, settings: Settings, ctx: RunContext, confirm_front: int = 0) -> dict:
    """The Pareto front, knee and recommendation of the trials so far (``steps.deliver``). With
    ``confirm_front`` > 0, up to that many front members are first re-confirmed against the kept
    configuration under the lease (restarts); with 0 the state is only read."""
    confirm = confirm_front > 0
    # re-confirming the front restarts the server: under the lease, like any trial; reading needs none
    with (held(sf, ctx) if confirm else contextlib.nullcontext(sf)):
        runner = make_tune(sf, settings, ctx, run_id="deliver" if confirm else None)
        if confirm:
            tuning.confirm_front(runner, goal(settings), confirm_front, ctx.progress)
            runner.seat.restore_kept()
        return tuning.deliver(runner, goal(settings))


def ablate(sf: StateFile, settings: Settings, ctx: RunContext) -> dict:
    """Under the lease: each parameter of the last kept multi-parameter change measured alone
    against the configuration it replaced (``steps.run_ablation``)."""
    with held(sf, ctx):
        runner = make_tune(sf, settings, ctx, run_id="ablate")
        return tuning.run_ablation(runner, ctx.progress)


def replay(log_path: str) -> Replay:
    """Re-derive every replayable proposal of a decision log and compare (``search.replay_mismatches``)."""
    recs = [r for _, r in load_json_lines(log_path, "decision log")]
    records = [r["audit"]["replay"] for r in recs if r.get("event") == "propose" and (r.get("audit") or {}).get("replay")]
    twin = None if records else tuning.twin_replay(recs, os.path.dirname(os.path.abspath(log_path)))
    if twin is not None:  # tune --search twin: each proposal re-ranked from its profile and logged inputs
        return Replay(**twin)
    if not records:
        raise UsageError(f"{log_path} holds no replayable proposals (Bayesian-search and twin proposals carry their inputs)")
    bad = search.replay_mismatches(records)
    return Replay(proposals=len(records), identical=len(records) - len(bad), differences=bad)
