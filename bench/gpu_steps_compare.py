#!/usr/bin/env python3
"""Real H200 engine steps (bench/gpu_steps.py's JSON and its nvidia-smi samples) against the
simulator's roofline cost model for the same model and accelerator.

For each measured prefill and decode step: the step time ``CostModel(llama-3.1-8b, H200)`` predicts
with its default efficiencies, and with mfu, mbu and the per-step overhead fitted to these steps
(least squares on log time); the sustained decode loops' energy per output token from the sampled
board power (the driver has no energy counter here: ``total_energy_consumption`` is not a valid
field of its nvidia-smi), and idle power. Writes bench/results/gpu_steps_h200.json.

Usage:
  .venv/bin/python bench/gpu_steps_compare.py RESULTS.json SAMPLES.csv [--out bench/results/gpu_steps_h200.json]
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import math
import sys

import numpy as np
from scipy.optimize import least_squares

from vkit.sim.profiles import get_gpu, get_model
from vkit.sim.steptime import CostModel


def step_args(row: dict, kind: str) -> tuple[int, int, int, int, int]:
    """The engine's (tokens, pairs, kv_tokens, sampled, nreqs) of one measured step, as
    ``vkit.sim.engine`` counts them."""
    if kind == "prefill":
        s = row["tokens"]
        return s, s * (s + 1) // 2, 2 * s, 1, 1
    b, c = row["batch"], row["context"]
    return b, b * (c + 1), b * (c + 2), b, b


def samples(path: str) -> list[tuple[float, float]]:
    """(epoch seconds, watts) of nvidia-smi's --format=csv samples (times in UTC)."""
    out = []
    with open(path) as f:
        rows = csv.reader(f)
        next(rows, None)
        for r in rows:
            try:
                t = dt.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=dt.timezone.utc).timestamp()
                out.append((t, float(r[1])))
            except (ValueError, IndexError):
                continue
    return out


def window(smp: list[tuple[float, float]], t0: float, t1: float) -> dict:
    """The samples' mean power and trapezoid integral over [t0, t1]."""
    xs = [(t, w) for t, w in smp if t0 <= t <= t1]
    if len(xs) < 2:
        return {"n": len(xs)}
    t, w = np.array([x[0] for x in xs]), np.array([x[1] for x in xs])
    return {"n": len(xs), "mean_w": float(w.mean()), "max_w": float(w.max()),
            "integral_j": float(np.sum((w[1:] + w[:-1]) / 2 * np.diff(t))), "covered_s": float(t[-1] - t[0])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results")
    ap.add_argument("samples")
    ap.add_argument("--out", default="bench/results/gpu_steps_h200.json")
    a = ap.parse_args()
    try:
        res = json.load(open(a.results))
        smp = samples(a.samples)
    except (OSError, ValueError) as e:
        print(f"gpu_steps_compare: {e}", file=sys.stderr)
        return 2
    model, gpu = get_model("llama-3.1-8b"), get_gpu("H200")
    rows = [("prefill", r) for r in res["prefill"]] + [("decode", r) for r in res["decode"]]
    meas = np.array([r["step_s"] for _, r in rows])

    def predict(mfu: float, mbu: float, over: float) -> np.ndarray:
        cm = CostModel(model, gpu, mfu=mfu, mbu=mbu, step_overhead_s=over)
        return np.array([cm.step_time(*step_args(r, k)) for k, r in rows])

    default = predict(0.5, 0.8, 0.5e-3)
    fit = least_squares(lambda p: np.log(predict(*p)) - np.log(meas), x0=[0.5, 0.8, 0.5e-3],
                        bounds=([0.05, 0.1, 0.0], [1.0, 1.0, 0.02]))
    fitted = predict(*fit.x)
    table = []
    for (k, r), m, d, f in zip(rows, meas, default, fitted, strict=True):
        table.append({"kind": k, **{x: r[x] for x in ("tokens", "batch", "context") if x in r},
                      "measured_ms": round(m * 1e3, 3), "model_default_ms": round(d * 1e3, 3),
                      "default_err": round(d / m - 1, 3), "model_fitted_ms": round(f * 1e3, 3), "fitted_err": round(f / m - 1, 3)})

    def mape(p: np.ndarray) -> dict:
        e = np.abs(p / meas - 1)
        return {"median_abs_err": round(float(np.median(e)), 3), "max_abs_err": round(float(e.max()), 3)}
    marks = {m[0]: m[1] for m in res.get("marks", [])}
    energy = []
    for s in res.get("sustain", []):
        b = s["batch"]
        w = window(smp, marks.get(f"sustain_start_{b}", 0), marks.get(f"sustain_end_{b}", 0))
        e = w.get("integral_j")
        energy.append({**s, "sampled": w,
                       "j_per_token": round(e / s["tokens"] * s["seconds"] / w["covered_s"], 4) if e else None,
                       "tokens_per_s": round(s["tokens"] / s["seconds"], 1)})
    idle = window(smp, marks.get("idle_start", 0), marks.get("idle_end", 0))
    out = {"device": res["device"], "torch": res["torch"], "model": res["model"],
           "energy_counter": f"nvidia-smi has no {res.get('energy_field', 'total_energy_consumption')} field on this driver: "
                             "energy is the integral of power.draw sampled every 100 ms",
           "idle": idle, "sustained_decode": energy,
           "cost_model": {"default": {"mfu": 0.5, "mbu": 0.8, "step_overhead_s": 0.5e-3, **mape(default)},
                          "fitted": {"mfu": round(float(fit.x[0]), 3), "mbu": round(float(fit.x[1]), 3),
                                     "step_overhead_s": round(float(fit.x[2]), 5), **mape(fitted)}},
           "steps": table,
           "command": "python3 bench/gpu_steps.py --out R.json --smi-dir SMI (on the GPU); "
                      "bench/gpu_steps_compare.py R.json SMI/nvidia-smi-lms100.csv"}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    for t in table:
        print(f"{t['kind']:8s} {t.get('tokens', t.get('batch')):>5} {t.get('context', ''):>5}  measured {t['measured_ms']:8.2f} ms"
              f"  default {t['model_default_ms']:8.2f} ({t['default_err']:+.0%})  fitted {t['model_fitted_ms']:8.2f} ({t['fitted_err']:+.0%})")
    print(json.dumps({k: out[k] for k in ("idle", "sustained_decode", "cost_model")}, indent=1))
    return 0 if math.isfinite(float(fit.cost)) else 1


if __name__ == "__main__":
    sys.exit(main())
