#!/usr/bin/env python3
"""How close is the simulator to measured vLLM runs, uncalibrated and calibrated?

Reads the measured runs in ``../shared/calibration/vllm_measured_runs.csv`` (or ``--runs``), runs
the whole ``sim_calibrate`` path on them and writes ``bench/results/fidelity.json``: per metric
(mean TTFT, mean TPOT) the MAPE and signed bias of the default simulator and of the calibrated one,
on the fitted rows, on 5-fold held-out rows and on leave-one-group-out held-out rows (group =
model/GPU/precision/TP), the same per group, the fitted parameters with their standard errors, and
the worst held-out rows with their simulated regime. The fitted profile goes to
``bench/results/fidelity_profile.json``. Targets on held-out rows: TTFT MAPE <= 15 %, TPOT <= 8 %.

Usage: python3 bench/bench_fidelity.py [--runs FILE.csv ...] [--folds 5] [--worst 10]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness import write_result  # noqa: E402

from vkit.sim.calibrate import FREE, calibrate  # noqa: E402
from vkit.sim.calibrated import write_profile  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "fidelity.json")
PROFILE = os.path.join(ROOT, "bench", "results", "fidelity_profile.json")
DEFAULT_RUNS = os.path.join(os.path.dirname(ROOT), "shared", "calibration", "vllm_measured_runs.csv")
TARGETS = {"ttft": 15.0, "tpot": 8.0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", nargs="+", default=[DEFAULT_RUNS])
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--worst", type=int, default=10)
    ap.add_argument("--ramp-steps", default="0,20,40,80", help="closed-loop ramps to try (see sim_calibrate)")
    ap.add_argument("--free", default=",".join(FREE), help="parameters to fit (see sim_calibrate)")
    ap.add_argument("--out", default=RESULTS, help="result file (default: bench/results/fidelity.json)")
    args = ap.parse_args()
    missing = [p for p in args.runs if not os.path.exists(p)]
    if missing:
        print(f"bench_fidelity: skipped, no measured runs at {', '.join(missing)}", file=sys.stderr)
        return 0
    t0 = time.time()
    ramps = tuple(int(x) for x in args.ramp_steps.split(","))
    free = [n for n in args.free.split(",") if n]
    report, params, stderr = calibrate(args.runs, free, args.folds, "group", 6, 0,
                                       lambda m: print(f"bench_fidelity: {m}", file=sys.stderr, flush=True), ramps)
    write_profile(PROFILE if args.out == RESULTS else os.path.splitext(args.out)[0] + "_profile.json", params, stderr,
                  {"runs": args.runs},
                  workload={"closed_loop_ramp_steps": report["closed_loop_ramp_steps"] or None})

    def rel_err(row, which, metric):
        return (row[which][metric + "_s"] - row["measured"][metric + "_s"]) / row["measured"][metric + "_s"] * 100

    worst = []
    for metric in ("ttft", "tpot"):
        rows = [r for r in report["per_row"] if "logo" in r]
        rows.sort(key=lambda r: -abs(rel_err(r, "logo", metric)))
        for r in rows[:args.worst]:
            worst.append({"metric": metric, "run": r["run"], "measured_s": r["measured"][metric + "_s"],
                          "held_out_s": r["logo"][metric + "_s"], "held_out_err_pct": rel_err(r, "logo", metric),
                          "fitted_err_pct": rel_err(r, "fitted", metric), "regime": r["regime"],
                          "measured_regime": r["measured_regime"]})
    held = report.get("leave_group_out", {})
    out = {
        "bench": "fidelity",
        "runs": args.runs,
        "rows": report["rows"],
        "seconds": round(time.time() - t0, 1),
        "python": platform.python_version(),
        "targets_held_out_mape_pct": TARGETS,
        "met": {m: held.get(m, {}).get("mape_pct", 1e9) <= TARGETS[m] for m in TARGETS},
        "default": report["default"],
        "fitted": report["fitted"],
        "kfold": report.get("kfold"),
        "leave_group_out": held,
        "groups": report["groups"],
        "params": report["params"],
        "closed_loop_ramp_steps": report["closed_loop_ramp_steps"],
        "ramp_costs": report["ramp_costs"],
        "stderr": report["stderr"],
        "at_bound": report["at_bound"],
        "queue_bound_rows": report["queue_bound_rows"],
        "below_memory_floor": report.get("below_memory_floor", []),
        "worst_held_out_rows": worst,
        "argv": ["python3", "bench/bench_fidelity.py", "--ramp-steps", args.ramp_steps, "--free", args.free]
        + ([] if args.runs == [DEFAULT_RUNS] else ["--runs", *args.runs]),
    }
    write_result(args.out, out, "fidelity", sort_keys=True)
    for name in ("default", "fitted", "kfold", "leave_group_out"):
        d = out[name]
        if d:
            print(f"{name:16s} TTFT MAPE {d['ttft']['mape_pct']:5.1f}% bias {d['ttft']['bias_pct']:+5.1f}%   "
                  f"TPOT MAPE {d['tpot']['mape_pct']:5.1f}% bias {d['tpot']['bias_pct']:+5.1f}%")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
