"""The proposers of steps 2-4: the staged octave plan and knee (seed 000), and Bayesian optimisation."""

from __future__ import annotations

from typing import Callable

from vkit import search
from vkit.apply.policy import Policy
from vkit.tune.context import Tune
from vkit.tune.ledger import Status
from vkit.tune.steps.common import finished_step, objectives, observations, search_slo
from vkit.tune.steps.delivery import workload_concurrency
from vkit.tune.steps.step5 import workload_priorities

# --staged-candidates octaves: the bounds bench/bench_tuner.py measured it in
OCTAVE_BOUNDS = {"max_num_batched_tokens": (256, 32768), "max_num_seqs": (8, 512)}


def staged_proposer(runner: Tune, policy: Policy, step: str, candidates: str = "policy") -> tuple[Callable, Callable]:
    st = runner.ledger.tune()
    names = ["max_num_batched_tokens", "max_num_seqs"]
    octaves = candidates == "octaves"
    space = search.space_from_policy(policy, names, frozen=st.frozen, bounds=OCTAVE_BOUNDS if octaves else None)
    # open loop there is no client concurrency to stay above: the server's own limit is what is measured
    conc = workload_concurrency(runner.s.workload) if runner.s.capacity is None else None
    opts = {"tokens_candidates": "octaves", "seqs_candidates": "octaves"} if octaves else {}
    base = dict(st.kept_config)
    if step == "4":
        knee = step3_knee(runner, space, base, conc, opts)
        if knee is not None:
            base["max_num_seqs"] = knee  # the grid centres on step 3's knee, kept or not
    plan = _staged_plan(runner, space, base, step, conc, opts)
    return plan.next, plan.stop_reason


def _staged_plan(runner: Tune, space: list, base: dict, step: str, conc: int | None, opts: dict) -> search.StagedPlan:
    return search.StagedPlan(space, base, objectives(runner), search_slo(runner), steps=(step,), load_concurrency=conc, **opts)


def step3_knee(runner: Tune, space: list, base: dict, conc: int | None, opts: dict) -> int | None:
    """Step 3's knee as its finished sweep shows it (the same plan replayed over the measured
    trials), or None when step 3 has not finished or found no knee."""
    if finished_step(runner, "3") is None:
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


def kb_observations(runner: Tune) -> list[dict]:
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


def bo_space(runner: Tune, policy: Policy) -> list:
    """The Bayesian search's space for this run (``BO_NAMES``, frozen parameters left out)."""
    names = list(BO_NAMES) + (["scheduling_policy"] if len(workload_priorities(runner.s.workload)) >= 2 else [])
    rows = {r["param"] for r in (policy.data if hasattr(policy, "data") else policy).get("situational", [])}
    names = [n for n in names if n in rows]
    return search.space_from_policy(policy, names, frozen=runner.ledger.tune().frozen,
                                    bounds={k: v for k, v in BO_BOUNDS.items() if k in names})


def bo_stalled(runner: Tune, patience: int = BO_PATIENCE) -> int | None:
    """The evaluations in a row, at the end of this run's Bayesian search, whose screening gate did
    not accept a gain over the kept configuration, when there are at least ``patience`` of them."""
    trials = [t for t in runner.ledger.trials(step="bo") if t["status"] != Status.SKIPPED and t.get("finished")]
    run = 0
    for t in reversed(trials):
        if t.get("verdict") == "accept":
            break
        run += 1
    return run if patience and run >= patience else None


def bo_acquisition(runner: Tune, acquisition: str) -> str:
    """The acquisition a Bayesian search of this run uses: ``auto`` under the capacity objective
    becomes :data:`CAPACITY_ACQUISITION`; anything else is as asked."""
    return CAPACITY_ACQUISITION if acquisition == "auto" and runner.s.capacity is not None else acquisition


def bo_proposer(runner: Tune, policy: Policy, budget: int, seed: int,
                prior: list[search.Observation] | None = None, acquisition: str = "auto",
                patience: int = BO_PATIENCE, batch_lie: str = "kb") -> tuple[Callable, Callable]:
    st = runner.ledger.tune()
    space = bo_space(runner, policy)
    base = dict(st.kept_config)
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
