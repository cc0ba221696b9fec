"""What one bench_stream run is asked to do (:class:`BenchConfig`): its own module, so that the
measurement loop (:mod:`vkit.measure.loadgen`) and the summary it writes
(:mod:`vkit.measure.runsummary`) both read it without importing each other."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from vkit.measure.datasets import Request


@dataclass
class BenchConfig:
    url: str
    requests: list[Request]
    model: str | None = None
    endpoint: str = "completions"  # or "chat"
    warmups: list[Request] = field(default_factory=list)
    max_concurrency: int | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0
    arrivals: np.ndarray | None = None  # send offsets (s); None = all at once
    duration_s: float | None = None
    stream: bool = True
    goodput_slo_ms: dict | None = None
    api_key: str | None = None
    transport: str = "auto"  # "loop" (one thread, selectors), "threads" (one per stream); auto = loop for http
    stall_timeout_s: float = 60.0
    scrape_interval_s: float = 1.0
    drain_timeout_s: float = 60.0
    meta: dict = field(default_factory=dict)  # dataset, seed, command line: copied into the summary
    idle_w: float | None = None  # the boards' idle power at the server's start (post_start_verify), for the energy checks
    launch_argv: list[str] | None = None  # how the server was launched (the state's), for the fingerprint; None: unknown
