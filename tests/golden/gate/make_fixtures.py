"""Regenerate gate's fixture summaries (run on purpose only; the outputs are golden files):

    python3 tests/golden/gate/make_fixtures.py

``sample_streaming.json`` and ``sample_nostream.json`` are real ``bench_stream`` summaries
measured against ``bin/sim_server sim-8b`` (200 prompts, 1024 in / 32 out, 8 in flight,
seed 1; the second with ``--no-stream``). Every other file is ``sample_streaming.json`` with
its clock rescaled by a factor ``s`` (times × s, rates ÷ s), which keeps every invariant
check_invariants applies (Little's law, prefill vs decode, client vs server TTFT) while
moving throughput by 1/s: lognormal run-to-run noise of 2% and, for ``gain_*``, a true
+12% throughput. Run dates follow an interleaved ABBA order, one run a minute.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RATE_KEYS = ("request_throughput", "output_throughput", "total_token_throughput", "max_output_tokens_per_s", "request_goodput")


def rescale(doc: dict, s: float) -> dict:
    """Times × s, rates ÷ s, everywhere a vkit summary has them (client-side timings excepted)."""

    def walk(obj, key=""):
        if isinstance(obj, dict):
            out = {}
            for k, v in obj.items():
                if k in ("client", "dispatch_lag_ms", "preflight", "command", "command_line", "dataset"):
                    out[k] = v
                elif k.endswith("_tok_s") and isinstance(v, dict):
                    out[k] = {kk: (vv / s if isinstance(vv, (int, float)) and kk != "count" else vv) for kk, vv in v.items()}
                else:
                    out[k] = walk(v, k)
            return out
        if isinstance(obj, bool) or not isinstance(obj, (int, float)):
            return obj
        if key.endswith("_ms") or key == "duration":
            return obj * s
        if key in RATE_KEYS or key.endswith("_tok_s"):
            return obj / s
        return obj

    return walk(copy.deepcopy(doc))


def write(name: str, doc: dict) -> None:
    with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
        f.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def main() -> None:
    with open(os.path.join(HERE, "sample_streaming.json"), encoding="utf-8") as f:
        base = json.load(f)
    rng = np.random.default_rng(20260101)
    t0 = dt.datetime(2026, 1, 1, 12, 0, 0)
    n = 6
    # ABBA: pair i is (b, c) when i is even, (c, b) when odd.
    order = []
    for i in range(n):
        order += [("b", i), ("c", i)] if i % 2 == 0 else [("c", i), ("b", i)]
    when = {arm_i: t0 + dt.timedelta(minutes=j) for j, arm_i in enumerate(order)}
    noise = {("b", i): float(rng.normal(0, 0.02)) for i in range(n)}
    noise.update({("c", i): float(rng.normal(0, 0.02)) for i in range(n)})
    noise.update({("g", i): float(rng.normal(0, 0.02)) for i in range(n)})
    for i in range(n):
        b = rescale(base, math.exp(noise[("b", i)]))
        b["date"] = when[("b", i)].strftime("%Y%m%d-%H%M%S")
        write(f"aa_b{i + 1}.json", b)
        c = rescale(base, math.exp(noise[("c", i)]))
        c["date"] = when[("c", i)].strftime("%Y%m%d-%H%M%S")
        write(f"aa_c{i + 1}.json", c)
        g = rescale(base, math.exp(noise[("g", i)]) / 1.12)  # +12% throughput, −11% latency
        g["date"] = when[("c", i)].strftime("%Y%m%d-%H%M%S")
        write(f"gain_c{i + 1}.json", g)
    # Same runs, another request set (dataset seed): a different gauge.
    with open(os.path.join(HERE, "aa_c1.json"), encoding="utf-8") as f:
        other = json.load(f)
    other["vkit"]["seed"] = 2
    write("gauge_seed_c1.json", other)
    # A plain `vllm bench serve --save-result` file (no "vkit" object).
    plain = {k: v for k, v in rescale(base, 1.0).items() if k != "vkit"}
    write("plain_vllm_c1.json", plain)


if __name__ == "__main__":
    main()
