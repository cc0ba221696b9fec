"""How long one engine step takes: the roofline :class:`CostModel` and the :class:`Noise` on it.

The engine (:mod:`vkit.sim.engine`) asks ``cost.step_time(...)`` for each scheduled batch and
multiplies it by ``noise.factor(now)``; :class:`vkit.sim.calibrated.PhysCost` is the same
model with fitted parameters. No I/O, no clocks: callers pass the time in.
"""

from __future__ import annotations

import math
import random

from vkit.sim.profiles import GpuProfile, ModelProfile

# Physical assumptions of the step-time model (runbook/sim_server.md gives the reasoning):
DEFAULT_MFU = 0.5  # achieved fraction of peak dense BF16 FLOP/s over a whole prefill step
DEFAULT_MBU = 0.8  # achieved fraction of peak HBM bandwidth for weight/KV streaming
STEP_OVERHEAD_S = 0.5e-3  # per-step CPU work not hidden behind the GPU (scheduling, launch)
PER_REQ_OVERHEAD_S = 4e-6  # per scheduled request (input preparation, sampling, detokenising)
GEMM_M_HALF = 128  # tokens per step at which GEMMs reach half of their large-batch efficiency


class CostModel:
    """Roofline step time of one engine iteration on ``tp`` accelerators.

    compute = 2 * body_params * tokens + 2 * lm_head_params * sampled + 4 * L * H * d * pairs
    memory  = weight_bytes + kv_bytes_per_token * (context read + new tokens written)
    step    = max(compute / (peak_flops * tp * mfu * tokens / (tokens + 128)),
                  memory / (hbm_bw * tp * mbu))
              + tensor-parallel all-reduces + CPU overhead

    ``mfu`` is the large-batch efficiency; ``tokens / (tokens + 128)`` is how GEMM efficiency
    falls for steps with few rows (small chunks, small decode batches).
    """

    def __init__(
        self,
        model: ModelProfile,
        gpu: GpuProfile,
        tp: int = 1,
        kv_dtype_bytes: int | None = None,
        mfu: float = DEFAULT_MFU,
        mbu: float = DEFAULT_MBU,
        step_overhead_s: float = STEP_OVERHEAD_S,
        per_req_overhead_s: float = PER_REQ_OVERHEAD_S,
    ):
        self.flops_per_token = 2.0 * model.body_params
        self.flops_per_sample = 2.0 * model.lm_head_params
        self.flops_per_pair = 4.0 * model.layers * model.heads * model.head_dim
        self.weight_bytes = model.streamed_weight_bytes()
        self.kv_bytes_per_token = model.kv_bytes_per_token(tp, kv_dtype_bytes)
        self.achieved_flops = gpu.peak_bf16_flops * tp * mfu
        self.achieved_bw = gpu.hbm_bytes_per_s * tp * mbu
        if tp > 1:
            self.comm_fixed = 2 * model.layers * gpu.allreduce_latency_s
            self.comm_per_token = 2 * model.layers * model.hidden * model.dtype_bytes * 2 * (tp - 1) / tp / gpu.link_bytes_per_s
        else:
            self.comm_fixed = 0.0
            self.comm_per_token = 0.0
        self.step_overhead_s = step_overhead_s
        self.per_req_overhead_s = per_req_overhead_s

    def step_time(self, tokens: int, pairs: int, kv_tokens: int, sampled: int, nreqs: int) -> float:
        if tokens <= 0:
            return 0.0
        # GEMM efficiency rises with the rows (tokens) of the batch and saturates: tokens/(tokens+M_HALF).
        t_c = ((self.flops_per_token * tokens + self.flops_per_sample * sampled + self.flops_per_pair * pairs)
               * (tokens + GEMM_M_HALF) / (tokens * self.achieved_flops))
        t_m = (self.weight_bytes + self.kv_bytes_per_token * kv_tokens) / self.achieved_bw
        return (
            (t_c if t_c > t_m else t_m)
            + self.comm_fixed
            + self.comm_per_token * tokens
            + self.step_overhead_s
            + self.per_req_overhead_s * nreqs
        )


class Noise:
    """Multiplicative step-time factor: between restarts, run to run, slow wander, jitter, drift.

    ``log f = x_start + x_run + x_ou(t) + e_step``:

    - ``x_start ~ N(0, restart_sigma^2)`` is drawn once per process from ``(seed, start_index)``:
      two starts of one configuration differ (KV block layout, graph capture, clocks), and the
      same seed and start count give the same draw;
    - ``x_run ~ N(0, sigma^2)`` is redrawn whenever the engine starts again after an idle
      gap of at least ``regime_gap_s`` (each benchmark run sees new conditions);
    - ``x_ou`` is an Ornstein-Uhlenbeck process with stationary sd ``0.25 sigma`` and correlation
      time ``tau_s`` (runs close in time are alike; it adds to the spread of runs far apart);
    - ``e_step ~ N(0, (0.5 sigma)^2)`` per step (it averages out over a run's thousands of steps).

    So back-to-back runs on one process have sd about ``sigma`` in their mean step time (and so in
    throughput); one run on a new process has sd about ``sqrt(sigma^2 + restart_sigma^2)``;
    ``bench/bench_sim.py --part noise`` measures both on the live server. Then ``f`` is
    multiplied by ``1 + drift * hours`` (hours of engine time since the first step, plus
    ``drift_offset_s`` of engine time already elapsed before it: drift a restart does not reset),
    and by ``slowdown`` once that age reaches ``slowdown_after_s`` (one step change: a neighbour's
    load, a clock throttled), which a restart does not undo either.
    """

    RUN, OU, STEP = 1.0, 0.25, 0.5  # shares of sigma (the wander adds to runs far apart in time)

    def __init__(self, sigma: float, drift_per_hour: float = 0.0, seed: int | None = None,
                 regime_gap_s: float = 2.0, tau_s: float = 60.0, drift_offset_s: float = 0.0,
                 restart_sigma: float = 0.0, start_index: int = 0, slowdown: float = 1.0,
                 slowdown_after_s: float = 0.0):
        self.slowdown, self.slowdown_after = slowdown, slowdown_after_s
        self.rng = random.Random(f"noise:{seed}:{start_index}")
        self.drift_offset = drift_offset_s
        self.sigma = sigma
        self.restart_sigma = restart_sigma
        self.start_index = start_index
        self.drift = drift_per_hour
        self.gap = regime_gap_s
        self.tau = tau_s
        self.s_run, self.s_ou, self.s_step = self.RUN * sigma, self.OU * sigma, self.STEP * sigma
        self.x_start = random.Random(f"start:{seed}:{start_index}").gauss(0.0, restart_sigma) if restart_sigma > 0 else 0.0
        self.x_run = self.rng.gauss(0.0, self.s_run) if sigma > 0 else 0.0
        self.x_ou = self.rng.gauss(0.0, self.s_ou) if sigma > 0 else 0.0
        self.t0: float | None = None
        self.t_prev: float | None = None
        self.last_end: float | None = None
        self.regimes = 1

    @property
    def start_factor(self) -> float:
        """This process's between-restart factor on every step time."""
        return math.exp(self.x_start)

    def factor(self, t: float) -> float:
        if self.t0 is None:
            self.t0 = t
        f = math.exp(self.x_start)
        if self.sigma > 0:
            g = self.rng.gauss
            if self.last_end is not None and t - self.last_end >= self.gap:
                self.x_run = g(0.0, self.s_run)
                self.regimes += 1
            if self.t_prev is not None:
                dt = t - self.t_prev
                if dt > 0:
                    a = math.exp(-dt / self.tau)
                    self.x_ou = self.x_ou * a + self.s_ou * math.sqrt(1.0 - a * a) * g(0.0, 1.0)
            self.t_prev = t
            f *= math.exp(self.x_run + self.x_ou + g(0.0, self.s_step))
        age = self.drift_offset + t - self.t0
        if self.drift:
            f *= 1.0 + self.drift * age / 3600.0
        if self.slowdown != 1.0 and age >= self.slowdown_after:
            f *= self.slowdown
        return f

    def note_end(self, t_end: float) -> None:
        self.last_end = t_end
