#!/usr/bin/env python3
"""How far behind its own virtual-time schedule does sim_server emit tokens, at what CPU cost, and how noisy is it?

Starts ``bin/sim_server`` (default profile: 8B on one H200, --sim-speed 1) and drives it
with 16, 64 and 256 concurrent streaming requests from a light asyncio client (raw
sockets, no JSON parsing). The server records, for every token, the lag between the wall
time its step was scheduled to end and the moment the token's SSE event was written; it
reports the lag percentiles and its own CPU time through ``/sim/stats``. Results go to
``bench/results/sim.json``. Target: p99 lag <= 2 ms at 64 streams on 2 cores.

Noise (``--part noise``): K starts of one server command (same ``--sim-seed``, one
``--sim-start-file``) x N back-to-back ``bench_stream`` runs each (the demo's workload: 512/128,
32 streams, 160 prompts, a new prompt seed per run); the realised within-process and
between-restart sd of output throughput, by the one-way variance-components estimate, against
the settings. The same estimate on the engine alone in virtual time with many more starts
pins the model's own figures. Results go to ``bench/results/sim_noise.json``.

Usage: python3 bench/bench_sim.py [--part lag|noise|all] [--seconds 20] [--levels 16,64,256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results", "sim.json")
NOISE_RESULTS = os.path.join(ROOT, "bench", "results", "sim_noise.json")
sys.path.insert(0, ROOT)
from harness import free_port, write_result  # noqa: E402

TARGET_P99_MS = 2.0
PROMPT_TOKENS = 256
OUTPUT_TOKENS = 256



def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


class StreamClient(asyncio.Protocol):
    """Sends one streaming completion after another on a keep-alive connection; counts events."""

    def __init__(self, request: bytes, stop_at: float, stats: dict, done: asyncio.Future):
        self.request = request
        self.stop_at = stop_at
        self.stats = stats
        self.done = done
        self.tail = b""
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes):
        buf = self.tail + data
        self.stats["events"] += buf.count(b"data: ") - self.tail.count(b"data: ")
        finished = buf.count(b"data: [DONE]") - self.tail.count(b"data: [DONE]")
        self.tail = buf[-16:]
        if finished:
            self.stats["requests"] += finished
            if time.perf_counter() < self.stop_at:
                self.transport.write(self.request)
            else:
                self.transport.close()

    def connection_lost(self, exc):
        if not self.done.done():
            self.done.set_result(None)


async def drive(port: int, concurrency: int, seconds: float) -> dict:
    ids = list(range(1000, 1000 + PROMPT_TOKENS))
    loop = asyncio.get_running_loop()
    stats = {"events": 0, "requests": 0}
    stop_at = time.perf_counter() + seconds
    futs = []
    for k in range(concurrency):
        # Distinct prompts (no prefix-cache hits) so every request pays its prefill.
        body = json.dumps({"model": "sim", "prompt": [k] + ids, "max_tokens": OUTPUT_TOKENS, "ignore_eos": True,
                           "stream": True}).encode()
        req = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body)) + body
        done = loop.create_future()
        await loop.create_connection(lambda req=req, done=done: StreamClient(req, stop_at, stats, done), "127.0.0.1", port)
        futs.append(done)
    await asyncio.wait_for(asyncio.gather(*futs), timeout=seconds + 120)
    return stats


def run_level(port: int, concurrency: int, seconds: float) -> dict:
    base = f"http://127.0.0.1:{port}"
    get_json(base + "/sim/stats?reset=1")
    c0 = os.times()
    w0 = time.perf_counter()
    client = asyncio.run(drive(port, concurrency, seconds))
    wall = time.perf_counter() - w0
    c1 = os.times()
    s = get_json(base + "/sim/stats?reset=1")
    tokens = s["lag_ms"]["n"]
    return {
        "concurrency": concurrency,
        "wall_s": round(wall, 2),
        "lag_ms": {k: round(v, 3) for k, v in s["lag_ms"].items() if k != "n"},
        "tokens": tokens,
        "tokens_per_s": round(tokens / s["wall_s"], 1),
        "server_cpu_cores": round(s["cpu_s"] / s["wall_s"], 3),
        "server_cpu_us_per_token": round(1e6 * s["cpu_s"] / tokens, 2) if tokens else None,
        "engine_steps": s["steps"],
        "reanchors": s["reanchors"],
        "client_requests": client["requests"],
        "client_events": client["events"],
        "client_cpu_cores": round((c1.user + c1.system - c0.user - c0.system) / wall, 3),
    }


def lag_part(a) -> int:
    levels = [int(x) for x in a.levels.split(",")]
    port = free_port()
    flags = ["sim", "--port", str(port), "--sim-startup-s", "0", "--sim-speed", str(a.speed), "--sim-seed", "1",
             "--max-model-len", "4096"]
    load_before = os.getloadavg()
    log = tempfile.NamedTemporaryFile("w+", prefix="bench_sim_", suffix=".log", delete=False)
    nice = a.server_nice
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "bin", "sim_server"), *flags],
                            stdout=log, stderr=subprocess.STDOUT, preexec_fn=(lambda: os.nice(nice)) if nice else None)
    try:
        deadline = time.time() + 30
        while True:
            try:
                get_json(f"http://127.0.0.1:{port}/version")
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"bench_sim: sim_server did not start; see {log.name}") from None
                time.sleep(0.05)
        asyncio.run(drive(port, 8, 1.0))  # warm-up
        rows = []
        for c in levels:
            row = run_level(port, c, a.seconds)
            rows.append(row)
            print(f"bench_sim: {c:4d} streams: lag p50 {row['lag_ms']['p50']:.3f} ms, p99 {row['lag_ms']['p99']:.3f} ms, "
                  f"server CPU {row['server_cpu_cores']:.2f} cores ({row['server_cpu_us_per_token']} us/token), "
                  f"{row['tokens_per_s']:.0f} tok/s, {row['reanchors']} re-anchors, "
                  f"client CPU {row['client_cpu_cores']:.2f} cores", file=sys.stderr)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    at64 = next((r for r in rows if r["concurrency"] == 64), None)
    best_us = min(r["server_cpu_us_per_token"] for r in rows if r["server_cpu_us_per_token"])
    result = {
        "benchmark": "sim_server emission lag and CPU",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "loadavg_1m_before": round(load_before[0], 2), "loadavg_1m_after": round(os.getloadavg()[0], 2),
                    "note": "other processes on the same cores inflate the lag tail; compare with the load average"},
        "server_flags": flags[1:],
        "server_nice": a.server_nice,
        "workload": {"prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS, "stream": True,
                     "closed_loop": True, "seconds_per_level": a.seconds},
        "lag_definition": "wall time an SSE token event was written minus the wall time its engine step was "
                          "scheduled to end (virtual step end / sim speed)",
        "levels": rows,
        "target": {"p99_lag_ms_at_64_streams": TARGET_P99_MS,
                   "met": bool(at64 and at64["lag_ms"]["p99"] <= TARGET_P99_MS)},
        "bound": {
            "server_cpu_us_per_token_best": best_us,
            "max_tokens_per_s_per_core": round(1e6 / best_us) if best_us else None,
            "note": "a step's tokens are written one after another, so the last stream of a step lags by "
                    "about (streams in the step) x (us per token); the p99 lag grows roughly linearly "
                    "with concurrency once that exceeds the event loop's wake-up jitter",
        },
    }
    write_result(a.out, result, "sim", sort_keys=True)
    print(json.dumps({"levels": [{k: r[k] for k in ("concurrency", "lag_ms", "server_cpu_cores")} for r in rows],
                      "target_met": result["target"]["met"]}, indent=1))
    os.unlink(log.name)
    return 0


NOISE_FLAGS = ["sim-8b", "--max-model-len", "8192", "--sim-gpu", "H200", "--sim-model", "llama-3.1-8b",
               "--sim-startup-s", "0.2", "--sim-seed", "11"]
NOISE_BENCH = ["--model", "sim-8b", "--max-concurrency", "32", "--random-input-len", "512", "--random-output-len", "128",
               "--num-prompts", "160", "-q", "--json"]


def start_sim(flags: list[str], log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "bin", "sim_server"), *flags],
                            stdout=log, stderr=subprocess.STDOUT)


def wait_up(port: int, proc: subprocess.Popen, log_name: str) -> None:
    deadline = time.time() + 30
    while True:
        try:
            get_json(f"http://127.0.0.1:{port}/version")
            return
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"bench_sim: sim_server did not start; see {log_name}") from None
            time.sleep(0.05)


def live_noise(starts: int, runs: int, speed: float, sigma: float, restart: float | None) -> dict:
    """Throughput of ``runs`` back-to-back bench_stream runs (in-process, as tune calls it) per start."""
    import io

    from vkit.cli import bench_stream

    tmp = tempfile.mkdtemp(prefix="bench_sim_noise_")
    start_file = os.path.join(tmp, "starts")
    groups = []
    t0 = time.time()
    for k in range(starts):
        port = free_port()
        flags = [*NOISE_FLAGS, "--port", str(port), "--sim-speed", str(speed), "--sim-noise", str(sigma),
                 "--sim-start-file", start_file] + (["--sim-restart-noise", str(restart)] if restart is not None else [])
        with open(os.path.join(tmp, f"server{k}.log"), "w") as log:
            proc = start_sim(flags, log)
            try:
                wait_up(port, proc, log.name)
                vals = []
                for j in range(runs):
                    out = io.StringIO()
                    rc = bench_stream.main(["--url", f"http://127.0.0.1:{port}", *NOISE_BENCH, "--seed", str(1000 + j)],
                                           stdout=out, stderr=io.StringIO())
                    if rc != 0:
                        raise SystemExit(f"bench_sim: bench_stream exit {rc} on start {k + 1}, run {j + 1}")
                    vals.append(json.loads(out.getvalue())["output_throughput"])
            finally:
                proc.terminate()
                proc.wait(timeout=10)
        groups.append(vals)
        el = time.time() - t0
        print(f"bench_sim: noise start {k + 1}/{starts}: mean {sum(vals) / len(vals):.0f} tok/s over {runs} runs; "
              f"ETA {el / (k + 1) * (starts - k - 1):.0f} s", file=sys.stderr)
    return {"groups_tok_s": [[round(v, 1) for v in g] for g in groups], "wall_s": round(time.time() - t0, 1)}


def engine_noise(starts: int, runs: int, sigma: float, restart: float | None) -> list[list[float]]:
    """The same design on the engine alone in virtual time (the server's gap rule, no sockets)."""
    from vkit.sim.engine import Noise
    from vkit.sim.harness import SimRequest, engine_for, random_prompts, simulate

    rs = 0.75 * sigma if restart is None else restart
    groups = []
    for k in range(starts):
        eng = engine_for(noise=Noise(sigma, seed=11, regime_gap_s=0.5, restart_sigma=rs, start_index=k + 1))
        t, vals = 0.0, []
        for j in range(runs):
            prompts = random_prompts(64, 512, seed=1000 + j)
            out = simulate(eng, [SimRequest(prompt_ids=p, max_tokens=128, arrival=t) for p in prompts], concurrency=32)
            vals.append(out["output_tok_s"])
            t = max(tm.token_times[-1] for tm in out["timings"]) + 1.0
        groups.append(vals)
    return groups


def components(groups: list[list[float]]) -> dict:
    import numpy as np

    from vkit.decide.stats import variance_components

    vc = variance_components([np.log(g) for g in groups])
    return {k: (round(v, 5) if isinstance(v, float) else [round(x, 5) for x in v] if isinstance(v, list) else v)
            for k, v in vc.as_dict().items()}


def noise_part(a) -> int:
    rs = 0.75 * a.sigma if a.restart_sigma is None else a.restart_sigma
    live = live_noise(a.starts, a.runs, a.speed_noise, a.sigma, a.restart_sigma)
    live_vc = components(live["groups_tok_s"])
    eng_groups = engine_noise(a.engine_starts, a.runs, a.sigma, a.restart_sigma)
    eng_vc = components(eng_groups)
    result = {
        "benchmark": "sim_server realised noise: within a process and between restarts",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_1m_after": round(os.getloadavg()[0], 2)},
        "settings": {"sim_noise": a.sigma, "sim_restart_noise": rs, "sim_seed": 11, "sim_speed": a.speed_noise},
        "design": {"starts": a.starts, "runs_per_start": a.runs, "server_flags": NOISE_FLAGS, "bench_stream": NOISE_BENCH,
                   "prompt_seed": "1000 + run index", "estimate": "one-way random effects on log output throughput "
                   "(ANOVA moments); 90% intervals: chi-square (within), Satterthwaite (between)"},
        "live": {**live, "sd": live_vc},
        "engine_virtual_time": {"starts": a.engine_starts, "runs_per_start": a.runs, "sd": eng_vc,
                                "workload": "64 prompts 512/128 at 32 streams, 1 s idle between runs"},
        "note": "between includes the slow wander (OU, sd 0.25 x sim_noise, 60 s correlation), which stays "
                "nearly constant over one start's few back-to-back runs",
    }
    write_result(a.noise_out, result, "sim_noise", sort_keys=True)
    for name, vc in (("live server", live_vc), ("engine, virtual time", eng_vc)):
        print(f"bench_sim: noise ({name}): within {100 * vc['within']:.2f}% "
              f"[{100 * vc['within_ci'][0]:.2f}, {100 * vc['within_ci'][1]:.2f}] (set {100 * a.sigma:g}%), between "
              f"{100 * vc['between']:.2f}% [{100 * vc['between_ci'][0]:.2f}, {100 * vc['between_ci'][1]:.2f}] "
              f"(set {100 * rs:g}%)", file=sys.stderr)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=["lag", "noise", "all"], default="all", help="what to measure (default: all)")
    ap.add_argument("--seconds", type=float, default=20.0, help="lag: measured seconds per level (default: 20)")
    ap.add_argument("--levels", default="16,64,256", help="lag: concurrent streams per level (default: 16,64,256)")
    ap.add_argument("--speed", type=float, default=1.0, help="lag: --sim-speed of the server (default: 1)")
    ap.add_argument("--server-nice", type=int, default=0,
                    help="lag: nice value for the server, e.g. -10 to measure it without interference from other "
                         "processes on a busy machine (needs privileges) (default: 0)")
    ap.add_argument("--out", default=RESULTS, help=f"lag result file (default: {os.path.relpath(RESULTS, ROOT)})")
    ap.add_argument("--starts", type=int, default=12, help="noise: server starts (default: 12)")
    ap.add_argument("--runs", type=int, default=5, help="noise: back-to-back runs per start (default: 5)")
    ap.add_argument("--engine-starts", type=int, default=200, help="noise: starts of the virtual-time estimate (default: 200)")
    ap.add_argument("--speed-noise", type=float, default=4.0, help="noise: --sim-speed, as the demo (default: 4)")
    ap.add_argument("--sigma", type=float, default=0.02, help="noise: --sim-noise (default: 0.02)")
    ap.add_argument("--restart-sigma", type=float, default=None, help="noise: --sim-restart-noise (default: the server's)")
    ap.add_argument("--noise-out", default=NOISE_RESULTS,
                    help=f"noise result file (default: {os.path.relpath(NOISE_RESULTS, ROOT)})")
    a = ap.parse_args(argv)
    rc = lag_part(a) if a.part in ("lag", "all") else 0
    return rc or (noise_part(a) if a.part in ("noise", "all") else 0)


if __name__ == "__main__":
    sys.exit(main())
