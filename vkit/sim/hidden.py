"""Effects the twin's step-cost model does not express: a world to measure the twin against
(``sim_server --sim-hidden-effects SEED``; ``bench/bench_capacity_tune.py --world hidden``).

A twin (:mod:`vkit.tune.twin`) fitted to a simulator that runs the twin's own cost model could fit
it exactly by construction. This wraps the world's cost model (:class:`~vkit.sim.steptime.CostModel`
or :class:`~vkit.sim.calibrated.PhysCost`) with four mechanisms of vLLM's that
:class:`~vkit.sim.calibrated.CostParams` has no parameter for, or only a linear stand-in for;
their sizes are drawn from a seed, so each world is different and none is the twin's:

- **CUDA-graph batch padding.** vLLM V1 captures graphs at the batch sizes ``[1, 2, 4]``, the
  multiples of 8 below 256 and the multiples of 16 from 256 up to ``min(2 x max_num_seqs, 512)``
  (``set_cudagraph_sizes`` in vLLM's config), and a step of T tokens up to the largest runs the
  graph of the next captured size: its GEMMs compute the padded rows. A step past the largest runs
  eager and pays the kernel launches a graph hides (``eager_launch_s``, 1-3 ms a step: some 300
  launches of a 32-layer model at 3-10 µs).
- **Per-sequence CPU time** not hidden behind the accelerator: the scheduler's per-request work
  (``vllm/v1/core/sched/scheduler.py``: block tables, the request's output), input preparation and
  the sampler's per-row work (``cpu_per_seq_s``, 10-40 µs a scheduled request).
- **Detokenization** of every sampled token in the output processor (``vllm/v1/engine/detokenizer.py``,
  incremental), sharing the front end's CPU with the engine loop (``detok_per_token_s``, 2-10 µs).
- **Attention beyond the roofline.** Paged decode attention reads a sequence's KV blocks with more
  gathers and a split-KV reduction as its context grows; its achieved bandwidth falls. The KV read
  costs ``attn_ctx_c x log2(1 + context / 1024)`` times its roofline time on top (``attn_ctx_c``
  0.1-0.6; the context: the step's KV tokens per scheduled request).

The twin's per-request overhead can stand in for the two CPU terms; nothing it has follows the
padding's steps, the eager cliff or the attention's growth with context.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import asdict, dataclass

from vkit.sim.profiles import GpuProfile, ModelProfile
from vkit.sim.steptime import DEFAULT_MBU

CONTEXT_REF = 1024.0  # tokens of context at which the attention's extra cost is attn_ctx_c x its roofline time


@dataclass(frozen=True)
class HiddenEffects:
    seed: int
    eager_launch_s: float
    cpu_per_seq_s: float
    detok_per_token_s: float
    attn_ctx_c: float

    @classmethod
    def draw(cls, seed: int) -> HiddenEffects:
        """The effects' sizes for ``seed``, each uniform over its range (see the module's docstring)."""
        r = random.Random(f"hidden:{seed}")
        return cls(seed, eager_launch_s=r.uniform(1e-3, 3e-3), cpu_per_seq_s=r.uniform(10e-6, 40e-6),
                   detok_per_token_s=r.uniform(2e-6, 10e-6), attn_ctx_c=r.uniform(0.1, 0.6))

    def as_dict(self) -> dict:
        return asdict(self)


def capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM V1's default CUDA-graph capture sizes for ``max_num_seqs``."""
    top = min(2 * max_num_seqs, 512)
    sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, top + 1, 16))
    return [s for s in sizes if s <= top]


class HiddenCost:
    """``inner``'s step time with the hidden effects added (same ``step_time`` signature)."""

    def __init__(self, inner, effects: HiddenEffects, max_num_seqs: int, model: ModelProfile, gpu: GpuProfile,
                 tp: int = 1, kv_dtype_bytes: int | None = None):
        self.inner = inner
        self.effects = effects
        self.sizes = capture_sizes(max_num_seqs)
        self.kv_read_s = model.kv_bytes_per_token(tp, kv_dtype_bytes) / (gpu.hbm_bytes_per_s * tp * DEFAULT_MBU)

    def step_time(self, tokens: int, pairs: int, kv_tokens: int, sampled: int, nreqs: int) -> float:
        if tokens <= 0:
            return 0.0
        e = self.effects
        if self.sizes and tokens <= self.sizes[-1]:
            rows, eager = self.sizes[bisect.bisect_left(self.sizes, tokens)], 0.0
        else:
            rows, eager = tokens, e.eager_launch_s
        # a padded decode-only step is still one (each row one token): the inner model's decode overhead
        t = self.inner.step_time(rows, pairs, kv_tokens, sampled, rows if tokens == nreqs else nreqs)
        context = kv_tokens / max(nreqs, 1)
        attn = self.kv_read_s * kv_tokens * e.attn_ctx_c * math.log2(1.0 + context / CONTEXT_REF)
        return t + eager + attn + e.cpu_per_seq_s * nreqs + e.detok_per_token_s * sampled


def with_hidden(cost, seed: int, resolved, model: ModelProfile, gpu: GpuProfile) -> HiddenCost:
    """``cost`` with the hidden effects of ``seed`` on top, for an engine of ``resolved``
    (:class:`vkit.sim.config.Resolved`: its max_num_seqs, tensor parallelism, KV dtype)."""
    return HiddenCost(cost, HiddenEffects.draw(seed), resolved.max_num_seqs, model, gpu, resolved.tensor_parallel_size,
                      resolved.kv_dtype_bytes)
