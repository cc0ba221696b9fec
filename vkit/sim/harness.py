"""Drive the simulated engine in pure virtual time: no sockets, no sleeping, deterministic.

``simulate`` replays a list of requests against an :class:`~vkit.sim.engine.Engine` with an
optional client concurrency limit (like ``vllm bench serve --max-concurrency`` with
``--request-rate inf``) and returns per-request timings and the usual summary figures.
Used by the tests (the knee, the pathology, chunking effects) and for quick what-ifs.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from vkit.sim.config import ServeOptions, resolve
from vkit.sim.engine import CostModel, Engine, EngineConfig, Noise, Request
from vkit.sim.profiles import get_gpu, get_model


@dataclass
class SimRequest:
    prompt_ids: list[int]
    max_tokens: int
    arrival: float = 0.0
    ignore_eos: bool = True
    priority: int = 0


@dataclass
class Timing:
    arrival: float
    first_sched: float | None = None
    token_times: list[float] = field(default_factory=list)
    prompt_len: int = 0
    finish_reason: str | None = None


def percentile(vals: list[float], q: float) -> float:
    if not vals:
        return 0.0
    s = sorted(vals)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def engine_for(model: str = "llama-3.1-8b", gpu: str = "H200", noise: Noise | None = None,
               pathology: bool = False, **serve_flags) -> Engine:
    """An engine configured exactly as ``sim_server`` would configure it for these flags."""
    opts = ServeOptions(model="sim", gpu=get_gpu(gpu), model_profile=get_model(model), **serve_flags)
    r = resolve(opts)
    cfg = EngineConfig(
        max_model_len=r.max_model_len, max_num_seqs=r.max_num_seqs, max_num_batched_tokens=r.max_num_batched_tokens,
        num_gpu_blocks=r.num_gpu_blocks, block_size=r.block_size, enable_chunked_prefill=r.enable_chunked_prefill,
        enable_prefix_caching=r.enable_prefix_caching, policy=r.scheduling_policy,
        long_prefill_token_threshold=r.long_prefill_token_threshold, short_prefill_pathology=pathology,
    )
    cost = CostModel(opts.model_profile, opts.gpu, r.tensor_parallel_size, r.kv_dtype_bytes)
    return Engine(cfg, cost, lambda req: 1000 + (req.num_output % 97), 2, noise)


def random_prompts(n: int, length: int, seed: int = 0, vocab: int = 32000) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256, vocab) for _ in range(length)] for _ in range(n)]


def simulate(engine: Engine, requests: list[SimRequest], concurrency: int | None = None,
             max_steps: int = 10_000_000) -> dict:
    """Run every request to completion; return summary figures (seconds of virtual time)."""
    pending = deque(sorted(requests, key=lambda r: r.arrival))
    timings: dict[int, Timing] = {}
    inflight = 0
    t = 0.0
    steps = 0
    preempt = 0
    step_tokens: list[int] = []
    limit = concurrency if concurrency else 1 << 60
    rid = 0
    while pending or engine.has_work():
        while pending and inflight < limit and pending[0].arrival <= t:
            sr = pending.popleft()
            rid += 1
            arr = max(sr.arrival, t) if concurrency else sr.arrival
            req = Request(str(rid), sr.prompt_ids, sr.max_tokens, ignore_eos=sr.ignore_eos,
                          priority=sr.priority, arrival=arr)
            tm = Timing(arrival=arr, prompt_len=len(sr.prompt_ids))
            req.user = tm
            timings[rid] = tm
            engine.add_request(req)
            inflight += 1
        if not engine.has_work():
            if pending:
                t = max(t, pending[0].arrival)
                continue
            break
        res = engine.step(t)
        steps += 1
        if steps > max_steps:
            raise RuntimeError("simulation did not finish")
        if not res.scheduled:
            if pending:
                t = max(t, pending[0].arrival)
                continue
            raise RuntimeError("engine cannot schedule any waiting request (KV cache too small?)")
        for r in res.new_scheduled:
            r.user.first_sched = t
        t += res.duration
        preempt += res.num_preempted
        step_tokens.append(res.num_tokens)
        for r in res.token_reqs:
            r.user.token_times.append(t)
        for r in res.finished:
            r.user.finish_reason = r.finish_reason
            inflight -= 1
    done = list(timings.values())
    ttft = [tm.token_times[0] - tm.arrival for tm in done if tm.token_times]
    itl = [b - a for tm in done for a, b in zip(tm.token_times, tm.token_times[1:], strict=False)]
    tpot = [(tm.token_times[-1] - tm.token_times[0]) / (len(tm.token_times) - 1) for tm in done if len(tm.token_times) > 1]
    e2e = [tm.token_times[-1] - tm.arrival for tm in done if tm.token_times]
    queue = [tm.first_sched - tm.arrival for tm in done if tm.first_sched is not None]
    out_tokens = sum(len(tm.token_times) for tm in done)
    in_tokens = sum(tm.prompt_len for tm in done)
    start = min((tm.arrival for tm in done), default=0.0)
    duration = t - start
    return {
        "requests": len(done),
        "duration_s": duration,
        "steps": steps,
        "preemptions": preempt,
        "output_tok_s": out_tokens / duration if duration > 0 else 0.0,
        "total_tok_s": (out_tokens + in_tokens) / duration if duration > 0 else 0.0,
        "ttft_p50_s": percentile(ttft, 50), "ttft_p95_s": percentile(ttft, 95), "ttft_p99_s": percentile(ttft, 99),
        "itl_p50_s": percentile(itl, 50), "itl_p95_s": percentile(itl, 95),
        "tpot_mean_s": sum(tpot) / len(tpot) if tpot else 0.0,
        "e2e_p50_s": percentile(e2e, 50), "e2e_p95_s": percentile(e2e, 95),
        "queue_p95_s": percentile(queue, 95),
        "mean_step_tokens": sum(step_tokens) / len(step_tokens) if step_tokens else 0.0,
        "timings": done,
    }
