"""The decision rule of gate, vectorised (``seq_bounds``, ``call_primary``, ``call_guard``): shared
with ``bench/bench_gate.py`` so that the benchmark measures this code, not a copy.

Sequential (default; ``stats`` has the formulas and their sources): pairs (baseline,
candidate) in time order; g = direction × (log c − log b).

- improves: the always-valid one-sided (1−α) lower bound of the confidence sequence on the
  mean of g is above 0, and the estimate is at least log(1 + t) (t the practical floor on
  top of the test, not the test itself);
- not enough (reject): the (1−β) upper confidence-sequence bound is below log(1 + t)
  (β = 1 − power; a time-uniform futility test), or, once the pairs reach the power
  analysis' n, the classical one-sided (1−α) upper bound is below it;
- otherwise undecided, with the number of further runs projected from the current estimate.

The confidence sequence is the normal mixture with σ_d = √2·max(σ_pooled, σ̂_now) when a
pooled σ from earlier A/A runs is given (state ``sigma_baseline`` or ``--sigma``), else the
scale-invariant t-mixture on the pair differences. Guards use the same machinery with the
tolerance in place of t: ok when the lower bound on g is above log(1 − tol). ``--fixed``
replaces the sequences with Welch's (blocked) or the paired (interleaved) t-test and
decides once, at the power analysis' n (at least 3 per arm): accept when p < α and the
estimate is at least log(1 + t), else reject; undecided before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as _sps

from vkit.decide import stats as st
from vkit.decide.specs import Settings

MAX_PROJECT = 200  # furthest look-ahead for "how many more runs"
MIN_FIXED_RUNS = 3  # --fixed never decides on fewer runs per arm


@dataclass(frozen=True)
class Boundaries:
    """The four boundary tables a decision needs (efficacy at α, futility at β = 1 − power;
    normal mixture for a pooled σ, t-mixture otherwise). Build once, reuse."""

    eff_t: st.TMixture
    fut_t: st.TMixture
    eff_n: st.NormalMixture
    fut_n: st.NormalMixture
    alpha: float
    beta: float

    @classmethod
    def build(cls, s: Settings, kmax: int = MAX_PROJECT) -> Boundaries:
        beta = 1 - s.power
        return cls(
            st.TMixture(s.alpha, s.c, kmax), st.TMixture(beta, s.c, kmax),
            st.NormalMixture(s.alpha, s.rho0, kmax), st.NormalMixture(beta, s.rho0, kmax), s.alpha, beta,
        )


def seq_bounds(bnd: Boundaries, k, est, sd, sigma_d=None):
    """Bounds on the mean of the pair differences after ``k`` pairs: the efficacy lower and
    upper bounds (one-sided 1−α each, always valid), the futility upper bound (1−β, always
    valid) and the classical one-sided (1−α) upper bound. ``sigma_d`` (known σ of a pair
    difference) selects the normal mixture; None the t-mixture on the sample sd ``sd``.
    Works elementwise on numpy arrays."""
    k = np.asarray(k)
    kk = np.maximum(k, 1)
    if sigma_d is not None:
        he = bnd.eff_n.half_width(k, sigma_d)
        hf = bnd.fut_n.half_width(k, sigma_d)
        hc = st.z(1 - bnd.alpha) * np.asarray(sigma_d) / np.sqrt(kk)
    else:
        he = bnd.eff_t.half_width(k, sd)
        hf = bnd.fut_t.half_width(k, sd)
        q = _sps.t.ppf(1 - bnd.alpha, np.maximum(k - 1, 1))
        hc = np.where(k >= 2, q * np.asarray(sd) / np.sqrt(kk), np.inf)
    est = np.asarray(est)
    return est - he, est + he, est + hf, est + hc


def call_primary(est, lo, hi_fut, hi_fixed, k, n_needed, thr):
    """+1 improves (lower bound > 0 and estimate ≥ threshold), −1 not enough (the futility
    bound, or at the planned n the classical bound, is below the threshold), 0 undecided."""
    ok = (np.asarray(lo) > 0) & (np.asarray(est) >= thr)
    futile = (np.asarray(hi_fut) < thr) | ((np.asarray(k) >= n_needed) & (np.asarray(hi_fixed) < thr))
    return np.where(ok, 1, np.where(futile, -1, 0))


def call_guard(lo, hi_fut, hi_fixed, k, n_needed, tol_log):
    """+1 ok (lower bound above −tolerance), −1 worse (futility bound, or at the planned n the
    classical bound, below −tolerance), 0 undecided. ``tol_log`` is negative."""
    ok = np.asarray(lo) > tol_log
    bad = (np.asarray(hi_fut) < tol_log) | ((np.asarray(k) >= n_needed) & (np.asarray(hi_fixed) < tol_log))
    return np.where(ok, 1, np.where(bad, -1, 0))


def threshold_log(t: float, direction: int) -> float:
    """log-scale improvement g that a relative improvement ``t`` means: higher-better
    c/b ≥ 1 + t; lower-better c/b ≤ 1 − t."""
    return math.log1p(t) if direction > 0 else -math.log1p(-t)


def tolerance_log(tol: float, direction: int) -> float:
    """log-scale g at the worst allowed worsening: c/b ≥ 1 − tol, or c/b ≤ 1 + tol."""
    return math.log1p(-tol) if direction > 0 else -math.log1p(tol)


def n_needed(sigma: float, d: float, s: Settings, known_sigma: bool, paired: bool) -> tuple[int, int]:
    """(n for the decision, n by the normal formula) per arm: exact t (paired when the
    analysis is on pairs) when σ is estimated, the normal formula when σ is known."""
    normal = st.n_per_arm_normal(sigma, d, s.alpha, s.power)
    if known_sigma:
        return normal, normal
    return st.n_per_arm_t(sigma, d, s.alpha, s.power, paired=paired)[0], normal


def pairs_to_decide(sigma: float, gap: float, s: Settings, futility: bool = True, bnd: Boundaries | None = None,
                    kmax: int = MAX_PROJECT) -> int | None:
    """The power analysis of the sequential rule itself: the fewest interleaved pairs at which, with a
    known σ per run (σ_d = √2·σ for a pair difference), the always-valid bounds separate a true change
    of 0 from one of ``gap`` (log scale, > 0) with probability ``s.power`` each way — at a true
    ``gap`` the efficacy lower bound clears 0, and (``futility``, the primary) at a true 0 the upper
    bound (futility, or the classical one once the pairs reach the fixed-n power analysis) falls
    below ``gap``. A guard (``futility=False``) needs only the first: at a true 0 its lower bound
    clears −tolerance. None when that takes more than ``kmax`` pairs.

    σ = 2 %, t = max(2σ, 3 %) = 4 %: 7 pairs (the fixed-n formula's 4 per arm does not hold for
    an always-valid sequence, which pays for looking after every pair)."""
    if not (sigma > 0 and gap > 0):
        raise ValueError("sigma and gap must be positive")
    bnd = bnd or Boundaries.build(s, kmax)
    sd = math.sqrt(2.0) * sigma
    ks = np.arange(2, kmax + 1)
    zp = st.z(s.power) * sd / np.sqrt(ks)
    worst = bnd.eff_n.half_width(ks, sd)
    if futility:
        n_fixed = st.n_per_arm_normal(sigma, gap, s.alpha, s.power)
        classical = st.z(1 - s.alpha) * sd / np.sqrt(ks)
        hf = bnd.fut_n.half_width(ks, sd)
        fut = np.where(ks >= n_fixed, np.minimum(hf, classical), hf)
        worst = np.maximum(worst, fut)
    hit = np.flatnonzero(worst + zp < gap)
    return int(ks[hit[0]]) if len(hit) else None
