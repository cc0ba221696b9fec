"""The simulator's HTTP server: vLLM's OpenAI-compatible contract over the simulated engine.

One asyncio event loop runs both a small hand-written HTTP/1.1 server (keep-alive,
chunked SSE) and the engine loop. The engine runs in virtual time; virtual time maps to
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
import json
import os
import random
import selectors
import socket
import time
import traceback
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from vkit import __version__ as VKIT_VERSION
from vkit.sim.config import Resolved, ServeOptions, SimStartupError, format_gib, resolve
from vkit.sim.engine import FINISHED, CostModel, Engine, EngineConfig, Noise, Request
from vkit.sim.metrics import Metrics
from vkit.sim.tokenizer import EOS_TOKEN_ID, Tokenizer, render_chat
from vkit.sim.vlog import ENGINE, VllmLog

VLLM_VERSION = "0.32.0"
SIM_VERSION = VLLM_VERSION + "+sim"
REGIME_GAP_WALL_S = 0.01  # idle wall time that starts a new noise level (a new benchmark run)
MAX_BEHIND_S = 0.05  # wall seconds behind the virtual schedule before re-anchoring
STATS_LOG_INTERVAL_S = 10.0
CRASH_EXIT_DELAY_S = 1.0
_ENGINE_DEAD_MSG = "EngineCore encountered an issue. See stack trace (above) for the root cause."

_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed",
            411: b"Length Required", 413: b"Request Entity Too Large", 500: b"Internal Server Error",
            503: b"Service Unavailable"}


@dataclass
class SimSettings:
    """Everything that is not a vLLM engine option: address, realism, faults."""

    host: str = "127.0.0.1"
    port: int = 8000
    gpu_name: str = "H200"
    model_name: str = "llama-3.1-8b"
    speed: float = 1.0
    startup_s: float = 1.0
    noise: float = 0.02  # run-to-run sd on one process
    restart_noise: float | None = None  # sd between process starts; None: 0.75 x noise
    start_index: int = 0  # which start of this seed this process is (the between-restart draw)
    drift_per_hour: float = 0.0
    drift_since: float | None = None  # unix time the drift counts from (survives restarts); None: first step
    seed: int = 0
    pathology: str | None = None
    output_len_mean: int = 128
    mfu: float = 0.5
    mbu: float = 0.8
    cost_params: object | None = None  # vkit.sim.calibrated.CostParams from --sim-profile; None: built-in roofline
    profile_path: str | None = None
    fail_at_start: bool = False
    crash_after: int | None = None
    hang_health: bool = False
    stall_stream_after: int | None = None
    error_rate: float = 0.0
    access_log: bool = True
    log_stats: bool = True
    stats_interval_s: float = STATS_LOG_INTERVAL_S
    dev_mode: bool = False
    non_default_args: dict = field(default_factory=dict)

    @property
    def effective_restart_noise(self) -> float:
        return 0.75 * self.noise if self.restart_noise is None else self.restart_noise


# -- small helpers -------------------------------------------------------------------------

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


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, code: int = 400, err_type: str = "BadRequestError"):
        super().__init__(message)
        self.body = error_body(message, err_type, code, param)
        self.code = code


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _percentile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return 0.0
    k = (len(sorted_vals) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


# -- per-request state on the server side --------------------------------------------------

class Live:
    """Server-side state of one in-flight request (kept in ``Request.user``)."""

    __slots__ = ("req", "conn", "sink", "t_arrival", "t_sched", "t_first", "t_last", "max_tokens_param", "done")

    def __init__(self, conn: "Conn", t_arrival: float, max_tokens_param: int | None):
        self.req: Request | None = None
        self.conn = conn
        self.sink: Any = None
        self.t_arrival = t_arrival
        self.t_sched: float | None = None
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.max_tokens_param = max_tokens_param
        self.done = False


class StreamSink:
    """Writes one request's SSE events. The token fast path concatenates pre-built bytes."""

    __slots__ = ("conn", "chat", "pre", "mid", "tail", "rid", "created", "model_json", "include_usage",
                 "continuous", "prompt_len", "stall_after", "stalled", "role_sent")

    def __init__(self, conn: "Conn", chat: bool, rid: str, created: int, model_json: str, include_usage: bool,
                 continuous: bool, prompt_len: int, stall_after: int | None):
        self.conn = conn
        self.chat = chat
        self.rid = rid
        self.created = created
        self.model_json = model_json
        self.include_usage = include_usage
        self.continuous = continuous
        self.prompt_len = prompt_len
        self.stall_after = stall_after
        self.stalled = False
        self.role_sent = False
        # Chat chunks are dumped with exclude_unset (stop_reason only on the last), completion
        # chunks without it (stop_reason always), as vLLM's serving_chat / serving_completion do.
        if chat:
            self.pre = (f'data: {{"id":"{rid}","object":"chat.completion.chunk","created":{created},'
                        f'"model":{model_json},"choices":[{{"index":0,"delta":{{"content":"').encode()
            self.mid = b'"},"logprobs":null,"finish_reason":'
            self.tail = b'null}]'
        else:
            self.pre = (f'data: {{"id":"{rid}","object":"text_completion","created":{created},'
                        f'"model":{model_json},"choices":[{{"index":0,"text":"').encode()
            self.mid = b'","logprobs":null,"finish_reason":'
            self.tail = b'null,"stop_reason":null}]'

    def _usage(self, n_out: int) -> str:
        return f'{{"prompt_tokens":{self.prompt_len},"total_tokens":{self.prompt_len + n_out},"completion_tokens":{n_out}}}'

    def render(self, text: bytes, finish: str | None, n_out: int) -> bytes | None:
        """The bytes to write for one token (HTTP chunk framing included), or None when stalled."""
        if self.stalled:
            return None
        if self.stall_after is not None and n_out > self.stall_after:
            self.stalled = True  # the fault: the stream goes silent and never ends
            return None
        if finish is None and not self.continuous and self.role_sent:
            payload = self.pre + text + self.mid + self.tail + b"}\n\n"
            return b"%x\r\n%s\r\n" % (len(payload), payload)
        parts = []
        if self.chat and not self.role_sent:
            role = (f'data: {{"id":"{self.rid}","object":"chat.completion.chunk","created":{self.created},'
                    f'"model":{self.model_json},"choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},'
                    f'"logprobs":null,"finish_reason":null}}]')
            if self.continuous:
                role += f',"usage":{self._usage(0)}'
            parts.append((role + "}\n\n").encode())
        self.role_sent = True
        if finish is None:
            ev = self.pre + text + self.mid + self.tail
        else:
            ev = self.pre + text + self.mid + b'"' + finish.encode() + b'","stop_reason":null}]'
        if self.continuous:
            ev += b',"usage":' + self._usage(n_out).encode()
        parts.append(ev + b"}\n\n")
        if finish is None:
            return _chunk(b"".join(parts))
        if self.include_usage:
            obj = "chat.completion.chunk" if self.chat else "text_completion"
            parts.append((f'data: {{"id":"{self.rid}","object":"{obj}","created":{self.created},'
                          f'"model":{self.model_json},"choices":[],"usage":{self._usage(n_out)}}}\n\n').encode())
        parts.append(b"data: [DONE]\n\n")
        return _chunk(b"".join(parts)) + b"0\r\n\r\n"

    def complete(self, finish: str, n_out: int) -> None:
        if not self.stalled:
            self.conn.response_done()

    def fail(self, body: dict) -> None:
        conn = self.conn
        if conn.closed:
            return
        payload = b"data: " + json.dumps(body).encode() + b"\n\ndata: [DONE]\n\n"
        conn.write(_chunk(payload) + b"0\r\n\r\n")
        conn.response_done()


class FullSink:
    """Collects the text of a non-streaming request and answers once it finishes."""

    __slots__ = ("conn", "chat", "rid", "created", "model", "prompt_len", "pieces", "app")

    def __init__(self, conn: "Conn", chat: bool, rid: str, created: int, model: str, prompt_len: int, app: "SimApp"):
        self.conn = conn
        self.chat = chat
        self.rid = rid
        self.created = created
        self.model = model
        self.prompt_len = prompt_len
        self.pieces: list[str] = []
        self.app = app

    def render(self, text: bytes, finish: str | None, n_out: int) -> None:
        self.pieces.append(text)
        return None

    def complete(self, finish: str, n_out: int) -> None:
        usage = {"prompt_tokens": self.prompt_len, "total_tokens": self.prompt_len + n_out,
                 "completion_tokens": n_out, "prompt_tokens_details": None}
        text_all = b"".join(self.pieces).decode()
        if self.chat:
            body = {
                "id": self.rid, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text_all, "refusal": None,
                                                     "annotations": None, "audio": None, "function_call": None,
                                                     "tool_calls": [], "reasoning_content": None},
                             "logprobs": None, "finish_reason": finish, "stop_reason": None}],
                "service_tier": None, "system_fingerprint": None, "usage": usage,
                "prompt_logprobs": None, "kv_transfer_params": None,
            }
        else:
            body = {
                "id": self.rid, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text_all, "logprobs": None, "finish_reason": finish,
                             "stop_reason": None, "prompt_logprobs": None}],
                "service_tier": None, "system_fingerprint": None, "usage": usage, "kv_transfer_params": None,
            }
        self.app.send_json(self.conn, 200, body)

    def fail(self, body: dict) -> None:
        self.app.send_json(self.conn, body["error"]["code"], body)


# -- HTTP/1.1 connection ---------------------------------------------------------------------

class Conn(asyncio.Protocol):
    """One client connection: parses requests, one at a time (later pipelined ones wait)."""

    MAX_HEAD = 64 * 1024
    MAX_BODY = 64 * 1024 * 1024

    def __init__(self, app: "SimApp"):
        self.app = app
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.busy = False
        self.closed = False
        self.keep_alive = True
        self.t_rx = 0.0
        self.live: Live | None = None
        self.peer = "127.0.0.1:0"
        self.req_line = ""
        self._continue_sent = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        # asyncio sets TCP_NODELAY only when the listening socket says IPPROTO_TCP; ours was made with
        # proto 0, so without this Nagle holds each small SSE write until the client's delayed ACK
        # (measured: +38 ms on the first token of every request after the first on a connection).
        # uvicorn's sockets, and so vLLM's, have it set.
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        self.app.conns.add(self)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.app.conns.discard(self)
        if self.live is not None and not self.live.done:
            self.app.abort(self.live)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.t_rx = self.app.ready_at()
        if not self.busy:
            self._process()

    def write(self, data: bytes) -> None:
        if not self.closed:
            self.transport.write(data)

    def response_done(self) -> None:
        self.busy = False
        self.live = None
        if not self.keep_alive:
            self.closed = True
            self.transport.close()
            return
        if self.buf:
            # A pipelined request already read: it arrives now, when the server can take it.
            self.t_rx = time.perf_counter()
            asyncio.get_running_loop().call_soon(self._process)

    def _process(self) -> None:
        while not self.busy and not self.closed and self.buf:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buf) > self.MAX_HEAD:
                    self._fatal(413)
                return
            head = bytes(self.buf[:end]).decode("latin-1")
            lines = head.split("\r\n")
            try:
                method, target, version = lines[0].split(" ", 2)
            except ValueError:
                self._fatal(400)
                return
            headers = {}
            for ln in lines[1:]:
                k, _, v = ln.partition(":")
                headers[k.strip().lower()] = v.strip()
            if "chunked" in headers.get("transfer-encoding", "").lower():
                self._fatal(411)
                return
            try:
                length = int(headers.get("content-length", "0") or 0)
            except ValueError:
                self._fatal(400)
                return
            if length > self.MAX_BODY:
                self._fatal(413)
                return
            total = end + 4 + length
            if len(self.buf) < total:
                if headers.get("expect", "").lower() == "100-continue" and not self._continue_sent:
                    self._continue_sent = True
                    self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                return
            body = bytes(self.buf[end + 4:total])
            del self.buf[:total]
            self._continue_sent = False
            conn_hdr = headers.get("connection", "").lower()
            self.keep_alive = not (conn_hdr == "close" or (version == "HTTP/1.0" and conn_hdr != "keep-alive"))
            self.busy = True
            path = target.split("?", 1)[0]
            query = target.split("?", 1)[1] if "?" in target else ""
            self.app.handle(self, method.upper(), path, query, headers, body)

    def _fatal(self, status: int) -> None:
        self.keep_alive = False
        self.busy = True
        self.app.send_json(self, status, {"detail": _REASONS.get(status, b"Error").decode()})


# -- the application -------------------------------------------------------------------------

class SimApp:
    def __init__(self, opts: ServeOptions, resolved: Resolved, settings: SimSettings, log: VllmLog,
                 selector: _StampedSelector | None = None):
        self.selector = selector
        self.opts = opts
        self.cfg = resolved
        self.s = settings
        self.log = log
        self.names = resolved.served_model_names
        self.model_name = self.names[0]
        self.model_json = json.dumps(self.model_name)
        m = opts.model_profile
        self.tok = Tokenizer(m.vocab)
        self.rng = random.Random(settings.seed ^ 0x5EED)
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
        since = settings.drift_since
        offset = max(0.0, time.time() - since) * settings.speed if since is not None else 0.0
        rs = settings.effective_restart_noise
        # A new run level after >= 10 ms of wall time with nothing to do: the pause between two benchmark
        # runs (15-40 ms in-process, more across processes); inside a closed-loop run the engine never
        # idles that long. Low-rate open-loop traffic idles often, so its runs average several levels.
        noise = Noise(settings.noise, settings.drift_per_hour, settings.seed, regime_gap_s=REGIME_GAP_WALL_S * settings.speed,
                      drift_offset_s=offset, restart_sigma=rs, start_index=settings.start_index) \
            if (settings.noise > 0 or rs > 0 or settings.drift_per_hour) else None
        tok = self.tok
        self.engine = Engine(ecfg, cost, lambda r: tok.output_token(r.text_seed, r.num_output), EOS_TOKEN_ID, noise)
        self.metrics = Metrics(resolved.max_model_len)
        self.speed = settings.speed
        self.w0 = time.perf_counter()
        self.v0 = 0.0
        self.v_end = 0.0
        self.busy_prev = False
        self.wake = asyncio.Event()
        self.conns: set[Conn] = set()
        self.dead = False
        self.exit_code: int | None = None
        self.stop_event = asyncio.Event()
        self.admitted = 0
        self._rid = 0
        self._rid_prefix = os.urandom(8).hex()
        # /sim/stats
        self.lags: deque[float] = deque(maxlen=2_000_000)
        # per request: (id, arrival, first-token write), perf_counter seconds (CLOCK_MONOTONIC, which
        # a client on the same machine shares): client TTFT minus this server TTFT is the client's overhead
        self.req_times: deque[tuple] = deque(maxlen=200_000)
        self.reanchors = 0
        self.stats_t0 = time.perf_counter()
        self.cpu_t0 = self._cpu()
        self.created_models = int(time.time())
        self._server: asyncio.base_events.Server | None = None

    # -- clock --------------------------------------------------------------------------------

    def ready_at(self) -> float:
        """When the current batch of readable sockets was seen (now, outside the server's loop)."""
        sel = self.selector
        return sel.ready_at if sel is not None and sel.ready_at else time.perf_counter()
    def vnow(self, w: float | None = None) -> float:
        return self.v0 + ((time.perf_counter() if w is None else w) - self.w0) * self.speed

    def wall(self, v: float) -> float:
        return self.w0 + (v - self.v0) / self.speed

    @staticmethod
    def _cpu() -> float:
        t = os.times()
        return t.user + t.system

    # -- responses ----------------------------------------------------------------------------
    def _head(self, conn: Conn, status: int, ctype: bytes, length: int | None) -> bytes:
        h = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"OK")), b"server: uvicorn\r\n"]
        if ctype:
            h.append(b"content-type: " + ctype + b"\r\n")
        if length is None:
            h.append(b"transfer-encoding: chunked\r\n")
        else:
            h.append(b"content-length: %d\r\n" % length)
        if not conn.keep_alive:
            h.append(b"connection: close\r\n")
        h.append(b"\r\n")
        return b"".join(h)

    def _access(self, conn: Conn, status: int) -> None:
        if self.s.access_log and conn.req_line:
            self.log.uvicorn(f'{conn.peer} - "{conn.req_line}" {status} {_REASONS.get(status, b"").decode()}')

    def send_bytes(self, conn: Conn, status: int, ctype: bytes, body: bytes) -> None:
        if conn.closed:
            return
        self._access(conn, status)
        conn.write(self._head(conn, status, ctype, len(body)) + body)
        conn.response_done()

    def send_json(self, conn: Conn, status: int, obj: Any) -> None:
        body = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
        self.send_bytes(conn, status, b"application/json", body)

    # -- routing ------------------------------------------------------------------------------
    def handle(self, conn: Conn, method: str, path: str, query: str, headers: dict, body: bytes) -> None:
        conn.req_line = f"{method} {path}{'?' + query if query else ''} HTTP/1.1"
        try:
            if path in ("/health", "/ping"):
                if method not in ("GET", "POST" if path == "/ping" else "GET"):
                    return self.send_json(conn, 405, {"detail": "Method Not Allowed"})
                if self.s.hang_health:
                    return  # the fault: never answer; the connection stays busy
                if self.dead:
                    return self.send_bytes(conn, 503, b"", b"")
                return self.send_bytes(conn, 200, b"", b"")
            if path == "/v1/completions" or path == "/v1/chat/completions":
                if method != "POST":
                    return self.send_json(conn, 405, {"detail": "Method Not Allowed"})
                return self.generate(conn, body, chat=path.endswith("chat/completions"))
            if method != "GET" and path in ("/version", "/v1/models", "/metrics", "/sim/stats"):
                return self.send_json(conn, 405, {"detail": "Method Not Allowed"})
            if path == "/version":
                return self.send_json(conn, 200, self.version_info())
            if path == "/v1/models":
                return self.send_json(conn, 200, self.models())
            if path == "/metrics":
                return self.send_bytes(conn, 200, b"text/plain; version=0.0.4; charset=utf-8",
                                       self.render_metrics().encode())
            if path == "/sim/stats":
                return self.send_json(conn, 200, self.sim_stats(reset="reset=1" in query, requests="requests=1" in query))
            if path == "/reset_prefix_cache" and self.s.dev_mode and method == "POST":
                self.engine.reset_prefix_cache()
                return self.send_bytes(conn, 200, b"", b"")
            return self.send_json(conn, 404, {"detail": "Not Found"})
        except BadRequest as e:
            return self.send_json(conn, e.code, e.body)
        except Exception:  # noqa: BLE001 - a bug must not leave the client hanging
            self.log.stderr("sim_server: internal error while handling a request (a bug; please report it):\n"
                            + traceback.format_exc())
            return self.send_json(conn, 500, error_body("Internal server error (sim_server bug)", "InternalServerError", 500))

    def version_info(self) -> dict:
        s = self.s
        return {
            "version": SIM_VERSION, "sim": True, "sim_server": f"vkit {VKIT_VERSION}",
            "sim_speed": s.speed, "sim_gpu": s.gpu_name, "sim_tensor_parallel_size": self.cfg.tensor_parallel_size,
            "sim_model": s.model_name, "sim_seed": s.seed, "sim_noise": s.noise, "sim_restart_noise": s.effective_restart_noise, "sim_start": s.start_index, "sim_drift": s.drift_per_hour, "sim_drift_since": s.drift_since,
            "sim_pathology": s.pathology, "sim_profile": s.profile_path,
        }

    def models(self) -> dict:
        data = []
        for name in self.names:
            data.append({
                "id": name, "object": "model", "created": self.created_models, "owned_by": "vllm",
                "root": self.opts.model, "parent": None, "max_model_len": self.cfg.max_model_len,
                "permission": [{
                    "id": f"modelperm-{zlib.crc32(name.encode()):08x}", "object": "model_permission",
                    "created": self.created_models, "allow_create_engine": False, "allow_sampling": True,
                    "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                    "allow_fine_tuning": False, "organization": "*", "group": None, "is_blocking": False,
                }],
            })
        return {"object": "list", "data": data}

    def cache_info(self) -> dict[str, str]:
        c = self.cfg
        return {
            "block_size": str(c.block_size), "cache_dtype": c.kv_cache_dtype, "calculate_kv_scales": "False",
            "cpu_offload_gb": "0", "enable_prefix_caching": str(c.enable_prefix_caching),
            "gpu_memory_utilization": str(c.gpu_memory_utilization), "is_attention_free": "False",
            "num_cpu_blocks": "None", "num_gpu_blocks": str(c.num_gpu_blocks),
            "num_gpu_blocks_override": str(c.num_gpu_blocks_override),
            "prefix_caching_hash_algo": "sha256", "sliding_window": "None",
        }

    def render_metrics(self) -> str:
        e = self.engine
        return self.metrics.render(self.model_name, e.num_running(), e.num_waiting(), e.kv_usage(), self.cache_info())

    def sim_stats(self, reset: bool = False, requests: bool = False) -> dict:
        lags = sorted(self.lags)
        now = time.perf_counter()
        cpu = self._cpu()
        out = {
            "lag_ms": {"n": len(lags), "p50": _percentile(lags, 0.5) * 1e3, "p90": _percentile(lags, 0.9) * 1e3,
                       "p99": _percentile(lags, 0.99) * 1e3, "max": (lags[-1] * 1e3 if lags else 0.0)},
            "cpu_s": cpu - self.cpu_t0, "wall_s": now - self.stats_t0, "reanchors": self.reanchors,
            "steps": self.engine.total_steps, "virtual_s": self.vnow(now), "speed": self.speed,
            "running": self.engine.num_running(), "waiting": self.engine.num_waiting(),
            "noise_regimes": self.engine.noise.regimes if self.engine.noise else 0,
        }
        if requests:
            out["requests"] = [{"id": i, "arrival": a, "first": f} for i, a, f in self.req_times]
        if reset:
            self.lags.clear()
            self.req_times.clear()
            self.reanchors = 0
            self.stats_t0 = now
            self.cpu_t0 = cpu
        return out

    # -- generation requests --------------------------------------------------------------------
    def _int_field(self, data: dict, key: str, default: int | None) -> int | None:
        v = data.get(key, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise BadRequest(f"1 validation error: {key}: Input should be a valid integer", key)
        return v

    def _prompt_ids(self, data: dict, chat: bool) -> list[int]:
        tok = self.tok
        if chat:
            msgs = data.get("messages")
            if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
                raise BadRequest("1 validation error: messages: Field required (a non-empty list of messages)", "messages")
            return tok.encode(render_chat(msgs))
        prompt = data.get("prompt")
        if isinstance(prompt, str):
            return tok.encode(prompt)
        if isinstance(prompt, list) and prompt:
            if set(map(type, prompt)) == {int}:  # JSON ints only (bool is a subclass, and excluded)
                ids = prompt
            elif len(prompt) == 1 and isinstance(prompt[0], str):
                return tok.encode(prompt[0])
            elif len(prompt) == 1 and isinstance(prompt[0], list) and all(isinstance(t, int) for t in prompt[0]):
                ids = prompt[0]
            else:
                raise BadRequest("sim_server: batched prompts (several prompts in one request) are not "
                                 "simulated; send one prompt per request", "prompt")
            if ids and (min(ids) < 0 or max(ids) >= tok.vocab):
                bad = next(t for t in ids if t < 0 or t >= tok.vocab)
                raise BadRequest(f"Token id {bad} is out of vocabulary", "prompt")
            return list(ids)
        raise BadRequest("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")

    def generate(self, conn: Conn, raw: bytes, chat: bool) -> None:
        if self.dead:
            raise BadRequest(_ENGINE_DEAD_MSG, None, 500, "InternalServerError")
        try:
            data = json.loads(raw or b"null")
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(f"JSON decode error: {e}") from None
        if not isinstance(data, dict):
            raise BadRequest("1 validation error: Input should be a valid dictionary or object")
        model = data.get("model")
        if model is not None and model not in self.names:
            raise BadRequest(f"The model `{model}` does not exist.", "model", 404, "NotFoundError")
        if self.s.error_rate and self.rng.random() < self.s.error_rate:
            raise BadRequest("Internal server error (sim_server fault: --sim-error-rate)", None, 500,
                             "InternalServerError")
        n = self._int_field(data, "n", 1)
        if n != 1:
            raise BadRequest("sim_server: n > 1 is not simulated; send one request per sample", "n")
        ids = self._prompt_ids(data, chat)
        mml = self.cfg.max_model_len
        if chat:
            mt = self._int_field(data, "max_completion_tokens", None)
            if mt is None:
                mt = self._int_field(data, "max_tokens", None)
            mt_param = "max_completion_tokens" if data.get("max_completion_tokens") is not None else "max_tokens"
        else:
            mt = self._int_field(data, "max_tokens", 16)
            mt_param = "max_tokens"
        if mt is not None and mt < 1:
            raise BadRequest(f"max_tokens must be at least 1, got {mt}.", mt_param)
        plen = len(ids)
        if mt is not None and mt > mml:
            raise BadRequest(f"{mt_param}={mt} cannot be greater than max_model_len={mml}. "
                             "Please request fewer output tokens.", mt_param)
        if mt is None:
            if plen >= mml:
                raise BadRequest(f"This model's maximum context length is {mml} tokens. However, your request has "
                                 f"{plen} input tokens. Please reduce the length of the input messages.", "input_tokens")
            max_tokens = mml - plen
        else:
            if plen + mt > mml:
                raise BadRequest(
                    f"This model's maximum context length is {mml} tokens. However, you requested {mt} output "
                    f"tokens and your prompt contains {plen} input tokens, for a total of {plen + mt} tokens. "
                    "Please reduce the length of the input prompt or the number of requested output tokens.",
                    "input_tokens")
            max_tokens = mt
        min_tokens = self._int_field(data, "min_tokens", 0) or 0
        if min_tokens < 0:
            raise BadRequest(f"min_tokens must be greater than or equal to 0, got {min_tokens}.", "min_tokens")
        if min_tokens > max_tokens:
            raise BadRequest(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.",
                             "min_tokens")
        priority = self._int_field(data, "priority", 0) or 0
        if priority != 0 and self.cfg.scheduling_policy != "priority":
            raise BadRequest(f"Got priority {priority} but Priority scheduling is not enabled.", "priority")
        ignore_eos = bool(data.get("ignore_eos", False))
        stream = bool(data.get("stream", False))
        so = data.get("stream_options") or {}
        if not isinstance(so, dict):
            raise BadRequest("1 validation error: stream_options: Input should be a valid dictionary", "stream_options")
        if so and not stream:
            raise BadRequest("Stream options can only be defined when `stream=True`.", "stream_options")

        # Fault: the engine dies when the (N+1)-th request arrives.
        self.admitted += 1
        if self.s.crash_after is not None and self.admitted > self.s.crash_after:
            self.crash(f"simulated engine failure after {self.s.crash_after} requests (--sim-crash-after)")
            raise BadRequest(_ENGINE_DEAD_MSG, None, 500, "InternalServerError")

        h = hash(tuple(ids))
        mean = self.s.output_len_mean
        natural = 1 + (h >> 8) % (2 * mean) if mean > 0 else 0
        self._rid += 1
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{self._rid_prefix}{self._rid:08x}"
        created = int(time.time())
        t_arrival = min(conn.t_rx, time.perf_counter()) if conn.t_rx else time.perf_counter()
        live = Live(conn, t_arrival, mt)
        if stream:
            live.sink = StreamSink(conn, chat, rid, created, self.model_json, bool(so.get("include_usage")),
                                   bool(so.get("continuous_usage_stats")), plen, self.s.stall_stream_after)
        else:
            live.sink = FullSink(conn, chat, rid, created, self.model_name, plen, self)
        req = Request(rid, ids, max_tokens, min_tokens=min_tokens, ignore_eos=ignore_eos, natural_len=natural,
                      priority=priority, arrival=self.vnow(t_arrival), text_seed=h & 0xFFFF, user=live)
        live.req = req
        conn.live = live
        if stream:
            self._access(conn, 200)
            conn.write(self._head(conn, 200, b"text/event-stream; charset=utf-8", None))
        self.engine.add_request(req)
        self.wake.set()

    def abort(self, live: Live) -> None:
        """The client went away: free the request like vLLM's abort on disconnect."""
        if live.done or live.req is None:
            return
        live.done = True
        r = live.req
        if self.engine.abort(r):
            self._record_finish(live, "abort", time.perf_counter())
        elif r.finish_reason is not None:  # finished in the step being emitted: count it as it ended
            self._record_finish(live, r.finish_reason, time.perf_counter())

    def _record_finish(self, live: Live, reason: str, t: float) -> None:
        r = live.req
        t_sched = live.t_sched if live.t_sched is not None else t
        t_first = live.t_first if live.t_first is not None else t
        t_last = live.t_last if live.t_last is not None else t
        self.metrics.on_finish(reason, e2e=t - live.t_arrival, queue=max(0.0, t_sched - live.t_arrival),
                               prefill=max(0.0, t_first - t_sched), decode=max(0.0, t_last - t_first),
                               inference=max(0.0, t_last - t_sched), prompt_len=r.prompt_len,
                               gen_len=r.num_output, max_tokens_param=live.max_tokens_param)

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
    def crash(self, cause: str) -> None:
        if self.dead:
            return
        self.dead = True
        log = self.log
        log.error("core.py:1142", "EngineCore encountered a fatal error.", ENGINE)
        log.error("core.py:1142", "Traceback (most recent call last):\n"
                  "  (sim_server: simulated fault inside EngineCore)\n"
                  f"RuntimeError: {cause}", ENGINE)
        log.error("async_llm.py:480", "AsyncLLM output_handler failed.\nTraceback (most recent call last):\n"
                  f"vllm.v1.engine.exceptions.EngineDeadError: {_ENGINE_DEAD_MSG}")
        body = error_body(_ENGINE_DEAD_MSG, "InternalServerError", 500)
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
            report_startup_error(SimStartupError(
                "engine", "torch.OutOfMemoryError",
                f"CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total capacity of "
                f"{opts.gpu.memory_bytes / (1 << 30):.2f} GiB of which 1.02 GiB is free. "
                "(sim_server fault: --sim-fail-at-start)",
                log_before=["Failed to load model - not enough GPU memory. Try lowering "
                            "--gpu-memory-utilization to free memory for weights, increasing "
                            "--tensor-parallel-size, or using --quantization."]), log)
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
        app._server = server
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
