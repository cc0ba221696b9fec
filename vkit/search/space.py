"""The search space: tunable parameters, their lattices and their encoding for a surrogate.

Every parameter has a finite, ordered lattice of values (``Param.levels()``) so that a
proposal is always a value an engineer would type (``max_num_seqs=96``, not 93) and so that
"never re-propose an evaluated config" is an exact set test. Integers on a log scale use the
"nice" lattice {1, 1.5} x 2^k (…, 4096, 6144, 8192, 12288, …) plus the policy's candidates
and the bounds; floats use 41 evenly spaced values plus the candidates; booleans and choices
use their values.

For the Gaussian process every parameter maps to [0, 1] (log-scaled when ``log``; a choice
with more than two values becomes one 0/1 coordinate per value).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from vkit.errors import UsageError

KINDS = ("int", "float", "bool", "choice")
# Steps of seed 000 whose parameters form the default search space: 1 (max_model_len) is a
# business decision frozen before the search; 5 (behaviour flags) is a validation, not a search.
SEARCH_STEPS = (2, 3, 4)
FLOAT_LEVELS = 41
MAX_ENUMERATE = 20000  # the acquisition is evaluated on the whole lattice up to this size


@dataclass
class Param:
    """One tunable. ``values`` (optional) replaces the derived lattice with an explicit one."""

    name: str
    kind: str  # "int" | "float" | "bool" | "choice"
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: list | None = None
    candidates: list | None = None
    values: list | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UsageError(f"parameter {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind in ("int", "float"):
            if self.values:
                vals = sorted(self.coerce(v) for v in self.values)
                self.low = vals[0] if self.low is None else self.low
                self.high = vals[-1] if self.high is None else self.high
            if self.low is None or self.high is None or self.low > self.high:
                raise UsageError(f"parameter {self.name}: needs low <= high (got {self.low}, {self.high})")
            if self.log and self.low <= 0:
                raise UsageError(f"parameter {self.name}: a log scale needs low > 0 (got {self.low})")
        if self.kind == "choice" and not self.choices:
            raise UsageError(f"parameter {self.name}: a choice needs its choices")

    # -- values -----------------------------------------------------------
    def coerce(self, v: Any) -> Any:
        if self.kind == "int":
            return int(round(float(v)))
        if self.kind == "float":
            return float(f"{float(v):.6g}")
        if self.kind == "bool":
            return bool(v)
        return v if v in (self.choices or []) else str(v)

    def levels(self) -> list:
        """The ordered finite lattice of values this parameter may take."""
        if self.kind == "bool":
            return [False, True]
        if self.kind == "choice":
            return list(self.choices or [])
        if self.values:
            out = {self.coerce(v) for v in self.values}
        elif self.kind == "int":
            out = _int_lattice(int(self.low), int(self.high), self.log)
        else:
            out = {self.coerce(v) for v in _float_lattice(float(self.low), float(self.high), self.log)}
        for c in self.candidates or []:
            c = self.coerce(c)
            if self.low <= c <= self.high:
                out.add(c)
        return sorted(out)

    def snap(self, v: Any) -> Any:
        """The lattice value nearest to ``v`` (on the parameter's scale)."""
        lv = self.levels()
        if self.kind in ("bool", "choice"):
            return v if v in lv else lv[0]
        u = self.unit(v)
        return lv[int(np.argmin([abs(self.unit(x) - u) for x in lv]))]

    def unit(self, v: Any) -> float:
        """Position of a numeric value on [0, 1] (log-scaled when ``log``)."""
        lo, hi, x = float(self.low), float(self.high), float(v)
        if self.log:
            lo, hi, x = math.log(lo), math.log(hi), math.log(max(x, 1e-300))
        return 0.0 if hi == lo else (x - lo) / (hi - lo)

    def from_unit(self, u: float) -> Any:
        """The lattice value nearest to unit position ``u``."""
        if self.kind == "bool":
            return bool(u >= 0.5)
        if self.kind == "choice":
            ch = list(self.choices or [])
            return ch[min(int(u * len(ch)), len(ch) - 1)]
        lo, hi = float(self.low), float(self.high)
        x = math.exp(math.log(lo) + u * (math.log(hi) - math.log(lo))) if self.log else lo + u * (hi - lo)
        return self.snap(x)

    def width(self) -> int:
        """Number of encoded coordinates."""
        return len(self.choices) if self.kind == "choice" and len(self.choices or []) > 2 else 1

    def encode(self, v: Any) -> list[float]:
        if self.kind == "bool":
            return [1.0 if v else 0.0]
        if self.kind == "choice":
            ch = list(self.choices or [])
            if len(ch) <= 2:
                return [float(ch.index(v)) if v in ch else 0.5]
            return [1.0 if v == c else 0.0 for c in ch]
        return [self.unit(v)]

    def to_dict(self) -> dict:
        return asdict(self)


def _int_lattice(lo: int, hi: int, log: bool) -> set[int]:
    if not log:
        if hi - lo <= 256:
            return set(range(lo, hi + 1))
        return {int(round(x)) for x in np.linspace(lo, hi, 65)}
    out = {lo, hi}
    k = 0
    while (1 << k) <= hi:
        for v in (1 << k, 3 << k >> 1 if k > 0 else 1):
            if lo <= v <= hi:
                out.add(v)
        k += 1
    for v in (1, 2, 3):  # below 4 every integer is a "nice" value
        if lo <= v <= hi:
            out.add(v)
    return out


def _float_lattice(lo: float, hi: float, log: bool) -> list[float]:
    """About ``FLOAT_LEVELS`` values: geometric when ``log``, else multiples of a round step
    (1, 2 or 5 times a power of ten) so that values read as an engineer would write them."""
    if hi == lo:
        return [lo]
    if log:
        return list(np.exp(np.linspace(math.log(lo), math.log(hi), FLOAT_LEVELS)))
    raw = (hi - lo) / (FLOAT_LEVELS - 1)
    e = 10.0 ** math.floor(math.log10(raw))
    step = next(m * e for m in (1, 2, 5, 10) if m * e >= raw * (1 - 1e-9))
    first = math.ceil(lo / step - 1e-9) * step
    vals = list(np.arange(first, hi + step * 1e-6, step))
    return [lo] + [round(v, 10) for v in vals if lo < v < hi] + [hi]


def param_from_dict(d: dict) -> Param:
    return Param(**{k: d.get(k) for k in ("name", "kind", "low", "high", "log", "choices", "candidates", "values")
                    if k in d or k in ("name", "kind")})


def space_from_policy(policy: Any, names: list[str] | None = None, frozen: dict | None = None,
                      bounds: dict | None = None) -> list[Param]:
    """Build the search space from the parameter policy's "situational" rows.

    ``policy``: a :class:`vkit.apply.policy.Policy` or its data dict. ``names``: the parameters to
    search (default: the tunables of steps 2–4). ``frozen``: parameters that must not move
    (left out of the space). ``bounds``: ``{name: (low, high)}`` narrows a range (it must stay
    inside the policy's range), ``{name: [v1, v2, …]}`` gives an explicit lattice.
    Integers whose range spans a factor of 16 or more are searched on a log scale.
    """
    data = policy.data if hasattr(policy, "data") else policy
    rows = {_canon(r["param"]): r for r in data.get("situational", [])}
    frozen_set = {_canon(k) for k in (frozen or {})}
    if names is None:
        names = [p for p, r in rows.items() if r.get("step") in SEARCH_STEPS]
    out: list[Param] = []
    bounds = {_canon(k): v for k, v in (bounds or {}).items()}
    for raw in names:
        n = _canon(raw)
        if n in frozen_set:
            continue
        r = rows.get(n)
        if r is None:
            raise UsageError(f"{n} is not a situational parameter of the policy; add it under 'situational' to search it")
        kind = r.get("type")
        cands = list(r.get("candidates") or [])
        if kind in ("int", "float"):
            lo, hi = r.get("min"), r.get("max")
            values = None
            b = bounds.get(n)
            if isinstance(b, dict):
                lo, hi = _narrow(n, r, (b.get("low", lo), b.get("high", hi)))
            elif isinstance(b, tuple):
                lo, hi = _narrow(n, r, b)
            elif isinstance(b, list) and b:
                values = sorted(b)
                lo, hi = _narrow(n, r, (values[0], values[-1]))
            elif b is not None:
                raise UsageError(f"bounds for {n}: give (low, high), {{'low': …, 'high': …}} or a list of values")
            log = kind == "int" and lo is not None and lo > 0 and hi / lo >= 16
            cands = [c for c in cands if lo <= c <= hi]
            out.append(Param(n, kind, float(lo) if kind == "float" else int(lo), float(hi) if kind == "float" else int(hi),
                             log=log, candidates=cands or None, values=values))
        elif kind == "bool":
            out.append(Param(n, "bool", candidates=cands or None))
        elif kind == "choice":
            out.append(Param(n, "choice", choices=list(r["choices"]), candidates=cands or None))
        else:
            raise UsageError(f"{n} has type {kind!r} in the policy; the search handles int, float, bool and choice")
    return out


def _narrow(name: str, rule: dict, b) -> tuple:
    lo, hi = b
    plo, phi = rule.get("min"), rule.get("max")
    if lo is None or hi is None or lo > hi:
        raise UsageError(f"bounds for {name} must be low <= high, got {b}")
    if (plo is not None and lo < plo) or (phi is not None and hi > phi):
        raise UsageError(f"bounds {lo}..{hi} for {name} leave the policy range [{plo}, {phi}] (rule {rule.get('id')})")
    return lo, hi


def _canon(name: str) -> str:
    return name.strip().lstrip("-").replace("-", "_")


# -- configs ---------------------------------------------------------------
def key_of(config: dict, space: list[Param]) -> tuple:
    """The identity of a config inside the space (values coerced to each parameter's type)."""
    return tuple(p.coerce(config[p.name]) if config.get(p.name) is not None else None for p in space)


def encode(configs: list[dict], space: list[Param]) -> np.ndarray:
    rows = []
    for c in configs:
        row: list[float] = []
        for p in space:
            v = c.get(p.name)
            row += p.encode(v) if v is not None else [0.5] * p.width()
        rows.append(row)
    return np.asarray(rows, dtype=float).reshape(len(configs), sum(p.width() for p in space))


def lattice_size(space: list[Param]) -> int:
    n = 1
    for p in space:
        n *= len(p.levels())
    return n


def lattice(space: list[Param]) -> list[tuple]:
    """Every lattice point as a tuple of values, in a fixed order (only for small spaces)."""
    levels = [p.levels() for p in space]
    idx = np.indices([len(lv) for lv in levels]).reshape(len(levels), -1).T
    return [tuple(levels[j][i] for j, i in enumerate(row)) for row in idx]


def config_of(values: tuple, space: list[Param], base_config: dict) -> dict:
    out = dict(base_config)
    for p, v in zip(space, values, strict=True):
        out[p.name] = v
    return out


def from_units(u: np.ndarray, space: list[Param]) -> tuple:
    return tuple(p.from_unit(float(x)) for p, x in zip(space, u, strict=True))
