"""queue_growth: whether the server's queue grew within one run, from the TTFT trend over send time
(a short run just above capacity ends before its P95 reaches the SLO; the trend shows it), checked
on a seeded FIFO single-server queue with Poisson arrivals and exponential service (M/M/1), and its
place in bench_stream's summary."""

from __future__ import annotations

import numpy as np
import pytest

from vkit.measure.summary import queue_growth

pytestmark = pytest.mark.unit

SEEDS = range(100)


def mm1(rho: float, n: int, seed: int, service_s: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """Send times and time in system (waiting + service, the TTFT of a server that answers when
    served) of ``n`` requests arriving as a Poisson process at utilisation ``rho`` at one FIFO
    server with exponential service of mean ``service_s``, starting empty."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(service_s / rho, n))
    service = rng.exponential(service_s, n)
    departures = np.empty(n)
    free = 0.0
    for i in range(n):
        free = max(arrivals[i], free) + service[i]
        departures[i] = free
    return arrivals, departures - arrivals


def flagged(rho: float, n: int = 2000) -> int:
    return sum(queue_growth(*mm1(rho, n, seed))["growing"] for seed in SEEDS)


def test_a_stationary_queue_at_utilisation_0_9_is_not_growing():
    """Its TTFTs wander widely (long excursions), which an ordinary-SE trend test would call
    growing in most runs. Expected 4.5 % of runs flagged (400 seeds); these 100 seeds: 4."""
    assert flagged(0.9) <= 8


def test_a_queue_at_utilisation_1_05_is_growing():
    """Expected 84 % of runs of 2,000 requests flagged (400 seeds); these 100 seeds: 85."""
    assert flagged(1.05) >= 75


def test_a_queue_at_utilisation_1_02_is_growing_in_most_runs_of_2000_requests():
    """2 % over capacity: the queue's drift over 2,000 requests (~40) is smaller than its random walk
    (~60), so some runs end with the queue shorter than it started and no trend test can flag them;
    expected 59 % flagged (400 seeds), against 4.5 % at 0.9; these 100 seeds: 56."""
    assert flagged(1.02) >= 50


def test_one_run_above_capacity_reports_its_rise():
    g = queue_growth(*mm1(1.05, 2000, seed=1))
    assert g["growing"] is True and g["n"] == 2000
    assert g["late_ms"] > 2 * g["early_ms"] and g["late_over_early"] == pytest.approx(g["late_ms"] / g["early_ms"])
    assert g["slope_ms_per_s"] > 3 * g["slope_se_ms_per_s"] and g["theil_sen_ms_per_s"] > 0
    assert g["rise_ms"] == pytest.approx(g["slope_ms_per_s"] * g["window_s"])


def test_a_constant_latency_run_is_not_growing():
    g = queue_growth([i * 0.1 for i in range(200)], [0.05] * 200)
    assert g is not None and g["growing"] is False
    assert g["slope_ms_per_s"] == 0.0 and g["late_over_early"] == 1.0


def test_a_significant_but_immaterial_drift_is_not_growing():
    """50 → 52 ms over the run, with 0.5 ms of noise: a real trend (both t far above 3) but not a
    queue growing."""
    t = np.arange(1000) * 0.1
    noise = np.random.default_rng(0).normal(0.0, 0.0005, t.size)
    g = queue_growth(t, 0.050 + 0.002 * t / t[-1] + noise)
    assert g["t"] > 10 and g["batch_t"] > 3 and g["growing"] is False


def test_a_steady_linear_rise_is_growing():
    """TTFT up 10 ms per second of sending, without noise: 99 ms over 9.9 s, from 66 ms early."""
    t = np.arange(100) * 0.1
    g = queue_growth(t, 0.05 + 0.01 * t)
    assert g["growing"] is True and g["rise_ms"] == pytest.approx(99.0)


def test_fewer_than_20_requests_is_not_enough_to_tell():
    t = np.arange(19) * 0.1
    assert queue_growth(t, 0.05 + t) is None
    assert queue_growth(np.arange(20) * 0.1, 0.05 + np.arange(20) * 0.1) is not None


def test_the_summary_carries_queue_growth_over_the_successful_measured_requests():
    from vkit.measure import loadgen as bench
    from vkit.measure.client import Result
    from vkit.measure.datasets import Request

    start, ttft = mm1(1.5, 300, seed=3)
    reqs = [Request(i, prompt=[1] * 8, input_len=8, output_len=4, ignore_eos=True) for i in range(301)]
    cfg = bench.BenchConfig(url="http://x", requests=reqs, max_concurrency=None)
    t0 = 1000.0

    def result(i: int, s: float, ft: float, ok: bool = True) -> Result:
        r = Result(index=i, ok=ok, status=200 if ok else 500, start=t0 + s, ttft=ft if ok else None,
                   latency=ft + 0.03 if ok else None, done=ft + 0.031 if ok else None, itl=[0.01] * 3, events=4,
                   prompt_tokens=8, completion_tokens=4, event_times=[ft + 0.01 * k for k in range(4)],
                   error=None if ok else "HTTP 500")
        r.request = reqs[i]
        return r

    results = [result(i, s, ft) for i, (s, ft) in enumerate(zip(start, ttft, strict=True))] + [result(300, 5.0, 0.0, ok=False)]
    warm = [result(0, -1.0, 9.0)]  # a warm-up with a huge TTFT: not measured
    s, _ = bench.summarize(cfg, "m", results, warm, t0, t0 + start[-1] + 60, False, None, extra={})
    g = s["vkit"]["queue_growth"]
    alone = queue_growth(start, ttft)  # relative send times: the same trend
    assert set(g) == set(alone) and g["slope_ms_per_s"] == pytest.approx(alone["slope_ms_per_s"])
    assert g["n"] == 300 and g["growing"] is True
