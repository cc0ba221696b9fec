"""What gate decides on: the metrics (``MetricSpec``, parsed from ``--primary``/``--guard``), the
settings (``Settings``: α, power, floor, sequential or fixed), ``--sigma`` values, and the names of
the three decisions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from vkit.decide.percent import parse_fraction
from vkit.errors import UsageError

DEFAULT_PRIMARY = "output_throughput:+"
# Metrics reported (not decided on) when every run has them; primary and guards are added.
REPORT_METRICS = (
    "output_throughput",
    "request_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "p95_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p95_tpot_ms",
    "mean_itl_ms",
    "mean_e2el_ms",
    "p95_e2el_ms",
    "p99_e2el_ms",
)

ACCEPT, REJECT, UNDECIDED = "accept", "reject", "undecided"


@dataclass(frozen=True)
class MetricSpec:
    """A metric and how to judge it: ``direction`` +1 when higher is better, −1 when lower is;
    ``tolerance`` (guards) the relative worsening allowed, None for max(2σ, floor)."""

    name: str
    direction: int
    role: str = "primary"
    tolerance: float | None = None

    @property
    def sign(self) -> str:
        return "+" if self.direction > 0 else "-"


def infer_direction(name: str) -> int | None:
    """+1 for rates (throughput, goodput, tok/s), −1 for times (``_ms``, ``_s``), else None."""
    if "throughput" in name or "goodput" in name or name.endswith("tok_s") or name.endswith("per_s"):
        return 1
    if name.endswith("_ms") or name.endswith("_s"):
        return -1
    return None


def parse_metric(text: str, role: str) -> MetricSpec:
    """``name``, ``name:+``, ``name:-`` or (guards) ``name:-:5%``."""
    parts = [p.strip() for p in text.split(":")]
    name = parts[0]
    if not name:
        raise UsageError(f"--{role} {text!r}: no metric name")
    if len(parts) > 3:
        raise UsageError(f"--{role} {text!r}: expected NAME[:+|-][:TOLERANCE]")
    if len(parts) >= 2 and parts[1]:
        if parts[1] not in ("+", "-"):
            raise UsageError(f"--{role} {text!r}: direction must be + (higher is better) or - (lower is better)")
        direction = 1 if parts[1] == "+" else -1
    else:
        d = infer_direction(name)
        if d is None:
            raise UsageError(f"--{role} {text!r}: cannot tell whether higher or lower is better; write {name}:+ or {name}:-")
        direction = d
    tol = None
    if len(parts) == 3 and parts[2]:
        if role == "primary":
            raise UsageError(f"--primary {text!r}: a tolerance belongs to a guard; the primary's threshold is max(2σ, --floor)")
        tol = parse_fraction(parts[2], f"--guard {text}")
    return MetricSpec(name, direction, role, tol)


def parse_guards(values: Iterable[str]) -> list[MetricSpec]:
    out = []
    for v in values:
        for part in v.split(","):
            if part.strip():
                out.append(parse_metric(part, "guard"))
    return out


@dataclass(frozen=True)
class Settings:
    """How gate decides. ``c`` and ``rho0`` tune the two confidence sequences (chosen by
    simulation in bench/bench_gate.py: c = 0.5, ρ₀ = 1 pair)."""

    alpha: float = 0.05
    power: float = 0.8
    floor: float = 0.03
    sequential: bool = True
    c: float = 0.5
    rho0: float = 1.0
    allow_anomaly: bool = False

    def __post_init__(self) -> None:
        if not (0 < self.alpha < 0.5):
            raise UsageError(f"--alpha {self.alpha}: must be in (0, 0.5)")
        if not (0.5 <= self.power < 1):
            raise UsageError(f"--power {self.power}: must be in [0.5, 1)")
        if not (0 <= self.floor < 1):
            raise UsageError(f"--floor {self.floor}: must be in [0, 1)")


def parse_sigma(values: Iterable[str]) -> dict:
    """``--sigma METRIC=REL`` (REL a fraction or a percentage), repeatable or comma-separated."""
    out = {}
    for v in values:
        for part in v.split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise UsageError(f"--sigma {part!r}: expected METRIC=REL, e.g. output_throughput=2%")
            k, x = part.split("=", 1)
            out[k.strip()] = parse_fraction(x, f"--sigma {part}")
    return out
