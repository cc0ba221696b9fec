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

``--seeds N``: the same tune with the simulator's default noise (2 % within a process, 1.5 % between
starts), N seeds (``--sim-seed`` 1..N) on each backend: live at ``--sim-speed 2`` (the SLO in wall ms
halved, each figure scaled back to simulated time), virtual in virtual time. Per side: the restarts, the
configurations kept, the recommendation and its true throughput (the recommended configuration measured
once more on a noiseless virtual start, the same workload); the two distributions side by side (median,
quartiles, the share of seeds per recommendation), and whether each median lies within the other side's
quartiles. Writes bench/results/virtual_fidelity_noise.json (about 15 minutes on 2 cores for 20 seeds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from harness import free_port, revision, write_result  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "results", "virtual_fidelity.json")
OUT_NOISE = os.path.join(ROOT, "bench", "results", "virtual_fidelity_noise.json")
NOISE_SPEED = 2.0  # the live side of --seeds: wall time is half the simulated time
PY = sys.executable
SIM = ["--max-model-len", "8192", "--sim-gpu", "H200", "--sim-model", "llama-3.1-8b", "--sim-seed", "11",
       "--sim-speed", "1", "--sim-startup-s", "0.5", "--sim-noise", "0", "--sim-restart-noise", "0"]
TUNE = ["--sandbox", "--objective", "throughput", "--concurrency", "32", "--input-len", "512", "--output-len", "128",
        "--num-prompts", "200", "--slo", "p95_ttft_ms=1000", "--steps", "1,2", "--budget", "2", "--ablation", "off",
        "--ready-timeout", "60", "--json"]



def tool(name: str, *argv: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([PY, os.path.join(ROOT, "bin", name), *argv], env=env, capture_output=True, text=True)


def one_tune(workdir: str, virtual: bool, sim: list[str] = SIM, tune: list[str] = TUNE) -> dict:
    os.makedirs(workdir, exist_ok=True)
    state = os.path.join(workdir, "state.json")
    env = {**os.environ, "VKIT_STATE": state}
    port = free_port()
    r = tool("state", "init", "--url", f"http://127.0.0.1:{port}", "--model", "sim-8b", "--set", "max_num_batched_tokens=2048",
             "--set", "max_num_seqs=16", "--", PY, os.path.join(ROOT, "bin", "sim_server"), "sim-8b", "--port", str(port), *sim,
             env=env)
    if r.returncode:
        raise SystemExit(f"state init failed: {r.stderr}")
    t0 = time.time()
    r = tool("tune", *(["--virtual"] if virtual else []), *tune, env=env)
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
            "run_s": (tim.get("run") or {}).get("s"),
            "kept": [t["config"] for t in res["trials"] if t.get("kept")]}


# --scenario: the tune's workload; "gap" has candidates apart by more than the wall clock's jitter
SCENARIOS = {"tie": {}, "gap": {"--input-len": "2048", "--output-len": "64", "--slo": "p95_ttft_ms=3000"}}
OUT_GAP = os.path.join(ROOT, "bench", "results", "virtual_fidelity_gap.json")


def scenario_tune(name: str) -> list[str]:
    tune = list(TUNE)
    for flag, value in SCENARIOS[name].items():
        tune[tune.index(flag) + 1] = value
    return tune


# -- --seeds: the default noise, many seeds a side ---------------------------------------------------
def noisy_argv(seed: int, virtual: bool) -> tuple[list[str], list[str]]:
    """sim_server's and tune's arguments for seed ``seed``: the default noise; live at NOISE_SPEED."""
    speed = 1.0 if virtual else NOISE_SPEED
    noise = ("--sim-noise", "--sim-restart-noise")
    sim = [x for i, x in enumerate(SIM) if x not in noise and not (i > 0 and SIM[i - 1] in noise)]  # the defaults
    sim[sim.index("--sim-seed") + 1] = str(seed)
    sim[sim.index("--sim-speed") + 1] = f"{speed:g}"
    tune = list(TUNE)
    tune[tune.index("--slo") + 1] = f"p95_ttft_ms={1000 / speed:g}"
    return sim, tune


def true_throughput(config: dict, seed: int) -> float:
    """``config``'s output tok/s on a noiseless virtual start of the same deployment, the tune's workload."""
    from vkit.cli.sim_server import parse_virtual
    from vkit.measure.gauge import BenchOptions, build_config
    from vkit.sim.virtual import VirtualServer

    argv = ["sim-8b", *SIM]  # noise off
    vs = VirtualServer(*parse_virtual(argv, 0))
    vs.start(dict(config))
    opts = BenchOptions(random_input_len=512, random_output_len=128, num_prompts=200, max_concurrency=32, seed=1000 + seed)
    return float(vs.measure(build_config(opts, "virtual://", ["x"]))[0]["output_throughput"])


def quartiles(v: list[float]) -> dict:
    import numpy as np

    return {"median": float(np.median(v)), "q1": float(np.percentile(v, 25)), "q3": float(np.percentile(v, 75)),
            "min": float(min(v)), "max": float(max(v))}


def side(rows: list[dict]) -> dict:
    recs: dict[str, int] = {}
    for r in rows:
        k = json.dumps(r["recommendation"], sort_keys=True)
        recs[k] = recs.get(k, 0) + 1
    return {"seeds": len(rows), "restarts": quartiles([r["restarts"] for r in rows]),
            "kept": quartiles([len(r["kept"]) for r in rows]),
            "true_throughput": quartiles([r["true_throughput"] for r in rows]),
            "recommendations": {k: n / len(rows) for k, n in sorted(recs.items(), key=lambda kv: -kv[1])}}


def noise_main(n: int, out_path: str) -> int:
    rows: dict[str, list[dict]] = {"live": [], "virtual": []}
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="vkit-fidelity-noise-") as d:
        for seed in range(1, n + 1):
            for name in ("virtual", "live"):
                sim, tune = noisy_argv(seed, name == "virtual")
                r = one_tune(os.path.join(d, f"{name}-{seed}"), name == "virtual", sim, tune)
                r["seed"], r["true_throughput"] = seed, true_throughput(r["recommendation"], seed)
                r.pop("trials")
                rows[name].append(r)
            done = time.time() - t0
            print(f"seed {seed}/{n}: live {rows['live'][-1]['restarts']} restarts -> {rows['live'][-1]['recommendation']}, "
                  f"virtual {rows['virtual'][-1]['restarts']} -> {rows['virtual'][-1]['recommendation']}; "
                  f"ETA {done / seed * (n - seed) / 60:.1f} min", file=sys.stderr)
    sides = {k: side(v) for k, v in rows.items()}
    agree = {}
    for m in ("restarts", "kept", "true_throughput"):
        a, b = sides["live"][m], sides["virtual"][m]
        agree[m] = {"live_median_in_virtual_quartiles": b["q1"] <= a["median"] <= b["q3"],
                    "virtual_median_in_live_quartiles": a["q1"] <= b["median"] <= a["q3"]}
    recs = set(sides["live"]["recommendations"]) | set(sides["virtual"]["recommendations"])
    agree["recommendations_total_variation"] = 0.5 * sum(abs(sides["live"]["recommendations"].get(k, 0.0)
                                                              - sides["virtual"]["recommendations"].get(k, 0.0)) for k in recs)
    rev = revision()
    out = {"revision": rev or None, "machine": platform.node(), "command": f"python3 bench/bench_virtual_fidelity.py --seeds {n}",
           "live_speed": NOISE_SPEED, "sim_server": noisy_argv(0, True)[0], "tune": TUNE, "sides": sides, "agreement": agree,
           "rows": rows, "seconds": round(time.time() - t0, 1)}
    write(out_path, out)
    print(json.dumps({"sides": {k: {m: v[m] for m in ("restarts", "kept", "true_throughput")} for k, v in sides.items()},
                      "agreement": agree}, indent=1), file=sys.stderr)
    return 0


def write(path: str, doc: dict) -> None:
    write_result(path, doc, "virtual_fidelity", indent=1, sort_keys=True)


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
    ap.add_argument("--out", default=None, help=f"results file (default {OUT}, with --seeds {OUT_NOISE})")
    ap.add_argument("--seeds", type=int, default=0, help="N seeds a side with the default noise (the distributions compared)")
    ap.add_argument("--scenario", choices=sorted(SCENARIOS), default="tie",
                    help="tie: 512-token prompts, whose two candidates carry the same throughput within 0.1 %% (the "
                         "recommendation is a coin the wall clock's jitter tosses); gap: 2,048-token prompts, whose "
                         "candidates differ by 0.35 %% in throughput and 1.7 %% in P95 TTFT (default: tie; gap writes "
                         f"{OUT_GAP})")
    a = ap.parse_args(argv)
    if a.seeds:
        return noise_main(a.seeds, a.out or OUT_NOISE)
    a.out = a.out or (OUT_GAP if a.scenario == "gap" else OUT)
    tune = scenario_tune(a.scenario)
    with tempfile.TemporaryDirectory(prefix="vkit-fidelity-") as d:
        print("virtual tune ...", file=sys.stderr)
        virt = one_tune(os.path.join(d, "virtual"), True, tune=tune)
        print(f"  {virt['wall_s']:.0f} s wall; live tune (about {virt['run_s'] or 0:.0f} s of runs) ...", file=sys.stderr)
        live = one_tune(os.path.join(d, "live"), False, tune=tune)
    rev = revision()
    out = {"revision": rev or None, "machine": platform.node(),
           "command": "python3 bench/bench_virtual_fidelity.py" + (f" --scenario {a.scenario}" if a.scenario != "tie" else ""),
           "scenario": a.scenario, "sim_server": SIM, "tune": tune, "live": live, "virtual": virt, "comparison": compare(live, virt)}
    write(a.out, out)
    c = out["comparison"]
    print(json.dumps({k: c[k] for k in c if k != "trials"} | {"wall_s": {"live": live["wall_s"], "virtual": virt["wall_s"]}},
                     indent=1), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
