#!/usr/bin/env python3
"""How closely does bench_stream keep an open-loop arrival schedule at the rates a capacity
search offers? The send lag: actual send − scheduled send, per request, at p50/p99/max.

Against sim_server (qwen2.5-0.5b on H200, --sim-speed 1, no noise: the server is fast and cheap,
so the lag is the client's), the client process pinned to one core and the server to the other
where the machine has two. Rates 50, 100, 200, 500 req/s (default), 32 output tokens, streaming,
for --seconds each (default 10). Target: p99 <= 1 ms at 500 req/s on one core. Writes
bench/results/send_lag.json. Run: python3 bench/bench_send_lag.py   (about a minute)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from harness import free_port, write_result  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results", "send_lag.json")
TARGET_P99_MS, TARGET_RATE = 1.0, 500.0



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", default="50,100,200,500", help="req/s, comma-separated (default 50,100,200,500)")
    ap.add_argument("--seconds", type=float, default=10.0, help="seconds per rate (default 10)")
    ap.add_argument("--out", default=OUT, help="result file (default bench/results/send_lag.json)")
    a = ap.parse_args(argv)
    from vkit.cli import bench_stream

    cpus = sorted(os.sched_getaffinity(0))
    client_cpu, server_cpu = cpus[0], (cpus[1] if len(cpus) > 1 else cpus[0])
    port = free_port()
    srv = subprocess.Popen([sys.executable, os.path.join(ROOT, "bin", "sim_server"), "sim", "--port", str(port),
                            "--sim-model", "qwen2.5-0.5b", "--sim-gpu", "H200", "--sim-speed", "1", "--sim-noise", "0",
                            "--sim-restart-noise", "0", "--sim-startup-s", "0", "--sim-seed", "1", "--max-model-len", "2048",
                            "--disable-uvicorn-access-log"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           preexec_fn=lambda: os.sched_setaffinity(0, {server_cpu}))
    rows = []
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        os.sched_setaffinity(0, {client_cpu})
        for rate in (float(x) for x in a.rates.split(",")):
            out = io.StringIO()
            n = int(rate * a.seconds)
            rc = bench_stream.main(["--url", f"http://127.0.0.1:{port}", "--model", "sim", "--random-input-len", "64",
                                    "--random-output-len", "32", "--num-prompts", str(n), "--request-rate", f"{rate:g}",
                                    "--exact-rate", "--seed", "1", "-q", "--json"], stdout=out, stderr=io.StringIO())
            d = json.loads(out.getvalue())
            lag = d["vkit"]["dispatch_lag_ms"]
            row = {"rate": rate, "requests": n, "exit": rc, "failed": d["failed"], "send_lag_ms": {k: round(lag[k], 4) for k in
                   ("p50", "p95", "p99", "max")}, "achieved_req_s": round(d["request_throughput"], 1),
                   "client_cpu_s": round(d["vkit"]["client"]["cpu_s"], 2), "wall_s": round(d["duration"], 2)}
            rows.append(row)
            print(f"bench_send_lag: {rate:5g} req/s: send lag p50 {lag['p50']:.3f} ms, p99 {lag['p99']:.3f} ms, "
                  f"max {lag['max']:.2f} ms; {row['client_cpu_s']} client CPU s in {row['wall_s']} s", file=sys.stderr)
    finally:
        os.sched_setaffinity(0, set(cpus))
        srv.terminate()
        srv.wait(timeout=10)
    at = next((r for r in rows if r["rate"] == TARGET_RATE), None)
    result = {
        "benchmark": "bench_stream open-loop send lag (actual - scheduled send)",
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "client_cpu": client_cpu, "server_cpu": server_cpu,
                    "python": platform.python_version(), "loadavg_1m_after": round(os.getloadavg()[0], 2)},
        "workload": {"input_tokens": 64, "output_tokens": 32, "stream": True, "seconds_per_rate": a.seconds,
                     "server": "sim_server qwen2.5-0.5b on H200, speed 1, no noise", "exact_rate": True},
        "rates": rows,
        "target": {"rate": TARGET_RATE, "p99_ms": TARGET_P99_MS,
                   "met": bool(at and at["send_lag_ms"]["p99"] <= TARGET_P99_MS)},
    }
    write_result(a.out, result, "send_lag", sort_keys=True)
    print(json.dumps({"rates": [{"rate": r["rate"], "p99_ms": r["send_lag_ms"]["p99"]} for r in rows],
                      "target_met": result["target"]["met"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
