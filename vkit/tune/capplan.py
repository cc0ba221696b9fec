"""What a capacity search looks for and how: the SLO (limits, a goodput share) and the search plan
(mode, start, precision, run lengths). ``vkit.tune.capacity`` searches with them."""

from __future__ import annotations

import math
from dataclasses import dataclass

from vkit.errors import UsageError

# Per-request SLOs bench_stream's --goodput knows, by summary key.
GOODPUT_KEYS = {"ttft": ("mean_ttft_ms", "p50_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "median_ttft_ms"),
                "tpot": ("mean_tpot_ms", "p50_tpot_ms", "p95_tpot_ms", "p99_tpot_ms", "median_tpot_ms"),
                "e2el": ("mean_e2el_ms", "p50_e2el_ms", "p95_e2el_ms", "p99_e2el_ms", "median_e2el_ms")}
SLO_METRICS = tuple(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el") for s in ("mean", "median", "p50", "p90", "p95", "p99"))


@dataclass(frozen=True)
class Slo:
    """Upper limits on summary metrics (ms), and optionally the share of requests that must meet
    every per-request limit (``goodput``, e.g. 0.99: bench_stream's request goodput over throughput)."""

    limits: dict[str, float]
    goodput: float | None = None

    def __post_init__(self):
        if not self.limits:
            raise UsageError("give at least one SLO, e.g. --slo p95_ttft_ms=1000")
        bad = [k for k in self.limits if k not in SLO_METRICS]
        if bad:
            raise UsageError(f"unknown SLO metric(s) {', '.join(bad)}; one of {', '.join(SLO_METRICS)}")
        if any(not (v > 0 and math.isfinite(v)) for v in self.limits.values()):
            raise UsageError("every SLO limit must be a positive number of milliseconds")
        if self.goodput is not None and not 0 < self.goodput < 1:
            raise UsageError(f"--goodput-fraction must be in (0, 1), got {self.goodput:g}")

    def per_request(self) -> dict[str, float]:
        """The limits bench_stream checks per request (--goodput ttft:MS tpot:MS e2el:MS): the
        tightest limit given on each of TTFT, TPOT and E2EL."""
        out = {}
        for key, names in GOODPUT_KEYS.items():
            vals = [v for k, v in self.limits.items() if k in names]
            if vals:
                out[key] = min(vals)
        return out

    def margins(self, summary: dict) -> dict[str, float]:
        """log(limit / value) per SLO (positive: it holds); goodput: log((1 - target) / (1 - share))."""
        out = {}
        for k, limit in self.limits.items():
            v = summary.get(k)
            out[k] = math.log(limit / v) if isinstance(v, (int, float)) and v > 0 else (math.inf if v == 0 else -math.inf)
        if self.goodput is not None:
            rt, gp = summary.get("request_throughput"), summary.get("request_goodput")
            share = gp / rt if isinstance(rt, (int, float)) and rt > 0 and isinstance(gp, (int, float)) else 0.0
            out["goodput"] = math.log((1 - self.goodput) / max(1e-9, 1 - min(share, 1.0)))
        return out


@dataclass(frozen=True)
class Plan:
    mode: str = "rate"  # "rate" (open loop, req/s), "concurrency" (closed loop, streams) or "trace" (speed-up)
    start: float = 4.0  # first load offered
    lo_limit: float = 0.05  # never offer less (rate) / 1 stream
    hi_limit: float = 10_000.0  # never offer more
    tolerance: float = 0.10  # the promise's step down from a load that failed (and its resolution)
    max_points: int = 12  # distinct loads at most
    repeats: int = 3  # a fixed load's runs at most before its verdict is unclear (the promise, the sentinel)
    noise: float = 0.05  # prior sd of a margin between runs (log units, tail latencies)
    max_send_lag_ms: float = 5.0  # open loop: p99 actual - scheduled send above this: the client, not the server
    keep_up: float = 0.95  # open loop: the server must complete at least this share of the offered rate
    point_seconds: float = 20.0  # open loop: each run sends at least load x this many requests
    step: float = 2.0  # the factor between one load and the next while every load holds (or none does)
    precision: float = 0.05  # model: stop when the interval's larger side is within this share of the capacity
    max_runs: int = 24  # model: runs in all at most
    model_repeats: int = 6  # model: runs per load at most (replicates near the crossing are how the interval narrows)
    max_point_seconds: float = 60.0  # open loop, model: a run sized for its percentile's error sends at most load x this
    # open loop, model: a run at a load near the estimated crossing lasts this many times point_seconds at least
    # (a queue near saturation relaxes slowly: a short run there reads its tail latency and its completion rate low)
    crossing_factor: float = 2.0

    def __post_init__(self):
        if not 0 < self.precision < 1 or self.max_runs < 2:
            raise UsageError("need 0 < precision < 1 and max runs >= 2")
        if not self.crossing_factor >= 1:
            raise UsageError(f"the crossing factor must be >= 1, got {self.crossing_factor:g}")
        if self.mode not in ("rate", "concurrency", "trace"):
            raise UsageError(f"mode must be rate, concurrency or trace, got {self.mode!r}")
        if not 0 < self.lo_limit <= self.start <= self.hi_limit:
            raise UsageError(f"the start load {self.start:g} must lie in [{self.lo_limit:g}, {self.hi_limit:g}]")
        if not 0 < self.tolerance < 1 or self.max_points < 2 or self.repeats < 1 or not self.step > 1 + self.tolerance:
            raise UsageError("need 0 < tolerance < 1, max points >= 2, repeats >= 1, a bracketing step above 1 + tolerance")

    def snap(self, load: float) -> float:
        load = min(self.hi_limit, max(self.lo_limit, load))
        return float(max(1, round(load))) if self.mode == "concurrency" else float(f"{load:.4g}")
