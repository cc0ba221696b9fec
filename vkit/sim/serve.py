"""The simulator's server: start-up, the asyncio loop, and the engine loop in virtual time.

One asyncio event loop runs both a small hand-written HTTP/1.1 server (keep-alive,
chunked SSE: ``vkit.sim.http``, its endpoints: ``vkit.sim.api``) and the engine loop here. The engine runs in virtual time; virtual time maps to
wall time through ``--sim-speed K`` (``wall = w0 + virtual / K``). Each step's tokens are
written when the wall clock reaches the step's scheduled end; everything the server reports
(/metrics, log throughputs) is measured on the observed wall clock, so a client's and the
server's figures agree. If the process falls more than ``MAX_BEHIND_S`` behind the schedule
(CPU-bound, e.g. a very high --sim-speed) the schedule is re-anchored and counted in
``/sim/stats``.

Start-up follows vLLM: the socket is bound first (connections are refused while loading),
then configs are validated, the model "loads" for ``--sim-startup-s``, the KV cache is sized,
and only then does the socket listen.
"""

from __future__ import annotations

import asyncio
import selectors
import socket
import time
import traceback
from collections import deque
from typing import Callable

from vkit import __version__ as VKIT_VERSION
from vkit.sim.api import ENGINE_DEAD_MSG, SIM_VERSION, SimApi, cpu_seconds
from vkit.sim.config import Resolved, ServeOptions, SimStartupError, format_gib, resolve
from vkit.sim.engine import FINISHED, CostModel, Engine, EngineConfig, Noise
from vkit.sim.http import Conn, error_body
from vkit.sim.metrics import Metrics
from vkit.sim.power import PowerMeter
from vkit.sim.settings import SimSettings
from vkit.sim.tokenizer import EOS_TOKEN_ID, Tokenizer
from vkit.sim.vlog import ENGINE, VllmLog

REGIME_GAP_WALL_S = 0.01  # idle wall time that starts a new noise level (a new benchmark run)
MAX_BEHIND_S = 0.05  # wall seconds behind the virtual schedule before re-anchoring
CRASH_EXIT_DELAY_S = 1.0



class _StampedSelector(selectors.DefaultSelector):  # type: ignore[misc, valid-type]
    """The event loop's selector, noting when each batch of ready sockets was seen.

    The loop then runs one callback after another; a request read by the 64th callback of a batch
    reached the server when the batch did, not when its turn came. vLLM's HTTP front end runs in
    its own process beside the engine, so its intake never waits for the engine's token writes;
    here both share one thread, and the batch time is the honest arrival of every request in it.
    """

    ready_at = 0.0

    def select(self, timeout=None):
        ready = super().select(timeout)
        self.ready_at = time.perf_counter()
        return ready


def build_engine(opts: ServeOptions, resolved: Resolved, settings: SimSettings, tok: Tokenizer,
                 drift_offset_s: float | None = None) -> Engine:
    """The engine ``vllm serve`` would run for these options: scheduler limits, step-cost model, noise.
    ``drift_offset_s``: the drift's age at this start in simulated seconds (the virtual server's);
    None: the wall time since ``settings.drift_since`` at the simulator's speed."""
    m = opts.model_profile
    ecfg = EngineConfig(
        max_model_len=resolved.max_model_len,
        max_num_seqs=resolved.max_num_seqs,
        max_num_batched_tokens=resolved.max_num_batched_tokens,
        num_gpu_blocks=resolved.num_gpu_blocks,
        block_size=resolved.block_size,
        enable_chunked_prefill=resolved.enable_chunked_prefill,
        enable_prefix_caching=resolved.enable_prefix_caching,
        policy=resolved.scheduling_policy,
        long_prefill_token_threshold=resolved.long_prefill_token_threshold,
        short_prefill_pathology=settings.pathology == "short-prefill",
        short_prefill_slowdown=settings.pathology_slowdown,
    )
    if settings.cost_params is not None or opts.quantization:
        from vkit.sim.calibrated import CostParams, PhysCost

        params = settings.cost_params if settings.cost_params is not None else CostParams(
            mfu=settings.mfu, mbu=settings.mbu)
        cost = PhysCost(m, opts.gpu, resolved.tensor_parallel_size, resolved.kv_dtype_bytes, params,
                        opts.quantization)
    else:
        cost = CostModel(m, opts.gpu, resolved.tensor_parallel_size, resolved.kv_dtype_bytes,
                         mfu=settings.mfu, mbu=settings.mbu)
    if settings.hidden_seed is not None:
        from vkit.sim.hidden import with_hidden

        cost = with_hidden(cost, settings.hidden_seed, resolved, m, opts.gpu)
    since = settings.drift_since
    offset = drift_offset_s if drift_offset_s is not None else (
        max(0.0, time.time() - since) * settings.speed if since is not None else 0.0)
    rs = settings.effective_restart_noise
    # A new run level after >= 10 ms of wall time with nothing to do: the pause between two benchmark
    # runs (15-40 ms in-process, more across processes); inside a closed-loop run the engine never
    # idles that long. Low-rate open-loop traffic idles often, so its runs average several levels.
    noise = Noise(settings.noise, settings.drift_per_hour, settings.seed, regime_gap_s=REGIME_GAP_WALL_S * settings.speed,
                  drift_offset_s=offset, restart_sigma=rs, start_index=settings.start_index,
                  slowdown=settings.slowdown, slowdown_after_s=settings.slowdown_after_s) \
        if (settings.noise > 0 or rs > 0 or settings.drift_per_hour or settings.slowdown != 1.0) else None
    engine = Engine(ecfg, cost, lambda r: tok.output_token(r.text_seed, r.num_output), EOS_TOKEN_ID, noise)
    engine.meter = PowerMeter(m, opts.gpu, resolved.tensor_parallel_size, resolved.kv_dtype_bytes, opts.quantization)
    return engine


def oom_under_load(opts: ServeOptions, settings: SimSettings) -> str | None:
    """The CUDA out-of-memory message the engine dies with at its first step of more than one request, when
    the memory left outside vLLM's budget (total x (1 - gpu_memory_utilization) - memory other processes hold)
    is less than --sim-oom-under-load-gib; None when it is enough (or the fault is off)."""
    need = settings.oom_under_load_bytes
    total = opts.gpu.memory_bytes
    left = total - total * opts.gpu_memory_utilization - opts.memory_in_use_bytes
    if need <= 0 or left >= need:
        return None
    return (f"CUDA out of memory. Tried to allocate {format_gib(need)} GiB. GPU 0 has a total capacity of "
            f"{format_gib(total)} GiB of which {format_gib(max(left, 0))} GiB is free. (sim_server fault: "
            "--sim-oom-under-load-gib)")


def fail_at_start(opts: ServeOptions) -> SimStartupError:
    """The start-up failure of ``--sim-fail-at-start``: CUDA out of memory while loading the weights."""
    return SimStartupError(
        "engine", "torch.OutOfMemoryError",
        f"CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of "
        f"{opts.gpu.memory_bytes / (1 << 30):.2f} GiB of which 1.02 GiB is free. "
        "(sim_server fault: --sim-fail-at-start)",
        log_before=["Failed to load model - not enough GPU memory. Try lowering "
                    "--gpu-memory-utilization to free memory for weights, increasing "
                    "--tensor-parallel-size, or using --quantization."])


# -- the application: the API over the engine, run in virtual time ---------------------------

class SimApp(SimApi):
    """The simulated server: :class:`~vkit.sim.api.SimApi` over an engine whose steps a loop
    runs in virtual time and writes out at their wall-clock ends."""

    def __init__(self, opts: ServeOptions, resolved: Resolved, settings: SimSettings, log: VllmLog,
                 selector: _StampedSelector | None = None):
        super().__init__(opts, resolved, settings, log)
        self.selector = selector
        self.engine = build_engine(opts, resolved, settings, self.tok)
        self.metrics = Metrics(resolved.max_model_len)
        self.speed = settings.speed
        self.w0 = time.perf_counter()
        self.v0 = 0.0
        self.v_end = 0.0
        self.busy_prev = False
        self.wake = asyncio.Event()
        self.dead = False
        self.exit_code: int | None = None
        self.stop_event = asyncio.Event()
        # /sim/stats
        self.lags: deque[float] = deque(maxlen=2_000_000)
        # per request: (id, arrival, first-token write), perf_counter seconds (CLOCK_MONOTONIC, which
        # a client on the same machine shares): client TTFT minus this server TTFT is the client's overhead
        self.req_times: deque[tuple] = deque(maxlen=200_000)
        self.reanchors = 0
        self.oom_left = oom_under_load(opts, settings)
        self.stats_t0 = time.perf_counter()
        self.cpu_t0 = cpu_seconds()
        self.listener: asyncio.base_events.Server | None = None

    # -- clock --------------------------------------------------------------------------------

    def ready_at(self) -> float:
        """When the current batch of readable sockets was seen (now, outside the server's loop)."""
        sel = self.selector
        return sel.ready_at if sel is not None and sel.ready_at else time.perf_counter()

    def vnow(self, w: float | None = None) -> float:
        """Virtual time at wall time ``w`` (now when None)."""
        return self.v0 + ((time.perf_counter() if w is None else w) - self.w0) * self.speed

    def wall(self, v: float) -> float:
        return self.w0 + (v - self.v0) / self.speed

    # -- the engine loop ------------------------------------------------------------------------
    async def _sleep_until(self, t: float) -> None:
        d = t - time.perf_counter()
        if d > 0.0015:
            # asyncio rounds selector timeouts up to whole milliseconds; wake early, then sleep precisely.
            await asyncio.sleep(d - 0.0012)
        else:
            await asyncio.sleep(0)  # always let the loop take in new requests between steps
        d = t - time.perf_counter()
        if d > 0:
            time.sleep(d)

    async def engine_loop(self) -> None:
        try:
            await self._engine_loop()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a simulator bug kills the "engine", visibly, as a crash would
            self.log.stderr("sim_server: internal error in the engine loop (a bug; please report it):\n"
                            + traceback.format_exc())
            self.crash("sim_server internal error (see stderr)")

    async def _engine_loop(self) -> None:
        eng = self.engine
        max_behind_v = MAX_BEHIND_S * self.speed
        while not self.dead:
            if not eng.has_work():
                self.busy_prev = False
                self.wake.clear()
                await self.wake.wait()
                continue
            w_now = time.perf_counter()
            v_now = self.vnow(w_now)
            if self.busy_prev:
                vs = self.v_end
                if v_now - vs > max_behind_v:
                    self.w0, self.v0 = w_now, vs  # re-anchor: the simulator could not keep up
                    self.reanchors += 1
            else:
                vs = max(self.v_end, v_now)
            res = eng.step(vs)
            if self.oom_left is not None and len(res.scheduled) > 1:
                self.crash(self.oom_left, exc="torch.OutOfMemoryError")
                return
            if not res.scheduled:
                # Nothing fits (e.g. a prompt larger than the whole KV cache); wait for a change.
                self.busy_prev = False
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), timeout=0.05)
                except asyncio.TimeoutError:
                    pass
                continue
            w_start = self.wall(vs)
            for r in res.new_scheduled:
                if r.user is not None:
                    r.user.t_sched = w_start
            ve = vs + res.duration
            w_end = self.wall(ve)
            batch = self._prepare(res)  # format while the "GPU" works; only the writes remain at w_end
            await self._sleep_until(w_end)
            if self.dead:
                return
            self._emit(res, batch, w_end)
            self.v_end = ve
            self.busy_prev = True
            # Take in what arrived during the writes before scheduling the next step, as vLLM's
            # engine core takes its input queue before each schedule().
            await asyncio.sleep(0)

    def _prepare(self, res) -> list:
        bytes_of = self.tok.bytes_of
        batch = []
        for r in res.token_reqs:
            live = r.user
            if live is None or live.done:
                continue
            fin = r.finish_reason if r.status == FINISHED else None
            batch.append((live, live.sink.render(bytes_of(r.token_ids[-1]), fin, r.num_output), fin, r.num_output))
        return batch

    def _emit(self, res, batch: list, w_end: float) -> None:
        perf = time.perf_counter
        times = []
        append = times.append
        # 1. The writes, back to back: this is what the lag measures.
        for live, payload, _, _ in batch:
            if payload is not None and not live.done:
                live.conn.write(payload)
            append(perf())
        lags = self.lags
        for t in times:
            lags.append(t - w_end)
        # 2. Bookkeeping.
        m = self.metrics
        prefix_reqs = len(res.new_scheduled) if res.prefix_queries else 0
        m.on_step(res.prompt_tokens, res.generation_tokens, res.num_preempted, prefix_reqs,
                  res.prefix_queries, res.prefix_hits)
        h_ttft, h_itl = m.h_ttft, m.h_itl
        for (live, _, fin, n_out), t in zip(batch, times, strict=True):
            if live.done:
                continue
            if live.t_first is None:
                live.t_first = t
                h_ttft.observe(t - live.t_arrival)
                self.req_times.append((live.req.req_id, live.t_arrival, t))
            else:
                h_itl.observe(t - live.t_last)
            live.t_last = t
            if fin is not None:
                live.done = True
                live.sink.complete(fin, n_out)
                self._record_finish(live, fin, t)

    # -- faults ---------------------------------------------------------------------------------
    def crash(self, cause: str, exc: str = "RuntimeError") -> None:
        if self.dead:
            return
        self.dead = True
        log = self.log
        log.error("core.py:1142", "EngineCore encountered a fatal error.", ENGINE)
        log.error("core.py:1142", "Traceback (most recent call last):\n"
                  "  (sim_server: simulated fault inside EngineCore)\n"
                  f"{exc}: {cause}", ENGINE)
        log.error("async_llm.py:480", "AsyncLLM output_handler failed.\nTraceback (most recent call last):\n"
                  f"vllm.v1.engine.exceptions.EngineDeadError: {ENGINE_DEAD_MSG}")
        body = error_body(ENGINE_DEAD_MSG, "InternalServerError", 500)
        for conn in list(self.conns):
            live = conn.live
            if live is not None and not live.done:
                live.done = True
                live.sink.fail(body)
                if live.req is not None and self.engine.abort(live.req):
                    self._record_finish(live, "error", time.perf_counter())
        loop = asyncio.get_running_loop()
        loop.call_later(CRASH_EXIT_DELAY_S, self._shutdown, 1)

    def _shutdown(self, code: int) -> None:
        if self.exit_code is None:
            self.exit_code = code
        self.stop_event.set()

    # -- periodic log ---------------------------------------------------------------------------
    async def stats_loop(self) -> None:
        last = time.perf_counter()
        last_p = last_g = 0.0
        while True:
            await asyncio.sleep(self.s.stats_interval_s)
            now = time.perf_counter()
            p, g = self.metrics.take_interval()
            dt = now - last
            last = now
            tp, tg = (p / dt, g / dt) if dt > 0 else (0.0, 0.0)
            if self.s.log_stats and (tp or tg or last_p or last_g):
                e = self.engine
                self.log.info("loggers.py:127", (
                    f"Engine 000: Avg prompt throughput: {tp:.1f} tokens/s, Avg generation throughput: {tg:.1f} "
                    f"tokens/s, Running: {e.num_running()} reqs, Waiting: {e.num_waiting()} reqs, GPU KV cache "
                    f"usage: {e.kv_usage() * 100:.1f}%, Prefix cache hit rate: {self.metrics.prefix_hit_rate() * 100:.1f}%"))
            last_p, last_g = tp, tg


# -- start-up --------------------------------------------------------------------------------

def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def report_startup_error(e: SimStartupError, log: VllmLog) -> None:
    """Print a start-up failure the way vLLM does (engine side to the log, tracebacks to stderr)."""
    if e.stage == "engine":
        for line in e.log_before:
            log.error("gpu_model_runner.py:2650", line, ENGINE)
        log.error("core.py:708", "EngineCore failed to start.\nTraceback (most recent call last):\n"
                  "  (sim_server: simulated failure inside EngineCore)\n" + f"{e.exc_type}: {e.message}", ENGINE)
        log.stderr("Process EngineCore_DP0:\nTraceback (most recent call last):\n"
                   "  (sim_server: simulated failure inside EngineCore)\n" + f"{e.exc_type}: {e.message}")
        log.stderr("Traceback (most recent call last):\n  (sim_server: simulated vLLM start-up failure)\n"
                   "RuntimeError: Engine core initialization failed. See root cause above. "
                   "Failed core proc(s): {'EngineCore': 1}")
    else:
        log.stderr("Traceback (most recent call last):\n  (sim_server: simulated vLLM start-up failure)\n"
                   f"{e.exc_type}: {e.message}")


OnLoop = Callable[[asyncio.AbstractEventLoop, Callable[[], None]], None]


async def _serve(opts: ServeOptions, s: SimSettings, log: VllmLog, selector: _StampedSelector, on_loop: OnLoop | None) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    if on_loop is not None:
        on_loop(loop, stop.set)  # the caller wires its signals to the stop (the CLI: SIGTERM, SIGINT)
    return await _serve_until(opts, s, log, selector, stop)


async def _serve_until(opts: ServeOptions, s: SimSettings, log: VllmLog, selector: _StampedSelector, stop: asyncio.Event) -> int:
    loop = asyncio.get_running_loop()
    log.info("api_server.py:1839", f"vLLM API server version {SIM_VERSION}")
    log.info("utils.py:233", f"non-default args: {s.non_default_args!r}")
    log.warning("sim_server.py:1", (
        f"SIMULATED vLLM: vkit sim_server {VKIT_VERSION} emulating {s.gpu_name} x{opts.tensor_parallel_size} "
        f"serving {s.model_name} (--sim-speed {s.speed:g}, --sim-noise {s.noise:g}, --sim-restart-noise "
        f"{s.effective_restart_noise:g}, --sim-seed {s.seed}, start {s.start_index}). "
        "Every figure this server reports is simulated, not measured."))

    # vLLM binds the socket before building the engine (connections are refused until it listens).
    host = s.host
    try:
        sock = _bind(host, s.port)
    except OSError as e:
        log.stderr("Traceback (most recent call last):\n  (sim_server: binding the API server socket)\n"
                   f"OSError: [Errno {e.errno}] {e.strerror}")
        return 1
    try:
        try:
            resolved = resolve(opts)
        except SimStartupError as e:
            if e.stage == "engine":
                _pre_engine_logs(opts, s, log, None)
                await _sleep_or_stop(s.startup_s * 0.7, stop)
            report_startup_error(e, log)
            return 1
        _pre_engine_logs(opts, s, log, resolved)
        t_load = s.startup_s * 0.7
        log.info("gpu_model_runner.py:2602", f"Starting to load model {opts.model}...", ENGINE)
        if await _sleep_or_stop(t_load, stop):
            return 0
        if s.fail_at_start:
            report_startup_error(fail_at_start(opts), log)
            return 1
        log.info("gpu_model_runner.py:2634",
                 f"Model loading took {resolved.weights_bytes_per_gpu / (1 << 30):.4f} GiB memory and {t_load:.6f} seconds",
                 ENGINE)
        if await _sleep_or_stop(s.startup_s - t_load, stop):
            return 0
        for msg in resolved.infos:
            if msg.startswith("Auto-fit") or msg.startswith("Overriding"):
                log.info("kv_cache_utils.py:1280", msg, ENGINE)
        log.info("gpu_worker.py:298", f"Available KV cache memory: {format_gib(resolved.available_kv_bytes_per_gpu):.2f} GiB",
                 ENGINE)
        log.info("kv_cache_utils.py:1087", f"GPU KV cache size: {resolved.kv_cache_tokens:,} tokens", ENGINE)
        log.info("kv_cache_utils.py:1091", f"Maximum concurrency for {resolved.max_model_len:,} tokens per request: "
                 f"{resolved.max_concurrency:.2f}x", ENGINE)
        log.info("core.py:218", f"init engine (profile, create kv cache, warmup model) took {s.startup_s - t_load:.2f} seconds",
                 ENGINE)

        app = SimApp(opts, resolved, s, log, selector)
        app.stop_event = stop
        sock.listen(2048)
        server = await loop.create_server(lambda: Conn(app), sock=sock)
        app.listener = server
        log.info("api_server.py:1634", "Supported_tasks: ['generate']")
        log.info("api_server.py:1912", f"Starting vLLM API server 0 on http://{host}:{sock.getsockname()[1]}")
        log.info("launcher.py:34", "Available routes are:")
        for route, methods in (("/health", "GET"), ("/ping", "GET, POST"), ("/version", "GET"),
                               ("/v1/models", "GET"), ("/v1/chat/completions", "POST"),
                               ("/v1/completions", "POST"), ("/metrics", "GET")):
            log.info("launcher.py:42", f"Route: {route}, Methods: {methods}")
        log.uvicorn(f"Started server process [{log.pid}]")
        log.uvicorn("Waiting for application startup.")
        log.uvicorn("Application startup complete.")
        log.start_background()
        engine_task = loop.create_task(app.engine_loop())
        stats_task = loop.create_task(app.stats_loop())
        await stop.wait()
        code = app.exit_code if app.exit_code is not None else 0
        log.close()
        log.uvicorn("Shutting down")
        server.close()
        for conn in list(app.conns):
            if conn.transport is not None:
                conn.transport.close()
        engine_task.cancel()
        stats_task.cancel()
        log.uvicorn("Waiting for application shutdown.")
        log.uvicorn("Application shutdown complete.")
        log.uvicorn(f"Finished server process [{log.pid}]")
        return code
    finally:
        log.close()
        sock.close()


def _pre_engine_logs(opts: ServeOptions, s: SimSettings, log: VllmLog, r: Resolved | None) -> None:
    m = opts.model_profile
    log.info("model.py:547", "Resolved architecture: " + ("Qwen2ForCausalLM" if m.name.startswith("qwen") else "LlamaForCausalLM"))
    mml = r.max_model_len if r is not None else (opts.max_model_len if opts.max_model_len not in (None, -1)
                                                  else m.max_position_embeddings)
    log.info("model.py:1510", f"Using max model len {mml}")
    if r is None:
        return
    for w in r.warnings:
        log.warning("model.py:1490" if w.startswith("User-specified") else "scheduler.py:240", w)
    for msg in r.infos:
        if msg.startswith("Chunked prefill"):
            log.info("scheduler.py:205", msg)
    log.info("core.py:77", (
        f"Initializing a V1 LLM engine (v{SIM_VERSION}) with config: model={opts.model!r}, "
        f"dtype={m.dtype}, max_seq_len={r.max_model_len}, tensor_parallel_size={r.tensor_parallel_size}, "
        f"kv_cache_dtype={r.kv_cache_dtype}, served_model_name={r.served_model_names[0]}, "
        f"enable_prefix_caching={r.enable_prefix_caching}, enable_chunked_prefill={r.enable_chunked_prefill}, "
        f"max_num_seqs={r.max_num_seqs}, max_num_batched_tokens={r.max_num_batched_tokens}, "
        f"scheduling_policy={r.scheduling_policy}, block_size={r.block_size}, "
        f"gpu_memory_utilization={r.gpu_memory_utilization}"), ENGINE)


async def _sleep_or_stop(seconds: float, stop: asyncio.Event) -> bool:
    """Sleep; True if a stop signal came first."""
    if seconds <= 0:
        return stop.is_set()
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
        return True
    except asyncio.TimeoutError:
        return False


def serve(opts: ServeOptions, settings: SimSettings, log: VllmLog, on_loop: OnLoop | None = None) -> int:
    """Run the server until the stop that ``on_loop(loop, stop)`` is handed is called (under the
    CLI: SIGTERM/SIGINT, exit 0), a start-up failure or engine death (exit 1)."""
    selector = _StampedSelector()
    loop = asyncio.SelectorEventLoop(selector)
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(_serve(opts, settings, log, selector, on_loop))
    finally:
        try:
            for task in asyncio.all_tasks(loop):
                task.cancel()
            loop.run_until_complete(asyncio.sleep(0))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
