"""Step 1: max-model-len (start-up success, KV capacity, TTFT stability), frozen after it."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable

from vkit.errors import ExitCode, Rejected, VkitError
from vkit.state import now_iso
from vkit.tune.compare import Versus
from vkit.tune.config import Workload
from vkit.tune.context import Tune
from vkit.tune.ledger import PENDING, Status
from vkit.tune.steps.common import STEP_NAMES, finished_step, record_step

# Step 1's TTFT stability: P95 / mean TTFT of one run. A wait with an exponential tail (plain
# queueing) has P95 = mean * ln 20 = 3.0 * mean; a heavier tail than that is the server stalling
# (preemption, requests waiting for KV room), which a longer max-model-len makes worse.
STEP1_TTFT_RATIO = math.log(20.0)


def run_step1(runner: Tune, candidates: list[int], need_len: int, target_concurrency: int,
              progress: Callable[[str], None]) -> dict:
    """max-model-len: the smallest candidate >= the business length (plus margin) that starts,
    has room for the target concurrency and a stable TTFT (P95 / mean TTFT at most
    ``STEP1_TTFT_RATIO`` in both runs); then frozen. When every candidate that starts with room has
    an unstable TTFT, the instability is the load's, not the length's: the smallest of them is
    chosen and the record says so."""
    done = finished_step(runner, "1")
    if done:
        return done
    frozen = runner.ledger.tune().frozen
    if "max_model_len" in frozen:
        rec = {"step": "1", "name": STEP_NAMES["1"], "finished": now_iso(), "chosen": frozen["max_model_len"],
               "stop_rule": f"max_model_len already frozen at {frozen['max_model_len']}"}
        record_step(runner, rec)
        return rec
    cands = sorted(c for c in candidates if c >= need_len)
    if not cands:
        raise VkitError(f"no max-model-len candidate is >= the business length {need_len}", ExitCode.USAGE)
    chosen, notes, roomy, checks = None, [], [], []
    for L in cands:
        t = next((x for x in runner.ledger.trials(step="1") if x["config"].get("max_model_len") == L), None)
        if t is None:
            t = runner.trials.new("1", dict(runner.ledger.kept_config(), max_model_len=L),
                                 f"max-model-len {L}: starts? KV capacity for {target_concurrency} sequences? TTFT stable?")
        if t["status"] in PENDING:
            t = runner.trials.run(t["id"], Versus(workload=step1_workload(runner)), repeats=2)  # two runs: is TTFT stable?
        if t["status"] == Status.START_FAILED:
            notes.append(f"{L}: does not start ({(t.get('diagnosis') or {}).get('kind')})")
            checks.append({"max_model_len": L, "starts": False})
            continue
        su = t.get("startup") or {}
        cap = su.get("kv_cache_tokens")
        conc = (cap / L) if cap else None
        docs = [runner.ledger.load(p) for p in t.get("runs") or []]
        stab = max((d["p95_ttft_ms"] / d["mean_ttft_ms"] for d in docs if d.get("mean_ttft_ms")), default=None)
        room = t["status"] == Status.DONE and (conc is None or conc >= target_concurrency)
        stable = stab is not None and stab <= STEP1_TTFT_RATIO
        checks.append({"max_model_len": L, "starts": True, "kv_cache_tokens": cap, "room_sequences": conc,
                       "ttft_p95_over_mean": stab, "ttft_threshold": STEP1_TTFT_RATIO, "room": room, "stable": stable})
        notes.append((f"{L}: starts, KV {cap} tokens = {conc:.1f} full-length sequences, P95/mean TTFT {stab:.2f} "
                      f"({'stable' if stable else 'unstable'}: threshold {STEP1_TTFT_RATIO:.2f})") if cap and stab is not None
                     else f"{L}: {t['status']}")
        runner.sf.tune.update_trial(t["id"], why=notes[-1])
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
    kept = runner.ledger.kept_config()
    if kept.get("max_model_len") != chosen:
        runner.seat.apply(dict(kept, max_model_len=chosen))
        did = runner.seat.keep(reason=f"step 1: max-model-len {chosen} is {why} (a business decision, frozen from now on)", decision="step1")
        t1 = next(x for x in runner.ledger.trials(step="1") if x["config"].get("max_model_len") == chosen)
        runner.sf.tune.update_trial(t1["id"], kept=True, decision_id=did)
    runner.sf.tune.freeze("max_model_len", chosen)
    rec = {"step": "1", "name": STEP_NAMES["1"], "finished": now_iso(), "chosen": chosen, "notes": notes, "checks": checks,
           "ttft_threshold": STEP1_TTFT_RATIO, "stop_rule": f"{why}: {chosen}{_ttft_text(checks, chosen)}; frozen"}
    record_step(runner, rec)
    runner.log("freeze", param="max_model_len", value=chosen, notes=notes)
    progress(f"step 1: max_model_len {chosen} frozen ({'; '.join(notes)})")
    return rec


def _ttft_text(checks: list[dict], chosen: int) -> str:
    c = next((x for x in checks if x.get("max_model_len") == chosen), {})
    r = c.get("ttft_p95_over_mean")
    return "" if r is None else f" (P95/mean TTFT {r:.2f} against the threshold ln 20 = {STEP1_TTFT_RATIO:.2f})"


def step1_workload(runner: Tune) -> Workload | None:
    """Step 1 judges start-up, KV room and TTFT stability on the closed-loop gauge at the target
    concurrency, whatever the objective (a capacity search would answer another question)."""
    w = runner.s.workload
    if runner.s.capacity is None:
        return None
    # a trace's prompts without its arrivals: the closed loop at --concurrency
    opts = replace(w.options, dataset_name="jsonl") if w.options.dataset_name == "trace" else w.options
    return Workload(opts, seed=w.seed, name="step1")
