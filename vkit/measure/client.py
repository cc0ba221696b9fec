"""The streaming HTTP client of bench_stream: stdlib ``http.client``, one persistent
connection per worker thread, SSE read line by line.

Why not requests for the streams: measured on these machines, urllib3's chunked
streaming read path makes a threaded requests client ~40% heavier on the CPU than
vLLM's own client at 32 streams, and on a small box that CPU is taken from the server
being measured. ``http.client`` with ``readline`` is as light as vLLM's asyncio client.

Timing follows ``vllm bench serve`` (vllm/benchmarks/lib/endpoint_request_func.py):
the clock starts just before the request is written; for completions every SSE message
with ``choices`` is a token event, for chat only deltas with content; TTFT is the first
event, ITL the gaps between events, E2EL the last content event. Token counts come
from ``usage`` (``stream_options.include_usage``), never from counting events.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Result:
    """What one request did. Times are seconds on the ``perf_counter`` clock."""

    index: int
    ok: bool = False
    status: int | None = None
    error: str | None = None
    start: float = 0.0  # perf_counter just before the request was written
    ttft: float | None = None  # first token event - start
    latency: float | None = None  # last token event - start (vLLM's E2EL)
    done: float | None = None  # [DONE] (or end of body) - start
    itl: list = field(default_factory=list)  # gaps between token events
    events: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    event_times: list = field(default_factory=list)  # offsets from start of each token event
    rid: str | None = None  # the response's id (first event), to join with server-side logs


def error_message(body: bytes) -> str:
    """The ``error.message`` of an OpenAI/vLLM error body, else the body's first line."""
    try:
        obj = json.loads(body)
        err = obj.get("error", obj) if isinstance(obj, dict) else obj
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(obj, dict) and obj.get("detail"):
            return str(obj["detail"])
    except (ValueError, AttributeError):
        pass
    text = body.decode("utf-8", "replace").strip()
    return text.splitlines()[0][:300] if text else "(empty body)"


class StreamClient:
    """Thread-safe: each thread keeps its own keep-alive connection."""

    def __init__(self, base_url: str, api_key: str | None = None, stall_timeout: float = 60.0, connect_timeout: float = 10.0):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {base_url}")
        self.scheme = u.scheme
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.prefix = u.path.rstrip("/")
        self.stall_timeout = stall_timeout
        self.connect_timeout = connect_timeout
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"  # never logged
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        c = getattr(self._local, "conn", None)
        if c is None:
            cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
            c = cls(self.host, self.port, timeout=self.connect_timeout)
            c.connect()
            c.sock.settimeout(self.stall_timeout)
            c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._local.conn = c
        return c

    def _drop(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None:
            try:
                c.close()
            finally:
                self._local.conn = None

    def close(self) -> None:
        self._drop()

    def post(self, path: str, body: dict, stream: bool, chat: bool, index: int = 0) -> Result:
        """Send one request and read its response; every failure is recorded in the result, never raised."""
        r = Result(index=index)
        try:
            self._post(path, json.dumps(body).encode(), stream, chat, r)
        except Exception as e:  # noqa: BLE001 - a worker must survive anything one response does
            r.ok = False
            r.error = r.error or f"client error: {type(e).__name__}: {e}"
            self._drop()
        return r

    def _post(self, path: str, payload: bytes, stream: bool, chat: bool, r: Result) -> None:
        for attempt in (0, 1):  # one retry only for a keep-alive connection the server closed while idle
            try:
                conn = self._conn()
                r.start = time.perf_counter()
                conn.request("POST", self.prefix + path, body=payload, headers=self._headers)
                resp = conn.getresponse()
                break
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
                self._drop()
                if attempt:
                    r.error = f"connection lost: {e}"
                    return
            except socket.timeout:
                self._drop()
                r.error = f"no response for {self.stall_timeout:g} s"
                return
            except OSError as e:
                self._drop()
                r.error = f"cannot connect to {self.host}:{self.port}: {e.strerror or e}"
                return
        r.status = resp.status
        try:
            if resp.status != 200:
                r.error = f"HTTP {resp.status}: {error_message(resp.read())}"
            elif stream:
                self._read_stream(resp, r, chat)
            else:
                self._read_whole(resp, r)
        except socket.timeout:
            r.error = f"no data for {self.stall_timeout:g} s (stream stalled)"
        except (http.client.HTTPException, OSError) as e:
            r.error = f"stream cut: {type(e).__name__}: {e}"
        if r.error is not None or resp.will_close or not resp.isclosed():
            # Anything but a fully read response leaves the connection in an unknown state.
            self._drop()

    @staticmethod
    def _read_whole(resp, r: Result) -> None:
        body = resp.read()
        SSEState.whole(r, body, time.perf_counter())

    @staticmethod
    def _read_stream(resp, r: Result, chat: bool) -> None:
        st = SSEState(r, chat)
        pc = time.perf_counter
        readline = resp.readline
        while True:
            line = readline()
            if not line:
                break
            if st.line(line, pc()):
                if st.done:
                    resp.read()  # drain the terminating chunk so the connection can be reused
                break
        st.finish()


class SSEState:
    """One response's server-sent events, read into its :class:`Result`; both transports use it.

    Every SSE message with ``choices`` is a token event for completions; for chat only
    deltas with content count (as ``vllm bench serve``). An error event is recorded and
    reading goes on to ``[DONE]`` (vLLM sends one after the error); a malformed event ends
    the response (``fatal``).
    """

    __slots__ = ("r", "chat", "tail", "last", "done", "fatal")

    def __init__(self, r: Result, chat: bool):
        self.r, self.chat = r, chat
        self.tail = b""
        self.last: float | None = None
        self.done = False
        self.fatal = False

    def feed(self, data: bytes, t: float) -> bool:
        """Bytes that arrived by time ``t``; True once the stream is over ([DONE] or fatal)."""
        if self.tail:
            data = self.tail + data
        lines = data.split(b"\n")
        self.tail = lines.pop()
        for line in lines:
            if self.line(line, t):
                return True
        return False

    def line(self, line: bytes, t: float) -> bool:
        """One SSE line read at time ``t``; True once the stream is over."""
        if not line.startswith(b"data:"):
            return False  # blank separators, comments, event:/id: fields
        data = line[5:].strip()
        r = self.r
        if data == b"[DONE]":
            r.done = t - r.start
            self.done = True
            return True
        last = self.last
        if (last is not None and not self.chat and b'"finish_reason":null' in data and b'"choices":[{' in data
                and b'"usage"' not in data and b'"error"' not in data and data[:1] == b"{" and data[-1:] == b"}"):
            # A completions token event in vLLM's compact form, neither the last nor carrying usage or an
            # error: what json.loads would conclude, at a tenth of the cost. Inside a JSON string these
            # patterns can only appear escaped (\"), so text content never matches them; any other
            # spelling falls through to the full parse.
            r.itl.append(t - last)
            r.event_times.append(t - r.start)
            r.events += 1
            self.last = t
            return False
        try:
            obj = json.loads(data)
        except ValueError:
            r.error = f"malformed SSE event: {data[:80]!r}"
            self.fatal = True
            return True
        if "error" in obj:
            err = obj["error"]
            r.error = "error event: " + (err.get("message", str(err)) if isinstance(err, dict) else str(err))
            return False  # vLLM sends [DONE] after an error event; read on to it
        choices = obj.get("choices")
        if choices:
            c0 = choices[0]
            if self.chat:
                d = c0.get("delta") or {}
                counted = bool(d.get("content") or d.get("reasoning_content"))
            else:
                counted = True
            if counted:
                last = self.last
                if last is None:
                    r.ttft = t - r.start
                    r.rid = obj.get("id")
                else:
                    r.itl.append(t - last)
                r.event_times.append(t - r.start)
                r.events += 1
                self.last = t
            if c0.get("finish_reason"):
                r.finish_reason = c0["finish_reason"]
        usage = obj.get("usage")
        if usage:
            r.prompt_tokens = usage.get("prompt_tokens")
            r.completion_tokens = usage.get("completion_tokens")
        return False

    def finish(self) -> None:
        """The body ended: decide whether the request succeeded."""
        r = self.r
        if r.error is not None:
            return
        if not self.done:
            r.error = "stream ended before [DONE]"
        elif self.last is None:
            r.error = "no token event before [DONE]"
        else:
            r.latency = self.last - r.start
            r.ok = True

    @staticmethod
    def whole(r: Result, body: bytes, t: float) -> None:
        """A non-streamed response read completely at time ``t``."""
        t -= r.start
        try:
            obj = json.loads(body)
        except ValueError:
            r.error = "malformed JSON body"
            return
        # Without streaming there are only two time points: first token and last are the same.
        r.ttft = r.latency = r.done = t
        r.rid = obj.get("id")
        usage = obj.get("usage") or {}
        r.prompt_tokens = usage.get("prompt_tokens")
        r.completion_tokens = usage.get("completion_tokens")
        ch = obj.get("choices") or [{}]
        r.finish_reason = ch[0].get("finish_reason")
        r.events = 1
        r.ok = True


def request_body(req: Any, model: str, chat: bool, stream: bool, max_tokens: int | None = None) -> dict:
    """The JSON body for a ``vkit.measure.datasets.Request``, as ``vllm bench serve`` sends it."""
    body: dict = {"model": model, "stream": stream, "temperature": 0.0}
    if stream:
        body["stream_options"] = {"include_usage": True}
    n = max_tokens if max_tokens is not None else req.output_len
    if chat:
        body["messages"] = req.messages if req.messages is not None else [{"role": "user", "content": str(req.prompt)}]
        if n is not None:
            body["max_completion_tokens"] = n
    else:
        body["prompt"] = req.prompt
        if n is not None:
            body["max_tokens"] = n
    if req.ignore_eos:
        body["ignore_eos"] = True
    prio = (getattr(req, "extra", None) or {}).get("priority")
    if prio is not None:
        body["priority"] = int(prio)  # vLLM's completions and chat field (--scheduling-policy priority)
    return body
