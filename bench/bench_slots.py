#!/usr/bin/env python3
"""Wall time of the same tune on q = 1, 2, 4 simulator slots on loopback.

Each slot is its own ``sim_server`` on its own port (``state init --slots-file``); q = 1 is the
default path, a state without slots. Every tune is the same staged run (``--steps 2,3 --budget 4``,
throughput objective, the simulated 8B at 16 closed-loop streams, ``--sim-seed 5``, speed-up 8, so the
servers' work is virtual time and cheap on a small machine): step 2's candidates are independent and
run q at a time; step 3's sweep runs ahead of its knee q at a time (the pending values as lies), so a
slot can measure a value the serial sweep would not have reached. Reported per q: the wall time, the
recommendation, the restarts and trials it took, and the speed-up against q = 1 with the CPU count
(every server and the load generator share the same cores: the speed-up is bounded by them).

``rayN`` in ``--qs`` runs the same tune on N slots served through a local Ray cluster (one node, this
machine; ``tune --ray``, the optional extra ``make fleet``): the same work plus each call's round trip
to its worker and the files it brings back.

Writes bench/results/slots.json. Run: python3 bench/bench_slots.py [--repeats 2] (about 2 min on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

from harness import free_port, write_result  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B = os.path.join(REPO, "bin")
PY = sys.executable
TUNE = ["--sandbox", "--objective", "throughput", "--concurrency", "16", "--input-len", "256", "--output-len", "64",
        "--num-prompts", "100", "--baseline-repeats", "3", "--screen-repeats", "1", "--ready-timeout", "60",
        "--slo", "p95_ttft_ms=5000", "--guard", "p95_ttft_ms:-:50%", "--confirm-front", "0", "--ablation", "off",
        "--json", "-q"]
SEARCH = {"staged": ["--steps", "2,3", "--budget", "4"],
          # a search whose screening dominates: 12 Bayesian evaluations, batches of q (Kriging believer)
          "bo": ["--mode", "bo", "--steps", "2", "--budget", "12", "--bo-patience", "0"]}
MODE = ["staged"]


SPEED = [8.0]  # --sim-speed: the simulated accelerator's time over wall time
STARTUP = [0.2]  # --sim-startup-s: wall seconds a server start takes (the host waits; no CPU)
QUIET: list[str] = []  # --sim-noise off: the simulators' run-to-run and restart noise off



def sim(port: int) -> list[str]:
    return [PY, os.path.join(B, "sim_server"), "sim-8b", "--port", str(port), "--sim-speed", str(SPEED[0]), "--sim-startup-s", f"{STARTUP[0]:g}",
            "--sim-seed", "5", "--max-model-len", "4096", *QUIET]


def one_tune(q: int, work: str, ray: str | None = None) -> dict:
    st = os.path.join(work, "vkit.json")
    ports = [free_port() for _ in range(q)]
    init = [PY, os.path.join(B, "state"), "--state", st, "init", "--url", f"http://127.0.0.1:{ports[0]}", "--model", "sim-8b",
            "--set", "max_num_seqs=4", "--set", "max_num_batched_tokens=2048"]
    if q > 1:
        spec = os.path.join(work, "slots.json")
        with open(spec, "w", encoding="utf-8") as f:
            json.dump([{"name": f"s{i}", "devices": [i], "port": p, **({"gpus": False} if ray else {})} for i, p in enumerate(ports)], f)
        init += ["--slots-file", spec]
    subprocess.run([*init, "--", *sim(ports[0])], check=True, capture_output=True)
    t0 = time.time()
    r = subprocess.run([PY, os.path.join(B, "tune"), "--state", st, *TUNE, *SEARCH[MODE[0]], *(["--ray", ray] if ray else [])],
                       capture_output=True, text=True)
    wall = time.time() - t0
    try:
        _stop_all(st)
    except Exception:  # noqa: BLE001 - a benchmark's cleanup never hides its result
        pass
    if r.returncode != 0:
        return {"q": q, "ray": bool(ray), "ok": False, "exit": r.returncode, "stderr": r.stderr[-600:]}
    res = json.loads(r.stdout)
    state = json.load(open(st, encoding="utf-8"))
    phases = phase_times(state, os.path.join(work, "decisions.jsonl"), t0, wall)
    logs = [os.path.join(work, "decisions.jsonl")] + [os.path.join(work, os.path.dirname(x["state"]), "decisions.jsonl")
                                                      for x in state.get("slots") or []]
    # runs measured again because the client fell behind its schedule: this machine's cores, not the slots
    again = sum(1 for p in logs if os.path.exists(p) for x in open(p, encoding="utf-8") if '"event": "remeasure"' in x)
    return {"phases_s": phases, "remeasured": again, "q": q, "ray": bool(ray), "ok": True, "wall_s": round(wall, 1), "recommendation": res["recommendation"]["config"],
            "restarts": res["timings"]["restarts"], "timings": res["timings"], "trials": len(state["trials"]),
            "measured": sum(1 for t in state["trials"] if t["status"] not in ("skipped",)),
            "slots_out": [s["name"] for s in state.get("slots") or [] if s.get("out")]}


def phase_times(state: dict, log: str, t0: float, wall: float) -> dict:
    """Wall seconds of the tune's phases (whole-second stamps): the baseline (with the A/A pass beside
    it on slots: from the start to the first ``baseline`` event), the screening (the union of the
    trials' [started, finished] intervals: while at least one trial ran) and the rest (confirmations,
    rebases, drift checks, delivery)."""
    from datetime import datetime

    def at(s: str) -> float:
        return datetime.fromisoformat(s).timestamp()

    base = next((at(e["ts"]) for e in map(json.loads, open(log, encoding="utf-8")) if e["event"] == "baseline" and e.get("ts")), None)
    spans = sorted((at(t["started"]), at(t["finished"])) for t in state["trials"]
                   if t.get("started") and t.get("finished") and t["status"] != "skipped")
    screen, end = 0.0, None
    for a, z in spans:
        if end is None or a > end:
            screen += z - a
            end = z
        elif z > end:
            screen += z - end
            end = z
    b = max(0.0, base - t0) if base else None
    return {"baseline": round(b, 1) if b is not None else None, "screening": round(screen, 1),
            "rest": round(wall - (b or 0.0) - screen, 1)}


def _stop_all(st: str) -> None:
    sys.path.insert(0, REPO)
    from vkit.apply import launcher
    from vkit.state import StateFile

    sf = StateFile(st)
    files = [sf] + [StateFile(os.path.join(sf.dir, s["state"])) for s in sf.read().get("slots") or []]
    for f in files:
        launcher.stop(f.read()["service"].get("running"), grace_s=3)


def start_ray() -> dict:
    """A local Ray cluster (one node, this machine) for the --ray path; its sockets in a short folder."""
    tmp = tempfile.mkdtemp(prefix="vr", dir="/tmp")
    port = free_port()
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=tmp)
    ray_bin = os.path.join(os.path.dirname(PY), "ray")
    subprocess.run([ray_bin, "start", "--head", "--port", str(port), "--num-cpus", "4", "--num-gpus", "0",
                    "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", tmp], check=True, capture_output=True, env=env)
    return {"address": f"127.0.0.1:{port}", "env": env, "bin": ray_bin, "tmp": tmp}


def stop_ray(ray: dict) -> None:
    subprocess.run([ray["bin"], "stop", "--force"], capture_output=True, env=ray["env"])
    shutil.rmtree(ray["tmp"], ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--qs", default="1,2,4", help="slot counts to compare; rayN: N slots through a local Ray cluster "
                                                   "(tune --ray, needs make fleet) (default 1,2,4)")
    ap.add_argument("--repeats", type=int, default=1, help="tunes per slot count (default 1)")
    ap.add_argument("-o", "--output", default=os.path.join(REPO, "bench", "results", "slots.json"))
    ap.add_argument("--sim-speed", type=float, default=8.0,
                    help="the simulators' speed-up (default 8: the accelerator's work is cheap virtual time, so this machine's "
                         "cores bound the slots; 1: real time, the servers mostly wait as a real accelerator's host does)")
    ap.add_argument("--sim-startup-s", type=float, default=0.2,
                    help="seconds each simulated server start takes (default 0.2; a field restart of 30 s to 5 min is an "
                         "idle wait on the host, which slots overlap)")
    ap.add_argument("--sim-noise", choices=("on", "off"), default="on",
                    help="off: the simulators' noise off, so every q meets the same measurements and should deliver the same "
                         "recommendation (default on: the realistic noise)")
    ap.add_argument("--num-prompts", type=int, default=100, help="prompts per benchmark run (default 100)")
    ap.add_argument("--search", choices=sorted(SEARCH), default="staged",
                    help="staged: steps 2 and 3, 4 candidates each (default); bo: 12 Bayesian evaluations of step 2's space")
    a = ap.parse_args(argv)
    SPEED[0] = a.sim_speed
    STARTUP[0] = a.sim_startup_s
    TUNE[TUNE.index("--num-prompts") + 1] = str(a.num_prompts)
    QUIET[:] = ["--sim-noise", "0", "--sim-restart-noise", "0"] if a.sim_noise == "off" else []
    MODE[0] = a.search
    kinds = a.qs.split(",")
    rows = []
    ray = start_ray() if any(k.startswith("ray") for k in kinds) else None
    try:
        for rep in range(a.repeats):
            for kind in kinds:
                q = int(kind[3:] if kind.startswith("ray") else kind)
                with tempfile.TemporaryDirectory(prefix=f"vkit-slots-{q}-") as work:
                    row = dict(one_tune(q, work, ray["address"] if kind.startswith("ray") else None), repeat=rep, kind=kind)
                print(json.dumps(row), file=sys.stderr)
                rows.append(row)
    finally:
        if ray:
            stop_ray(ray)
    summary = {}
    for q in kinds:
        ok = [r for r in rows if r["kind"] == q and r["ok"]]
        if ok:
            walls = sorted(r["wall_s"] for r in ok)
            screens = sorted(r["phases_s"]["screening"] for r in ok)
            summary[str(q)] = {"median_wall_s": walls[len(walls) // 2], "median_screening_s": screens[len(screens) // 2], "runs": len(ok),
                               "recommendations": sorted({json.dumps(r["recommendation"], sort_keys=True) for r in ok}),
                               "restarts": [r["restarts"] for r in ok], "trials": [r["trials"] for r in ok]}
    base = (summary.get("1") or {}).get("median_wall_s")
    base_screen = (summary.get("1") or {}).get("median_screening_s")
    for v in summary.values():
        v["speedup_vs_q1"] = round(base / v["median_wall_s"], 2) if base else None
        v["screening_speedup_vs_q1"] = round(base_screen / v["median_screening_s"], 2) if base_screen and v["median_screening_s"] else None
    out = {"bench": "slots", "cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
           "tune_args": TUNE + SEARCH[MODE[0]], "sim": sim(0)[2:], "sim_speed": SPEED[0], "sim_startup_s": STARTUP[0], "rows": rows, "summary": summary,
           "command": "python3 bench/bench_slots.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_result(a.output, out, "slots", sort_keys=True)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
