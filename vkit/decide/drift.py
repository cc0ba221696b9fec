"""Drift: has the level of one configuration's metric changed over its repeated runs?

The server is not a stable instrument (fragmentation, thermals, neighbours, caches): the tune
driver re-measures the kept configuration (a sentinel) every few trials and calls
``detect(series, sigma)``; when the level changed it re-baselines, and gate refuses a
baseline older than the change point (``stale_runs``). ``bin/drift`` is the same on the
command line.

Four detectors on the natural log of the metric (relative changes, homoscedastic noise),
each standardised by σ — pooled from earlier A/A runs when given, else estimated from the
first ``m`` runs (8; 6 for streams shorter than 16) (the reference window, whose mean is the reference level):

- CUSUM (Page 1954), two-sided, reference value k = 0.5, on self-starting residuals
  (Hawkins 1987, "Self-starting cusum charts for location and scale", The Statistician 36):
  u_t = (y_t − ȳ_{t−1}) / (σ·sqrt(1 + 1/(t−1))), ȳ_{t−1} the mean of all earlier runs; with σ
  estimated from the earlier runs too, T_t is Student-t with t−2 degrees of freedom and
  u_t = Φ⁻¹(F(T_t)). Under no change the u_t are i.i.d. N(0, 1) in either case, so the
  reference window's own error does not accumulate (the plug-in version needs h = 17 for 5%
  false alarms at 40 runs and then detects a 1.5σ step only 2 times in 3).
  S⁺ = max(0, S⁺ + u − k), S⁻ = max(0, S⁻ − u − k), alarm when max(S⁺, S⁻) > h.
- Page–Hinkley (Page 1954; Hinkley 1971), two-sided, tolerance δ = 0.5σ, on the deviation
  from the running mean: m_T = Σ(z_t − z̄_t − δ), alarm when m_T − min m_t > λ (and mirrored).
- ADWIN (Bifet & Gavaldà 2007) with the Gaussian cut: for every split of the window into an
  older and a newer part (at least 3 runs each), |μ̂₀ − μ̂₁| / (σ·sqrt(1/n₀ + 1/n₁)) ≥
  sqrt(2 ln(2|W|/δ)); the statistic is z²/2 − ln(2|W|) and the alarm is at −ln δ.
- BOCPD (Adams & MacKay 2007) with a normal-inverse-gamma model: μ' = (κμ + x)/(κ+1),
  κ' = κ+1, α' = α+½, β' = β + κ(x−μ)²/(2(κ+1)); predictive Student-t with 2α degrees of
  freedom, location μ and scale sqrt(β(κ+1)/(ακ)); constant hazard 1/40. Alarm when the
  posterior probability of a change within the last 10 runs exceeds a threshold.

The textbook settings do not suit 40-run streams (STATS.md: CUSUM h = 5 with an estimated σ
raises 40% false alarms, ADWIN δ = 0.002 never fires), so every threshold is calibrated by
simulation of N(0, 1) streams to a 5% chance of any false alarm over the whole stream, per
stream length and per σ mode (pooled or estimated). ``calibrate()`` is that simulation; its
output is stored in ``THRESHOLDS``; regenerate with

    python3 -c "import vkit.decide.drift as d; print(d.calibrate())"

(20 000 streams per cell, seed 20260101; about a minute on two cores). A stream longer
than the longest calibrated length is judged on its last ``max(LENGTHS)`` runs.

Inside one tune the kept configuration has 4–12 runs on 2–8 server starts, too few for the
detectors. ``level_check(reference, latest)`` asks the narrower question of a sentinel: is the
newest start's mean (log) level away from the reference level, the mean of the earlier starts'
means? Within- and between-start sds come from ``stats.variance_components`` on the reference;
T = diff / sqrt((b² + w²/n) + Σ_i (b² + w²/n_i) / K²). With so few degrees of freedom T's null
law depends on the unknown b/w, so its threshold is simulated for exactly the design (group
sizes) at b/w = 0, 0.5, 1, 2 and 4, and the largest (1 − α/checks) quantile of |T| kept:
Bonferroni over the tune's ``checks`` sentinel checks, so at most about α over a whole tune at the
worst ratio, and fewer false alarms at smaller ratios (the quantile grows with b/w; beyond 4 it keeps
growing towards Student t with K − 1 degrees of freedom, so the guarantee holds for b/w ≤ 4).
The price of so little data: 2 reference starts of 2 runs need |T| > 11 at 4 checks, 8 starts
about 3.3; bench/bench_drift_tune.py measures false alarms and detection over a whole tune.

Nothing here prints or exits; no state is kept between calls.
"""

from __future__ import annotations

import datetime as _dt
import functools
import math
from typing import Any, Iterable

import numpy as np
from scipy import special, stats

from vkit.decide.stats import variance_components

DETECTORS = ("cusum", "page_hinkley", "adwin", "bocpd")
DEFAULT_DETECTOR = "cusum"
MIN_RUNS = 12  # below this no verdict: 6 reference runs and 6 to watch
LENGTHS = (12, 15, 20, 30, 40, 60, 80, 120)
FALSE_ALARM = 0.05
CUSUM_K = 0.5
PH_DELTA = 0.5
ADWIN_MIN = 3
BOCPD_HAZARD = 1 / 40
BOCPD_WINDOW = 10
BOCPD_PRIOR = {"known": (0.5, 50.0, 50.0), "estimated": (0.5, 5.0, 5.0)}  # κ0, α0, β0 on standardised data
CALIBRATION_REPS = 20000
CALIBRATION_SEED = 20260101

# calibrate() output: THRESHOLDS[mode][detector][length] = 95th percentile of the stream's
# maximum statistic under no change (ADWIN: −ln δ).
THRESHOLDS: dict = {
    "estimated": {
        "adwin": {12: 3.5804, 15: 5.3066, 20: 4.5155, 30: 5.9081, 40: 7.1796, 60: 8.6278, 80: 10.0042, 120: 11.2829},
        "bocpd": {12: 0.7093, 15: 0.7842, 20: 0.7909, 30: 0.8411, 40: 0.8662, 60: 0.8921, 80: 0.9057, 120: 0.9219},
        "cusum": {12: 3.076, 15: 3.5731, 20: 4.0103, 30: 4.6455, 40: 5.1221, 60: 5.617, 80: 5.9744, 120: 6.4865},
        "page_hinkley": {12: 4.8472, 15: 5.9675, 20: 5.9438, 30: 7.2247, 40: 8.3624, 60: 9.7724, 80: 10.8442, 120: 12.1167},
    },
    "known": {
        "adwin": {12: 0.8246, 15: 1.2186, 20: 1.4274, 30: 1.8522, 40: 2.0446, 60: 2.3416, 80: 2.5129, 120: 2.8032},
        "bocpd": {12: 0.4904, 15: 0.5621, 20: 0.6317, 30: 0.7134, 40: 0.7541, 60: 0.8093, 80: 0.833, 120: 0.8755},
        "cusum": {12: 3.1033, 15: 3.6128, 20: 3.9745, 30: 4.6701, 40: 5.1153, 60: 5.6688, 80: 5.9896, 120: 6.5181},
        "page_hinkley": {12: 2.8434, 15: 3.3447, 20: 3.7346, 30: 4.4542, 40: 4.9006, 60: 5.4879, 80: 5.8313, 120: 6.3836},
    },
}


def reference_size(n: int) -> int:
    """Runs in the reference window: 6 for streams shorter than 16, else 8."""
    return 6 if n < 16 else 8


# --------------------------------------------------------------------------- detectors (batched)
# Each takes y of shape (R, L) (log values, or already standardised) and returns the
# statistic at every time, shape (R, L), −inf where nothing is watched (the reference window).


def standardise(y: np.ndarray, m: int, sigma: float | None) -> tuple[np.ndarray, np.ndarray]:
    """(z, σ used): z = (y − mean of the first m) / σ, σ pooled or the first m runs' sd."""
    mu = y[:, :m].mean(axis=1, keepdims=True)
    s = np.full((y.shape[0], 1), float(sigma)) if sigma is not None else y[:, :m].std(axis=1, ddof=1, keepdims=True)
    s = np.where(s > 0, s, np.nan)
    return (y - mu) / s, s[:, 0]


def self_starting(y: np.ndarray, m: int, sigma: float | None) -> np.ndarray:
    """Hawkins' self-starting residuals u_t for t ≥ m (NaN before): i.i.d. N(0, 1) under no change."""
    r, n = y.shape
    u = np.full((r, n), np.nan)
    cs = np.cumsum(y, axis=1)
    css = np.cumsum(y * y, axis=1)
    for t in range(max(m, 2), n):
        mean = cs[:, t - 1] / t
        if sigma is not None:
            u[:, t] = (y[:, t] - mean) / (sigma * math.sqrt(1 + 1 / t))
        else:
            var = np.maximum(css[:, t - 1] - t * mean * mean, 0.0) / (t - 1)
            with np.errstate(divide="ignore", invalid="ignore"):
                tt = (y[:, t] - mean) / np.sqrt(var * (1 + 1 / t))
            u[:, t] = stats.norm.ppf(np.clip(stats.t.cdf(tt, t - 1), 1e-300, 1 - 1e-16))
    return u


def cusum_stat(z: np.ndarray, m: int, k: float = CUSUM_K) -> np.ndarray:
    """Two-sided CUSUM of ``z`` (self-starting residuals) from index m on."""
    r, n = z.shape
    out = np.full((r, n), -np.inf)
    up = np.zeros(r)
    dn = np.zeros(r)
    for t in range(m, n):
        up = np.maximum(0.0, up + z[:, t] - k)
        dn = np.maximum(0.0, dn - z[:, t] - k)
        out[:, t] = np.maximum(up, dn)
    return out


def page_hinkley_stat(z: np.ndarray, m: int, delta: float = PH_DELTA) -> np.ndarray:
    r, n = z.shape
    out = np.full((r, n), -np.inf)
    csum = np.cumsum(z, axis=1)
    mean_run = csum / np.arange(1, n + 1)
    mu = np.zeros(r)
    md = np.zeros(r)
    min_u = np.zeros(r)
    max_d = np.zeros(r)
    for t in range(m, n):
        dev = z[:, t] - mean_run[:, t]
        mu = mu + dev - delta
        md = md + dev + delta
        min_u = np.minimum(min_u, mu)
        max_d = np.maximum(max_d, md)
        out[:, t] = np.maximum(mu - min_u, max_d - md)
    return out


def adwin_stat(z: np.ndarray, m: int, min_sub: int = ADWIN_MIN) -> np.ndarray:
    """On data already divided by σ: max over splits of z²/2 − ln(2|W|), the window being
    the whole stream so far (no cut happens before the first alarm)."""
    r, n = z.shape
    out = np.full((r, n), -np.inf)
    cs = np.concatenate([np.zeros((r, 1)), np.cumsum(z, axis=1)], axis=1)
    for t in range(max(m, 2 * min_sub - 1), n):
        w = t + 1
        j = np.arange(min_sub, w - min_sub + 1)  # the older part is z[:j]
        if len(j) == 0:
            continue
        mu0 = cs[:, j] / j
        mu1 = (cs[:, [w]] - cs[:, j]) / (w - j)
        zz = (mu0 - mu1) / np.sqrt(1.0 / j + 1.0 / (w - j))
        out[:, t] = (zz * zz).max(axis=1) / 2 - math.log(2 * w)
    return out


def bocpd_stat(z: np.ndarray, m: int, prior: tuple[float, float, float], hazard: float = BOCPD_HAZARD,
               window: int = BOCPD_WINDOW) -> np.ndarray:
    """P(a change within the last ``window`` runs | data) after each run.

    The segment length L counts the runs of the current segment including the newest, so the
    no-change path has L = t + 1 after run t (0-based). A change just before x_t predicts x_t
    from the prior (so the change probability is H·π₀(x_t), not the predictive of the old
    segment); growth of a segment of length L predicts x_t from that segment's posterior.
    """
    r_, n = z.shape
    k0, a0, b0 = prior
    out = np.full((r_, n), -np.inf)
    lh, l1h = math.log(hazard), math.log1p(-hazard)
    prior_scale = math.sqrt(b0 * (k0 + 1) / (a0 * k0))

    def upd(mu, ka, al, be, x):
        return (ka * mu + x) / (ka + 1), ka + 1, al + 0.5, be + ka * (x - mu) ** 2 / (2 * (ka + 1))

    x0 = z[:, [0]]
    # After the first run: one segment of length 1.
    mu, ka, al, be = upd(np.zeros((r_, 1)), np.full((r_, 1), k0), np.full((r_, 1), a0), np.full((r_, 1), b0), x0)
    logr = np.zeros((r_, 1))
    for t in range(1, n):
        x = z[:, [t]]
        lp = stats.t.logpdf(x, 2 * al, loc=mu, scale=np.sqrt(be * (ka + 1) / (al * ka)))
        lp0 = stats.t.logpdf(x, 2 * a0, loc=0.0, scale=prior_scale)
        grow = logr + lp + l1h  # lengths 2..t+1
        cp = lh + lp0  # length 1 (Σ P(L) = 1)
        new = np.concatenate([cp, grow], axis=1)
        logr = new - special.logsumexp(new, axis=1, keepdims=True)
        mu1, ka1, al1, be1 = upd(np.zeros((r_, 1)), np.full((r_, 1), k0), np.full((r_, 1), a0), np.full((r_, 1), b0), x)
        mug, kag, alg, beg = upd(mu, ka, al, be, x)
        mu = np.concatenate([mu1, mug], axis=1)
        ka = np.concatenate([ka1, kag], axis=1)
        al = np.concatenate([al1, alg], axis=1)
        be = np.concatenate([be1, beg], axis=1)
        if t >= m:
            upto = min(window, t)  # lengths 1..upto; the no-change path (t+1) excluded
            out[:, t] = np.exp(special.logsumexp(logr[:, :upto], axis=1))
    return out


def statistics(y: np.ndarray, sigma: float | None) -> tuple[dict, int, np.ndarray]:
    """All four statistics for a batch of log series y (R, L): (stats, m, σ per row)."""
    m = reference_size(y.shape[1])
    z, s = standardise(y, m, sigma)
    mode = "known" if sigma is not None else "estimated"
    out = {
        "cusum": cusum_stat(self_starting(y, m, sigma), m),
        "page_hinkley": page_hinkley_stat(z, m),
        "adwin": adwin_stat(z, m),
        "bocpd": bocpd_stat(z, m, BOCPD_PRIOR[mode]),
    }
    return out, m, s


# --------------------------------------------------------------------------- calibration


def calibrate(lengths: Iterable[int] = LENGTHS, reps: int = CALIBRATION_REPS, seed: int = CALIBRATION_SEED,
              false_alarm: float = FALSE_ALARM) -> dict:
    """Thresholds giving ``false_alarm`` probability of any alarm over a stream of no change,
    per σ mode, detector and stream length: the (1 − false_alarm) quantile of each stream's
    maximum statistic over ``reps`` simulated N(0, 1) streams. Returns THRESHOLDS' shape."""
    rng = np.random.default_rng(seed)
    out: dict = {"estimated": {d: {} for d in DETECTORS}, "known": {d: {} for d in DETECTORS}}
    for n in lengths:
        y = rng.standard_normal((reps, n))
        for mode, sigma in (("known", 1.0), ("estimated", None)):
            st, _m, _s = statistics(y, sigma)
            for d in DETECTORS:
                mx = st[d].max(axis=1)
                out[mode][d][int(n)] = round(float(np.quantile(mx, 1 - false_alarm)), 4)
    return out


def threshold(detector: str, n: int, known_sigma: bool, table: dict | None = None) -> tuple[float, int]:
    """The calibrated threshold for a stream of n runs: the one for the shortest calibrated
    length ≥ n (a longer stream has more chances to false-alarm, so this is conservative)."""
    table = table or THRESHOLDS
    col = table["known" if known_sigma else "estimated"][detector]
    lengths = sorted(int(k) for k in col)
    for length in lengths:
        if length >= n:
            return float(col[length]), length
    return float(col[lengths[-1]]), lengths[-1]


# --------------------------------------------------------------------------- one series


def _change_index(det: str, z: np.ndarray, u: np.ndarray, m: int, alarm: int) -> int:
    """Where the new level starts (index of its first run), estimated at the alarm: CUSUM's
    last restart before the alarm; otherwise the split that best separates before and after."""
    x = z[: alarm + 1]
    if det == "cusum":
        up = dn = 0.0
        last_up = last_dn = m
        for t in range(m, alarm + 1):
            up = max(0.0, up + u[t] - CUSUM_K)
            dn = max(0.0, dn - u[t] - CUSUM_K)
            if up == 0.0:
                last_up = t + 1
            if dn == 0.0:
                last_dn = t + 1
        return min(last_up if up >= dn else last_dn, alarm)
    # Split maximising the two-sample z between before and after (ADWIN's own cut, and a
    # sensible location for Page–Hinkley and BOCPD too).
    w = alarm + 1
    cs = np.concatenate([[0.0], np.cumsum(x)])
    best, arg = -1.0, max(1, m)
    for j in range(ADWIN_MIN, w - ADWIN_MIN + 1):
        d = cs[j] / j - (cs[w] - cs[j]) / (w - j)
        zz = abs(d) / math.sqrt(1 / j + 1 / (w - j))
        if zz > best:
            best, arg = zz, j
    return arg


def detect(series: Iterable[float], sigma: float | None = None, detector: str = DEFAULT_DETECTOR, table: dict | None = None) -> dict:
    """Did the level of ``series`` (positive values of one metric, in run order) change?

    ``sigma``: relative run-to-run σ pooled from earlier A/A runs (recommended), else it is
    estimated from the reference window. ``detector`` decides (default CUSUM); all four are
    reported. Returns a plain dict: ``changed``, ``change_index`` (0-based index of the first
    run at the new level), ``alarm_index``, ``shift`` (relative change of the geometric mean
    after vs before), per-detector details, the calibration used.
    """
    if detector not in DETECTORS:
        raise ValueError(f"unknown detector {detector!r}; one of {', '.join(DETECTORS)}")
    vals = np.asarray(list(series), dtype=float)
    if vals.ndim != 1 or np.any(~np.isfinite(vals)) or np.any(vals <= 0):
        raise ValueError("the series must be finite positive numbers")
    n_all = len(vals)
    res: dict[str, Any] = {"n": n_all, "detector": detector, "changed": False, "change_index": None, "alarm_index": None,
                           "shift": None, "detectors": {}, "false_alarm_target": FALSE_ALARM}
    if sigma is not None and not (0 < sigma < 1):
        raise ValueError("sigma must be a relative standard deviation in (0, 1)")
    if n_all < MIN_RUNS:
        res["verdict"] = "too_short"
        res["why"] = f"{n_all} runs; drift needs at least {MIN_RUNS} (a reference window and runs to watch)"
        return res
    maxlen = max(LENGTHS)
    offset = max(0, n_all - maxlen)
    y = np.log(vals[offset:])[None, :]
    n = y.shape[1]
    sts, m, s = statistics(y, sigma)
    z = (y[0] - y[0, :m].mean()) / s[0]
    u = self_starting(y, m, sigma)[0]
    res.update({"offset": offset, "reference_runs": m, "sigma": float(s[0]),
                "sigma_source": "pooled (earlier A/A runs)" if sigma is not None else f"first {m} runs"})
    if offset:
        res["note"] = f"judged on the last {n} runs (calibration covers up to {maxlen})"
    if not math.isfinite(float(s[0])) or s[0] <= 0:
        res["verdict"] = "no_spread"
        res["why"] = "the reference runs have no spread; give a pooled σ (--sigma)"
        return res
    for d in DETECTORS:
        h, cal_len = threshold(d, n, sigma is not None, table)
        stat = sts[d][0]
        fired = np.flatnonzero(stat > h)
        info: dict[str, Any] = {"fired": bool(len(fired)), "threshold": h, "calibrated_length": cal_len,
                                "statistic_max": float(np.max(stat[m:])) if n > m else None}
        if d == "adwin":
            info["delta"] = float(math.exp(-h))
        if len(fired):
            alarm = int(fired[0])
            cp = _change_index(d, z, u, m, alarm)
            before, after = y[0, :cp], y[0, cp : alarm + 1]
            info.update({"alarm_index": alarm + offset, "change_index": cp + offset,
                         "shift": float(math.expm1(after.mean() - before.mean())) if len(before) and len(after) else None})
        res["detectors"][d] = info
    chosen = res["detectors"][detector]
    if chosen["fired"]:
        cp = chosen["change_index"] - offset
        res.update({"changed": True, "verdict": "changed", "alarm_index": chosen["alarm_index"], "change_index": chosen["change_index"]})
        before, after = y[0, :cp], y[0, cp:]
        res["shift"] = float(math.expm1(after.mean() - before.mean()))
        res["level_before"] = float(math.exp(before.mean()))
        res["level_after"] = float(math.exp(after.mean()))
        res["why"] = (f"{detector} alarm at run {chosen['alarm_index'] + 1}: the level changed from run "
                      f"{chosen['change_index'] + 1} on by {res['shift']:+.1%}")
    else:
        res["verdict"] = "stable"
        others = [d for d in DETECTORS if d != detector and res["detectors"][d]["fired"]]
        res["why"] = f"no change detected by {detector} over {n_all} runs" + (
            f" ({', '.join(others)} fired; each alone is calibrated to {FALSE_ALARM:.0%} false alarms)" if others else "")
    return res


def stale_runs(dates: list[_dt.datetime | None], change_at: _dt.datetime) -> list[int]:
    """Indices of runs older than a detected change point (a run without a date cannot be shown
    to be newer, so it counts as stale): gate refuses a baseline made of them."""
    return [i for i, d in enumerate(dates) if d is None or d < change_at]


# --------------------------------------------------------------------------- a tune's sentinel check

LEVEL_RATIOS = (0.0, 0.5, 1.0, 2.0, 4.0)  # b/w ratios the level check's threshold covers (worst case)
LEVEL_MIN_REPS = 1000


def _level_t(y_ref: np.ndarray, sizes: tuple[int, ...], y_lat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Batched level statistic: (T, diff, within², between²) per row.

    ``y_ref`` (R, N): log values of the reference, its columns grouped by start in the order of
    ``sizes``; ``y_lat`` (R, n): the newest start's log values. The same ANOVA moment estimates as
    ``stats.variance_components`` (MSW; max(0, (MSB − MSW) / n0))."""
    sz = np.asarray(sizes, dtype=float)
    k, n = len(sizes), int(sz.sum())
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(int)
    means = np.add.reduceat(y_ref, starts, axis=1) / sz
    dev = y_ref - np.repeat(means, sizes, axis=1)
    msw = (dev * dev).sum(axis=1) / (n - k)
    grand = y_ref.mean(axis=1, keepdims=True)
    msb = (sz * (means - grand) ** 2).sum(axis=1) / (k - 1)
    n0 = (n - float((sz * sz).sum()) / n) / (k - 1)
    vb = np.maximum(0.0, (msb - msw) / n0)
    n_lat = y_lat.shape[1]
    diff = y_lat.mean(axis=1) - means.mean(axis=1)
    var = vb + msw / n_lat + (k * vb + msw * float((1.0 / sz).sum())) / (k * k)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = diff / np.sqrt(var)
    return t, diff, msw, vb


@functools.lru_cache(maxsize=256)
def _level_threshold(sizes: tuple[int, ...], n_latest: int, checks: int, alpha: float, reps: int, seed: int) -> tuple[float, tuple[float, ...]]:
    """(threshold, quantile per ratio in LEVEL_RATIOS): the (1 − alpha/checks) quantile of |T| under
    no change for this design, simulated at each b/w ratio (T does not depend on the scale, so w = 1)
    on common random numbers; the threshold is the largest."""
    rng = np.random.default_rng(seed)
    k, n = len(sizes), sum(sizes)
    u = rng.standard_normal((reps, k + 1))
    e = rng.standard_normal((reps, n + n_latest))
    u_ref = np.repeat(u[:, :k], sizes, axis=1)
    qs = []
    for r in LEVEL_RATIOS:
        t, _d, _w, _b = _level_t(r * u_ref + e[:, :n], sizes, r * u[:, [k]] + e[:, n:])
        qs.append(float(np.quantile(np.abs(np.nan_to_num(t, nan=0.0)), 1.0 - alpha / checks)))
    return max(qs), tuple(qs)


def level_check(reference: list[list[float]], latest: list[float], checks: int = 4, alpha: float = FALSE_ALARM,
                reps: int = 20000, seed: int = CALIBRATION_SEED) -> dict:
    """Has the kept configuration's level moved? ``latest`` (the newest server start's values,
    usually one sentinel run) against ``reference`` (earlier values, one list per server start,
    oldest first), on natural logs.

    Reference level: the mean of the start means. Within (w) and between-start (b) sd from
    ``variance_components`` on the reference; T = diff / sqrt((b² + w²/n) + Σ_i (b² + w²/n_i) / K²).
    ``changed`` when |T| exceeds the threshold simulated for exactly this design so that a
    no-change check false-alarms with probability ``alpha / checks`` at the worst of the b/w ratios
    in LEVEL_RATIOS. Returns a plain dict (verdict "changed", "stable" or "too_short", and why)."""
    if checks < 1:
        raise ValueError("checks must be at least 1")
    if not (0.0 < alpha < 1.0):
        raise ValueError("alpha must be in (0, 1)")
    if reps < LEVEL_MIN_REPS:
        raise ValueError(f"reps must be at least {LEVEL_MIN_REPS}")
    groups = [np.asarray(list(g), dtype=float) for g in reference]
    lat = np.asarray(list(latest), dtype=float)
    if lat.ndim != 1 or len(lat) == 0:
        raise ValueError("latest must hold at least one value")
    for arr in [lat, *groups]:
        if arr.ndim != 1 or np.any(~np.isfinite(arr)) or np.any(arr <= 0):
            raise ValueError("the values must be finite positive numbers")
    groups = [g for g in groups if len(g)]
    sizes = tuple(len(g) for g in groups)
    k, n = len(sizes), sum(sizes)
    a_check = alpha / checks
    res: dict[str, Any] = {"verdict": "too_short", "changed": False, "shift": None, "statistic": None, "threshold": None,
                           "false_alarm_per_check": a_check, "within": None, "between": None, "reference_starts": k,
                           "reference_runs": n, "latest_runs": len(lat)}
    if k < 2 or n - k < 1:
        res["why"] = (f"the reference has {k} start(s) and {n - k} within-start degree(s) of freedom; the level check "
                      "needs at least 2 starts and one start with 2 or more runs")
        return res
    logs = [np.log(g) for g in groups]
    vc = variance_components(logs)
    w2, b2 = vc.within ** 2, vc.between ** 2
    ref_level = float(np.mean([g.mean() for g in logs]))
    diff = float(np.log(lat).mean() - ref_level)
    var = (b2 + w2 / len(lat)) + sum(b2 + w2 / s for s in sizes) / (k * k)
    res.update({"within": vc.within, "between": vc.between, "shift": math.expm1(diff)})
    if not var > 0:
        res["why"] = "the reference runs have no spread (all values equal within every start), so no scale to judge a move by"
        return res
    t = diff / math.sqrt(var)
    thr, by_ratio = _level_threshold(sizes, len(lat), int(checks), float(alpha), int(reps), int(seed))
    changed = abs(t) > thr
    res.update({"verdict": "changed" if changed else "stable", "changed": bool(changed), "statistic": t, "threshold": thr,
                "calibration": {"ratios": list(LEVEL_RATIOS), "quantiles": list(by_ratio), "reps": int(reps), "seed": int(seed)}})
    res["why"] = (f"level {res['shift']:+.1%} vs the reference of {k} starts: |T| {abs(t):.1f} "
                  f"{'above' if changed else 'within'} {thr:.1f} (calibrated for {alpha:.0%} false alarms over {checks} checks)")
    return res


# --------------------------------------------------------------------------- the soak's length

SOAK_WINDOWS = MIN_RUNS  # make soak's windows: drift's minimum for a verdict
RATE_LEVEL = 0.90


def drift_rate(hours: Iterable[float], values: Iterable[float], level: float = RATE_LEVEL) -> dict | None:
    """The level's linear drift: the least-squares slope of ln(value) on time in hours (a relative
    change per hour), its standard error and two-sided ``level`` interval (Student t, n − 2 degrees
    of freedom). None with fewer than 3 runs or no time between them."""
    t = np.asarray(list(hours), dtype=float)
    v = np.asarray(list(values), dtype=float)
    if t.shape != v.shape or t.ndim != 1 or np.any(~np.isfinite(t)) or np.any(~np.isfinite(v)) or np.any(v <= 0):
        raise ValueError("hours and values must be finite, one per run, and the values positive")
    if not (0.0 < level < 1.0):
        raise ValueError("level must be in (0, 1)")
    n = len(t)
    tc = t - t.mean() if n else t
    sxx = float(tc @ tc)
    if n < 3 or not sxx > 0:
        return None
    y = np.log(v)
    slope = float(tc @ (y - y.mean())) / sxx
    resid = y - y.mean() - slope * tc
    se = math.sqrt(float(resid @ resid) / (n - 2) / sxx)
    half = float(stats.t.ppf(0.5 + level / 2, n - 2)) * se
    return {"per_h": slope, "se": se, "interval": [slope - half, slope + half], "level": level, "runs": n,
            "span_h": float(t.max() - t.min())}


def soak_plan(rate: dict, threshold: float, run_s: float, windows: int = SOAK_WINDOWS) -> dict:
    """How long a soak must run to show the drift that the runs behind ``rate`` cannot rule out.

    g = ln(1 + threshold), the gate's threshold on the log scale; r_max = max(|lo|, |hi|) over the
    rate's interval, the fastest drift (per hour, either way) the runs allow. Drift at r_max moves
    the level by the threshold in T = g / r_max hours: a soak of T shows it as a change the gate
    counts, and a baseline older than T may be off by the threshold. The soak: ``windows`` windows
    of max(T / windows, run_s) seconds (a window no shorter than the runs the rate came from).
    ``at_rate_h``: g / |slope|, when the level moves by the threshold at the measured rate itself;
    ``drifting``: the interval excludes 0."""
    if not (0.0 < threshold < 1.0):
        raise ValueError("threshold must be a relative change in (0, 1)")
    if windows < 1 or not run_s > 0:
        raise ValueError("windows must be at least 1 and run_s positive")
    g = math.log1p(threshold)
    lo, hi = rate["interval"]
    r_max = max(abs(lo), abs(hi))
    hours = g / r_max if r_max > 0 else math.inf
    window_s = max(math.ceil(hours * 3600 / windows), math.ceil(run_s)) if math.isfinite(hours) else math.ceil(run_s)
    return {"threshold": threshold, "log_threshold": g, "fastest_per_h": r_max, "hours": hours,
            "at_rate_h": g / abs(rate["per_h"]) if rate["per_h"] else math.inf, "drifting": bool(lo > 0 or hi < 0),
            "windows": windows, "window_s": window_s, "soak_h": windows * window_s / 3600}


def format_hours(hours: float) -> str:
    """A duration for a sentence: seconds below 2 minutes, minutes below an hour, else hours."""
    if not math.isfinite(hours):
        return "no finite time"
    if hours * 3600 < 120:
        return f"{hours * 3600:.0f} s"
    return f"{hours * 60:.1f} min" if hours < 1 else f"{hours:.2f} h"


def soak_advice(hours: list[float], values: list[float], threshold: float, run_s: float, metric: str = "output_throughput",
                threshold_rule: str = "max(2σ, 3%)") -> dict:
    """The soak recommendation from the drift rate measured on one configuration's runs (``hours``:
    when each ran, ``values``: its ``metric``): ``drift_rate``, ``soak_plan`` and a sentence saying
    how long to soak, how often to re-measure the baseline, and the numbers behind both."""
    rate = drift_rate(hours, values)
    if rate is None:
        span = (max(hours) - min(hours)) * 3600 if hours else 0.0
        return {"rate": None, "plan": None,
                "text": (f"no drift rate measured: {len(values)} dated run(s) of the kept configuration over {span:.0f} s, and a "
                         f"slope needs 3 at different times; soak before delivery (`make soak`, {SOAK_WINDOWS} windows), which "
                         "measures the rate over its windows and says how often to re-measure the baseline (runbook/soak.md)")}
    plan = soak_plan(rate, threshold, run_s)
    lo, hi = rate["interval"]
    head = (f"measured drift of the kept configuration: {metric} {rate['per_h']:+.2%}/h ({rate['level']:.0%} interval "
            f"{lo:+.2%} to {hi:+.2%}/h) over {rate['runs']} runs in {rate['span_h']:.2f} h. ")
    if not math.isfinite(plan["hours"]):
        return {"rate": rate, "plan": plan,
                "text": head + "The runs show no spread and no slope, so no time can be put on the drift: soak before delivery "
                               f"(`make soak`, {SOAK_WINDOWS} windows), which measures the rate over its windows (runbook/soak.md)"}
    text = (head + f"Drift at the interval's fastest, {plan['fastest_per_h']:.2%}/h, moves the level by the gate's threshold "
            f"({threshold:.1%}, {threshold_rule}) in ln(1 + {threshold:.3f}) / {plan['fastest_per_h']:.4f} = {plan['hours']:.4g} h: "
            f"soak at least that long (`make soak WINDOWS={plan['windows']} WINDOW_S={plan['window_s']}`, "
            f"{format_hours(plan['soak_h'])}): such drift shows within it as a change the gate counts, and a shorter soak adds "
            f"nothing to what the tune's runs showed; re-measure the baseline at least every {format_hours(plan['hours'])}. "
            "The soak ends with the same computation over its own windows: the longer it runs, the narrower the interval "
            "(and, with no real drift, the longer a baseline holds)")
    if plan["drifting"]:
        text += (f". The level is moving (the interval excludes 0): at the measured rate it crosses the threshold in "
                 f"{format_hours(plan['at_rate_h'])}; find the cause before delivery (runbook/soak.md, When it drifted)")
    return {"rate": rate, "plan": plan, "text": text}
