"""The tuning order of seed 000, driven through the per-trial state machine of ``vkit.tune.runner``.

Step 1 max-model-len (start-up success, KV capacity, TTFT stability) → frozen; step 2
max-num-batched-tokens with max-num-seqs fixed; step 3 max-num-seqs at the best budget with
knee detection; step 4 a small grid around the knee; step 5 behaviour flags as a validation
on a mixed long/short workload. Each step screens its candidates, then re-confirms its winner
on fresh interleaved runs with the gate before keeping it (the winner's curse). ``bo`` mode
replaces steps 2–4 by Bayesian optimisation over the same parameters.

Stop rules are quantified and recorded with each step. Library only: progress goes to the
callback, nothing is printed.
"""

from __future__ import annotations

import math
import shlex
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace
from typing import Any, Callable

from vkit import search
from vkit.apply import launcher
from vkit.apply.launcher import serve_argv
from vkit.apply.policy import Policy, to_serve_flags
from vkit.decide.specs import parse_metric
from vkit.errors import ExitCode, Rejected, VkitError
from vkit.search import gpumem
from vkit.state import now_iso
from vkit.tune import power
from vkit.tune.runner import Runner, Workload, comparison_sigma, comparison_sigma_low

OBJECTIVES = [search.Objective("output_throughput", "max"), search.Objective("p95_ttft_ms", "min")]
# The capacity objective: SLO capacity (req/s), and interactivity as mean TPOT at the reference load
# (per-user output tok/s = 1000 / TPOT: the same order, the axis the report shows).
CAPACITY_OBJECTIVES = [search.Objective("slo_capacity", "max"), search.Objective("ref_mean_tpot_ms", "min")]


def objectives(runner: Runner) -> list[search.Objective]:
    """The search's objectives for this run's objective (throughput at one load, or SLO capacity)."""
    return CAPACITY_OBJECTIVES if runner.s.capacity is not None else OBJECTIVES


def primary_metric(runner: Runner) -> str:
    return objectives(runner)[0].name


def search_slo(runner: Runner) -> dict | None:
    """The SLO as the search sees it: a constraint on the throughput objective; inside the capacity
    objective already (a capacity is the highest load meeting it), so none on top."""
    return None if runner.s.capacity is not None else (runner.s.slo or None)
STEP_NAMES = {"1": "max-model-len", "2": "max-num-batched-tokens", "3": "max-num-seqs",
              "4m": "gpu-memory-utilization (highest that starts, validated under load)", "4": "grid around the knee",
              "5": "behaviour flags (validation)", "bo": "Bayesian optimisation"}


def observations(runner: Runner, steps: tuple[str, ...] | None = None) -> list[search.Observation]:
    """Finished trials as the search sees them (screening means; infeasible when they did not start)."""
    st = runner.sf.read()
    slo = search_slo(runner)
    objs = objectives(runner)
    out = []
    for t in st["trials"]:
        if steps is not None and t["step"] not in steps:
            continue
        if t["status"] not in ("done", "eliminated", "start_failed", "invalid", "skipped"):
            continue
        feasible = t["status"] in ("done", "eliminated", "skipped") and t.get("valid") is not False and bool(t.get("metrics"))
        obj = {o.name: t["metrics"].get(o.name) for o in objs if t["metrics"].get(o.name) is not None}
        if feasible and len(obj) < len(objs):
            feasible = False
        slo_ok = None
        if feasible and slo:
            slo_ok = all(obj.get(k, math.inf) <= v for k, v in slo.items() if k in obj)
        reps = []
        for p in t.get("runs") or []:
            try:
                d = runner.load(p)
                reps.append({o.name: d.get(o.name) for o in objs})
            except (OSError, ValueError):
                continue
        out.append(search.Observation(config=dict(t["config"]), objectives=obj, repeats=reps, feasible=feasible,
                                      slo_ok=slo_ok, step=t["step"], trial_id=t["id"]))
    return out


def _finished(runner: Runner, step: str) -> dict | None:
    for s in runner.sf.read().get("steps", []):
        if s["step"] == step and s.get("finished"):
            return s
    return None


def _record_step(runner: Runner, rec: dict) -> None:
    runner.sf.record_step(rec)


def _open_trial(runner: Runner, step: str) -> dict | None:
    """A trial of this step that an interruption left unfinished."""
    for t in runner.sf.read()["trials"]:
        if t["step"] == step and t["status"] in ("proposed", "applied"):
            return t
    return None


def guard_anomalies(runner: Runner) -> None:
    """Seed: a baseline with an invariant anomaly (e.g. prefill slower than decode) blocks steps 2–4:
    fix the path first — headroom is not a reason to use it now."""
    b = runner.sf.read().get("baseline") or {}
    bad = [c for c in b.get("checks", []) if c.get("code") not in (0, None)]
    if bad:
        f = sorted({x for c in bad for x in (c.get("findings") or [])})
        if "client_saturation" in f and set(f) <= Runner.TRANSIENT | Runner.SATURATION_EFFECTS:
            # the load generator fell behind (a busy machine): the serving path is not at fault, the baseline is
            raise VkitError(
                f"the baseline could not be measured: the client fell behind its schedule ({', '.join(f)}) even when "
                "measured again: the machine running vkit is busy; when it is quiet, rerun with --restart (a new baseline) "
                "(steps 2–4 are not started on such a baseline)", ExitCode.INVALID)
        raise Rejected(
            f"the baseline has invariant anomalies ({', '.join(f)}): fix the serving path before tuning throughput "
            "(steps 2–4 are blocked; run check_invariants on the baseline runs for the explanation)"
        )


# Step 1's TTFT stability: P95 / mean TTFT of one run. A wait with an exponential tail (plain
# queueing) has P95 = mean * ln 20 = 3.0 * mean; a heavier tail than that is the server stalling
# (preemption, requests waiting for KV room), which a longer max-model-len makes worse.
STEP1_TTFT_RATIO = math.log(20.0)


def run_step1(runner: Runner, candidates: list[int], need_len: int, target_concurrency: int,
              progress: Callable[[str], None]) -> dict:
    """max-model-len: the smallest candidate >= the business length (plus margin) that starts,
    has room for the target concurrency and a stable TTFT (P95 / mean TTFT at most
    ``STEP1_TTFT_RATIO`` in both runs); then frozen. When every candidate that starts with room has
    an unstable TTFT, the instability is the load's, not the length's: the smallest of them is
    chosen and the record says so."""
    done = _finished(runner, "1")
    if done:
        return done
    st = runner.sf.read()
    frozen = st.get("frozen") or {}
    if "max_model_len" in frozen:
        rec = {"step": "1", "name": STEP_NAMES["1"], "finished": now_iso(), "chosen": frozen["max_model_len"],
               "stop_rule": f"max_model_len already frozen at {frozen['max_model_len']}"}
        _record_step(runner, rec)
        return rec
    cands = sorted(c for c in candidates if c >= need_len)
    if not cands:
        raise VkitError(f"no max-model-len candidate is >= the business length {need_len}", ExitCode.USAGE)
    chosen, notes, roomy, checks = None, [], [], []
    for L in cands:
        t = next((x for x in runner.sf.read()["trials"] if x["step"] == "1" and x["config"].get("max_model_len") == L), None)
        if t is None:
            t = runner.new_trial("1", dict(runner.sf.read()["kept"]["config"], max_model_len=L),
                                 f"max-model-len {L}: starts? KV capacity for {target_concurrency} sequences? TTFT stable?")
        if t["status"] in ("proposed", "applied"):
            t = runner.run_trial(t["id"], workload=step1_workload(runner), repeats=2)  # two runs: is TTFT stable?
        if t["status"] == "start_failed":
            notes.append(f"{L}: does not start ({(t.get('diagnosis') or {}).get('kind')})")
            checks.append({"max_model_len": L, "starts": False})
            continue
        su = t.get("startup") or {}
        cap = su.get("kv_cache_tokens")
        conc = (cap / L) if cap else None
        docs = [runner.load(p) for p in t.get("runs") or []]
        stab = max((d["p95_ttft_ms"] / d["mean_ttft_ms"] for d in docs if d.get("mean_ttft_ms")), default=None)
        room = t["status"] == "done" and (conc is None or conc >= target_concurrency)
        stable = stab is not None and stab <= STEP1_TTFT_RATIO
        checks.append({"max_model_len": L, "starts": True, "kv_cache_tokens": cap, "room_sequences": conc,
                       "ttft_p95_over_mean": stab, "ttft_threshold": STEP1_TTFT_RATIO, "room": room, "stable": stable})
        notes.append((f"{L}: starts, KV {cap} tokens = {conc:.1f} full-length sequences, P95/mean TTFT {stab:.2f} "
                      f"({'stable' if stable else 'unstable'}: threshold {STEP1_TTFT_RATIO:.2f})") if cap and stab is not None
                     else f"{L}: {t['status']}")
        runner.update_trial(t["id"], why=notes[-1])
        if room:
            roomy.append(L)
        if room and stable:
            chosen = L
            break
    why = f"the smallest candidate >= {need_len} that starts with room for {target_concurrency} sequences and a stable TTFT"
    if chosen is None and roomy:
        chosen = roomy[0]
        why = (f"every candidate that starts with room for {target_concurrency} sequences has P95/mean TTFT above "
               f"{STEP1_TTFT_RATIO:.2f} (the load's tail, not the length's): the smallest of them")
        notes.append(f"TTFT unstable at every candidate with room: {chosen} chosen; see the load before trusting later steps")
    if chosen is None:
        raise Rejected("no max-model-len candidate starts with room for the target concurrency: " + "; ".join(notes))
    kept = runner.sf.read()["kept"]["config"]
    if kept.get("max_model_len") != chosen:
        runner.apply(dict(kept, max_model_len=chosen))
        did = runner.keep(reason=f"step 1: max-model-len {chosen} is {why} (a business decision, frozen from now on)", decision="step1")
        t1 = next(x for x in runner.sf.read()["trials"] if x["step"] == "1" and x["config"].get("max_model_len") == chosen)
        runner.update_trial(t1["id"], kept=True, decision_id=did)
    runner.sf.freeze("max_model_len", chosen)
    rec = {"step": "1", "name": STEP_NAMES["1"], "finished": now_iso(), "chosen": chosen, "notes": notes, "checks": checks,
           "ttft_threshold": STEP1_TTFT_RATIO, "stop_rule": f"{why}: {chosen}{_ttft_text(checks, chosen)}; frozen"}
    _record_step(runner, rec)
    runner.log("freeze", param="max_model_len", value=chosen, notes=notes)
    progress(f"step 1: max_model_len {chosen} frozen ({'; '.join(notes)})")
    return rec


def _ttft_text(checks: list[dict], chosen: int) -> str:
    c = next((x for x in checks if x.get("max_model_len") == chosen), {})
    r = c.get("ttft_p95_over_mean")
    return "" if r is None else f" (P95/mean TTFT {r:.2f} against the threshold ln 20 = {STEP1_TTFT_RATIO:.2f})"


def step1_workload(runner: Runner) -> Workload | None:
    """Step 1 judges start-up, KV room and TTFT stability on the closed-loop gauge at the target
    concurrency, whatever the objective (a capacity search would answer another question)."""
    w = runner.s.workload
    if runner.s.capacity is None:
        return None
    # a trace's prompts without its arrivals: the closed loop at --concurrency
    opts = replace(w.options, dataset_name="jsonl") if w.options.dataset_name == "trace" else w.options
    return Workload(opts, seed=w.seed, name="step1")


def run_screening_step(runner: Runner, step: str, proposer: Callable[[list], Any], progress: Callable[[str], None],
                       budget: int, stop_text: Callable[[list], str]) -> dict:
    """Propose → trial (APPLY/VERIFY/VALIDATE/GATE-screen) until the proposer is done or the budget is
    spent; then confirm the best screened candidate (fresh, interleaved), its blocks planned for its
    screened effect less the winner's curse, and KEEP it or REVERT. The power analysis decides nothing
    before the screening: a step is underpowered only when its winner cannot be confirmed."""
    done = _finished(runner, step)
    if done:
        return done
    if len(runner.slots()) > 1:
        stop = _screen_on_slots(runner, step, proposer, progress, budget, stop_text)
    else:
        stop = _screen_one_at_a_time(runner, step, proposer, progress, budget, stop_text)
    hist = observations(runner, (step,))
    best = _best_screened(runner, step)
    rec: dict[str, Any] = {"step": step, "name": STEP_NAMES.get(step, step), "trials": [h.trial_id for h in hist], "stop_rule": stop}
    rivals = [t for t in runner.sf.read()["trials"] if t["step"] == step and t["status"] in ("done", "eliminated")]
    effect = None if best is None else screened_effect(runner, best, rivals)
    if best is None or (effect is not None and effect.observed <= 0):
        rec["result"] = "no candidate beat the kept configuration on screening; nothing to confirm" + (
            "" if best is None else f" (the best screened, {best['id']}, measured {math.expm1(effect.observed):+.1%})")
    else:
        k = max(1, len([h for h in hist if h.feasible]))
        conf = runner.confirm_and_keep(best["id"], selected_from=k, effect=effect)
        rec["confirmed"] = {"trial_id": best["id"], "decision": conf.get("decision"), "why": conf.get("why")}
        rec["result"] = (f"kept {best['id']} ({' '.join(to_serve_flags(best['changes']))})" if conf.get("decision") == "kept"
                         else f"best screened {best['id']} not kept: {conf.get('decision')} — {conf.get('why')}")
        _underpowered(runner, rec, conf, progress)
    runner.settle()
    rec["finished"] = now_iso()
    _record_step(runner, rec)
    progress(f"step {step} done: {rec['result']}; stop rule: {stop}")
    return rec


def _spent(runner: Runner, step: str, running: bool = False) -> int:
    """Trials of ``step`` that count toward its budget: the finished ones (a skipped candidate cost no
    restart: it does not), and with ``running`` those proposed or running too."""
    counted = ("done", "eliminated", "start_failed", "invalid") + (("proposed", "applied") if running else ())
    return sum(1 for t in runner.sf.read()["trials"] if t["step"] == step and t["status"] in counted)


def _out_of_budget(runner: Runner, step: str, budget: int, progress: Callable[[str], None], running: bool = False) -> str | None:
    """Why ``step`` proposes no more candidates (its trial budget or its time spent), or None."""
    spent = _spent(runner, step, running)
    if spent >= budget:
        return f"budget of {budget} trials for step {step} spent"
    return _over_time(runner, step, budget - spent, progress)


def lies(runner: Runner, pending: list[dict], hist: list[search.Observation] | None = None) -> list[search.Observation]:
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
            v = ((runner.sf.read().get("baseline") or {}).get("metrics") or {}).get(o.name)
            vals = [v] if isinstance(v, (int, float)) else []
        if vals:
            best[o.name] = max(vals) if o.direction == "max" else min(vals)
    out = []
    for i, cfg in enumerate(pending):
        obj = {k: (v * 1.10 ** (i + 1) if next(o for o in objs if o.name == k).direction == "max" else v) for k, v in best.items()}
        out.append(search.Observation(config=dict(cfg), objectives=obj, repeats=[], feasible=len(obj) == len(objs),
                                      slo_ok=True, step="pending", trial_id=f"pending-{i}"))
    return out


def _screen_on_slots(runner: Runner, step: str, proposer: Callable[[list], Any], progress: Callable[[str], None],
                     budget: int, stop_text: Callable[[list], str]) -> str:
    """Screening on the slots, asynchronously: every live slot measures a trial, and when one ends its
    outcome is logged and the next candidate is proposed at once on the history as it then stands
    (the trials still running as ``lies``), so no slot waits for the slowest trial of a batch. Each
    proposal's audit records what it was made from (the trials in flight and their configurations;
    a Bayesian proposal its whole input), so the decision log replays whatever order the slots
    finished in; outcomes that end together are logged in trial-id order."""
    flight: dict[str, tuple[dict, Future]] = {}
    spent_out: str | None = None  # the budget or the time is spent: no new proposal
    with runner.interrupts.every_section(), ThreadPoolExecutor(max_workers=max(1, len(runner.slots(live=False)))) as ex:
        while True:
            live = runner.slots()
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
            if not runner.use_first_slot():
                raise VkitError("every slot has been taken out (see `state show`): fix them, then `state --slot-in NAME` and "
                                "rerun the same command to continue", ExitCode.UNAVAILABLE)


def _propose_on_slots(runner: Runner, step: str, proposer: Callable[[list], Any], flight: dict, slots: int) -> str | None:
    """The next trial's id, proposed with the trials in flight as lies (a candidate that cannot differ
    is skipped with its reason); None when the proposer has nothing now."""
    inflight = sorted(flight)
    pending = [dict(runner.trial(t)["config"]) for t in inflight]
    while True:
        hist = observations(runner)
        prop = proposer(hist + lies(runner, pending, hist))
        if prop is None:
            return None
        same = runner.cannot_differ(prop.config)
        if same is not None:
            runner.skip_trial(step, prop.config, prop.reason, same[0], same[1], prop.audit)
            continue
        audit = dict(prop.audit, batch={"size_limit": slots, "position": len(pending), "pending": pending, "in_flight": inflight})
        return runner.new_trial(step, prop.config, prop.reason, audit)["id"]


def _waiting_trials(runner: Runner, step: str, flight: dict, live: list[dict], free: list[dict]) -> list[tuple[str, dict]]:
    """Trials of ``step`` proposed but not running (a resumed tune's, or one whose slot failed under it),
    each with a free slot it has not tried; one that no live slot is left for is marked, with the reason."""
    out, free = [], list(free)
    for t in runner.sf.read()["trials"]:
        if t["step"] != step or t["status"] not in ("proposed", "applied") or t["id"] in flight:
            continue
        tried = set(t.get("slots_tried") or [])
        if all(x["name"] in tried for x in live):
            runner.update_trial(t["id"], status="invalid", valid=False, verdict=None, finished=now_iso(),
                                why=f"not measured: the slots it was tried on ({', '.join(sorted(tried))}) failed "
                                    "under it, and no other slot is left")
            continue
        slot = next((x for x in free if x["name"] not in tried), None)
        if slot is not None:  # else it waits for a slot it has not tried to come free
            free.remove(slot)
            out.append((t["id"], slot))
    return out


AA_REPEATS = 2  # runs of the kept configuration on each slot in the A/A pass


def baseline_beside_aa(runner: Runner, progress: Callable[[str], None], repeats: int = AA_REPEATS) -> dict:
    """The A/A pass over the slots (once a tune): the kept configuration started afresh on every live
    slot at once (so shared host and PCIe contention is in it) and measured ``repeats`` times on
    each. A one-way random-effects analysis of the log metric per slot gives the spread between slots
    (σ_slots, which holds the restart-to-restart part too: each slot is one process) and, less the
    baseline's between-restart part, the device-to-device part (σ_device) that gate adds to a
    comparison across slots; resumed when recorded.

    It runs beside the baseline: the baseline on the first slot while the other slots measure; the
    baseline's first server start is the first slot's A/A start (its first ``repeats`` runs, measured
    while the other slots measure theirs, so the shared-host contention is in them too). One phase
    instead of two. Without two live slots, or with the A/A pass recorded, the baseline alone."""
    done, live, kept = _aa_recorded(runner)
    if done is not None or len(live) < 2:
        return runner.baseline()
    progress(f"slots: A/A pass beside the baseline, the kept configuration on {len(live)} slots at once, {repeats} run(s) "
             f"each (device-to-device and shared-host effects; slot {live[0]['name']}'s are the baseline's first start)")
    with runner.interrupts.every_section(), ThreadPoolExecutor(max_workers=len(live)) as ex:
        fb = ex.submit(runner.baseline)
        futures = {s["name"]: ex.submit(_aa_on, runner, s, kept, repeats) for s in live[1:]}
        got: dict[str, list[str] | str] = {name: f.result() for name, f in futures.items()}
        b = fb.result()
    first = _first_start_runs(runner, b["runs"], live[0]["name"])
    if len(first) >= repeats and b["config"] == kept:
        got[live[0]["name"]] = first[:repeats]
    else:  # the baseline measured elsewhere (resumed, rebased) or one run per start: measure the slot as the pass does
        got[live[0]["name"]] = _aa_on(runner, live[0], kept, repeats)
    _aa_record(runner, got, kept, progress)
    return b


def _aa_recorded(runner: Runner) -> tuple[dict | None, list[dict], dict]:
    """(the A/A pass recorded for the kept configuration, or None; the live slots; the kept configuration)."""
    st = runner.sf.read()
    live = runner.slots()
    kept = st["kept"]["config"]
    done = st.get("slot_effects")
    return (done if done and done.get("config") == kept and done.get("finished") else None), live, kept


def _first_start_runs(runner: Runner, runs: list[str], slot: str) -> list[str]:
    """The runs of ``runs`` measured on ``slot`` by the first server start among them."""
    known = runner.sf.read().get("run_starts") or {}
    mine = [p for p in runs if slot in runner.slots_of([p]) and known.get(p)]
    return [p for p in mine if known[p] == known[mine[0]]] if mine else []


def _aa_on(runner: Runner, slot: dict, kept: dict, repeats: int) -> list[str] | str:
    """A thread's body: the kept configuration started afresh on ``slot`` and measured ``repeats``
    times; its valid runs, or why the slot failed (ABNORMAL, unreachable, does not start)."""
    r = runner.for_slot(slot)
    try:
        ok, res = r.apply(dict(kept), fresh=True)
        if not ok:
            return f"the kept configuration does not start on it: {res.get('message')}"
        paths = []
        for k in range(1, repeats + 1):
            path, doc, check = r.measure("aa", k)
            if check["code"] == 0:
                paths.append(path)
        return paths
    except VkitError as e:  # ABNORMAL on this slot (its server died twice), or unreachable
        if e.code != ExitCode.UNAVAILABLE:
            raise
        return " ".join(str(e).split())


def _aa_record(runner: Runner, got: dict[str, list[str] | str], kept: dict, progress: Callable[[str], None]) -> dict:
    """Slots that failed the pass taken out; the slot effects of the others recorded and logged."""
    runs = {n: v for n, v in got.items() if isinstance(v, list)}
    for name, why in sorted((n, v) for n, v in got.items() if isinstance(v, str)):
        reason = f"A/A pass: {why}"
        did = runner.log("slot_out", slot=name, reason=reason, trial=None)
        runner.sf.take_slot_out(name, reason, did)
        runner.warn(f"slot {name} taken out: {reason}; the tune goes on with the other slots ({did})")
    rec = slot_effects(runner, runs)
    rec.update(config=dict(kept), finished=now_iso())
    runner.sf.set_slot_effects(rec)
    runner.log("slot_effects", **{k: v for k, v in rec.items() if k != "runs"})
    pm = rec["metric"]
    one = rec["metrics"].get(pm) or {}
    if one:
        progress(f"slots: {pm} per slot " + ", ".join(f"{n} {v:+.1%}" for n, v in one["offsets"].items())
                 + f"; σ between slots {one['sigma_slots']:.1%}, of which devices {one['sigma_device']:.1%} "
                 f"(within a slot {one['sigma_within']:.1%})")
    return rec


def slot_effects(runner: Runner, runs: dict[str, list[str]]) -> dict:
    """Per metric: each slot's level relative to the mean of the slots, σ within a slot, σ between
    slots (one-way random effects on logs: (MS_between - MS_within) / n, floored at 0) and the
    device part (σ between slots² less the baseline's between-restart σ², floored at 0)."""
    import numpy as np

    docs = {n: [runner.load(p) for p in ps] for n, ps in runs.items()}
    comps = runner.components()
    out: dict[str, Any] = {}
    names = [n for n in runs if len(docs[n]) >= 2]
    metrics = sorted({k for ds in docs.values() for d in ds for k, v in d.items() if k in comps or k == primary_metric(runner)})
    for m in metrics:
        rows = {n: [math.log(d[m]) for d in docs[n] if isinstance(d.get(m), (int, float)) and d[m] > 0] for n in names}
        rows = {n: v for n, v in rows.items() if len(v) >= 2}
        if len(rows) < 2:
            continue
        k, n = len(rows), min(len(v) for v in rows.values())
        means = {s: float(np.mean(v[:n])) for s, v in rows.items()}
        grand = float(np.mean(list(means.values())))
        msw = sum(float(np.sum((np.asarray(v[:n]) - means[s]) ** 2)) for s, v in rows.items()) / (k * (n - 1))
        msb = n * sum((mu - grand) ** 2 for mu in means.values()) / (k - 1)
        slots_var = max(0.0, (msb - msw) / n)
        between = ((comps.get(m) or {}).get("between") or 0.0) ** 2
        out[m] = {"offsets": {s: math.exp(mu - grand) - 1 for s, mu in means.items()}, "sigma_within": math.sqrt(msw),
                  "sigma_slots": math.sqrt(slots_var), "sigma_device": math.sqrt(max(0.0, slots_var - between)), "runs_per_slot": n}
    return {"metric": primary_metric(runner), "metrics": out, "runs": runs}


def _trial_on_slot(runner: Runner, slot: dict, tid: str) -> tuple[str, str | None]:
    """One trial on one slot's server (a thread's body): ("ok" | "slot_down" | "slot_fault", why)."""
    r = runner.for_slot(slot)
    t = runner.trial(tid)
    runner.update_trial(tid, slot=slot["name"], slots_tried=[*(t.get("slots_tried") or []), slot["name"]])
    try:
        t = r.run_trial(tid)
        r.settle()
    except VkitError as e:
        if e.code != ExitCode.UNAVAILABLE:
            raise
        return "slot_down", " ".join(str(e).split())
    if t["status"] == "invalid" and "server_died" in {f for c in t.get("checks") or [] for f in (c.get("findings") or [])}:
        return "slot_fault", f"the server died under {tid} twice on slot {slot['name']}"
    return "ok", None


def _after_trial(runner: Runner, tid: str, slot: dict, res: tuple[str, str | None], progress: Callable[[str], None]) -> None:
    kind, why = res
    name = slot["name"]
    t = runner.trial(tid)
    if kind == "ok":
        runner.sf.slot_ok(name)
        runner.log("screened", trial=tid, slot=name, status=t["status"], verdict=t.get("verdict"))
        return
    n = runner.sf.slot_failed(name, why or kind)
    sub = runner.for_slot(slot).svc.read()
    ab = sub.get("abnormal") or {}
    if kind == "slot_down" or ab.get("flag") or n >= 2:
        reason = (f"ABNORMAL: {ab.get('reason')}" if ab.get("flag") else why) + f" ({n} failure(s) in a row on this slot)"
        did = runner.log("slot_out", slot=name, reason=reason, trial=tid)
        runner.sf.take_slot_out(name, reason, did)
        runner.warn(f"slot {name} taken out: {reason}; the tune goes on with the other slots ({did})")
    tried = t.get("slots_tried") or []
    runner.log("slot_failed", trial=tid, slot=name, why=why, retry=len(tried) < 2)
    if len(tried) < 2:
        progress(f"{tid}: {why}; measured again on another slot")
        runner.update_trial(tid, status="proposed", runs=[], checks=[], valid=None, verdict=None, metrics={}, finished=None,
                            failed_on=[*(t.get("failed_on") or []), {"slot": name, "why": why, "runs": t.get("runs") or [],
                                                                    "status": t["status"]}])
    elif t["status"] in ("proposed", "applied"):
        runner.update_trial(tid, status="invalid", valid=False, verdict=None, finished=now_iso(),
                            why=f"not measured: its slots ({', '.join(tried)}) failed under it; last: {why}")


def _screened_here(runner: Runner, tid: str) -> None:
    """One trial on this runner's server, its outcome logged (``screened``) as on slots."""
    t = runner.run_trial(tid)
    runner.log("screened", trial=tid, slot=runner.slot, status=t["status"], verdict=t.get("verdict"))


def _screen_one_at_a_time(runner: Runner, step: str, proposer: Callable[[list], Any], progress: Callable[[str], None],
                          budget: int, stop_text: Callable[[list], str]) -> str:
    n = 0
    while True:
        open_t = _open_trial(runner, step)
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
        same = runner.cannot_differ(prop.config)
        if same is not None:
            runner.skip_trial(step, prop.config, prop.reason, same[0], same[1], prop.audit)
            continue
        t = runner.new_trial(step, prop.config, prop.reason, prop.audit)
        _screened_here(runner, t["id"])
        runner.settle()
        n += 1
    return stop

def _screened_log_ratio(runner: Runner, t: dict, spec: Any, key: str) -> float | None:
    """Trial ``t``'s effect on the primary as its screening measured it: the screening gate's log-ratio
    estimate against baseline ``key`` (positive: better); from the means when no gate recorded one."""
    est = ((t.get("gate") or {}).get("primary") or {}).get("estimate_log")
    if isinstance(est, (int, float)):
        return float(est)
    base = ((runner.sf.read().get(key) or {}).get("metrics") or {}).get(spec.name)
    mine = (t.get("metrics") or {}).get(spec.name)
    ok = all(isinstance(v, (int, float)) and v > 0 for v in (base, mine))
    return spec.direction * math.log(mine / base) if ok else None


def screened_effect(runner: Runner, t: dict, rivals: list[dict], key: str = "baseline",
                    primary: str | None = None) -> power.Effect | None:
    """The winner ``t``'s screened effect and the sd of its screening mean (per-run σ at its runs on one
    process, over √n: within²/n + between²), for the confirmation to plan for after the winner's-curse
    correction (:class:`power.Effect`). The correction counts the contenders: the winner and those of
    ``rivals`` (the other candidates it was selected from) whose screened effect lies within 3 sd of
    the winner's; one further below could not have come first by luck, and selects nothing. On a flat
    surface every candidate contends (the correction is the full one over k); a winner far above the
    rest is corrected by nothing. None when there is no σ to plan with (planned at the threshold)."""
    spec = parse_metric(primary or runner.s.primary, "primary")
    obs = _screened_log_ratio(runner, t, spec, key)
    per_run = ((t.get("gate") or {}).get("primary") or {}).get("sigma")
    n = max(1, len(t.get("runs") or []))
    comp = runner.components(key).get(spec.name)
    if not isinstance(per_run, (int, float)) and comp:
        per_run = comparison_sigma(comp, n)
    if obs is None or not isinstance(per_run, (int, float)) or not per_run > 0:
        return None
    sd = per_run / math.sqrt(n)
    low = (comparison_sigma_low(comp, n) if comp else None) or per_run
    est = [_screened_log_ratio(runner, r, spec, key) for r in rivals if r["id"] != t["id"]]
    near = [e for e in est if e is None or e >= obs - 3 * sd]  # one with no estimate is counted: it errs low
    return power.Effect(observed=obs, k=1 + len(near), sigma=sd, sigma_low=min(sd, low / math.sqrt(n)), trial_id=t["id"])


def _underpowered(runner: Runner, rec: dict, conf: dict, progress: Callable[[str], None]) -> None:
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


def _over_time(runner: Runner, step: str, left: int, progress: Callable[[str], None]) -> str | None:
    """The ETA of the step from the restarts and runs timed so far, said on stderr and kept in the
    state (``tune.eta``); with ``--time-budget``, the stop rule when one more candidate and the
    step's confirmation would not finish within it (None: go on)."""
    per, conf, spent = runner.trial_cost(), runner.confirm_cost(), runner.elapsed_s()
    if per is None or conf is None:
        return None
    eta = left * per + conf
    restart_s, run_s = runner.costs() or (0.0, 0.0)
    progress(f"ETA step {step}: at most {left} more candidate(s) and a confirmation, about {eta / 60:.1f} min "
             f"(restart {restart_s:.0f} s, measurement {run_s:.0f} s, as measured so far)")
    if runner.sf.read().get("tune"):
        runner.sf.update_tune_run(eta={"step": step, "candidates_left": left, "seconds": round(eta), "at": now_iso(),
                                       "restart_s": round(restart_s, 1), "run_s": round(run_s, 1)})
    budget = runner.s.time_budget_s
    if budget is None or spent is None or spent + per + conf <= budget:
        return None
    return (f"time budget {budget / 3600:.2g} h: {spent / 60:.0f} min spent, and one more candidate ({per / 60:.1f} min) "
            f"with the confirmation ({conf / 60:.1f} min) would not fit; {left} candidate(s) of step {step} given up")


def _best_screened(runner: Runner, step: str) -> dict | None:
    """The step's candidate with the highest screening primary (throughput, or SLO capacity) among
    those the screening gate did not reject and that meet the SLO."""
    slo = search_slo(runner) or {}
    pm = primary_metric(runner)
    best = None
    for t in runner.sf.read()["trials"]:
        if t["step"] != step or t["status"] != "done" or not t.get("valid") or t.get("verdict") not in ("accept", "undecided"):
            continue
        m = t["metrics"]
        if any(m.get(k, math.inf) > v for k, v in slo.items()):
            continue
        if best is None or m.get(pm, 0) > best["metrics"].get(pm, 0):
            best = t
    return best


# -- step 4m: gpu_memory_utilization ------------------------------------------------------------------
GMU = "gpu_memory_utilization"
# Start failures that answer a gpu_memory_utilization probe (more memory asked for than there is), as the
# launcher diagnoses them from vLLM's own lines: not an environment fault, so not counted toward ABNORMAL.
MEMORY_KINDS = ("oom", "gpu_memory_taken")


def gpu_memory_bounds(runner: Runner, policy: Policy) -> tuple[float, float, str]:
    """(the value known to start, the highest allowed, where the first came from): the kept
    configuration's value, else what the kept server reported in its baseline (``cache_config_info``),
    else the policy's min; the policy's max (S4: 0.98, auto_tune.sh's first value)."""
    rule = policy.rule(GMU) or {}
    hi = float(rule.get("max", gpumem.TOP))
    st = runner.sf.read()
    kept = st["kept"]["config"]
    if kept.get(GMU) is not None:
        return float(kept[GMU]), hi, "the kept configuration's"
    b = st.get("baseline") or {}
    if b.get("config") == kept and b.get("runs"):
        try:
            cc = ((runner.load(b["runs"][0]).get("vkit") or {}).get("server") or {}).get("cache_config") or {}
            return float(cc[GMU]), hi, "the kept server's default, from its cache_config_info"
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return float(rule.get("min", 0.5)), hi, "the policy's min (the kept server's own value is not known)"


def kept_kv_tokens(runner: Runner) -> int | None:
    """The KV-cache size (tokens) the kept configuration's last start logged (vLLM's ``GPU KV cache size``):
    the running server's when it is the kept one, else the latest start of it in the decision log."""
    st = runner.svc.read()
    kept = st["kept"]["config"]
    if runner.running_config() == kept and (st["service"].get("startup") or {}).get("kv_cache_tokens"):
        return st["service"]["startup"]["kv_cache_tokens"]
    for e in reversed(runner.svc.log.read()):
        cfg = e.get("kept") if e.get("event") == "rolled_back" else e.get("candidate") if e.get("event") == "applied" else None
        if cfg == kept and (e.get("startup") or {}).get("kv_cache_tokens"):
            return e["startup"]["kv_cache_tokens"]
    return None


def _probe_record(t: dict) -> gpumem.Probe:
    diag = t.get("diagnosis") or {}
    return gpumem.Probe(value=float(t["config"][GMU]), started=t["status"] == "probe_started",
                        kv_cache_tokens=(t.get("startup") or {}).get("kv_cache_tokens"), kind=diag.get("kind"),
                        quote=diag.get("quote"))


def _probes(runner: Runner, kept: dict) -> list[dict]:
    """This step's start probes of the kept configuration (every parameter but the value the same)."""
    rest = {k: v for k, v in kept.items() if k != GMU}
    return [t for t in runner.sf.read()["trials"] if t["step"] == "4m" and t.get("probe")
            and {k: v for k, v in t["config"].items() if k != GMU} == rest]


def probe_start(runner: Runner, value: float, progress: Callable[[str], None]) -> gpumem.Probe:
    """One start of the kept configuration at ``gpu_memory_utilization`` ``value`` (restart_with_rollback:
    a failure rolls back to the kept configuration), recorded as a probe trial; resumable. A failure
    diagnosed as memory (``MEMORY_KINDS``) is the answer the probe asks for: it is logged and not
    counted toward the two-failures-in-a-row ABNORMAL rule (the rollback verified the kept
    configuration); any other failure counts as usual."""
    kept = runner.sf.read()["kept"]["config"]
    cfg = dict(kept, **{GMU: value})
    t = next((x for x in _probes(runner, kept) if x["config"] == cfg), None)
    if t is not None and t["status"] in ("probe_started", "probe_failed"):
        return _probe_record(t)
    if t is None:
        t = runner.new_trial("4m", cfg, f"start probe: does {GMU} {value} start, and what KV cache does it log?")
        runner.update_trial(t["id"], probe=True)
    progress(f"{t['id']} step 4m: start probe {GMU} {value}")
    ok, res = runner.apply(cfg, fresh=True)
    if ok:
        su = res.get("startup") or {}
        kv = su.get("kv_cache_tokens")
        t = runner.update_trial(t["id"], status="probe_started", startup=su, finished=now_iso(),
                                why=f"started; GPU KV cache size {kv:,} tokens" if kv else "started (no KV cache size in the log)")
    else:
        diag = res.get("diagnosis") or {}
        t = runner.update_trial(t["id"], status="probe_failed", valid=False, diagnosis=diag, finished=now_iso(),
                                why=f"does not start ({diag.get('kind')}): {diag.get('quote') or res.get('message')}")
        if diag.get("kind") in MEMORY_KINDS:
            runner.svc.forgive_start_failure()
            runner.log("probe_failure", trial=t["id"], config=cfg, kind=diag.get("kind"),
                       why="a gpu_memory_utilization start probe refused for memory: the answer sought, not counted "
                           "toward the two-failures-in-a-row rule (the rollback verified the kept configuration)")
    progress(f"{t['id']} step 4m: {GMU} {value}: {t['why']}")
    return _probe_record(t)


def find_highest_start(runner: Runner, lo: float, hi: float, progress: Callable[[str], None]) -> dict:
    """The highest ``gpu_memory_utilization`` in [lo, hi] that starts (``lo`` known to start), to 0.01, by
    bisection on real starts (``vkit.search.gpumem``): the answer, its KV-cache size, the probes, the
    starts used and auto_tune.sh's count for the same answer. A probe that fails for another reason than
    memory stops the search below it (the answer is then the highest value seen to start)."""
    kept = runner.sf.read()["kept"]["config"]
    lo_h, hi_h = gpumem.hundredths(lo), gpumem.hundredths(hi)
    probes = [p for p in (_probe_record(t) for t in _probes(runner, kept) if t["status"] in ("probe_started", "probe_failed"))
              if lo_h < gpumem.hundredths(p.value) <= hi_h]
    stopped = None
    while True:
        other = next((p for p in probes if not p.started and p.kind not in MEMORY_KINDS), None)
        if other is not None:
            stopped = f"a probe failed for another reason than memory ({other.value}: {other.kind}): the search stops there"
            break
        v = gpumem.next_value(lo, hi, probes)
        if v is None:
            break
        probes.append(probe_start(runner, v, progress))
    best = gpumem.answer(lo, probes)
    kv = next((p.kv_cache_tokens for p in probes if p.started and gpumem.hundredths(p.value) == gpumem.hundredths(best)), None)
    return {"lo": lo, "hi": hi, "value": best, "kv_cache_tokens": kv, "probes": [p.as_dict() for p in probes],
            "starts": len(probes), "rollbacks": sum(1 for p in probes if not p.started),
            "step_down_starts": gpumem.step_down_starts(best, hi), "monotone": gpumem.monotone(lo, probes), "stopped": stopped}


def load_failure(runner: Runner, t: dict) -> list[str]:
    """The evidence that a configuration which started failed under the load (empty: none): the engine
    died during one of its measurements (the runner's ``server_died`` log event, once is enough; check_invariants'
    ``server_died`` when it died again after the restart), requests failed (a run's failed count, or a capacity
    search's load points refused for failed requests), or the server no longer answers /health after the
    measurement (its log's last error quoted)."""
    ev: list[str] = []
    findings = sorted({f for c in t.get("checks") or [] for f in (c.get("findings") or [])})
    if "server_died" in findings:
        ev.append("the engine died during a measurement, and again after a restart (server_died)")
    for e in runner.sf.log.read():
        if e.get("event") == "server_died" and e.get("label") in (t["id"], f"confirm-{t['id']}-B"):
            errs = ", ".join(f"{n}x {m}" for m, n in sorted((e.get("errors") or {}).items(), key=lambda kv: -kv[1])[:2])
            ev.append(f"the engine died during run {e.get('run')}" + (f" ({errs})" if errs else "") + ": restarted and measured again")
    for p in t.get("runs") or []:
        try:
            d = runner.load(p)
        except (OSError, ValueError):
            continue
        if isinstance(d.get("failed"), int) and d["failed"] > 0:
            errs = "; ".join(f"{n}x {m}" for m, n in sorted(((d.get("vkit") or {}).get("errors") or {}).items(), key=lambda kv: -kv[1])[:2])
            ev.append(f"{p}: {d['failed']} request(s) failed" + (f" ({errs})" if errs else ""))
        for pt in ((d.get("vkit") or {}).get("capacity") or {}).get("curve") or []:
            bad = [w for w in pt.get("invalid") or [] if "request(s) failed" in str(w)]
            if bad:
                ev.append(f"{p}: at load {pt.get('load')}: {bad[0]}")
    st = runner.svc.read()
    run = st["service"].get("running") or {}
    if run.get("config") == t["config"] and t.get("runs") and not runner._healthy(st["service"]["url"]):
        quote = launcher.diagnose(launcher.tail(run["log"]))["quote"] if run.get("log") else ""
        ev.append("the server no longer answers /health after the measurement" + (f"; its log: {quote}" if quote else ""))
    return ev


def _rel_gain(new: Any, old: Any) -> float | None:
    return new / old - 1 if isinstance(new, (int, float)) and isinstance(old, (int, float)) and old else None


def _kv_text(kv: dict) -> str:
    a, b = kv.get("kept_tokens"), kv.get("tokens")
    if not a or not b:
        return f"KV cache {b:,} tokens" if b else "KV cache size not logged"
    return f"KV cache {a:,} -> {b:,} tokens ({b - a:+,}, {b / a - 1:+.1%})"


def run_gpu_memory_step(runner: Runner, policy: Policy, progress: Callable[[str], None], budget: int) -> dict:
    """Step 4m (policy S4, before step 4's grid): the highest ``gpu_memory_utilization`` that starts
    (:func:`find_highest_start`), then validated under the load through the normal trial path
    (screening against the kept configuration, then the fresh interleaved confirmation and KEEP or
    REVERT). A value that starts but fails under the load (:func:`load_failure`) is rejected with its
    evidence, and the search steps down by bisection between the kept value and it (at most ``budget``
    validations). The record carries the KV capacity gained (tokens, from vLLM's logged KV size) next
    to the capacity (the primary objective) gained."""
    done = _finished(runner, "4m")
    if done:
        return done
    st = runner.sf.read()
    kept0 = dict(st["kept"]["config"])
    lo, hi, lo_why = gpu_memory_bounds(runner, policy)
    kv_kept = kept_kv_tokens(runner)
    pm = primary_metric(runner)
    b = st.get("baseline") or {}
    base_pm = (b.get("metrics") or {}).get(pm) if b.get("config") == kept0 else None
    rec: dict[str, Any] = {"step": "4m", "name": STEP_NAMES["4m"], "lo": lo, "lo_from": lo_why, "hi": hi}
    if gpumem.hundredths(lo) >= gpumem.hundredths(hi):
        found = {"value": lo, "kv_cache_tokens": kv_kept, "probes": [], "starts": 0, "rollbacks": 0,
                 "step_down_starts": gpumem.step_down_starts(lo, hi), "monotone": True, "stopped": None}
    else:
        found = find_highest_start(runner, lo, hi, progress)
    rec["bisection"] = found
    search_text = (f"bisection between {lo} ({lo_why}) and {hi} (the policy's max) to 0.01: the highest that starts is "
                   f"{found['value']} in {found['starts']} start(s) (+{found['rollbacks']} rollback(s) to the kept configuration); "
                   f"auto_tune.sh's step-down from {hi} by 0.01 would take {found['step_down_starts']}"
                   + (f"; {found['stopped']}" if found.get("stopped") else "")
                   + ("" if found.get("monotone", True) else "; WARNING: a value failed below one that started (not monotone)"))
    kv = {"kept_value": lo, "kept_tokens": kv_kept, "value": found["value"], "tokens": found["kv_cache_tokens"],
          "gained_tokens": (found["kv_cache_tokens"] - kv_kept) if found["kv_cache_tokens"] and kv_kept else None,
          "metric": pm, "metric_gain_screening": None, "metric_gain_confirmed": None, "decision": None}
    validations: list[dict] = []
    result = None
    if gpumem.hundredths(found["value"]) <= gpumem.hundredths(lo):
        result = f"no value above {lo} starts (or {lo} is the policy's max): nothing to validate"
    elif found["kv_cache_tokens"] and kv_kept and found["kv_cache_tokens"] <= kv_kept:
        result = (f"{found['value']} starts but its logged KV cache ({found['kv_cache_tokens']:,} tokens) is no larger than the "
                  f"kept configuration's ({kv_kept:,}): nothing to gain, not validated")
    else:
        result, kv = _validate_gpu_memory(runner, lo, found, kv, kv_kept, base_pm, budget, validations, progress)
    rec.update(kv_cache=kv, validations=validations, result=result,
               trials=[t["id"] for t in runner.sf.read()["trials"] if t["step"] == "4m"],
               stop_rule=search_text + (f"; validated under the load: {'; '.join(v['summary'] for v in validations)}" if validations else ""))
    runner.settle()
    rec["finished"] = now_iso()
    _record_step(runner, rec)
    progress(f"step 4m done: {result}; {search_text}")
    return rec


def _validation_trial(runner: Runner, cfg: dict, value: float) -> dict:
    """The validation trial of ``cfg`` (resumed when recorded). When the server runs ``cfg`` on the process
    a start probe left (it served post_start_verify's short request only), that process is measured:
    no restart."""
    st = runner.sf.read()
    t = next((x for x in st["trials"] if x["step"] == "4m" and not x.get("probe") and x["config"] == cfg), None)
    if t is not None:
        return t
    t = runner.new_trial("4m", cfg, f"validate {GMU} {value} under the load: screening against the kept configuration")
    probe = next((x for x in reversed(_probes(runner, st["kept"]["config"])) if x["status"] == "probe_started"), None)
    last_start = (st.get("candidate") or {}).get("config")
    if probe is not None and probe["config"] == cfg and runner.running_config() == cfg and last_start == cfg:
        t = runner.update_trial(t["id"], status="applied", startup=probe.get("startup") or {}, reused_probe=probe["id"])
    return t


def _validate_gpu_memory(runner: Runner, lo: float, found: dict, kv: dict, kv_kept: int | None, base_pm: float | None,
                         budget: int, validations: list[dict], progress: Callable[[str], None]) -> tuple[str, dict]:
    """Screen, then confirm, the found value; a load failure rejects it with its evidence and the next
    candidate is the midpoint (0.01 grid) between the kept value and it."""
    pm = kv["metric"]
    ok_h, cand = gpumem.hundredths(lo), found["value"]
    kept = runner.sf.read()["kept"]["config"]
    while True:
        if len(validations) >= budget:
            return f"budget of {budget} validation(s) spent; nothing kept", kv
        cfg = dict(kept, **{GMU: cand})
        t = _validation_trial(runner, cfg, cand)
        t = runner.run_trial(t["id"])
        ev = load_failure(runner, t)
        cand_kv = (t.get("startup") or {}).get("kv_cache_tokens") or (found["kv_cache_tokens"] if cand == found["value"] else None)
        row: dict[str, Any] = {"trial_id": t["id"], "value": cand, "kv_cache_tokens": cand_kv, "verdict": t.get("verdict"),
                               "metric_gain_screening": _rel_gain((t.get("metrics") or {}).get(pm), base_pm)}
        if not ev and t["status"] == "done" and t.get("valid") and t.get("verdict") in ("accept", "undecided"):
            # the value was chosen by its starts (the bisection), not by its screening: no winner's curse to correct
            conf = runner.confirm_and_keep(t["id"], selected_from=len(validations) + 1, effect=screened_effect(runner, t, []))
            row["confirmation"] = {"decision": conf.get("decision"), "why": conf.get("why")}
            _underpowered(runner, {"step": "4m"}, conf, progress)
            row["metric_gain_confirmed"] = _vs_kept(runner, conf).get(pm)
            after = load_failure(runner, dict(t, runs=[*(conf.get("b_runs") or [])]))
            if conf.get("decision") == "kept" and after:
                row["warnings"] = after  # kept by the gate, its engine died once in a run measured again: said, not hidden
            elif after:
                ev = after
        if ev:
            runner.update_trial(t["id"], verdict="reject", load_failure=ev,
                                why=f"starts but fails under the load: {'; '.join(ev)}")
            row.update(rejected=True, evidence=ev, summary=f"{cand} rejected under the load ({ev[0]})")
            validations.append(row)
            progress(f"step 4m: {GMU} {cand} starts but fails under the load: {'; '.join(ev)}")
            bad_h = gpumem.hundredths(cand)
            if bad_h - ok_h <= 1:
                return f"{cand} starts but fails under the load, and no value lies between it and the kept {lo}: nothing kept", kv
            cand = gpumem.grid_value(ok_h + (bad_h - ok_h) // 2)  # the bisection steps down
            continue
        kv.update(value=cand, tokens=cand_kv, gained_tokens=(cand_kv - kv_kept) if cand_kv and kv_kept else None,
                  metric_gain_screening=row["metric_gain_screening"], metric_gain_confirmed=row.get("metric_gain_confirmed"),
                  decision=(row.get("confirmation") or {}).get("decision") or f"screening {t.get('verdict') or t['status']}")
        if row.get("metric_gain_confirmed") is not None:
            gain_text = f"{pm} {row['metric_gain_confirmed']:+.1%} on the confirmation's fresh runs"
        elif row["metric_gain_screening"] is not None:
            gain_text = f"{pm} {row['metric_gain_screening']:+.1%} on screening"
        else:
            gain_text = f"{pm} not measured"
        row["summary"] = f"{cand}: {_kv_text(kv)}, {gain_text}, {kv['decision']}"
        validations.append(row)
        if kv["decision"] == "kept":
            warn = f"; WARNING: {'; '.join(row['warnings'])}" if row.get("warnings") else ""
            return f"kept {t['id']} (--gpu-memory-utilization {cand}): {_kv_text(kv)}, {gain_text}{warn}", kv
        why = (row.get("confirmation") or {}).get("why") or t.get("why")
        return f"{cand} not kept ({kv['decision']}: {why}): {_kv_text(kv)}, {gain_text}", kv


# --staged-candidates octaves: the bounds bench/bench_tuner.py measured it in
OCTAVE_BOUNDS = {"max_num_batched_tokens": (256, 32768), "max_num_seqs": (8, 512)}


def staged_proposer(runner: Runner, policy: Policy, step: str, candidates: str = "policy") -> tuple[Callable, Callable]:
    st = runner.sf.read()
    names = ["max_num_batched_tokens", "max_num_seqs"]
    octaves = candidates == "octaves"
    space = search.space_from_policy(policy, names, frozen=st.get("frozen") or {}, bounds=OCTAVE_BOUNDS if octaves else None)
    # open loop there is no client concurrency to stay above: the server's own limit is what is measured
    conc = _concurrency(runner.s.workload) if runner.s.capacity is None else None
    opts = {"tokens_candidates": "octaves", "seqs_candidates": "octaves"} if octaves else {}
    base = dict(st["kept"]["config"])
    if step == "4":
        knee = step3_knee(runner, space, base, conc, opts)
        if knee is not None:
            base["max_num_seqs"] = knee  # the grid centres on step 3's knee, kept or not
    plan = _staged_plan(runner, space, base, step, conc, opts)
    return plan.next, plan.stop_reason


def _staged_plan(runner: Runner, space: list, base: dict, step: str, conc: int | None, opts: dict) -> search.StagedPlan:
    return search.StagedPlan(space, base, objectives(runner), search_slo(runner), steps=(step,), load_concurrency=conc, **opts)


def step3_knee(runner: Runner, space: list, base: dict, conc: int | None, opts: dict) -> int | None:
    """Step 3's knee as its finished sweep shows it (the same plan replayed over the measured
    trials), or None when step 3 has not finished or found no knee."""
    if _finished(runner, "3") is None:
        return None
    st = _staged_plan(runner, space, base, "3", conc, opts).state(observations(runner, ("3",)))
    if st["next"] is not None or not st.get("knee"):
        return None
    return st["knee"]["x"]


def prior_observations(entries: list[dict]) -> list[search.Observation]:
    """Observations of earlier runs in the same environment (knowledge base), for a warm start."""
    out = []
    for e in entries:
        for o in e.get("observations") or []:
            out.append(search.Observation(config=dict(o["config"]), objectives=dict(o.get("objectives") or {}), repeats=[],
                                          feasible=bool(o.get("feasible")), slo_ok=o.get("slo_ok"), step="kb",
                                          trial_id=f"{e.get('run_id')}:{o.get('trial_id')}"))
    return out


def kb_observations(runner: Runner) -> list[dict]:
    return [{"config": h.config, "objectives": h.objectives, "feasible": h.feasible, "slo_ok": h.slo_ok, "trial_id": h.trial_id}
            for h in observations(runner) if h.step in ("2", "3", "4", "bo")]


# The Bayesian search's space (seed 004 §8: every situational parameter): steps 2-4's two, the memory
# fraction (from 0.85: below vLLM's default it only gives KV cache away) and step 5's production
# flags as categories; the scheduling policy only on a workload with two or more priority classes.
BO_NAMES = ("max_num_batched_tokens", "max_num_seqs", "gpu_memory_utilization", *("enable_chunked_prefill", "enable_prefix_caching"))
BO_BOUNDS = {"gpu_memory_utilization": (0.85, 0.98)}
BO_PATIENCE = 4  # early stop: this many evaluations in a row without a screened gain over the kept configuration
# --acquisition auto under the capacity objective, as bench/bench_tuner_capacity.py decided it in this
# space (bench/results/tuner_capacity.json); under the throughput objective auto is vkit.search.propose's
# own rule (constrained EI with an SLO), as bench/bench_tuner.py measured it.
CAPACITY_ACQUISITION = "cei"


def bo_space(runner: Runner, policy: Policy) -> list:
    """The Bayesian search's space for this run (``BO_NAMES``, frozen parameters left out)."""
    names = list(BO_NAMES) + (["scheduling_policy"] if len(workload_priorities(runner.s.workload)) >= 2 else [])
    rows = {r["param"] for r in (policy.data if hasattr(policy, "data") else policy).get("situational", [])}
    names = [n for n in names if n in rows]
    return search.space_from_policy(policy, names, frozen=runner.sf.read().get("frozen") or {},
                                    bounds={k: v for k, v in BO_BOUNDS.items() if k in names})


def bo_stalled(runner: Runner, patience: int = BO_PATIENCE) -> int | None:
    """The evaluations in a row, at the end of this run's Bayesian search, whose screening gate did
    not accept a gain over the kept configuration, when there are at least ``patience`` of them."""
    trials = [t for t in runner.sf.read()["trials"] if t["step"] == "bo" and t["status"] not in ("skipped",) and t.get("finished")]
    run = 0
    for t in reversed(trials):
        if t.get("verdict") == "accept":
            break
        run += 1
    return run if patience and run >= patience else None


def bo_acquisition(runner: Runner, acquisition: str) -> str:
    """The acquisition a Bayesian search of this run uses: ``auto`` under the capacity objective
    becomes :data:`CAPACITY_ACQUISITION`; anything else is as asked."""
    return CAPACITY_ACQUISITION if acquisition == "auto" and runner.s.capacity is not None else acquisition


def bo_proposer(runner: Runner, policy: Policy, budget: int, seed: int,
                prior: list[search.Observation] | None = None, acquisition: str = "auto",
                patience: int = BO_PATIENCE, batch_lie: str = "kb") -> tuple[Callable, Callable]:
    st = runner.sf.read()
    space = bo_space(runner, policy)
    base = dict(st["kept"]["config"])
    prior = list(prior or [])
    acquisition = bo_acquisition(runner, acquisition)
    opts = {} if acquisition == "auto" else {"acquisition": acquisition}
    n0 = search.n_initial(budget + len(prior))
    stalled: dict[str, int] = {}

    def nxt(hist):
        # warm start: earlier runs of this environment count as evaluated points (never re-proposed)
        real = prior + [h for h in hist if h.step == "bo"]
        pending = [h.config for h in hist if h.step == "pending"]  # a batch's earlier proposals (slots)
        total = budget + len(prior)  # the budget counts this run's evaluations; prior ones come on top
        if len(real) >= n0 and not pending:  # the Sobol start runs whole; then k in a row without a gain stop it
            run = bo_stalled(runner, patience)
            if run is not None:
                stalled["run"] = run
                return None
        objs, slo = objectives(runner), search_slo(runner)
        # a batch: the pending points believed (Kriging believer) or lied about (constant liar), so the next goes elsewhere
        mine = real + search.batch_lies(space, real, base, objs, slo, seed, pending, kind=batch_lie)
        prop = search.propose("bo", space, mine, base, objs, slo, total, seed, **opts)
        if prop is not None and pending:
            prop.audit["batch_lie"] = batch_lie
        if prop is not None:  # the inputs go into the decision log, so `sweep --replay` can re-derive the proposal
            prop.audit["replay"] = search.log_record("bo", space, mine, base, objs, slo, total, seed, prop, **opts)
        return prop

    def stop(hist):
        if stalled:
            return (f"Bayesian optimisation stopped early after {len(hist)} evaluations: the last {stalled['run']} "
                    f"screened no gain over the kept configuration (early stop at {patience} in a row, after the "
                    f"{n0}-point Sobol start)")
        return f"Bayesian optimisation finished after {len(hist)} evaluations"

    return nxt, stop


# Seed 000's step 5 adds the production flags and validates them; vLLM V1 has chunked prefill and
# prefix caching on unless told otherwise, so only a configuration that turned one off has a flip.
PRODUCTION_FLAGS = ("enable_chunked_prefill", "enable_prefix_caching")


def workload_priorities(w: Workload) -> list[int]:
    """The distinct ``priority`` values of the workload's own prompt file (none for synthetic prompts)."""
    o = w.options
    if o.dataset_name not in ("jsonl", "trace") or not o.dataset_path:
        return []
    from vkit.measure.datasets import jsonl_requests
    reqs = jsonl_requests(o.dataset_path, None, o.random_output_len, False)
    return sorted({r.extra["priority"] for r in reqs if "priority" in (r.extra or {})})


def step5_flips(kept: dict, priorities: list[int]) -> tuple[list[tuple[str, Any]], list[str]]:
    """What step 5 validates: each production flag turned on where the kept configuration has it off,
    and ``scheduling_policy priority`` only when the workload carries two or more priority classes
    (on any other workload it cannot differ from fcfs). Returns (flips, why each other one is not run)."""
    flips, not_run = [], []
    for f in PRODUCTION_FLAGS:
        if kept.get(f, True) is False:
            flips.append((f, True))
        else:
            not_run.append(f"{f} is already on")
    if kept.get("scheduling_policy", "fcfs") == "priority":
        not_run.append("scheduling_policy is already priority")
    elif len(priorities) >= 2:
        flips.append(("scheduling_policy", "priority"))
    else:
        not_run.append("scheduling_policy priority: the workload has "
                       + (f"one priority class ({priorities[0]})" if priorities else "no priority classes"))
    return flips, not_run


def run_step5(runner: Runner, mixed: Workload, progress: Callable[[str], None]) -> dict:
    """Behaviour flags as a validation (seed 000, step 5): each production flag the kept configuration
    has off is turned on and measured on a mixed long/short workload; the priority policy is measured
    on the business's own prompts, and only when they carry priority classes. A flip must not buy
    P99 TTFT with a throughput loss; it is kept only if the gate accepts it. Nothing to validate:
    no baseline, no restart."""
    done = _finished(runner, "5")
    if done:
        return done
    kept = runner.sf.read()["kept"]["config"]
    prios = workload_priorities(runner.s.workload)
    flips, not_run = step5_flips(kept, prios)
    rec: dict[str, Any] = {"step": "5", "name": STEP_NAMES["5"], "not_run": not_run}
    if not flips:
        rec.update(trials=[], result="nothing to validate: " + "; ".join(not_run),
                   stop_rule="the production flags are on and the workload has no priority classes", finished=now_iso())
        _record_step(runner, rec)
        progress(f"step 5: {rec['result']}")
        return rec
    primary, guards = "p99_ttft_ms:-", ["output_throughput:+:5%"]
    prio_w = step1_workload(runner) or runner.s.workload  # the business prompts, closed loop
    workloads = {"baseline_mixed": mixed, "baseline_priority": prio_w}  # each flip's workload, by its baseline key
    arms: dict[str, list] = {}
    for n, v in flips:
        arms.setdefault("baseline_priority" if n == "scheduling_policy" else "baseline_mixed", []).append((n, v))
    results, trials = [], []
    for key, arm_flips in arms.items():
        w = workloads[key]
        runner.baseline(workload=w, key=key)
        ids = []
        for name, value in arm_flips:
            cfg = dict(runner.sf.read()["kept"]["config"], **{name: value})
            t = next((x for x in runner.sf.read()["trials"] if x["step"] == "5" and x["config"] == cfg), None)
            if t is None:
                t = runner.new_trial("5", cfg, f"validate {name}={value} on the {w.name} workload: P99 TTFT, throughput loss <= 5%")
            runner.run_trial(t["id"], baseline_key=key, workload=w, primary=primary, guards=guards)
            ids.append(t["id"])
        arm_trials = [t for t in runner.sf.read()["trials"] if t["id"] in ids]
        trials += arm_trials
        best = None
        for t in arm_trials:
            if t["status"] == "done" and t.get("valid") and t.get("verdict") == "accept":
                if best is None or t["metrics"].get("p99_ttft_ms", math.inf) < best["metrics"].get("p99_ttft_ms", math.inf):
                    best = t
        if best is not None:
            conf = runner.confirm_and_keep(best["id"], selected_from=len(arm_trials), workload=w, primary=primary,
                                           guards=guards, key=key,
                                           effect=screened_effect(runner, best, arm_trials, key, primary))
            rec.setdefault("confirmed", []).append({"trial_id": best["id"], "decision": conf.get("decision"), "why": conf.get("why")})
            _underpowered(runner, rec, conf, progress)
            results.append(f"{best['id']} {conf.get('decision')}")
        else:
            results.append(f"{', '.join(f'{n}={v}' for n, v in arm_flips)}: no flip improved P99 TTFT without costing throughput")
    rec.update(trials=[t["id"] for t in trials], result="; ".join(results),
               stop_rule=f"{len(flips)} flag flip(s) validated ({', '.join(f'{n}={v}' for n, v in flips)}); not run: {'; '.join(not_run) or 'none'}")
    runner.settle()
    rec["finished"] = now_iso()
    _record_step(runner, rec)
    progress(f"step 5 done: {rec['result']}")
    return rec


def _front(runner: Runner, goal: dict) -> tuple[dict, list[search.Observation]]:
    """The search's delivery over every screened configuration plus the kept one."""
    st = runner.sf.read()
    # a member whose claim the gate rejected on fresh runs was a screening artefact: out of the front
    gone = {c["trial_id"] for c in _current_checks(st) if c.get("decision") in _NOT_CONFIRMED}
    hist = [h for h in observations(runner) if h.step in ("2", "3", "4", "bo") and h.trial_id not in gone]
    if runner.s.capacity is not None:
        # interactivity is measured at the reference load: a configuration that does not carry that load
        # within the SLO has no interactivity to trade, so it is not deliverable on this front
        trials = {t["id"]: t for t in st["trials"]}
        hist = [h for h in hist if _carries_reference(runner, trials.get(h.trial_id) or {})]
    b = st.get("baseline") or {}
    kept = st["kept"]["config"]
    # the kept configuration (confirmed) is always a candidate for delivery
    objs = objectives(runner)
    if b.get("metrics") and b.get("config") == kept:  # the baseline measured the kept configuration itself
        hist.append(search.Observation(config=dict(kept), objectives={o.name: b["metrics"].get(o.name) for o in objs},
                                       repeats=[], feasible=True, slo_ok=None, step="kept", trial_id="kept"))
    out = search.deliver(hist, objs, goal) if hist else {"front": [], "knee": None, "recommendation": None}
    return out, hist


_NOT_CONFIRMED = ("reject", "invalid", "start_failed")


def _carries_reference(runner: Runner, trial: dict) -> bool:
    """Every capacity search of the trial (or of the one it is the same as) held the SLO at the reference load."""
    if trial.get("same_as"):
        src = next((t for t in runner.sf.read()["trials"] if t["id"] == trial["same_as"]), None)
        trial = src if src is not None else {"runs": (runner.sf.read().get("baseline") or {}).get("runs") or []}
    docs = []
    for p in trial.get("runs") or []:
        try:
            docs.append(runner.load(p))
        except (OSError, ValueError):
            return False
    return bool(docs) and all(d.get("ref_holds", True) for d in docs)


def _kept_ids(st: dict) -> set:
    """Trials whose confirmation ended in a keep."""
    return {c["trial_id"] for c in st.get("confirmations", []) if c.get("decision") == "kept"}


def _current_checks(st: dict) -> list[dict]:
    """Delivery confirmations made against the configuration kept now (older ones no longer apply)."""
    kept = st["kept"]["config"]
    return [c for c in st.get("delivery_confirmations", []) if c.get("against", kept) == kept]


def _claim(point: dict, kept_obj: dict, objs: list[search.Objective]) -> tuple[str, float]:
    """The objective a front member screened best on relative to the kept configuration, as a gate
    primary spec, and that relative advantage (in the objective's good direction)."""
    best, gain = None, -math.inf
    for o in objs:
        a, b = kept_obj.get(o.name), (point.get("objectives") or {}).get(o.name)
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or a == 0:
            continue
        rel = (b - a) / abs(a) * (1 if o.direction == "max" else -1)
        if rel > gain:
            best, gain = o, rel
    best = best or objs[0]
    return f"{best.name}:{'+' if best.direction == 'max' else '-'}", gain


# Capacity objective: a front member claiming better interactivity is confirmed with its capacity guarded,
# so an accepted claim means "as much traffic, within this, and faster tokens per user".
CAPACITY_GUARD = 0.05


def _claim_guards(runner: Runner, primary: str) -> list[str]:
    if runner.s.capacity is not None and not primary.startswith("slo_capacity"):
        return [f"slo_capacity:+:{CAPACITY_GUARD:.0%}"]
    return []


def confirm_front(runner: Runner, goal: dict, limit: int, progress: Callable[[str], None]) -> list[dict]:
    """Re-confirm (measure) up to ``limit`` delivered configurations that are not the kept one, each on its own
    claim (the objective it screened better on) against the kept configuration, on fresh interleaved
    runs with the gate (the winner's curse: a screening mean is biased up). Resumable; the
    decisions go into the state file (``delivery_confirmations``) for :func:`deliver`."""
    done: list[dict] = []
    tried: set = set()
    measured = 0
    while measured < limit:
        # the front is recomputed after every rejection: a member that was a noise artefact leaves it,
        # and whatever takes its place is confirmed in turn
        out, hist = _front(runner, goal)
        st = runner.sf.read()
        kept_ids = _kept_ids(st)
        kept_cfg = st["kept"]["config"]
        # the kept configuration's own numbers: its baseline, else the screening of the trial that became it
        kept_obj = next((h.objectives for h in hist if h.trial_id == "kept"), None) or \
            next((h.objectives for h in hist if h.trial_id in kept_ids and h.config == kept_cfg), None)
        if not kept_obj:
            break
        finished = {c["trial_id"] for c in _current_checks(st) if c.get("finished") or c.get("decision")}
        todo = [p for p in out.get("front", []) if p.get("trial_id") not in (None, "kept")
                and p["trial_id"] not in kept_ids and p["trial_id"] not in finished and p["trial_id"] not in tried]
        if not todo:
            break
        p = todo[0]
        tid = p["trial_id"]
        tried.add(tid)
        primary, gain = _claim(p, kept_obj, objectives(runner))
        if gain <= 0:  # on the front only through the pooled means: no claim over the kept configuration to test
            conf = runner.drop_point(tid, max(1, len(hist)), primary,
                                     f"no advantage over the kept configuration on screening (best: {primary} {gain:+.1%}); "
                                     "not measured again")
            progress(f"deliver: {tid} dropped: {conf['why']}")
            done.append(conf)
            continue
        progress(f"deliver: confirming {tid} ({' '.join(to_serve_flags(p.get('config') or {}))}) on its claim {primary} "
                 f"({gain:+.1%} on screening) against the kept configuration")
        conf = runner.confirm_point(tid, selected_from=max(1, len(hist)), primary=primary, guards=_claim_guards(runner, primary))
        measured += 1 if conf.get("b_runs") else 0  # one refused before any run (underpowered) cost nothing
        progress(f"deliver: {tid} {'confirmed' if conf.get('decision') == 'accept' else conf.get('decision')}: {conf.get('why')}")
        done.append(conf)
    st = runner.svc.read()
    if measured or (st["service"].get("running") or {}).get("config") not in (None, st["kept"]["config"]):
        runner.settle()  # once, after the last candidate (or one left running by an interrupted run)
    return done


def _vs_kept(runner: Runner, conf: dict) -> dict:
    """Each objective's relative difference, candidate vs kept, over a confirmation's fresh runs (the
    claim is the gate's; the others are shown so a trade-off's price is seen on the same runs)."""
    out: dict = {}
    try:
        a = [runner.load(p) for p in conf.get("a_runs") or []]
        b = [runner.load(p) for p in conf.get("b_runs") or []]
    except (OSError, ValueError):
        return out
    for o in objectives(runner):
        va = [d[o.name] for d in a if isinstance(d.get(o.name), (int, float))]
        vb = [d[o.name] for d in b if isinstance(d.get(o.name), (int, float))]
        if va and vb and sum(va):
            out[o.name] = (sum(vb) / len(vb)) / (sum(va) / len(va)) - 1
    return out


def deliver(runner: Runner, goal: dict) -> dict:
    """3–5 Pareto configurations with dominance rates, the knee, the recommendation, the flags.
    Reads the state only: a member is ``confirmed`` when it is the kept configuration or the gate
    accepted its claim on fresh interleaved runs (:func:`confirm_front`); one whose claim the gate
    rejected is moved to ``not_confirmed`` and no longer offered as better."""
    st = runner.sf.read()
    out, _ = _front(runner, goal)
    kept = st["kept"]["config"]
    confirmed = _kept_ids(st)
    checks = {c["trial_id"]: c for c in _current_checks(st)}
    pareto = []
    for p in out.get("front", []):
        cfg = p.get("config") or {}
        tid = p.get("trial_id")
        row = dict(p, metrics=p.get("objectives"), serve_flags=to_serve_flags(cfg),
                   confirmed=tid in confirmed or tid == "kept")
        c = checks.get(tid)
        if row["confirmed"]:
            row["confirmation"] = {"decision": "kept", "why": "the kept configuration"}
        elif c is not None:
            row["confirmation"] = {"claim": c.get("primary"), "decision": c.get("decision"), "why": c.get("why"),
                                   "pairs": len(c.get("b_runs") or []), "vs_kept": _vs_kept(runner, c)}
            row["confirmed"] = c.get("decision") == "accept"
        else:
            row["confirmation"] = {"decision": None, "why": "screening only: not re-confirmed on fresh runs"}
        pareto.append(row)
    trials = {t["id"]: t for t in st["trials"]}
    dropped = [{"trial_id": c["trial_id"], "config": c.get("config"), "serve_flags": to_serve_flags(c.get("config") or {}),
                "screening": (trials.get(c["trial_id"]) or {}).get("metrics"), "claim": c.get("primary"),
                "decision": c.get("decision"), "why": c.get("why")}
               for c in _current_checks(st) if c.get("decision") in _NOT_CONFIRMED]
    out["pareto"] = pareto
    out["not_confirmed"] = dropped
    better = _more_interactive(runner, pareto) if runner.s.capacity is not None else None
    if better is not None:
        # The business goal is max capacity, then interactivity: a member confirmed faster per user at
        # the reference load, its capacity guarded within CAPACITY_GUARD of the kept one's, is that goal's pick.
        cfg = better.get("config") or {}
        out["recommendation"] = {
            "config": dict(cfg), "trial_id": better["trial_id"], "decision_id": None, "serve_flags": to_serve_flags(cfg),
            "serve_command": shlex.join(serve_argv(st["service"]["launch"], cfg)), "kept_config": dict(kept),
            "why": (f"the goal is the most SLO capacity, then interactivity: {better['trial_id']} was confirmed on fresh "
                    "interleaved runs against the kept configuration with a lower mean TPOT at the reference load "
                    f"({better['confirmation'].get('why')}), its capacity guarded within {CAPACITY_GUARD:.0%} of the kept "
                    "one's; the kept configuration (the server runs it now) is the one every keep decision confirmed, "
                    "deploy this one for the stated goal")}
        return out
    # The recommendation is the kept configuration: the only one confirmed on fresh interleaved runs.
    kept_trial = next((t["id"] for t in reversed(st["trials"]) if t.get("kept") and t["config"] == kept), "kept")
    searched = out.get("recommendation") or {}
    rec = {"config": dict(kept), "trial_id": kept_trial, "decision_id": st["kept"].get("decision_id"),
           "serve_flags": to_serve_flags(kept), "serve_command": shlex.join(serve_argv(st["service"]["launch"], kept)),
           "why": "the kept configuration: every change in it was accepted by the gate on fresh, interleaved runs "
                  "against the configuration it replaced",
           "search_pick": {"trial_id": searched.get("trial_id"), "config": searched.get("config"), "why": searched.get("why")}}
    out["recommendation"] = rec
    return out


def _more_interactive(runner: Runner, pareto: list[dict]) -> dict | None:
    """The front member whose interactivity claim (guarded on capacity) the gate accepted on fresh
    interleaved runs, the lowest mean TPOT at the reference load among them; None when there is none."""
    ok = [p for p in pareto if (p.get("confirmation") or {}).get("decision") == "accept"
          and str((p.get("confirmation") or {}).get("claim") or "").startswith("ref_mean_tpot_ms")]
    return min(ok, key=lambda p: (p.get("metrics") or {}).get("ref_mean_tpot_ms", math.inf)) if ok else None


def _concurrency(w: Workload) -> int | None:
    return w.options.max_concurrency


def _last_multi_keep(runner: Runner) -> tuple[dict, dict, dict, list] | None:
    """The latest keep whose change moved several parameters: (its log event, the configuration
    before, the one kept, the one-parameter variants), or None."""
    keeps = [e for e in runner.sf.log.read() if e.get("event") == "keep"]
    for e in reversed(keeps):
        prev = (e.get("previous") or {}).get("config") or {}
        new = e.get("config") or {}
        variants = search.ablation_configs(prev, new)
        if variants:
            return e, prev, new, variants
    return None


def auto_ablate(runner: Runner, step: str, progress: Callable[[str], None]) -> dict | None:
    """After ``step`` kept a change of several parameters at once, the attribution runs by itself
    (seed 000's one-switch control): once per keep, resumable, recorded with the step."""
    rec = _finished(runner, step) or {}
    if (rec.get("confirmed") or {}).get("decision") != "kept":
        return None
    found = _last_multi_keep(runner)
    if found is None or found[2] != runner.sf.read()["kept"]["config"]:
        return None
    if (rec.get("ablation") or {}).get("decision_id") == found[0]["id"] or any(
            a.get("decision_id") == found[0]["id"] for a in runner.sf.read().get("ablations") or []):
        return None  # attributed, or refused, already (a resumed run)
    progress(f"step {step} kept {len(found[3])} parameters changed at once: measuring each alone (attribution)")
    try:
        out = run_ablation(runner, progress)
    except Rejected as ex:
        progress(f"step {step}: no attribution: {ex}")
        runner.log("ablation_skipped", decision_id=found[0]["id"], why=str(ex))
        _record_step(runner, dict(rec, ablation={"decision_id": found[0]["id"], "skipped": str(ex)}))
        return None
    parts = [f"{r['param']} {r['from']}→{r['to']} alone " + (f"{r['change']:+.1%} {r['metric']}, " if r["change"] is not None else "")
             + f"gate {r['verdict']}" for r in out["switches"]]
    text = ("attribution: " + ", ".join(out["attribution"]) + " paid" if out["attribution"] else
            "attribution: no parameter alone paid (the gain needs them together, or is within the noise)")
    _record_step(runner, dict(rec, ablation={k: out[k] for k in ("decision_id", "switches", "attribution")},
                              stop_rule=f"{rec.get('stop_rule')}; {text} ({'; '.join(parts)})"))
    return out


def run_ablation(runner: Runner, progress: Callable[[str], None]) -> dict:
    """The seed's missing one-switch control: when the last kept change moved several parameters
    at once, measure each one alone against the configuration it replaced, so the report can say
    which switch produced the gain (on the run's primary metric: throughput or SLO capacity)."""
    found = _last_multi_keep(runner)
    if found is None:
        raise Rejected("no kept change moved several parameters at once: nothing to ablate")
    e, prev, new, variants = found
    if runner.sf.read()["kept"]["config"] != new:
        raise Rejected("the configuration kept by that decision is no longer the kept one: ablate right after the keep")
    unset = sorted(k for k in new if k not in prev)
    if unset:
        raise Rejected(f"the configuration before {e['id']} left {', '.join(unset)} at the server's own default, which a "
                       "candidate cannot set back (vkit only knows values it set): set it explicitly in the kept "
                       "configuration first (restart_with_rollback --set ... --keep) to attribute such a change")
    pm = primary_metric(runner)
    key = f"ablate-{e['id']}"
    runner.baseline(key=key, config=prev)
    rows = []
    for param, cfg in variants:
        t = next((x for x in runner.sf.read()["trials"] if x["step"] == "ablate" and x["config"] == cfg), None)
        if t is None:
            t = runner.new_trial("ablate", cfg, f"{param} alone: {prev.get(param)} -> {new.get(param)}, against the configuration before {e['id']}")
        # an attribution needs a verdict, not a screening glance
        t = runner.run_trial(t["id"], baseline_key=key, repeats=max(runner.s.screen_repeats, 3))
        base = runner.sf.read()[key]["metrics"]
        gain = (t["metrics"].get(pm) or 0) / base[pm] - 1 if base.get(pm) else None
        rows.append({"param": param, "from": prev.get(param), "to": new.get(param), "trial_id": t["id"], "verdict": t.get("verdict"),
                     "metric": pm, "change": gain, "why": t.get("why")})
        progress(f"ablate {param}: {prev.get(param)} -> {new.get(param)} alone: "
                 + (f"{gain:+.1%} {pm}, " if gain is not None else "") + f"gate {t.get('verdict')}")
    runner.restore_kept()
    out = {"decision_id": e["id"], "previous": prev, "kept": new, "switches": rows,
           "attribution": [r["param"] for r in rows if r["verdict"] == "accept"]}
    runner.sf.record_ablation(dict(out, finished=now_iso()))
    runner.log("ablation", **out)
    return out
