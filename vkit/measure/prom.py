"""A small Prometheus text-format parser and the /metrics arithmetic vkit needs:
counter and histogram deltas between two scrapes, summed over label sets.

Only what vLLM's /metrics uses: ``# HELP``/``# TYPE`` comments, samples with optional
labels, no timestamps or exemplars needed (both are tolerated and ignored).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\S+)?\s*$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


class PromParseError(ValueError):
    pass


@dataclass
class Metrics:
    """Parsed exposition: samples by metric name, and the declared family types."""

    samples: dict[str, list[tuple[dict, float]]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)

    def families(self) -> set[str]:
        return set(self.types)

    def get(self, name: str, **labels: str) -> list[tuple[dict, float]]:
        return [(lb, v) for lb, v in self.samples.get(name, []) if all(lb.get(k) == want for k, want in labels.items())]

    def total(self, name: str, **labels: str) -> float | None:
        """Sum of a sample over all label sets (None if absent)."""
        rows = self.get(name, **labels)
        return sum(v for _, v in rows) if rows else None

    def first_labels(self, name: str) -> dict | None:
        rows = self.samples.get(name)
        return dict(rows[0][0]) if rows else None

    def histogram(self, name: str, **labels: str) -> "Histogram | None":
        """The histogram ``name`` summed over label sets (``_bucket``/``_sum``/``_count``)."""
        buckets: dict[float, float] = {}
        for lb, v in self.get(name + "_bucket", **labels):
            le = lb.get("le")
            if le is None:
                continue
            b = math.inf if le in ("+Inf", "Inf", "inf") else float(le)
            buckets[b] = buckets.get(b, 0.0) + v
        s, c = self.total(name + "_sum", **labels), self.total(name + "_count", **labels)
        if not buckets and c is None:
            return None
        return Histogram(sorted(buckets.items()), s or 0.0, c or 0.0)


@dataclass
class Histogram:
    buckets: list[tuple[float, float]]  # (upper bound, cumulative count)
    sum: float
    count: float

    def minus(self, before: "Histogram | None") -> "Histogram":
        if before is None:
            return self
        prev = dict(before.buckets)
        return Histogram([(b, c - prev.get(b, 0.0)) for b, c in self.buckets], self.sum - before.sum, self.count - before.count)

    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def quantile(self, q: float) -> float | None:
        """Prometheus-style ``histogram_quantile`` (linear within the bucket)."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        prev_b, prev_c = 0.0, 0.0
        for b, c in self.buckets:
            if c >= rank:
                if math.isinf(b):
                    return prev_b
                if c == prev_c:
                    return b
                return prev_b + (b - prev_b) * (rank - prev_c) / (c - prev_c)
            prev_b, prev_c = b, c
        return prev_b


_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_ESCAPE_RE = re.compile(r'\\[\\"n]')


def _unescape(s: str) -> str:
    """Label value escapes, in one left-to-right pass (``\\\\n`` is a backslash and an n)."""
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group(0)], s)


def parse(text: str) -> Metrics:
    m = Metrics()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                m.types[parts[2]] = parts[3].strip()
            continue
        mo = _SAMPLE.match(line)
        if not mo:
            raise PromParseError(f"line {n}: not a Prometheus sample: {raw[:80]!r}")
        name, _, lbl, val = mo.group(1), mo.group(2), mo.group(3), mo.group(4)
        labels: dict[str, str] = {}
        if lbl:
            pos = 0
            while pos < len(lbl):
                lm = _LABEL.match(lbl, pos)
                if not lm:
                    raise PromParseError(f"line {n}: bad labels {lbl[:80]!r}")
                labels[lm.group(1)] = _unescape(lm.group(2))
                pos = lm.end()
        try:
            v = float(val)
        except ValueError:
            raise PromParseError(f"line {n}: bad value {val!r}") from None
        m.samples.setdefault(name, []).append((labels, v))
    return m
