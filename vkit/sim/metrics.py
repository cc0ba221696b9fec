"""vLLM V1's Prometheus metrics, computed from the simulated engine.

Names, HELP texts, bucket boundaries and label sets follow ``vllm/v1/metrics/loggers.py``;
the text rendering follows ``prometheus_client``'s exposition: counters typed under their
``_total`` name, a ``<name>_created`` gauge for every counter and histogram, labels sorted,
floats in Go's format. Timestamps passed in are seconds on whatever clock the caller uses
(the server passes observed wall time, the virtual-time harness passes virtual time).
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections import deque

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                           50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
ITERATION_TOKENS_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
N_BUCKETS = [1, 2, 5, 10, 20]
FINISH_REASONS = ("stop", "length", "abort", "error")


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    out: list[int] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_value:
                return out
            out.append(v)
        exponent += 1


def go_float(d: float) -> str:
    """``prometheus_client.utils.floatToGoString``."""
    d = float(d)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if d != d:
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


class Histogram:
    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds):
        self.bounds = [float(b) for b in bounds]
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.sum += v
        self.count += 1


class Metrics:
    """Counters, histograms and the log-line accumulators of one engine."""

    def __init__(self, max_model_len: int, created: float | None = None):
        self.created = time.time() if created is None else created
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.num_preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.success = {r: 0 for r in FINISH_REASONS}
        b125 = build_1_2_5_buckets(max_model_len)
        self.h_prompt = Histogram(b125)
        self.h_gen = Histogram(b125)
        self.h_iter = Histogram(ITERATION_TOKENS_BUCKETS)
        self.h_max_gen = Histogram(b125)
        self.h_n = Histogram(N_BUCKETS)
        self.h_max_tokens = Histogram(b125)
        self.h_ttft = Histogram(TTFT_BUCKETS)
        self.h_itl = Histogram(ITL_BUCKETS)
        self.h_tpot = Histogram(ITL_BUCKETS)
        self.h_e2e = Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_queue = Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_inference = Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_prefill = Histogram(REQUEST_LATENCY_BUCKETS)
        self.h_decode = Histogram(REQUEST_LATENCY_BUCKETS)
        # For the periodic log line.
        self.interval_prompt = 0
        self.interval_gen = 0
        self._recent: deque[tuple[int, int, int]] = deque()  # (requests, queries, hits) per step
        self._recent_sums = [0, 0, 0]

    # -- recording ------------------------------------------------------------------------
    def on_step(self, prompt_tokens: int, generation_tokens: int, preempted: int,
                prefix_requests: int, prefix_queries: int, prefix_hits: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.generation_tokens += generation_tokens
        self.interval_prompt += prompt_tokens
        self.interval_gen += generation_tokens
        self.num_preemptions += preempted
        if prefix_queries:
            self.prefix_queries += prefix_queries
            self.prefix_hits += prefix_hits
            self._observe_recent(prefix_requests, prefix_queries, prefix_hits)
        if prompt_tokens + generation_tokens:
            self.h_iter.observe(prompt_tokens + generation_tokens)

    def _observe_recent(self, requests: int, queries: int, hits: int, max_recent: int = 1000) -> None:
        """vLLM's PrefixCachingMetrics: hit rate over (about) the last 1000 requests."""
        self._recent.append((requests, queries, hits))
        s = self._recent_sums
        s[0] += requests
        s[1] += queries
        s[2] += hits
        while len(self._recent) > 1 and s[0] > max_recent:
            r, q, h = self._recent.popleft()
            s[0] -= r
            s[1] -= q
            s[2] -= h

    def prefix_hit_rate(self) -> float:
        q = self._recent_sums[1]
        return self._recent_sums[2] / q if q else 0.0

    def on_finish(self, reason: str, e2e: float, queue: float, prefill: float, decode: float,
                  inference: float, prompt_len: int, gen_len: int, max_tokens_param: int | None,
                  n_param: int = 1) -> None:
        self.success[reason] = self.success.get(reason, 0) + 1
        self.h_e2e.observe(e2e)
        self.h_queue.observe(queue)
        self.h_prefill.observe(prefill)
        self.h_decode.observe(decode)
        self.h_inference.observe(inference)
        self.h_prompt.observe(prompt_len)
        self.h_gen.observe(gen_len)
        self.h_max_gen.observe(gen_len)
        self.h_n.observe(n_param)
        if max_tokens_param:
            self.h_max_tokens.observe(max_tokens_param)
        self.h_tpot.observe(decode / (gen_len - 1) if gen_len > 1 else 0.0)

    def take_interval(self) -> tuple[int, int]:
        p, g = self.interval_prompt, self.interval_gen
        self.interval_prompt = self.interval_gen = 0
        return p, g

    # -- exposition -----------------------------------------------------------------------
    def render(self, model_name: str, running: int, waiting: int, kv_usage: float,
               cache_info: dict[str, str], engine: str = "0") -> str:
        out: list[str] = []
        mn = model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        lbl = f'engine="{engine}",model_name="{mn}"'
        created = go_float(self.created)

        def gauge(name: str, doc: str, value: float, labels: str = lbl) -> None:
            out.append(f"# HELP {name} {doc}\n# TYPE {name} gauge\n{name}{{{labels}}} {go_float(value)}\n")

        def counter(name: str, doc: str, values: list[tuple[str, float]]) -> None:
            out.append(f"# HELP {name}_total {doc}\n# TYPE {name}_total counter\n")
            for labels, v in values:
                out.append(f"{name}_total{{{labels}}} {go_float(v)}\n")
            out.append(f"# HELP {name}_created {doc}\n# TYPE {name}_created gauge\n")
            for labels, _ in values:
                out.append(f"{name}_created{{{labels}}} {created}\n")

        def histogram(name: str, doc: str, h: Histogram) -> None:
            out.append(f"# HELP {name} {doc}\n# TYPE {name} histogram\n")
            acc = 0
            for b, c in zip(h.bounds, h.counts, strict=False):
                acc += c
                out.append(f'{name}_bucket{{engine="{engine}",le="{go_float(b)}",model_name="{mn}"}} {go_float(acc)}\n')
            acc += h.counts[-1]
            out.append(f'{name}_bucket{{engine="{engine}",le="+Inf",model_name="{mn}"}} {go_float(acc)}\n')
            out.append(f"{name}_count{{{lbl}}} {go_float(h.count)}\n")
            out.append(f"{name}_sum{{{lbl}}} {go_float(h.sum)}\n")
            out.append(f"# HELP {name}_created {doc}\n# TYPE {name}_created gauge\n{name}_created{{{lbl}}} {created}\n")

        gauge("vllm:num_requests_running", "Number of requests in model execution batches.", running)
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting)
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv_usage)
        counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                [(lbl, self.prefix_queries)])
        counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                [(lbl, self.prefix_hits)])
        counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", [(lbl, self.num_preemptions)])
        counter("vllm:prompt_tokens", "Number of prefill tokens processed.", [(lbl, self.prompt_tokens)])
        counter("vllm:generation_tokens", "Number of generation tokens processed.", [(lbl, self.generation_tokens)])
        counter("vllm:request_success", "Count of successfully processed requests.",
                [(f'engine="{engine}",finished_reason="{r}",model_name="{mn}"', v) for r, v in self.success.items()])
        histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", self.h_prompt)
        histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", self.h_gen)
        histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", self.h_iter)
        histogram("vllm:request_max_num_generation_tokens",
                  "Histogram of maximum number of requested generation tokens.", self.h_max_gen)
        histogram("vllm:request_params_n", "Histogram of the n request parameter.", self.h_n)
        histogram("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", self.h_max_tokens)
        histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", self.h_ttft)
        histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", self.h_itl)
        histogram("vllm:request_time_per_output_token_seconds",
                  "Histogram of time_per_output_token_seconds per request.", self.h_tpot)
        histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", self.h_e2e)
        histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", self.h_queue)
        histogram("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.",
                  self.h_inference)
        histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.",
                  self.h_prefill)
        histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.",
                  self.h_decode)
        info_labels = ",".join(f'{k}="{v}"' for k, v in sorted({**cache_info, "engine": engine}.items()))
        gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", 1.0, info_labels)
        return "".join(out)
