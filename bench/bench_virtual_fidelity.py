#!/usr/bin/env python3
"""Is the virtual backend faithful to a live simulator? The same seeded tune (throughput objective,
steps 1 and 2, no noise) run twice: once against a live ``sim_server`` process at ``--sim-speed 1``
(wall time is simulated time), once with ``tune --virtual`` on the same state (the simulator's engine
in virtual time, no process). Compared: each trial's verdict, the recommendation, and every trial's
measured output throughput and P95 TTFT (live / virtual - 1), with each run's cost.

With the simulator's noise off, the live run differs from the virtual one only by the wall clock's
jitter (the client's reads, the server's step writes on a shared machine) and the HTTP path. Writes
bench/results/virtual_fidelity.json. Run: python3 bench/bench_virtual_fidelity.py [--out FILE]
(about 5 minutes on 2 cores, most of it the live tune).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "results", "virtual_fidelity.json")
PY = sys.executable
SIM = ["--max-model-len", "8192", "--sim-gpu", "H200", "--sim-model", "llama-3.1-8b", "--sim-seed", "11",
       "--sim-speed", "1", "--sim-startup-s", "0.5", "--sim-noise", "0", "--sim-restart-noise", "0"]
TUNE = ["--sandbox", "--objective", "throughput", "--concurrency", "32", "--input-len", "512", "--output-len", "128",
        "--num-prompts", "200", "--slo", "p95_ttft_ms=1000", "--steps", "1,2", "--budget", "2", "--ablation", "off",
        "--ready-timeout", "60", "--json"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tool(name: str, *argv: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([PY, os.path.join(ROOT, "bin", name), *argv], env=env, capture_output=True, text=True)


def one_tune(workdir: str, virtual: bool) -> dict:
    os.makedirs(workdir, exist_ok=True)
    state = os.path.join(workdir, "state.json")
    env = {**os.environ, "VKIT_STATE": state}
    port = free_port()
    r = tool("state", "init", "--url", f"http://127.0.0.1:{port}", "--model", "sim-8b", "--set", "max_num_batched_tokens=2048",
             "--set", "max_num_seqs=16", "--", PY, os.path.join(ROOT, "bin", "sim_server"), "sim-8b", "--port", str(port), *SIM,
             env=env)
    if r.returncode:
        raise SystemExit(f"state init failed: {r.stderr}")
    t0 = time.time()
    r = tool("tune", *(["--virtual"] if virtual else []), *TUNE, env=env)
    wall = time.time() - t0
    if r.returncode:
        raise SystemExit(f"tune ({'virtual' if virtual else 'live'}) failed (exit {r.returncode}): {r.stderr[-2000:]}")
    res = json.loads(r.stdout)
    st = json.load(open(state))
    trials = {}
    for t in res["trials"]:
        runs = [json.load(open(os.path.join(workdir, p))) for p in (next(x for x in st["trials"] if x["id"] == t["id"]).get("runs") or [])]
        trials[t["id"]] = {"config": t["config"], "status": t["status"], "verdict": t.get("verdict"),
                           "output_throughput": [s["output_throughput"] for s in runs],
                           "p95_ttft_ms": [s["p95_ttft_ms"] for s in runs]}
    tim = st.get("timing") or {}
    return {"wall_s": wall, "trials": trials, "recommendation": res["recommendation"]["config"],
            "restarts": (tim.get("restart") or {}).get("n"), "runs": (tim.get("run") or {}).get("n"),
            "run_s": (tim.get("run") or {}).get("s")}


def compare(live: dict, virt: dict) -> dict:
    rows, ratios = [], {"output_throughput": [], "p95_ttft_ms": []}
    for tid, lt in live["trials"].items():
        vt = virt["trials"].get(tid)
        row = {"trial": tid, "config": lt["config"], "live": lt["status"], "virtual": vt["status"] if vt else None,
               "same_config": bool(vt) and vt["config"] == lt["config"]}
        for m in ratios:
            if vt and lt[m] and vt[m]:
                k = min(len(lt[m]), len(vt[m]))
                r = [a / b - 1 for a, b in zip(lt[m][:k], vt[m][:k], strict=True)]
                row[m] = r
                ratios[m] += r
        rows.append(row)
    med = {m: (sorted(abs(x) for x in v)[len(v) // 2] if v else None) for m, v in ratios.items()}
    mx = {m: (max(abs(x) for x in v) if v else None) for m, v in ratios.items()}
    return {"trials": rows, "same_decisions": all(r["same_config"] and r["live"] == r["virtual"] for r in rows)
            and len(live["trials"]) == len(virt["trials"]),
            "same_recommendation": live["recommendation"] == virt["recommendation"],
            "median_abs_live_over_virtual_minus_1": med, "max_abs_live_over_virtual_minus_1": mx}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vkit-fidelity-") as d:
        print("virtual tune ...", file=sys.stderr)
        virt = one_tune(os.path.join(d, "virtual"), True)
        print(f"  {virt['wall_s']:.0f} s wall; live tune (about {virt['run_s'] or 0:.0f} s of runs) ...", file=sys.stderr)
        live = one_tune(os.path.join(d, "live"), False)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    out = {"revision": rev or None, "machine": platform.node(), "command": "python3 bench/bench_virtual_fidelity.py",
           "sim_server": SIM, "tune": TUNE, "live": live, "virtual": virt, "comparison": compare(live, virt)}
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, a.out)
    c = out["comparison"]
    print(json.dumps({k: c[k] for k in c if k != "trials"} | {"wall_s": {"live": live["wall_s"], "virtual": virt["wall_s"]}},
                     indent=1), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
