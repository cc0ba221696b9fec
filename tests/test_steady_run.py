"""A capacity run judged on its steady state (``Scenario.steady``): a short open-loop run that starts
on an empty server and ends with the server draining reads latencies low, and a search built on
such runs puts the capacity high. The steady run leaves out two request lifetimes of warm-up and
keeps arrivals going, unmeasured, until its last measured request has finished."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vkit.sim.predict import Scenario, _steady_warmup, bench_summary

# long outputs, mean-TPOT-bound (bench_capacity_interval's tpot-long-output), at about its capacity
TPOT_BOUND = Scenario(model="llama-3.1-8b", gpu="H200", isl=256, osl=384, rate=24.6, num_prompts=450, exact_rate=True,
                      serve={"max_model_len": 1024, "max_num_batched_tokens": 8192, "max_num_seqs": 256})


def _mean_tpot(sc: Scenario, seeds=(501, 502)) -> float:
    return float(np.mean([bench_summary(dataclasses.replace(sc, seed=s))["mean_tpot_ms"] for s in seeds]))


def test_a_short_steady_run_reads_the_long_runs_tpot_and_a_plain_one_reads_it_low():
    long = bench_summary(dataclasses.replace(TPOT_BOUND, num_prompts=3000, steady=True, seed=9))["mean_tpot_ms"]
    plain = _mean_tpot(TPOT_BOUND)
    steady = _mean_tpot(dataclasses.replace(TPOT_BOUND, steady=True))
    assert plain < long * 0.97  # the gauge's old bias: more than 3 % low
    assert abs(steady / long - 1) < 0.015


def test_the_tail_is_not_measured_and_the_warm_up_covers_the_ramp():
    s = bench_summary(dataclasses.replace(TPOT_BOUND, num_prompts=300, steady=True))
    plain = bench_summary(dataclasses.replace(TPOT_BOUND, num_prompts=300))
    assert plain["completed"] == 270  # a tenth left out
    # two lifetimes (~3.5 s each at 24.6 req/s) are more than a tenth, at most half the run
    assert 150 <= s["completed"] < 270


@pytest.mark.parametrize("life, n, expect", [(1.0, 100, 20), (0.1, 100, 10), (10.0, 100, 50)])
def test_the_warm_up_is_two_lifetimes_at_least_a_tenth_at_most_half(life, n, expect):
    arrival = np.arange(n) * 0.1  # 10 req/s
    assert _steady_warmup(arrival, arrival + life, n // 10) == expect
