"""The records the search exchanges with the trial runner, and their JSON form."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Observation:
    """One evaluated configuration, after its repeats.

    ``objectives``: aggregated values, e.g. ``{"goodput": 2950.0, "p95_ttft_ms": 2480.0}``;
    ``repeats``: the per-repeat objective dicts (used for noise-aware dominance and the SLO's
    confidence bound); ``feasible``: False when the server failed to start or the measurement
    was invalid (then ``objectives`` may be empty); ``slo_ok``: the runner's own verdict on the
    SLO when it has one (False excludes the config from recommendations).
    """

    config: dict
    objectives: dict = field(default_factory=dict)
    repeats: list[dict] = field(default_factory=list)
    feasible: bool = True
    slo_ok: bool | None = None
    step: str | None = None
    trial_id: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Observation":
        return cls(config=dict(d["config"]), objectives=dict(d.get("objectives") or {}),
                   repeats=[dict(r) for r in d.get("repeats") or []], feasible=bool(d.get("feasible", True)),
                   slo_ok=d.get("slo_ok"), step=d.get("step"), trial_id=d.get("trial_id"))


@dataclass
class Objective:
    name: str
    direction: str  # "max" | "min"

    def __post_init__(self) -> None:
        if self.direction not in ("max", "min"):
            raise ValueError(f"objective {self.name}: direction must be 'max' or 'min', not {self.direction!r}")

    @property
    def sign(self) -> float:
        """+1 for minimised objectives, −1 for maximised: ``sign * value`` is minimised."""
        return 1.0 if self.direction == "min" else -1.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Proposal:
    """What to evaluate next, why, and everything needed to audit and replay the decision."""

    config: dict
    step: str
    reason: str
    audit: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"config": self.config, "step": self.step, "reason": self.reason, "audit": self.audit}

    @classmethod
    def from_dict(cls, d: dict) -> "Proposal":
        return cls(config=dict(d["config"]), step=str(d["step"]), reason=d.get("reason", ""), audit=dict(d.get("audit") or {}))


def objectives_from(items: Any) -> list[Objective]:
    out = []
    for o in items:
        out.append(o if isinstance(o, Objective) else Objective(o["name"], o["direction"]))
    return out


def history_from(items: Any) -> list[Observation]:
    return [o if isinstance(o, Observation) else Observation.from_dict(o) for o in items]


def _clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, float):
        return None if math.isnan(x) else float(f"{x:.12g}")
    if hasattr(x, "to_dict"):
        return _clean(x.to_dict())
    if hasattr(x, "item"):  # numpy scalar
        return _clean(x.item())
    return x


def digest(obj: Any) -> str:
    """sha256 of the canonical JSON of ``obj`` (sorted keys, floats to 12 significant digits)."""
    return hashlib.sha256(json.dumps(_clean(obj), sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def jsonable(obj: Any) -> Any:
    return _clean(obj)
