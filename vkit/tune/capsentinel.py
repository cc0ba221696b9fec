"""The drift sentinel under the capacity objective: the kept configuration checked at the low end of
its capacity's interval, one or two runs instead of a whole capacity search.

The baseline's searches give the kept configuration's capacity C and σ, the sd of one search's
answer on a fresh start (between restarts and within the search: ``Baselines.measure``). On an unchanged
server a fresh start holds the SLO at ``C·exp(−Z·σ)`` (Z = 2: about 97.7 % of starts, one-sided),
so the sentinel restarts the kept configuration and runs the gauge's workload at that load:

- the run holds (its margin above zero): no drift;
- it fails: a second run at the same load; both failing, with their mean margin clear of zero by
  twice its standard error (``capacity.verdict_of``), or both with a queue that grew through the run
  (``capacity.judge_run``'s ``queue_grew``: the load is not sustainable, though a short run completes
  nearly all it was offered and its margin reads barely below zero), is a drift: the machine no
  longer carries what its baseline said, and the tune measures the baseline again. One failing run
  and one holding run is the noise the interval allows; two that fail by less than their noise, with
  no queue growing in both, give no verdict.

A machine that slowed by s (in log capacity) fails the check when s exceeds Z·σ plus the noise of
two runs; a smaller slowdown stays within what the baseline's own σ lets the gate absorb.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import TYPE_CHECKING

from vkit.state import now_iso
from vkit.tune import capacity as _cap
from vkit.tune.assemble import capacity_of
from vkit.tune.ledger import first

if TYPE_CHECKING:
    from vkit.tune.context import Tune

Z = 2.0  # the check's load: Z σ below the kept capacity
RUNS = 2  # at most this many runs a check


def check_load(baseline: dict, plan: _cap.Plan) -> tuple[float, float, float] | None:
    """(load, capacity, σ) of the check, from the kept configuration's baseline; None when it has no
    capacity with a σ (nothing to judge against)."""
    c = (baseline.get("metrics") or {}).get("slo_capacity")
    s = (baseline.get("sigma") or {}).get("slo_capacity")
    if not (isinstance(c, (int, float)) and c > 0 and isinstance(s, (int, float)) and s >= 0):
        return None
    return plan.snap(c * math.exp(-Z * s)), float(c), float(s)


def kept_record(runner: Tune) -> dict:
    """The kept configuration's capacity and σ, as a baseline record: the baseline when it measured the kept
    configuration; else (a keep with too few runs of its own to rebase on) its capacity over the kept trial's
    searches (``assemble.capacity_of`` its screening and confirmation runs) with the baseline's σ, the σ the
    gate compared it with."""
    st = runner.ledger.tune()
    b = st.record("baseline")
    if b.get("config") == st.kept_config:
        return b
    t = next((t for t in reversed(st.trials()) if t.get("kept") and t["config"] == st.kept_config), None)
    if t is None:
        return {}
    conf = first(st.confirmations(), trial_id=t["id"]) or {}
    c = capacity_of(runner, [*(t.get("runs") or []), *(conf.get("b_runs") or [])]).get("req_s")
    if c is None:
        return {}
    return {"config": t["config"], "metrics": {"slo_capacity": c}, "sigma": b.get("sigma") or {}, "from_trial": t["id"]}


def queues_grew(point: _cap.Point) -> bool:
    """Every run at the check's load saw its queue grow through it (``capacity.judge_run``'s ``queue_grew``)."""
    return all(r.get("queue_grew") for r in point.runs)


def judge(point: _cap.Point, plan: _cap.Plan) -> str | None:
    """'holds' / 'drift' once the runs at the check's load say so, 'unclear' when they cannot (runs
    that could not measure the server, or two that fail by less than their noise); None: one more run."""
    m = point.margins()
    if m.size and m[-1] > 0:
        return "holds"
    if m.size >= 2:
        return "drift" if queues_grew(point) or _cap.verdict_of(point, replace(plan, repeats=RUNS)) == _cap.FAILS else "unclear"
    return "unclear" if len(point.runs) >= RUNS else None


def sentinel(runner: Tune, fresh: bool = True) -> dict:
    """The check (see the module's docstring), recorded as a drift check; on a drift, the change
    (``drift``, the alarm time that resets the kept series) as the series sentinel records one.
    ``fresh=False``: on the process that runs the kept configuration now, when one does (the twin
    search's check: a run on a process that is not fresh varies less than σ allows, so the check's
    load stays as conservative)."""
    c = runner.s.capacity
    assert c is not None
    st = runner.ledger.tune()
    trials = st.trials()
    base = {"after_trial": trials[-1]["id"] if trials else None, "detector": "capacity_low_end", "shift": None,
            "fresh_start": fresh}
    at = check_load(kept_record(runner), c.plan)
    if at is None:
        return _record(runner, dict(base, changed=False, why="no capacity with a σ in the baseline: no drift verdict"))
    load, cap, sigma = at
    runner.seat.restore_kept(fresh=fresh)
    w = runner.s.workload
    d = os.path.join(runner.runs_dir, "sentinel")
    k = 1 + (len(os.listdir(d)) if os.path.isdir(d) else 0)  # never overwrite an earlier check
    run = _cap.live_measure(replace(w.options, seed=w.seed + 70_000 + 10 * k), runner.served.url(),
                            os.path.join(d, f"check{k}"), c.plan, command=["--state", runner.sf.path],
                            interrupts=runner.interrupts, launch_argv=st.server.launch_argv, bench=runner.measurer.bench)
    point, verdict = _cap.Point(load), None
    for i in range(RUNS):
        t0 = runner.backend.now()
        summary = run(load, i)
        # a run like any other: on the process it ran on, in the time accounting
        where = ((summary or {}).get("vkit") or {}).get("capacity_check", {}).get("path") or os.path.join(d, f"check{k}", str(i))
        runner.sf.tune.record_run_start(os.path.relpath(where, runner.sf.dir), runner.measurer.start_key(), seconds=runner.backend.now() - t0)
        j = _cap.judge_run(summary, c.slo, c.plan, load)
        point.runs.append(j)
        runner.progress(f"sentinel {load:g}: " + (f"margin {j['margin']:+.3f}" if j["margin"] is not None else j["why"]))
        verdict = judge(point, c.plan)
        if verdict is not None:
            break
    m, n = point.margins(), len(point.runs)
    if verdict == "drift":
        grew = ", its queue growing through each" if queues_grew(point) else ""
        why = (f"the kept configuration fails its SLO at {load:g}, {Z:g} σ ({sigma:.1%}) below its capacity {cap:.4g}, "
               f"on {n} runs (mean margin {m.mean():+.3f}{grew})")
    elif verdict == "holds":
        why = f"the kept configuration holds its SLO at {load:g}, {Z:g} σ below its capacity {cap:.4g}"
    elif m.size >= 2:
        why = (f"the kept configuration fails its SLO at {load:g} on {n} runs by less than their noise (mean margin "
               f"{m.mean():+.3f}), with no queue growing in both: no drift verdict")
    else:
        why = f"fewer than {RUNS} valid runs at {load:g}: no drift verdict"
    out = dict(base, changed=verdict == "drift", load=load, capacity=cap, sigma=sigma, runs=n,
               margins=[r["margin"] for r in point.runs], last=float(m[-1]) if m.size else None, why=why)
    return _record(runner, out, drift=out["changed"])


def _record(runner: Tune, out: dict, drift: bool = False) -> dict:
    """The check in the state's drift checks and the decision log; a drift also as the change (the
    alarm time that resets the kept series), as the series sentinel records one."""
    now = now_iso()
    change = {"reset": now, "changed": True, "change_date": now, "change_run": None, "shift": None,
              "detector": "capacity_low_end", "source": "tune sentinel"} if drift else None
    runner.sf.tune.record_drift_check(dict(out, ts=now), change)
    runner.log("drift_check", **out)
    return out
