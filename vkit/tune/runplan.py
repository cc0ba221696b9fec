"""What a tuning run is given and what it gives back: the run's context (tool, lease owner, policy,
callbacks, where servers run), its plan (tune's search flags), and the typed results of tune and
sweep's modes. Plain data: the drivers (``vkit.tune.driver``) read and fill them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from vkit.apply.backend import Backend
from vkit.apply.policy import Policy
from vkit.interrupts import Interrupts
from vkit.tune.result import TuneResult


def _quiet(msg: str) -> None:
    pass


@dataclass
class RunContext:
    """Who drives and where it reports: the tool's name, the lease owner (a parent run's when it
    hands its lease down), the parameter policy, the lease's lifetime and the callbacks."""

    tool: str
    owner: str
    policy: Policy
    lease_ttl_s: float = 6 * 3600.0
    progress: Callable[[str], None] = _quiet
    warn: Callable[[str], None] = _quiet
    interrupts: Interrupts = field(default_factory=Interrupts)
    ray: str | None = None  # --ray ADDRESS: the slots served on a Ray cluster's nodes (vkit.tune.fleet)
    backend: Backend | None = None  # where the servers run: processes (None), or the simulator in virtual time (--virtual)


@dataclass
class TunePlan:
    """What a tuning run does: its mode, steps and budgets (tune's search flags)."""

    mode: str = "staged"  # staged | bo | twin
    twin_fallback: bool = False  # --search auto: a twin that cannot calibrate gives way to the staged steps
    max_restarts: int | None = None  # --max-restarts: the twin search proposes no trial that would take the run past it
    twin_refit: bool = False  # --twin-refit: the twin refitted on each measured trial's load points too
    twin_design: str = "off"  # --twin-design: auto | always | off (designed closed-loop calibration runs, no restart)
    steps: list[str] = field(default_factory=lambda: ["1", "2", "3", "4m", "4", "5"])  # 4m: gpu_memory_utilization
    budget: int = 8  # trials per step (staged) or in all (bo)
    seed: int = 1  # the Bayesian search's seed
    staged_candidates: str = "policy"  # policy | octaves
    business_len: int | None = None  # step 1: None = (longest prompt + output) x 1.25
    max_model_len_candidates: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192])
    confirm_front: int = 4  # delivered configurations re-confirmed before delivery
    ablate: bool = True  # attribution after a keep that changed several parameters (steps.auto_ablate)
    restart: bool = False  # a new run even if the state holds an unfinished one
    report_dir: str | None = None  # None: reports/<run id> beside the state
    kb_path: str | None = None  # the knowledge base; None: knowledge.jsonl beside the state
    acquisition: str = "auto"  # --mode bo: vkit.search.propose's acquisition
    patience: int = 4  # --mode bo: early stop after this many evaluations in a row without a screened gain (0: never)
    batch_lie: str = "kb"  # --mode bo on slots: how a batch's later proposals treat its pending ones


@dataclass
class Tuned:
    """A finished tuning run: its result, its id and the report files written."""

    result: TuneResult
    run_id: str
    report: dict = field(default_factory=dict)  # md, html, json: paths


@dataclass
class StepRun:
    """One sweep step (or Bayesian search): its record, its trials, the kept configuration after it."""

    step: dict
    trials: list[dict]
    kept: dict

    def to_dict(self) -> dict:
        return {"step": self.step, "trials": self.trials, "kept": self.kept}


@dataclass
class Replay:
    """Logged proposals re-derived: how many, how many identical, and each difference."""

    proposals: int
    identical: int
    differences: list

    def to_dict(self) -> dict:
        return {"proposals": self.proposals, "identical": self.identical, "differences": self.differences}
