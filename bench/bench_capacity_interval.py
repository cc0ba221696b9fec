#!/usr/bin/env python3
"""Is the capacity's interval honest, and what does it cost? Hundreds of capacity searches in virtual
time against a known truth (the search every vkit tool makes, :func:`vkit.tune.capsearch.search`). The
bracket search it replaced was deleted; its rows in the results file are from the revision that measured
them (``previous``).

- **The server**: the virtual-time predictor (``vkit.sim.predict.bench_summary``: the simulator's V1
  scheduler and cost model, no sockets, no clock) with the simulator's run-level noise (2 % sd of a
  run's step-time level, redrawn after 10 ms of idle virtual time, plus the Ornstein–Uhlenbeck wander
  and per-step jitter of ``vkit.sim.steptime.Noise``), Poisson arrivals at the exact offered rate, a
  fresh arrival seed every run, each run judged on its steady state (``Scenario.steady``: a warm-up
  of two request lifetimes, and arrivals that go on unmeasured until the last measured request has
  finished; without them a 450-request run at the TPOT-bound truth read mean TPOT 5.1 % low). One
  search measures one start: no between-restart draw (that part of σ is the gate's, across starts).
- **The truth**: the same predictor without noise; per load, ``TRUTH_SEEDS`` runs of
  ``TRUTH_REQUESTS`` requests on the same arrival seeds at every load, each judged as a search judges a run (the SLOs' margins, the keep-up
  rule at 0.95 of the offered rate, a queue that grew within the run); the capacity is the highest load
  at which every SLO's mean margin over them (the keep-up's included) is >= 0, bisected in log load to 0.2 %.
- **Scenarios** (``SCENARIOS``): a smooth TTFT-bound boundary (long prompts), a cliff (16 sequences:
  the queue grows the moment they are all busy), a mean-TPOT-bound boundary (long outputs), and a
  keep-up-bound one (latency SLOs so loose that only the throughput binds).
- **Scored** per scenario and method: median and 90th percentile of |estimate / truth − 1|, the share of
  searches whose 95 % interval holds the truth (the model; the bracket's [holds, fails] for
  reference), searches with no answer, and the median load points, runs and request-seconds (requests
  / offered rate: the seconds of load a search costs).

Writes bench/results/capacity_interval.json. Run: python3 bench/bench_capacity_interval.py
[--searches 200] [--scenarios a,b] [--jobs 2] [--out FILE] (about 2 hours on 2 cores for
the four scenarios; separate --scenarios with separate --out files can run side by side).
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import multiprocessing as mp
import os
import platform
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.harness import revision as _revision  # noqa: E402  (bench_capacity_sim reads it here too)
from bench.harness import sim_sources  # noqa: E402
from vkit.sim.predict import Scenario, bench_summary  # noqa: E402
from vkit.state import atomic_write_text  # noqa: E402
from vkit.tune import capacity as cap  # noqa: E402
from vkit.tune import capsearch  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results", "capacity_interval.json")
NOISE = 0.02  # the simulator's default --sim-noise
TRUTH_REQUESTS = 6000
TRUTH_SEEDS = 6
TRUTH = os.path.join(ROOT, "bench", "results", "capacity_interval_truth.json")
KEEP_UP = 0.95

CLIFF = {"model": "llama-3.1-8b", "gpu": "H200", "tp": 1, "isl": 512, "osl": 128,
         "serve": {"max_model_len": 1024, "max_num_batched_tokens": 8192, "max_num_seqs": 16},
         "slo": {"p95_ttft_ms": 200.0, "mean_tpot_ms": 50.0}, "start": 4.0}
SCENARIOS = {
    "ttft-smooth": {"model": "llama-3.1-8b", "gpu": "H200", "tp": 1, "isl": 2048, "osl": 64,
                    "serve": {"max_model_len": 4096, "max_num_batched_tokens": 8192, "max_num_seqs": 256},
                    "slo": {"p95_ttft_ms": 500.0, "mean_tpot_ms": 100.0}, "start": 4.0},
    "cliff-seqs": CLIFF,
    "tpot-long-output": {"model": "llama-3.1-8b", "gpu": "H200", "tp": 1, "isl": 256, "osl": 384,
                         "serve": {"max_model_len": 1024, "max_num_batched_tokens": 8192, "max_num_seqs": 256},
                         "slo": {"p95_ttft_ms": 2000.0, "mean_tpot_ms": 9.0}, "start": 4.0},
    # the cliff's server, latency SLOs so loose that only the keep-up binds
    "keep-up": {**CLIFF, "slo": {"p95_ttft_ms": 60000.0, "mean_tpot_ms": 50.0}},
}


def scenario(sc: dict, rate: float, n: int, seed: int, noise: float = 0.0, key: str = "0") -> Scenario:
    return Scenario(model=sc["model"], gpu=sc["gpu"], tp=sc["tp"], isl=sc["isl"], osl=sc["osl"], rate=rate,
                    num_prompts=n, seed=seed, exact_rate=True, steady=True, serve=dict(sc["serve"]), noise=noise,
                    noise_seed=key)


# -- the truth ------------------------------------------------------------------------------------
def _holds(sc: dict, rate: float, requests: int = TRUTH_REQUESTS, seeds: int = TRUTH_SEEDS) -> bool:
    """The SLO holds at ``rate`` when every SLO's margin (and the keep-up margin), each averaged over
    ``TRUTH_SEEDS`` long noise-free runs judged as a search judges a run (the SLOs, the keep-up rule,
    a growing queue), is >= 0: the least of the means, as the boundary model estimates it (each SLO's
    expected margin against load, the binding one the least). Not the mean of each run's least margin:
    where the binding SLO differs from run to run (a run that keeps up binds on its latency margin,
    two far above zero, one that falls short on its keep-up margin, a few hundredths below), one run
    that kept up would outweigh five that did not."""
    slo, plan = cap.Slo(dict(sc["slo"])), cap.Plan(keep_up=KEEP_UP)
    runs = [cap.judge_run(bench_summary(scenario(sc, rate, requests, 10_000 + s)), slo, plan, rate)
            for s in range(seeds)]
    return least_mean_margin(runs, list(slo.limits)) >= 0


def least_mean_margin(runs: list[dict], keys: list[str]) -> float:
    """The least over the SLOs ``keys`` and the keep-up of their margin averaged over ``runs``
    (:func:`vkit.tune.capacity.judge_run`'s answers; the keep-up margin is each run's ``keep``, kept
    up or not)."""
    means = [float(np.mean([r["margins"][k] for r in runs])) for k in keys]
    keep = [r["keep"] for r in runs if r.get("keep") is not None]
    if keep:
        means.append(float(np.mean(keep)))
    return min(means)


def _digest(sc: dict) -> str:
    h = hashlib.sha256(json.dumps([sc, TRUTH_REQUESTS, TRUTH_SEEDS, KEEP_UP], sort_keys=True).encode())
    for f in sim_sources("predict"):
        h.update(open(f, "rb").read())
    h.update(inspect.getsource(cap.judge_run).encode())  # how a run is judged is part of the truth
    for f in (_holds, least_mean_margin):  # and how the runs of a load are judged together
        h.update(inspect.getsource(f).encode())
    return h.hexdigest()[:16]


def cached_truth(name: str) -> float:
    """The scenario's true capacity, cached in capacity_interval_truth.json under a digest of the
    scenario, the simulator's source and the source of the run's judge (capacity.judge_run)."""
    cache = json.load(open(TRUTH)) if os.path.exists(TRUTH) else {}
    key = _digest(SCENARIOS[name])
    if (cache.get(name) or {}).get("digest") != key:
        t0 = time.time()
        entry = {"digest": key, "capacity": true_capacity(SCENARIOS[name]), "cpu_s": time.time() - t0}
        cache = json.load(open(TRUTH)) if os.path.exists(TRUTH) else {}  # again: another process may have written
        cache[name] = entry
        _write(TRUTH, cache)
    return cache[name]["capacity"]


def true_capacity(sc: dict, requests: int = TRUTH_REQUESTS, seeds: int = TRUTH_SEEDS) -> float:
    def holds(rate: float) -> bool:
        return _holds(sc, rate, requests, seeds)

    lo, hi = 1.0, 2.0
    while not holds(lo):
        lo, hi = lo / 2, lo
    while holds(hi):
        lo, hi = hi, hi * 2
    while hi / lo > 1.002:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return math.sqrt(lo * hi)


# -- one search -----------------------------------------------------------------------------------
def one_search(args) -> dict:
    name, method, rep, overrides = args
    sc = SCENARIOS[name]
    slo = cap.Slo(dict(sc["slo"]))
    plan = cap.Plan(start=sc["start"], keep_up=KEEP_UP, **overrides)
    count = [0]

    def measure(load: float, k: int, n: int | None = None) -> dict:
        count[0] += 1
        i = count[0]
        n = n or max(100, math.ceil(load * plan.point_seconds))
        return bench_summary(scenario(sc, load, n, seed=1_000_000 * rep + i, noise=NOISE, key=f"{name}:{rep}:{i}"))

    t0 = time.time()
    res = capsearch.search(measure, slo, plan)
    d = res.as_dict()
    out = {"scenario": name, "method": method, "rep": rep, "points": d["points"], "runs": d["runs"],
           "requests": d["requests"], "request_seconds": d.get("request_seconds"), "stop": d["stop"],
           "cpu_s": time.time() - t0, "binding": d["binding_slo"]}
    out.update(estimate=d["capacity"], lo=d["interval"][0], hi=d["interval"][1], shape=d.get("boundary"),
               bounds=d["estimate"].get("bounds"))
    return out


def score(rows: list[dict], truth: float) -> dict:
    err = [abs(r["estimate"] / truth - 1) for r in rows if r["estimate"]]
    cover = [r["lo"] is not None and r["hi"] is not None and r["lo"] <= truth <= r["hi"] for r in rows]
    width = [r["hi"] / r["lo"] - 1 for r in rows if r["lo"] and r["hi"]]
    return {
        "searches": len(rows),
        "no_answer": sum(1 for r in rows if not r["estimate"]),
        "median_abs_error": float(np.median(err)) if err else None,
        "p90_abs_error": float(np.quantile(err, 0.9)) if err else None,
        "coverage": float(np.mean(cover)) if cover else None,
        "below_interval": sum(1 for r in rows if r["lo"] is not None and truth < r["lo"]),
        "above_interval": sum(1 for r in rows if r["hi"] is not None and truth > r["hi"]),
        "median_width": float(np.median(width)) if width else None,
        "median_points": float(np.median([r["points"] for r in rows])),
        "median_runs": float(np.median([r["runs"] for r in rows])),
        "median_request_seconds": float(np.median([r["request_seconds"] or 0 for r in rows])),
        "median_requests": float(np.median([r["requests"] for r in rows])),
        "binding": {b: sum(1 for r in rows if r["binding"] == b) for b in sorted({str(r["binding"]) for r in rows})},
        "shape": {s: sum(1 for r in rows if r.get("shape") == s) for s in sorted({str(r.get("shape")) for r in rows})}
        if rows and "shape" in rows[0] else None,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--searches", type=int, default=200, help="model searches per scenario (default 200)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated (default all)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--rows", default=None, metavar="FILE", help="also write every search's row here (JSON Lines)")
    ap.add_argument("--crossing-factor", type=float, default=None, metavar="F",
                    help="the searches' Plan.crossing_factor (default: the Plan's own)")
    ap.add_argument("--point-seconds", type=float, default=None, metavar="S",
                    help="the searches' Plan.point_seconds, the shortest run in seconds of load (default: the Plan's own)")
    ap.add_argument("--truth-at", metavar="N:S",
                    help="run no search: print each scenario's truth judged on S runs of N requests per load "
                         "(the capacity over a window of N requests; not cached)")
    ap.add_argument("--rescore", metavar="ROWS",
                    help="run no search: score the model and bracket rows of ROWS (a --rows file) against the current "
                         "truth of each scenario named (recomputed where the truth's definition or the simulator changed)")
    a = ap.parse_args(argv)
    overrides = {k: v for k, v in (("crossing_factor", a.crossing_factor), ("point_seconds", a.point_seconds)) if v}
    names = [s for s in a.scenarios.split(",") if s]
    bad = [s for s in names if s not in SCENARIOS]
    if bad:
        print(f"bench_capacity_interval: unknown scenario(s) {', '.join(bad)}; one of {', '.join(SCENARIOS)}", file=sys.stderr)
        return 2
    result = json.load(open(a.out)) if os.path.exists(a.out) else {}
    if a.truth_at:
        n, _, k = a.truth_at.partition(":")
        if not (n.isdigit() and k.isdigit() and int(n) >= 100 and int(k) >= 1):
            print(f"bench_capacity_interval: --truth-at wants N:S, N >= 100 requests and S >= 1 runs (got {a.truth_at!r})",
                  file=sys.stderr)
            return 2
        for name in names:
            c = true_capacity(SCENARIOS[name], int(n), int(k))
            print(json.dumps({"scenario": name, "requests": int(n), "runs": int(k), "capacity": c,
                              "over_truth": c / cached_truth(name)}))
        return 0
    if a.rescore:
        if not os.path.isfile(a.rescore):
            print(f"bench_capacity_interval: --rescore {a.rescore}: no such file (a --rows file of an earlier run)", file=sys.stderr)
            return 2
        return rescore(a.rescore, names, a.out)
    result.update({"revision": _revision(), "machine": platform.node(), "noise": NOISE, "keep_up": KEEP_UP,
                   "plan": dict(vars(cap.Plan(**overrides)))})
    result.setdefault("scenarios", {})
    with mp.Pool(a.jobs) as pool:
        for name in names:
            t0 = time.time()
            truth = cached_truth(name)
            print(f"{name}: truth {truth:.4g} req/s ({time.time() - t0:.0f} s)", file=sys.stderr)
            rows: dict[str, list] = {"model": [], "bracket": []}
            jobs = [(name, "model", i, overrides) for i in range(a.searches)]
            for k, r in enumerate(pool.imap_unordered(one_search, jobs), 1):
                rows[r["method"]].append(r)
                if k % 25 == 0 or k == len(jobs):
                    el = time.time() - t0
                    print(f"  {k}/{len(jobs)} searches, {el:.0f} s, ETA {el / k * (len(jobs) - k):.0f} s", file=sys.stderr)
            if a.rows:
                with open(a.rows, "a") as f:
                    for r in rows["model"] + rows["bracket"]:
                        f.write(json.dumps({**r, "truth": truth}) + "\n")
            result["scenarios"][name] = {"config": SCENARIOS[name], "truth": truth, "revision": result["revision"],
                                         "model": score(rows["model"], truth),
                                         # the deleted bracket search's scores, as its revision measured them
                                         "bracket": (result["scenarios"].get(name) or {}).get("bracket"),
                                         "wall_s": time.time() - t0}
            print(json.dumps({name: {m: result["scenarios"][name][m] for m in ("truth", "model", "bracket")}}, indent=1),
                  file=sys.stderr)
            _write(a.out, result)
    return 0


def _write(path: str, doc: dict) -> None:
    atomic_write_text(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def rescore(rows_path: str, names: list[str], out: str) -> int:
    """Score stored searches against each scenario's current truth, without searching again: the
    scenario's entry in ``out`` gets its model and bracket scores from the rows, the truth they were
    scored against before (``truth_before``) and when (``rescored``)."""
    rows = [json.loads(x) for x in open(rows_path) if x.strip()]
    result = json.load(open(out)) if os.path.exists(out) else {"scenarios": {}}
    for name in names:
        mine = [r for r in rows if r["scenario"] == name]
        if not mine:
            continue
        truth = cached_truth(name)
        entry = result["scenarios"].setdefault(name, {"config": SCENARIOS[name]})
        before = entry.get("truth")
        bracket = [r for r in mine if r["method"] == "bracket"]
        entry.update({"truth": truth, "model": score([r for r in mine if r["method"] == "model"], truth),
                      "bracket": score(bracket, truth) if bracket else None,
                      "rescored": {"revision": _revision(), "truth_before": before, "rows": os.path.relpath(rows_path, ROOT)}})
        print(json.dumps({name: {m: entry[m] for m in ("truth", "model")}}, indent=1), file=sys.stderr)
    _write(out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
