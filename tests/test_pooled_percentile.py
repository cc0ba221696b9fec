"""A load's percentile over all its runs' requests, from each run's own p50/p90/p95/p99
(vkit.tune.pooled), and the capacity model's use of it (vkit.tune.capsearch.pooled_shifts)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vkit.measure.summary import describe_ms
from vkit.tune import capacity as cap
from vkit.tune import pooled
from vkit.tune.capsearch import pooled_shifts

pytestmark = pytest.mark.unit


def summary_of(ttft_s: np.ndarray) -> dict:
    return {"completed": len(ttft_s), **describe_ms(ttft_s, "ttft")}


def test_the_cdf_passes_through_the_runs_own_percentiles_and_is_clipped_beyond_them():
    q = {50: 10.0, 90: 20.0, 95: 40.0, 99: 80.0}
    for p, v in q.items():
        assert pooled.run_cdf(q, v) == pytest.approx(p / 100)
    assert pooled.run_cdf(q, math.sqrt(20.0 * 40.0)) == pytest.approx(0.925)  # linear in log latency
    assert pooled.run_cdf(q, 1e-3) == 0.0 and pooled.run_cdf(q, 1e6) == 1.0


def test_identical_runs_pool_to_their_own_percentile_and_one_run_is_not_shifted():
    q = {50: 10.0, 90: 20.0, 95: 40.0, 99: 80.0}
    assert pooled.pooled_percentile([(100, q), (300, q)], 95) == pytest.approx(40.0, rel=1e-9)
    assert pooled.pooled_shift([(100, q)], 95) == 0.0


def test_the_pooled_p95_of_two_runs_is_close_to_the_p95_of_their_requests_together():
    rng = np.random.default_rng(3)
    a, b = rng.lognormal(np.log(0.05), 0.4, 800), rng.lognormal(np.log(0.08), 0.4, 400)
    runs = [(len(x), pooled.quantiles(summary_of(x), "ttft")) for x in (a, b)]
    exact = float(np.percentile(np.concatenate([a, b]), 95)) * 1000
    got = pooled.pooled_percentile(runs, 95)
    assert got == pytest.approx(exact, rel=0.03)
    # and not the mean of the runs' logs, which sits lower
    assert math.exp(np.mean([math.log(q[95]) for _, q in runs])) < exact * 0.95


def test_a_run_without_usable_percentiles_has_none_and_keys_parse():
    assert pooled.quantiles({"p50_ttft_ms": 5.0, "p90_ttft_ms": 6.0, "p95_ttft_ms": 7.0}, "ttft") is None
    assert pooled.quantiles({"p50_ttft_ms": 5.0, "p90_ttft_ms": 4.0, "p95_ttft_ms": 7.0, "p99_ttft_ms": 8.0}, "ttft") is None
    assert pooled.percentile_key("p95_ttft_ms") == (95, "ttft") and pooled.percentile_key("median_e2el_ms") == (50, "e2el")
    assert pooled.percentile_key("mean_tpot_ms") is None and pooled.percentile_key("p97_ttft_ms") is None


def test_the_model_moves_a_loads_mean_margin_to_the_pooled_percentiles_margin():
    rng = np.random.default_rng(5)
    slo, plan = cap.Slo({"p95_ttft_ms": 100.0, "mean_tpot_ms": 50.0}), cap.Plan()
    runs = []
    for scale in (0.04, 0.07, 0.05):
        x = rng.lognormal(np.log(scale), 0.5, 600)
        s = {**summary_of(x), "failed": 0, "mean_tpot_ms": 10.0, "vkit": {"dispatch_lag_ms": {"p99": 0.1}}}
        runs.append((x, cap.judge_run(s, slo, plan)))
    shift = pooled_shifts([r for _, r in runs])
    assert set(shift) == {"p95_ttft_ms"}  # a mean is not a percentile
    moved = np.mean([r["margins"]["p95_ttft_ms"] for _, r in runs]) + shift["p95_ttft_ms"]
    exact = math.log(100.0 / (float(np.percentile(np.concatenate([x for x, _ in runs]), 95)) * 1000))
    assert moved == pytest.approx(exact, abs=0.03)
    assert shift["p95_ttft_ms"] < -0.03  # the runs' own logs averaged above the pooled margin
    assert pooled_shifts([runs[0][1]]) == {}
