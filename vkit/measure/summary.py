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


QUEUE_GROWTH_MIN_N = 20  # fewer measured requests than this: not enough to tell (None)
QUEUE_GROWTH_BATCHES = 10  # batch means for the autocorrelation-proof trend test
QUEUE_GROWTH_T = 3.0  # both t statistics must exceed this
QUEUE_GROWTH_RISE = 0.5  # the fitted rise must exceed this fraction of the early median TTFT
THEIL_SEN_MAX = 500  # Theil–Sen on at most this many points (evenly spaced in send order): ≤ 125k pairs


def _ols(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float | None]:
    """Least-squares slope of y on x, its ordinary standard error, and t = slope/SE (None when
    the fit is exact and the slope not zero: SE 0; 0.0 when both are 0)."""
    xc = x - x.mean()
    sxx = float(np.dot(xc, xc))
    if sxx <= 0:
        return 0.0, 0.0, 0.0
    yc = y - y.mean()
    slope = float(np.dot(xc, yc)) / sxx
    res = yc - slope * xc
    se = math.sqrt(max(float(np.dot(res, res)), 0.0) / (x.size - 2) / sxx) if x.size > 2 else 0.0
    if se > 0:
        return slope, se, slope / se
    return slope, 0.0, (0.0 if slope == 0 else None)


def _significant(slope: float, t: float | None) -> bool:
    return slope > 0 and (t is None or t > QUEUE_GROWTH_T)


def _theil_sen(x: np.ndarray, y: np.ndarray) -> float | None:
    """Median of the pairwise slopes over at most THEIL_SEN_MAX points taken evenly in order
    (deterministic); None when no pair differs in x."""
    idx = np.unique(np.linspace(0, x.size - 1, min(x.size, THEIL_SEN_MAX)).round().astype(np.int64))
    xs, ys = x[idx], y[idx]
    i, j = np.triu_indices(xs.size, 1)
    dx = xs[j] - xs[i]
    keep = dx > 0
    if not keep.any():
        return None
    return float(np.median((ys[j] - ys[i])[keep] / dx[keep]))


def queue_growth(start_s: Iterable[float], ttft_s: Iterable[float]) -> dict | None:
    """Whether the server's queue was growing within one run, from the TTFT trend over send time.

    Why: a short run at a load slightly above capacity ends before its P95 TTFT reaches the SLO
    (the queue grows by only (λ − μ)·T requests), so the load point passes although the server
    cannot sustain it. The trend of TTFT over the run shows the queue growing.

    Over the requests given (the successful measured ones; send times in s, absolute or relative,
    TTFT in s), ordered by send time:

    - ``slope_ms_per_s``, ``slope_se_ms_per_s``, ``t``: least-squares slope of TTFT (ms) on send
      time (s), its ordinary regression standard error and their ratio (``t`` None when the fit is
      exact: SE 0 with a nonzero slope);
    - ``batch_t``: the same slope's t over the means of ``QUEUE_GROWTH_BATCHES`` (10) equal-count
      batches in send order (8 degrees of freedom). TTFTs of a queue are strongly autocorrelated
      (one long excursion spans hundreds of requests), so the ordinary SE understates the slope's
      uncertainty many times over: a stationary M/M/1 queue at utilisation 0.9 shows an ordinary
      |t| > 3 in most runs of 2,000 requests. Batch means absorb that correlation;
    - ``theil_sen_ms_per_s``: a robust slope (median of pairwise slopes over at most 500 points
      evenly spaced in send order), for reading, not used by the rule;
    - ``early_ms``, ``late_ms``: median TTFT of the first and the last third of the requests;
      ``late_over_early`` their ratio (None when ``early_ms`` is 0);
    - ``window_s``: last send − first send; ``rise_ms`` = slope × window (TTFT's rise over the run
      according to the fit); ``n``: requests used.

    Rule: ``growing`` is True when the slope is positive, ``t > 3`` AND ``batch_t > 3`` (an exact
    fit with a positive slope counts as significant), AND ``rise_ms > 0.5 × early_ms`` (TTFT rose by
    at least half its early level: a real but immaterial drift, say 50 → 52 ms, is not a growing
    queue). Operating characteristics, M/M/1 FIFO with Poisson arrivals starting empty, 400 seeds
    at 2,000 requests: flagged in 4.5 % of runs at utilisation 0.9, 59 % at 1.02, 84 % at 1.05,
    99 % at 1.1; at 10,000 requests 0 % at 0.9, 78 % at 1.02, 98 % at 1.05. A run just above
    capacity can end with its queue shorter than it started (the queue's random walk outweighs
    its drift over a short run), so no trend test flags every such run; longer runs sharpen it.

    None when fewer than 20 requests remain (not enough to tell) or every send has the same time
    (no window to fit over, e.g. a burst sent at once). Pure: numpy only.
    """
    t = np.asarray(list(start_s), dtype=float)
    y = np.asarray(list(ttft_s), dtype=float)
    if t.shape != y.shape:
        raise ValueError(f"queue_growth: {t.size} send times but {y.size} TTFTs")
    keep = np.isfinite(t) & np.isfinite(y)
    t, y = t[keep], y[keep] * 1000.0
    n = int(t.size)
    if n < QUEUE_GROWTH_MIN_N:
        return None
    order = np.argsort(t, kind="stable")
    t, y = t[order] - t[order][0], y[order]
    window = float(t[-1])
    if window <= 0:
        return None
    slope, se, t_ols = _ols(t, y)
    parts = np.array_split(np.arange(n), QUEUE_GROWTH_BATCHES)
    b_slope, _, t_batch = _ols(np.array([t[p].mean() for p in parts]), np.array([y[p].mean() for p in parts]))
    third = n // 3
    early = float(np.median(y[:third]))
    late = float(np.median(y[-third:]))
    rise = slope * window
    growing = (_significant(slope, t_ols) and _significant(b_slope, t_batch)
               and rise > QUEUE_GROWTH_RISE * early)
    return {
        "n": n,
        "window_s": window,
        "slope_ms_per_s": slope,
        "slope_se_ms_per_s": se,
        "t": t_ols,
        "batch_t": t_batch,
        "theil_sen_ms_per_s": _theil_sen(t, y),
        "early_ms": early,
        "late_ms": late,
        "late_over_early": late / early if early > 0 else None,
        "rise_ms": rise,
        "growing": bool(growing),
    }
