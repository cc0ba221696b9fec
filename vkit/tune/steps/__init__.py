"""The tuning order of seed 000, driven through the per-trial state machine of ``vkit.tune.context``.

Step 1 max-model-len (start-up success, KV capacity, TTFT stability) → frozen; step 2
max-num-batched-tokens with max-num-seqs fixed; step 3 max-num-seqs at the best budget with
knee detection; step 4 a small grid around the knee; step 5 behaviour flags as a validation
on a mixed long/short workload. Each step screens its candidates, then re-confirms its winner
on fresh interleaved runs with the gate before keeping it (the winner's curse). ``bo`` mode
replaces steps 2–4 by Bayesian optimisation over the same parameters.

Stop rules are quantified and recorded with each step. Library only: progress goes to the
callback, nothing is printed.

One module per step or phase: ``common`` (objectives, observations, a step's record), ``step1``,
``screening`` (steps 2-4's screen-and-confirm), ``aa`` (the slots' A/A pass), ``gpumemory``,
``proposers`` (staged and Bayesian), ``step5``, ``delivery`` (the front and the recommendation) and
``ablation``; ``twinsearch`` (tune --search twin) and ``twinmemory`` (step 4m after it). The names the driver calls are here.
"""

from __future__ import annotations

from vkit.tune.steps.aa import (  # noqa: F401
    AA_REPEATS,
    baseline_beside_aa,
    slot_effects,
)
from vkit.tune.steps.ablation import (  # noqa: F401
    auto_ablate,
    run_ablation,
)
from vkit.tune.steps.common import (  # noqa: F401
    CAPACITY_OBJECTIVES,
    OBJECTIVES,
    guard_anomalies,
    objectives,
    observations,
    search_slo,
)
from vkit.tune.steps.delivery import (  # noqa: F401
    claim_guards,
    confirm_front,
    deliver,
    energy_pick,
    more_interactive,
)
from vkit.tune.steps.gpumemory import (  # noqa: F401
    find_highest_start,
    load_failure,
    run_gpu_memory_step,
)
from vkit.tune.steps.proposers import (  # noqa: F401
    BO_BOUNDS,
    BO_NAMES,
    BO_PATIENCE,
    CAPACITY_ACQUISITION,
    bo_acquisition,
    bo_proposer,
    bo_space,
    bo_stalled,
    kb_observations,
    prior_observations,
    staged_proposer,
    step3_knee,
)
from vkit.tune.steps.screening import (  # noqa: F401
    over_time,
    run_screening_step,
    screened_effect,
)
from vkit.tune.steps.step1 import (  # noqa: F401
    STEP1_TTFT_RATIO,
    run_step1,
)
from vkit.tune.steps.step5 import (  # noqa: F401
    run_step5,
    step5_flips,
    workload_priorities,
)
from vkit.tune.steps.twinmemory import (  # noqa: F401
    run_twin_memory_step,
)
from vkit.tune.steps.twinsearch import (  # noqa: F401
    kb_twin,
    prior_twin,
    run_twin_step,
    twin_replay,
)
