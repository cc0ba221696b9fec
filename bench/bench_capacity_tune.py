#!/usr/bin/env python3
"""Does `tune --objective capacity` deliver a configuration near the best SLO capacity, at what
cost in restarts and benchmark-seconds, and does its promise hold when measured afresh?

Per scenario (model, GPU, tensor parallelism, prompt/output lengths, SLO in the simulator's
virtual time):

- Ground truth, from the virtual-time predictor (``vkit.sim.predict``, no server, no noise): the
  SLO capacity of every configuration on the policy's lattice (max_num_batched_tokens
  candidates x max_num_seqs candidates and the three doublings past them that step 3 may go on
  to, the starting configuration too): the highest exact-rate Poisson rate
  whose P95 TTFT and mean TPOT meet the SLO over a 500-request run, bisected in log rate to 1 %.
  The best of them is the optimum over the search space (rows measured before step 3 went past
  its candidates compared against seqs 8–128 only; each row names its truth's digest).
- The product run: ``bin/tune --objective capacity --steps 2,3,4`` on a live ``bin/sim_server``
  of the scenario (``--sim-speed 4``, the simulator's default noise: 2 % within a process, 1.5 %
  between starts), started from a conservative configuration, with ``make demo``'s capacity
  settings but the defaults of a field tune: 8 trials a step, a baseline of 4 runs over 3 starts, a
  confirmation budget of tune's default (4 blocks at the rows' revisions, 6 since), no attribution run (``--ablation off``: it measures which
  parameter of a keep paid, not where the tune lands; the earlier rows predate it). Measured: server restarts, benchmark-seconds (the summed duration of every load-point
  run), wall seconds, the recommended configuration.
  The tune ends by verifying its promise with 10-second runs on a fresh start (``--verify-seconds
  10``): it must clearly hold on two of them (their mean margin beyond twice its standard error,
  as a search's point), else it steps down by the tolerance.
- Scored: the recommendation's true capacity over the optimum (target >= 0.98); the promise
  (``recommendation.capacity.req_s``, wall req/s / speed) over the recommendation's true
  capacity; and a fresh measurement on the live server at the promised rate (3 valid runs, each
  judged as a capacity point's run is; a run the client could not keep up with is replaced, 9 at
  most): the promise breaks when 2 of them fail, or when 9 runs leave fewer than 3 valid (target:
  no scenario breaks).

- ``--virtual --seeds N``: the same tune on the virtual backend (``tune --virtual``, vkit.tune.virtual):
  the shipped loop on the simulator in virtual time, N seeds a scenario (``--sim-seed`` 11, 12, ...), the
  SLO and run lengths in simulated seconds (the live rows' wall settings times SPEED), a restart at
  ``VIRTUAL_RESTART_S`` simulated seconds; the fresh check on a new virtual start of the recommendation.
  Per scenario the median and range of restarts, simulated hours, ratio to the best and promise over
  truth. Writes bench/results/capacity_tune_virtual.json.
- ``--search twin`` (or ``staged,twin``: both in one run): the same tunes with ``tune --search twin``
  (the calibrated twin ranks the space, the server confirms; ``--max-restarts N`` passed on), their
  rows under each scenario's ``twin`` key beside the staged ones; ``--search twin-refit`` the same with
  ``tune --twin-refit`` (the twin refitted on each measured trial's load points), under ``twin_refit``;
  ``--search twin-design`` with ``tune --twin-design always`` (designed calibration runs before the
  twin proposes), under ``twin_design``. Without ``--virtual``, ``--search staged,twin`` runs one live tune of
  each a scenario, the twin's row under the scenario's ``twin`` key and summarised beside the staged rows.

Writes bench/results/capacity_tune.json (the truth is cached in capacity_truth.json, keyed by a
digest of the scenario and the source of the simulator's modules the predictor runs). Run: python3 bench/bench_capacity_tune.py
[--scenarios a,b] (7 to 9 minutes a scenario on 2 cores; the results file is updated after each);
with --virtual, 2 to 6 minutes a tune on one core.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness import free_port as _free_port  # noqa: E402
from harness import revision, sim_sources, write_result  # noqa: E402

from vkit.sim.predict import Scenario, predict  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results", "capacity_tune.json")
ROW_KEYS = {"twin": "twin", "twin-refit": "twin_refit", "twin-design": "twin_design"}  # --search kinds whose rows go beside the staged ones
OUT_VIRTUAL = os.path.join(ROOT, "bench", "results", "capacity_tune_virtual.json")
TRUTH = os.path.join(ROOT, "bench", "results", "capacity_truth.json")
SPEED = 4.0
VIRTUAL_RESTART_S = 60.0  # --virtual: what one restart costs, in simulated seconds (a field engineer's minute)
TOKENS = [2048, 4096, 8192, 16384, 32768]
SEQS = [8, 16, 32, 64, 128, 256, 512, 1024]  # the policy's list, then step 3's doublings past it
TARGET_RATIO = 0.98

SCENARIOS = {
    "8b-h200-chat": {"model": "llama-3.1-8b", "gpu": "H200", "tp": 1, "isl": 512, "osl": 128, "max_model_len": 1024,
                     "slo": {"p95_ttft_ms": 1000.0, "mean_tpot_ms": 50.0}},
    "70b-h100x4": {"model": "llama-3.1-70b", "gpu": "H100-80G", "tp": 4, "isl": 1024, "osl": 128, "max_model_len": 2048,
                   "slo": {"p95_ttft_ms": 1000.0, "mean_tpot_ms": 40.0}},
    "8b-a100-long-prompts": {"model": "llama-3.1-8b", "gpu": "A100-80G", "tp": 1, "isl": 2048, "osl": 128,
                             "max_model_len": 4096, "slo": {"p95_ttft_ms": 2000.0, "mean_tpot_ms": 60.0}},
    "qwen7b-l40s": {"model": "qwen2.5-7b", "gpu": "L40S", "tp": 1, "isl": 512, "osl": 256, "max_model_len": 1024,
                    "slo": {"p95_ttft_ms": 1500.0, "mean_tpot_ms": 80.0}},
    # an NPU, short prompts and long outputs: the start (16 sequences) carries a twentieth of the best
    "8b-910b-long-output": {"model": "llama-3.1-8b", "gpu": "Ascend-910B", "tp": 1, "isl": 128, "osl": 512,
                            "max_model_len": 1024, "slo": {"p95_ttft_ms": 3000.0, "mean_tpot_ms": 60.0}},
    # FP8 weights (--quantization fp8): more KV blocks and faster decode than the bf16 70B on the same GPUs
    "70b-h100x4-fp8": {"model": "llama-3.1-70b", "gpu": "H100-80G", "tp": 4, "isl": 1024, "osl": 128,
                       "max_model_len": 2048, "quantization": "fp8", "slo": {"p95_ttft_ms": 1000.0, "mean_tpot_ms": 40.0}},
    # TPOT-bound so tightly that the knee sits below the start: 8 sequences carry more than 16
    "8b-h200-tpot-knee": {"model": "llama-3.1-8b", "gpu": "H200", "tp": 1, "isl": 512, "osl": 256, "max_model_len": 1024,
                          "slo": {"p95_ttft_ms": 4000.0, "mean_tpot_ms": 5.2}},
}
START = {"max_num_batched_tokens": 2048, "max_num_seqs": 16}


# -- ground truth ---------------------------------------------------------------------------------
SILICON = os.path.join("bench", "results", "fidelity_profile.json")  # fitted to ../shared/calibration's H100 rows


def scenario(name: str) -> dict:
    """A scenario by name; ``NAME+hidden`` (``--world hidden``): NAME in a world with the hidden effects
    (vkit.sim.hidden) drawn from NAME's place in SCENARIOS plus one, the same for every seed (each world
    costs its own ground truth: minutes of CPU); ``NAME+silicon`` (``--world silicon``): NAME on the step
    costs fitted to measured H100 runs (SILICON, ``sim_server --sim-profile``), where the twin starts
    from the built-in roofline."""
    base, _, world = name.partition("+")
    sc = SCENARIOS[base]
    if world == "hidden":
        return dict(sc, hidden=list(SCENARIOS).index(base) + 1)
    if world == "silicon":
        return dict(sc, profile=SILICON)
    return sc


_PLAIN_BUILD = None


def _world(sc: dict) -> None:
    """The predictor builds the scenario's world: its engines' step costs carry the hidden effects of
    ``sc['hidden']`` (as ``sim_server --sim-hidden-effects``) or the parameters of ``sc['profile']`` (as
    ``--sim-profile``), else the plain cost model. The predictor itself has no such option (its source
    keys every cached truth), so its ``build`` is wrapped here."""
    import vkit.sim.predict as pr

    global _PLAIN_BUILD
    if _PLAIN_BUILD is None:
        _PLAIN_BUILD = pr.build
    seed, profile = sc.get("hidden"), sc.get("profile")
    if seed is None and profile is None:
        pr.build = _PLAIN_BUILD
        return
    from vkit.sim.calibrated import load_profile

    world_params = load_profile(os.path.join(ROOT, profile))["cost_params"] if profile else None

    def build(s, params=None):
        from vkit.sim.hidden import with_hidden
        from vkit.sim.profiles import get_gpu, get_model

        engine, r, rec = _PLAIN_BUILD(s, params if params is not None else world_params)
        if seed is not None:
            rec.cost = with_hidden(rec.cost, seed, r, get_model(s.model), get_gpu(s.gpu))
        return engine, r, rec

    pr.build = build


def run_at(sc: dict, cfg: dict, rate: float) -> dict:
    """The predictor's noiseless run of ``cfg`` at an exact Poisson ``rate`` (500 requests)."""
    _world(sc)
    return predict(Scenario(model=sc["model"], gpu=sc["gpu"], tp=sc["tp"], isl=sc["isl"], osl=sc["osl"], rate=rate,
                            num_prompts=500, warmup=0, seed=0, exact_rate=True, quantization=sc.get("quantization"),
                            serve={"max_model_len": sc["max_model_len"], **cfg}))


def _holds(sc: dict, cfg: dict, rate: float) -> bool:
    r = run_at(sc, cfg, rate)
    ok = r["ttft_s"]["p95"] * 1e3 <= sc["slo"]["p95_ttft_ms"]
    if "mean_tpot_ms" in sc["slo"]:
        ok = ok and r["tpot_s"]["mean"] * 1e3 <= sc["slo"]["mean_tpot_ms"]
    return ok


def true_capacity(sc: dict, cfg: dict, hint: float | None = None) -> float:
    """The highest virtual rate (req/s) meeting the SLO, bisected in log rate to 1 %."""
    return bisect(lambda r: _holds(sc, cfg, r), *((hint / 2, hint * 2) if hint else (0.5, 64.0)), step=4.0)


def bisect(holds, lo: float, hi: float, step: float) -> float:
    """The highest rate at which ``holds``: bracketed from [lo, hi] in steps of ``step``, then bisected
    in log rate to 1 % (0 when nothing above 1e-3 holds)."""
    while not holds(lo):
        lo, hi = lo / step, lo
        if lo < 1e-3:
            return 0.0
    while holds(hi):
        lo, hi = hi, hi * step
    while hi / lo > 1.01:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return lo


# -- the steady-state truth (--truth steady) -------------------------------------------------------
STEADY_REQUESTS = 2000  # at least; and a minute of the load
STEADY_SEEDS = 2


def _holds_steady(sc: dict, cfg: dict, rate: float) -> bool:
    """The SLO holds at ``rate`` over long steady-state runs (a warm-up of two request lifetimes,
    arrivals going on past the measured requests), each judged as a capacity search judges a run (the
    SLO's margins, the keep-up rule, a queue that grew within the run): the least of each SLO's mean
    margin over them (bench_capacity_interval.least_mean_margin) >= 0. A 500-request run cannot show
    a queue that grows slowly: on 8b-h200-chat at 4096 tokens / 512 sequences it holds P95 TTFT at
    54 req/s (260 ms) where a 2,000-request run reads 2.4 s."""
    from bench_capacity_interval import least_mean_margin

    from vkit.sim.predict import bench_summary
    from vkit.tune import capacity as cap

    n = max(STEADY_REQUESTS, math.ceil(rate * 60))
    _world(sc)
    m = []
    for s in range(STEADY_SEEDS):
        summ = bench_summary(Scenario(model=sc["model"], gpu=sc["gpu"], tp=sc["tp"], isl=sc["isl"], osl=sc["osl"],
                                      rate=rate, num_prompts=n, seed=20_000 + s, exact_rate=True, steady=True,
                                      quantization=sc.get("quantization"), serve={"max_model_len": sc["max_model_len"], **cfg}))
        m.append(cap.judge_run(summ, cap.Slo(dict(sc["slo"])), cap.Plan(keep_up=0.95), rate))
    return least_mean_margin(m, list(sc["slo"])) >= 0


def _steady_capacity(args) -> float:
    sc, cfg, hint = args
    return bisect(lambda r: _holds_steady(sc, cfg, r), *((hint / 2, hint * 1.5) if hint else (0.5, 64.0)), step=2.0)


def steady_truth(name: str, sc: dict, jobs: int = 2) -> dict:
    """Every lattice configuration's steady-state capacity (:func:`_holds_steady`), bisected to 1 %,
    the short truth's value as the first guess; cached under ``name@steady``."""
    import multiprocessing as mp

    cache = json.load(open(TRUTH)) if os.path.exists(TRUTH) else {}
    key = _digest(dict(sc, truth="steady", n=STEADY_REQUESTS, seeds=STEADY_SEEDS, judged="least mean margin"))
    if (cache.get(f"{name}@steady") or {}).get("digest") == key:
        return cache[f"{name}@steady"]
    short = truth(name, sc)
    t0 = time.time()
    cfgs = [r["config"] for r in short["table"]] + [dict(START)]
    guesses = [r["capacity"] for r in short["table"]] + [short["start"]]
    with mp.Pool(jobs) as pool:
        caps = pool.map(_steady_capacity, [(sc, c, g) for c, g in zip(cfgs, guesses, strict=True)])
    table = [{"config": c, "capacity": x} for c, x in zip(cfgs[:-1], caps[:-1], strict=True)]
    best = max(table, key=lambda r: r["capacity"])
    out = {"digest": key, "table": table, "best": best, "start": caps[-1], "seconds": round(time.time() - t0, 1),
           "truth": f"steady: {STEADY_SEEDS} runs of >= {STEADY_REQUESTS} requests (and a minute of load) per rate, "
                    "judged as a capacity search judges a run"}
    cache = json.load(open(TRUTH)) if os.path.exists(TRUTH) else {}
    cache[f"{name}@steady"] = out
    json.dump(cache, open(TRUTH, "w"), indent=1)
    return out


def _digest(sc: dict) -> str:
    h = hashlib.sha256(json.dumps([sc, TOKENS, SEQS, START], sort_keys=True).encode())
    for f in sim_sources("predict", *(["hidden"] if sc.get("hidden") is not None else [])) \
            + ([os.path.join(ROOT, sc["profile"])] if sc.get("profile") else []):
        h.update(open(f, "rb").read())
    return h.hexdigest()[:16]


def truth(name: str, sc: dict) -> dict:
    cache = json.load(open(TRUTH)) if os.path.exists(TRUTH) else {}
    key = _digest(sc)
    if (cache.get(name) or {}).get("digest") == key:
        return cache[name]
    t0 = time.time()
    table, hint = [], None
    for tokens in TOKENS:
        for seqs in SEQS:
            cfg = {"max_num_batched_tokens": tokens, "max_num_seqs": seqs}
            hint = true_capacity(sc, cfg, hint)
            table.append({"config": cfg, "capacity": hint})
            print(f"  truth {name} {tokens}/{seqs}: {hint:.3g} req/s", file=sys.stderr)
    best = max(table, key=lambda r: r["capacity"])
    out = {"digest": key, "table": table, "best": best, "start": true_capacity(sc, START), "seconds": round(time.time() - t0, 1)}
    cache[name] = out
    os.makedirs(os.path.dirname(TRUTH), exist_ok=True)
    json.dump(cache, open(TRUTH, "w"), indent=1)
    return out


# -- the product run ------------------------------------------------------------------------------

def tune(name: str, sc: dict, work: str, virtual: bool = False, seed: int = 11, search: str = "staged",
         max_restarts: int | None = None) -> dict:
    """One tune of the scenario: on a live simulator (SPEED x faster than wall time, the SLO and the
    run lengths scaled to wall time), or ``virtual`` (tune --virtual: the simulator in virtual time, a
    restart costing VIRTUAL_RESTART_S simulated seconds as a field engineer pays one, the same run
    lengths in simulated seconds)."""
    py, b = sys.executable, os.path.join(ROOT, "bin")
    work = os.path.join(work, search, f"seed{seed}") if virtual else work
    state = os.path.join(work, name, "vkit.json")
    os.makedirs(os.path.dirname(state), exist_ok=True)
    port = _free_port()
    env = dict(os.environ, VKIT_STATE=state)
    speed = 1.0 if virtual else SPEED
    sim = [py, os.path.join(b, "sim_server"), f"sim-{name}", "--port", str(port), "--sim-gpu", sc["gpu"], "--sim-model",
           sc["model"], "-tp", str(sc["tp"]), "--max-model-len", str(sc["max_model_len"]), "--sim-speed", f"{speed:g}",
           "--sim-startup-s", f"{VIRTUAL_RESTART_S if virtual else 0.5:g}", "--sim-seed", str(seed),
           "--sim-start-file", os.path.join(work, name, "sim-starts"),
           *(["--quantization", sc["quantization"]] if sc.get("quantization") else []),
           *(["--sim-hidden-effects", str(sc["hidden"])] if sc.get("hidden") is not None else []),
           *(["--sim-profile", os.path.join(ROOT, sc["profile"])] if sc.get("profile") else [])]
    init = [py, os.path.join(b, "state"), "init", "--url", f"http://127.0.0.1:{port}", "--model", f"sim-{name}"]
    for k, v in START.items():
        init += ["--set", f"{k}={v}"]
    subprocess.run([*init, "--", *sim], env=env, check=True, capture_output=True)
    slo = [a for k, v in sc["slo"].items() for a in ("--slo", f"{k}={v / speed:g}")]  # the SLO in the client's ms
    # run lengths: 1 s of wall time at SPEED, the same simulated seconds on the virtual backend
    point_s, verify_s = 1.0 * SPEED / speed, 10.0 * SPEED / speed
    argv = [py, os.path.join(b, "tune"), *(["--virtual"] if virtual else []), "--sandbox", "--objective", "capacity",
            "--input-len", str(sc["isl"]),
            "--output-len", str(sc["osl"]), "--num-prompts", "100", *slo, "--steps", "2,3,4", "--budget", "8",
            "--screen-repeats", "1", "--confirm-front", "1", "--ablation", "off",
            "--point-seconds", f"{point_s:g}", "--capacity-start", f"{8 * SPEED / speed:g}",
            "--capacity-noise", "0.03", "--max-point-seconds", f"{8 * point_s:g}", "--verify-seconds", f"{verify_s:g}", "--ready-timeout",
            "60", "--vocab-size", "2000", "--json", "--report-dir", os.path.join(work, name, "report"),
            *(["--search", "twin"] if search.startswith("twin") else ["--search", "staged"]), *(["--twin-refit"] if search == "twin-refit" else []),
            *(["--twin-design", "always"] if search == "twin-design" else []),
            *(["--max-restarts", str(max_restarts)] if max_restarts else [])]
    t0 = time.time()
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        _stop(state)
        return {"error": f"tune exit {p.returncode}: {p.stderr[-800:]}", "seed": seed}
    res = json.loads(p.stdout)
    runs = glob.glob(os.path.join(work, name, "runs", "*", "*", "rep*-points", "*", "rep*.json"))
    bench_s = sum(json.load(open(f)).get("duration") or 0.0 for f in runs)
    rec = res["recommendation"]
    if rec["capacity"]["req_s"] is None:  # the promise held at no load: nothing promised, nothing to break
        fresh = {"rate": None, "runs": [], "breaks": False, "unverified": True}
    else:
        fresh = _fresh_virtual(sim, rec, sc) if virtual else _fresh(state, rec, sc)
    _stop(state)
    out = {"wall_s": round(wall, 1), "restarts": res["timings"]["restarts"], "benchmark_s": round(bench_s, 1),
           "point_runs": len(runs), "recommendation": rec["config"], "promised_req_s_wall": rec["capacity"]["req_s"],
           "binding_slo": rec.get("binding_slo"), "fresh": fresh}
    if virtual:  # the tune's own clock: simulated seconds, restarts at VIRTUAL_RESTART_S each
        out.update(seed=seed, simulated_s=res["timings"]["total_s"], promised_req_s=rec["capacity"]["req_s"])
    return out


def _fresh_virtual(sim: list[str], rec: dict, sc: dict) -> dict:
    """As :func:`_fresh`, on a fresh virtual start of the recommended configuration."""
    from vkit.cli.sim_server import parse_virtual
    from vkit.measure.gauge import BenchOptions, build_config
    from vkit.sim.virtual import VirtualServer
    from vkit.tune import capacity as cap

    rate = rec["capacity"]["req_s"]
    opts, settings = parse_virtual(sim[2:], 10_000)
    vs = VirtualServer(opts, settings)
    vs.start({k: v for k, v in rec["config"].items() if k in ("max_num_batched_tokens", "max_num_seqs", "max_model_len",
                                                               "gpu_memory_utilization")})
    slo, plan = cap.Slo(dict(sc["slo"])), cap.Plan()
    verdicts = []
    for k in range(3):
        o = BenchOptions(random_input_len=sc["isl"], random_output_len=sc["osl"], num_prompts=max(200, math.ceil(rate * 40)),
                         request_rate=rate, exact_rate=True, seed=90_000 + k, vocab_size=2000)
        j = cap.judge_run(vs.measure(build_config(o, "virtual://", []))[0], slo, plan, rate)
        verdicts.append({"valid": bool(j["valid"]), "holds": bool(j["valid"] and j["margin"] > 0), "margin": j["margin"],
                         "why": j["why"]})
    valid = [v for v in verdicts if v["valid"]]
    return {"rate": rate, "runs": verdicts, "breaks": sum(not v["holds"] for v in valid) >= 2 or len(valid) < 3}


def _fresh(state: str, rec: dict, sc: dict) -> dict:
    """3 valid runs at the promised rate on the server as the tune left it (the kept configuration)."""
    from vkit.measure.gauge import BenchOptions, build_config, measure
    from vkit.state import StateFile
    from vkit.tune import capacity as cap

    st = StateFile(state).read()
    rate = rec["capacity"]["req_s"]
    slo = cap.Slo({k: v / SPEED for k, v in sc["slo"].items()})
    plan = cap.Plan()
    verdicts, k = [], 0
    while sum(v["valid"] for v in verdicts) < 3 and k < 9:
        o = BenchOptions(model=st["service"]["model"], random_input_len=sc["isl"], random_output_len=sc["osl"],
                         num_prompts=max(200, math.ceil(rate * 10)), request_rate=rate, exact_rate=True, seed=90_000 + k,
                         vocab_size=2000)
        out = measure(build_config(o, st["service"]["url"], []))
        j = cap.judge_run(out.summary, slo, plan, rate)
        # a run the client could not keep up with measured the client, not the promise: run another
        verdicts.append({"valid": bool(j["valid"]), "holds": bool(j["valid"] and j["margin"] > 0), "margin": j["margin"],
                         "why": j["why"]})
        k += 1
    valid = [v for v in verdicts if v["valid"]]
    return {"rate_wall": rate, "runs": verdicts, "breaks": sum(not v["holds"] for v in valid) >= 2 or len(valid) < 3}


def _stop(state: str) -> None:
    from vkit.apply import launcher
    from vkit.state import StateFile

    try:
        launcher.stop(StateFile(state).read()["service"].get("running"), grace_s=3)
    except Exception:  # noqa: BLE001 - the benchmark's own clean-up
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated (default {','.join(SCENARIOS)})")
    ap.add_argument("--work", default=os.path.join(ROOT, "vkit-state", "bench-capacity-tune"), help="state and runs")
    ap.add_argument("--out", default=None, help=f"default {OUT} ({OUT_VIRTUAL} with --virtual)")
    ap.add_argument("--virtual", action="store_true",
                    help="tune --virtual: the shipped tune on the simulator in virtual time (seconds a tune), restarts at "
                         f"{VIRTUAL_RESTART_S:g} simulated seconds each")
    ap.add_argument("--truth", choices=("short", "steady"), default="short",
                    help="short: each rate's one 500-request run (the rows so far); steady: long steady-state runs "
                         "judged as a search judges them (minutes a scenario on 2 cores)")
    ap.add_argument("--world", choices=("plain", "hidden", "silicon"), default="plain",
                    help="hidden: each scenario in a world with effects the twin's cost model lacks (sim_server "
                         "--sim-hidden-effects, vkit.sim.hidden); silicon: on step costs fitted to measured H100 runs "
                         f"({SILICON}); each its own truth, rows under NAME+WORLD (default: plain)")
    ap.add_argument("--rescore", action="store_true", help="no tune: score the rows already in --out against --truth")
    ap.add_argument("--seeds", type=int, default=1, help="--virtual: tunes per scenario, --sim-seed 11, 12, ... (default 1)")
    ap.add_argument("--first-seed", type=int, default=11, metavar="S",
                    help="--virtual: the first --sim-seed (default 11); with S past 11 the rows of seeds already in --out "
                         "are kept beside the new ones (each tune names its revision)")
    ap.add_argument("--jobs", type=int, default=2, help="--virtual: tunes run at a time (default 2: one a core here)")
    ap.add_argument("--search", default="staged", help="staged, twin, twin-refit (tune --search twin "
                    "--twin-refit), twin-design (tune --search twin --twin-design always), comma-separated (twin rows go "
                    "under each scenario's 'twin' key, twin-refit's under 'twin_refit', twin-design's under "
                    "'twin_design', in the same file; live: one tune of each a scenario)")
    ap.add_argument("--max-restarts", type=int, default=None, metavar="N", help="--search twin: tune --max-restarts N")
    a = ap.parse_args(argv)
    out_path = a.out or (OUT_VIRTUAL if a.virtual else OUT)
    # scenarios measured earlier (the file this writes) are kept; the ones run now replace theirs
    rows = (json.load(open(out_path)).get("scenarios") or {}) if os.path.exists(out_path) else {}
    rev = revision()
    truths: dict[str, dict] = {}
    for name in a.scenarios.split(","):
        name += f"+{a.world}" if a.world != "plain" and "+" not in name else ""
        sc = scenario(name)
        print(f"== {name}: ground truth ({a.truth})", file=sys.stderr)
        t = steady_truth(name, sc) if a.truth == "steady" else truth(name, sc)
        if a.rescore:  # the tunes measured before, scored against this truth
            if name not in rows:
                continue
            if not ("tunes" in rows[name] or any(k in rows[name] for k in ROW_KEYS.values())):  # a live row
                rows[name] = dict(score(rows[name], sc, t, SPEED), truth=a.truth)
                _write(out_path, rows)
                continue
            if "tunes" in rows[name]:
                rows[name]["tunes"] = [score(r, sc, t, 1.0) for r in rows[name]["tunes"]]
                rows[name].update(summary=spread(rows[name]["tunes"]), truth=a.truth)
            for search, key in ROW_KEYS.items():  # the twin's ranking, where the tune's state is still in --work
                twin = rows[name].get(key)
                for r in (twin or {}).get("tunes") or []:
                    state = os.path.join(a.work, search, f"seed{r.get('seed')}", name, "vkit.json")
                    if "error" not in r and os.path.exists(state):
                        r["twin_ranking"] = twin_ranking(state, t)
                if twin:
                    twin["summary"] = spread(twin["tunes"])
            _write_virtual(out_path, rows)
            continue
        if a.virtual:
            truths[name] = t
            continue
        for search in [x.strip() for x in a.search.split(",") if x.strip()]:
            print(f"== {name}: {search} tune on a live simulator", file=sys.stderr)
            r = score(tune(name, sc, os.path.join(a.work, search) if search != "staged" else a.work, search=search,
                           max_restarts=a.max_restarts if search != "staged" else None), sc, t, SPEED)
            r = dict(r, measured=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), revision=rev or None)
            if search in ROW_KEYS:  # beside the staged row of the same scenario
                rows.setdefault(name, {})[ROW_KEYS[search]] = dict(r, max_restarts=a.max_restarts)
            else:
                rows[name] = dict(r, **{k: rows[name][k] for k in ROW_KEYS.values() if k in rows.get(name, {})})
            print(f"   {name} {search}: {json.dumps(r)}", file=sys.stderr)
            _write(out_path, rows)
    if truths:
        _virtual_tunes(truths, a, rows, out_path, rev)
    return 0


def _one_virtual(job: tuple) -> tuple[str, int, str, dict]:
    name, seed, work, t, search, max_restarts = job
    r = tune(name, scenario(name), work, virtual=True, seed=seed, search=search,
             max_restarts=max_restarts if search.startswith("twin") else None)
    r = score(r, scenario(name), t, 1.0)
    if search.startswith("twin") and "error" not in r:
        r["twin_ranking"] = twin_ranking(os.path.join(work, search, f"seed{seed}", name, "vkit.json"), t)
    return name, seed, search, r


def twin_ranking(state: str, t: dict) -> dict | None:
    """How the twin that ranked the tune's first proposal (fitted on its baseline, with any designed runs) ranks the whole lattice the truth covers: the
    Spearman correlation of its predicted against the true capacities (40 configurations), the median
    and largest |log| error of its predictions (uncorrected by any trial), and its top pick's true
    capacity over the best (Spearman None where every prediction is the same). None when the tune logged no
    twin profile."""
    from scipy.stats import spearmanr

    from vkit.sim.calibrated import load_profile
    from vkit.state import StateFile
    from vkit.tune.twin import Twin

    log = StateFile(state).log.read()
    # the fit that ranked the first proposal (after designed runs, their refit), else the baseline's
    first = next((e for e in log if e.get("event") == "propose"), {})
    sha = (((first.get("audit") or {}).get("twin")) or {}).get("profile_sha256")
    fits = [e for e in log if e.get("event") == "twin_profile"]
    prof = next((e for e in fits if sha and e.get("profile_sha256") == sha), fits[0] if fits else None)
    if prof is None:
        return None
    path = prof["profile"] if os.path.isabs(prof["profile"]) else os.path.join(os.path.dirname(state), prof["profile"])
    twin = Twin.from_inputs(prof["inputs"], load_profile(path)["cost_params"], prof.get("profile_sha256") or "")
    _world({})  # the twin's own engine: never the world's hidden effects
    rows = [(x["capacity"], twin.capacity(dict(x["config"]), hint=twin.hint)) for x in t["table"]]
    err = sorted(abs(math.log(p / c)) for c, p in rows if c > 0 and p > 0)
    top = max(rows, key=lambda r: r[1])
    rho = float(spearmanr([c for c, _ in rows], [p for _, p in rows]).statistic)
    # undefined (None) where the twin predicts one capacity for every configuration
    return {"spearman": round(rho, 3) if math.isfinite(rho) else None,
            "distinct_predictions": len({round(p, 6) for _, p in rows}),
            "median_abs_log_error": round(err[len(err) // 2], 3) if err else None,
            "max_abs_log_error": round(err[-1], 3) if err else None,
            "top_pick_ratio_to_best": round(top[0] / t["best"]["capacity"], 3),
            "fit_rms_log_error": prof.get("rms_log_error"), "configurations": len(rows)}


def _virtual_tunes(truths: dict, a, rows: dict, out_path: str, rev: str) -> None:
    """--virtual: ``a.seeds`` tunes of each scenario, ``a.jobs`` at a time; a scenario's rows are written
    as soon as its last tune ends (an interrupted run keeps the scenarios it finished)."""
    import multiprocessing as mp

    searches = [x.strip() for x in a.search.split(",") if x.strip()]
    seeds = range(a.first_seed, a.first_seed + a.seeds)
    jobs = [(name, seed, a.work, t, search, a.max_restarts) for name, t in truths.items() for seed in seeds
            for search in searches]
    got: dict[tuple[str, str], list] = {(name, s): [] for name in truths for s in searches}
    t0, done = time.time(), 0
    with mp.Pool(max(1, a.jobs)) as pool:
        for name, seed, search, r in pool.imap_unordered(_one_virtual, jobs):
            done += 1
            eta = (time.time() - t0) / done * (len(jobs) - done)
            print(f"   [{done}/{len(jobs)}, ETA {eta / 60:.0f} min] {name} {search} seed {seed}: "
                  f"{json.dumps({k: r.get(k) for k in ('restarts', 'ratio_to_best', 'promise_over_truth', 'error')})}",
                  file=sys.stderr)
            got[(name, search)].append(dict(r, revision=rev or None))
            if len(got[(name, search)]) == a.seeds:
                key = ROW_KEYS.get(search)
                old = (rows.get(name, {}).get(key) if key else rows.get(name)) or {}
                kept = [dict(x, revision=x.get("revision") or old.get("revision")) for x in old.get("tunes") or []
                        if a.first_seed > 11 and x.get("seed") not in seeds] if old.get("truth") == a.truth else []
                runs = sorted(kept + got[(name, search)], key=lambda x: x.get("seed") or 0)
                revs = sorted({x["revision"] for x in runs if x.get("revision")})
                row = {"tunes": runs, "summary": spread(runs), "revision": ",".join(revs) or None, "truth": a.truth,
                       "measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                if key:  # beside the staged rows of the same scenario
                    rows.setdefault(name, {})[key] = dict(row, max_restarts=a.max_restarts)
                else:
                    rows[name] = dict(row, **{k: rows[name][k] for k in ROW_KEYS.values() if k in rows.get(name, {})})
                _write_virtual(out_path, rows)


def score(r: dict, sc: dict, t: dict, speed: float) -> dict:
    """A tune's row scored against the truth: the recommendation's true capacity over the best, the
    promise (req/s the client saw, / ``speed``) over the recommendation's true capacity."""
    if "error" in r:
        return r
    cfg = r["recommendation"]
    key = {k: cfg.get(k) for k in START}
    got = next((x["capacity"] for x in t["table"] if x["config"] == key), None)
    if got is None and str(t.get("truth", "")).startswith("steady"):  # a step-4 midpoint: off the lattice
        got = _steady_capacity((sc, key, t["best"]["capacity"]))
    elif got is None:
        got = true_capacity(sc, key, t["best"]["capacity"])
    r["true_capacity"] = got
    r["best_capacity"] = t["best"]["capacity"]
    r["best_config"] = t["best"]["config"]
    r["start_capacity"] = t["start"]
    r["truth_digest"], r["truth_seqs"] = t["digest"], SEQS
    r["ratio_to_best"] = got / t["best"]["capacity"] if t["best"]["capacity"] else None
    r["within_98pct"] = bool(r["ratio_to_best"] is not None and r["ratio_to_best"] >= TARGET_RATIO)
    r["promise_over_truth"] = (r["promised_req_s_wall"] / speed) / got if got and r["promised_req_s_wall"] else None
    return r


def spread(runs: list[dict]) -> dict:
    """Median and range over a scenario's seeded tunes of what each cost and where it landed."""
    done = [r for r in runs if "error" not in r]
    out: dict = {"tunes": len(runs), "finished": len(done), "within_98pct": sum(r["within_98pct"] for r in done),
                 "fresh_breaks": sum(r["fresh"]["breaks"] for r in done),
                 "unverified": sum(bool(r["fresh"].get("unverified")) for r in done)}
    for k in ("restarts", "simulated_s", "ratio_to_best", "promise_over_truth", "wall_s"):
        v = sorted(float(r[k]) for r in done if r.get(k) is not None)
        out[k] = {"median": v[len(v) // 2], "min": v[0], "max": v[-1]} if v else None
    rho = sorted(r["twin_ranking"]["spearman"] for r in done if (r.get("twin_ranking") or {}).get("spearman") is not None)
    if rho:
        out["twin_spearman"] = {"median": rho[len(rho) // 2], "min": rho[0], "max": rho[-1]}
    if out["simulated_s"]:
        out["simulated_hours"] = {k: round(x / 3600, 2) for k, x in out["simulated_s"].items()}
    return out


def _write_virtual(out: str, rows: dict) -> None:
    doc = {"benchmark": "capacity_tune (virtual backend)", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "restart_s": VIRTUAL_RESTART_S,
           "targets": {"ratio_to_best": TARGET_RATIO, "fresh_breaks": 0}, "scenarios": rows,
           "scenario_defs": {k: scenario(k) for k in rows if k.partition("+")[0] in SCENARIOS}, "start": START,
           "command": "python3 bench/bench_capacity_tune.py --virtual --seeds N"}
    old = json.load(open(out)) if os.path.exists(out) else {}
    # the commands of earlier rows that the generic one does not give (twin_refit_command, world_commands)
    doc.update({k: v for k, v in old.items() if k.endswith(("_command", "_commands"))})
    write_result(out, doc, indent=1)


def _live_summary(rs: list[dict]) -> dict:
    done = [r for r in rs if "error" not in r]
    return {
        "scenarios": len(rs), "finished": len(done),
        "within_98pct": sum(r["within_98pct"] for r in done),
        "fresh_breaks": sum(r["fresh"]["breaks"] for r in done),
        "median_restarts": sorted(r["restarts"] for r in done)[len(done) // 2] if done else None,
        "median_benchmark_s": sorted(r["benchmark_s"] for r in done)[len(done) // 2] if done else None,
    }


def _write(out: str, rows: dict) -> None:
    summary = _live_summary([r for r in rows.values() if "restarts" in r or "error" in r])  # the staged rows
    for key in ROW_KEYS.values():  # the twin's rows beside them, where a scenario has one
        beside = [r[key] for r in rows.values() if isinstance(r.get(key), dict)]
        if beside:
            summary[key] = _live_summary(beside)
    doc = {"benchmark": "capacity_tune", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "sim_speed": SPEED,
           "targets": {"ratio_to_best": TARGET_RATIO, "fresh_breaks": 0}, "summary": summary, "scenarios": rows,
           "scenario_defs": {k: scenario(k) for k in rows if k.partition("+")[0] in SCENARIOS}, "start": START,
           "command": "python3 bench/bench_capacity_tune.py"}
    write_result(out, doc, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.exit(main())
