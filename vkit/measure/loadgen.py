"""The measurement loop of bench_stream: closed loop (N in flight) or open loop
(Poisson / gamma arrivals), warm-ups, /metrics scraped before, during and after,
client CPU and scheduling lag, and a summary with ``vllm bench serve``'s keys plus
vkit's own fields under ``"vkit"`` (built by ``vkit.measure.runsummary.summarize``, which
this module re-exports).

The library never prints: progress goes to a callback, errors are raised as
``VkitError``. An interrupt stops sending, lets in-flight requests end (up to a drain
timeout), and still returns records and a summary marked ``partial``.
"""

from __future__ import annotations

import gc
import json
import math
import queue
import resource
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from vkit import __version__
from vkit.errors import Unavailable, UsageError
from vkit.measure.accel import Sampler
from vkit.measure.benchconfig import BenchConfig
from vkit.measure.client import Result, StreamClient, request_body
from vkit.measure.datasets import Request
from vkit.measure.energy import add_energy
from vkit.measure.fingerprint import fingerprint
from vkit.measure.loopclient import LoopClient
from vkit.measure.prom import Metrics
from vkit.measure.runsummary import summarize
from vkit.measure.serverapi import Server, cache_config, delta, families, gauges

MAX_THREADS = 1024



@dataclass
class Outcome:
    summary: dict
    records: list[dict]
    partial: bool


class _LagSampler:
    """How late a thread wakes from a 5 ms sleep: a saturated client (GIL, CPU) shows here."""

    def __init__(self, period: float = 0.005):
        self.period = period
        self.lags: list[float] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, name="lag-sampler", daemon=True)

    def start(self) -> None:
        self._t.start()

    def _loop(self) -> None:
        pc = time.perf_counter
        while not self._stop.is_set():
            t = pc()
            time.sleep(self.period)
            self.lags.append(pc() - t - self.period)

    def stop(self) -> dict | None:
        self._stop.set()
        self._t.join(timeout=2)
        if not self.lags:
            return None
        a = np.asarray(self.lags) * 1000
        return {"p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)), "max_ms": float(a.max()), "samples": int(a.size)}


class _Scraper:
    """Periodic /metrics scrape for peak KV usage and queue depth during the run."""

    def __init__(self, server: Server, interval: float):
        self.server, self.interval = server, interval
        self.peaks: dict[str, float] = {}
        self.n = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, name="metrics-scraper", daemon=True)

    def start(self) -> None:
        if self.interval > 0:
            self._t.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            m = self.server.metrics()
            if m is None:
                continue
            self.n += 1
            for k, v in gauges(m).items():
                if v is not None:
                    self.peaks[k] = max(self.peaks.get(k, v), v)

    def stop(self) -> dict:
        self._stop.set()
        if self._t.is_alive():
            self._t.join(timeout=5)
        return {"scrapes": self.n, **{f"{k}_max": v for k, v in self.peaks.items()}}


def _endpoint(cfg: BenchConfig) -> tuple[bool, str]:
    """(chat?, path) of the API the run calls."""
    chat = cfg.endpoint == "chat"
    return chat, "/v1/chat/completions" if chat else "/v1/completions"


def _progress_row(done: int, sent: int, total: int | None, el: float, tokens: int, errors: int) -> dict:
    return {"done": done, "sent": sent, "total": total, "elapsed_s": el,
            "output_tok_s": tokens / el if el > 0 else 0.0, "errors": errors}


def _fd_budget() -> int:
    """How many sockets the loop transport may open: the soft file limit, raised to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else max(soft, 65536), hard))
            soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except (ValueError, OSError):
            pass
    return max(1, soft - 64)


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


class _Pool:
    """W daemon worker threads, each with its own keep-alive connection."""

    def __init__(self, client: StreamClient, cfg: BenchConfig, model: str, workers: int, on_done: Callable[[Result], None]):
        self.client, self.cfg, self.model = client, cfg, model
        self.q: queue.Queue = queue.Queue()
        self.sem = threading.Semaphore(workers)
        self.on_done = on_done
        self.in_flight = 0
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._work, name=f"bench-{i}", daemon=True) for i in range(workers)]
        for t in self.threads:
            t.start()

    def _work(self) -> None:
        chat, path = _endpoint(self.cfg)
        while True:
            item = self.q.get()
            if item is None:
                self.client.close()
                return
            req, idx, lag = item
            r = self.client.post(path, request_body(req, self.model, chat, self.cfg.stream), self.cfg.stream, chat, index=idx)
            r.dispatch_lag = lag  # type: ignore[attr-defined]
            r.request = req  # type: ignore[attr-defined]
            with self.lock:
                self.in_flight -= 1
            self.sem.release()
            self.on_done(r)

    def submit(self, req: Request, idx: int, lag: float, stop: threading.Event) -> bool:
        while not self.sem.acquire(timeout=0.1):
            if stop.is_set():
                return False
        with self.lock:
            self.in_flight += 1
        self.q.put((req, idx, lag))
        return True

    def close(self) -> None:
        for _ in self.threads:
            self.q.put(None)


def _run_phase(
    client: StreamClient,
    cfg: BenchConfig,
    model: str,
    reqs: list[Request],
    offsets: np.ndarray | None,
    workers: int,
    duration_s: float | None,
    stop: threading.Event,
    progress: Callable[[dict], None] | None,
) -> tuple[list[Result], float, float, bool]:
    """Send ``reqs`` and wait for them. Returns results, t0, t_end, interrupted."""
    results: list[Result] = []
    lock = threading.Lock()
    all_done = threading.Event()
    state = {"sent": 0, "done": 0, "tokens": 0, "errors": 0, "closed": False}

    def on_done(r: Result) -> None:
        with lock:
            results.append(r)
            state["done"] += 1
            state["tokens"] += r.completion_tokens or 0
            state["errors"] += 0 if r.ok else 1
            if state["closed"] and state["done"] >= state["sent"]:
                all_done.set()

    pool = _Pool(client, cfg, model, workers, on_done)
    interrupted = False
    t0 = time.perf_counter()
    total = len(reqs) if duration_s is None else None
    last_report = t0

    def report(force: bool = False) -> None:
        nonlocal last_report
        now = time.perf_counter()
        if progress and (force or now - last_report >= 2.0):
            last_report = now
            el = now - t0
            progress(_progress_row(state["done"], state["sent"], total, el, state["tokens"], state["errors"]))

    try:
        i = 0
        while not stop.is_set():
            if duration_s is None:
                if i >= len(reqs):
                    break
                req = reqs[i]
            else:
                if time.perf_counter() - t0 >= duration_s:
                    break
                req = reqs[i % len(reqs)]
            target = t0 + (float(offsets[i]) if offsets is not None and i < len(offsets) else 0.0)
            while True:
                wait = target - time.perf_counter()
                if wait <= 0 or stop.wait(min(wait, 0.5)):
                    break
                report()
            if stop.is_set():
                break
            if not pool.submit(req, i, max(0.0, time.perf_counter() - target), stop):
                break
            with lock:
                state["sent"] += 1
            i += 1
            report()
        with lock:
            state["closed"] = True
            if state["done"] >= state["sent"]:
                all_done.set()
        while not all_done.wait(0.5):
            report()
            if stop.is_set():
                break
    except KeyboardInterrupt:
        interrupted = True
        stop.set()
    if stop.is_set():
        interrupted = True
        with lock:
            state["closed"] = True
            if state["done"] >= state["sent"]:
                all_done.set()
        try:
            all_done.wait(cfg.drain_timeout_s)  # let in-flight requests end
        except KeyboardInterrupt:
            pass  # a second Ctrl-C: stop waiting
    t_end = time.perf_counter()
    pool.close()
    report(force=True)
    with lock:
        got = list(results)
        missing = state["sent"] - len(got)
    for k in range(missing):
        got.append(Result(index=-1 - k, error="interrupted before the response ended"))
    return got, t0, t_end, interrupted


def _run_phase_loop(
    cfg: BenchConfig,
    model: str,
    reqs: list[Request],
    offsets: np.ndarray | None,
    conc: int,
    duration_s: float | None,
    stop: threading.Event,
    progress: Callable[[dict], None] | None,
) -> tuple[list[Result], float, float, bool]:
    """``_run_phase`` on the one-thread transport: the dispatch schedule and the streams share
    one loop. Returns results, t0, t_end, interrupted."""
    chat, path = _endpoint(cfg)
    lc = LoopClient(cfg.url, api_key=cfg.api_key, stall_timeout=cfg.stall_timeout_s)
    results: list[Result] = []
    pending: dict[int, Request] = {}
    pc = time.perf_counter
    t0 = pc()
    total = len(reqs) if duration_s is None else None
    last_report = t0
    sent = tokens = errors = 0
    i = 0
    drain_until = None

    def collect(done: list[Result]) -> None:
        nonlocal tokens, errors
        for r in done:
            r.request = pending.pop(r.index, None)  # type: ignore[attr-defined]
            results.append(r)
            tokens += r.completion_tokens or 0
            errors += 0 if r.ok else 1

    # Under the CLI a first interrupt only sets `stop` (vkit.interrupts: the loop notices within 0.1 s),
    # so it never lands halfway through parsing a response; a second one raises KeyboardInterrupt and ends the wait.
    try:
        while True:
            try:
                now = pc()
                sending = drain_until is None and not stop.is_set()
                if sending and duration_s is None and i >= len(reqs):
                    sending = False
                if sending and duration_s is not None and now - t0 >= duration_s:
                    sending = False
                wait = 0.1
                while sending and lc.in_flight < conc:
                    target = t0 + (float(offsets[i]) if offsets is not None and i < len(offsets) else 0.0)
                    if target > now:
                        wait = min(wait, target - now)
                        break
                    req = reqs[i % len(reqs)]
                    pending[i] = req
                    r = lc.start(path, json.dumps(request_body(req, model, chat, cfg.stream)).encode(), cfg.stream, chat, index=i)
                    r.dispatch_lag = max(0.0, now - target)  # type: ignore[attr-defined]
                    sent += 1
                    i += 1
                    if duration_s is None and i >= len(reqs):
                        break
                    now = pc()
                if not sending and lc.in_flight == 0:
                    collect(lc.poll(0))
                    break
                if stop.is_set() and drain_until is None:
                    drain_until = pc() + cfg.drain_timeout_s
                if drain_until is not None and pc() >= drain_until:
                    break
                collect(lc.poll(wait))
                now = pc()
                if progress and now - last_report >= 2.0:
                    last_report = now
                    el = now - t0
                    progress(_progress_row(len(results), sent, total, el, tokens, errors))
            except KeyboardInterrupt:
                if drain_until is not None:
                    break  # a second Ctrl-C: stop waiting
                stop.set()
    finally:
        t_end = pc()
        collect(lc.abort_all("interrupted before the response ended"))
        lc.close()
    if progress:
        el = t_end - t0
        progress(_progress_row(len(results), sent, total, el, tokens, errors))
    return results, t0, t_end, stop.is_set()


def preflight_request(first: Request) -> Request:
    """The first request's shape with other token ids, so the preflight does not put the
    measured prompt into the server's prefix cache (text prompts are sent as they are)."""
    hi = max(first.prompt) if isinstance(first.prompt, list) and first.prompt else 0
    if hi > 20:  # ids stay in [10, hi]: never above what the dataset itself sends
        ids = [10 + (t * 7919 + 17) % (hi - 9) for t in reversed(first.prompt)]
        return Request(index=-1, prompt=ids, input_len=first.input_len, output_len=1, ignore_eos=first.ignore_eos)
    return first


def run_bench(cfg: BenchConfig, progress: Callable[[dict], None] | None = None, stop: threading.Event | None = None) -> Outcome:
    stop = stop or threading.Event()
    transport = cfg.transport
    if transport == "auto":
        transport = "threads" if cfg.url.startswith("https:") else "loop"
    if transport == "loop" and cfg.url.startswith("https:"):
        raise UsageError("--transport loop speaks plain http only; use --transport threads for https")
    server = Server(cfg.url, api_key=cfg.api_key)
    models = server.models()  # raises Unavailable naming the URL
    if not models:
        raise Unavailable(f"{cfg.url}/v1/models lists no model")
    model = cfg.model or models[0].get("id")
    served = next((m for m in models if m.get("id") == model), None)
    version = server.version()
    client = StreamClient(cfg.url, api_key=cfg.api_key, stall_timeout=cfg.stall_timeout_s)
    if not cfg.requests:
        raise UsageError("no requests to send (--num-prompts 0?)")
    pre = _preflight(cfg, client, model)
    conc = cfg.max_concurrency
    if cfg.duration_s is not None and conc is None and math.isinf(cfg.request_rate):
        raise UsageError("--duration with --request-rate inf needs --max-concurrency")
    phase, n_workers = _phase_runner(cfg, client, model, transport)

    warm_results: list[Result] = []
    if cfg.warmups:
        warm_results, _, _, intr = phase(cfg.warmups, None, min(n_workers, len(cfg.warmups)), None, stop, None)
        if intr:
            stop.set()

    before = server.metrics()
    # No cyclic garbage collection while measuring: in a large process (the tune driver, a test
    # runner) a full collection stalls every thread for tens to hundreds of milliseconds, and the
    # stall lands in the latencies. Reference counting still frees what the run drops.
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        scraper = _Scraper(server, cfg.scrape_interval_s)
        lag = _LagSampler()
        accel = Sampler()
        cpu0, wall0 = _cpu_s(), time.perf_counter()
        scraper.start()
        lag.start()
        accel.start()
        results: list[Result] = []
        t0 = t_end = time.perf_counter()
        interrupted = stop.is_set()
        if not interrupted:
            results, t0, t_end, interrupted = phase(cfg.requests, cfg.arrivals, n_workers, cfg.duration_s, stop, progress)
        cpu_s, wall_s = _cpu_s() - cpu0, time.perf_counter() - wall0
    finally:
        if gc_was_enabled:
            gc.enable()
        gc.unfreeze()
    peaks = scraper.stop()
    lag_stats = lag.stop()
    accel_stats = accel.stop()
    after = server.metrics()
    sdelta = delta(before, after)

    summary, records = summarize(
        cfg, model, results, warm_results, t0, t_end, interrupted, sdelta,
        extra={
            "server": _server_info(cfg, model, version, served, before, after, peaks, sdelta),
            "accelerator": accel_stats,
            "client": _client_info(transport, n_workers, cpu_s, wall_s, t0, lag_stats),
            "preflight": {"ok": pre.ok, "ttft_ms": None if pre.ttft is None else pre.ttft * 1000},
            "fingerprint": fingerprint(model, cfg.launch_argv, server_version=(version or {}).get("version")),
        },
    )
    add_energy(summary, accel_stats.get("power") or {"available": False, "why": accel_stats.get("why")}, cfg.idle_w)
    out_tokens = summary["total_output_tokens"]
    summary["vkit"]["client"]["cpu_s_per_1k_output_tokens"] = cpu_s / out_tokens * 1000 if out_tokens else None
    return Outcome(summary, records, interrupted)


def _preflight(cfg: BenchConfig, client: StreamClient, model: str) -> Result:
    """The first request alone, one token. A rejection here is a usage error with the server's words."""
    chat, path = _endpoint(cfg)
    pre = client.post(path, request_body(preflight_request(cfg.requests[0]), model, chat, cfg.stream, max_tokens=1), cfg.stream, chat)
    if pre.status is None:
        raise Unavailable(f"cannot send to {cfg.url}: {pre.error}")
    if 400 <= pre.status < 500:
        raise UsageError(f"the server rejected the first request: {pre.error}")
    if not pre.ok:
        raise Unavailable(f"the first request to {cfg.url} failed: {pre.error}")
    client.close()
    return pre


def _phase_runner(cfg: BenchConfig, client: StreamClient, model: str, transport: str) -> tuple[Callable, int]:
    """The function that runs one phase (warm-ups or the measured requests) on ``transport``, and
    how many streams it may keep in flight."""
    conc = cfg.max_concurrency
    if transport == "loop":
        n_workers = min(conc or len(cfg.requests), _fd_budget())

        def phase(reqs, offsets, workers, duration_s, stop_, progress_):
            return _run_phase_loop(cfg, model, reqs, offsets, workers, duration_s, stop_, progress_)
    else:
        n_workers = min(conc or len(cfg.requests), MAX_THREADS)

        def phase(reqs, offsets, workers, duration_s, stop_, progress_):
            return _run_phase(client, cfg, model, reqs, offsets, workers, duration_s, stop_, progress_)
    return phase, n_workers


def _server_info(cfg: BenchConfig, model: str, version: dict | None, served: dict | None, before: Metrics | None,
                 after: Metrics | None, peaks: dict, sdelta: dict | None) -> dict:
    """The summary's ``vkit.server``: what the server said about itself, and its /metrics over the run."""
    return {
        "url": cfg.url,
        "version": (version or {}).get("version"),
        "version_info": version,
        "model": model,
        "max_model_len": (served or {}).get("max_model_len"),
        "cache_config": cache_config(after or before),
        "metrics_available": after is not None,
        "families": families(after),
        "peaks": peaks,
        "delta": sdelta,
    }


def _client_info(transport: str, n_workers: int, cpu_s: float, wall_s: float, t0: float, lag_stats: dict | None) -> dict:
    """The summary's ``vkit.client``: the client, its transport and what it cost."""
    return {
        "name": "vkit bench_stream",
        "version": __version__,
        "python": sys.version.split()[0],
        "transport": transport,
        "transport_detail": ("one thread, non-blocking sockets in a selectors loop, keep-alive" if transport == "loop"
                             else "http.client, one keep-alive connection per thread"),
        "threads": 1 if transport == "loop" else n_workers,
        "max_streams": n_workers,
        "cpu_s": cpu_s,
        "t0_monotonic_s": t0,  # perf_counter (CLOCK_MONOTONIC) at the run's start: records' start_s are offsets from it
        "wall_s": wall_s,
        "cpu_frac_of_one_core": cpu_s / wall_s if wall_s > 0 else None,
        "sched_lag": lag_stats,
    }
