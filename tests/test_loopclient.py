"""The one-thread transport's HTTP/1.1 reading, against a raw socket server that splits its
responses at arbitrary bytes, closes idle keep-alive connections, and answers with each body
framing (chunked, Content-Length, close-delimited)."""

from __future__ import annotations

import json
import random
import socket
import threading
import time

import pytest

from vkit.measure.loopclient import LoopClient


def _events(n: int) -> bytes:
    out = b""
    for k in range(n):
        ev = {"id": "cmpl-x", "choices": [{"index": 0, "text": f" t{k}", "finish_reason": "length" if k == n - 1 else None}]}
        out += b"data: " + json.dumps(ev).encode() + b"\n\n"
    out += b'data: {"id": "cmpl-x", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": %d}}\n\n' % n
    return out + b"data: [DONE]\n\n"


def _chunked(body: bytes, pieces: int = 3) -> bytes:
    out, step = b"", max(1, len(body) // pieces)
    for i in range(0, len(body), step):
        part = body[i:i + step]
        out += b"%x;ext=1\r\n%s\r\n" % (len(part), part)
    return out + b"0\r\nX-Trailer: 1\r\n\r\n"


class RawServer:
    """Answers requests in turn from a script; each answer is (head, body, then) where then is
    "keep" or "close"; every write is split into 1-9 byte pieces."""

    def __init__(self, script):
        self.script = list(script)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.connections = 0
        self.requests: list[bytes] = []
        self.rng = random.Random(5)
        self.threads = [threading.Thread(target=self._serve, daemon=True)]
        self.conns: list[socket.socket] = []
        self.threads[0].start()

    def __enter__(self) -> "RawServer":
        return self

    def __exit__(self, *exc) -> None:
        """Stop accepting, close every connection, and join the threads: a thread left alive in the test
        process makes every later fan-out there (vkit.sim.fanout, the twin's fit and ranking) run serially."""
        for s in [self.sock, *self.conns]:
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in accept or recv on it
            except OSError:
                pass
            s.close()
        for t in list(self.threads):
            t.join(timeout=5)
        assert not any(t.is_alive() for t in self.threads), "a RawServer thread outlived the test"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self.conns.append(conn)
            self.threads.append(threading.Thread(target=self._conn, args=(conn,), daemon=True))
            self.threads[-1].start()

    def _read_request(self, conn, buf: bytes):
        while b"\r\n\r\n" not in buf:
            try:
                d = conn.recv(65536)
            except OSError:  # closed by __exit__
                return None, b""
            if not d:
                return None, b""
            buf += d
        head, _, rest = buf.partition(b"\r\n\r\n")
        n = int([ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0])
        while len(rest) < n:
            rest += conn.recv(65536)
        return head + b"\r\n\r\n" + rest[:n], rest[n:]

    def _conn(self, conn):
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        while True:
            req, buf = self._read_request(conn, buf)
            if req is None or not self.script:
                conn.close()
                return
            self.requests.append(req)
            action, data = self.script.pop(0)
            if action == "drop":  # close without answering: a keep-alive connection closed while idle
                conn.close()
                return
            i = 0
            while i < len(data):
                k = self.rng.randint(1, 9)
                try:
                    conn.sendall(data[i:i + k])
                except OSError:  # the client gave up on this response (a malformed event)
                    return
                i += k
                time.sleep(0.0002)
            if action == "close":
                conn.close()
                return


@pytest.fixture
def raw_server():
    """RawServer(script), closed with its threads at the test's end."""
    made: list[RawServer] = []

    def make(script) -> RawServer:
        made.append(RawServer(script))
        return made[-1]

    yield make
    for srv in made:
        srv.__exit__(None, None, None)


def _drive(lc: LoopClient, n: int, stream: bool = True, timeout: float = 10.0):
    out = []
    t = time.time()
    while len(out) < n and time.time() - t < timeout:
        out += lc.poll(0.05)
    return out


SSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def test_split_chunked_stream_then_keepalive_reuse_then_retry_after_idle_close(raw_server):
    body = _events(5)
    whole = b'{"id": "cmpl-w", "choices": [{"text": "abc", "finish_reason": "length"}], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}'
    srv = raw_server([
        ("keep", SSE_HEAD + _chunked(body, 7)),
        ("keep", b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(whole) + whole),
        ("drop", b""),  # the server closed the idle connection: resent once on a new one
        ("close", b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body),  # body delimited by the close
    ])
    lc = LoopClient(srv.url)
    lc.start("/v1/completions", b'{"a": 1}', stream=True, chat=False, index=0)
    (r,) = _drive(lc, 1)
    assert r.ok, r.error
    assert r.events == 5 and r.completion_tokens == 5 and r.prompt_tokens == 7 and len(r.itl) == 4
    assert r.rid == "cmpl-x" and r.finish_reason == "length"
    assert 0 < r.ttft <= r.latency <= r.done
    lc.start("/v1/completions", b'{"b": 2}', stream=False, chat=False, index=1)
    (r,) = _drive(lc, 1)
    assert r.ok and r.completion_tokens == 3 and r.ttft == r.latency
    assert srv.connections == 1  # kept alive
    lc.start("/v1/completions", b'{"c": 3}', stream=True, chat=False, index=2)
    (r,) = _drive(lc, 1)
    assert r.ok, r.error
    assert r.events == 5 and srv.connections == 2
    assert srv.requests[2].endswith(b'{"c": 3}') and srv.requests[3].endswith(b'{"c": 3}')
    assert b"POST /v1/completions HTTP/1.1\r\n" in srv.requests[0] and b"Content-Length: 8\r\n" in srv.requests[0]
    lc.close()


def test_errors_are_recorded_not_raised(raw_server):
    err = b'{"error": {"message": "too long", "type": "BadRequestError", "code": 400}}'
    srv = raw_server([
        ("keep", b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n" % len(err) + err),
        ("close", SSE_HEAD + _chunked(_events(4)[:60], 2)),  # cut mid-event, no terminating chunk
        ("keep", SSE_HEAD + _chunked(b"data: {oops\n\n", 1)),
    ])
    lc = LoopClient(srv.url)
    got = {}
    for i in range(3):
        lc.start("/v1/completions", b"{}", stream=True, chat=False, index=i)
        (r,) = _drive(lc, 1)
        got[i] = r
    assert got[0].status == 400 and got[0].error == "HTTP 400: too long"
    assert not got[1].ok and "before [DONE]" in got[1].error
    assert not got[2].ok and "malformed SSE event" in got[2].error
    lc.close()


def test_unreachable_and_stalled(raw_server):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    lc = LoopClient(f"http://127.0.0.1:{port}")
    lc.start("/v1/completions", b"{}", stream=True, chat=False)
    (r,) = _drive(lc, 1)
    assert not r.ok and f"cannot connect to 127.0.0.1:{port}" in r.error
    lc.close()
    srv = raw_server([("keep", SSE_HEAD + b"5\r\ndata:")])  # then silence
    lc = LoopClient(srv.url, stall_timeout=0.5)
    lc.start("/v1/completions", b"{}", stream=True, chat=False)
    (r,) = _drive(lc, 1)
    assert not r.ok and "stream stalled" in r.error
    lc.close()


def test_https_is_refused_with_a_clear_message():
    with pytest.raises(ValueError, match="plain http"):
        LoopClient("https://example.invalid")


def test_sse_fast_path_agrees_with_the_full_parse():
    from vkit.measure.client import Result, SSEState

    def stream(sep: tuple) -> bytes:
        out = b""
        texts = [" a", ' \\"finish_reason\\":null \\"usage\\": {', " c", " d"]  # escaped patterns inside the text
        for k, text in enumerate(texts):
            fin = '"length"' if k == len(texts) - 1 else "null"
            ev = '{"id":"cmpl-9","object":"text_completion","choices":[{"index":0,"text":"%s","logprobs":null,"finish_reason":%s}]}' % (text, fin)
            out += b"data: " + json.dumps(json.loads(ev), separators=sep).encode() + b"\n\n"
        out += b'data: {"id":"cmpl-9","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}\n\n'
        return out + b"data: [DONE]\n\n"

    got = []
    for sep in ((",", ":"), (", ", ": ")):  # vLLM's compact form takes the fast path; the spaced one is parsed
        r = Result(index=0, start=1.0)
        st = SSEState(r, chat=False)
        for i, line in enumerate(stream(sep).split(b"\n")):
            st.line(line, 2.0 + i)
        st.finish()
        got.append((r.ok, r.events, r.itl, r.event_times, r.ttft, r.latency, r.completion_tokens, r.finish_reason, r.rid))
    assert got[0] == got[1]
    assert got[0][0] is True and got[0][1] == 4 and got[0][6] == 4 and got[0][7] == "length"
