#!/usr/bin/env python3
"""Time real transformer engine steps on a GPU, with the board's power beside them.

A Llama-3.1-8B-shaped decoder (32 layers, hidden 4096, 32 query / 8 KV heads of 128, MLP 14336,
vocabulary 128256) in bf16 with random weights (no download: the weights' values do not change a
step's time) runs the two kinds of step the simulator's cost model prices:

- prefill: one sequence of S prompt tokens, causal attention (S in 128 ... 8192);
- decode: B sequences of one new token each over a KV cache of C tokens, captured in a CUDA graph
  as vLLM captures its decode steps (B in 1 ... 256, C in 512 and 2048).

Each step is timed with CUDA events (median of ``--iters`` after warm-up). While it runs,
``nvidia-smi --query-gpu=... -lms 100`` samples board power; a sustained decode loop is measured
both by the driver's energy counter (``total_energy_consumption``) and by the integral of the
sampled power, side by side. Raw nvidia-smi outputs are saved as fixtures beside the JSON.

Not part of the default path: it needs torch with CUDA (exit 2 without). Usage:
  python3 bench/gpu_steps.py --out /tmp/gpu_steps.json --smi-dir /tmp/smi
Then compare it with the simulator's model on this machine:
  .venv/bin/python bench/gpu_steps_compare.py /tmp/gpu_steps.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 4096, 32, 32, 8, 128, 14336, 128256
SMI_FIELDS = "timestamp,power.draw,utilization.gpu,clocks.sm,memory.used"


def smi(args: list[str]) -> str:
    try:
        return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"ERROR {e}"


ENERGY_FIELD = ["total_energy_consumption"]


def energy_field(help_text: str) -> str:
    """The driver's name of its energy counter, read off ``nvidia-smi --help-query-gpu``."""
    for line in help_text.splitlines():
        if line.startswith('"'):
            for name in re.findall(r'"([^"]+)"', line):
                if "energy" in name.lower():
                    return name
    return "total_energy_consumption"


def energy_mj() -> float | None:
    out = smi([f"--query-gpu={ENERGY_FIELD[0]}", "--format=csv,noheader,nounits"]).strip()
    try:
        return float(out.splitlines()[0])
    except (ValueError, IndexError):
        return None


class Sampler:
    """nvidia-smi's own loop (-lms) writing power samples to a file while the script runs."""

    def __init__(self, path: str, ms: int = 100):
        self.path = path
        self.f = open(path, "w")
        self.p = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,nounits", f"-lms={ms}"],
                                  stdout=self.f, stderr=subprocess.STDOUT)
        self.marks: list[tuple[str, float, str]] = []

    def mark(self, name: str) -> None:
        self.marks.append((name, time.time(), time.strftime("%Y/%m/%d %H:%M:%S", time.localtime())))

    def stop(self) -> None:
        self.p.terminate()
        self.p.wait(timeout=10)
        self.f.close()


class Model:
    def __init__(self, torch):
        self.t = torch
        dev, dt = "cuda", torch.bfloat16

        def w(*shape):
            return torch.empty(*shape, device=dev, dtype=dt).normal_(0, 0.02)
        self.layers = [dict(qkv=w(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM), o=w(HEADS * HEAD_DIM, HIDDEN),
                            gu=w(HIDDEN, 2 * MLP), d=w(MLP, HIDDEN), n1=w(HIDDEN), n2=w(HIDDEN)) for _ in range(LAYERS)]
        self.embed = w(VOCAB, HIDDEN)
        self.head = w(HIDDEN, VOCAB)
        self.nf = w(HIDDEN)

    def forward(self, ids, caches=None, pos=None):
        """ids [B, S]; caches: per layer (K, V) [B, KV_HEADS, C+1, HEAD_DIM] for decode (S == 1),
        the new token written at ``pos``; None for a causal prefill."""
        t, F = self.t, self.t.nn.functional
        x = self.embed[ids]
        B, S, _ = x.shape
        for i, L in enumerate(self.layers):
            h = F.rms_norm(x, (HIDDEN,), L["n1"])
            qkv = h @ L["qkv"]
            q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
            q = q.view(B, S, HEADS, HEAD_DIM).transpose(1, 2)
            k = k.view(B, S, KV_HEADS, HEAD_DIM).transpose(1, 2)
            v = v.view(B, S, KV_HEADS, HEAD_DIM).transpose(1, 2)
            if caches is None:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                K, V = caches[i]
                K[:, :, pos:pos + 1] = k
                V[:, :, pos:pos + 1] = v
                a = F.scaled_dot_product_attention(q, K, V, enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(B, S, HEADS * HEAD_DIM) @ L["o"]
            h = F.rms_norm(x, (HIDDEN,), L["n2"])
            g, u = (h @ L["gu"]).chunk(2, dim=-1)
            x = x + (F.silu(g) * u) @ L["d"]
        last = F.rms_norm(x[:, -1], (HIDDEN,), self.nf)
        return t.argmax(last @ self.head, dim=-1)


def timed(torch, fn, iters: int, warm: int = 3) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1000.0)
    return statistics.median(out)


def decode_graph(torch, m: Model, B: int, C: int):
    caches = [(torch.empty(B, KV_HEADS, C + 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16).normal_(),
               torch.empty(B, KV_HEADS, C + 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16).normal_())
              for _ in range(LAYERS)]
    ids = torch.randint(0, VOCAB, (B, 1), device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            m.forward(ids, caches, C)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        m.forward(ids, caches, C)
    return g, caches


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="results JSON")
    ap.add_argument("--smi-dir", required=True, help="folder for the raw nvidia-smi outputs (fixtures)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--sustain-s", type=float, default=8.0, help="seconds of the sustained decode loop for energy")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("gpu_steps: needs torch with CUDA", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_steps: no CUDA device", file=sys.stderr)
        return 2
    os.makedirs(a.smi_dir, exist_ok=True)
    helptext = smi(["--help-query-gpu"])
    with open(os.path.join(a.smi_dir, "nvidia-smi-help-query-gpu.txt"), "w") as f:
        f.write(helptext)
    ENERGY_FIELD[0] = energy_field(helptext)
    print(f"energy field: {ENERGY_FIELD[0]}", file=sys.stderr)
    for name, args in (("nvidia-smi-q-power.txt", ["-q", "-d", "POWER"]),
                       ("nvidia-smi-query-accel.csv", ["--query-gpu=index,utilization.gpu,memory.used,memory.total",
                                                       "--format=csv,noheader,nounits"]),
                       ("nvidia-smi-query-power.csv", ["--query-gpu=index,power.draw,power.limit,enforced.power.limit,"
                                                       f"{ENERGY_FIELD[0]}", "--format=csv,noheader,nounits"]),
                       ("nvidia-smi-query-power-header.csv", ["--query-gpu=index,power.draw,power.draw.average,"
                                                              f"power.draw.instant,power.limit,{ENERGY_FIELD[0]}",
                                                              "--format=csv"])):
        with open(os.path.join(a.smi_dir, name), "w") as f:
            f.write(smi(args))
    sampler = Sampler(os.path.join(a.smi_dir, "nvidia-smi-lms100.csv"))
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "model": {"hidden": HIDDEN, "layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
                           "mlp": MLP, "vocab": VOCAB, "dtype": "bfloat16"},
                 "prefill": [], "decode": [], "energy_field": ENERGY_FIELD[0]}
    sampler.mark("idle_start")
    e0, t0 = energy_mj(), time.time()
    time.sleep(3.0)
    e1, t1 = energy_mj(), time.time()
    sampler.mark("idle_end")
    res["idle"] = {"seconds": t1 - t0, "energy_j": (e1 - e0) / 1000 if e0 is not None and e1 is not None else None}
    torch.manual_seed(0)
    m = Model(torch)
    with torch.inference_mode():
        for S in (128, 512, 2048, 8192):
            ids = torch.randint(0, VOCAB, (1, S), device="cuda")
            s = timed(torch, lambda ids=ids: m.forward(ids), a.iters)
            res["prefill"].append({"batch": 1, "tokens": S, "step_s": s})
            print(f"prefill S={S}: {s * 1e3:.2f} ms", file=sys.stderr, flush=True)
        for C in (512, 2048):
            for B in (1, 8, 32, 64, 128, 256):
                g, caches = decode_graph(torch, m, B, C)
                s = timed(torch, g.replay, a.iters)
                res["decode"].append({"batch": B, "context": C, "step_s": s})
                print(f"decode B={B} C={C}: {s * 1e3:.2f} ms", file=sys.stderr, flush=True)
                if B in (8, 128) and C == 2048:
                    sampler.mark(f"sustain_start_{B}")
                    e0, t0, n = energy_mj(), time.time(), 0
                    torch.cuda.synchronize()
                    while time.time() - t0 < a.sustain_s:
                        for _ in range(20):
                            g.replay()
                        torch.cuda.synchronize()
                        n += 20
                    e1, t1 = energy_mj(), time.time()
                    sampler.mark(f"sustain_end_{B}")
                    res.setdefault("sustain", []).append({"batch": B, "context": C, "steps": n, "seconds": t1 - t0, "tokens": n * B,
                                      "energy_counter_j": (e1 - e0) / 1000 if e0 is not None and e1 is not None else None})
                del g, caches
                torch.cuda.empty_cache()
    time.sleep(0.5)
    sampler.stop()
    res["marks"] = sampler.marks
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: res[k] for k in ("idle", "sustain") if k in res}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
