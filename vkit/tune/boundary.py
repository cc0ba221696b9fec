"""The SLO boundary as an estimate: one monotone model of each SLO's margin against load, the
load where the binding margin crosses zero, and a confidence interval on that load.

Every valid run of a capacity search (its load, and per SLO its margin ``log(limit / value)``,
positive where the SLO holds, with the sampling error the run's own request count gives it) enters
one model:

- **Per SLO, a decreasing isotonic regression of the margin on log load** (pool-adjacent-violators,
  weighted by each point's precision). A queueing latency never falls when more load is offered,
  so every margin is non-increasing in load; nothing else is assumed. A parametric curve (a line, a
  logistic, a polynomial) would smooth over the knee where a queue's tail latency bends sharply at
  saturation; the isotonic fit follows a cliff as well as a gentle slope.
- **The crossing, bounded**: a queue's margin is concave in log load (for M/M/1, ``log(1 - ρ)``
  falls ever faster as ρ grows; a keep-up margin is flat, then falls), so between the two loads that
  straddle zero the chord lies below the curve (its zero: a lower bound) and the neighbouring
  segments' lines, extended into the gap, lie above it (their zeros: upper bounds). The estimate is
  the middle of the two in log load; the search narrows the gap until they meet within the precision.
- **Robust to one bad run**: a point's centre is a Huber M-estimate of its runs' margins (a run that
  stalled weighs as a run ``1.5 σ`` off, not as its full excursion), and a point whose centre is
  far (over 3 SE) from the fitted curve is reported as ``suspect``: the search measures it again
  before it trusts the curve there. A point never becomes a bound by itself: the crossing comes
  from the curve through every point.
- **σ of a run** per SLO pools the replicates' spread with a prior (``noise``, worth ``PRIOR_DF``
  degrees of freedom) and adds each run's sampling error: the SE the run's summary carries
  (``vkit.se_log``: the textbook error times the series' integrated autocorrelation time, for a
  queue's latencies are autocorrelated and the textbook error of a percentile understates it),
  else the percentile's error from its request count and spread.
- **The keep-up margin** enters only where a run failed it (a server that keeps up sits at
  ``log(1 / keep_up)`` whatever its load: no distance to the boundary). Where it binds, the load
  below it that kept up is the crossing's lower bound (the chord through the other SLOs' margins
  there says nothing of it).
- **The estimate and its interval**: the estimate is the middle of the curve's two bounds in log
  load. The interval comes from a parametric bootstrap (each point's centre redrawn around the
  fitted curve with its SE, σ itself redrawn from its scaled inverse chi-square on the pooled degrees
  of freedom, the curve refitted): the spread of the crossing of the weighted least-squares line
  through the ``WINDOW`` loads on each side of the crossing (every run near it counts, not only the
  two straddling loads), set around both that line's crossing and the estimate, and widened by how
  far a quadratic through the same loads moves the crossing (curvature the line cannot follow).
  Where the line cannot be fitted (a flat or rising window, fewer than two loads, a fifth of the
  bootstrap curves never crossing), the interval runs from the lower bounds' 2.5th percentile to the
  upper bounds' 97.5th. A bootstrap whose curves do not cross within the measured loads leaves that
  end of the interval open (``None``): the data do not bound it.
- **Smooth or cliff**: the binding margin's slope at the crossing, per unit of log load: a margin
  that drops by more than 10 per e-fold of load (a 10 % load step moves the latency by e-fold)
  is a cliff; a keep-up (throughput) boundary is a cliff by nature.
- **Measured against a known truth**: ``bench/bench_capacity_interval.py`` (hundreds of searches in
  virtual time per scenario; coverage, error, cost, beside the bracket search).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

THROUGHPUT = "throughput"
CLIFF_SLOPE = 10.0  # |d margin / d log load| at the crossing above which the boundary is a cliff
Z95 = 1.959963984540054


@dataclass
class Run:
    """One valid run: its load, margins per SLO, and each margin's sampling SE (0: unknown)."""

    load: float
    margins: dict[str, float]
    se: dict[str, float] = field(default_factory=dict)


@dataclass
class Estimate:
    capacity: float | None  # the load where the binding margin crosses zero (None: not bounded by the data)
    lo: float | None  # the interval's lower end (None: below every load measured)
    hi: float | None  # upper end (None: above every load measured)
    binding: str | None
    shape: str | None  # "smooth" or "cliff"
    slope: float | None  # d binding margin / d log load at the crossing
    where: str  # "between" (a crossing inside the loads), "above" (all hold), "below" (none holds), "none"
    sigma: dict[str, float]  # σ of one run per SLO (log units)
    df: float  # degrees of freedom behind σ (the prior's included)
    fitted: dict[float, float]  # binding margin fitted at each load
    suspect: list[float]  # loads whose centre is far from the curve: measure again
    bracket: tuple[float | None, float | None]  # the measured loads straddling the crossing
    level: float = 0.95
    z: dict[float, float] = field(default_factory=dict)  # per load: the binding fitted margin over its point's SE
    bounds: tuple[float | None, float | None] = (None, None)  # the fitted curve's own bounds on the crossing (chord, segments)

    def half_width(self) -> float | None:
        """The interval's larger side in relative terms (hi / capacity - 1 or 1 - lo / capacity)."""
        if self.capacity is None or self.lo is None or self.hi is None:
            return None
        return max(self.hi / self.capacity - 1.0, 1.0 - self.lo / self.capacity)

    def as_dict(self) -> dict:
        return {"capacity": self.capacity, "interval": [self.lo, self.hi], "level": self.level,
                "binding": self.binding, "shape": self.shape, "slope": self.slope, "where": self.where,
                "sigma": self.sigma, "df": self.df, "suspect": self.suspect,
                "bracket": list(self.bracket), "bounds": list(self.bounds), "half_width": self.half_width()}


# -- sampling error of one run's margin ------------------------------------------------------------
def sampling_se(summary: dict, key: str) -> float:
    """The SE of ``log(value)`` of one summary metric from the run's own requests: the
    autocorrelation-aware SE the summary carries (``vkit.se_log``), else from its figures alone: a mean's
    ``std / (mean sqrt n)``; a percentile p's ``sqrt(p (1 - p) / n)`` times the slope of log latency
    against the quantile, read from the run's own percentiles (p90, p95, p99): the sparsity method.
    0 when the summary cannot say (the prior noise then carries it)."""
    own = ((summary.get("vkit") or {}).get("se_log") or {}).get(key)
    if isinstance(own, (int, float)) and own >= 0:
        return float(own)  # the run's own SE (vkit.measure.runse): autocorrelation included
    n = summary.get("completed")
    if not isinstance(n, (int, float)) or n < 2:
        return 0.0
    stat, _, rest = key.partition("_")
    metric = rest[:-3] if rest.endswith("_ms") else rest

    def q(p: str) -> float | None:
        v = summary.get(f"{p}_{metric}_ms")
        return float(v) if isinstance(v, (int, float)) and v > 0 else None

    if stat == "mean":
        mean, sd = summary.get(key), summary.get(f"std_{metric}_ms")
        if isinstance(mean, (int, float)) and mean > 0 and isinstance(sd, (int, float)):
            return float(sd) / (float(mean) * math.sqrt(n))
        return 0.0
    p = {"median": 0.5, "p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}.get(stat)
    if p is None:
        return 0.0
    spans = {0.5: ("p50", "p90", 0.4), 0.9: ("p50", "p95", 0.45), 0.95: ("p90", "p99", 0.09), 0.99: ("p95", "p99", 0.04)}
    a, b, dp = spans[p]
    qa, qb = q(a), q(b)
    if qa is None or qb is None or qb < qa:
        return 0.0
    slope = (math.log(qb) - math.log(qa)) / dp
    return math.sqrt(p * (1 - p) / n) * slope


# -- the monotone fit ------------------------------------------------------------------------------
def pava_decreasing(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least-squares non-increasing fit (pool adjacent violators), in the order given."""
    vals, wts, sizes = [], [], []
    for yi, wi in zip(y.tolist(), w.tolist(), strict=True):
        vals.append(yi)
        wts.append(wi)
        sizes.append(1)
        while len(vals) > 1 and vals[-2] < vals[-1]:  # a rise: pool the two blocks
            w2 = wts[-2] + wts[-1]
            v2 = (vals[-2] * wts[-2] + vals[-1] * wts[-1]) / w2
            s2 = sizes[-2] + sizes[-1]
            vals[-2:], wts[-2:], sizes[-2:] = [v2], [w2], [s2]
    return np.repeat(np.asarray(vals), sizes)


def huber_centre(x: np.ndarray, scale: float, c: float = 1.5, iters: int = 20) -> float:
    """Huber's M-estimate of location (runs further than ``c x scale`` from the centre weigh as if at
    that distance); the median with fewer than 3 runs would throw half the evidence away, so the
    start is the median and two runs that disagree wildly end near their mean."""
    if x.size == 1:
        return float(x[0])
    mu = float(np.median(x))
    scale = max(scale, 1e-9)
    for _ in range(iters):
        r = (x - mu) / scale
        w = np.minimum(1.0, c / np.maximum(np.abs(r), 1e-12))
        nxt = float((w * x).sum() / w.sum())
        if abs(nxt - mu) < 1e-9:
            break
        mu = nxt
    return mu


def _crossing(lx: np.ndarray, g: np.ndarray) -> tuple[float, float, int]:
    """(lower, upper, j): bounds on the log load where a concave non-increasing margin g crosses
    zero, from its values at ``lx``; ``j`` the first load below zero. The chord between the two
    loads that straddle zero lies below a concave curve, so its zero is a lower bound; the lines
    through the neighbouring segments, extended into the gap, lie above it, so their zeros (and the
    failing load itself) are upper bounds. (+inf, +inf) when g never falls below zero, (-inf, -inf)
    when it is below zero from the first load."""
    neg = np.flatnonzero(g < 0)
    if neg.size == 0:
        return math.inf, math.inf, len(g)
    j = int(neg[0])
    if j == 0:
        return -math.inf, -math.inf, 0
    a, b = g[j - 1], g[j]
    lo = float(lx[j - 1] + (a / (a - b)) * (lx[j] - lx[j - 1]))
    hi = float(lx[j])
    if j >= 2 and g[j - 2] > a:  # the segment below the gap, extended up
        s1 = (a - g[j - 2]) / (lx[j - 1] - lx[j - 2])
        hi = min(hi, float(lx[j - 1] - a / s1))
    if j + 1 < len(g) and b > g[j + 1]:  # the segment above the gap, extended down
        s2 = (g[j + 1] - b) / (lx[j + 1] - lx[j])
        hi = min(hi, float(lx[j] - b / s2))
    return lo, max(lo, hi), j


def _bounds(p: "_Points", fit: np.ndarray) -> tuple[float, float, int]:
    """:func:`_crossing` of the binding margin (the least of the SLOs' fitted margins). Where the SLO
    that fails at the first failing load was not measured at the load below it (a keep-up margin,
    which enters only where a run failed it), the chord through that load's other margins says
    nothing of it: the lower bound is the load that held itself."""
    lo, hi, j = _crossing(p.lx, fit.min(axis=0))
    if 0 < j < len(p.loads) and _unmeasured_below(p, fit, j):
        lo = float(p.lx[j - 1])
    return lo, hi, j


def _unmeasured_below(p: "_Points", fit: np.ndarray, j: int) -> bool:
    """The SLO that binds at load ``j`` has no margin at load ``j - 1`` (a keep-up margin at a load
    that kept up)."""
    return not np.isfinite(p.centre[int(np.argmin(fit[:, j])), j - 1])


WINDOW = 2  # loads on each side of the crossing that the local line goes through


def _local_line(lx: np.ndarray, y: np.ndarray, var: np.ndarray, j: int) -> tuple[float | None, float | None]:
    """(crossing, curvature term) of the binding margin near its crossing: the weighted least-squares
    line through the ``WINDOW`` loads on each side of it (every run near the crossing counts, not only
    the two loads that straddle it); the curvature term is how far a quadratic through the same loads
    (when there are four or more) puts the crossing from the line's. None where the line does not fall."""
    idx = [i for i in range(max(0, j - WINDOW), min(len(lx), j + WINDOW)) if np.isfinite(y[i]) and np.isfinite(var[i])]
    if len(idx) < 2:
        return None, None
    x, yy, w = lx[idx], y[idx], 1.0 / np.maximum(var[idx], 1e-12)
    xm, ym = float((w * x).sum() / w.sum()), float((w * yy).sum() / w.sum())
    sxx = float((w * (x - xm) ** 2).sum())
    if sxx <= 0:
        return None, None
    b = float((w * (x - xm) * (yy - ym)).sum() / sxx)
    if not b < 0:
        return None, None
    x0 = xm - ym / b
    curv = None
    if len(idx) >= 4:
        c2, c1, c0 = np.polyfit(x - xm, yy, 2, w=np.sqrt(w))
        roots = [r.real + xm for r in np.roots([c2, c1, c0]) if abs(r.imag) < 1e-12]
        near = [r for r in roots if lx[idx[0]] <= r <= lx[idx[-1]]]
        if near:
            curv = abs(min(near, key=lambda r: abs(r - x0)) - x0)
    return x0, curv


@dataclass
class _Points:
    loads: list[float]  # ascending, as measured
    lx: np.ndarray  # their logs
    keys: list[str]
    centre: np.ndarray  # (keys, loads): the point's robust centre (nan where the SLO has no run)
    var: np.ndarray  # (keys, loads): the centre's variance
    k: np.ndarray  # runs per load


def _points(runs: list[Run], sigma: dict[str, float]) -> _Points:
    loads = sorted({r.load for r in runs})
    keys = sorted({k for r in runs for k in r.margins})
    centre = np.full((len(keys), len(loads)), np.nan)
    var = np.full((len(keys), len(loads)), np.nan)
    k = np.zeros(len(loads), dtype=int)
    for j, load in enumerate(loads):
        here = [r for r in runs if r.load == load]
        k[j] = len(here)
        for i, key in enumerate(keys):
            m = np.array([r.margins[key] for r in here if key in r.margins and math.isfinite(r.margins[key])])
            if m.size == 0:
                # an SLO a run cannot even measure (nothing completed): far on its failing side
                if any(key in r.margins for r in here):
                    centre[i, j], var[i, j] = -5.0, sigma[key] ** 2
                continue
            se2 = np.mean([r.se.get(key, 0.0) ** 2 for r in here if key in r.margins])
            s = math.sqrt(sigma[key] ** 2 + se2)
            centre[i, j] = huber_centre(m, s)
            var[i, j] = (sigma[key] ** 2 + se2) / m.size
    return _Points(loads, np.log(np.asarray(loads, dtype=float)), keys, centre, var, k)


def _fit(p: _Points, centre: np.ndarray) -> np.ndarray:
    """(keys, loads) fitted margins: each SLO's isotonic fit over the loads where it was measured;
    an SLO not measured at a load does not bind there (+inf)."""
    out = np.full(centre.shape, np.inf)
    for i in range(len(p.keys)):
        ok = np.isfinite(centre[i])
        if ok.any():
            out[i, ok] = pava_decreasing(centre[i, ok], 1.0 / np.maximum(p.var[i, ok], 1e-12))
    return out


PRIOR_DF = 3.0  # the prior noise counts as this many degrees of freedom


def pooled_sigma(runs: list[Run], noise: dict[str, float], prior_df: float = PRIOR_DF) -> tuple[dict[str, float], float]:
    """σ of one run per SLO: the replicates' spread (less their sampling error) pooled with the prior
    ``noise[key]`` worth ``prior_df`` degrees of freedom; and the degrees of freedom in all."""
    by: dict[float, list[Run]] = {}
    for r in runs:
        by.setdefault(r.load, []).append(r)
    keys = sorted({k for r in runs for k in r.margins})
    sig, dfs = {}, []
    for key in keys:
        ss, df = 0.0, 0
        for here in by.values():
            m = np.array([r.margins[key] for r in here if math.isfinite(r.margins.get(key, math.nan))])
            if m.size > 1:
                # robust spread: a stalled run should not set σ for every other point
                mad = 1.4826 * float(np.median(np.abs(m - np.median(m))))
                sd2 = min(float(m.var(ddof=1)), max(mad, 1e-12) ** 2 * 4) if m.size > 2 else float(m.var(ddof=1))
                se2 = float(np.mean([r.se.get(key, 0.0) ** 2 for r in here]))
                ss += max(sd2 - se2, 0.0) * (m.size - 1)
                df += m.size - 1
        prior = noise.get(key, noise.get("*", 0.05))
        sig[key] = math.sqrt((prior_df * prior ** 2 + ss) / (prior_df + df))
        dfs.append(df)
    return sig, prior_df + (min(dfs) if dfs else 0)


def estimate(runs: list[Run], noise: dict[str, float], boot: int = 400, seed: int = 0, level: float = 0.95) -> Estimate:
    """The boundary from every valid run (see the module's docstring)."""
    if not runs:
        return Estimate(None, None, None, None, None, None, "none", {}, 0.0, {}, [], (None, None), level)
    sigma, df = pooled_sigma(runs, noise)
    p = _points(runs, sigma)
    fit = _fit(p, p.centre)
    g = fit.min(axis=0)
    loads = p.loads
    x_lo, x_hi, j = _bounds(p, fit)
    # points far from the curve: a run that stalled (or a curve that bends between two points)
    resid = np.abs(np.where(np.isfinite(p.centre), p.centre - np.where(np.isfinite(fit), fit, p.centre), 0.0))
    sd = np.sqrt(np.where(np.isfinite(p.var), p.var, np.inf))
    suspect = sorted({loads[jj] for jj in np.nonzero(resid > 3 * sd)[1]})
    rng = np.random.default_rng(seed)
    # no line to fit where the binding SLO was not measured below the crossing (a load that kept up)
    key = int(np.argmin(fit[:, j])) if 0 < j < len(loads) and not _unmeasured_below(p, fit, j) else None
    x_ln, curv = _local_line(p.lx, p.centre[key], p.var[key], j) if key is not None else (None, None)
    lows, highs, lines = np.empty(boot), np.empty(boot), np.full(boot, np.nan)
    for b in range(boot):
        # σ itself from its scaled inverse chi-square, then the centres around the fitted curve
        scale = math.sqrt(df / rng.chisquare(df))
        c = fit + rng.standard_normal(fit.shape) * np.sqrt(p.var) * scale
        c = np.where(np.isfinite(p.centre), c, np.nan)
        lows[b], highs[b], jb = _bounds(p, _fit(p, c))
        if x_ln is not None and 0 < jb < len(loads):
            xb = _local_line(p.lx, c[key], p.var[key], jb)[0]
            lines[b] = np.nan if xb is None else xb
    a = (1 - level) / 2
    # order statistics (the bounds may be infinite: a curve that never crosses)
    qlo = float(np.sort(lows)[int(math.floor(a * (boot - 1)))])
    qhi = float(np.sort(highs)[int(math.ceil((1 - a) * (boot - 1)))])
    fitted = dict(zip(loads, g.tolist(), strict=True))
    arg = np.argmin(fit, axis=0)
    z = {load: float(g[i] / math.sqrt(max(p.var[arg[i], i], 1e-12))) for i, load in enumerate(loads)}
    if not math.isfinite(x_lo):
        if x_lo > 0:  # every load holds: the capacity is above the highest, by at least what the bootstrap says
            lo = float(math.exp(min(qlo, p.lx[-1]))) if math.isfinite(qlo) else loads[-1]
            return Estimate(None, lo, None, _binding(p, fit, len(loads) - 1), None, None, "above", sigma, df,
                            fitted, suspect, (loads[-1], None), level, z)
        hi = float(math.exp(max(qhi, p.lx[0]))) if math.isfinite(qhi) else loads[0]
        return Estimate(None, None, hi, _binding(p, fit, 0), None, None, "below", sigma, df,
                        fitted, suspect, (None, loads[0]), level, z)
    ok = lines[np.isfinite(lines)]
    if x_ln is not None and ok.size >= 0.8 * boot and math.isfinite(qlo) and math.isfinite(qhi):
        # the local line: its bootstrap interval (the share of curves that never cross is small),
        # widened by the quadratic's disagreement (curvature the line cannot follow)
        # the estimate is the middle of the curve's own bounds (the line, a chord of a concave curve,
        # runs low); the interval the line's spread around both, widened by the curvature term
        x = (x_lo + x_hi) / 2
        m = curv or 0.0
        dl, dh = x_ln - float(np.quantile(ok, a)), float(np.quantile(ok, 1 - a)) - x_ln
        lo_x, hi_x = min(x_ln, x) - dl - m, max(x_ln, x) + dh + m
    else:
        x = (x_lo + x_hi) / 2
        lo_x = min(qlo, x_lo) if math.isfinite(qlo) else None
        hi_x = max(qhi, x_hi) if math.isfinite(qhi) else None
    slope = (g[j] - g[j - 1]) / (p.lx[j] - p.lx[j - 1])
    binding = _binding(p, fit, j)
    shape = "cliff" if binding == THROUGHPUT or abs(slope) > CLIFF_SLOPE else "smooth"
    return Estimate(float(math.exp(x)), None if lo_x is None else float(math.exp(lo_x)),
                    None if hi_x is None else float(math.exp(hi_x)), binding, shape, float(slope), "between",
                    sigma, df, fitted, suspect, (loads[j - 1], loads[j]), level, z,
                    (float(math.exp(x_lo)), float(math.exp(x_hi))))


def _binding(p: _Points, fit: np.ndarray, j: int) -> str | None:
    col = fit[:, j]
    if not np.isfinite(col).any():
        return None
    return p.keys[int(np.argmin(np.where(np.isfinite(col), col, np.inf)))]
