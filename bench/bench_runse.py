#!/usr/bin/env python3
"""Is a run's SE of a latency statistic honest? Each run's own SE of log(statistic) against the spread of
that log across independent runs of one scenario, for the integrated-autocorrelation SE the runs carry
(``vkit.measure.runse``) and for ten batch means (the estimator it replaced), on
bench_capacity_interval's cliff and smooth TTFT scenarios at 0.95 and 1.0 of their true capacities.

Noise-free runs of the virtual-time predictor (each from an idle server, the steady-state warm-up of
``vkit.sim.predict.bench_summary``), ``--runs`` arrival seeds per case. An honest SE's root mean square
over the runs is close to the runs' spread (part of the spread is between runs: each starts idle, which
no run sees in its own requests; the capacity model pools that part into its σ).

Writes bench/results/runse.json. Run: python3 bench/bench_runse.py [--runs 80] (about 2 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.bench_capacity_interval import SCENARIOS, cached_truth, scenario  # noqa: E402
from bench.harness import write_result  # noqa: E402
from vkit.measure.runse import log_se  # noqa: E402
from vkit.sim.predict import _steady_warmup, run_trace  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results", "runse.json")


def ttfts(sc) -> np.ndarray:
    """The measured requests' TTFTs (ms) in send order, as bench_summary measures them."""
    tr = run_trace(sc)
    end = tr.step_start + tr.durations
    w = _steady_warmup(tr.arrival_time, end[tr.token_steps[:, -1]], tr.warmup)
    return (end[tr.token_steps[w:]][:, 0] - tr.arrival_time[w:]) * 1000.0


def batch_means_se(a: np.ndarray, batches: int = 10) -> float:
    """The SE of log P95 from ten batch means (the estimator runse replaced)."""
    per = [float(np.percentile(b, 95)) for b in np.array_split(a, batches)]
    return float(np.std(np.log(per), ddof=1) / math.sqrt(batches))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=80, help="arrival seeds per case (default 80)")
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args(argv)
    if a.runs < 10:
        print("bench_runse: --runs must be at least 10", file=sys.stderr)
        return 2
    cases = []
    for name in ("cliff-seqs", "ttft-smooth"):
        truth = cached_truth(name)
        for share in (0.95, 1.0):
            for n in (280, 560):
                logs, own, bm = [], [], []
                for s in range(a.runs):
                    x = ttfts(scenario(SCENARIOS[name], truth * share, n, 5000 + s))
                    logs.append(math.log(float(np.percentile(x, 95))))
                    own.append(log_se(x.tolist(), "p95"))
                    bm.append(batch_means_se(x))
                case = {"scenario": name, "load_over_truth": share, "requests": n, "runs": a.runs,
                        "spread_log_p95": float(np.std(logs, ddof=1)),
                        "runse_rms": float(math.sqrt(np.mean(np.square(own)))),
                        "batch_means_rms": float(math.sqrt(np.mean(np.square(bm))))}
                print(json.dumps(case), file=sys.stderr)
                cases.append(case)
    write_result(a.out, {"statistic": "p95_ttft_ms", "cases": cases})
    return 0


if __name__ == "__main__":
    sys.exit(main())
