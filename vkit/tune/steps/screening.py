"""A screening step: candidates proposed, screened (one at a time, or side by side on slots), the winner confirmed
and kept; stop rules on budget, time and power."""

from __future__ import annotations

import math
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Callable

from vkit import search
from vkit.apply.policy import to_serve_flags
from vkit.decide import power
from vkit.decide.components import comparison_sigma, comparison_sigma_low
from vkit.decide.specs import parse_metric
from vkit.errors import ExitCode, VkitError
from vkit.state import now_iso
from vkit.tune.compare import MAIN, Versus
from vkit.tune.context import Tune, for_slot, use_first_slot
from vkit.tune.ledger import PENDING, RANKED, Status
from vkit.tune.steps.common import (
    STEP_NAMES,
    finished_step,
    objectives,
    observations,
    open_trial,
    primary_metric,
    record_step,
    search_slo,
)


def run_screening_step(runner: Tune, step: str, proposer: Callable[[list], Any], progress: Callable[[str], None],
                       budget: int, stop_text: Callable[[list], str]) -> dict:
    """Propose → trial (APPLY/VERIFY/VALIDATE/GATE-screen) until the proposer is done or the budget is
    spent; then confirm the best screened candidate (fresh, interleaved), its blocks planned for its
    screened effect less the winner's curse, and KEEP it or REVERT. The power analysis decides nothing
    before the screening: a step is underpowered only when its winner cannot be confirmed."""
    done = finished_step(runner, step)
    if done:
        return done
    if len(runner.ledger.slots()) > 1:
        stop = _screen_on_slots(runner, step, proposer, progress, budget, stop_text)
    else:
        stop = _screen_one_at_a_time(runner, step, proposer, progress, budget, stop_text)
    hist = observations(runner, (step,))
    best = _best_screened(runner, step)
    rec: dict[str, Any] = {"step": step, "name": STEP_NAMES.get(step, step), "trials": [h.trial_id for h in hist], "stop_rule": stop}
    rivals = runner.ledger.trials(step=step, status=RANKED)
    effect = None if best is None else screened_effect(runner, best, rivals)
    if best is None or (effect is not None and effect.observed <= 0):
        rec["result"] = "no candidate beat the kept configuration on screening; nothing to confirm" + (
            "" if best is None else f" (the best screened, {best['id']}, measured {math.expm1(effect.observed):+.1%})")
    else:
        k = max(1, len([h for h in hist if h.feasible]))
        conf = runner.confirmer.confirm_and_keep(best["id"], selected_from=k, effect=effect)
        rec["confirmed"] = {"trial_id": best["id"], "decision": conf.get("decision"), "why": conf.get("why")}
        rec["result"] = (f"kept {best['id']} ({' '.join(to_serve_flags(best['changes']))})" if conf.get("decision") == "kept"
                         else f"best screened {best['id']} not kept: {conf.get('decision')} — {conf.get('why')}")
        refuse_underpowered(runner, rec, conf, progress)
    runner.seat.settle()
    rec["finished"] = now_iso()
    record_step(runner, rec)
    progress(f"step {step} done: {rec['result']}; stop rule: {stop}")
    return rec


def _spent(runner: Tune, step: str, running: bool = False) -> int:
    """Trials of ``step`` that count toward its budget: the finished ones (a skipped candidate cost no
    restart: it does not), and with ``running`` those proposed or running too."""
    counted = {Status.DONE, Status.ELIMINATED, Status.START_FAILED, Status.INVALID} | (PENDING if running else set())
    return len(runner.ledger.trials(step=step, status=counted))


def _out_of_budget(runner: Tune, step: str, budget: int, progress: Callable[[str], None], running: bool = False) -> str | None:
    """Why ``step`` proposes no more candidates (its trial budget or its time spent), or None."""
    spent = _spent(runner, step, running)
    if spent >= budget:
        return f"budget of {budget} trials for step {step} spent"
    return over_time(runner, step, budget - spent, progress)


def lies(runner: Tune, pending: list[dict], hist: list[search.Observation] | None = None) -> list[search.Observation]:
    """Batch proposals: the configurations proposed but not yet measured, as observations a proposer
    reads as measured and promising (the best value of each objective so far, a maximised one 10 % above
    it), so it proposes the next configuration of its plan instead of the same one again and does not
    stop a sweep at a knee the pending values may not show. Never recorded: the real screening replaces them.
    ``hist``: ``observations(runner)`` when the caller has read it already."""
    hist = observations(runner) if hist is None else hist
    objs = objectives(runner)
    best = {}
    for o in objs:
        vals = [h.objectives[o.name] for h in hist if h.feasible and isinstance(h.objectives.get(o.name), (int, float))]
        if not vals:  # nothing screened yet: the kept configuration's baseline
            v = (runner.ledger.record("baseline").get("metrics") or {}).get(o.name)
            vals = [v] if isinstance(v, (int, float)) else []
        if vals:
            best[o.name] = max(vals) if o.direction == "max" else min(vals)
    out = []
    for i, cfg in enumerate(pending):
        obj = {k: (v * 1.10 ** (i + 1) if next(o for o in objs if o.name == k).direction == "max" else v) for k, v in best.items()}
        out.append(search.Observation(config=dict(cfg), objectives=obj, repeats=[], feasible=len(obj) == len(objs),
                                      slo_ok=True, step="pending", trial_id=f"pending-{i}"))
    return out


def _screen_on_slots(runner: Tune, step: str, proposer: Callable[[list], Any], progress: Callable[[str], None],
                     budget: int, stop_text: Callable[[list], str]) -> str:
    """Screening on the slots, asynchronously: every live slot measures a trial, and when one ends its
    outcome is logged and the next candidate is proposed at once on the history as it then stands
    (the trials still running as ``lies``), so no slot waits for the slowest trial of a batch. Each
    proposal's audit records what it was made from (the trials in flight and their configurations;
    a Bayesian proposal its whole input), so the decision log replays whatever order the slots
    finished in; outcomes that end together are logged in trial-id order."""
    flight: dict[str, tuple[dict, Future]] = {}
    spent_out: str | None = None  # the budget or the time is spent: no new proposal
    with runner.interrupts.every_section(), ThreadPoolExecutor(max_workers=max(1, len(runner.ledger.slots(live=False)))) as ex:
        while True:
            live = runner.ledger.slots()
            if not live:
                raise VkitError("every slot has been taken out (see `state show`); fix them, then `state --slot-in NAME` and "
                                "rerun the same command to continue", ExitCode.UNAVAILABLE)
            busy = {slot["name"] for slot, _ in flight.values()}
            free = [x for x in live if x["name"] not in busy]
            for tid, slot in _waiting_trials(runner, step, flight, live, free):
                free.remove(slot)
                flight[tid] = (slot, ex.submit(_trial_on_slot, runner, slot, tid))
                progress(f"{tid} on slot {slot['name']}")
            while free and spent_out is None:
                spent_out = _out_of_budget(runner, step, budget, progress, running=True)
                if spent_out:
                    break
                tid = _propose_on_slots(runner, step, proposer, flight, len(live))
                if tid is None:
                    break  # nothing to propose now; a trial still running may change that when it ends
                slot = free.pop(0)
                flight[tid] = (slot, ex.submit(_trial_on_slot, runner, slot, tid))
                progress(f"{tid} on slot {slot['name']}" + (f" ({len(flight) - 1} other(s) running)" if len(flight) > 1 else ""))
            if not flight:
                return spent_out or stop_text(observations(runner))
            ended, _ = wait([f for _, f in flight.values()], return_when=FIRST_COMPLETED)
            for tid in sorted(t for t, (_, f) in flight.items() if f in ended):
                slot, f = flight.pop(tid)
                _after_trial(runner, tid, slot, f.result(), progress)
            if not use_first_slot(runner):
                raise VkitError("every slot has been taken out (see `state show`): fix them, then `state --slot-in NAME` and "
                                "rerun the same command to continue", ExitCode.UNAVAILABLE)


def _propose_on_slots(runner: Tune, step: str, proposer: Callable[[list], Any], flight: dict, slots: int) -> str | None:
    """The next trial's id, proposed with the trials in flight as lies (a candidate that cannot differ
    is skipped with its reason); None when the proposer has nothing now."""
    inflight = sorted(flight)
    pending = [dict(runner.ledger.trial(t)["config"]) for t in inflight]
    while True:
        hist = observations(runner)
        prop = proposer(hist + lies(runner, pending, hist))
        if prop is None:
            return None
        same = runner.trials.cannot_differ(prop.config)
        if same is not None:
            runner.trials.skip(step, prop.config, prop.reason, same[0], same[1], prop.audit)
            continue
        audit = dict(prop.audit, batch={"size_limit": slots, "position": len(pending), "pending": pending, "in_flight": inflight})
        return runner.trials.new(step, prop.config, prop.reason, audit)["id"]


def _waiting_trials(runner: Tune, step: str, flight: dict, live: list[dict], free: list[dict]) -> list[tuple[str, dict]]:
    """Trials of ``step`` proposed but not running (a resumed tune's, or one whose slot failed under it),
    each with a free slot it has not tried; one that no live slot is left for is marked, with the reason."""
    out, free = [], list(free)
    for t in runner.ledger.trials(step=step, status=PENDING):
        if t["id"] in flight:
            continue
        tried = set(t.get("slots_tried") or [])
        if all(x["name"] in tried for x in live):
            runner.sf.tune.update_trial(t["id"], status=Status.INVALID, valid=False, verdict=None, finished=now_iso(),
                                why=f"not measured: the slots it was tried on ({', '.join(sorted(tried))}) failed "
                                    "under it, and no other slot is left")
            continue
        slot = next((x for x in free if x["name"] not in tried), None)
        if slot is not None:  # else it waits for a slot it has not tried to come free
            free.remove(slot)
            out.append((t["id"], slot))
    return out


def _trial_on_slot(runner: Tune, slot: dict, tid: str) -> tuple[str, str | None]:
    """One trial on one slot's server (a thread's body): ("ok" | "slot_down" | "slot_fault", why)."""
    r = for_slot(runner, slot)
    t = runner.ledger.trial(tid)
    runner.sf.tune.update_trial(tid, slot=slot["name"], slots_tried=[*(t.get("slots_tried") or []), slot["name"]])
    try:
        t = r.trials.run(tid)
        r.seat.settle()
    except VkitError as e:
        if e.code != ExitCode.UNAVAILABLE:
            raise
        return "slot_down", " ".join(str(e).split())
    if t["status"] == Status.INVALID and "server_died" in {f for c in t.get("checks") or [] for f in (c.get("findings") or [])}:
        return "slot_fault", f"the server died under {tid} twice on slot {slot['name']}"
    return "ok", None


def _after_trial(runner: Tune, tid: str, slot: dict, res: tuple[str, str | None], progress: Callable[[str], None]) -> None:
    kind, why = res
    name = slot["name"]
    t = runner.ledger.trial(tid)
    if kind == "ok":
        runner.sf.slots.ok(name)
        runner.log("screened", trial=tid, slot=name, status=t["status"], verdict=t.get("verdict"))
        return
    n = runner.sf.slots.failed(name, why or kind)
    ab = for_slot(runner, slot).served.server().abnormal
    if kind == "slot_down" or ab.get("flag") or n >= 2:
        reason = (f"ABNORMAL: {ab.get('reason')}" if ab.get("flag") else why) + f" ({n} failure(s) in a row on this slot)"
        did = runner.log("slot_out", slot=name, reason=reason, trial=tid)
        runner.sf.slots.take_out(name, reason, did)
        runner.warn(f"slot {name} taken out: {reason}; the tune goes on with the other slots ({did})")
    tried = t.get("slots_tried") or []
    runner.log("slot_failed", trial=tid, slot=name, why=why, retry=len(tried) < 2)
    if len(tried) < 2:
        progress(f"{tid}: {why}; measured again on another slot")
        runner.sf.tune.update_trial(tid, status=Status.PROPOSED, runs=[], checks=[], valid=None, verdict=None, metrics={}, finished=None,
                            failed_on=[*(t.get("failed_on") or []), {"slot": name, "why": why, "runs": t.get("runs") or [],
                                                                    "status": t["status"]}])
    elif t["status"] in PENDING:
        runner.sf.tune.update_trial(tid, status=Status.INVALID, valid=False, verdict=None, finished=now_iso(),
                            why=f"not measured: its slots ({', '.join(tried)}) failed under it; last: {why}")


def _screened_here(runner: Tune, tid: str) -> None:
    """One trial on this tune's server, its outcome logged (``screened``) as on slots."""
    t = runner.trials.run(tid)
    runner.log("screened", trial=tid, slot=runner.slot, status=t["status"], verdict=t.get("verdict"))


def _screen_one_at_a_time(runner: Tune, step: str, proposer: Callable[[list], Any], progress: Callable[[str], None],
                          budget: int, stop_text: Callable[[list], str]) -> str:
    n = 0
    while True:
        open_t = open_trial(runner, step)
        if open_t is not None:
            _screened_here(runner, open_t["id"])
            n += 1
            continue
        stop = _out_of_budget(runner, step, budget, progress)
        if stop:
            break
        everything = observations(runner)
        prop = proposer(everything)
        if prop is None:
            stop = stop_text(everything)
            break
        same = runner.trials.cannot_differ(prop.config)
        if same is not None:
            runner.trials.skip(step, prop.config, prop.reason, same[0], same[1], prop.audit)
            continue
        t = runner.trials.new(step, prop.config, prop.reason, prop.audit)
        _screened_here(runner, t["id"])
        runner.seat.settle()
        n += 1
    return stop

def _screened_log_ratio(runner: Tune, t: dict, spec: Any, key: str) -> float | None:
    """Trial ``t``'s effect on the primary as its screening measured it: the screening gate's log-ratio
    estimate against baseline ``key`` (positive: better); from the means when no gate recorded one."""
    est = ((t.get("gate") or {}).get("primary") or {}).get("estimate_log")
    if isinstance(est, (int, float)):
        return float(est)
    base = (runner.ledger.record(key).get("metrics") or {}).get(spec.name)
    mine = (t.get("metrics") or {}).get(spec.name)
    ok = all(isinstance(v, (int, float)) and v > 0 for v in (base, mine))
    return spec.direction * math.log(mine / base) if ok else None


def screened_effect(runner: Tune, t: dict, rivals: list[dict], versus: Versus = MAIN) -> power.Effect | None:
    """The winner ``t``'s screened effect and the sd of its screening mean (per-run σ at its runs on one
    process, over √n: within²/n + between²), for the confirmation to plan for after the winner's-curse
    correction (:class:`power.Effect`). The correction counts the contenders: the winner and those of
    ``rivals`` (the other candidates it was selected from) whose screened effect lies within 3 sd of
    the winner's; one further below could not have come first by luck, and selects nothing. On a flat
    surface every candidate contends (the correction is the full one over k); a winner far above the
    rest is corrected by nothing. None when there is no σ to plan with (planned at the threshold)."""
    key = versus.key
    spec = parse_metric(versus.primary_of(runner.s), "primary")
    obs = _screened_log_ratio(runner, t, spec, key)
    per_run = ((t.get("gate") or {}).get("primary") or {}).get("sigma")
    n = max(1, len(t.get("runs") or []))
    comp = runner.budget.components(key).get(spec.name)
    if not isinstance(per_run, (int, float)) and comp:
        per_run = comparison_sigma(comp, n)
    if obs is None or not isinstance(per_run, (int, float)) or not per_run > 0:
        return None
    sd = per_run / math.sqrt(n)
    low = (comparison_sigma_low(comp, n) if comp else None) or per_run
    est = [_screened_log_ratio(runner, r, spec, key) for r in rivals if r["id"] != t["id"]]
    near = [e for e in est if e is None or e >= obs - 3 * sd]  # one with no estimate is counted: it errs low
    return power.Effect(observed=obs, k=1 + len(near), sigma=sd, sigma_low=min(sd, low / math.sqrt(n)), trial_id=t["id"])


def refuse_underpowered(runner: Tune, rec: dict, conf: dict, progress: Callable[[str], None]) -> None:
    """A step whose best screened candidate cannot be confirmed within the budget (its confirmation,
    planned for its screened effect less the winner's curse, was refused before any run): the step's
    record carries the plan, and the stop rule and the log say so. The screening was run first: its
    trials are in the record, and a resumed run whose step had started goes on (nothing is refused
    before a candidate is screened)."""
    if conf.get("decision") != "underpowered":
        return
    plan = conf.get("plan") or {}
    rec["plan"] = plan
    if "stop_rule" in rec:
        rec["stop_rule"] += ("; the power analysis at the measured σ needs more confirmation blocks than the budget "
                             "for the best screened candidate's effect")
    runner.log("underpowered", step=rec["step"], trial_id=conf.get("trial_id"), plan=plan)
    progress(f"step {rec['step']}: {conf.get('trial_id')} not confirmed: {plan.get('why')}")


def over_time(runner: Tune, step: str, left: int, progress: Callable[[str], None]) -> str | None:
    """The ETA of the step from the restarts and runs timed so far, said on stderr and kept in the
    state (``tune.eta``); with ``--time-budget``, the stop rule when one more candidate and the
    step's confirmation would not finish within it (None: go on)."""
    per, conf, spent = runner.budget.trial_cost(), runner.budget.confirm_cost(), runner.budget.elapsed_s()
    if per is None or conf is None:
        return None
    eta = left * per + conf
    restart_s, run_s = runner.budget.costs() or (0.0, 0.0)
    progress(f"ETA step {step}: at most {left} more candidate(s) and a confirmation, about {eta / 60:.1f} min "
             f"(restart {restart_s:.0f} s, measurement {run_s:.0f} s, as measured so far)")
    if runner.ledger.tune().tune:
        runner.sf.tune.update(eta={"step": step, "candidates_left": left, "seconds": round(eta), "at": now_iso(),
                                       "restart_s": round(restart_s, 1), "run_s": round(run_s, 1)})
    budget = runner.s.time_budget_s
    if budget is None or spent is None or spent + per + conf <= budget:
        return None
    return (f"time budget {budget / 3600:.2g} h: {spent / 60:.0f} min spent, and one more candidate ({per / 60:.1f} min) "
            f"with the confirmation ({conf / 60:.1f} min) would not fit; {left} candidate(s) of step {step} given up")


def _best_screened(runner: Tune, step: str) -> dict | None:
    """The step's candidate with the highest screening primary (throughput, or SLO capacity) among
    those the screening gate did not reject and that meet the SLO."""
    slo = search_slo(runner) or {}
    pm = primary_metric(runner)
    best = None
    for t in runner.ledger.trials(step=step, status=(Status.DONE,)):
        if not t.get("valid") or t.get("verdict") not in ("accept", "undecided"):
            continue
        m = t["metrics"]
        if any(m.get(k, math.inf) > v for k, v in slo.items()):
            continue
        if best is None or m.get(pm, 0) > best["metrics"].get(pm, 0):
            best = t
    return best
