#!/usr/bin/env python3
"""One capacity gauge inside tune: what the tune's searches cost against the bracket they replaced,
and whether their intervals hold the truth with the tune's own plan.

Two parts, each writing its own section of bench/results/tune_capacity_gauge.json:

- ``tunes``: whole twin-guided tunes in virtual time (``bench_capacity_tune.tune``: the hidden world,
  ``tune --virtual --search twin --max-restarts 8``, seeds 11, 12, ...), each tune's request-seconds
  (requests over the offered rate, summed over every capacity search it made: baseline, trials,
  confirmations; and over the promise's runs), restarts, the recommendation over the best and the
  promise over the steady truth. ``--tree DIR`` runs another checkout's tune (the revision before the
  bracket was deleted, for the ratio); its rows go under ``--label``. The ratio of the medians per
  scenario is written when both ``bracket`` and ``model`` rows are there.
- ``searches``: the capacity searches of ``bench_capacity_interval`` (its scenarios, truths and
  simulator noise) with tune's own plan (tune's parser and defaults) started as a tune starts them: at
  a reference load (the first baseline search's capacity: the truth times a factor drawn in [0.7, 1.4])
  with a hint (the configuration's last estimate or the twin's prediction: the truth times exp(N(0,
  0.1))). Scored as bench_capacity_interval scores: coverage of the 95 % interval, |error|, request-seconds,
  and how many searches said the level moved during them (``vkit.tune.capanchor``: false alarms here).
  ``--slowdown F`` makes the server F times slower from the search's fifth run on (every step-time
  term of the cost model scaled by F): those rows go under ``drift`` and count the searches that
  caught the change, and the error of those that did not.

Run: python3 bench/bench_tune_capacity_gauge.py tunes [--scenarios a,b] [--seeds 2] [--tree DIR --label bracket]
     python3 bench/bench_tune_capacity_gauge.py searches [--searches 40] [--scenarios a,b] [--jobs 2] [--slowdown 1.25]
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import multiprocessing as mp
import os
import random
import sys
import time
from dataclasses import replace

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import bench_capacity_interval as bci  # noqa: E402
import bench_capacity_tune as _bct  # noqa: E402
from harness import revision  # noqa: E402

from vkit.sim.calibrated import CostParams  # noqa: E402
from vkit.sim.predict import bench_summary  # noqa: E402
from vkit.state import atomic_write_text  # noqa: E402
from vkit.tune import capacity as cap  # noqa: E402
from vkit.tune import capmeasure, capsearch  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results", "tune_capacity_gauge.json")
TUNE_SCENARIOS = ("8b-h200-chat", "70b-h100x4", "8b-h200-tpot-knee")
SLOW_AFTER = 4  # --slowdown: the runs after this many are on the slower server


def slower(f: float) -> CostParams | None:
    """The cost model's defaults with every step-time term f times slower (None: f = 1, as built in)."""
    if f == 1.0:
        return None
    p = CostParams()
    return replace(p, mfu=p.mfu / f, mbu=p.mbu / f, decode_step_overhead_s=p.decode_step_overhead_s * f,
                   mixed_step_overhead_s=p.mixed_step_overhead_s * f, per_req_overhead_s=p.per_req_overhead_s * f)


def request_seconds(work: str) -> dict:
    """A tune's request-seconds under ``work`` (its state folder): every capacity search's (its
    document's ``request_seconds``) and the promise's runs' (completed over the offered rate)."""
    search, n = 0.0, 0
    for f in glob.glob(os.path.join(work, "runs", "run-*", "*", "rep*.json")):
        c = ((json.load(open(f)).get("vkit") or {}).get("capacity") or {})
        if isinstance(c.get("request_seconds"), (int, float)):
            search += c["request_seconds"]
            n += 1
    promise = 0.0
    for f in glob.glob(os.path.join(work, "runs", "run-*", "promise", "*", "rep*.json")):
        d = json.load(open(f))
        if isinstance(d.get("request_rate"), (int, float)) and d["request_rate"] > 0:
            promise += (d.get("completed") or 0) / d["request_rate"]
    return {"searches": n, "search_request_s": search, "promise_request_s": promise}


def _tree_bench(tree: str):
    """The other checkout's own bench_capacity_tune (its tune flags and its bin/tune), loaded apart."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tree_bench_capacity_tune", os.path.join(tree, "bench", "bench_capacity_tune.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.join(tree, "bench"))
    spec.loader.exec_module(mod)
    return mod


def tunes(a) -> int:
    bct = _bct if os.path.abspath(a.tree) == ROOT else _tree_bench(os.path.abspath(a.tree))
    doc = json.load(open(a.out)) if os.path.exists(a.out) else {}
    part = doc.setdefault("tunes", {})
    rev = revision() if os.path.abspath(a.tree) == ROOT else _tree_revision(a.tree)
    rows = []
    for name in a.scenarios.split(","):
        name += "+hidden"
        sc = bct.scenario(name)
        t = bct.steady_truth(name, sc)
        for seed in range(11, 11 + a.seeds):
            work = os.path.join(a.work, a.label)
            t0 = time.time()
            r = bct.score(bct.tune(name, sc, work, virtual=True, seed=seed, search="twin", max_restarts=8), sc, t, 1.0)
            cost = request_seconds(os.path.join(work, "twin", f"seed{seed}", name))
            row = {"scenario": name, "seed": seed, "restarts": r.get("restarts"), "ratio_to_best": r.get("ratio_to_best"),
                   "promise_over_truth": r.get("promise_over_truth"), "broken_afresh": (r.get("fresh") or {}).get("breaks"),
                   "cpu_s": round(time.time() - t0, 1), **cost, "error": r.get("error")}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    part[a.label] = {"revision": rev, "tree": "this checkout" if os.path.abspath(a.tree) == ROOT else
                     "another checkout at that revision (its own bench_capacity_tune flags and bin/tune)",
                     "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": rows}
    if "bracket" in part and "model" in part:
        part["ratio"] = ratio(part["bracket"]["rows"], part["model"]["rows"])
    _write(a.out, doc)
    return 0


def ratio(bracket: list[dict], model: list[dict]) -> dict:
    """Per scenario and in all: the model's median request-seconds (searches and promise) over the
    bracket's, and the medians beside each other."""
    def total(r):
        return r["search_request_s"] + r["promise_request_s"]

    out = {}
    for name in sorted({r["scenario"] for r in model} & {r["scenario"] for r in bracket}):
        b = [r for r in bracket if r["scenario"] == name]
        m = [r for r in model if r["scenario"] == name]
        out[name] = {
            "search_request_seconds": {"bracket": float(np.median([r["search_request_s"] for r in b])),
                                       "model": float(np.median([r["search_request_s"] for r in m]))},
            "total_request_seconds": {"bracket": float(np.median([total(r) for r in b])),
                                      "model": float(np.median([total(r) for r in m]))},
            "restarts": {"bracket": float(np.median([r["restarts"] for r in b])), "model": float(np.median([r["restarts"] for r in m]))},
            "promise_over_truth": {"bracket": float(np.median([r["promise_over_truth"] or 0 for r in b])),
                                   "model": float(np.median([r["promise_over_truth"] or 0 for r in m]))},
            "ratio_to_best": {"bracket": float(np.median([r["ratio_to_best"] or 0 for r in b])),
                              "model": float(np.median([r["ratio_to_best"] or 0 for r in m]))},
        }
        out[name]["search_request_seconds_ratio_to_bracket"] = (out[name]["search_request_seconds"]["model"]
                                                               / out[name]["search_request_seconds"]["bracket"])
        out[name]["total_request_seconds_ratio_to_bracket"] = (out[name]["total_request_seconds"]["model"]
                                                              / out[name]["total_request_seconds"]["bracket"])
    return out


def _tree_revision(tree: str) -> str | None:
    import subprocess

    p = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return p.stdout.strip() or None


# -- searches with the tune's plan ----------------------------------------------------------------
def tune_plan(start: float) -> cap.Plan:
    """The plan ``tune`` searches a capacity with (its parser's defaults), from ``start``."""
    from vkit.cli import _tuneargs
    from vkit.cli.tune import build_parser

    args = build_parser().parse_args(["--sandbox", "--capacity-start", f"{start:g}"])
    return _tuneargs.capacity_objective(args, {"p95_ttft_ms": 1000.0}).plan


def one_search(job) -> dict:
    name, rep, truth, slowdown = job
    sc = bci.SCENARIOS[name]
    rng = random.Random(f"{name}:{rep}")
    reference = truth * math.exp(rng.uniform(math.log(0.7), math.log(1.4)))
    hint = truth * math.exp(rng.gauss(0.0, 0.1))
    base = tune_plan(reference)
    plan = cap.Plan(**{**vars(base), "keep_up": bci.KEEP_UP})
    count = [0]

    def measure(load: float, k: int, n: int | None = None) -> dict:
        count[0] += 1
        n = n or max(100, math.ceil(load * plan.point_seconds))
        return bench_summary(bci.scenario(sc, load, n, seed=2_000_000 * (rep + 1) + count[0], noise=bci.NOISE,
                                          key=f"{name}:tune:{rep}:{count[0]}"),
                             slower(slowdown) if count[0] > SLOW_AFTER else None)

    # as capmeasure.measure_configuration starts a warm search: steps of 1.25 from the reference, the hint second
    p = cap.Plan(**{**vars(plan), "start": plan.snap(reference), "step": max(1.25, 1 + 2 * plan.tolerance)})
    t0 = time.time()
    res = capsearch.search(measure, cap.Slo(dict(sc["slo"])), p, hint=hint)
    d = res.as_dict()
    drift = d.get("drift") or {}
    # the anchor's extra run (the check's price): the search's last run when it is at the anchor past the plan's most
    last = max(((q.load, r) for q in res.points for r in q.runs if r.get("order") is not None), key=lambda x: x[1]["order"])
    extra = d["runs"] > p.max_runs and drift.get("load") == last[0] and last[1]["valid"]
    check_s = float(last[1]["metrics"].get("completed", 0) / last[0]) if extra else 0.0
    est, sd = capmeasure.estimate(d, p)
    return {"scenario": name, "rep": rep, "reference": reference, "hint": hint, "estimate": d["capacity"],
            "lo": d["interval"][0], "hi": d["interval"][1], "slo_capacity": est, "sd": sd, "runs": d["runs"],
            "points": d["points"], "requests": d["requests"], "request_seconds": d.get("request_seconds"),
            "binding": d["binding_slo"], "stop": d["stop"], "cpu_s": time.time() - t0,
            "level_moved": bool(drift.get("moved")), "anchor_z": drift.get("z"), "check_request_seconds": check_s}


def searches(a) -> int:
    doc = json.load(open(a.out)) if os.path.exists(a.out) else {}
    part = doc.setdefault("searches", {}) if a.slowdown == 1.0 else doc.setdefault("drift", {})
    with mp.Pool(a.jobs) as pool:
        for name in a.scenarios.split(","):
            truth = bci.cached_truth(name)
            t0 = time.time()
            rows = []
            for k, r in enumerate(pool.imap_unordered(one_search, [(name, i, truth, a.slowdown) for i in range(a.searches)]), 1):
                rows.append(r)
                if k % 10 == 0 or k == a.searches:
                    el = time.time() - t0
                    print(f"  {name}: {k}/{a.searches} searches, {el:.0f} s, ETA {el / k * (a.searches - k):.0f} s",
                          file=sys.stderr)
            s = bci.score(rows, truth)
            moved = sum(r["level_moved"] for r in rows)
            if a.slowdown != 1.0:
                # the truth of the slower server: the search's later runs see it (its first four, the faster one)
                missed = [r for r in rows if not r["level_moved"] and r["estimate"]]
                part[f"{name}@{a.slowdown:g}"] = {
                    "revision": revision(), "slowdown": a.slowdown, "slow_after_runs": SLOW_AFTER, "searches": len(rows),
                    "caught": moved, "truth_before": truth,
                    "median_estimate_over_truth_before_when_missed": float(np.median([r["estimate"] / truth for r in missed]))
                    if missed else None,
                    "median_anchor_z": float(np.median([r["anchor_z"] for r in rows if r["anchor_z"] is not None]))}
                print(json.dumps({name: part[f"{name}@{a.slowdown:g}"]}, indent=1), file=sys.stderr)
                _write(a.out, doc)
                continue
            s["level_moved"] = moved  # false alarms: the server did not change
            # the drift check's own price: its extra run's share of the searches' request-seconds
            s["check_share_of_request_seconds"] = float(sum(r["check_request_seconds"] for r in rows)
                                                        / max(sum(r["request_seconds"] or 0 for r in rows), 1e-9))
            prev = ((json.load(open(bci.OUT)).get("scenarios") or {}).get(name) or {}) if os.path.exists(bci.OUT) else {}
            bracket = (prev.get("bracket") or {}).get("median_request_seconds")
            part[name] = {"truth": truth, "revision": revision(), "plan": "tune's defaults (warm: reference and hint)",
                          **s, "coverage_ok": s["coverage"] is not None and 0.92 <= s["coverage"] <= 0.98,
                          "bracket_median_request_seconds_cold": bracket,
                          "request_seconds_ratio_to_cold_bracket": (s["median_request_seconds"] / bracket) if bracket else None}
            print(json.dumps({name: part[name]}, indent=1), file=sys.stderr)
            _write(a.out, doc)
    return 0


def _write(path: str, doc: dict) -> None:
    doc["benchmark"] = "tune_capacity_gauge"
    atomic_write_text(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="part", required=True)
    t = sub.add_parser("tunes", help="whole virtual tunes: request-seconds, restarts, promise")
    t.add_argument("--scenarios", default=",".join(TUNE_SCENARIOS))
    t.add_argument("--seeds", type=int, default=2)
    t.add_argument("--tree", default=ROOT, help="the checkout whose bin/tune runs (default this one)")
    t.add_argument("--label", default="model", help="the rows' key (default model; bracket for the revision before)")
    t.add_argument("--work", default=os.path.join(ROOT, "vkit-state", "bench-tune-capacity-gauge"))
    t.add_argument("--out", default=OUT)
    s = sub.add_parser("searches", help="searches with the tune's plan against bench_capacity_interval's truths")
    s.add_argument("--scenarios", default=",".join(bci.SCENARIOS))
    s.add_argument("--searches", type=int, default=40)
    s.add_argument("--jobs", type=int, default=2)
    s.add_argument("--slowdown", type=float, default=1.0, metavar="F",
                   help=f"the server F times slower after the search's first {SLOW_AFTER} runs (rows under 'drift')")
    s.add_argument("--out", default=OUT)
    a = ap.parse_args(argv)
    return tunes(a) if a.part == "tunes" else searches(a)


if __name__ == "__main__":
    sys.exit(main())
