"""The sampling error of a run's latency statistics, honest about autocorrelation.

A queue's latencies are not independent: one long excursion spans hundreds of consecutive
requests, so the textbook error of a percentile (``sqrt(p (1 - p) / n)`` over the density) understates
it many times over near saturation. The error here is that textbook error times the series' own
**integrated autocorrelation time** τ (the number of requests one independent observation is worth):

- a percentile ``q_p``: by the Bahadur representation its error is the error of the share of requests
  at or below it, so τ is that of the indicator series ``1[x <= q_p]`` and
  ``SE(log q_p) = sqrt(τ p (1 - p) / n) · d log q / dp``, the slope read from the run's own
  percentiles at ``p ± h``;
- a mean: ``SE(log mean) = sqrt(τ var / n) / mean``, τ of the values themselves;
- τ = 1 + 2 Σ ρ_t over the autocorrelations up to Sokal's automatic window (the smallest ``M`` with
  ``M >= 5 τ(M)``): the sum stops where the correlations have died out, before its own noise takes
  over.

Why not batch means (10 batches of a run's requests, the SE of the log of the whole run's statistic
taken as the batches' spread over √10): in a 280- or 560-request run each batch holds 28–56 requests,
shorter than an excursion, so neighbouring batches are correlated, and a batch's P95 (its third
largest value) is not a mean. Measured on bench_capacity_interval's cliff and smooth TTFT scenarios
at 0.95 and 1.0 of their true capacities (80 noise-free runs of 280 and 560 requests each, every
run's own estimate against the spread of log P95 TTFT across the runs): batch means gave 0.23–0.25
where the runs spread by 0.42–0.56 (cliff) and 0.11–0.13 against 0.20–0.25 (smooth); τ gives
0.37–0.49 and 0.16–0.17 (``python3 bench/bench_runse.py``). The rest of the spread is between
runs, each started on an idle server; the capacity model pools that part into its σ.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

MIN_VALUES = 100  # fewer positive values: no estimate
SOKAL_C = 5.0  # the window's multiple of τ
STATS = {"mean": None, "median": 50.0, "p50": 50.0, "p90": 90.0, "p95": 95.0, "p99": 99.0}


def integrated_autocorrelation(x: np.ndarray) -> float:
    """τ = 1 + 2 Σ_{t=1..M} ρ_t of the series ``x``, with Sokal's window (the smallest ``M`` with
    ``M >= 5 τ(M)``); at least 1 (a constant series: 1)."""
    x = np.asarray(x, dtype=float)
    n = x.size
    x = x - x.mean()
    v = float(np.dot(x, x)) / n if n else 0.0
    if n < 2 or v <= 0:
        return 1.0
    f = np.fft.rfft(x, 2 * n)
    rho = np.fft.irfft(f * np.conj(f), 2 * n)[:n] / (v * n)
    tau = 1.0 + 2.0 * np.cumsum(rho[1:])  # tau[m - 1] = τ(M = m)
    ok = np.flatnonzero(np.arange(1, n) >= SOKAL_C * tau)
    return float(max(tau[ok[0]] if ok.size else tau[-1], 1.0))


def log_se(values: Iterable[float], stat: str) -> float | None:
    """SE of ``log(stat(values))`` (values in send order), autocorrelation included; None when there
    are fewer than ``MIN_VALUES`` positive values or the statistic is not one of ``STATS``."""
    if stat not in STATS:
        return None
    a = np.asarray([v for v in values if v is not None and v > 0 and math.isfinite(v)], dtype=float)
    n = a.size
    if n < MIN_VALUES:
        return None
    q = STATS[stat]
    if q is None:
        m = float(a.mean())
        return math.sqrt(integrated_autocorrelation(a) * float(a.var(ddof=1)) / n) / m
    p = q / 100.0
    h = min(0.05, 0.8 * (1.0 - p), 0.8 * p)
    lo, mid, hi = (float(v) for v in np.percentile(a, [100.0 * (p - h), q, 100.0 * (p + h)]))
    slope = (math.log(hi) - math.log(lo)) / (2.0 * h)
    tau = integrated_autocorrelation((a <= mid).astype(float))
    return math.sqrt(tau * p * (1.0 - p) / n) * slope


def run_log_se(series: dict[str, list[float]]) -> dict[str, float]:
    """For each metric's per-request values in send order (``{"ttft": [...], ...}``, any unit), the
    SE of every statistic's log, keyed as the summary keys them (``p95_ttft_ms``)."""
    out = {}
    for metric, vals in series.items():
        for stat in STATS:
            se = log_se(vals, stat)
            if se is not None:
                out[f"{stat}_{metric}_ms"] = se
    return out
