"""The statistics behind gate (and the parts of drift that are not detectors).

Everything works on natural logs of a metric, so that run-to-run noise is roughly
homoscedastic and relative effects add: a difference of logs ``δ`` is a relative change
``exp(δ) − 1``, and a standard deviation of logs is a relative σ.

What scipy has is used as is (``stats.ttest_ind``/``ttest_rel`` with their
``confidence_interval``, ``stats.nct``, ``stats.false_discovery_control``); what it lacks
is written here with its source:

- sample size by the normal approximation and by the exact noncentral t;
- one-sided confidence-sequence boundaries: the normal mixture for a known (pooled) σ
  (Howard, Ramdas, McAuliffe & Sekhon 2021) and the scale-invariant t-mixture for an
  unknown σ (Lai 1976; Wang & Ramdas 2023), both as *one-sided* mixtures so that each
  bound holds at α on its own;
- their e-values (for e-BH) and e-BH itself (Wang & Ramdas 2022);
- the intersection-union combination (Berger 1982).

Nothing here prints or exits; nothing here keeps state between calls. Boundary tables
are objects the caller builds (they are cheap) and passes around.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import optimize, special, stats

# --------------------------------------------------------------------------- sample size


def z(p: float) -> float:
    """The standard normal quantile."""
    return float(stats.norm.ppf(p))


def n_per_arm_normal(sigma: float, d: float, alpha: float = 0.05, power: float = 0.8, sided: int = 1) -> int:
    """Repeats per arm to detect a difference ``d`` between two means, normal approximation:
    n = (z_{1−α/sided} + z_{power})² · 2σ² / d², rounded up (at least 2).

    The textbook two-sample formula (e.g. Chow, Shao & Wang, *Sample Size Calculations in
    Clinical Research*, 2008, §3.2.1), seed 004 §7. σ = 2%, d = 3%, α = 0.05, power 0.8:
    one-sided 5.5 → 6, two-sided 6.98 → 7.
    """
    _check_design(sigma, d, alpha, power, sided)
    za, zb = z(1 - alpha / sided), z(power)
    return max(2, math.ceil((za + zb) ** 2 * 2 * sigma**2 / d**2 - 1e-9))


def power_t(n: int, sigma: float, d: float, alpha: float = 0.05, sided: int = 1, paired: bool = False, rho: float = 0.0) -> float:
    """Exact power of the t-test with ``n`` per arm (or ``n`` pairs) at a true difference ``d``.

    Two-sample pooled t: df = 2n − 2, noncentrality d / (σ·sqrt(2/n)). Paired t on
    differences with correlation ``rho`` between the two runs of a pair: σ_d = σ·sqrt(2(1−ρ)),
    df = n − 1, noncentrality d·sqrt(n)/σ_d. Power from ``scipy.stats.nct``.
    """
    if n < 2:
        return 0.0
    if paired:
        df, ncp = n - 1, d * math.sqrt(n) / (sigma * math.sqrt(2 * (1 - rho)))
    else:
        df, ncp = 2 * n - 2, d / (sigma * math.sqrt(2.0 / n))
    if sided == 1:
        tc = stats.t.ppf(1 - alpha, df)
        return float(stats.nct.sf(tc, df, ncp))
    tc = stats.t.ppf(1 - alpha / 2, df)
    return float(stats.nct.sf(tc, df, ncp) + stats.nct.cdf(-tc, df, ncp))


def n_per_arm_t(
    sigma: float, d: float, alpha: float = 0.05, power: float = 0.8, sided: int = 1, paired: bool = False, rho: float = 0.0, n_max: int = 100000
) -> tuple[int, float]:
    """Smallest n per arm (or pairs) whose exact t-test power reaches ``power``; returns
    ``(n, achieved power)``. σ = 2%, d = 3%, α = 0.05, power 0.8: one-sided 7 (0.841),
    two-sided 9 (0.848); paired one-sided 8 pairs.
    """
    _check_design(sigma, d, alpha, power, sided)
    lo = 2
    if power_t(lo, sigma, d, alpha, sided, paired, rho) >= power:
        return lo, power_t(lo, sigma, d, alpha, sided, paired, rho)
    hi = max(4, 2 * n_per_arm_normal(sigma, d, alpha, power, sided))
    while power_t(hi, sigma, d, alpha, sided, paired, rho) < power:
        hi *= 2
        if hi > n_max:
            return n_max, power_t(n_max, sigma, d, alpha, sided, paired, rho)
    while hi - lo > 1:  # power is increasing in n
        mid = (lo + hi) // 2
        if power_t(mid, sigma, d, alpha, sided, paired, rho) >= power:
            hi = mid
        else:
            lo = mid
    return hi, power_t(hi, sigma, d, alpha, sided, paired, rho)


def min_detectable(sigma: float, n: int, alpha: float = 0.05, power: float = 0.8, sided: int = 1) -> float:
    """Smallest difference detectable with ``n`` per arm, normal approximation:
    (z_α + z_β)·σ·sqrt(2/n). σ = 2%, one-sided: 4.06% at n = 3, 3.15% at 5, 2.22% at 10."""
    return (z(1 - alpha / sided) + z(power)) * sigma * math.sqrt(2.0 / n)


def _check_design(sigma: float, d: float, alpha: float, power: float, sided: int) -> None:
    if not (sigma > 0 and d > 0):
        raise ValueError("sigma and d must be > 0")
    if not (0 < alpha < 1 and 0 < power < 1) or sided not in (1, 2):
        raise ValueError("alpha and power must be in (0, 1), sided 1 or 2")


# --------------------------------------------------------------------------- confidence sequences


@dataclass(frozen=True)
class NormalMixture:
    """One-sided normal-mixture confidence-sequence boundary for the mean of i.i.d.
    N(μ, σ²) observations with σ *known* (pooled from earlier A/A runs).

    Howard, Ramdas, McAuliffe & Sekhon (2021), "Time-uniform, nonparametric, nonasymptotic
    confidence sequences", Ann. Statist. 49(2), §3 (normal mixture; one-sided version with a
    half-normal mixing distribution). With S_k = Σ(x_i − μ), V_k = kσ² and the mixing
    precision ρ, the process

        M⁺_k = 2·sqrt(ρ/(V_k+ρ)) · exp(S_k²/(2(V_k+ρ))) · Φ(S_k/sqrt(V_k+ρ))

    is a nonnegative martingale with M⁺_0 = 1 (mixture over λ ≥ 0 of exp(λS − λ²V/2)), so by
    Ville's inequality P(∃k: M⁺_k ≥ 1/α) ≤ α. Inverting: μ ≥ x̄_k − u_k·σ/k for all k at once,
    where u_k solves M⁺ = 1/α with ρ = ρ₀σ² (so u_k depends on k, α, ρ₀ only). The mirror
    image gives the upper bound; each holds at α on its own.

    ``rho0`` sets where the boundary is tightest, in observations: about ρ₀ pairs.
    """

    alpha: float
    rho0: float = 4.0
    kmax: int = 200
    u: tuple = field(init=False, repr=False)

    def __post_init__(self) -> None:
        us = [math.inf] + [_nm_root(k, self.alpha, self.rho0) for k in range(1, self.kmax + 1)]  # k = 0: no bound
        object.__setattr__(self, "u", tuple(us))

    def half_width(self, k, sigma):
        """One-sided half-width u_k·σ/k for k observations (array-friendly)."""
        k = np.asarray(k)
        u = np.asarray(self.u)[np.minimum(k, self.kmax)]
        if np.any(k > self.kmax):
            u = np.where(k > self.kmax, _nm_u(k, self.alpha, self.rho0), u)
        with np.errstate(divide="ignore", invalid="ignore"):
            return u * np.asarray(sigma) / np.where(k > 0, k, np.nan)

    def log_e_two_sided(self, s, k, sigma):
        """log of the two-sided mixture martingale sqrt(ρ/(V+ρ))·exp(S²/(2(V+ρ))) at mean 0:
        an e-value against "no change" (Howard et al. 2021, eq. for the normal mixture)."""
        v = np.asarray(k) * np.asarray(sigma) ** 2
        rho = self.rho0 * np.asarray(sigma) ** 2
        return 0.5 * np.log(rho / (v + rho)) + np.asarray(s) ** 2 / (2 * (v + rho))


def _nm_root(k: int, alpha: float, rho0: float) -> float:
    """u solving log M⁺(uσ, kσ²; ρ₀σ²) = log(1/α)."""
    target = math.log(1 / alpha)
    w = k + rho0

    def f(x: float) -> float:
        return math.log(2) + 0.5 * math.log(rho0 / w) + x * x / (2 * w) + float(special.log_ndtr(x / math.sqrt(w))) - target

    hi = 2 * math.sqrt(w)
    while f(hi) < 0:
        hi *= 2
    return optimize.brentq(f, 0.0, hi, xtol=1e-10)


def _nm_u(k, alpha: float, rho0: float):
    return np.vectorize(lambda kk: _nm_root(int(kk), alpha, rho0))(k)


@dataclass(frozen=True)
class TMixture:
    """One-sided confidence-sequence boundary for the mean of i.i.d. normal observations
    with *unknown* σ: the scale-invariant Gaussian-mixture t-martingale.

    Lai (1976), "On confidence sequences", Ann. Statist. 4(2); Wang & Ramdas (2023),
    "Anytime-valid t-tests and confidence sequences for Gaussian means with unknown
    variance", arXiv:2310.03722. Mixing the (scale-invariant) likelihood ratio of
    N(μ + θσ, σ²) against N(μ, σ²) over θ ~ N(0, 1/c²) gives the two-sided
    G_k = sqrt(c²/(k+c²))·(1 − S²/((k+c²)V))^(−k/2), S = Σ(x−μ), V = Σ(x−μ)². Mixing over
    θ ≥ 0 only (half-normal, weight 2) and integrating σ out with the right Haar measure gives
    (our derivation; the σ integral turns Φ into a Student-t cdf with k degrees of freedom)

        G⁺_k = 2·G_k·F_k( S·sqrt(k) / sqrt((k+c²)V − S²) ),

    a nonnegative martingale on the scale-invariant filtration, so P(∃k: G⁺_k ≥ 1/α) ≤ α
    (Ville; the event is a property of the whole path, so any stopping rule is covered).
    G⁺ is increasing in r = S/sqrt(V); with r_k solving G⁺ = 1/α, the bound is
    μ ≥ x̄ − s·r_k·sqrt((k−1)/(k(k − r_k²))) (s the sample sd), infinite when no r < √k solves
    it. ``c`` = 0.5 is tight from about 4 observations on (STATS.md).
    """

    alpha: float
    c: float = 0.5
    kmax: int = 200
    mult: tuple = field(init=False, repr=False)

    def log_g_plus(self, r: float, k: int) -> float:
        c2 = self.c * self.c
        w = k + c2
        lg = 0.5 * math.log(c2 / w) - (k / 2) * math.log1p(-r * r / w)
        # r >= 0 on every path that calls this, so the cdf is >= 1/2 and its log is accurate.
        return math.log(2) + lg + math.log(float(special.stdtr(k, r * math.sqrt(k) / math.sqrt(w - r * r))))

    def __post_init__(self) -> None:
        target = math.log(1 / self.alpha)
        ms = [math.inf, math.inf]  # k = 0, 1: no bound without a variance estimate
        for k in range(2, self.kmax + 1):
            ms.append(self._mult(k, target))
        object.__setattr__(self, "mult", tuple(ms))

    def _mult(self, k: int, target: float) -> float:
        top = math.sqrt(k) * (1 - 1e-12)
        if self.log_g_plus(top, k) < target:
            return math.inf
        r = optimize.brentq(lambda x: self.log_g_plus(x, k) - target, 0.0, top, xtol=1e-12)
        return r * math.sqrt((k - 1) / (k * (k - r * r)))

    def half_width(self, k, sd):
        """One-sided half-width s·m_k for k observations with sample sd ``sd`` (array-friendly)."""
        k = np.asarray(k)
        m = np.asarray(self.mult)[np.minimum(k, self.kmax)]
        if np.any(k > self.kmax):
            target = math.log(1 / self.alpha)
            m = np.where(k > self.kmax, np.vectorize(lambda kk: self._mult(int(kk), target))(k), m)
        # no bound yet (m infinite: too few observations) stays no bound when the sample sd is 0 (identical
        # runs, e.g. a simulator with its noise off): inf x 0 would read NaN, an interval of "n/a"
        with np.errstate(invalid="ignore"):
            return np.where(np.isinf(m), np.inf, m * np.asarray(sd))

    def log_e_two_sided(self, s, ss, k):
        """log G_k at mean 0 (two-sided t-mixture; S = Σx, V = Σx²): an e-value against
        "no change". Wang & Ramdas (2023) eq. for the Lai martingale."""
        k = np.asarray(k, dtype=float)
        c2 = self.c * self.c
        w = k + c2
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(np.asarray(ss) > 0, np.asarray(s) ** 2 / (w * np.asarray(ss)), 0.0)
            return 0.5 * np.log(c2 / w) - (k / 2) * np.log1p(-ratio)


# --------------------------------------------------------------------------- fixed-n tests


@dataclass(frozen=True)
class FixedTest:
    """A classical one-sided comparison of means (on logs): estimate, one-sided p-value for
    "greater than zero", the one-sided (1−α) lower and upper bounds, degrees of freedom."""

    estimate: float
    p_greater: float
    p_two_sided: float
    lower: float
    upper: float
    df: float
    method: str


def fixed_test(cand: np.ndarray, base: np.ndarray, alpha: float, paired: bool) -> FixedTest | None:
    """Welch's t-test (``scipy.stats.ttest_ind(equal_var=False)``) or the paired t-test
    (``ttest_rel``) of mean(cand) − mean(base); ``None`` when there are too few runs."""
    cand, base = np.asarray(cand, float), np.asarray(base, float)
    if paired:
        if len(cand) != len(base) or len(cand) < 2:
            return None
        d = cand - base
        if np.ptp(d) == 0:
            return _degenerate(float(d.mean()), "paired t")
        g = stats.ttest_rel(cand, base, alternative="greater")
        two = stats.ttest_rel(cand, base)
        lo = g.confidence_interval(1 - alpha).low
        hi = stats.ttest_rel(cand, base, alternative="less").confidence_interval(1 - alpha).high
        return FixedTest(float(d.mean()), float(g.pvalue), float(two.pvalue), float(lo), float(hi), float(g.df), "paired t")
    if len(cand) < 2 or len(base) < 2:
        return None
    est = float(cand.mean() - base.mean())
    if np.ptp(cand) == 0 and np.ptp(base) == 0:
        return _degenerate(est, "Welch t")
    g = stats.ttest_ind(cand, base, equal_var=False, alternative="greater")
    two = stats.ttest_ind(cand, base, equal_var=False)
    lo = g.confidence_interval(1 - alpha).low
    hi = stats.ttest_ind(cand, base, equal_var=False, alternative="less").confidence_interval(1 - alpha).high
    return FixedTest(est, float(g.pvalue), float(two.pvalue), float(lo), float(hi), float(g.df), "Welch t")


def _degenerate(est: float, method: str) -> FixedTest:
    # No spread at all (identical runs): the test is undefined; say so with NaN p-values.
    return FixedTest(est, math.nan, math.nan, -math.inf, math.inf, math.nan, method + " (no variance)")


# --------------------------------------------------------------------------- several metrics


def intersection_union(*rejections: bool) -> bool:
    """Berger (1982): H0 = ∪ H0_j is rejected at α when every H0_j is rejected by its own
    level-α test; no multiplicity correction is needed for the joint accept decision."""
    return all(bool(r) for r in rejections)


def fdr(pvalues, q: float = 0.05, method: str = "bh") -> tuple[list[float], list[bool]]:
    """Benjamini–Hochberg (``bh``, valid under positive dependence) or Benjamini–Yekutieli
    (``by``, any dependence) adjusted p-values via ``scipy.stats.false_discovery_control``,
    and which are discoveries at level ``q``. NaN p-values are never discoveries."""
    p = np.asarray(pvalues, dtype=float)
    ok = np.isfinite(p)
    adj = np.full(p.shape, math.nan)
    if ok.any():
        adj[ok] = stats.false_discovery_control(np.clip(p[ok], 0, 1), method=method)
    return [float(a) for a in adj], [bool(a <= q) if math.isfinite(a) else False for a in adj]


def e_bh(evalues, alpha: float = 0.05) -> list[bool]:
    """e-BH (Wang & Ramdas 2022, "False discovery rate control with e-values", JRSS-B 84(3)):
    with K e-values sorted in decreasing order, reject the k* largest, k* = max{k : e_(k) ≥ K/(αk)}.
    Controls the FDR at α under any dependence."""
    e = np.asarray(evalues, dtype=float)
    e = np.where(np.isfinite(e), e, 0.0)
    k_all = len(e)
    order = np.argsort(-e)
    ks = np.arange(1, k_all + 1)
    ok = e[order] >= k_all / (alpha * ks)
    out = np.zeros(k_all, dtype=bool)
    if ok.any():
        kstar = int(ks[ok].max())
        out[order[:kstar]] = True
    return [bool(x) for x in out]


@dataclass(frozen=True)
class VarianceComponents:
    """One-way random-effects estimate: runs grouped by server process (start).

    ``within``: sd of runs on one process; ``between``: sd of the process level (restarts);
    ``total``: sd of one run on a new process, ``sqrt(within^2 + between^2)``. All on the scale
    of the values given (pass log values for relative sds). Intervals are two-sided ``level``:
    chi-square for ``within`` (df = N - K), Satterthwaite's approximate df for ``between`` when it
    is at least 1, else from 0 to the bound MSB's own chi-square allows.
    """

    within: float
    between: float
    total: float
    within_ci: tuple[float, float]
    between_ci: tuple[float, float]
    groups: int
    runs: int
    df_within: int
    df_between: float

    def as_dict(self) -> dict:
        return {"within": self.within, "between": self.between, "total": self.total,
                "within_ci": list(self.within_ci), "between_ci": list(self.between_ci),
                "groups": self.groups, "runs": self.runs, "df_within": self.df_within,
                "df_between": self.df_between}


def variance_components(groups, level: float = 0.9) -> VarianceComponents:
    """Within- and between-group sd from the ANOVA mean squares (unbalanced groups allowed).

    Needs at least two groups and one group with two or more values. ``between`` is the
    moment estimate ``max(0, (MSB - MSW) / n0)`` with ``n0 = (N - sum n_i^2 / N) / (K - 1)``.
    """
    gs = [np.asarray(g, dtype=float) for g in groups if len(g) > 0]
    k = len(gs)
    n = sum(len(g) for g in gs)
    if k < 2 or n - k < 1:
        raise ValueError("need at least two groups and one repeat within a group")
    grand = float(np.concatenate(gs).mean())
    ssw = float(sum(((g - g.mean()) ** 2).sum() for g in gs))
    ssb = float(sum(len(g) * (g.mean() - grand) ** 2 for g in gs))
    dfw, dfb = n - k, k - 1
    msw, msb = ssw / dfw, ssb / dfb
    n0 = (n - sum(len(g) ** 2 for g in gs) / n) / dfb
    vb = max(0.0, (msb - msw) / n0)
    a = (1.0 - level) / 2.0
    w_ci = (math.sqrt(ssw / stats.chi2.ppf(1 - a, dfw)), math.sqrt(ssw / stats.chi2.ppf(a, dfw)))
    # Satterthwaite: n0 * vb = MSB - MSW, a difference of two scaled chi-squares.
    df_b = (msb - msw) ** 2 / (msb ** 2 / dfb + msw ** 2 / dfw) if vb > 0 else 0.0
    if df_b >= 1.0:
        b_ci = (math.sqrt(df_b * vb / stats.chi2.ppf(1 - a, df_b)), math.sqrt(df_b * vb / stats.chi2.ppf(a, df_b)))
    else:
        # No evidence of a between part, or less than one degree of freedom for it (two starts give
        # at most one): Satterthwaite's interval means nothing there. The interval is from 0 to
        # what MSB allows at this level, MSB's own chi-square bound less MSW.
        b_ci = (0.0, math.sqrt(max(0.0, (msb * dfb / stats.chi2.ppf(a, dfb) - msw) / n0)))
    return VarianceComponents(math.sqrt(msw), math.sqrt(vb), math.sqrt(msw + vb), w_ci, b_ci, k, n, dfw, df_b)
