"""The simulated engine: vLLM V1's scheduler and KV-block manager in virtual time, with a
roofline step-time model. No I/O, no clocks: callers pass the time in.

``Engine.step(now)`` does what one iteration of vLLM's EngineCore does
(``vllm/v1/core/sched/scheduler.py``):

1. RUNNING requests first, in order (decodes and partial prefills): each takes
   ``min(remaining, long_prefill_token_threshold, budget left)`` tokens; if KV blocks run
   out, the lowest-priority running request is preempted by recompute (FCFS: the most
   recently admitted; priority: the largest ``(priority, arrival)``), its blocks freed,
   computed tokens reset, and it goes back to the front of the waiting queue.
2. WAITING requests next, only if nothing was preempted this step and fewer than
   ``max_num_seqs`` run: prefix-cache lookup on full blocks (the last prompt token is
   always recomputed); with chunked prefill off a prompt larger than the budget left stops
   admission; with it on, the prompt is chunked. Admission requires free blocks for the
   whole prompt (the ``full_sequence_must_fit`` gate) and allocates those for the chunk.
3. The step's duration comes from :class:`CostModel`; then every request whose computed
   tokens reached its length samples one token, stop conditions are checked (EOS unless
   ``ignore_eos``, not before ``min_tokens``; ``max_tokens``; ``max_model_len``) and
   finished requests free their blocks (tail first, so tails are evicted first).

The prefix cache hashes full blocks as a chain ``hash((parent_hash, block_token_ids))``;
free cached blocks stay reusable until evicted in LRU order.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from vkit.sim.steptime import (  # noqa: F401 - the step-time names are importable from here too
    DEFAULT_MBU,
    DEFAULT_MFU,
    GEMM_M_HALF,
    PER_REQ_OVERHEAD_S,
    STEP_OVERHEAD_S,
    CostModel,
    Noise,
)

if TYPE_CHECKING:
    from vkit.sim.power import PowerMeter

WAITING, RUNNING, PREEMPTED, FINISHED = 0, 1, 2, 3

_NONE_HASH = hash(("vkit-sim-none-hash",))


@dataclass
class EngineConfig:
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    num_gpu_blocks: int  # includes vLLM's reserved null block
    block_size: int = 16
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    policy: str = "fcfs"
    long_prefill_token_threshold: int = 0
    short_prefill_pathology: bool = False
    short_prefill_max_tokens: int = 512  # prompts up to this length count as "short"
    short_prefill_slowdown: float = 10.0


class Request:
    """One generation request as the scheduler sees it. ``user`` is the caller's slot."""

    __slots__ = (
        "req_id", "token_ids", "prompt_len", "max_tokens", "min_tokens", "ignore_eos", "eos_pos",
        "priority", "arrival", "seq", "text_seed", "num_computed", "num_output", "blocks",
        "block_hashes", "num_cached_blocks", "status", "num_preemptions", "num_cached_tokens",
        "scheduled_once", "finish_reason", "user",
    )

    def __init__(self, req_id: str, prompt_ids: list[int], max_tokens: int, *, min_tokens: int = 0,
                 ignore_eos: bool = True, natural_len: int = 0, priority: int = 0, arrival: float = 0.0,
                 text_seed: int = 0, user: Any = None):
        self.req_id = req_id
        self.token_ids = list(prompt_ids)
        self.prompt_len = len(prompt_ids)
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.ignore_eos = ignore_eos
        # 1-based output position of the EOS token (0 = never): the "model's" natural length.
        self.eos_pos = 0 if ignore_eos or natural_len <= 0 else max(natural_len, min_tokens)
        self.priority = priority
        self.arrival = arrival
        self.seq = 0
        self.text_seed = text_seed
        self.num_computed = 0
        self.num_output = 0
        self.blocks: list[int] = []
        self.block_hashes: list[int] = []
        self.num_cached_blocks = 0
        self.status = WAITING
        self.num_preemptions = 0
        self.num_cached_tokens = -1
        self.scheduled_once = False
        self.finish_reason: str | None = None
        self.user = user

    def __lt__(self, other: "Request") -> bool:  # heap tie-break, as vLLM's Request.__lt__
        return (self.priority, self.arrival, self.seq) < (other.priority, other.arrival, other.seq)

    def __repr__(self) -> str:
        return f"Request({self.req_id!r}, prompt={self.prompt_len}, out={self.num_output}, computed={self.num_computed})"


class BlockPool:
    """KV blocks: ref counts, an LRU free queue (cached blocks stay reusable) and the
    hash -> block map of the prefix cache. Block 0 is vLLM's null block, never handed out.

    The free queue is vLLM's: every block in index order at the start, a freed block at its end,
    taken from its front. The blocks never handed out yet are its head, in index order, so they are
    kept as a count (``fresh``: the next one) rather than one entry each; ``free`` holds the blocks
    freed since, in the order they were freed (a pool of 50,000 blocks is built in no time)."""

    def __init__(self, num_blocks: int, enable_caching: bool):
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref = [0] * num_blocks
        self.hash: list[int | None] = [None] * num_blocks
        self.fresh = min(1, num_blocks)  # blocks fresh .. num_blocks - 1 were never handed out: the free queue's head
        self.free: OrderedDict[int, None] = OrderedDict()
        self.cached: dict[int, int] = {}

    def num_free(self) -> int:
        return self.num_blocks - self.fresh + len(self.free)

    def usage(self) -> float:
        total = self.num_blocks - 1
        return 0.0 if total <= 0 else 1.0 - self.num_free() / total

    def take(self, n: int) -> list[int]:
        k = min(n, self.num_blocks - self.fresh)
        out = list(range(self.fresh, self.fresh + k))  # never handed out: no hash, no reference yet
        self.fresh += k
        free, hashes, cached, ref = self.free, self.hash, self.cached, self.ref
        for b in out:
            ref[b] = 1
        for _ in range(n - k):
            b, _ = free.popitem(last=False)
            h = hashes[b]
            if h is not None:
                if cached.get(h) == b:
                    del cached[h]
                hashes[b] = None
            ref[b] = 1
            out.append(b)
        return out

    def touch(self, blocks: list[int]) -> None:
        ref, free = self.ref, self.free
        for b in blocks:
            if ref[b] == 0:
                del free[b]
            ref[b] += 1

    def release(self, blocks_in_eviction_order) -> None:
        ref, free = self.ref, self.free
        for b in blocks_in_eviction_order:
            ref[b] -= 1
            if ref[b] == 0:
                free[b] = None

    def cache(self, block: int, h: int) -> None:
        if self.hash[block] is None:
            self.hash[block] = h
            self.cached.setdefault(h, block)

    def reset_prefix_cache(self) -> bool:
        if self.num_free() != self.num_blocks - 1:
            return False
        self.cached.clear()
        self.hash = [None] * self.num_blocks
        return True


class _FcfsQueue:
    def __init__(self):
        self.q: deque[Request] = deque()

    def __len__(self):
        return len(self.q)

    def add(self, r: Request) -> None:
        self.q.append(r)

    def prepend(self, r: Request) -> None:
        self.q.appendleft(r)

    def peek(self) -> Request:
        return self.q[0]

    def pop(self) -> Request:
        return self.q.popleft()

    def remove(self, r: Request) -> bool:
        try:
            self.q.remove(r)
            return True
        except ValueError:
            return False

    def __iter__(self):
        return iter(self.q)


class _PriorityQueue:
    """vLLM's PriorityRequestQueue: a heap on (priority, arrival); preempted requests re-enter by key."""

    def __init__(self):
        self.h: list[Request] = []

    def __len__(self):
        return len(self.h)

    def add(self, r: Request) -> None:
        heapq.heappush(self.h, r)

    prepend = add

    def peek(self) -> Request:
        return self.h[0]

    def pop(self) -> Request:
        return heapq.heappop(self.h)

    def remove(self, r: Request) -> bool:
        try:
            self.h.remove(r)
        except ValueError:
            return False
        heapq.heapify(self.h)
        return True

    def __iter__(self):
        return iter(sorted(self.h))


class StepResult:
    __slots__ = (
        "start", "duration", "num_tokens", "scheduled", "token_reqs", "finished", "new_scheduled",
        "num_preempted", "prefix_queries", "prefix_hits", "prompt_tokens", "generation_tokens",
    )

    def __init__(self):
        self.start = 0.0
        self.duration = 0.0
        self.num_tokens = 0
        self.scheduled: dict[Request, int] = {}
        self.token_reqs: list[Request] = []
        self.finished: list[Request] = []
        self.new_scheduled: list[Request] = []
        self.num_preempted = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_tokens = 0  # prompt lengths of requests that got their first token (vLLM's counting)
        self.generation_tokens = 0


class Engine:
    """The scheduler + KV manager + step-time model. Drive it with ``add_request``/``step``."""

    def __init__(self, cfg: EngineConfig, cost: CostModel, next_token: Callable[[Request], int],
                 eos_token_id: int = 2, noise: Noise | None = None):
        self.cfg = cfg
        self.cost = cost
        self.next_token = next_token
        self.eos = eos_token_id
        self.noise = noise
        self.pool = BlockPool(cfg.num_gpu_blocks, cfg.enable_prefix_caching)
        self.running: list[Request] = []
        self.waiting = _PriorityQueue() if cfg.policy == "priority" else _FcfsQueue()
        self._seq = 0
        self.total_preemptions = 0
        self.total_steps = 0
        self.meter: PowerMeter | None = None  # board power of each step (vkit.sim.power), where one is attached

    # -- requests -------------------------------------------------------------------------
    def add_request(self, r: Request) -> None:
        self._seq += 1
        r.seq = self._seq
        r.status = WAITING
        self.waiting.add(r)

    def abort(self, r: Request) -> bool:
        """Remove a request wherever it is and free its blocks; False if already finished."""
        if r.status == FINISHED:
            return False
        if r.status == RUNNING:
            try:
                self.running.remove(r)
            except ValueError:
                pass
        else:
            self.waiting.remove(r)
        self._free(r)
        r.status = FINISHED
        r.finish_reason = "abort"
        return True

    def has_work(self) -> bool:
        return bool(self.running) or len(self.waiting) > 0

    def num_running(self) -> int:
        return len(self.running)

    def num_waiting(self) -> int:
        return len(self.waiting)

    def kv_usage(self) -> float:
        return self.pool.usage()

    # -- KV management --------------------------------------------------------------------
    def _hashes_upto(self, r: Request, nblocks: int) -> list[int]:
        bh = r.block_hashes
        bs = self.cfg.block_size
        toks = r.token_ids
        while len(bh) < nblocks:
            i = len(bh)
            parent = bh[-1] if i else _NONE_HASH
            bh.append(hash((parent, tuple(toks[i * bs:(i + 1) * bs]))))
        return bh

    def _computed_blocks(self, r: Request) -> list[int]:
        if not self.cfg.enable_prefix_caching:
            return []
        max_hit_blocks = (len(r.token_ids) - 1) // self.cfg.block_size
        if max_hit_blocks <= 0:
            return []
        hashes = self._hashes_upto(r, max_hit_blocks)
        cached = self.pool.cached
        hit = []
        for i in range(max_hit_blocks):
            b = cached.get(hashes[i])
            if b is None:
                break
            hit.append(b)
        return hit

    def _allocate(self, r: Request, n: int, hit: list[int] | None = None, admission: bool = False) -> bool:
        cfg = self.cfg
        bs = cfg.block_size
        pool = self.pool
        n_hit = len(hit) * bs if hit else 0
        comp = r.num_computed + n_hit
        need_tokens = comp + n
        if need_tokens > cfg.max_model_len:
            need_tokens = cfg.max_model_len
        have = len(r.blocks) + (len(hit) if hit else 0)
        new = -(-need_tokens // bs) - have
        if new < 0:
            new = 0
        evictable = 0
        if hit:
            ref = pool.ref
            for b in hit:
                if ref[b] == 0:
                    evictable += 1
        free = pool.num_free()
        if new + evictable > free:
            return False
        if admission:
            full = -(-min(len(r.token_ids), cfg.max_model_len) // bs) - have
            if full + evictable > free:
                return False
        if hit:
            pool.touch(hit)
            r.blocks.extend(hit)
            r.num_cached_blocks = len(r.blocks)
        if new:
            r.blocks.extend(pool.take(new))
        if cfg.enable_prefix_caching:
            upto = comp + n
            if upto > len(r.token_ids):
                upto = len(r.token_ids)
            nfull = upto // bs
            if nfull > r.num_cached_blocks:
                hashes = self._hashes_upto(r, nfull)
                blocks = r.blocks
                for i in range(r.num_cached_blocks, nfull):
                    pool.cache(blocks[i], hashes[i])
                r.num_cached_blocks = nfull
        return True

    def _free(self, r: Request) -> None:
        if r.blocks:
            self.pool.release(reversed(r.blocks))
            r.blocks = []
        r.num_cached_blocks = 0

    def _preempt(self, r: Request) -> None:
        self._free(r)
        r.status = PREEMPTED
        r.num_computed = 0
        r.num_preemptions += 1
        self.waiting.prepend(r)

    def reset_prefix_cache(self) -> bool:
        return self.pool.reset_prefix_cache()

    # -- one iteration --------------------------------------------------------------------
    def step(self, now: float) -> StepResult:
        """One EngineCore iteration at virtual time ``now`` (steps 1-4 of the module docstring)."""
        res = StepResult()
        res.start = now
        budget = self._schedule_running(res)
        preempted = res.num_preempted
        if not preempted:
            self._schedule_waiting(res, budget)
        self.total_preemptions += preempted
        if not res.scheduled:
            return res
        self._cost_batch(res, now)
        self._sample(res)
        return res

    def _schedule_running(self, res: StepResult) -> int:
        """1. RUNNING requests, in order, preempting when KV blocks run out; returns the budget left."""
        cfg = self.cfg
        budget = cfg.max_num_batched_tokens
        thr = cfg.long_prefill_token_threshold
        mml = cfg.max_model_len
        sched = res.scheduled
        running = self.running
        preempted = 0
        priority = cfg.policy == "priority"
        bs = cfg.block_size
        caching = cfg.enable_prefix_caching
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = len(r.token_ids) - r.num_computed
            if 0 < thr < n:
                n = thr
            if n > budget:
                n = budget
            lim = mml - 1 - r.num_computed
            if n > lim:
                n = lim
            if n <= 0:
                i += 1
                continue
            # Fast path (most decodes): the blocks held already cover the new tokens and no
            # block becomes full, so there is nothing to allocate or cache.
            upto = r.num_computed + n
            if upto <= len(r.blocks) * bs and (not caching or upto // bs <= r.num_cached_blocks):
                sched[r] = n
                budget -= n
                i += 1
                continue
            ok = True
            while not self._allocate(r, n):
                if priority:
                    victim = max(running, key=lambda x: (x.priority, x.arrival))
                    running.remove(victim)
                    if victim in sched:
                        budget += sched.pop(victim)
                        i -= 1
                else:
                    victim = running.pop()
                self._preempt(victim)
                preempted += 1
                if victim is r:
                    ok = False
                    break
            if not ok:
                break
            sched[r] = n
            budget -= n
            i += 1
        res.num_preempted = preempted
        return budget

    def _schedule_waiting(self, res: StepResult, budget: int) -> None:
        """2. WAITING requests while seats and budget last: prefix-cache hits, chunking, admission."""
        cfg = self.cfg
        thr = cfg.long_prefill_token_threshold
        sched = res.scheduled
        running = self.running
        waiting = self.waiting
        while len(waiting) and budget > 0:
            if len(running) >= cfg.max_num_seqs:
                break
            r = waiting.peek()
            hit = self._computed_blocks(r) if r.num_computed == 0 else []
            n_hit = len(hit) * cfg.block_size
            n = len(r.token_ids) - n_hit
            if 0 < thr < n:
                n = thr
            if not cfg.enable_chunked_prefill and n > budget:
                break
            if n > budget:
                n = budget
            if not self._allocate(r, n, hit, admission=True):
                break
            waiting.pop()
            running.append(r)
            r.status = RUNNING
            r.num_computed = n_hit
            if cfg.enable_prefix_caching and r.num_preemptions == 0:
                res.prefix_queries += len(r.token_ids)
                res.prefix_hits += n_hit
            if r.num_cached_tokens < 0:
                r.num_cached_tokens = n_hit
            if not r.scheduled_once:
                r.scheduled_once = True
                res.new_scheduled.append(r)
            sched[r] = n
            budget -= n

    def _cost_batch(self, res: StepResult, now: float) -> None:
        """3. The scheduled batch's duration: the cost model, the noise, the short-prefill pathology."""
        cfg = self.cfg
        sched = res.scheduled
        tokens = pairs = kv = sampled = 0
        s_tokens = s_pairs = s_kv = s_n = 0
        patho = cfg.short_prefill_pathology and not cfg.enable_chunked_prefill
        for r, n in sched.items():
            ctx = r.num_computed
            tokens += n
            p = n * ctx + n * (n + 1) // 2
            pairs += p
            kv += ctx + 2 * n
            if ctx + n >= len(r.token_ids):
                sampled += 1
            if patho and r.num_output == 0 and r.prompt_len <= cfg.short_prefill_max_tokens:
                s_tokens += n
                s_pairs += p
                s_kv += ctx + 2 * n
                s_n += 1
        cost = self.cost
        duration = cost.step_time(tokens, pairs, kv, sampled, len(sched))
        if self.noise is not None:
            duration *= self.noise.factor(now)
        if s_n:
            duration += (cfg.short_prefill_slowdown - 1.0) * cost.step_time(s_tokens, s_pairs, s_kv, s_n, s_n)
        res.duration = duration
        res.num_tokens = tokens
        if self.meter is not None:
            self.meter.step(tokens, pairs, kv, sampled, duration, now)
        if self.noise is not None:
            self.noise.note_end(now + duration)
        self.total_steps += 1

    def _sample(self, res: StepResult) -> None:
        """4. Advance computed tokens, sample one token per completed request, check stops, free the finished."""
        eos = self.eos
        mml = self.cfg.max_model_len
        next_token = self.next_token
        token_reqs = res.token_reqs
        finished = res.finished
        for r, n in res.scheduled.items():
            r.num_computed += n
            if r.num_computed < len(r.token_ids):
                continue  # partial prefill: nothing sampled
            if r.num_output == 0:
                res.prompt_tokens += r.prompt_len
            pos = r.num_output + 1
            tok = eos if pos == r.eos_pos else next_token(r)
            r.token_ids.append(tok)
            r.num_output = pos
            token_reqs.append(r)
            reason = None
            if tok == eos and not r.ignore_eos and pos >= r.min_tokens:
                reason = "stop"
            elif len(r.token_ids) >= mml or pos >= r.max_tokens:
                reason = "length"
            if reason is not None:
                r.finish_reason = reason
                r.status = FINISHED
                finished.append(r)
        res.generation_tokens = len(token_reqs)
        if finished:
            for r in finished:
                self._free(r)
            self.running = [r for r in self.running if r.status == RUNNING]
