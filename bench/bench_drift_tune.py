#!/usr/bin/env python3
"""Does the sentinel level check (``drift.level_check``) catch a level change inside one tune, and how
often does it cry wolf? Seeded simulated tunes of the kept configuration, no server involved.

Noise model, on natural logs: every server start has its own level (sd b, between restarts) and
every run its own noise (sd w, within one process): w = 2 %, b = 1.5 % (realistic), with b = 0 and
b = 3 % as sensitivity rows. A tune's kept configuration, in time order:

    baseline: 2 starts x 2 runs
    check 1: sentinel, 1 run on a fresh start
    confirmation: 2 starts x 2 runs (the A arms of B A A B blocks), then check 2, and so on
    up to check 4 (confirmations before checks 2, 3 and 4)

At each check, ``level_check(baseline + confirmations so far, [sentinel], checks=4)``; the first
alarm ends the tune. Rows: no change (the false-alarm rate over the whole tune, target <= 5 %, with
its one-sided 95 % Clopper-Pearson upper bound), and a step of -3 %, -5 % or -10 % from check 2 on
(the sentinel of check 2 and every later run are shifted; so are the confirmations before checks 3
and 4): the rate of alarms by the last check at or after the change, the mean delay in checks (0 =
at check 2), and alarms at check 1 (before the change). The same tunes are judged by the existing
``detect()`` (CUSUM, sigma estimated, as the tune's sentinel calls it) on the flattened series of
all kept runs so far (5, 10, 15, 20 runs at checks 1-4): it answers "too short" below 12 runs, so it
can only judge checks 3 and 4.

Both are computed batched (the functions ``level_check`` and ``detect`` call); a spot check runs the
public functions on the first tunes of every row and the bench stops if a verdict differs.

Writes bench/results/drift_tune.json. Run: python3 bench/bench_drift_tune.py [--tunes 4000]
[--seed 20260201] (about 10 s on 2 cores).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time

import numpy as np
from scipy import stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness import write_result  # noqa: E402

from vkit.decide import drift as vd  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results", "drift_tune.json")
W = 0.02
BETWEEN = (0.015, 0.0, 0.03)
SHIFTS = (0.0, -0.03, -0.05, -0.10)
CHECKS = 4
CHANGE_AT = 2  # the first shifted check (1-based)
ALPHA = vd.FALSE_ALARM
SPOT = 25  # tunes per row run through the public functions


def layout(checks: int = CHECKS) -> tuple[list[tuple[str, int, int]], list[int]]:
    """The tune's starts in time order as (kind, first column, runs), and the column of each check's
    sentinel. Kinds: "ref" (baseline or confirmation start) or "sentinel"."""
    starts: list[tuple[str, int, int]] = []
    col = 0
    sentinels = []
    for _check in range(checks):
        for _ in range(2):  # the baseline before check 1, a confirmation before every later check
            starts.append(("ref", col, 2))
            col += 2
        starts.append(("sentinel", col, 1))
        sentinels.append(col)
        col += 1
    return starts, sentinels


def simulate(rng: np.random.Generator, tunes: int, w: float, b: float, shift: float) -> np.ndarray:
    """(tunes, runs) log values in time order; the step starts at check CHANGE_AT's sentinel."""
    starts, sentinels = layout()
    n = starts[-1][1] + starts[-1][2]
    u = rng.normal(0.0, 1.0, (tunes, len(starts))) * b
    y = rng.normal(0.0, w, (tunes, n))
    for i, (_kind, c0, k) in enumerate(starts):
        y[:, c0:c0 + k] += u[:, [i]]
    y[:, sentinels[CHANGE_AT - 1]:] += math.log1p(shift)
    return y


def reference_at(check: int) -> tuple[list[int], tuple[int, ...]]:
    """Columns and group sizes of the reference at a check (1-based): baseline and confirmations."""
    starts, _s = layout()
    refs = [s for s in starts if s[0] == "ref"][: 2 * check]
    return [c for _k, c0, k in refs for c in range(c0, c0 + k)], tuple(k for _k, _c, k in refs)


def level_alarms(y: np.ndarray, seed: int) -> tuple[np.ndarray, list[float]]:
    """(tunes, checks) bool: level_check's verdict at each check; and the threshold at each check."""
    _starts, sentinels = layout()
    out = np.zeros((y.shape[0], CHECKS), dtype=bool)
    thresholds = []
    for j in range(1, CHECKS + 1):
        cols, sizes = reference_at(j)
        thr, _q = vd._level_threshold(sizes, 1, CHECKS, ALPHA, 20000, seed)
        t, _d, _w, _b = vd._level_t(y[:, cols], sizes, y[:, [sentinels[j - 1]]])
        out[:, j - 1] = np.abs(t) > thr
        thresholds.append(thr)
    return out, thresholds


def detect_alarms(y: np.ndarray) -> np.ndarray:
    """(tunes, checks) bool: detect()'s verdict (CUSUM, σ estimated) on all kept runs up to each
    check's sentinel; False where the series is shorter than MIN_RUNS (too short)."""
    _starts, sentinels = layout()
    out = np.zeros((y.shape[0], CHECKS), dtype=bool)
    for j, col in enumerate(sentinels):
        length = col + 1
        if length < vd.MIN_RUNS:
            continue
        st, m, _s = vd.statistics(y[:, :length], None)
        h, _cal = vd.threshold(vd.DEFAULT_DETECTOR, length, False)
        out[:, j] = (st[vd.DEFAULT_DETECTOR][:, m:] > h).any(axis=1)
    return out


def spot_check(y: np.ndarray, lvl: np.ndarray, det: np.ndarray, seed: int) -> None:
    """The public functions on the first SPOT tunes must give the batched verdicts."""
    _starts, sentinels = layout()
    vals = np.exp(y[:SPOT]) * 650.0
    for i in range(len(vals)):
        for j in range(1, CHECKS + 1):
            cols, sizes = reference_at(j)
            ref = np.split(vals[i, cols], np.cumsum(sizes)[:-1])
            r = vd.level_check([list(g) for g in ref], [float(vals[i, sentinels[j - 1]])], checks=CHECKS, alpha=ALPHA, seed=seed)
            d = vd.detect(list(vals[i, : sentinels[j - 1] + 1]))
            if r["changed"] != bool(lvl[i, j - 1]) or d["changed"] != bool(det[i, j - 1]):
                raise SystemExit(f"spot check failed: tune {i}, check {j}")


def summarise(alarm: np.ndarray, shift: float) -> dict:
    """The first alarm ends the tune: rates and delays from the first True per row."""
    n = alarm.shape[0]
    fired = alarm.any(axis=1)
    first = np.where(fired, alarm.argmax(axis=1) + 1, 0)  # 1-based check of the first alarm, 0 = none
    by_check = [int(((first > 0) & (first <= j)).sum()) for j in range(1, CHECKS + 1)]
    row: dict = {"tunes": n, "alarms_by_check": by_check, "alarm_rate_by_check": [k / n for k in by_check]}
    if shift == 0.0:
        k = int(fired.sum())
        row.update({"false_alarms": k, "false_alarm_rate": k / n,
                    "false_alarm_upper95": float(stats.beta.ppf(0.95, k + 1, n - k)) if k < n else 1.0})
    else:
        early = int((first == 1).sum()) if CHANGE_AT > 1 else 0
        hit = first >= CHANGE_AT
        k = int(hit.sum())
        row.update({"alarms_before_change": early, "detected": k, "detection_rate": k / n,
                    "detection_lower95": float(stats.beta.ppf(0.05, k, n - k + 1)) if k > 0 else 0.0,
                    "mean_delay_checks": float((first[hit] - CHANGE_AT).mean()) if k else None})
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Writes bench/results/drift_tune.json (or --out).")
    p.add_argument("--tunes", type=int, default=4000, help="simulated tunes per row (default 4000; at least 2000 for the report)")
    p.add_argument("--seed", type=int, default=20260201, help="seed of the simulated tunes (default 20260201)")
    p.add_argument("--out", default=OUT, help="where to write the JSON (default bench/results/drift_tune.json)")
    a = p.parse_args(argv)
    t0 = time.time()
    seq = np.random.SeedSequence(a.seed)
    rows = []
    thresholds = None
    row_seeds = seq.spawn(len(BETWEEN) * len(SHIFTS))
    for i, (b, shift) in enumerate((b, s) for b in BETWEEN for s in SHIFTS):
        rng = np.random.default_rng(row_seeds[i])
        y = simulate(rng, a.tunes, W, b, shift)
        lvl, thresholds = level_alarms(y, vd.CALIBRATION_SEED)
        det = detect_alarms(y)
        spot_check(y, lvl, det, vd.CALIBRATION_SEED)
        row = {"within": W, "between": b, "shift": shift, "level_check": summarise(lvl, shift), "detect": summarise(det, shift)}
        rows.append(row)
        lc, dt = row["level_check"], row["detect"]
        if shift == 0.0:
            print(f"b={b:.3f} no change: level_check false alarms {lc['false_alarm_rate']:.2%} (upper95 "
                  f"{lc['false_alarm_upper95']:.2%}); detect {dt['false_alarm_rate']:.2%}")
        else:
            print(f"b={b:.3f} shift {shift:+.0%}: level_check detects {lc['detection_rate']:.1%} (delay "
                  f"{lc['mean_delay_checks'] if lc['mean_delay_checks'] is None else round(lc['mean_delay_checks'], 2)}); "
                  f"detect {dt['detection_rate']:.1%}")
    _starts, sentinels = layout()
    doc = {
        "benchmark": "drift_tune",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}, numpy {np.__version__}",
        "command": f"python3 bench/bench_drift_tune.py --tunes {a.tunes} --seed {a.seed}",
        "wall_s": round(time.time() - t0, 1),
        "design": {
            "checks": CHECKS, "change_at_check": CHANGE_AT, "alpha_over_tune": ALPHA, "false_alarm_per_check": ALPHA / CHECKS,
            "reference_sizes_by_check": [list(reference_at(j)[1]) for j in range(1, CHECKS + 1)],
            "latest_runs": 1, "level_thresholds_by_check": thresholds,
            "detect_series_runs_by_check": [c + 1 for c in sentinels], "detect_min_runs": vd.MIN_RUNS,
            "detect": f"{vd.DEFAULT_DETECTOR}, sigma estimated (as the tune's sentinel calls it)",
            "noise": "log y = level + start effect N(0, b^2) + run noise N(0, w^2)",
            "spot_checked_tunes_per_row": SPOT,
        },
        "targets": {"false_alarm_over_tune": f"<= {ALPHA:.2f}"},
        "rows": rows,
    }
    write_result(a.out, doc, "drift_tune", indent=1)
    print(f"wrote {os.path.relpath(a.out, ROOT)} in {doc['wall_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
