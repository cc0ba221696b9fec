"""The simulator's own settings (:class:`SimSettings`): everything that is not a vLLM engine option.
Its own module, so that the endpoints (:mod:`vkit.sim.api`) and the server (:mod:`vkit.sim.serve`)
both read it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field

STATS_LOG_INTERVAL_S = 10.0  # the 'Engine 000: Avg ...' log line's period (vLLM's VLLM_LOG_STATS_INTERVAL default)


@dataclass
class SimSettings:
    """Everything that is not a vLLM engine option: address, realism, faults."""

    host: str = "127.0.0.1"
    port: int = 8000
    gpu_name: str = "H200"
    model_name: str = "llama-3.1-8b"
    speed: float = 1.0
    startup_s: float = 1.0
    noise: float = 0.02  # run-to-run sd on one process
    restart_noise: float | None = None  # sd between process starts; None: 0.75 x noise
    start_index: int = 0  # which start of this seed this process is (the between-restart draw)
    drift_per_hour: float = 0.0
    drift_since: float | None = None  # unix time the drift counts from (survives restarts); None: first step
    slowdown: float = 1.0  # step time x this once the drift's clock reaches slowdown_after_s (--sim-slowdown)
    slowdown_after_s: float = 0.0
    seed: int = 0
    pathology: str | None = None
    pathology_slowdown: float = 10.0  # how many times its own time a short prefill takes under the pathology
    output_len_mean: int = 128
    mfu: float = 0.5
    mbu: float = 0.8
    cost_params: object | None = None  # vkit.sim.calibrated.CostParams from --sim-profile; None: built-in roofline
    profile_path: str | None = None
    hidden_seed: int | None = None  # --sim-hidden-effects: effects the twin's cost model lacks (vkit.sim.hidden)
    fail_at_start: bool = False
    # memory the process needs outside gpu_memory_utilization x total once it serves concurrent requests
    # (--sim-oom-under-load-gib): where less is left, the engine dies of CUDA out of memory under load
    oom_under_load_bytes: int = 0
    crash_after: int | None = None
    hang_health: bool = False
    stall_stream_after: int | None = None
    error_rate: float = 0.0
    error_burst: tuple[int, int] | None = None  # (after, count): requests after+1 .. after+count answered 500
    malformed_sse_after: int | None = None  # the stream of request N+1 opens with an event that is not JSON
    access_log: bool = True
    log_stats: bool = True
    stats_interval_s: float = STATS_LOG_INTERVAL_S
    dev_mode: bool = False
    non_default_args: dict = field(default_factory=dict)

    @property
    def effective_restart_noise(self) -> float:
        return 0.75 * self.noise if self.restart_noise is None else self.restart_noise
