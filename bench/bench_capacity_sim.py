#!/usr/bin/env python3
"""SLO capacity on a live simulated server: ``bin/capacity``, repeated, against the virtual-time truth.

- **The server**: one ``bin/sim_server`` (HTTP, the simulator's engine in wall time) with one of
  bench_capacity_interval's scenarios (``--scenario``, default ttft-smooth: Llama-3.1-8B on one H200,
  2,048 prompt / 64 output tokens, 256 sequences), ``--sim-speed K`` (default 4: virtual time runs
  K times faster than wall time, so a 2-core client offers K x the scenario's rates in wall
  seconds), the simulator's default run-to-run noise (``--sim-noise 0.02``) and no between-restart
  draw (``--sim-restart-noise 0``: one search measures one start, as in the virtual-time benchmark).
- **The searches**: ``--searches`` (20) runs of ``bin/capacity`` at its defaults (the boundary
  model, 5 % precision), one arrival seed each, the scenario's SLO and plan in wall units (latency
  limits / K, loads x K, point seconds / K), one after another with nothing else on the machine.
- **The truth**: the scenario's capacity from bench_capacity_interval (the same engine in virtual
  time without noise, judged as a search judges a run, 6 x 6,000-request runs per load), x K.
- **Scored** as bench_capacity_interval scores (in the scenario's own units, the search's figures / K):
  median and 90th percentile |error|, 95 % interval coverage, below / above, width, points, runs,
  request-seconds (virtual), and each search's wall time; the virtual-time figures of the same
  scenario from bench/results/capacity_interval.json beside them.

Writes bench/results/capacity_sim.json (rows as they come: an interrupted run keeps what it
measured). Run: python3 bench/bench_capacity_sim.py [--searches 20] [--speed 4] [--scenario NAME]
(about 2 minutes a search on 2 cores at the defaults).
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, os.path.join(ROOT, "bench"))

import bench_capacity_interval as virtual  # noqa: E402
from harness import free_port, write_result  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results", "capacity_sim.json")
MODEL = "sim-8b"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def server_argv(sc: dict, port: int, speed: float, seed: int) -> list[str]:
    serve = sc["serve"]
    return [sys.executable, os.path.join(ROOT, "bin", "sim_server"), MODEL, "--port", str(port),
            "--sim-model", sc["model"], "--sim-gpu", sc["gpu"], "-tp", str(sc["tp"]),
            "--max-model-len", str(serve["max_model_len"]), "--max-num-batched-tokens", str(serve["max_num_batched_tokens"]),
            "--max-num-seqs", str(serve["max_num_seqs"]), "--sim-speed", f"{speed:g}", "--sim-startup-s", "0",
            "--sim-noise", f"{virtual.NOISE:g}", "--sim-restart-noise", "0", "--sim-seed", str(seed),
            "--disable-log-stats", "--disable-uvicorn-access-log"]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    import requests
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"bench_capacity_sim: the simulated server exited ({proc.returncode})")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise SystemExit(f"bench_capacity_sim: no /health from {url} within {timeout:g} s")


def search(url: str, sc: dict, speed: float, seed: int, run_dir: str) -> dict:
    """One bin/capacity search in wall units; its figures back in the scenario's units (/ speed)."""
    slo = [a for k, v in sc["slo"].items() for a in ("--slo", f"{k}={v / speed:g}")]
    plan = virtual.cap.Plan()
    argv = [sys.executable, os.path.join(ROOT, "bin", "capacity"), "--url", url, "--model", MODEL,
            "--random-input-len", str(sc["isl"]), "--random-output-len", str(sc["osl"]), "--num-prompts", "100",
            *slo, "--keep-up", f"{virtual.KEEP_UP:g}", "--start", f"{sc['start'] * speed:g}", "--seed", str(seed),
            "--point-seconds", f"{plan.point_seconds / speed:g}", "--max-point-seconds", f"{plan.max_point_seconds / speed:g}",
            "--run-dir", run_dir, "--json", "-q"]
    t0 = time.time()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    wall = time.time() - t0
    try:
        doc = json.loads(p.stdout)
    except ValueError:
        return {"seed": seed, "exit": p.returncode, "error": p.stderr.strip()[-300:], "wall_s": wall}
    lo, hi = doc.get("interval") or (None, None)

    def scale(x):
        return x / speed if isinstance(x, (int, float)) else None

    rs = doc.get("request_seconds")
    return {"seed": seed, "exit": p.returncode, "estimate": scale(doc.get("capacity")), "lo": scale(lo), "hi": scale(hi),
            "binding": doc.get("binding_slo"), "shape": doc.get("boundary"), "stop": doc.get("stop"),
            "points": doc.get("points"), "runs": doc.get("runs"), "requests": doc.get("requests"),
            # wall request-seconds x speed: the seconds of load in the scenario's own (virtual) time
            "request_seconds": rs * speed if isinstance(rs, (int, float)) else None, "wall_s": wall}


def summarise(rows: list[dict], truth: float) -> dict:
    ok = [r for r in rows if "error" not in r]
    out = virtual.score([{**r, "method": "model"} for r in ok], truth) if ok else {"searches": 0}
    out["failed_searches"] = len(rows) - len(ok)
    walls = sorted(r["wall_s"] for r in ok)
    out["median_wall_s"] = walls[len(walls) // 2] if walls else None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="ttft-smooth", choices=sorted(virtual.SCENARIOS))
    ap.add_argument("--searches", type=int, default=20)
    ap.add_argument("--speed", type=float, default=4.0, help="--sim-speed (default 4)")
    ap.add_argument("--seed", type=int, default=1, help="the server's --sim-seed; search i uses arrival seed 1000 x i")
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args(argv)
    if a.searches < 1 or a.speed <= 0:
        ap.error("need --searches >= 1 and --speed > 0")
    sc = virtual.SCENARIOS[a.scenario]
    truth = virtual.cached_truth(a.scenario)
    log(f"{a.scenario}: truth {truth:.4g} req/s (virtual time) = {truth * a.speed:.4g} req/s at --sim-speed {a.speed:g}")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    tmp = tempfile.mkdtemp(prefix="vkit-capsim-")
    server_log = open(os.path.join(tmp, "server.log"), "w")
    proc = subprocess.Popen(server_argv(sc, port, a.speed, a.seed), stdout=server_log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    rows: list[dict] = []
    doc = {"benchmark": "capacity_sim", "scenario": a.scenario, "scenario_spec": sc, "speed": a.speed, "server_seed": a.seed,
           "truth": truth, "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "revision": virtual._revision(), "rows": rows}
    try:
        old = json.load(open(virtual.OUT))["scenarios"][a.scenario]["model"]
        doc["virtual_time"] = {k: old.get(k) for k in ("searches", "median_abs_error", "p90_abs_error", "coverage",
                                                       "median_width", "median_points", "median_runs", "median_request_seconds")}
    except (OSError, ValueError, KeyError, TypeError):
        doc["virtual_time"] = None

    def save() -> None:
        doc["summary"] = summarise(rows, truth)
        write_result(a.out, doc, "capacity_sim", indent=1)

    t0 = time.time()
    try:
        wait_ready(url, proc)
        for i in range(a.searches):
            r = search(url, sc, a.speed, 1000 * (i + 1), os.path.join(tmp, f"search{i}"))
            rows.append(r)
            save()
            left = (time.time() - t0) / (i + 1) * (a.searches - i - 1)
            if "error" in r:
                log(f"search {i + 1}/{a.searches}: failed (exit {r['exit']}): {r['error']}")
            else:
                log(f"search {i + 1}/{a.searches}: {r['estimate'] or float('nan'):.4g} [{r['lo'] or float('nan'):.4g}, "
                    f"{r['hi'] or float('nan'):.4g}] (truth {truth:.4g}), {r['runs']} runs, {r['wall_s']:.0f} s; "
                    f"ETA {left / 60:.0f} min")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        save()
    s = doc["summary"]
    log(f"coverage {s.get('coverage')}, median |error| {s.get('median_abs_error')}, written {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
