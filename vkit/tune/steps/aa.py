"""The slots' A/A pass beside the baseline: each slot's level and the spreads within a slot, between slots and devices."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from vkit.errors import ExitCode, VkitError
from vkit.state import now_iso
from vkit.tune.context import Tune, for_slot
from vkit.tune.steps.common import primary_metric

AA_REPEATS = 2  # runs of the kept configuration on each slot in the A/A pass


def baseline_beside_aa(runner: Tune, progress: Callable[[str], None], repeats: int = AA_REPEATS) -> dict:
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
        return runner.baselines.measure()
    progress(f"slots: A/A pass beside the baseline, the kept configuration on {len(live)} slots at once, {repeats} run(s) "
             f"each (device-to-device and shared-host effects; slot {live[0]['name']}'s are the baseline's first start)")
    with runner.interrupts.every_section(), ThreadPoolExecutor(max_workers=len(live)) as ex:
        fb = ex.submit(runner.baselines.measure)
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


def _aa_recorded(runner: Tune) -> tuple[dict | None, list[dict], dict]:
    """(the A/A pass recorded for the kept configuration, or None; the live slots; the kept configuration)."""
    st = runner.ledger.tune()
    live = runner.ledger.slots()
    kept = st.kept_config
    done = st.record("slot_effects")  # the whole record (config, finished, metrics)
    return (done if done and done.get("config") == kept and done.get("finished") else None), live, kept


def _first_start_runs(runner: Tune, runs: list[str], slot: str) -> list[str]:
    """The runs of ``runs`` measured on ``slot`` by the first server start among them."""
    known = runner.ledger.tune().run_starts
    mine = [p for p in runs if slot in runner.compare.slots_of([p]) and known.get(p)]
    return [p for p in mine if known[p] == known[mine[0]]] if mine else []


def _aa_on(runner: Tune, slot: dict, kept: dict, repeats: int) -> list[str] | str:
    """A thread's body: the kept configuration started afresh on ``slot`` and measured ``repeats``
    times; its valid runs, or why the slot failed (ABNORMAL, unreachable, does not start)."""
    r = for_slot(runner, slot)
    try:
        ok, res = r.seat.apply(dict(kept), fresh=True)
        if not ok:
            return f"the kept configuration does not start on it: {res.get('message')}"
        paths = []
        for k in range(1, repeats + 1):
            path, doc, check = r.measurer.measure("aa", k)
            if check["code"] == 0:
                paths.append(path)
        return paths
    except VkitError as e:  # ABNORMAL on this slot (its server died twice), or unreachable
        if e.code != ExitCode.UNAVAILABLE:
            raise
        return " ".join(str(e).split())


def _aa_record(runner: Tune, got: dict[str, list[str] | str], kept: dict, progress: Callable[[str], None]) -> dict:
    """Slots that failed the pass taken out; the slot effects of the others recorded and logged."""
    runs = {n: v for n, v in got.items() if isinstance(v, list)}
    for name, why in sorted((n, v) for n, v in got.items() if isinstance(v, str)):
        reason = f"A/A pass: {why}"
        did = runner.log("slot_out", slot=name, reason=reason, trial=None)
        runner.sf.slots.take_out(name, reason, did)
        runner.warn(f"slot {name} taken out: {reason}; the tune goes on with the other slots ({did})")
    rec = slot_effects(runner, runs)
    rec.update(config=dict(kept), finished=now_iso())
    runner.sf.slots.set_effects(rec)
    runner.log("slot_effects", **{k: v for k, v in rec.items() if k != "runs"})
    pm = rec["metric"]
    one = rec["metrics"].get(pm) or {}
    if one:
        progress(f"slots: {pm} per slot " + ", ".join(f"{n} {v:+.1%}" for n, v in one["offsets"].items())
                 + f"; σ between slots {one['sigma_slots']:.1%}, of which devices {one['sigma_device']:.1%} "
                 f"(within a slot {one['sigma_within']:.1%})")
    return rec


def slot_effects(runner: Tune, runs: dict[str, list[str]]) -> dict:
    """Per metric: each slot's level relative to the mean of the slots, σ within a slot, σ between
    slots (one-way random effects on logs: (MS_between - MS_within) / n, floored at 0) and the
    device part (σ between slots² less the baseline's between-restart σ², floored at 0)."""
    import numpy as np

    docs = {n: [runner.ledger.load(p) for p in ps] for n, ps in runs.items()}
    comps = runner.budget.components()
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
