"""Step 4m under the twin (``tune --search twin``): the twin says whether more KV cache can pay before any start.

Step 4m finds the highest ``gpu_memory_utilization`` that starts by bisection on real starts, then validates it
under the load (a screen and a confirmation on fresh starts): three to eight restarts. A larger memory fraction
buys KV-cache blocks, and blocks raise SLO capacity only where the kept configuration runs out of them. The
twin, fitted to this run's load points, predicts the kept configuration's capacity at its own value and at the
policy's highest, with the fit's parameter sets (:meth:`vkit.tune.twin.Twin.draws`); when no set predicts a gain
of the gate's least (``MIN_GAIN``), the step is recorded as not searched, with the twin's figures, and no start
is made. Otherwise step 4m runs as always: what starts is only ever learned from starts, and the gain is kept
only through the gate on real runs.
"""

from __future__ import annotations

from typing import Callable

from vkit.apply.policy import Policy
from vkit.search import gpumem
from vkit.state import now_iso
from vkit.tune.context import Tune
from vkit.tune.steps.common import STEP_NAMES, finished_step, record_step
from vkit.tune.steps.gpumemory import GMU, gpu_memory_bounds, run_gpu_memory_step
from vkit.tune.steps.twinsearch import MIN_GAIN, run_profile
from vkit.tune.twin import Twin


def last_twin(runner: Tune) -> Twin | None:
    """This run's last fitted twin, rebuilt from its ``twin_profile`` event's inputs and profile file
    (:func:`vkit.tune.steps.twinsearch.run_profile`; None: none)."""
    from vkit.sim.calibrated import load_profile

    prof = run_profile(runner)
    if prof is None or not prof.get("inputs"):
        return None
    return Twin.from_inputs(prof["inputs"], load_profile(prof["profile"])["cost_params"], prof.get("profile_sha256") or "")


def memory_verdict(twin, kept: dict, lo: float, hi: float) -> dict:
    """The twin's kept configuration at ``gpu_memory_utilization`` ``lo`` and ``hi``, with the fit and each drawn
    parameter set: the capacities (wall req/s), the gains hi over lo, and whether any gain reaches MIN_GAIN (a
    twin that predicts no capacity at ``lo`` cannot say: it pays)."""
    sets = [None, *twin.draws()]
    caps = twin.capacities([(dict(kept, **{GMU: v}), ps, twin.hint) for ps in sets for v in (lo, hi)])
    gains = [b / a - 1 for a, b in zip(caps[0::2], caps[1::2], strict=True) if a > 0]
    return {"lo": lo, "hi": hi, "capacity": {"lo": round(caps[0], 4), "hi": round(caps[1], 4)},
            "gains": [round(g, 4) for g in gains], "pays": not gains or max(gains) >= MIN_GAIN}


def run_twin_memory_step(runner: Tune, policy: Policy, progress: Callable[[str], None], budget: int) -> dict:
    """Step 4m after the twin step: not searched when this run's twin predicts no gain from the policy's highest
    memory fraction in any of its parameter sets (a step record saying so, and a ``twin_memory`` log event);
    otherwise :func:`run_gpu_memory_step`."""
    done = finished_step(runner, "4m")
    if done:
        return done
    twin = last_twin(runner)
    lo, hi, lo_why = gpu_memory_bounds(runner, policy)
    if twin is None or gpumem.hundredths(lo) >= gpumem.hundredths(hi):
        return run_gpu_memory_step(runner, policy, progress, budget)
    kept = runner.ledger.kept_config()
    v = memory_verdict(twin, kept, lo, hi)
    runner.log("twin_memory", config=kept, profile_sha256=twin.profile_sha256, **v)
    best = max(v["gains"], default=0.0)
    said = (f"twin: the kept configuration at {GMU} {hi} predicted {v['capacity']['hi']:.4g} req/s against "
            f"{v['capacity']['lo']:.4g} at {lo} ({lo_why}); the largest gain over the fit's {len(v['gains'])} parameter "
            f"set(s) {best:+.1%}")
    if v["pays"]:
        progress(f"step 4m: {said}: more KV cache may pay, searched on real starts")
        return run_gpu_memory_step(runner, policy, progress, budget)
    result = f"not searched: more KV cache cannot pay the gate's least gain ({MIN_GAIN:.0%}) by the twin; no start made"
    rec = {"step": "4m", "name": STEP_NAMES["4m"], "lo": lo, "lo_from": lo_why, "hi": hi, "twin": v, "trials": [],
           "result": result, "stop_rule": said + f" < {MIN_GAIN:.0%}", "finished": now_iso()}
    record_step(runner, rec)
    progress(f"step 4m done: {result} ({said})")
    return rec
