#!/usr/bin/env python3
"""Fit the simulator's board-power constants (``vkit.sim.power``) to board power measured on a real GPU.

Input: bench/results/gpu_steps_h200.json (bench/gpu_steps.py on an NVIDIA H200, its nvidia-smi samples
integrated by bench/gpu_steps_compare.py): board idle power and two sustained decode loops (Llama-3.1-8B,
context 2048, batch 8 and 128), each with its measured step rate and mean board power.

For each loop, the step's achieved compute and memory utilisation come from its work (FLOPs and bytes,
counted as the engine counts them) over its *measured* step time, so the fit does not lean on the cost
model. ``(P - idle) / (limit - idle) = K_COMPUTE * u_compute + K_MEMORY * u_memory`` is solved for the two
constants; with two loops the solution is exact, so there is no residual to report. As an outside check,
the model's J/token on an H100 running the same 8B model is printed beside the range ML.ENERGY publishes
(0.12-0.20 J/token across vLLM versions), and the decode batch that reaches the power limit.

Usage:
  .venv/bin/python bench/power_fit.py [--in bench/results/gpu_steps_h200.json] [--out bench/results/power_fit.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from bench.harness import write_result  # noqa: E402
from vkit.sim.power import BOARDS, K_COMPUTE, K_MEMORY, PowerMeter  # noqa: E402
from vkit.sim.profiles import get_gpu, get_model  # noqa: E402
from vkit.sim.steptime import CostModel  # noqa: E402


def decode_work(b: int, c: int) -> tuple[int, int, int, int]:
    """(tokens, pairs, kv_tokens, sampled) of one decode step of ``b`` sequences at context ``c``."""
    return b, b * (c + 1), b * (c + 2), b


def utilisation(meter: PowerMeter, b: int, c: int, step_s: float) -> tuple[float, float]:
    flops, moved = meter.work(*decode_work(b, c))
    gpu = get_gpu("H200")
    return flops / (gpu.peak_bf16_flops * step_s), moved / (gpu.hbm_bytes_per_s * step_s)


def fit(doc: dict) -> dict:
    model, gpu = get_model("llama-3.1-8b"), get_gpu("H200")
    meter = PowerMeter(model, gpu, 1)
    idle = doc["idle"]["mean_w"]
    limit = BOARDS["H200"].limit_w
    rows, a, y = [], [], []
    for loop in doc["sustained_decode"]:
        b, c = loop["batch"], loop["context"]
        step_s = b / loop["tokens_per_s"]
        uc, um = utilisation(meter, b, c, step_s)
        share = (loop["sampled"]["mean_w"] - idle) / (limit - idle)
        a.append([uc, um])
        y.append(share)
        rows.append({"batch": b, "context": c, "step_ms": step_s * 1e3, "u_compute": uc, "u_memory": um,
                     "measured_w": loop["sampled"]["mean_w"], "j_per_token": loop["j_per_token"]})
    k_c, k_m = np.linalg.solve(np.array(a), np.array(y))
    for r, (uc, um) in zip(rows, a, strict=True):
        p = idle + (limit - idle) * min(1.0, k_c * uc + k_m * um)
        r["model_w"] = p
        r["model_j_per_token"] = p * r["step_ms"] / 1e3 / r["batch"]
    return {"k_compute": float(k_c), "k_memory": float(k_m), "idle_w": idle, "limit_w": limit, "loops": rows}


def outside_check() -> list[dict]:
    """J/token of an 8B decode on one H100 at the simulator's default step time, by batch (context 1024)."""
    model, gpu = get_model("llama-3.1-8b"), get_gpu("H100-80G")
    cost, meter = CostModel(model, gpu, 1), PowerMeter(model, gpu, 1)
    out = []
    for b in (1, 8, 32, 64, 128, 256):
        tokens, pairs, kv, sampled = decode_work(b, 1024)
        t = cost.step_time(tokens, pairs, kv, sampled, b)
        w = meter.step(tokens, pairs, kv, sampled, t)
        out.append({"batch": b, "step_ms": round(t * 1e3, 3), "board_w": round(w, 1), "j_per_token": round(w * t / b, 4)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("Usage:")[1])
    ap.add_argument("--in", dest="inp", default=os.path.join(HERE, "results", "gpu_steps_h200.json"))
    ap.add_argument("--out", default=os.path.join(HERE, "results", "power_fit.json"))
    a = ap.parse_args(argv)
    with open(a.inp, encoding="utf-8") as f:
        doc = json.load(f)
    res = fit(doc)
    res["in_code"] = {"k_compute": K_COMPUTE, "k_memory": K_MEMORY}
    res["residual"] = "none: two loops fix two constants exactly; no held-out loop was measured"
    res["h100_llama8b_decode_ctx1024"] = outside_check()
    res["ml_energy_llama8b_h100_j_per_token"] = [0.12, 0.20]
    res["command"] = "python3 bench/power_fit.py"
    write_result(a.out, res, "power_fit")
    print(f"K_COMPUTE {res['k_compute']:.5g}  K_MEMORY {res['k_memory']:.5g}  (in code: {K_COMPUTE}, {K_MEMORY})")
    for r in res["loops"]:
        print(f"  batch {r['batch']:>3}: measured {r['measured_w']:.1f} W, model {r['model_w']:.1f} W; "
              f"u_compute {r['u_compute']:.3f}, u_memory {r['u_memory']:.3f}")
    for r in res["h100_llama8b_decode_ctx1024"]:
        print(f"  H100 8B decode batch {r['batch']:>3}: {r['board_w']} W, {r['j_per_token']} J/token")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
