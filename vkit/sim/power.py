"""Board power of the simulated accelerators: what a step of the engine draws, and an energy counter.

Each engine step of duration ``T`` on ``tp`` boards moves ``bytes`` through HBM and does ``flops``
of arithmetic. Its board power, per device::

    P = idle + (limit - idle) * min(1, K_COMPUTE * flops / (peak * tp * T) + K_MEMORY * bytes / (hbm * tp * T))

that is, the idle draw plus a share of the board's dynamic range that rises with the step's
*achieved* compute and memory utilisation (not with its busy time: a small decode batch keeps the
SMs busy at a few percent of their peak, and draws accordingly). Between steps a board draws idle.
The simulator does not throttle clocks at the limit; a step that would draw more is capped at it.

``K_COMPUTE`` and ``K_MEMORY`` are fitted (``bench/power_fit.py``, its JSON in
``bench/results/power_fit.json``) to the sustained decode loops of ``bench/gpu_steps.py`` on a real
NVIDIA H200: Llama-3.1-8B, context 2048, batch 8 at 452 W and batch 128 at 669 W, board idle 77.7 W,
power limit 700 W. Two points fix two constants: the fit has no residual to report, and no held-out
point yet. They are shares of a board's dynamic range, and are used for every board; each board's
idle and limit are its own (``BOARDS``, each with where its numbers come from).
"""

from __future__ import annotations

from dataclasses import dataclass

from vkit.sim.profiles import GpuProfile, ModelProfile

# bench/power_fit.py on bench/results/gpu_steps_h200.json (tests/test_sim_power.py re-derives them)
K_COMPUTE = 2.2392
K_MEMORY = 0.89102


@dataclass(frozen=True)
class BoardPower:
    idle_w: float  # one board, nothing running, the model loaded
    limit_w: float  # the board's default power limit
    source: str


BOARDS: dict[str, BoardPower] = {
    "H200": BoardPower(77.7, 700.0, "measured: idle 77.7 W (31 samples) and Default Power Limit 700 W, nvidia-smi on an "
                                    "H200 SXM, driver 580.159.04 (tests/fixtures/accel/nvidia-h200)"),
    "H100-80G": BoardPower(77.7, 700.0, "limit: H100 SXM5 datasheet (700 W); idle not measured, the H200's (same SXM5 "
                                        "board family and limit)"),
    "A100-80G": BoardPower(55.0, 400.0, "limit: A100 SXM4 datasheet (400 W); idle assumed, not measured"),
    "L40S": BoardPower(35.0, 350.0, "limit: L40S datasheet (350 W); idle assumed, not measured"),
    "Ascend-910B": BoardPower(90.0, 400.0, "limit and idle assumed for an Atlas 800T A2 910B module, not measured"),
}


def board(gpu: GpuProfile) -> BoardPower:
    b = BOARDS.get(gpu.name)
    if b is None:
        raise KeyError(f"no power figures for the simulated accelerator {gpu.name}")
    return b


class PowerMeter:
    """The power the engine's steps draw on ``tp`` boards, and the energy since the engine started.

    ``step`` is called with each step's work and (noisy) duration; ``energy_j(t)`` is what an energy
    counter (nvidia-smi's ``total_energy_consumption``) would read ``t`` seconds after the start,
    all boards together: idle for the whole time, plus each step's draw above idle."""

    def __init__(self, model: ModelProfile, gpu: GpuProfile, tp: int = 1, kv_dtype_bytes: int | None = None,
                 quantization: str | None = None):
        self.board = board(gpu)
        self.tp = tp
        peak = gpu.peak_fp8_flops if quantization and gpu.peak_fp8_flops > 0 else gpu.peak_bf16_flops
        self.weight_bytes = model.streamed_weight_bytes(quantization)
        self.kv_bytes_per_token = model.kv_bytes_per_token(tp, kv_dtype_bytes)
        self.flops_per_token = 2.0 * model.body_params
        self.flops_per_sample = 2.0 * model.lm_head_params
        self.flops_per_pair = 4.0 * model.layers * model.heads * model.head_dim
        self.k_flops = K_COMPUTE / (peak * tp)
        self.k_bytes = K_MEMORY / (gpu.hbm_bytes_per_s * tp)
        self.idle_w = self.board.idle_w * tp
        self.span_w = (self.board.limit_w - self.board.idle_w) * tp
        self.above_idle_j = 0.0
        self.busy_s = 0.0
        self.last_w = self.idle_w
        self._last = (0.0, 0.0, 0.0)  # the last step's (start, duration, power above idle)

    def work(self, tokens: int, pairs: int, kv_tokens: int, sampled: int) -> tuple[float, float]:
        """(FLOPs, HBM bytes) of one step, counted as the engine counts its batch."""
        flops = self.flops_per_token * tokens + self.flops_per_sample * sampled + self.flops_per_pair * pairs
        return flops, self.weight_bytes + self.kv_bytes_per_token * kv_tokens

    def share(self, tokens: int, pairs: int, kv_tokens: int, sampled: int, duration: float) -> float:
        """The step's share of the boards' dynamic range, in [0, 1]."""
        if duration <= 0 or tokens <= 0:
            return 0.0
        flops, moved = self.work(tokens, pairs, kv_tokens, sampled)
        return min(1.0, (self.k_flops * flops + self.k_bytes * moved) / duration)

    def step(self, tokens: int, pairs: int, kv_tokens: int, sampled: int, duration: float, start: float = 0.0) -> float:
        """Account one step starting at ``start`` (virtual seconds); its power, all boards together (W)."""
        above = self.span_w * self.share(tokens, pairs, kv_tokens, sampled, duration)
        self.above_idle_j += above * duration
        self.busy_s += duration
        self.last_w = self.idle_w + above
        self._last = (start, duration, above)
        return self.last_w

    def energy_j(self, elapsed_s: float, now: float | None = None) -> float:
        """The counter ``elapsed_s`` after the start; with ``now`` (virtual seconds), less the part of a
        step still running then (a step is accounted whole when it is scheduled)."""
        e = self.idle_w * elapsed_s + self.above_idle_j
        if now is not None:
            start, duration, above = self._last
            if now < start + duration:
                e -= above * min(duration, start + duration - now)
        return e


__all__ = ["BOARDS", "K_COMPUTE", "K_MEMORY", "BoardPower", "PowerMeter", "board"]
