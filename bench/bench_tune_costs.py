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

Writes bench/results/tune_costs.json. Run: python3 bench/bench_tune_costs.py [--old REV]
(about 9 minutes on 2 cores: two demos of 4 minutes each).
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
    res = json.loads(p.stdout)
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", default=OLD, help=f"the earlier revision to compare with (default {OLD})")
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="vkit-costs-")
    old_tree = os.path.join(tmp, "old")
    try:
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", old_tree, a.old], check=True)
        rows = {}
        for name, tree, port in (("old", old_tree, 18191), ("new", ROOT, 18192)):
            print(f"== {name}: make demo's tune in {tree}", file=sys.stderr)
            rows[name] = run_demo(tree, os.path.join(tmp, f"state-{name}"), port)
            print(f"   {json.dumps(rows[name])}", file=sys.stderr)
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", old_tree], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    head = revision()
    o, n = rows["old"], rows["new"]
    ok = "error" not in o and "error" not in n
    doc = {
        "benchmark": "tune_costs", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus", "old": a.old, "new": head,
        "prices": {"restart_s": RESTART_S, "load_point_run_s": RUN_S},
        "target": {"restarts_at_most": 15},
        "rows": rows,
        "ratios": ({"restarts": n["restarts"] / o["restarts"], "load_point_runs": n["load_point_runs"] / o["load_point_runs"],
                    "field_cost": n["field_cost_h"] / o["field_cost_h"], "tune_wall": n["tune_wall_s"] / o["tune_wall_s"]}
                   if ok else None),
        "command": "python3 bench/bench_tune_costs.py",
    }
    write_result(a.out, doc, "tune_costs")
    print(json.dumps(doc["ratios"]), file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
