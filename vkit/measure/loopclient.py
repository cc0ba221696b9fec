"""bench_stream's default transport: every stream on one thread, non-blocking sockets and
one ``selectors`` loop, HTTP/1.1 keep-alive and chunked decoding written out here.

Why: a thread per stream pays a GIL hand-off and a wake-up for every SSE event; on a
2-core box that CPU is taken from the server being measured. One loop reads all ready
sockets back to back, so several events cost one wake-up (measured side by side with
``vllm bench serve`` in ``bench/bench_client.py``).

Timing: each socket's bytes are stamped with ``perf_counter()`` right after its
``recv`` returns, before any parsing, so a busy batch does not delay the stamps of the
sockets read after it by their parsing time. The clock starts just before the request's
first byte is sent (as ``vllm bench serve``). SSE events are handled by
``vkit.measure.client.SSEState``, the same code the threaded transport uses.

Plain ``http://`` only; ``https://`` URLs use the threaded transport
(``vkit.measure.client.StreamClient``).
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import time
import urllib.parse

from vkit.measure.client import Result, SSEState, error_message

_READ = selectors.EVENT_READ
_WRITE = selectors.EVENT_WRITE
_RECV = 262144


class _Conn:
    """One TCP connection and the response being read on it."""

    __slots__ = ("sock", "fd", "connected", "reused", "out", "r", "sse", "stream", "chat", "payload", "t_io",
                 "buf", "head_done", "status", "chunked", "clen", "close_after", "body", "chunk_left", "need_crlf",
                 "finished", "got_bytes", "trailer")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.fd = sock.fileno()
        self.connected = False
        self.reused = False
        self.r: Result | None = None

    def begin(self, r: Result, payload: bytes, stream: bool, chat: bool) -> None:
        self.r, self.payload, self.stream, self.chat = r, payload, stream, chat
        self.sse = SSEState(r, chat) if stream else None
        self.out = b""
        self.buf = b""
        self.head_done = False
        self.status = None
        self.chunked = False
        self.clen = None
        self.close_after = False
        self.body = []
        self.chunk_left = 0
        self.need_crlf = False
        self.finished = False
        self.got_bytes = False
        self.trailer = False


class LoopClient:
    """Start requests with :meth:`start`, then call :meth:`poll` until they end.

    ``poll`` returns the results that ended; every failure is recorded in its result,
    never raised. Idle connections are kept alive and reused.
    """

    def __init__(self, base_url: str, api_key: str | None = None, stall_timeout: float = 60.0, connect_timeout: float = 10.0):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"the loop transport speaks plain http only: {base_url}")
        self.host = u.hostname
        self.port = u.port or 80
        self.prefix = u.path.rstrip("/")
        self.stall_timeout = stall_timeout
        self.connect_timeout = connect_timeout
        host_hdr = self.host if self.port == 80 else f"{self.host}:{self.port}"
        if ":" in self.host and not self.host.startswith("["):
            host_hdr = f"[{self.host}]" + ("" if self.port == 80 else f":{self.port}")
        self._head = (
            f"Host: {host_hdr}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
            + (f"Authorization: Bearer {api_key}\r\n" if api_key else "")  # never logged
        ).encode("latin-1")
        self._addr = None
        self.sel = selectors.DefaultSelector()
        self.idle: list[_Conn] = []
        self.busy: dict[int, _Conn] = {}
        self._next_check = 0.0
        self._finished: list[Result] = []

    # -- public -----------------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return len(self.busy)

    def start(self, path: str, payload: bytes, stream: bool, chat: bool, index: int = 0) -> Result:
        """Begin one request; the result is returned by :meth:`poll` when it ends."""
        r = Result(index=index)
        head = b"POST %s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n" % ((self.prefix + path).encode(), self._head, len(payload))
        self._launch(self.idle.pop() if self.idle else None, r, head + payload, stream, chat)
        return r

    def poll(self, timeout: float) -> list[Result]:
        """Wait up to ``timeout`` s for I/O; return the results that ended meanwhile."""
        done = self._finished
        self._finished = []
        if done:
            timeout = 0.0
        pc = time.perf_counter
        events = self.sel.select(max(0.0, timeout))
        reads = []
        for key, mask in events:
            c = key.data
            if mask & _WRITE:
                self._writable(c)
            if mask & _READ and c.sock is not None:
                try:
                    data = c.sock.recv(_RECV)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError as e:
                    data = e
                reads.append((c, data, pc()))
        for c, data, t in reads:
            self._feed(c, data, t)
        now = pc()
        if now >= self._next_check:
            self._next_check = now + 0.25
            self._check_stalls(now)
        if self._finished:
            done.extend(self._finished)
            self._finished = []
        return done

    def abort_all(self, reason: str) -> list[Result]:
        """End every request in flight with ``reason``; returns their results."""
        out = []
        for c in list(self.busy.values()):
            c.r.error = c.r.error or reason
            out.append(c.r)
            self._close(c)
        out.extend(self._finished)
        self._finished = []
        return out

    def close(self) -> None:
        for c in list(self.busy.values()) + self.idle:
            self._close(c)
        self.idle = []
        self.sel.close()

    # -- connections ------------------------------------------------------------------------------
    def _launch(self, c: _Conn | None, r: Result, msg: bytes, stream: bool, chat: bool) -> None:
        """Send ``msg`` for ``r`` on ``c`` (an idle kept-alive connection) or on a new connection;
        the clock starts just before the first byte goes out (after a pending connect)."""
        if c is None:
            c = self._connect(r)
            if c is None:
                self._finished.append(r)
                return
        c.begin(r, msg, stream, chat)
        self.busy[c.fd] = c
        c.t_io = time.perf_counter()
        if c.connected:
            r.start = c.t_io
            self._send(c, msg)
        else:
            self.sel.modify(c.sock, _READ | _WRITE, c)


    def _connect(self, r: Result) -> _Conn | None:
        if self._addr is None:
            try:
                self._addr = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0]
            except OSError as e:
                r.error = f"cannot connect to {self.host}:{self.port}: {e.strerror or e}"
                return None
        fam, typ, proto, _, addr = self._addr
        s = socket.socket(fam, typ, proto)
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c = _Conn(s)
        err = s.connect_ex(addr)
        if err == 0:
            c.connected = True
        elif err not in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
            s.close()
            r.error = f"cannot connect to {self.host}:{self.port}: {errno.errorcode.get(err, err)} {os.strerror(err)}"
            return None
        self.sel.register(s, _READ, c)
        return c

    def _writable(self, c: _Conn) -> None:
        if c.r is None or c.sock is None:
            return
        if not c.connected:
            err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._fail(c, f"cannot connect to {self.host}:{self.port}: {os.strerror(err)}")
                return
            c.connected = True
            c.r.start = time.perf_counter()
            c.t_io = c.r.start
            self._send(c, c.payload)
            return
        self._send(c, c.out)

    def _send(self, c: _Conn, data: bytes) -> None:
        try:
            n = c.sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as e:
            self._retry_or_fail(c, f"connection lost: {e.strerror or e}")
            return
        c.out = data[n:]
        self.sel.modify(c.sock, _READ | _WRITE if c.out else _READ, c)

    def _close(self, c: _Conn) -> None:
        self.busy.pop(c.fd, None)
        if c.sock is not None:
            try:
                self.sel.unregister(c.sock)
            except (KeyError, ValueError):
                pass
            c.sock.close()
            c.sock = None

    def _fail(self, c: _Conn, msg: str) -> None:
        c.finished = True
        r = c.r
        r.ok = False
        r.error = r.error or msg
        self._close(c)
        self._finished.append(r)

    def _retry_or_fail(self, c: _Conn, msg: str) -> None:
        """A kept-alive connection the server closed while idle: resend once on a new one."""
        if c.reused and not c.got_bytes:
            r, payload, stream, chat = c.r, c.payload, c.stream, c.chat
            self._close(c)
            self._launch(None, r, payload, stream, chat)
            return
        self._fail(c, msg)

    def _check_stalls(self, now: float) -> None:
        for c in list(self.busy.values()):
            if now - c.t_io > (self.stall_timeout if c.connected else self.connect_timeout):
                if not c.connected:
                    self._fail(c, f"cannot connect to {self.host}:{self.port}: timed out")
                elif c.got_bytes:
                    self._fail(c, f"no data for {self.stall_timeout:g} s (stream stalled)")
                else:
                    self._fail(c, f"no response for {self.stall_timeout:g} s")

    # -- the response -----------------------------------------------------------------------------
    def _feed(self, c: _Conn, data, t: float) -> None:
        if c.sock is None:
            return
        if c.r is None:  # an idle kept-alive connection: the server closed it (or sent junk)
            self._close(c)
            if c in self.idle:
                self.idle.remove(c)
            return
        if isinstance(data, OSError):
            self._retry_or_fail(c, f"connection lost: {data.strerror or data}")
            return
        if not data:
            if not c.got_bytes:
                self._retry_or_fail(c, "connection lost: the server closed the connection without a response")
            elif c.head_done and c.clen is None and not c.chunked:
                self._end(c, t, keep=False)  # body delimited by the close
            else:
                self._fail(c, "stream ended before [DONE]" if c.stream and c.status == 200 else "connection lost: body cut short")
            return
        c.got_bytes = True
        c.t_io = t
        buf = c.buf + data if c.buf else data
        if not c.head_done:
            i = buf.find(b"\r\n\r\n")
            if i < 0:
                if len(buf) > 65536:
                    self._fail(c, "malformed HTTP response: header too long")
                    return
                c.buf = buf
                return
            if not self._head_parse(c, buf[:i]):
                return
            buf = buf[i + 4:]
        c.buf = b""
        if c.chunked:
            self._dechunk(c, buf, t)
        elif c.clen is not None:
            take = buf[:c.clen]
            c.clen -= len(take)
            self._payload(c, take, t)
            if c.clen == 0 and not c.finished and c.sock is not None:
                self._end(c, t, keep=not c.close_after)
        else:
            self._payload(c, buf, t)

    def _head_parse(self, c: _Conn, head: bytes) -> bool:
        lines = head.split(b"\r\n")
        parts = lines[0].split(None, 2)
        try:
            c.status = int(parts[1])
        except (IndexError, ValueError):
            self._fail(c, f"malformed HTTP response: {lines[0][:80]!r}")
            return False
        c.r.status = c.status
        c.close_after = parts[0] == b"HTTP/1.0"
        for ln in lines[1:]:
            k, _, v = ln.partition(b":")
            k = k.strip().lower()
            v = v.strip().lower()
            if k == b"transfer-encoding" and b"chunked" in v:
                c.chunked = True
            elif k == b"content-length":
                try:
                    c.clen = int(v)
                except ValueError:
                    self._fail(c, "malformed HTTP response: bad Content-Length")
                    return False
            elif k == b"connection":
                c.close_after = b"close" in v or (c.close_after and b"keep-alive" not in v)
        if c.chunked:
            c.clen = None
        c.head_done = True
        return True

    def _dechunk(self, c: _Conn, buf: bytes, t: float) -> None:
        pos, n = 0, len(buf)
        while pos < n and not c.finished:
            if c.trailer:  # after the last chunk: trailers end with an empty line
                i = buf.find(b"\r\n", pos)
                if i < 0:
                    break
                line = buf[pos:i]
                pos = i + 2
                if not line:
                    self._end(c, t, keep=not c.close_after)
                    return
                continue
            if c.need_crlf:
                if n - pos < 2:
                    break
                pos += 2
                c.need_crlf = False
                continue
            if c.chunk_left:
                take = min(c.chunk_left, n - pos)
                self._payload(c, buf[pos:pos + take], t)
                if c.sock is None:
                    return
                c.chunk_left -= take
                pos += take
                if c.chunk_left == 0:
                    c.need_crlf = True
                continue
            i = buf.find(b"\r\n", pos)
            if i < 0:
                break
            try:
                size = int(buf[pos:i].split(b";", 1)[0], 16)
            except ValueError:
                self._fail(c, "malformed HTTP response: bad chunk size")
                return
            pos = i + 2
            if size == 0:
                c.trailer = True
            else:
                c.chunk_left = size
        if not c.finished and c.sock is not None:
            c.buf = buf[pos:]

    def _payload(self, c: _Conn, data: bytes, t: float) -> None:
        if not data:
            return
        if c.sse is not None and c.status == 200:
            if c.sse.feed(data, t) and c.sse.fatal:  # a malformed event: the response is abandoned
                self._fail(c, c.r.error)
        else:
            c.body.append(data)

    def _end(self, c: _Conn, t: float, keep: bool) -> None:
        """The response body ended."""
        c.finished = True
        r = c.r
        if c.status != 200:
            r.error = f"HTTP {c.status}: {error_message(b''.join(c.body))}"
        elif c.sse is not None:
            c.sse.finish()
        else:
            SSEState.whole(r, b"".join(c.body), t)
        c.r = None
        self.busy.pop(c.fd, None)
        self._finished.append(r)
        if keep and r.error is None:
            c.reused = True
            c.payload = b""
            self.idle.append(c)
        else:
            self._close(c)
