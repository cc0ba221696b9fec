#!/usr/bin/env python3
"""What one tune costs, side by side: ``make demo``'s tune (``runbook/demo_tune.sh``: the simulated
8B on one H200, steps 1-3, the capacity objective, the same simulator seed) run by an earlier
revision and by this checkout, one after the other on this machine, in one run of this script.

Counted from each run's decision log and runs folder:

- restarts: every server start the tune made (``applied``, ``rolled_back``, ``start_failed``);
- measurements: the tune's own (a capacity search each, or a promise run) and the load-point
  bench_stream runs inside them;
- wall seconds of the tune and the simulated field cost at realistic prices, restart 60 s and
  load-point run 60 s (``restarts x 60 + load points x 60``), as a field engineer would pay them;
- the verdicts: the kept configuration, the recommendation and its verified promise, and which
  parts of σ the run measured.

Beside them, this checkout's same tune on the virtual backend (``tune --virtual``: the demo's simulator
and seed in virtual time, its wall-time settings scaled by the demo's speed, restarts at 60 simulated
seconds): what a demo-size tune costs in wall seconds when no server runs.

Writes bench/results/tune_costs.json. Run: python3 bench/bench_tune_costs.py [--old REV]
(about 10 minutes on 2 cores: two demos of 4 minutes each and the virtual one); ``--virtual-only``
runs the virtual tune alone and keeps the live rows already written.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

from harness import revision, write_result  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "bench", "results", "tune_costs.json")
RESTART_S, RUN_S = 60.0, 60.0
# the last revision before the tune's restarts were cut and its σ split (issue 18's starting point here)
OLD = "2a0a734"


def run_demo(checkout: str, work: str, port: int) -> dict:
    env = dict(os.environ, PY=sys.executable, DEMO_DIR=work, DEMO_PORT=str(port))
    t0 = time.time()
    p = subprocess.run(["bash", "runbook/demo_tune.sh", "--json"], cwd=checkout, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        return {"error": f"exit {p.returncode}: {p.stderr[-600:]}"}
    return _counted(work, json.loads(p.stdout), wall)


def _counted(work: str, res: dict, wall: float) -> dict:
    """What a finished tune in ``work`` cost and decided, from its decision log, runs folder and state."""
    events = [json.loads(line) for line in open(os.path.join(work, "decisions.jsonl"))]
    kinds = {k: sum(1 for e in events if e.get("event") == k) for k in ("applied", "rolled_back", "start_failed")}
    runs = glob.glob(os.path.join(work, "runs", "*", "*", "rep*.json"))
    points = [f for f in glob.glob(os.path.join(work, "runs", "*", "*", "*", "*", "rep*.json")) if "-points" in f]
    promise = glob.glob(os.path.join(work, "runs", "*", "promise", "**", "rep*.json"), recursive=True)
    restarts = sum(kinds.values())
    st = json.load(open(os.path.join(work, "vkit.json")))
    comps = (st.get("baseline") or {}).get("components") or {}
    first = next((e for e in events if e.get("event") == "baseline"), {})
    rec = res.get("recommendation") or {}
    return {
        "restarts": restarts, "restart_kinds": kinds,
        "measurements": len(runs), "load_point_runs": len(points) + len(promise),
        "tune_wall_s": round(wall, 1),
        "field_cost_h": round((restarts * RESTART_S + (len(points) + len(promise)) * RUN_S) / 3600, 2),
        "kept": st["kept"]["config"], "recommendation": rec.get("config"),
        "promise_req_s_wall": (rec.get("capacity") or {}).get("req_s"),
        "first_baseline_sigma": first.get("sigma", {}).get("slo_capacity"),
        "sigma_parts_measured": bool(st.get("sigma_components")) or any(c.get("between") is not None for c in comps.values()),
        "first_baseline_starts": len({(st.get("run_starts") or {}).get(p) for p in first.get("runs") or []} - {None}) or None,
    }


# make demo's tune on the virtual backend: the simulator in virtual time at speed 1, so the demo's wall-time
# settings (SIM_SPEED 4) become simulated ones: the SLO and run lengths x 4, the reference load / 4
DEMO_SPEED = 4.0


def run_virtual_demo(work: str) -> dict:
    """make demo's tune (runbook/demo_tune.sh's flags, its simulator seed) on this checkout's virtual backend
    (``tune --virtual``): restarts at RESTART_S simulated seconds, figures in simulated time; the promise
    given back in the live demo's wall req/s (x DEMO_SPEED) to sit beside its rows."""
    py, b = sys.executable, os.path.join(ROOT, "bin")
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, VKIT_STATE=os.path.join(work, "vkit.json"))
    sim = [py, os.path.join(b, "sim_server"), "sim-8b", "--port", "18193", "--max-model-len", "8192", "--sim-gpu", "H200",
           "--sim-model", "llama-3.1-8b", "--sim-speed", "1", "--sim-startup-s", f"{RESTART_S:g}", "--sim-seed", "11",
           "--sim-start-file", os.path.join(work, "sim-starts")]
    subprocess.run([py, os.path.join(b, "state"), "init", "--url", "http://127.0.0.1:18193", "--model", "sim-8b", "--set",
                    "max_num_batched_tokens=2048", "--set", "max_num_seqs=16", "--", *sim], env=env, check=True,
                   capture_output=True)
    k = DEMO_SPEED
    argv = [py, os.path.join(b, "tune"), "--virtual", "--sandbox", "--objective", "capacity", "--concurrency", "32",
            "--input-len", "512", "--output-len", "128", "--num-prompts", "100", "--slo", f"p95_ttft_ms={1000 * k:g}",
            "--slo", f"mean_tpot_ms={50 * k:g}", "--steps", "1,2,3", "--budget", "3", "--baseline-repeats", "3",
            "--screen-repeats", "1", "--confirm-front", "1", "--point-seconds", f"{1 * k:g}", "--capacity-start",
            f"{32 / k:g}", "--capacity-noise", "0.03",
            "--verify-seconds", f"{8 * k:g}", "--ablation", "off", "--ready-timeout", "60", "--search", "staged", "--json"]
    t0 = time.time()
    p = subprocess.run(argv, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if p.returncode != 0:
        return {"error": f"exit {p.returncode}: {p.stderr[-600:]}"}
    res = json.loads(p.stdout)
    row = _counted(work, res, wall)
    row.update(simulated_s=res["timings"]["total_s"], promise_req_s_wall=row["promise_req_s_wall"] * k
               if row["promise_req_s_wall"] else None, promise_req_s_simulated=row["promise_req_s_wall"],
               backend="virtual (figures in simulated time; the promise x 4 in the live demo's wall req/s)")
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", default=OLD, help=f"the earlier revision to compare with (default {OLD})")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--virtual-only", action="store_true",
                    help="run only this checkout's tune on the virtual backend (about a minute); the live rows already in "
                         "--out are kept, with the revision they were measured at")
    a = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="vkit-costs-")
    old_tree = os.path.join(tmp, "old")
    head = revision()
    try:
        if a.virtual_only:
            prev = json.load(open(a.out)) if os.path.exists(a.out) else {}
            rows = {k: v for k, v in (prev.get("rows") or {}).items() if k in ("old", "new")}
            live_new = prev.get("new")
        else:
            subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", old_tree, a.old], check=True)
            rows, live_new = {}, head
            for name, tree, port in (("old", old_tree, 18191), ("new", ROOT, 18192)):
                print(f"== {name}: make demo's tune in {tree}", file=sys.stderr)
                rows[name] = run_demo(tree, os.path.join(tmp, f"state-{name}"), port)
                print(f"   {json.dumps(rows[name])}", file=sys.stderr)
        print("== virtual: make demo's tune on the virtual backend", file=sys.stderr)
        rows["virtual"] = dict(run_virtual_demo(os.path.join(tmp, "state-virtual")), revision=head)
        print(f"   {json.dumps(rows['virtual'])}", file=sys.stderr)
    finally:
        if os.path.isdir(old_tree):
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", old_tree], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    o, n, v = rows.get("old") or {"error": "not run"}, rows.get("new") or {"error": "not run"}, rows["virtual"]
    ok = "error" not in o and "error" not in n
    doc = {
        "benchmark": "tune_costs", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus", "old": a.old, "new": live_new, "virtual": head,
        "prices": {"restart_s": RESTART_S, "load_point_run_s": RUN_S},
        "target": {"restarts_at_most": 15},
        "rows": rows,
        "ratios": ({"restarts": n["restarts"] / o["restarts"], "load_point_runs": n["load_point_runs"] / o["load_point_runs"],
                    "field_cost": n["field_cost_h"] / o["field_cost_h"], "tune_wall": n["tune_wall_s"] / o["tune_wall_s"]}
                   if ok else None),
        # the same tune on the two backends (the live row may be of an earlier revision: "new")
        "virtual_over_live": ({"restarts": v["restarts"] / n["restarts"], "load_point_runs": v["load_point_runs"] / n["load_point_runs"],
                               "tune_wall": v["tune_wall_s"] / n["tune_wall_s"]}
                              if "error" not in n and "error" not in v else None),
        "command": "python3 bench/bench_tune_costs.py" + (" --virtual-only" if a.virtual_only else ""),
    }
    write_result(a.out, doc, "tune_costs")
    print(json.dumps({"ratios": doc["ratios"], "virtual_over_live": doc["virtual_over_live"]}), file=sys.stderr)
    return 0 if ok and "error" not in v else 1


if __name__ == "__main__":
    sys.exit(main())
