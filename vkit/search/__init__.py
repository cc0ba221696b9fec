"""The search library of ``sweep``: where to measure next, and what to deliver.

Pure library: never prints, never exits, keeps no module-level state; every answer is a
function of its inputs and a seed. The tune (``vkit.tune.context``, driven by ``vkit.tune.steps``) evaluates what
:func:`propose` or :class:`StagedPlan` ask for and hands back :class:`Observation` records;
:func:`deliver` turns the history into the Pareto configurations, the knee and the
recommendation. ``runbook/search.md`` explains the methods and the benchmark behind the
default mode.

Modules: ``space`` (parameters, lattices, encoding), ``gp`` (Gaussian process, log-EI,
EHVI), ``front`` (Pareto, hypervolume, knee, dominance rate, recommendation, delivery),
``staged`` (seed 000's order), ``propose`` (the modes, audit and replay), ``advisor`` (an
advisor model's prompt and the parse of its answer; imported as ``vkit.search.advisor``).
"""

from vkit.search.front import (
    DEFAULT_CONFIDENCE,
    KNEE_METHODS,
    constraint_bound,
    deliver,
    dominance_rate,
    dominates,
    exclusive_hv_2d,
    front_indices,
    hypervolume_2d,
    knee_point,
    marginal_utilities,
    nondominated_probability,
    objective_matrix,
    pareto_indices,
    pooled_log_sigma,
    recommend,
    slo_status,
)
from vkit.search.gp import GP, Prior, ehvi_2d, ei, log_ei, log_h, matern52
from vkit.search.propose import (
    ACQUISITIONS,
    LIES,
    MODES,
    RANDOM_EVERY,
    batch_lies,
    grid_levels,
    log_record,
    n_initial,
    propose,
    replay,
    replay_mismatches,
)
from vkit.search.space import Param, encode, key_of, lattice, lattice_size, param_from_dict, space_from_policy
from vkit.search.staged import StagedPlan, ablation_configs, flag_variants, knee_of_sweep
from vkit.search.types import Objective, Observation, Proposal, digest, history_from, jsonable, objectives_from

__all__ = [
    "ACQUISITIONS", "DEFAULT_CONFIDENCE", "GP", "KNEE_METHODS", "LIES", "MODES", "RANDOM_EVERY", "Objective", "Observation", "Param", "Prior",
    "Proposal", "StagedPlan", "ablation_configs", "batch_lies", "constraint_bound", "deliver", "digest", "dominance_rate",
    "dominates", "ehvi_2d", "ei", "encode", "exclusive_hv_2d", "flag_variants", "front_indices", "grid_levels",
    "history_from", "hypervolume_2d", "jsonable", "key_of", "knee_of_sweep", "knee_point", "lattice", "lattice_size",
    "log_ei", "log_h", "log_record", "marginal_utilities", "matern52", "n_initial", "nondominated_probability",
    "objective_matrix", "objectives_from", "pareto_indices", "param_from_dict", "pooled_log_sigma", "propose",
    "recommend", "replay", "replay_mismatches", "slo_status", "space_from_policy",
]
