"""The simulator's OpenAI-compatible API: vLLM's endpoints over the simulated engine.

:class:`SimApi` routes each parsed request (``/v1/completions``, ``/v1/chat/completions``,
``/v1/models``, ``/version``, ``/health``, ``/ping``, ``/metrics``, ``/sim/stats``), validates
generation requests with vLLM's error texts and maps each to an engine
:class:`~vkit.sim.engine.Request` with its server-side :class:`Live` state and sink (SSE:
:class:`~vkit.sim.http.StreamSink`; one JSON body: :class:`FullSink`). The engine, the clock
mapping virtual to wall time and the loop that runs them come from its subclass
:class:`vkit.sim.serve.SimApp`.
"""

from __future__ import annotations

import json
import os
import random
import time
import traceback
import urllib.parse
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vkit import __version__ as VKIT_VERSION
from vkit.sim import smi
from vkit.sim.config import Resolved, ServeOptions
from vkit.sim.engine import Request
from vkit.sim.http import REASONS, BadRequest, Conn, StreamSink, error_body, response_head
from vkit.sim.settings import SimSettings
from vkit.sim.tokenizer import Tokenizer, render_chat
from vkit.sim.vlog import VllmLog

if TYPE_CHECKING:
    import asyncio
    from collections import deque

    from vkit.sim.engine import Engine
    from vkit.sim.metrics import Metrics

VLLM_VERSION = "0.32.0"
SIM_VERSION = VLLM_VERSION + "+sim"
ENGINE_DEAD_MSG = "EngineCore encountered an issue. See stack trace (above) for the root cause."
# the simulated boards' vendor tools (vkit.sim.smi; the shims in vkit/data/smi and vkit/data/smi-ascend)
SMI_PATHS = {"/sim/nvidia-smi": "nvidia-smi", "/sim/npu-smi": "npu-smi"}


def _percentile(sorted_vals: list[float], q: float) -> float:
    if not sorted_vals:
        return 0.0
    k = (len(sorted_vals) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (k - lo)


def cpu_seconds() -> float:
    """CPU time of this process (user + system), seconds."""
    t = os.times()
    return t.user + t.system


# -- per-request state on the server side --------------------------------------------------

@dataclass(frozen=True)
class Parsed:
    """A generation request as validated: what the engine is asked to do."""

    ids: list[int]
    max_tokens: int
    max_tokens_param: int | None  # the request's own max_tokens (None: up to max_model_len)
    min_tokens: int
    priority: int
    ignore_eos: bool
    stream: bool
    stream_options: dict


class Live:
    """Server-side state of one in-flight request (kept in ``Request.user``)."""

    __slots__ = ("req", "conn", "sink", "t_arrival", "t_sched", "t_first", "t_last", "max_tokens_param", "done")

    def __init__(self, conn: Conn, t_arrival: float, max_tokens_param: int | None):
        self.req: Request | None = None
        self.conn = conn
        self.sink: Any = None
        self.t_arrival = t_arrival
        self.t_sched: float | None = None
        self.t_first: float | None = None
        self.t_last: float | None = None
        self.max_tokens_param = max_tokens_param
        self.done = False


class FullSink:
    """Collects the text of a non-streaming request and answers once it finishes."""

    __slots__ = ("conn", "chat", "rid", "created", "model", "prompt_len", "pieces", "app")

    def __init__(self, conn: Conn, chat: bool, rid: str, created: int, model: str, prompt_len: int, app: SimApi):
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


# -- the application's front end -------------------------------------------------------------

class SimApi:
    """vLLM's HTTP API over the engine: routing, endpoints, request validation and mapping.

    The engine and its loop are the subclass's (:class:`vkit.sim.serve.SimApp`); this class reads
    the attributes below and calls ``vnow`` and ``crash``, which the subclass defines.
    """

    engine: Engine
    metrics: Metrics
    wake: asyncio.Event
    dead: bool
    speed: float
    lags: deque[float]
    req_times: deque[tuple]
    reanchors: int
    stats_t0: float
    cpu_t0: float

    def __init__(self, opts: ServeOptions, resolved: Resolved, settings: SimSettings, log: VllmLog):
        self.opts = opts
        self.cfg = resolved
        self.s = settings
        self.log = log
        self.names = resolved.served_model_names
        self.model_name = self.names[0]
        self.model_json = json.dumps(self.model_name)
        self.tok = Tokenizer(opts.model_profile.vocab)
        self.rng = random.Random(settings.seed ^ 0x5EED)
        self.conns: set[Conn] = set()
        self.admitted = 0
        self._rid = 0
        self._rid_prefix = os.urandom(8).hex()
        self.created_models = int(time.time())
        self.smi: smi.SmiBoards | None = None  # the boards nvidia-smi shows, from the first /sim/nvidia-smi

    def vnow(self, w: float | None = None) -> float:
        """Virtual time at wall time ``w`` (now when None)."""
        raise NotImplementedError

    def crash(self, cause: str, exc: str = "RuntimeError") -> None:
        """The engine dies (``exc``: the exception type its log shows): fail what is in flight, exit 1 soon after."""
        raise NotImplementedError

    # -- responses ----------------------------------------------------------------------------
    def _access(self, conn: Conn, status: int) -> None:
        if self.s.access_log and conn.req_line:
            self.log.uvicorn(f'{conn.peer} - "{conn.req_line}" {status} {REASONS.get(status, b"").decode()}')

    def send_bytes(self, conn: Conn, status: int, ctype: bytes, body: bytes) -> None:
        if conn.closed:
            return
        self._access(conn, status)
        conn.write(response_head(status, ctype, len(body), conn.keep_alive) + body)
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
            if method != "GET" and path in ("/version", "/v1/models", "/metrics", "/sim/stats", *SMI_PATHS):
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
            if path in SMI_PATHS:
                return self.send_json(conn, 200, self.vendor_smi(query, SMI_PATHS[path]))
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
            "sim_model": s.model_name, "sim_seed": s.seed, "sim_noise": s.noise, "sim_restart_noise": s.effective_restart_noise, "sim_start": s.start_index, "sim_drift": s.drift_per_hour, "sim_drift_since": s.drift_since, "sim_slowdown": s.slowdown, "sim_slowdown_after_s": s.slowdown_after_s,
            "sim_pathology": s.pathology, "sim_profile": s.profile_path, "sim_quantization": self.opts.quantization,
            "sim_hidden_effects": s.hidden_seed,
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

    def vendor_smi(self, query: str, tool: str) -> dict:
        """``nvidia-smi ARGS`` or ``npu-smi ARGS`` on the simulated boards (``args``: a JSON list; :mod:`vkit.sim.smi`):
        the boards' own vendor's tool answers; the other is not installed on such a machine (exit 127)."""
        if tool != smi.tool_of(self.opts.gpu.name):
            return {"stdout": "", "rc": 127}
        try:
            args = json.loads(urllib.parse.parse_qs(query).get("args", ["[]"])[0])
        except ValueError:
            args = None
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise BadRequest("args must be a JSON list of strings", "args")
        w = time.perf_counter()
        v = self.vnow(w)
        if self.smi is None:
            gpu, mib = self.opts.gpu, float(1 << 20)
            self.smi = smi.SmiBoards(self.engine.meter, gpu.device_name, gpu.memory_bytes / mib,
                                     round(gpu.memory_bytes * self.opts.gpu_memory_utilization / mib), v, w)
        out, rc = smi.ANSWERS[tool](args, self.smi.devices(w, v))
        return {"stdout": out, "rc": rc}

    def sim_stats(self, reset: bool = False, requests: bool = False) -> dict:
        lags = sorted(self.lags)
        now = time.perf_counter()
        cpu = cpu_seconds()
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

    def parse(self, raw: bytes, chat: bool) -> Parsed:
        """A generation request's body validated as vLLM validates it (``BadRequest`` with vLLM's
        words otherwise), and the fault of ``--sim-error-rate`` drawn."""
        if self.dead:
            raise BadRequest(ENGINE_DEAD_MSG, None, 500, "InternalServerError")
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
        return Parsed(ids, max_tokens, mt, min_tokens, priority, ignore_eos, stream, so)

    def next_rid(self, chat: bool) -> str:
        self._rid += 1
        return f"{'chatcmpl' if chat else 'cmpl'}-{self._rid_prefix}{self._rid:08x}"

    def engine_request(self, p: Parsed, rid: str, arrival: float, user: Any) -> Request:
        """The engine's request for a parsed one arriving at virtual time ``arrival``: its natural
        length (where EOS falls when it is not ignored) and its text drawn from its prompt."""
        h = hash(tuple(p.ids))
        mean = self.s.output_len_mean
        natural = 1 + (h >> 8) % (2 * mean) if mean > 0 else 0
        return Request(rid, p.ids, p.max_tokens, min_tokens=p.min_tokens, ignore_eos=p.ignore_eos, natural_len=natural,
                       priority=p.priority, arrival=arrival, text_seed=h & 0xFFFF, user=user)

    def generate(self, conn: Conn, raw: bytes, chat: bool) -> None:
        p = self.parse(raw, chat)
        malformed = self._admit(p.stream)
        rid = self.next_rid(chat)
        created = int(time.time())
        t_arrival = min(conn.t_rx, time.perf_counter()) if conn.t_rx else time.perf_counter()
        live = Live(conn, t_arrival, p.max_tokens_param)
        plen = len(p.ids)
        if p.stream:
            live.sink = StreamSink(conn, chat, rid, created, self.model_json, bool(p.stream_options.get("include_usage")),
                                   bool(p.stream_options.get("continuous_usage_stats")), plen, self.s.stall_stream_after,
                                   malformed=malformed)
        else:
            live.sink = FullSink(conn, chat, rid, created, self.model_name, plen, self)
        req = self.engine_request(p, rid, self.vnow(t_arrival), live)
        live.req = req
        conn.live = live
        if p.stream:
            self._access(conn, 200)
            conn.write(response_head(200, b"text/event-stream; charset=utf-8", None, conn.keep_alive))
        self.engine.add_request(req)
        self.wake.set()

    def _admit(self, stream: bool) -> bool:
        """Count a valid request in and apply the request-numbered faults: the engine dies at the
        (N+1)-th (--sim-crash-after), a burst of them is answered 500 (--sim-error-burst); True when
        this one's stream is to open with an event that is not JSON (--sim-malformed-sse-after)."""
        self.admitted += 1
        if self.s.crash_after is not None and self.admitted > self.s.crash_after:
            self.crash(f"simulated engine failure after {self.s.crash_after} requests (--sim-crash-after)")
            raise BadRequest(ENGINE_DEAD_MSG, None, 500, "InternalServerError")
        burst = self.s.error_burst
        if burst is not None and burst[0] < self.admitted <= burst[0] + burst[1]:
            if self.admitted == burst[0] + 1:
                self.log.warning("api_server.py:1", f"simulated 5xx burst: requests {burst[0] + 1} to {sum(burst)} "
                                                    "answered 500 (--sim-error-burst)")
            raise BadRequest("Internal server error (sim_server fault: --sim-error-burst)", None, 500, "InternalServerError")
        malformed = stream and self.s.malformed_sse_after is not None and self.admitted == self.s.malformed_sse_after + 1
        if malformed:
            self.log.warning("api_server.py:1", f"simulated malformed SSE event: request {self.admitted} opens its stream "
                                                "with an event that is not JSON (--sim-malformed-sse-after)")
        return malformed

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
