#!/usr/bin/env python3
"""Energy under the SLO on the simulator: does the configuration with the most SLO capacity also spend the
fewest joules per output token, and how far apart are they?

For each scenario, every configuration of a grid (max_num_seqs x max_num_batched_tokens) gets one
``bin/capacity --virtual`` search (the simulator's engine in virtual time, its board power model
``vkit.sim.power``; no run-to-run or between-restart noise, so the figures are the configuration's own),
at the capacity precision asked (default ±3 %). From each capacity document: the SLO capacity, and at it
the energy per output token, the board power and the capacity per kW. The benchmark names the
configuration with the most capacity, the one with the most capacity per kW and the one with the fewest
J/token, and their gaps; the whole grid is in the rows.

A scenario's ``required`` load (req/s, one every configuration of the grid was expected to carry) is each
search's first point (``--start``): its run gives the J per output token while serving that load, which is
what ``tune --objective j-per-token --required-capacity`` minimises. The summary names the configuration
with the fewest J/token there among those whose run at it held the SLO.

Writes bench/results/energy.json (rows as they come). Run:
  .venv/bin/python bench/bench_energy.py [--scenarios NAME,...] [--precision 0.03]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.harness import write_result  # noqa: E402
from vkit.cli import capacity as capacity_cli  # noqa: E402

OUT = os.path.join(ROOT, "bench", "results", "energy.json")
FLOOR = 0.03  # the gate's floor (max(2σ, 3 %)): a smaller gap is not a difference a tune can keep

# name: (sim_server deployment flags, workload flags, SLO, grid)
SCENARIOS = {
    # long outputs, TPOT-bound: the batch a TPOT limit allows, and what each extra sequence costs in power
    "8b-h100-long-output": {
        "sim": "--sim-model llama-3.1-8b --sim-gpu H100-80G --max-model-len 8192",
        "workload": ["--random-input-len", "512", "--random-output-len", "512"],
        "slo": ["p95_ttft_ms=1000", "mean_tpot_ms=25"],
        "grid": {"max_num_seqs": [32, 64, 128, 256], "max_num_batched_tokens": [2048, 8192]},
        "required": 6.0,
    },
    # long prompts, TTFT-bound: the prefill budget decides TTFT, the batch decides the decode's power
    "70b-h100x4-long-prompt": {
        "sim": "--sim-model llama-3.1-70b --sim-gpu H100-80G -tp 4 --max-model-len 8192",
        "workload": ["--random-input-len", "2048", "--random-output-len", "128"],
        "slo": ["p95_ttft_ms=1500", "mean_tpot_ms=60"],
        "grid": {"max_num_seqs": [32, 64, 128, 256], "max_num_batched_tokens": [2048, 8192]},
        "required": 3.5,
    },
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def search(sc: dict, config: dict, precision: float, tmp: str) -> dict:
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in config.items())
    out = os.path.join(tmp, "cap.json")
    argv = ["--virtual", f"m {sc['sim']} {flags} --sim-noise 0 --sim-restart-noise 0 --sim-seed 1",
            *sc["workload"], *itertools.chain.from_iterable(("--slo", s) for s in sc["slo"]),
            "--precision", f"{precision:g}", "--num-prompts", "400", "--start", f"{sc['required']:g}", "-o", out,
            "--run-dir", os.path.join(tmp, "runs"), "-q"]
    t0 = time.time()
    code = capacity_cli.main(argv, stdout=open(os.devnull, "w"), stderr=open(os.devnull, "w"))
    with open(out, encoding="utf-8") as f:
        doc = json.load(f)
    e = doc.get("energy") or {}
    # the search's point at the required load: its verdict and its J per output token there
    at = min(doc.get("curve") or [{}], key=lambda p: abs((p.get("load") or 0) - sc["required"]))
    near = at.get("load") is not None and abs(at["load"] / sc["required"] - 1) < 0.01
    return {"required": {"load": at.get("load"), "holds": at.get("verdict") == "holds",
                         "j_per_output_token": (at.get("metrics") or {}).get("j_per_output_token"),
                         "mean_w": (at.get("metrics") or {}).get("mean_w")} if near else None,
            "config": config, "exit": code, "capacity": doc.get("capacity"), "interval": doc.get("interval"),
            "binding": doc.get("binding_slo"), "output_tok_s": doc.get("capacity_output_tok_s"),
            "j_per_output_token": e.get("j_per_output_token"), "mean_w": e.get("mean_w"),
            "req_s_per_kw": e.get("req_s_per_kw"), "wall_s": round(time.time() - t0, 1)}


def summarize(rows: list[dict]) -> dict:
    ok = [r for r in rows if r["capacity"] and r["j_per_output_token"]]
    if not ok:
        return {}
    cap = max(ok, key=lambda r: r["capacity"])
    per_kw = max(ok, key=lambda r: r["req_s_per_kw"])
    jt = min(ok, key=lambda r: r["j_per_output_token"])
    there = [r for r in ok if (r.get("required") or {}).get("holds") and r["required"]["j_per_output_token"]]
    jr = min(there, key=lambda r: r["required"]["j_per_output_token"]) if there else None
    at_required = {"configurations_holding": len(there), "fewest_j": jr["config"] if jr else None,
                   "fewest_j_per_token": jr["required"]["j_per_output_token"] if jr else None,
                   "most_capacity_j_per_token": (cap.get("required") or {}).get("j_per_output_token"),
                   "range": [min(r["required"]["j_per_output_token"] for r in there),
                             max(r["required"]["j_per_output_token"] for r in there)] if there else None,
                   "differs_from_most_capacity": bool(jr) and jr["config"] != cap["config"]}
    if jr and at_required["most_capacity_j_per_token"]:
        # a gap under the gate's floor cannot be kept on a real server: the same answer in practice
        saves = 1 - at_required["fewest_j_per_token"] / at_required["most_capacity_j_per_token"]
        at_required.update(fewest_j_saves=saves, beyond_floor=saves > FLOOR)
    fewest_saves = 1 - jt["j_per_output_token"] / cap["j_per_output_token"]
    return {"at_required": at_required, "beyond_floor": fewest_saves > FLOOR,
            "most_capacity": cap["config"], "most_capacity_per_kw": per_kw["config"], "fewest_j_per_token": jt["config"],
            "differ": cap["config"] != jt["config"],
            "fewest_j_saves": fewest_saves,
            "fewest_j_capacity_cost": 1 - jt["capacity"] / cap["capacity"],
            "per_kw_gain_over_most_capacity": per_kw["req_s_per_kw"] / cap["req_s_per_kw"] - 1}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--precision", type=float, default=0.03)
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args(argv)
    names = [s for s in a.scenarios.split(",") if s]
    bad = [s for s in names if s not in SCENARIOS]
    if bad:
        ap.error(f"unknown scenario(s) {', '.join(bad)}; known: {', '.join(SCENARIOS)}")
    doc = {"precision": a.precision, "scenarios": {},
           "command": "python3 bench/bench_energy.py" + (f" --scenarios {a.scenarios}" if a.scenarios != ",".join(SCENARIOS) else "")}
    t0 = time.time()
    for name in names:
        sc = SCENARIOS[name]
        keys = list(sc["grid"])
        rows = []
        for values in itertools.product(*(sc["grid"][k] for k in keys)):
            cfg = dict(zip(keys, values, strict=True))
            with tempfile.TemporaryDirectory() as tmp:
                r = search(sc, cfg, a.precision, tmp)
            rows.append(r)
            log(f"{name} {cfg}: capacity {r['capacity']} req/s, {r['j_per_output_token']} J/token, {r['mean_w']} W "
                f"({r['wall_s']} s)")
            doc["scenarios"][name] = {"sim": sc["sim"], "workload": sc["workload"], "slo": sc["slo"],
                                      "required": sc["required"], "rows": rows,
                                      "summary": summarize(rows)}
            write_result(a.out, dict(doc, wall_s=round(time.time() - t0, 1)), "energy")
    for name in names:
        log(f"{name}: {json.dumps(doc['scenarios'][name]['summary'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
