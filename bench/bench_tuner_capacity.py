#!/usr/bin/env python3
"""Which acquisition should `tune --objective capacity --mode bo` use? Simulated, no server.

bench_tuner.py decides the search mode for the throughput objective (goodput under a P95 TTFT
SLO, two parameters). This benchmark asks the same question for tune's capacity objective, in
tune's own Bayesian space:

- **Objectives**: tune's (``vkit.tune.steps.CAPACITY_OBJECTIVES``): ``slo_capacity`` (the highest
  Poisson rate whose P95 TTFT and mean TPOT meet the scenario's SLO, maximised) and
  ``ref_mean_tpot_ms`` (mean TPOT at the reference load, minimised). No SLO on top: it is inside
  the capacity, so ``acquisition="auto"`` is EHVI here.
- **Space**: tune's (``vkit.tune.steps.bo_space`` on the shipped policy, nothing frozen): max
  batched tokens (256–131072, log), max sequences (1–4096, log), gpu_memory_utilization
  (0.85–0.98), enable_chunked_prefill and enable_prefix_caching: five parameters, 49,248 lattice
  points. (The sixth, the scheduling policy, is searched only on a workload with priority
  classes; these are synthetic prompts.)
- **Scenarios**: one KV-bound (qwen3-32b on two L40S: gpu_memory_utilization moves the capacity,
  1.53 req/s at 0.85 and 1.87 at 0.98 with 128 sequences) and bench_capacity_tune.py's
  8b-h200-chat (the capacity climbs with max_num_seqs far above the space's centre). Its
  8b-a100-long-prompts is left out: the first Sobol point, the space's centre, already holds 98 %
  of its optimum, so every mode scores 1 restart there and it cannot tell them apart.
- **Truth**: the virtual-time predictor (``vkit.sim.predict``, no noise), as
  bench_capacity_tune.py computes it: a configuration's capacity is bisected in log rate to 1 %
  over 500 exact-rate requests; its ``ref_mean_tpot_ms`` is the mean TPOT at the reference load
  (the starting configuration's capacity). A configuration that vLLM refuses to start (chunked
  prefill off with fewer batched tokens than max_model_len; too little memory) is infeasible.
  The lattice is too large to run whole, so the optimum is the best true capacity over a
  reference set (the policy's candidate lists for tokens and sequences x gpu_memory_utilization
  0.85 / 0.92 / 0.98, the flags on) and every configuration any mode evaluated in any replicate.
- **A measurement** (what the trial runner hands the search): ``screen_repeats`` (tune's default,
  2) capacity searches on one server start. Each is the true capacity moved by the simulator's
  default noise, the start's draw (sd 0.75 x 2 %) shared by the trial's searches and a run's
  draw (sd 2 %) per search, taken as a 1:1 log shift of the capacity, and by the capacity
  search's own resolution: the answer is the middle of a bracket within ``Plan().tolerance``
  (10 %), a uniform position in it. TPOT moves with the same draws. Common random numbers: a
  configuration measured by two modes in one replicate sees the same draws.
- **Scored** per mode over seeds, with a budget of 20 evaluations: ``restarts_to_98pct``
  (evaluations until ``vkit.search.recommend``'s pick, the highest measured capacity, truly
  holds 98 % of the optimum; null when never), the pick's true capacity over the optimum at 10
  and 20 evaluations, and the share of replicates within 98 % at 20.
- **Decided**: the acquisition for ``auto`` under the capacity objective: among the bo modes the
  fewest median restarts to 98 % (mean over scenarios; censored = budget + 1), then the larger
  share within 98 % at 20. ``random`` and the library's staged plan (tokens then sequences, the
  policy's lists) run beside them as references.

Writes bench/results/tuner_capacity.json. Run: python3 bench/bench_tuner_capacity.py [--seeds 8]
[--budget 20] [--jobs 2] [--methods bo,staged] [--out FILE] (one worker a scenario; 26 minutes on 2
cores, the qwen32b scenario the longer). The bo and random rows depend only on the seeds, the
truth and vkit.search's Bayesian proposer, so a change to the staged plan alone can be measured
with ``--methods staged --optimum-from bench/results/tuner_capacity.json`` into another file.
"""

from __future__ import annotations

import argparse
import hashlib
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_capacity_tune import SCENARIOS as CAPACITY_SCENARIOS  # noqa: E402
from bench_capacity_tune import START, run_at, true_capacity  # noqa: E402
from bench_tuner import _median, _noise_seed  # noqa: E402
from harness import revision as harness_revision  # noqa: E402
from harness import write_result  # noqa: E402

from vkit import search  # noqa: E402
from vkit.cli._common import load_policy  # noqa: E402
from vkit.search.space import key_of  # noqa: E402
from vkit.sim.config import SimStartupError  # noqa: E402
from vkit.sim.serve import SimSettings  # noqa: E402
from vkit.tune.capacity import Plan  # noqa: E402
from vkit.tune.config import Settings  # noqa: E402
from vkit.tune.steps import BO_BOUNDS, BO_NAMES, CAPACITY_OBJECTIVES  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results", "tuner_capacity.json")
BUDGET = 20
SEED = 20261202
SCENARIOS = {
    # KV-bound: gpu_memory_utilization moves the capacity (1.53 req/s at 0.85, 1.87 at 0.98, 128 sequences)
    "qwen32b-l40sx2": {"model": "qwen3-32b", "gpu": "L40S", "tp": 2, "isl": 1024, "osl": 256, "max_model_len": 2048,
                       "slo": {"p95_ttft_ms": 2000.0, "mean_tpot_ms": 100.0}},
    # chat on a large GPU: the capacity climbs with max_num_seqs far above the space's centre (64)
    "8b-h200-chat": CAPACITY_SCENARIOS["8b-h200-chat"],
}
GPU_DEFAULT = 0.9  # vLLM's --gpu-memory-utilization default: the starting configuration's
METHODS = {
    "bo": ("bo", {}),  # auto: EHVI for these two objectives without an SLO
    "bo_cei": ("bo", {"acquisition": "cei"}),
    "bo_ei": ("bo", {"acquisition": "ei"}),
    "bo_ucb": ("bo", {"acquisition": "ucb"}),
    "random": ("random", {}),
    "staged": ("staged", {}),
}
GOAL = {"maximize": "slo_capacity"}


def space() -> list:
    """tune's Bayesian space (vkit.tune.steps.bo_space) on the shipped policy, nothing frozen."""
    return search.space_from_policy(load_policy(), list(BO_NAMES), frozen={}, bounds=BO_BOUNDS)


def noise() -> dict:
    sim, plan = SimSettings(), Plan()
    return {"run_sigma": sim.noise, "start_sigma": sim.effective_restart_noise,
            "bracket_log_width": math.log(1 + plan.tolerance), "repeats": Settings(workload=None).screen_repeats}


# -- the truth of one configuration -----------------------------------------------------------------
def _tpot_ms(sc: dict, cfg: dict, rate: float) -> float:
    return run_at(sc, cfg, rate)["tpot_s"]["mean"] * 1e3


class Truth:
    """True (capacity, ref_mean_tpot_ms) per configuration, computed once, None when it cannot start."""

    def __init__(self, sc: dict):
        self.sc = sc
        self.table: dict[str, dict | None] = {}
        start = {**START, "gpu_memory_utilization": GPU_DEFAULT}
        self.reference = true_capacity(sc, start)

    def __call__(self, cfg: dict) -> dict | None:
        serve = {k: v for k, v in cfg.items() if k != "max_model_len"}
        k = json.dumps(serve, sort_keys=True)
        if k not in self.table:
            try:
                cap = true_capacity(self.sc, serve, self.reference)
                self.table[k] = {"config": serve, "capacity": cap, "ref_mean_tpot_ms": _tpot_ms(self.sc, serve, self.reference)}
            except (SimStartupError, RuntimeError):
                self.table[k] = None
        return self.table[k]


def reference_set(sp: list) -> list[dict]:
    by = {p.name: p for p in sp}
    return [{"max_num_batched_tokens": t, "max_num_seqs": s, "gpu_memory_utilization": g,
             "enable_chunked_prefill": True, "enable_prefix_caching": True}
            for t in by["max_num_batched_tokens"].candidates for s in by["max_num_seqs"].candidates + [256, 512]
            for g in (0.85, 0.92, 0.98)]


# -- one scenario, every replicate --------------------------------------------------------------------
def measured(truth: dict, draws: dict, name: str, seed: int, key: tuple) -> list[dict]:
    """``repeats`` capacity searches of one start: the start's draw shared, a run's draw and the
    bracket position per search (common random numbers per (scenario, seed, configuration))."""
    rng = np.random.default_rng(_noise_seed(name, seed, key, 0))
    x_start = rng.normal(0, draws["start_sigma"])
    reps = []
    for _ in range(draws["repeats"]):
        x = x_start + rng.normal(0, draws["run_sigma"])
        u = rng.uniform(-0.5, 0.5) * draws["bracket_log_width"]
        reps.append({"slo_capacity": truth["capacity"] * math.exp(-x + u), "ref_mean_tpot_ms": truth["ref_mean_tpot_ms"] * math.exp(x)})
    return reps


def run_scenario(args) -> dict:
    name, seeds, budget, labels = args
    sc = SCENARIOS[name]
    sp, draws = space(), noise()
    base = {"max_model_len": sc["max_model_len"], **START, "gpu_memory_utilization": GPU_DEFAULT}
    truth = Truth(sc)
    t0 = time.perf_counter()
    for cfg in reference_set(sp):
        truth(cfg)
    t_ref = time.perf_counter() - t0
    reps = []
    for s in range(seeds):
        seed = SEED + s
        row = {"seed": seed, "methods": {}}
        for label in labels:
            mode, opts = METHODS[label]
            t1 = time.perf_counter()
            hist: list[search.Observation] = []
            while len(hist) < budget:
                p = search.propose(mode, sp, hist, base, CAPACITY_OBJECTIVES, None, budget, seed, **opts)
                if p is None:
                    break
                tv = truth(p.config)
                tid = f"t{len(hist)}"
                if tv is None:
                    hist.append(search.Observation(config=p.config, feasible=False, step=p.step, trial_id=tid))
                    continue
                rr = measured(tv, draws, name, seed, key_of(p.config, sp))
                agg = {m: float(np.mean([r[m] for r in rr])) for m in rr[0]}
                hist.append(search.Observation(config=p.config, objectives=agg, repeats=rr, step=p.step, trial_id=tid))
            row["methods"][label] = {"history": [{"config": {k: v for k, v in o.config.items() if k != "max_model_len"},
                                                  "feasible": o.feasible, "measured": o.objectives} for o in hist],
                                     "picks": [_pick(hist[:t]) for t in range(1, len(hist) + 1)],
                                     "seconds": round(time.perf_counter() - t1, 2)}
        reps.append(row)
        print(f"  {name}: seed {s + 1}/{seeds} done, {len(truth.table)} configurations known", file=sys.stderr, flush=True)
    return {"scenario": name, "reference_capacity": truth.reference, "table": list(truth.table.values()),
            "reference_seconds": round(t_ref, 1), "replicates": reps}


def _pick(hist: list[search.Observation]) -> int | None:
    idx, _ = search.recommend(hist, CAPACITY_OBJECTIVES, GOAL)
    return idx


# -- scoring --------------------------------------------------------------------------------------------
def score(out: dict, also: dict | None = None) -> dict:
    """Per method over seeds. ``also``: an optimum found by another run ({config, capacity}), so a
    run of some methods is scored against the same optimum as the run of all."""
    known = {json.dumps(r["config"], sort_keys=True): r for r in out["table"] if r is not None}
    if also:
        known.setdefault(json.dumps(also["config"], sort_keys=True), also)
    best_row = max(known.values(), key=lambda r: r["capacity"])
    best = best_row["capacity"]
    refset = {json.dumps(c, sort_keys=True) for c in reference_set(space())}
    methods = {}
    for label in out["replicates"][0]["methods"]:
        rows = []
        for rep in out["replicates"]:
            m = rep["methods"][label]

            def ratio(t: int, m=m) -> float:
                i = m["picks"][t - 1] if t else None
                if i is None:
                    return 0.0
                return known[json.dumps(m["history"][i]["config"], sort_keys=True)]["capacity"] / best

            n = len(m["history"])
            restarts = next((t for t in range(1, n + 1) if ratio(t) >= 0.98), None)
            rows.append({"seed": rep["seed"], "evaluations": n, "restarts_to_98pct": restarts,
                         "ratio_at_10": round(ratio(min(10, n)), 4), "ratio_at_20": round(ratio(n), 4),
                         "failed_evaluations": sum(1 for h in m["history"] if not h["feasible"]),
                         "pick": m["history"][m["picks"][-1]]["config"] if n and m["picks"][-1] is not None else None,
                         "seconds": m["seconds"]})
        k = len(rows)
        methods[label] = {
            "replicates": k,
            "restarts_to_98pct_median": _median([r["restarts_to_98pct"] for r in rows]),
            "reached_98pct_share": round(sum(r["restarts_to_98pct"] is not None for r in rows) / k, 3),
            "ratio_at_10_median": _median([r["ratio_at_10"] for r in rows]),
            "ratio_at_20_median": _median([r["ratio_at_20"] for r in rows]),
            "ratio_at_20_min": min(r["ratio_at_20"] for r in rows),
            "within_98pct_at_20_share": round(sum(r["ratio_at_20"] >= 0.98 for r in rows) / k, 3),
            "failed_evaluations_mean": round(float(np.mean([r["failed_evaluations"] for r in rows])), 2),
            "search_seconds_mean": round(float(np.mean([r["seconds"] for r in rows])), 2),
            "rows": rows,
        }
    return {"optimum": {"config": best_row["config"], "capacity": best,
                        "found_outside_reference_set": json.dumps(best_row["config"], sort_keys=True) not in refset},
            "reference_capacity": out["reference_capacity"], "configurations_known": len(out["table"]),
            "infeasible_known": sum(1 for r in out["table"] if r is None),
            "reference_seconds": out["reference_seconds"], "methods": methods,
            "truth": sorted((r for r in out["table"] if r is not None), key=lambda r: -r["capacity"])}


def choose(per: dict, budget: int) -> dict | None:
    """The bo acquisition with the fewest median restarts to 98 % (mean over scenarios; censored =
    budget + 1), then the larger share within 98 % at 20 (None when no bo acquisition ran)."""
    key = {}
    for label in next(iter(per.values()))["methods"]:
        if METHODS[label][0] != "bo":
            continue
        med = [r["methods"][label]["restarts_to_98pct_median"] for r in per.values()]
        share = [r["methods"][label]["within_98pct_at_20_share"] for r in per.values()]
        key[label] = (float(np.mean([budget + 1 if x is None else x for x in med])), -float(np.mean(share)))
    if not key:
        return None
    best = min(key, key=lambda k: key[k])
    return {"label": best, "acquisition": METHODS[best][1].get("acquisition", "ehvi"),
            "mean_median_restarts": {k: v[0] for k, v in key.items()},
            "mean_within_98pct_at_20": {k: -v[1] for k, v in key.items()},
            "rule": "fewest median restarts to 98 % of the optimum (mean over scenarios; censored = budget + 1), then "
                    "the larger share within 98 % at 20 evaluations; among the bo acquisitions"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="example: python3 bench/bench_tuner_capacity.py --seeds 8 --jobs 2")
    ap.add_argument("--seeds", type=int, default=8, help="replicates per scenario (default 8)")
    ap.add_argument("--budget", type=int, default=BUDGET, help="evaluations per search (default 20)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes, one a scenario (default 2)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated scenario names")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {','.join(METHODS)} (default all)")
    ap.add_argument("--optimum-from", metavar="FILE", default=None,
                    help="score against the optimum of this earlier result as well (for a run of some --methods)")
    ap.add_argument("--out", default=RESULTS, help="result file (default bench/results/tuner_capacity.json)")
    a = ap.parse_args(argv)
    names = [s for s in a.scenarios.split(",") if s]
    labels = [s for s in a.methods.split(",") if s]
    bad = [n for n in names if n not in SCENARIOS] + [m for m in labels if m not in METHODS]
    if bad or not labels or a.seeds < 1 or a.budget < 2:
        ap.error(f"unknown scenario or method {bad[0]!r}" if bad else "--seeds must be >= 1, --budget >= 2, a method named")
    t0 = time.time()
    with mp.Pool(min(a.jobs, len(names))) as pool:
        outs = pool.map(run_scenario, [(n, a.seeds, a.budget, labels) for n in names], chunksize=1)
    earlier = {}
    if a.optimum_from:
        with open(a.optimum_from) as f:
            earlier = {n: r["optimum"] for n, r in json.load(f)["scenarios"].items()}
    per = {o["scenario"]: {"scenario": SCENARIOS[o["scenario"]], **score(o, earlier.get(o["scenario"]))} for o in outs}
    default = choose(per, a.budget)
    revision = harness_revision()
    result = {"bench": "tuner_capacity", "revision": revision, "python": platform.python_version(), "numpy": np.__version__,
              "cpus": os.cpu_count(), "jobs": a.jobs, "seed": SEED, "seeds": a.seeds, "budget": a.budget,
              "measurement": noise(), "space": [p.to_dict() for p in space()],
              "objectives": [o.to_dict() for o in CAPACITY_OBJECTIVES],
              "methods": {k: {"mode": METHODS[k][0], "options": METHODS[k][1]} for k in labels},
              "scenarios": per, "default_acquisition": default,
              "digest": hashlib.sha256(json.dumps([SCENARIOS, START], sort_keys=True).encode()).hexdigest()[:16],
              "seconds": round(time.time() - t0, 1)}
    write_result(a.out, result, "tuner_capacity", sort_keys=True, default=str)
    brief = {n: {k: {x: m[x] for x in ("restarts_to_98pct_median", "ratio_at_10_median", "ratio_at_20_median",
                                      "within_98pct_at_20_share", "failed_evaluations_mean")}
                 for k, m in r["methods"].items()} for n, r in per.items()}
    print(json.dumps({"methods": brief, "default_acquisition": default, "seconds": result["seconds"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
