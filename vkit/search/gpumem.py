"""The highest ``gpu_memory_utilization`` that starts, by bisection on the start-up outcome.

vLLM's ``benchmarks/auto_tune/auto_tune.sh`` steps down from 0.98 by 0.01 until the server starts:
an answer k hundredths below the top costs k + 1 starts. Starting is monotone in the value (more
memory asked for, more that can be refused), so the boundary between a value known to start (the
kept one) and the top can be bisected to the same 0.01 resolution:

- the top is tried first (auto_tune's first start too): where it starts, one start answers;
- then the midpoint (floored to 0.01) of the highest value that started and the lowest that did
  not, until they are 0.01 apart: 1 + ceil(log2(n)) starts for n hundredths between them;
- a failed start whose log carries vLLM's ``Free memory on device (F/T GiB) on startup is less
  than desired GPU memory utilization`` line bounds the answer directly: no value above F / T can
  start (vLLM refuses to ask for more than is free), so the bracket closes there, and F / T floored
  to 0.01 is tried next: two starts in all when it starts; the bisection goes on below it if it
  does not (memory taken during start-up, after that check).

The KV-cache size each start logs (``GPU KV cache size: N tokens``) is kept with its probe: it
is what the value buys (the caller reports it, and does not validate a value whose KV cache did
not grow).

Pure library: the caller starts the server (``start(value) -> Probe``); nothing is printed.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Callable

RESOLUTION = 0.01
TOP = 0.98  # the policy's max (S4) and auto_tune.sh's first value

_FREE = re.compile(r"Free memory on device \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired GPU memory utilization")


def hundredths(x: float) -> int:
    """``x`` on the 0.01 grid, rounded down (a value between two grid points never rounds up past it)."""
    return int(math.floor(x * 100 + 1e-6))


def grid_value(h: int) -> float:
    return round(h / 100, 2)


def free_ratio(text: str | None) -> tuple[float, float] | None:
    """F / T of vLLM's ``Free memory on device (F/T GiB) on startup ...`` line, or None: as printed,
    and at most (F is rounded to 0.01 GiB in the line, so the free memory may be 0.005 GiB more)."""
    m = _FREE.search(text or "")
    if not m:
        return None
    free, total = float(m.group(1)), float(m.group(2))
    return (free / total, (free + 0.005) / total) if total > 0 else None


@dataclass
class Probe:
    """One start of the server at ``value``: whether it started, the KV-cache size it logged, and
    (failed) the diagnosis kind and vLLM's own line."""

    value: float
    started: bool
    kv_cache_tokens: int | None = None
    kind: str | None = None
    quote: str | None = None

    @property
    def free_ratio(self) -> tuple[float, float] | None:
        return None if self.started else free_ratio(self.quote)

    def as_dict(self) -> dict:
        return asdict(self)


def bracket(lo: float, probes: list[Probe]) -> tuple[int, int | None]:
    """(highest value known to start, lowest value known not to), in hundredths; None: none failed.
    A failed start that logged the free memory rules out every value above F / T as well."""
    good = max([hundredths(lo)] + [hundredths(p.value) for p in probes if p.started])
    bads = [hundredths(p.value) for p in probes if not p.started]
    bads += [hundredths(r[1]) + 1 for p in probes if (r := p.free_ratio) is not None]
    return good, min(bads, default=None)


def next_value(lo: float, hi: float, probes: list[Probe]) -> float | None:
    """The next value to start, or None when the answer is known (:func:`answer`). ``lo`` is known to
    start (the kept value); ``hi`` is the highest value allowed (the policy's max)."""
    good, bad = bracket(lo, probes)
    top = hundredths(hi)
    tried = {hundredths(p.value) for p in probes}
    if bad is None:
        return grid_value(top) if good < top and top not in tried else None
    if bad <= good:
        return None  # not monotone: a value failed below one that started; the caller says so
    if bad - good <= 1:
        return None
    for p in probes:
        r = p.free_ratio
        h = hundredths(r[0]) if r is not None else None
        if h is not None and good < h < bad and h not in tried:
            return grid_value(h)
    return grid_value(good + (bad - good) // 2)


def answer(lo: float, probes: list[Probe]) -> float:
    """The highest value known to start (``lo`` when no higher one did)."""
    return grid_value(bracket(lo, probes)[0])


def monotone(lo: float, probes: list[Probe]) -> bool:
    """Whether every failed start lies above every value that started (the bisection's premise)."""
    good, bad = bracket(lo, probes)
    return bad is None or bad > good


def step_down_starts(value: float, top: float = TOP) -> int:
    """auto_tune.sh's starts to reach ``value``: one per 0.01 from ``top`` down to it, that one included."""
    return max(0, hundredths(top) - hundredths(value)) + 1


def bisect(lo: float, hi: float, start: Callable[[float], Probe], max_starts: int = 32) -> dict:
    """Run the search with ``start`` (value -> Probe): the answer, its KV-cache size, every probe,
    the starts used and what auto_tune.sh's step-down would have used."""
    probes: list[Probe] = []
    while len(probes) < max_starts:
        v = next_value(lo, hi, probes)
        if v is None:
            break
        probes.append(start(v))
    best = answer(lo, probes)
    kv = next((p.kv_cache_tokens for p in probes if p.started and hundredths(p.value) == hundredths(best)), None)
    return {"value": best, "kv_cache_tokens": kv, "probes": [p.as_dict() for p in probes], "starts": len(probes),
            "step_down_starts": step_down_starts(best, hi), "monotone": monotone(lo, probes)}
