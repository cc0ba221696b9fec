"""What every step shares: the objectives, the observations the search sees, a step's record, the guard on anomalies."""

from __future__ import annotations

import math

from vkit import search
from vkit.errors import ExitCode, Rejected, VkitError
from vkit.tune.context import Tune
from vkit.tune.ledger import FINISHED, PENDING, Status
from vkit.tune.measurement import Measurer

OBJECTIVES = [search.Objective("output_throughput", "max"), search.Objective("p95_ttft_ms", "min")]
# The capacity objective: SLO capacity (req/s), and interactivity as mean TPOT at the reference load
# (per-user output tok/s = 1000 / TPOT: the same order, the axis the report shows).
CAPACITY_OBJECTIVES = [search.Objective("slo_capacity", "max"), search.Objective("ref_mean_tpot_ms", "min")]


# --energy-axis: board energy per output token, at the capacity (or the run's load), a third objective
ENERGY_OBJECTIVE = search.Objective("j_per_output_token", "min")
# --objective j-per-token: SLO capacity, and the board energy per output token at the required load (the
# reference load of every search), the figure the recommendation minimises among the configurations carrying it
REQUIRED_OBJECTIVES = [search.Objective("slo_capacity", "max"), search.Objective("ref_j_per_output_token", "min")]


def objectives(runner: Tune) -> list[search.Objective]:
    """The search's objectives for this run's objective (throughput at one load, SLO capacity, SLO capacity
    per kW, or J per output token at a required capacity), J per output token at the capacity beside them with
    --energy-axis."""
    s = runner.s
    if s.capacity is None:
        objs = list(OBJECTIVES)
    elif s.objective == "j-per-token":
        objs = list(REQUIRED_OBJECTIVES)
    else:
        objs = list(CAPACITY_OBJECTIVES) if s.objective == "capacity" else [
            search.Objective("slo_capacity_per_kw", "max"), *CAPACITY_OBJECTIVES[1:]]
    return objs + ([ENERGY_OBJECTIVE] if s.energy_axis else [])


def primary_metric(runner: Tune) -> str:
    return objectives(runner)[0].name


def search_slo(runner: Tune) -> dict | None:
    """The SLO as the search sees it: a constraint on the throughput objective; inside the capacity
    objective already (a capacity is the highest load meeting it), so none on top."""
    return None if runner.s.capacity is not None else (runner.s.slo or None)
STEP_NAMES = {"1": "max-model-len", "2": "max-num-batched-tokens", "3": "max-num-seqs",
              "4m": "gpu-memory-utilization (highest that starts, validated under load)", "4": "grid around the knee",
              "5": "behaviour flags (validation)", "bo": "Bayesian optimisation",
              "twin": "twin-guided search (the calibrated simulator ranks, the server confirms)"}


def observations(runner: Tune, steps: tuple[str, ...] | None = None) -> list[search.Observation]:
    """Finished trials as the search sees them (screening means; infeasible when they did not start)."""
    st = runner.ledger.tune()
    slo = search_slo(runner)
    objs = objectives(runner)
    out = []
    for t in st.trials(status=FINISHED):
        if steps is not None and t["step"] not in steps:
            continue
        feasible = t["status"] in (Status.DONE, Status.ELIMINATED, Status.SKIPPED) and t.get("valid") is not False and bool(t.get("metrics"))
        obj = {o.name: t["metrics"].get(o.name) for o in objs if t["metrics"].get(o.name) is not None}
        if feasible and len(obj) < len(objs):
            feasible = False
        slo_ok = None
        if feasible and slo:
            slo_ok = all(obj.get(k, math.inf) <= v for k, v in slo.items() if k in obj)
        reps = []
        for p in t.get("runs") or []:
            try:
                d = runner.ledger.load(p)
                reps.append({o.name: d.get(o.name) for o in objs})
            except (OSError, ValueError):
                continue
        out.append(search.Observation(config=dict(t["config"]), objectives=obj, repeats=reps, feasible=feasible,
                                      slo_ok=slo_ok, step=t["step"], trial_id=t["id"]))
    return out


def finished_step(runner: Tune, step: str) -> dict | None:
    for s in runner.ledger.tune().steps:
        if s["step"] == step and s.get("finished"):
            return s
    return None


def record_step(runner: Tune, rec: dict) -> None:
    runner.sf.tune.record_step(rec)


def open_trial(runner: Tune, step: str) -> dict | None:
    """A trial of this step that an interruption left unfinished."""
    pending = runner.ledger.trials(step=step, status=PENDING)
    return pending[0] if pending else None


# finding -> (what the runs showed, whose fault, when to rerun): a baseline that still shows it after the
# measurer's own retries fails for a reason outside the serving path
PASSING_CAUSES = {
    "client_saturation": ("the client fell behind its schedule", "the machine running vkit is busy", "quiet"),
    "level_moved": ("the server's level moved during its capacity searches",
                    "the serving machine is drifting (clocks, thermals, a neighbour's load)", "steady"),
}


def guard_anomalies(runner: Tune) -> None:
    """Seed: a baseline with an invariant anomaly (e.g. prefill slower than decode) blocks steps 2–4:
    fix the path first — headroom is not a reason to use it now."""
    b = runner.ledger.record("baseline")
    bad = [c for c in b.get("checks", []) if c.get("code") not in (0, None)]
    if bad:
        f = sorted({x for c in bad for x in (c.get("findings") or [])})
        if set(f) <= Measurer.TRANSIENT | Measurer.SATURATION_EFFECTS:
            # a cause outside the serving path, measured again and still there: no baseline, no steps
            cause = next((c for k, c in PASSING_CAUSES.items() if k in f), None)
            if cause:
                raise VkitError(
                    f"the baseline could not be measured: {cause[0]} ({', '.join(f)}) even when measured again: "
                    f"{cause[1]}; when it is {cause[2]}, rerun with --restart (a new baseline) (steps 2–4 are not "
                    "started on such a baseline)", ExitCode.INVALID)
        raise Rejected(
            f"the baseline has invariant anomalies ({', '.join(f)}): fix the serving path before tuning throughput "
            "(steps 2–4 are blocked; run check_invariants on the baseline runs for the explanation)"
        )
