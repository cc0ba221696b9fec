"""The simulator's HTTP/1.1 side: connections, request parsing, responses, chunked SSE framing.

:class:`Conn` parses one request at a time off a keep-alive connection (later pipelined ones
wait) and hands it to the application's ``handle``; :class:`StreamSink` writes one request's
tokens as SSE events in HTTP chunks, concatenating pre-built bytes on the per-token path.
``error_body`` and :class:`BadRequest` are the OpenAI-style error bodies the endpoints answer with.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any, Protocol


class Live(Protocol):
    """What a connection knows of the request it is streaming (:class:`vkit.sim.api.Live`)."""

    done: bool


class App(Protocol):
    """What a connection needs of the application behind it (:class:`vkit.sim.serve.SimApp`): the
    connection set, the request handler, JSON answers, aborting a request whose client left, and
    the wall time an arriving request counts from."""

    conns: set

    def handle(self, conn: Conn, method: str, path: str, query: str, headers: dict, body: bytes) -> None: ...

    def send_json(self, conn: Conn, status: int, obj: Any) -> None: ...

    def abort(self, live: Any) -> None: ...

    def ready_at(self) -> float: ...

REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 405: b"Method Not Allowed",
           411: b"Length Required", 413: b"Request Entity Too Large", 500: b"Internal Server Error",
           503: b"Service Unavailable"}


def error_body(message: str, err_type: str, code: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, code: int = 400, err_type: str = "BadRequestError"):
        super().__init__(message)
        self.body = error_body(message, err_type, code, param)
        self.code = code


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def response_head(status: int, ctype: bytes, length: int | None, keep_alive: bool) -> bytes:
    """A response's status line and headers; ``length`` None: a chunked body follows."""
    h = [b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, b"OK")), b"server: uvicorn\r\n"]
    if ctype:
        h.append(b"content-type: " + ctype + b"\r\n")
    if length is None:
        h.append(b"transfer-encoding: chunked\r\n")
    else:
        h.append(b"content-length: %d\r\n" % length)
    if not keep_alive:
        h.append(b"connection: close\r\n")
    h.append(b"\r\n")
    return b"".join(h)


# -- the SSE stream of one request -----------------------------------------------------------

class StreamSink:
    """Writes one request's SSE events. The token fast path concatenates pre-built bytes."""

    __slots__ = ("conn", "chat", "pre", "mid", "tail", "rid", "created", "model_json", "include_usage",
                 "continuous", "prompt_len", "stall_after", "stalled", "role_sent", "malformed")

    def __init__(self, conn: Conn, chat: bool, rid: str, created: int, model_json: str, include_usage: bool,
                 continuous: bool, prompt_len: int, stall_after: int | None, malformed: bool = False):
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
        self.malformed = malformed  # the fault --sim-malformed-sse-after: the first event is not JSON
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
        if self.malformed:
            self.malformed = False
            payload = b'data: {"id":"' + self.rid.encode() + b'","choices":[{"index":0,"text":\n\n'
            return _chunk(payload) + (self.render(text, finish, n_out) or b"")
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


# -- HTTP/1.1 connection ---------------------------------------------------------------------

class Conn(asyncio.Protocol):
    """One client connection: parses requests, one at a time (later pipelined ones wait)."""

    MAX_HEAD = 64 * 1024
    MAX_BODY = 64 * 1024 * 1024

    def __init__(self, app: App):
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
        self.app.send_json(self, status, {"detail": REASONS.get(status, b"Error").decode()})
