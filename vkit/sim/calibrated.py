"""The calibrated step-cost model and the profile file that carries its parameters.

A *sim profile* (``--sim-profile FILE``, written by ``bin/sim_calibrate``) is a JSON object::

    {"format": "vkit-sim-profile/1", "params": {"mfu": 0.43, ...}, "stderr": {...}, "fit": {...},
     "workload": {"closed_loop_ramp_steps": 40}}

``workload.closed_loop_ramp_steps`` is the closed-loop ramp the fit kept (how many engine steps the
first batch of requests took to enter; see :mod:`vkit.sim.predict`); ``sim_predict`` uses it for
closed loops unless ``--ramp-steps`` says otherwise.

``params`` are the free parameters of :class:`PhysCost`; missing ones take the defaults, and with
every parameter at its default ``PhysCost`` is the built-in roofline of
:class:`vkit.sim.engine.CostModel` (a test holds the two equal). Without a profile the simulator
keeps using ``CostModel`` itself, so its default behaviour does not depend on this module.

Step time of one engine iteration with T scheduled tokens, S sampled rows, P attention
query/key pairs, K KV tokens read or written and n scheduled requests, on ``tp`` devices::

    t_c   = (2·body·T / peak_body + 2·head·S / peak_16 + attn_scale·4·L·H·d·P / peak_16)
            · (T + gemm_m_half) / T / (tp · mfu)
    t_m   = (weight_bytes + kv_bytes_per_token · K) / (hbm_bw · tp · mbu)
    step  = max(t_c, t_m) + (1 − overlap) · min(t_c, t_m)
            + [tp > 1] 2·L·(allreduce_latency_s + T·hidden·2 B·2(tp−1)/tp / (link_bw · link_eff))
            + (decode_step_overhead_s if every request took one token else mixed_step_overhead_s)
            + per_req_overhead_s · n

and every request's TTFT and E2EL carry ``frontend_latency_s + frontend_per_token_s · prompt_len``,
the API server's part (HTTP, tokenisation, the hand-off to EngineCore) that the engine does not see.

``peak_body`` is the GPU's dense FP8 peak when the weights are FP8 and the GPU has FP8 tensor
cores (W8A8 GEMMs), else its 16-bit peak; the LM head and attention run in 16 bits. A step is
*decode-only* when each scheduled request takes exactly one token: vLLM V1 runs such a batch as
one full CUDA graph (``cudagraph_mode`` FULL_AND_PIECEWISE, the default since v0.11), while a
step carrying prompt tokens runs piecewise graphs with attention eager between them, or eager
past the largest captured size; the two overheads are separate parameters for that reason.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields

from vkit.errors import UsageError
from vkit.sim.profiles import GpuProfile, ModelProfile
from vkit.sim.steptime import DEFAULT_MBU, DEFAULT_MFU, GEMM_M_HALF, PER_REQ_OVERHEAD_S, STEP_OVERHEAD_S

PROFILE_FORMAT = "vkit-sim-profile/1"


@dataclass
class CostParams:
    """The free parameters of the step-cost model; the defaults are the built-in roofline's."""

    mfu: float = DEFAULT_MFU  # achieved fraction of peak FLOP/s at large batch
    mbu: float = DEFAULT_MBU  # achieved fraction of peak HBM bandwidth
    gemm_m_half: float = float(GEMM_M_HALF)  # tokens at which GEMMs reach half their large-batch rate
    attn_scale: float = 1.0  # prefill attention FLOPs cost this many GEMM FLOPs
    overlap: float = 1.0  # 1: compute and memory traffic overlap fully (roofline max); 0: they add
    decode_step_overhead_s: float = STEP_OVERHEAD_S  # CPU time per decode-only step (full CUDA graph)
    mixed_step_overhead_s: float = STEP_OVERHEAD_S  # CPU time per step with prompt tokens (piecewise)
    per_req_overhead_s: float = PER_REQ_OVERHEAD_S  # CPU time per scheduled request
    allreduce_latency_s: float | None = None  # None: the GPU profile's
    link_eff: float = 1.0  # achieved fraction of the GPU-to-GPU link bandwidth
    frontend_latency_s: float = 0.0  # API server time before a request reaches the engine (HTTP, hand-off)
    frontend_per_token_s: float = 0.0  # ... plus this per prompt token (tokenisation)

    def frontend_s(self, prompt_len: int) -> float:
        """Time from the client's send to the engine's queue, added to TTFT and E2EL."""
        return self.frontend_latency_s + self.frontend_per_token_s * prompt_len

    @classmethod
    def from_dict(cls, d: dict) -> CostParams:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise UsageError(f"unknown sim profile parameter(s): {', '.join(unknown)}; known: {', '.join(sorted(names))}")
        out = cls()
        for k, v in d.items():
            if v is None and k == "allreduce_latency_s":
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise UsageError(f"sim profile parameter {k} must be a finite number >= 0, got {v!r}")
            setattr(out, k, float(v))
        if not 0 < out.mfu <= 1 or not 0 < out.mbu <= 1 or not 0 <= out.overlap <= 1 or out.link_eff <= 0:
            raise UsageError("sim profile: mfu and mbu must be in (0, 1], overlap in [0, 1], link_eff > 0")
        return out

    def to_dict(self) -> dict:
        return asdict(self)


class PhysCost:
    """Step time with :class:`CostParams`; the same formula scalar (for the engine) and vectorised
    (for replaying a recorded schedule, see :mod:`vkit.sim.predict`)."""

    def __init__(self, model: ModelProfile, gpu: GpuProfile, tp: int = 1, kv_dtype_bytes: int | None = None,
                 params: CostParams | None = None, quantization: str | None = None):
        p = params or CostParams()
        self.params = p
        if quantization:
            peak_body = gpu.peak_fp8_flops if gpu.peak_fp8_flops > 0 else gpu.peak_bf16_flops
        else:
            peak_body = gpu.peak_bf16_flops
        denom = tp * p.mfu
        self.a_body = 2.0 * model.body_params / (peak_body * denom)
        self.a_head = 2.0 * model.lm_head_params / (gpu.peak_bf16_flops * denom)
        self.a_attn = p.attn_scale * 4.0 * model.layers * model.heads * model.head_dim / (gpu.peak_bf16_flops * denom)
        self.m_half = p.gemm_m_half
        bw = gpu.hbm_bytes_per_s * tp * p.mbu
        self.t_weights = model.streamed_weight_bytes(quantization) / bw
        self.b_kv = model.kv_bytes_per_token(tp, kv_dtype_bytes) / bw
        self.under = 1.0 - p.overlap
        if tp > 1:
            lat = gpu.allreduce_latency_s if p.allreduce_latency_s is None else p.allreduce_latency_s
            self.comm_fixed = 2 * model.layers * lat
            self.comm_per_token = (2 * model.layers * model.hidden * model.dtype_bytes * 2 * (tp - 1) / tp
                                   / (gpu.link_bytes_per_s * p.link_eff))
        else:
            self.comm_fixed = 0.0
            self.comm_per_token = 0.0
        self.o_dec = p.decode_step_overhead_s
        self.o_mix = p.mixed_step_overhead_s
        self.o_req = p.per_req_overhead_s

    def step_time(self, tokens: int, pairs: int, kv_tokens: int, sampled: int, nreqs: int) -> float:
        if tokens <= 0:
            return 0.0
        t_c = (self.a_body * tokens + self.a_head * sampled + self.a_attn * pairs) * (tokens + self.m_half) / tokens
        t_m = self.t_weights + self.b_kv * kv_tokens
        hi, lo = (t_c, t_m) if t_c > t_m else (t_m, t_c)
        return (hi + self.under * lo + self.comm_fixed + self.comm_per_token * tokens
                + (self.o_dec if tokens == nreqs else self.o_mix) + self.o_req * nreqs)

    def step_times(self, tokens, pairs, kv_tokens, sampled, nreqs):
        """``step_time`` over numpy arrays (every entry has tokens > 0)."""
        import numpy as np

        t_c = (self.a_body * tokens + self.a_head * sampled + self.a_attn * pairs) * (tokens + self.m_half) / tokens
        t_m = self.t_weights + self.b_kv * kv_tokens
        hi = np.maximum(t_c, t_m)
        lo = np.minimum(t_c, t_m)
        return (hi + self.under * lo + self.comm_fixed + self.comm_per_token * tokens
                + np.where(tokens == nreqs, self.o_dec, self.o_mix) + self.o_req * nreqs)


def load_profile(path: str) -> dict:
    """Read a sim profile file; a usage error (exit 2) with one sentence if it is not one."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"--sim-profile: no such file: {path}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise UsageError(f"--sim-profile: {path} is not a readable JSON file ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != PROFILE_FORMAT or not isinstance(doc.get("params"), dict):
        raise UsageError(f"--sim-profile: {path} is not a {PROFILE_FORMAT} file (written by sim_calibrate)")
    doc["cost_params"] = CostParams.from_dict(doc["params"])
    ramp = (doc.get("workload") or {}).get("closed_loop_ramp_steps")
    if ramp is not None and (not isinstance(ramp, int) or isinstance(ramp, bool) or ramp < 1):
        raise UsageError(f"--sim-profile: workload.closed_loop_ramp_steps must be an integer >= 1, got {ramp!r}")
    doc["ramp_steps"] = ramp
    return doc


def write_profile(path: str, params: CostParams, stderr: dict | None = None, fit: dict | None = None,
                  workload: dict | None = None) -> None:
    doc = {"format": PROFILE_FORMAT, "params": params.to_dict(), "stderr": stderr or {}, "fit": fit or {},
           "workload": workload or {}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")
