"""What a tune measures and how: the workload (the gauge), the capacity objective, the settings."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from vkit.measure.gauge import BenchOptions
from vkit.tune import capacity as _cap
from vkit.tune import capenergy as _capenergy


@dataclass
class Workload:
    """How every configuration is measured (the gauge: identical for all trials)."""

    options: BenchOptions  # bench_stream's options; repeat k of a configuration uses seed + k
    seed: int = 1
    name: str = "main"
    kind: str = "closed"  # how one measurement runs: "closed" (one bench_stream run) or "capacity" (an SLO-capacity search)

    def describe(self) -> dict:
        """The workload as the state file records it (bench_stream's flags, the seed apart)."""
        return {"name": self.name, "bench_args": self.options.flags(), "seed": self.seed}


@dataclass
class CapacityObjective:
    """Tune's capacity objective: every measurement of the main workload is one SLO-capacity search
    (``vkit.tune.capsearch``: an estimate with its 95 % interval), searched from the reference load (the
    first baseline search's capacity); the gate compares ``slo_capacity``."""

    slo: _cap.Slo
    plan: _cap.Plan
    accelerators: int | None = None
    verify_seconds: float = 60.0  # the promise verified by one run this long at the promised load (0: not verified)
    prices: _capenergy.Prices | None = None  # --price-per-accelerator-hour / --price-per-kwh: the cost at the capacity

    def describe(self) -> dict:
        p = self.plan
        return {"slo": dict(self.slo.limits), "goodput_fraction": self.slo.goodput, "mode": p.mode, "start": p.start,
                "accelerators": self.accelerators,
                "verify_seconds": self.verify_seconds,
                "tolerance": p.tolerance, "max_points": p.max_points, "repeats": p.model_repeats, "noise": p.noise,
                "precision": p.precision, "max_runs": p.max_runs, "method": "model",
                "point_seconds": p.point_seconds, "max_send_lag_ms": p.max_send_lag_ms, "keep_up": p.keep_up}


@dataclass
class Settings:
    workload: Workload
    baseline_repeats: int = 4
    screen_repeats: int = 2
    confirm_blocks: int = 6  # B A A B blocks at most (the budget; the power analysis plans fewer when σ allows)
    primary: str = "output_throughput:+"
    guards: list[str] = field(default_factory=lambda: ["p95_ttft_ms:-:15%"])
    slo: dict = field(default_factory=dict)  # e.g. {"p95_ttft_ms": 2000}
    eliminate_below: float = 0.10  # first screening run more than this (or 4σ) below the baseline: eliminated
    ready_timeout_s: float = 600.0
    sandbox: bool = True
    capacity: CapacityObjective | None = None  # None: the throughput objective (one load, the primary metric)
    time_budget_s: float | None = None  # --time-budget: no trial is started that cannot finish (with its confirmation) within it
    grant_budget: bool = False  # --yes: a confirmation whose power analysis needs more blocks than confirm_blocks gets them
    baseline_starts: int | None = None  # server starts the baseline's repeats are spread over (None: default_starts)
    energy_axis: bool = False  # --energy-axis: J per output token is an objective of the front (minimised)
    # --objective j-per-token: the load the deployment must carry within the SLO (req/s, or a trace's speed-up); every
    # capacity search measures it (the reference load), and the recommendation is the fewest J per output token there
    required_capacity: float | None = None

    def __post_init__(self) -> None:
        # under the capacity objective the tune's own workload is measured by capacity searches; the others
        # (step 1's, step 5's) stay single runs
        if self.capacity is not None and self.workload.kind != "capacity":
            self.workload = replace(self.workload, kind="capacity")

    @property
    def objective(self) -> str:
        if self.capacity is None:
            return "throughput"
        if self.required_capacity is not None:
            return "j-per-token"
        return "capacity-per-kw" if self.primary.startswith("slo_capacity_per_kw") else "capacity"

    def energy_metrics(self) -> tuple[str, ...]:
        """The board-energy figures this tune cannot decide without (every measurement must carry them)."""
        need = {"capacity-per-kw": ("slo_capacity_per_kw",), "j-per-token": ("ref_j_per_output_token",)}.get(self.objective, ())
        return need + (("j_per_output_token",) if self.energy_axis else ())

    def starts(self) -> int:
        return self.baseline_starts if self.baseline_starts is not None else default_starts(self.baseline_repeats)


def default_starts(repeats: int) -> int:
    """Server starts for ``repeats`` baseline runs by default: three when one of them can still
    measure two runs (σ within a process needs a start with two), else as many as allow that.
    Two starts give the between-restart part one degree of freedom, three give two: its 90 %
    interval's upper end falls from 16x to 4.4x the estimate."""
    return max(1, min(3, repeats - 1))


def start_sizes(repeats: int, starts: int) -> list[int]:
    """Runs per server start, as even as possible, the larger first: 4 over 3 is [2, 1, 1]."""
    s = max(1, min(starts, repeats))
    q, r = divmod(repeats, s)
    return [q + 1] * r + [q] * (s - r)
