"""A small Gaussian-process surrogate and the acquisition functions built on it.

- :class:`GP`: zero-mean GP on standardised targets with a Matérn-5/2 ARD kernel and a
  homoscedastic noise term (Rasmussen & Williams 2006, *Gaussian Processes for Machine
  Learning*, eq. 4.17 for the kernel, Alg. 2.1 for the Cholesky posterior, eq. 5.9 for the
  marginal-likelihood gradient). Hyperparameters are MAP estimates: log marginal likelihood
  plus log-normal priors, maximised by L-BFGS-B with analytic gradients from two starts
  (the prior mean and one draw from the prior).
- :func:`log_ei`: the logarithm of expected improvement computed without underflow
  (Ament et al. 2023, "Unexpected Improvements to Expected Improvement for Bayesian
  Optimization", NeurIPS, eq. 9 and App. A.1); EI itself is Jones, Schonlau & Welch 1998.
- :func:`ehvi_2d`: exact expected hypervolume improvement for two objectives
  (Emmerich, Giannakoglou & Naujoks 2006; the O(n) strip decomposition as in Emmerich,
  Deutz & Klinkenberg 2011, "Hypervolume-based expected improvement: monotonicity
  properties and exact computation", IEEE CEC).

Nothing here keeps state between calls; every random draw comes from a caller's seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import linalg, optimize, special

SQRT5 = math.sqrt(5.0)
C1 = 0.5 * math.log(2.0 * math.pi)
C2 = 0.5 * math.log(math.pi / 2.0)
JITTER = 1e-8


@dataclass
class Prior:
    """Log-normal priors of the hyperparameters (on unit-cube inputs, standardised targets)."""

    log_ls_mean: float = math.log(0.4)
    log_ls_sd: float = 1.0
    log_sf2_mean: float = 0.0
    log_sf2_sd: float = 1.0
    log_sn2_mean: float = math.log(1e-2)
    log_sn2_sd: float = 1.5
    ls_bounds: tuple = (math.log(0.02), math.log(20.0))
    sf2_bounds: tuple = (math.log(1e-2), math.log(1e2))
    sn2_bounds: tuple = (math.log(1e-6), math.log(1.0))


def matern52(X1: np.ndarray, X2: np.ndarray, ls: np.ndarray, sf2: float) -> np.ndarray:
    """k(x, x') = σ_f² (1 + √5 r + 5r²/3) exp(−√5 r), r² = Σ_j (x_j − x'_j)² / ℓ_j²
    (Rasmussen & Williams 2006, eq. 4.17 with ν = 5/2, ARD distance)."""
    d = (X1[:, None, :] - X2[None, :, :]) / ls
    r = np.sqrt(np.maximum((d * d).sum(-1), 0.0))
    return sf2 * (1.0 + SQRT5 * r + (5.0 / 3.0) * r * r) * np.exp(-SQRT5 * r)


@dataclass
class GP:
    """Fit with :meth:`fit`, then :meth:`predict` the latent mean and variance."""

    prior: Prior = field(default_factory=Prior)
    standardize: bool = True
    ls: np.ndarray | None = None
    sf2: float = 1.0
    sn2: float = 1e-2
    X: np.ndarray | None = None
    y_mean: float = 0.0
    y_std: float = 1.0
    lml: float = float("nan")
    _L: np.ndarray | None = None
    _alpha: np.ndarray | None = None

    # -- objective of the MAP fit ------------------------------------------
    def _nlp(self, theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """Negative log posterior of θ = (log ℓ_1..d, log σ_f², log σ_n²) and its gradient.

        −log p(y|θ) = ½ yᵀK⁻¹y + ½ log|K| + (n/2) log 2π, and
        ∂/∂θ_k = ½ tr((K⁻¹ − ααᵀ) ∂K/∂θ_k) with α = K⁻¹y (R&W eq. 5.9)."""
        n, d = X.shape
        pr = self.prior
        ls = np.exp(theta[:d])
        sf2 = math.exp(theta[d])
        sn2 = math.exp(theta[d + 1])
        diff = (X[:, None, :] - X[None, :, :]) / ls
        D2 = diff * diff
        r = np.sqrt(np.maximum(D2.sum(-1), 0.0))
        e = np.exp(-SQRT5 * r)
        Kf = sf2 * (1.0 + SQRT5 * r + (5.0 / 3.0) * r * r) * e
        K = Kf + (sn2 + JITTER) * np.eye(n)
        try:
            L = linalg.cholesky(K, lower=True)
        except linalg.LinAlgError:
            return 1e10, np.zeros_like(theta)
        alpha = linalg.cho_solve((L, True), y)
        nll = 0.5 * float(y @ alpha) + float(np.log(np.diag(L)).sum()) + 0.5 * n * math.log(2 * math.pi)
        W = linalg.cho_solve((L, True), np.eye(n)) - np.outer(alpha, alpha)
        g = np.empty_like(theta)
        # ∂k/∂log ℓ_j = σ_f² (5/3)(1 + √5 r) e^{−√5 r} (Δ_j/ℓ_j)²
        common = sf2 * (5.0 / 3.0) * (1.0 + SQRT5 * r) * e
        for j in range(d):
            g[j] = 0.5 * float((W * (common * D2[:, :, j])).sum())
        g[d] = 0.5 * float((W * Kf).sum())
        g[d + 1] = 0.5 * sn2 * float(np.trace(W))
        means = np.r_[np.full(d, pr.log_ls_mean), pr.log_sf2_mean, pr.log_sn2_mean]
        sds = np.r_[np.full(d, pr.log_ls_sd), pr.log_sf2_sd, pr.log_sn2_sd]
        z = (theta - means) / sds
        return nll + 0.5 * float(z @ z), g + z / sds

    def fit(self, X: np.ndarray, y: np.ndarray, seed: int = 0, restarts: int = 2) -> "GP":
        X = np.asarray(X, dtype=float)
        y = np.asarray(y, dtype=float)
        n, d = X.shape
        if self.standardize:
            self.y_mean = float(y.mean())
            sd = float(y.std())
            self.y_std = sd if sd > 1e-12 else 1.0
        ys = (y - self.y_mean) / self.y_std
        pr = self.prior
        bounds = [pr.ls_bounds] * d + [pr.sf2_bounds, pr.sn2_bounds]
        means = np.r_[np.full(d, pr.log_ls_mean), pr.log_sf2_mean, pr.log_sn2_mean]
        sds = np.r_[np.full(d, pr.log_ls_sd), pr.log_sf2_sd, pr.log_sn2_sd]
        rng = np.random.default_rng([seed, n, d, 7])
        starts = [means] + [means + sds * rng.standard_normal(d + 2) for _ in range(max(restarts - 1, 0))]
        best = None
        for x0 in starts:
            x0 = np.clip(x0, [b[0] for b in bounds], [b[1] for b in bounds])
            res = optimize.minimize(self._nlp, x0, args=(X, ys), jac=True, method="L-BFGS-B", bounds=bounds,
                                    options={"maxiter": 200})
            if best is None or res.fun < best.fun:
                best = res
        theta = best.x
        self.ls = np.exp(theta[:d])
        self.sf2 = float(math.exp(theta[d]))
        self.sn2 = float(math.exp(theta[d + 1]))
        self.lml = -float(best.fun)
        return self.condition(X, y)

    def condition(self, X: np.ndarray, y: np.ndarray) -> "GP":
        """Condition on data with the current hyperparameters (no refit)."""
        X = np.asarray(X, dtype=float)
        y = np.asarray(y, dtype=float)
        if self.ls is None:
            self.ls = np.full(X.shape[1], math.exp(self.prior.log_ls_mean))
        self.X = X
        K = matern52(X, X, self.ls, self.sf2) + (self.sn2 + JITTER) * np.eye(len(X))
        self._L = linalg.cholesky(K, lower=True)
        self._alpha = linalg.cho_solve((self._L, True), (y - self.y_mean) / self.y_std)
        return self

    def predict(self, Xs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and variance of the latent function (noise excluded), in y units."""
        Xs = np.asarray(Xs, dtype=float)
        Ks = matern52(Xs, self.X, self.ls, self.sf2)
        mu = Ks @ self._alpha
        v = linalg.solve_triangular(self._L, Ks.T, lower=True)
        var = np.maximum(self.sf2 - (v * v).sum(0), 1e-12)
        return self.y_mean + self.y_std * mu, var * self.y_std ** 2

    def summary(self, names: list[str] | None = None) -> dict:
        ls = [round(float(x), 4) for x in (self.ls if self.ls is not None else [])]
        return {
            "kernel": "matern52_ard",
            "n": 0 if self.X is None else int(len(self.X)),
            "lengthscales": dict(zip(names, ls, strict=False)) if names and len(names) == len(ls) else ls,
            "signal_var": round(self.sf2, 6),
            "noise_var": round(self.sn2, 8),
            "y_mean": round(self.y_mean, 6),
            "y_std": round(self.y_std, 6),
            "log_marginal_posterior": round(self.lml, 4),
        }


# -- expected improvement --------------------------------------------------
def _log1mexp(x: np.ndarray) -> np.ndarray:
    """log(1 − eˣ) for x < 0 (Mächler 2012, "Accurately computing log(1 − exp(−|a|))")."""
    x = np.minimum(x, -1e-300)
    return np.where(x > -math.log(2.0), np.log(-np.expm1(x)), np.log1p(-np.exp(x)))


def log_h(z: np.ndarray) -> np.ndarray:
    """log(φ(z) + zΦ(z)) without underflow (Ament et al. 2023, eq. 9):
    z > −1: direct; −1/√ε < z ≤ −1: −z²/2 − c₁ + log1mexp(log(erfcx(−z/√2)|z|) + c₂);
    below: −z²/2 − c₁ − 2 log|z|, with c₁ = log(2π)/2, c₂ = log(π/2)/2."""
    z = np.asarray(z, dtype=float)
    out = np.empty_like(z)
    big = z > -1.0
    zb = z[big]
    out[big] = np.log(np.maximum(np.exp(-0.5 * zb * zb) / math.sqrt(2 * math.pi) + zb * special.ndtr(zb), 1e-300))
    tiny = z <= -1.0 / math.sqrt(np.finfo(float).eps)
    mid = ~big & ~tiny
    zm = z[mid]
    out[mid] = -0.5 * zm * zm - C1 + _log1mexp(np.log(special.erfcx(-zm / math.sqrt(2.0)) * np.abs(zm)) + C2)
    zt = z[tiny]
    out[tiny] = -0.5 * zt * zt - C1 - 2.0 * np.log(np.abs(zt))
    return out


def log_ei(mu: np.ndarray, sd: np.ndarray, best: float) -> np.ndarray:
    """log EI for maximisation: EI = σ h((μ − f*)/σ), h(z) = φ(z) + zΦ(z)
    (Jones et al. 1998; in log space per Ament et al. 2023)."""
    sd = np.maximum(np.asarray(sd, dtype=float), 1e-12)
    return log_h((np.asarray(mu, dtype=float) - best) / sd) + np.log(sd)


def ei(mu, sd, best):
    """Closed-form EI for maximisation, (μ − f*)Φ(z) + σφ(z) (Jones et al. 1998)."""
    sd = np.maximum(np.asarray(sd, dtype=float), 1e-300)
    z = (np.asarray(mu, dtype=float) - best) / sd
    return (mu - best) * special.ndtr(z) + sd * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def _psi(c: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """g(c; μ, σ) = E[(c − Y)⁺] for Y ~ N(μ, σ²) = (c − μ)Φ((c−μ)/σ) + σφ((c−μ)/σ); g(−∞) = 0."""
    with np.errstate(invalid="ignore"):
        z = (c - mu) / sd
        out = (c - mu) * special.ndtr(z) + sd * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    return np.where(np.isneginf(c), 0.0, out)


def ehvi_2d(front: np.ndarray, ref: np.ndarray, mu: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """Exact expected hypervolume improvement for two objectives, both **minimised**.

    ``front``: the current non-dominated points (k × 2), ``ref``: the reference point,
    ``mu``/``sd``: (n × 2) independent Gaussian predictions. With the front sorted by f₁
    ascending (so f₂ descending), a₀ = −∞, aᵢ = f₁ of point i, a_{k+1} = r₁, b₀ = r₂,
    bᵢ = f₂ of point i, the non-dominated region splits into vertical strips and

        EHVI = Σ_{i=0..k} [g₁(a_{i+1}) − g₁(aᵢ)] · g₂(bᵢ)

    with g as in :func:`_psi` (Emmerich, Deutz & Klinkenberg 2011). O(k) per candidate.
    """
    mu = np.atleast_2d(np.asarray(mu, dtype=float))
    sd = np.maximum(np.atleast_2d(np.asarray(sd, dtype=float)), 1e-12)
    P = np.asarray(front, dtype=float).reshape(-1, 2)
    P = P[(P[:, 0] < ref[0]) & (P[:, 1] < ref[1])]
    P = P[np.argsort(P[:, 0], kind="stable")]
    # keep it a proper staircase (drop points dominated inside the given set)
    keep, best2 = [], math.inf
    for p in P:
        if p[1] < best2:
            keep.append(p)
            best2 = p[1]
    P = np.asarray(keep).reshape(-1, 2)
    a = np.r_[-np.inf, P[:, 0], ref[0]]
    b = np.r_[ref[1], P[:, 1]]
    g1 = _psi(a[None, :], mu[:, :1], sd[:, :1])  # n × (k+2)
    g2 = _psi(b[None, :], mu[:, 1:2], sd[:, 1:2])  # n × (k+1)
    return np.maximum(((g1[:, 1:] - g1[:, :-1]) * g2).sum(1), 0.0)


def ehvi(front: np.ndarray, ref: np.ndarray, mu: np.ndarray, sd: np.ndarray, chunk: int = 2048) -> np.ndarray:
    """Exact expected hypervolume improvement for any number of objectives, all **minimised**,
    under independent Gaussian predictions (``mu``/``sd``: n × D).

    The box below ``ref`` is cut into a grid by the front's coordinates (−∞ first in every
    axis); a cell [l, u] is free when no front point weakly dominates its lower corner. The
    improvement of a point y is the volume of [y, ref] inside the free cells, and for a cell
    it factorises over the axes, (u_d − max(l_d, y_d))⁺ = (u_d − y_d)⁺ − (l_d − y_d)⁺; with the
    axes independent its expectation is Π_d [g_d(u_d) − g_d(l_d)], g as in :func:`_psi`, so

        EHVI = Σ_free cells Π_d [g_d(u_d) − g_d(l_d)]

    (the grid decomposition of Couckuyt, Deschrijver & Dhaene 2014). O(k^D) cells for k front
    points; with two objectives it equals :func:`ehvi_2d`."""
    mu = np.atleast_2d(np.asarray(mu, dtype=float))
    sd = np.maximum(np.atleast_2d(np.asarray(sd, dtype=float)), 1e-12)
    D = mu.shape[1]
    ref = np.asarray(ref, dtype=float).reshape(D)
    P = np.asarray(front, dtype=float).reshape(-1, D)
    P = P[(P < ref).all(1)]
    axes = [np.r_[-np.inf, np.unique(P[:, d]), ref[d]] for d in range(D)]
    grids = np.meshgrid(*[np.arange(len(a) - 1) for a in axes], indexing="ij")
    idx = np.stack([g.ravel() for g in grids], 1)  # cells × D, index of each cell's lower edge
    lower = np.stack([axes[d][idx[:, d]] for d in range(D)], 1)
    free = ~(P[None, :, :] <= lower[:, None, :]).all(-1).any(1) if len(P) else np.ones(len(idx), bool)
    idx = idx[free]
    out = np.zeros(len(mu))
    for s in range(0, len(mu), chunk):
        m, v = mu[s:s + chunk], sd[s:s + chunk]
        prod = np.ones((len(m), len(idx)))
        for d in range(D):
            g = _psi(axes[d][None, :], m[:, d:d + 1], v[:, d:d + 1])  # n × (edges)
            prod *= (g[:, 1:] - g[:, :-1])[:, idx[:, d]]
        out[s:s + chunk] = prod.sum(1)
    return np.maximum(out, 0.0)
