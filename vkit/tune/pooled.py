"""A load's percentile over the requests of all its runs, from each run's own percentiles.

Why: a tail percentile read from one short run of a queue reads low. Its requests come in
correlated stretches (one burst of arrivals slows hundreds of them), and a short run often holds
no bad stretch; the log of its P95 then averages below the log of the long run's P95, and a
search that averages the runs at a load puts the capacity high. Each run's empirical CDF, on the
other hand, is an unbiased estimate of the steady state's, so the average CDF over k runs is too,
with a k times smaller variance, and the percentile read from it (the percentile of the pooled
requests) carries much less of that bias. Measured on bench_capacity_interval's scenarios at their
true capacities, noise-free, against 6,000-request runs (P95 TTFT 185 ms on cliff-seqs, 485 ms on
ttft-smooth), twelve sets of runs each (``python3 -c`` over ``vkit.sim.predict.bench_summary``):

=================  =====================  ======================  ========================
scenario           runs                   mean of the runs' logs  pooled (this module)
=================  =====================  ======================  ========================
cliff-seqs         3 x 800 requests       170 ms                  179 ms
cliff-seqs         6 x 800 requests       177 ms                  189 ms
ttft-smooth        3 x 800 requests       463 ms                  476 ms
=================  =====================  ======================  ========================

Summaries keep only a run's p50, p90, p95 and p99, not its requests: between them a run's CDF is
taken as linear in log latency (beyond them, the nearest segment's slope, clipped to [0, 1]), and
the pooled percentile is where the request-weighted mean of the runs' CDFs reaches it. Pure.
"""

from __future__ import annotations

import math

LEVELS = (50, 90, 95, 99)  # the percentiles every bench_stream summary carries (vkit.measure.summary.PERCENTILES)


def quantiles(summary: dict, metric: str) -> dict[int, float] | None:
    """{50: p50, 90: p90, 95: p95, 99: p99} of ``metric`` (ttft, tpot, itl, e2el) in ms, or None
    when the summary lacks any of them or they are not positive and non-decreasing."""
    q = {}
    for p in LEVELS:
        v = summary.get(f"p{p}_{metric}_ms")
        if not isinstance(v, (int, float)) or not v > 0 or not math.isfinite(v):
            return None
        q[p] = float(v)
    vals = [q[p] for p in LEVELS]
    return q if all(vals[i] <= vals[i + 1] for i in range(len(vals) - 1)) else None


def run_cdf(q: dict[int, float], x: float) -> float:
    """One run's share of requests at or below ``x`` (ms), from its percentiles ``q``."""
    lv = [math.log(q[p]) for p in LEVELS]
    pr = [p / 100.0 for p in LEVELS]
    lx = math.log(x)

    def along(i: int) -> float:  # on the line through levels i and i + 1
        span = lv[i + 1] - lv[i]
        if span <= 0:
            return pr[i + 1] if lx >= lv[i + 1] else pr[i]
        return pr[i] + (pr[i + 1] - pr[i]) * (lx - lv[i]) / span

    if lx <= lv[0]:
        return max(0.0, along(0))
    for i in range(len(LEVELS) - 1):
        if lx <= lv[i + 1]:
            return along(i)
    return min(1.0, along(len(LEVELS) - 2))


def pooled_percentile(runs: list[tuple[float, dict[int, float]]], p: int) -> float:
    """The ``p``-th percentile over all the runs' requests: ``runs`` as (requests, quantiles). It
    lies between the runs' lowest and highest own ``p``-th percentile (there every run's CDF is at
    most, respectively at least, p / 100), found by bisection in log latency."""
    if p not in LEVELS:
        raise ValueError(f"pooled_percentile: p{p} is not one of the levels {LEVELS}")
    total = sum(n for n, _ in runs)
    if not runs or total <= 0:
        raise ValueError("pooled_percentile: no requests")
    lo, hi = math.log(min(q[p] for _, q in runs)), math.log(max(q[p] for _, q in runs))
    target = p / 100.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if sum(n * run_cdf(q, math.exp(mid)) for n, q in runs) / total < target:
            lo = mid
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi))


def percentile_key(key: str) -> tuple[int, str] | None:
    """(p, metric) of an SLO key such as ``p95_ttft_ms`` (``median_*`` is p50), else None."""
    stat, _, rest = key.partition("_")
    p = 50 if stat == "median" else int(stat[1:]) if stat[:1] == "p" and stat[1:].isdigit() else None
    if p not in LEVELS or not rest.endswith("_ms"):
        return None
    return p, rest[:-3]


def pooled_shift(runs: list[tuple[float, dict[int, float]]], p: int) -> float:
    """How far the pooled percentile's log sits below the mean of the runs' own logs: the shift that
    moves the mean of the runs' margins, log(limit / value), to the pooled percentile's margin
    (0 for one run)."""
    if len(runs) < 2:
        return 0.0
    mean_log = sum(math.log(q[p]) for _, q in runs) / len(runs)
    return mean_log - math.log(pooled_percentile(runs, p))
