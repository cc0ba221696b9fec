"""The gauge: how one measurement is made (``BenchOptions``, bench_stream's options as data)
and one measurement written to files (``measure``), for bench_stream and the trial runner alike.

``BenchOptions.flags()`` writes the options as the bench_stream command line that makes the
same measurement: it is recorded in the summary and names the workload in the state file.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from dataclasses import dataclass, field
from typing import Callable

from vkit.errors import UsageError
from vkit.interrupts import Interrupts
from vkit.measure.datasets import (
    arrival_times,
    file_sha256,
    jsonl_requests,
    length_distribution,
    mixed_requests,
    random_requests,
    trace_requests,
)
from vkit.measure.loadgen import BenchConfig, Outcome, run_bench
from vkit.state import atomic_write_text

TOOL = "bench_stream"


@dataclass(frozen=True)
class BenchOptions:
    """bench_stream's options: the request set, the load and the client's limits."""

    model: str | None = None
    endpoint: str = "completions"
    no_stream: bool = False
    dataset_name: str = "random"
    dataset_path: str | None = None
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    shared_prefix_len: int = 0
    mixed_long_len: int | None = None
    mixed_long_fraction: float = 0.2
    vocab_size: int = 1000
    num_prompts: int = 1000
    seed: int = 0
    max_concurrency: int | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0
    exact_rate: bool = False
    duration: float | None = None
    num_warmups: int = 0
    stall_timeout: float = 60.0
    drain_timeout: float = 60.0
    transport: str = "auto"
    scrape_interval: float = 1.0
    goodput: dict | None = field(default=None, hash=False)
    api_key_env: str | None = None
    trace_speedup: float = 1.0  # dataset "trace": the recorded arrival offsets divided by this

    def flags(self) -> list[str]:
        """The bench_stream flags that make this measurement (the seed apart): the request set
        and load first, in a fixed order, then whatever differs from bench_stream's defaults."""
        d = BenchOptions()
        out = ["--dataset-name", self.dataset_name, "--random-input-len", str(self.random_input_len)]
        if self.dataset_name == "mixed" and self.mixed_long_len is not None:
            out += ["--mixed-long-len", str(self.mixed_long_len)]
        if self.model is not None:
            out += ["--model", self.model]
        out += ["--random-output-len", str(self.random_output_len), "--num-prompts", str(self.num_prompts)]
        if self.max_concurrency is not None:
            out += ["--max-concurrency", str(self.max_concurrency)]
        out += ["--vocab-size", str(self.vocab_size), "--stall-timeout", f"{self.stall_timeout:g}"]
        optional = [
            ("--endpoint", self.endpoint, d.endpoint, str),
            ("--dataset-path", self.dataset_path, d.dataset_path, str),
            ("--random-range-ratio", self.random_range_ratio, d.random_range_ratio, lambda v: f"{v:g}"),
            ("--shared-prefix-len", self.shared_prefix_len, d.shared_prefix_len, str),
            ("--mixed-long-fraction", self.mixed_long_fraction, d.mixed_long_fraction, lambda v: f"{v:g}"),
            ("--request-rate", self.request_rate, d.request_rate, lambda v: f"{v:g}"),
            ("--burstiness", self.burstiness, d.burstiness, lambda v: f"{v:g}"),
            ("--duration", self.duration, d.duration, lambda v: f"{v:g}"),
            ("--num-warmups", self.num_warmups, d.num_warmups, str),
            ("--drain-timeout", self.drain_timeout, d.drain_timeout, lambda v: f"{v:g}"),
            ("--transport", self.transport, d.transport, str),
            ("--scrape-interval", self.scrape_interval, d.scrape_interval, lambda v: f"{v:g}"),
            ("--api-key-env", self.api_key_env, d.api_key_env, str),
            ("--trace-speedup", self.trace_speedup, d.trace_speedup, lambda v: f"{v:g}"),
        ]
        for flag, value, default, fmt in optional:
            if value != default:
                out += [flag, fmt(value)]
        if self.no_stream:
            out.append("--no-stream")
        if self.exact_rate:
            out.append("--exact-rate")
        if self.goodput:
            out += ["--goodput", *(f"{k}:{v:g}" for k, v in self.goodput.items())]
        return out


def check(o: BenchOptions) -> None:
    """Refuse options no run can have."""
    if o.burstiness <= 0:
        raise UsageError("--burstiness must be > 0")
    if o.duration is not None and o.duration <= 0:
        raise UsageError("--duration must be > 0")


def build_config(o: BenchOptions, url: str, command: list[str], api_key: str | None = None) -> BenchConfig:
    """The request set, arrivals and client settings of one run; ``command`` is recorded in the summary.
    Without ``api_key``, the key is read from ``o.api_key_env`` here, at the last moment: only the
    variable's name is ever part of the options, the command or a record."""
    if api_key is None and o.api_key_env:
        api_key = os.environ.get(o.api_key_env) or None
    chat = o.endpoint == "chat"
    n = o.num_prompts
    w = o.num_warmups
    if o.dataset_name == "random":
        reqs = random_requests(n + w, o.random_input_len, o.random_output_len, o.random_range_ratio, o.seed,
                               o.shared_prefix_len, o.vocab_size, text=chat)
    elif o.dataset_name == "mixed":
        long_len = o.mixed_long_len or 8 * o.random_input_len
        reqs = mixed_requests(n + w, o.random_input_len, long_len, o.mixed_long_fraction, o.random_output_len,
                              o.seed, o.vocab_size, text=chat)
    elif o.dataset_name == "trace":
        if not o.dataset_path:
            raise UsageError("--dataset-name trace needs --dataset-path FILE (rows with a 'timestamp')")
        if w or o.duration is not None or not math.isinf(o.request_rate) or o.max_concurrency is not None:
            raise UsageError("a trace sets its own arrivals: leave out --num-warmups, --duration, --request-rate and "
                             "--max-concurrency (--trace-speedup scales it)")
        reqs, offsets = trace_requests(o.dataset_path, n, o.random_output_len, chat, o.trace_speedup)
        n = len(reqs)
    else:
        if not o.dataset_path:
            raise UsageError("--dataset-name jsonl needs --dataset-path FILE")
        reqs = jsonl_requests(o.dataset_path, n + w, o.random_output_len, chat, o.seed)
    warm, meas = reqs[:w], reqs[w:]
    for i, r in enumerate(meas):
        r.index = i
    rate = o.request_rate
    if o.dataset_name == "trace":
        arrivals = offsets
        rate = (n - 1) / offsets[-1] if n > 1 and offsets[-1] > 0 else math.inf  # the trace's own mean rate
    else:
        arrivals = None if math.isinf(o.request_rate) else arrival_times(
            n if o.duration is None else max(n, int(o.request_rate * o.duration) + 1), o.request_rate, o.burstiness, o.seed,
            exact=o.exact_rate)
    dataset = {
        "name": o.dataset_name,
        "path": o.dataset_path,
        "random_input_len": o.random_input_len,
        "random_output_len": o.random_output_len,
        "random_range_ratio": o.random_range_ratio,
        "shared_prefix_len": o.shared_prefix_len,
        "vocab_size": o.vocab_size,
        "mixed_long_len": o.mixed_long_len if o.dataset_name == "mixed" else None,
        "mixed_long_fraction": o.mixed_long_fraction if o.dataset_name == "mixed" else None,
        "num_prompts": n,
        "duration_s": o.duration,  # a timed run: the requests sent vary, the duration is the gauge
    }
    if o.dataset_name == "trace":
        dataset["trace_speedup"] = o.trace_speedup
        dataset["priorities"] = sorted({r.extra["priority"] for r in meas if "priority" in r.extra}) or None
    if o.dataset_path and o.dataset_name in ("jsonl", "trace"):
        dataset["sha256"] = file_sha256(o.dataset_path)  # the file's content is the gauge, not its name
    return BenchConfig(
        url=url,
        model=o.model,
        endpoint=o.endpoint,
        requests=meas,
        warmups=warm,
        max_concurrency=o.max_concurrency,
        request_rate=rate,
        burstiness=o.burstiness,
        arrivals=arrivals,
        duration_s=o.duration,
        stream=not o.no_stream,
        goodput_slo_ms=o.goodput,
        api_key=api_key,
        stall_timeout_s=o.stall_timeout,
        scrape_interval_s=o.scrape_interval,
        transport=o.transport,
        drain_timeout_s=o.drain_timeout,
        meta={"dataset": dataset, "lengths": length_distribution(meas), "seed": o.seed, **({"exact_rate": True} if o.exact_rate else {}), "command": [TOOL] + list(command), "command_line": shlex.join([TOOL] + list(command))},
    )


def measure(cfg: BenchConfig, records: str | None = None, output: str | None = None, label: str | None = None,
            progress: Callable[[dict], None] | None = None, interrupts: Interrupts | None = None,
            on_interrupt: Callable[[], None] | None = None) -> Outcome:
    """One run: the first interrupt stops sending and drains the in-flight requests (``partial``),
    the next stops waiting. The records (JSON Lines) and the summary go to their files when given."""
    cfg.meta["label"] = label
    with (interrupts or Interrupts()).deferred(on_first=on_interrupt, again_raises=True) as d:
        out = run_bench(cfg, progress=progress, stop=d.event)
    save(out.summary, out.records, records, output, label)
    return out


def save(summary: dict, records: list[dict], records_path: str | None, output: str | None, label: str | None = None) -> None:
    """A run's records (JSON Lines) and summary written to their files (each atomically), as
    bench_stream writes them; the summary names its records file."""
    summary["label"] = label
    if records_path:
        summary["vkit"]["records"] = os.path.abspath(records_path)
        text = "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in records)
        atomic_write_text(records_path, text)
    if output:
        atomic_write_text(output, json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
