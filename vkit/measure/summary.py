"""Summary statistics with ``vllm bench serve``'s definitions and key names, so a vkit
summary can be diffed line by line against ``--save-result`` output.

Definitions (vllm/benchmarks/serve.py): TTFT per completed request; TPOT =
(E2EL − TTFT)/(output − 1) over requests with more than one output token; ITL pools
every gap of every request; E2EL = last token event − send. Percentiles with
``numpy.percentile`` (linear), std is the population std (``numpy.std``), an empty
list gives 0 as vLLM does.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

METRICS = ("ttft", "tpot", "itl", "e2el")
PERCENTILES = (50, 90, 95, 99)

# The keys `vllm bench serve --save-result` writes (without --save-detailed), in its order.
VLLM_BASE_KEYS = (
    "date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
    "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    "max_output_tokens_per_s", "max_concurrent_requests",
)


def stat_keys(metric: str) -> list[str]:
    return [f"mean_{metric}_ms", f"median_{metric}_ms", f"std_{metric}_ms"] + [f"p{p}_{metric}_ms" for p in PERCENTILES]


def vllm_keys() -> list[str]:
    keys = list(VLLM_BASE_KEYS)
    for m in METRICS:
        keys += stat_keys(m)
    return keys


def describe_ms(values_s: Iterable[float], metric: str) -> dict:
    """mean/median/std/percentiles in ms of values given in seconds (0 when empty, as vLLM)."""
    a = np.asarray(list(values_s), dtype=float) * 1000.0
    out = {}
    if a.size == 0:
        for k in stat_keys(metric):
            out[k] = 0.0
        return out
    out[f"mean_{metric}_ms"] = float(np.mean(a))
    out[f"median_{metric}_ms"] = float(np.median(a))
    out[f"std_{metric}_ms"] = float(np.std(a))
    for p in PERCENTILES:
        out[f"p{p}_{metric}_ms"] = float(np.percentile(a, p))
    return out


def dist(values: Iterable[float]) -> dict | None:
    """A compact distribution (count, mean, p5/p50/p95/p99, min, max) or None when empty."""
    a = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if a.size == 0:
        return None
    return {
        "count": int(a.size),
        "mean": float(a.mean()),
        "p5": float(np.percentile(a, 5)),
        "p50": float(np.percentile(a, 50)),
        "p95": float(np.percentile(a, 95)),
        "p99": float(np.percentile(a, 99)),
        "min": float(a.min()),
        "max": float(a.max()),
    }


def tpot_of(latency: float, ttft: float, output_tokens: int | None) -> float | None:
    if output_tokens is None or output_tokens <= 1:
        return None
    return (latency - ttft) / (output_tokens - 1)


def peak_per_second(event_times_abs: Iterable[float]) -> float:
    """Highest number of token events in any 1-s bin (vLLM's max_output_tokens_per_s)."""
    a = np.asarray(list(event_times_abs), dtype=float)
    if a.size == 0:
        return 0.0
    bins = np.floor(a - a.min()).astype(int)
    return float(np.bincount(bins).max())


def max_overlap(intervals: Iterable[tuple[float, float]]) -> int:
    """Most requests in flight at once."""
    ev = []
    for s, e in intervals:
        ev.append((s, 1))
        ev.append((e, -1))
    ev.sort(key=lambda x: (x[0], x[1]))
    cur = best = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best


def mean_in_flight(intervals: Iterable[tuple[float, float]], duration: float) -> float | None:
    """Time-averaged number of requests in flight (for Little's law)."""
    if duration <= 0:
        return None
    return sum(e - s for s, e in intervals) / duration


def goodput_ok(ttft_s: float, tpot_s: float | None, e2el_s: float, slo_ms: dict) -> bool:
    """vLLM's goodput: a request is good when every chosen SLO holds."""
    vals = {"ttft": ttft_s * 1000, "tpot": (tpot_s or 0.0) * 1000, "e2el": e2el_s * 1000}
    return all(vals[k] <= v for k, v in slo_ms.items())
