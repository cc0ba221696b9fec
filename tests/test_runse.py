"""The SE of a run's statistic with the series' integrated autocorrelation time (vkit.measure.runse)."""

import math

import numpy as np
import pytest

from vkit.measure.runse import integrated_autocorrelation, log_se, run_log_se


def ar1(phi: float, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    e = rng.standard_normal(n)
    x = np.empty(n)
    x[0] = e[0] / math.sqrt(1 - phi * phi)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + e[i]
    return x


def test_tau_of_independent_values_is_about_one():
    taus = [integrated_autocorrelation(np.random.default_rng(s).standard_normal(2000)) for s in range(20)]
    assert 0.8 < float(np.median(taus)) < 1.25


def test_tau_of_an_ar1_series_is_its_known_value():
    # AR(1) with φ = 0.8: τ = (1 + φ) / (1 - φ) = 9
    taus = [integrated_autocorrelation(ar1(0.8, 20000, s)) for s in range(10)]
    assert float(np.median(taus)) == pytest.approx(9.0, rel=0.15)


def test_a_constant_series_has_tau_one():
    assert integrated_autocorrelation(np.full(500, 3.0)) == 1.0


def test_se_of_a_mean_matches_the_spread_across_runs_of_a_correlated_series():
    # positive values: exp of a scaled AR(1); the SE of log(mean) each run claims against the spread
    # of log(mean) over independent runs
    runs = [np.exp(0.3 * ar1(0.9, 1000, s)) for s in range(200)]
    spread = float(np.std([math.log(r.mean()) for r in runs], ddof=1))
    claimed = float(np.sqrt(np.mean([log_se(r.tolist(), "mean") ** 2 for r in runs])))
    assert claimed == pytest.approx(spread, rel=0.2)
    # without the autocorrelation it would claim about sqrt(τ = 19) ≈ 4.4 times less
    naive = float(np.median([r.std(ddof=1) / (r.mean() * math.sqrt(r.size)) for r in runs]))
    assert claimed > 3 * naive


def test_se_of_a_percentile_matches_the_spread_across_runs_of_a_correlated_series():
    # 400 values correlated over about 39 (τ of AR(1) at φ = 0.95): ten batches of 40 would be
    # correlated with each other, and batch means claimed 0.40 where the runs spread by 0.61
    runs = [np.exp(0.5 * ar1(0.95, 400, 100 + s)) for s in range(200)]
    spread = float(np.std([math.log(np.percentile(r, 95)) for r in runs], ddof=1))
    claimed = float(np.sqrt(np.mean([log_se(r.tolist(), "p95") ** 2 for r in runs])))
    assert claimed == pytest.approx(spread, rel=0.2)


def test_too_few_values_or_an_unknown_statistic_give_none():
    assert log_se([1.0] * 99, "p95") is None
    assert log_se([1.0 + i for i in range(200)], "p42") is None
    out = run_log_se({"ttft": [1.0 + (i % 7) for i in range(300)], "tpot": [0.5] * 10})
    assert set(out) == {f"{s}_ttft_ms" for s in ("mean", "median", "p50", "p90", "p95", "p99")}
