"""The sampling error of a run's latency statistics, honest about autocorrelation.

A queue's latencies are not independent: one long excursion spans hundreds of consecutive
requests, so the textbook error of a percentile (``sqrt(p (1 - p) / n)`` over the density) understates
it many times over near saturation. Batch means absorb that correlation: the run's requests, in send
order, are cut into ``BATCHES`` equal batches, the statistic is taken in each, and the SE of its
logarithm over the whole run is the batches' spread over ``sqrt(BATCHES)``.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

BATCHES = 10
MIN_PER_BATCH = 10
STATS = {"mean": None, "median": 50.0, "p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}


def log_se(values: Iterable[float], stat: str) -> float | None:
    """SE of ``log(stat(values))`` by batch means (values in send order); None when there are
    fewer than ``BATCHES x MIN_PER_BATCH`` positive values or the statistic is not one of ``STATS``."""
    if stat not in STATS:
        return None
    a = np.asarray([v for v in values if v is not None and v > 0 and math.isfinite(v)], dtype=float)
    if a.size < BATCHES * MIN_PER_BATCH:
        return None
    q = STATS[stat]
    per = [float(b.mean()) if q is None else float(np.percentile(b, q)) for b in np.array_split(a, BATCHES)]
    if min(per) <= 0:
        return None
    return float(np.std(np.log(per), ddof=1) / math.sqrt(BATCHES))


def run_log_se(series: dict[str, list[float]]) -> dict[str, float]:
    """For each metric's per-request values in send order (``{"ttft": [...], ...}``, any unit), the
    batch-means SE of every statistic's log, keyed as the summary keys them (``p95_ttft_ms``)."""
    out = {}
    for metric, vals in series.items():
        for stat in STATS:
            se = log_se(vals, stat)
            if se is not None:
                out[f"{stat}_{metric}_ms"] = se
    return out
