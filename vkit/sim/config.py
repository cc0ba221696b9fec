"""Resolve ``vllm serve`` options the way vLLM V1 does, and fail the way it fails.

``resolve(opts)`` applies V1's defaults for the simulated accelerator, validates like
vLLM's ``ModelConfig`` / ``CacheConfig`` / ``SchedulerConfig``, and sizes the KV cache
from the memory model::

    available = total_memory * gpu_memory_utilization - weights - activation_peak - fixed

Failures raise :class:`SimStartupError` carrying vLLM's own exception type and text;
the server prints them as vLLM would and exits 1. Nothing here prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from vkit.errors import ExitCode, VkitError
from vkit.sim.profiles import KV_DTYPE_BYTES, GiB, GpuProfile, ModelProfile

DOCS_MEMORY = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"

# Memory vLLM keeps outside the KV cache besides weights and the profiled activation peak:
# non-torch allocations (CUDA context, NCCL buffers) and the CUDA-graph pool. Typical values
# in vLLM's own start-up log ("non-torch memory", "CUDA graph ... took X GiB") on H100-class GPUs.
NON_TORCH_BYTES = int(0.25 * GiB)
CUDA_GRAPH_BYTES = int(0.40 * GiB)


class SimStartupError(VkitError):
    """A start-up failure reproduced with vLLM's exception type and message.

    ``stage`` is ``"frontend"`` (argument/config validation in the API server process:
    printed as a traceback on stderr) or ``"engine"`` (raised inside EngineCore: logged as
    ``EngineCore failed to start.`` and followed by the API server's RuntimeError).
    """

    code = ExitCode.REJECTED

    def __init__(self, stage: str, exc_type: str, message: str, log_before: list[str] | None = None):
        super().__init__(message)
        self.stage = stage
        self.exc_type = exc_type
        self.message = message
        self.log_before = log_before or []


@dataclass
class ServeOptions:
    """The engine-relevant ``vllm serve`` flags, as parsed (``None`` = not given)."""

    model: str
    gpu: GpuProfile
    model_profile: ModelProfile
    served_model_name: list[str] | None = None
    max_model_len: int | None = None  # -1 = auto
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    scheduling_policy: str = "fcfs"
    gpu_memory_utilization: float = 0.92
    block_size: int = 16
    tensor_parallel_size: int = 1
    kv_cache_dtype: str = "auto"
    num_gpu_blocks_override: int | None = None
    long_prefill_token_threshold: int = 0
    max_num_partial_prefills: int = 1
    allow_long_max_model_len: bool = False
    quantization: str | None = None  # --quantization: None (the model's dtype) or "fp8" (weights)
    memory_in_use_bytes: int = 0  # device memory other processes hold at start-up (--sim-memory-in-use-gib)


@dataclass
class Resolved:
    served_model_names: list[str]
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    scheduling_policy: str
    block_size: int
    tensor_parallel_size: int
    kv_cache_dtype: str
    kv_dtype_bytes: int
    gpu_memory_utilization: float
    weights_bytes_per_gpu: int
    activation_bytes_per_gpu: int
    available_kv_bytes_per_gpu: int
    num_gpu_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    num_gpu_blocks_override: int | None
    long_prefill_token_threshold: int
    warnings: list[str] = field(default_factory=list)
    infos: list[str] = field(default_factory=list)


def format_gib(n_bytes: float) -> float:
    """vLLM's ``format_gib``: GiB rounded to 2 decimals, printed as a Python float (``1.0``)."""
    return round(n_bytes / GiB, 2)


def _check_free_memory(o: ServeOptions) -> None:
    """vLLM's worker (``gpu_worker.py``, ``init_device``) refuses to start when the device's free memory is
    less than gpu_memory_utilization x total: memory other processes hold lowers the highest value that starts."""
    total = o.gpu.memory_bytes
    free = total - o.memory_in_use_bytes
    requested = total * o.gpu_memory_utilization
    if free < requested:
        raise SimStartupError(
            "engine", "ValueError",
            f"Free memory on device ({format_gib(free)}/{format_gib(total)} GiB) on startup is less than desired GPU "
            f"memory utilization ({o.gpu_memory_utilization}, {format_gib(requested)} GiB). Decrease GPU memory "
            "utilization or reduce GPU memory used by other processes.",
        )


def batch_defaults(gpu: GpuProfile) -> tuple[int, int]:
    """V1's server defaults (max_num_batched_tokens, max_num_seqs) for a device."""
    if gpu.memory_bytes >= 70 * GiB and "a100" not in gpu.device_name.lower():
        return 8192, 1024
    return 2048, 256


def activation_peak_bytes(m: ModelProfile, tokens: int, max_num_seqs: int, tp: int) -> int:
    """Peak activation memory of vLLM's profiling run (a forward pass of ``tokens`` tokens
    plus a sampler pass over ``max_num_seqs`` rows of fp32 logits), per GPU.

    Dominant live tensors of a transformer layer: the residual/normed hidden states
    (2 x hidden) and the fused gate/up MLP output (2 x intermediate, split over TP).
    """
    per_token = (2 * m.hidden + 2 * m.intermediate // tp) * m.dtype_bytes
    logits = max_num_seqs * m.vocab * 4
    return tokens * per_token + logits


def _kv_heads_per_gpu(m: ModelProfile, tp: int) -> int:
    return max(1, m.kv_heads // tp)


def page_bytes_per_layer(m: ModelProfile, block_size: int, tp: int, kv_bytes: int) -> int:
    """Bytes of one KV block of one layer on one GPU (K and V)."""
    return 2 * block_size * _kv_heads_per_gpu(m, tp) * m.head_dim * kv_bytes


def resolve(o: ServeOptions) -> Resolved:
    """The engine configuration ``vllm serve`` would run with, or the :class:`SimStartupError` it fails with.

    Front-end validation first (ModelConfig, ParallelConfig, CacheConfig, SchedulerConfig), then the
    engine's start-up: load the weights, profile the activation peak, size the KV cache.
    """
    m, gpu, tp = o.model_profile, o.gpu, o.tensor_parallel_size
    warnings: list[str] = []
    infos: list[str] = []
    max_model_len = _model_len(o, warnings)
    _check_parallel(m, tp)
    kv_bytes = _cache_dtype_bytes(o)
    chunked, prefix, max_num_seqs, tokens = _scheduler(o, max_model_len, warnings, infos)

    # Engine start-up: the worker's memory check, then load, profile, size the KV cache.
    _check_free_memory(o)
    weights = _weights_per_gpu(o)
    activation = activation_peak_bytes(m, tokens, max_num_seqs, tp)
    available = int(gpu.memory_bytes * o.gpu_memory_utilization) - weights - activation - NON_TORCH_BYTES - CUDA_GRAPH_BYTES
    page = page_bytes_per_layer(m, o.block_size, tp, kv_bytes)
    per_block_all_layers = page * m.layers
    if available <= 0:
        raise SimStartupError(
            "engine", "ValueError",
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
            f"when initializing the engine. See {DOCS_MEMORY} for more details.",
        )
    fit_blocks = available // per_block_all_layers
    if o.max_model_len == -1:
        max_model_len = _auto_fit_len(m.max_position_embeddings, fit_blocks * o.block_size, available, infos)
    blocks_per_seq = _check_one_sequence_fits(o, max_model_len, per_block_all_layers, fit_blocks, available)
    num_blocks = int(fit_blocks)
    if o.num_gpu_blocks_override is not None:
        infos.append(f"Overriding num_gpu_blocks={num_blocks} with num_gpu_blocks_override={o.num_gpu_blocks_override}")
        num_blocks = o.num_gpu_blocks_override
    names = list(o.served_model_name) if o.served_model_name else [o.model]
    return Resolved(
        served_model_names=names,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=tokens,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=prefix,
        scheduling_policy=o.scheduling_policy,
        block_size=o.block_size,
        tensor_parallel_size=tp,
        kv_cache_dtype=o.kv_cache_dtype,
        kv_dtype_bytes=kv_bytes,
        gpu_memory_utilization=o.gpu_memory_utilization,
        weights_bytes_per_gpu=weights,
        activation_bytes_per_gpu=activation,
        available_kv_bytes_per_gpu=available,
        num_gpu_blocks=num_blocks,
        kv_cache_tokens=num_blocks * o.block_size,
        max_concurrency=num_blocks / blocks_per_seq,
        num_gpu_blocks_override=o.num_gpu_blocks_override,
        long_prefill_token_threshold=o.long_prefill_token_threshold,
        warnings=warnings,
        infos=infos,
    )


def _model_len(o: ServeOptions, warnings: list[str]) -> int:
    """ModelConfig: the max model len asked for (the derived one when auto), checked against the derived one."""
    derived = o.model_profile.max_position_embeddings
    auto_len = o.max_model_len is None or o.max_model_len == -1
    max_model_len = derived if auto_len else o.max_model_len
    if not auto_len and max_model_len > derived:
        msg = (
            f"User-specified max_model_len ({max_model_len}) is greater than the derived "
            f"max_model_len (max_position_embeddings={float(derived)} or model_max_length=None "
            "in model's config.json)."
        )
        if not o.allow_long_max_model_len:
            raise SimStartupError(
                "frontend",
                "pydantic_core._pydantic_core.ValidationError",
                "1 validation error for ModelConfig\n  Value error, "
                + msg
                + " To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model uses "
                "relative position encoding (RoPE), positions exceeding derived_max_model_len lead to "
                "nan. If the model uses absolute position encoding, positions exceeding "
                "derived_max_model_len will cause a CUDA array out-of-bounds error. "
                f"[type=value_error, input_value=ArgsKwargs((), {{'model': '{o.model}', ...}}), "
                "input_type=ArgsKwargs]\n"
                "    For further information visit https://errors.pydantic.dev/2.12/v/value_error",
            )
        warnings.append(msg + " Make sure the value is correct and within the model context size.")
    if max_model_len < 1:
        raise SimStartupError(
            "frontend", "pydantic_core._pydantic_core.ValidationError",
            "1 validation error for ModelConfig\nmax_model_len\n  Input should be greater than or "
            f"equal to 1 [type=greater_than_equal, input_value={max_model_len}, input_type=int]",
        )
    return max_model_len


def _check_parallel(m: ModelProfile, tp: int) -> None:
    """ParallelConfig vs the model: the attention heads split evenly over the GPUs."""
    if m.heads % tp != 0:
        raise SimStartupError(
            "frontend", "ValueError",
            f"Total number of attention heads ({m.heads}) must be divisible by tensor parallel size ({tp}).",
        )


def _cache_dtype_bytes(o: ServeOptions) -> int:
    """CacheConfig: validate gpu_memory_utilization; the bytes of one KV-cache element."""
    if not 0 < o.gpu_memory_utilization <= 1:
        bound = "greater than 0" if o.gpu_memory_utilization <= 0 else "less than or equal to 1"
        kind = "greater_than" if o.gpu_memory_utilization <= 0 else "less_than_equal"
        raise SimStartupError(
            "frontend", "pydantic_core._pydantic_core.ValidationError",
            "1 validation error for CacheConfig\ngpu_memory_utilization\n  Input should be "
            f"{bound} [type={kind}, input_value={o.gpu_memory_utilization}, input_type=float]",
        )
    return KV_DTYPE_BYTES.get(o.kv_cache_dtype) or o.model_profile.dtype_bytes


def _scheduler(o: ServeOptions, max_model_len: int, warnings: list[str], infos: list[str]) -> tuple[bool, bool, int, int]:
    """SchedulerConfig: V1 defaults for this device, then validation.

    Returns (enable_chunked_prefill, enable_prefix_caching, max_num_seqs, max_num_batched_tokens).
    """
    d_tokens, d_seqs = batch_defaults(o.gpu)
    chunked = True if o.enable_chunked_prefill is None else o.enable_chunked_prefill
    prefix = True if o.enable_prefix_caching is None else o.enable_prefix_caching
    max_num_seqs = o.max_num_seqs if o.max_num_seqs is not None else d_seqs
    if o.max_num_batched_tokens is not None:
        tokens = o.max_num_batched_tokens
    else:
        tokens = d_tokens if chunked else max(max_model_len, d_tokens)
    if o.max_num_partial_prefills != 1:
        raise SimStartupError(
            "frontend", "NotImplementedError",
            "Concurrent Partial Prefill is not supported. We recommend to remove "
            "concurrent partial prefill settings from your config.",
        )
    sched_err = None
    if tokens < max_model_len and not chunked:
        sched_err = (
            f"max_num_batched_tokens ({tokens}) is smaller than max_model_len ({max_model_len}). "
            "This effectively limits the maximum sequence length to max_num_batched_tokens and "
            "makes vLLM reject longer sequences. Please increase max_num_batched_tokens or "
            "decrease max_model_len."
        )
    elif tokens < max_num_seqs:
        sched_err = (
            f"max_num_batched_tokens ({tokens}) must be greater than or equal to max_num_seqs ({max_num_seqs})."
        )
    if sched_err:
        raise SimStartupError(
            "frontend", "pydantic_core._pydantic_core.ValidationError",
            "1 validation error for SchedulerConfig\n  Value error, " + sched_err
            + " [type=value_error, input_value=ArgsKwargs((), {'runner_type': 'generate', "
            f"'max_num_batched_tokens': {tokens}, 'max_num_seqs': {max_num_seqs}, ...}}), "
            "input_type=ArgsKwargs]\n"
            "    For further information visit https://errors.pydantic.dev/2.12/v/value_error",
        )
    if chunked:
        infos.append(f"Chunked prefill is enabled with max_num_batched_tokens={tokens}.")
    if tokens > max_num_seqs * max_model_len:
        warnings.append(
            f"max_num_batched_tokens ({tokens}) exceeds max_num_seqs * max_model_len "
            f"({max_num_seqs * max_model_len}). This may lead to unexpected behavior."
        )
    return chunked, prefix, max_num_seqs, tokens


def _weights_per_gpu(o: ServeOptions) -> int:
    """Loading the model: its weight bytes on each GPU, or vLLM's OOM when they cannot fit at all."""
    total = o.gpu.memory_bytes
    weights = o.model_profile.weight_bytes_for(o.quantization) // o.tensor_parallel_size
    if weights > total:
        raise SimStartupError(
            "engine", "torch.OutOfMemoryError",
            f"CUDA out of memory. Tried to allocate {format_gib(weights - total + GiB)} GiB. GPU 0 has a "
            f"total capacity of {total / GiB:.2f} GiB of which 0 bytes is free.",
            log_before=[
                "Failed to load model - not enough GPU memory. Try lowering --gpu-memory-utilization "
                "to free memory for weights, increasing --tensor-parallel-size, or using --quantization. "
                f"See {DOCS_MEMORY} for more tips."
            ],
        )
    return weights


def _auto_fit_len(derived: int, fit_tokens: int, available: int, infos: list[str]) -> int:
    """``--max-model-len -1``: the derived max model len, reduced to the tokens the KV cache holds."""
    fit_len = min(derived, fit_tokens)
    if fit_len <= 0:
        raise SimStartupError(
            "engine", "ValueError",
            "Cannot auto-fit max_model_len: not enough GPU memory available to serve even a "
            "single token. Try increasing `gpu_memory_utilization`.",
        )
    if fit_len >= derived:
        infos.append(f"Auto-fit max_model_len: full model context length {derived} fits in available GPU memory")
        return derived
    infos.append(
        f"Auto-fit max_model_len: reduced from {derived} to {fit_len} to fit in available "
        f"GPU memory ({format_gib(available)} GiB available for KV cache)"
    )
    return fit_len


def _check_one_sequence_fits(o: ServeOptions, max_model_len: int, per_block_all_layers: int, fit_blocks: int,
                             available: int) -> int:
    """The KV cache must hold one request of ``max_model_len`` tokens; returns its blocks."""
    blocks_per_seq = math.ceil(max_model_len / o.block_size)
    needed = per_block_all_layers * blocks_per_seq
    if needed > available:
        est = min(max_model_len, fit_blocks * o.block_size)
        est_msg = f"Based on the available memory, the estimated maximum model length is {est}. " if est > 0 else ""
        raise SimStartupError(
            "engine", "ValueError",
            f"To serve at least one request with the model's max seq len ({max_model_len}), "
            f"({format_gib(needed)} GiB KV cache is needed, which is larger than the available KV cache "
            f"memory ({format_gib(available)} GiB). {est_msg}Try increasing `gpu_memory_utilization` or "
            f"decreasing `max_model_len` when initializing the engine. See {DOCS_MEMORY} for more details.",
        )
    return blocks_per_seq
