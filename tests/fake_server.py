"""A scripted OpenAI-style server for fault cases the simulator does not produce
(malformed SSE, a stream cut before [DONE], a 400 on the first request). Each request's
behaviour is chosen by the prompt's first token id (or text) so tests can mix faults."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "ok"  # default behaviour, overridden per server

    def log_message(self, *a):  # quiet
        pass

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": "fake", "object": "model", "max_model_len": 4096}]}).encode())
        elif self.path == "/version":
            self._send(200, b'{"version": "fake"}')
        else:
            self._send(404, b'{"detail": "Not Found"}')

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(n))
        mode = self.server.mode_for(body)
        if mode == "reject":
            self._send(400, json.dumps({"error": {"message": "This model's maximum context length is 4096 tokens. However, you requested 9999 tokens.", "type": "BadRequestError", "param": None, "code": 400}}).encode())
            return
        if mode == "500":
            self._send(500, json.dumps({"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError", "param": None, "code": 500}}).encode())
            return
        if not body.get("stream"):
            ntok = int(body.get("max_tokens") or 4)
            time.sleep(self.server.token_delay * ntok)
            plen = len(body["prompt"]) if isinstance(body.get("prompt"), list) else 5
            self._send(200, json.dumps({"id": "cmpl-1", "object": "text_completion",
                                        "choices": [{"index": 0, "text": " t" * ntok, "finish_reason": "length"}],
                                        "usage": {"prompt_tokens": plen, "completion_tokens": ntok, "total_tokens": plen + ntok}}).encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        ntok = int(body.get("max_tokens") or 4)
        for k in range(ntok):
            if mode == "cut" and k == 2:
                self.wfile.write(b"0\r\n\r\n")  # end the body without [DONE]
                self.wfile.flush()
                return
            if mode == "malformed" and k == 1:
                chunk(b"data: {not json\n\n")
                continue
            ev = {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": f" t{k}", "finish_reason": "length" if k == ntok - 1 else None}]}
            chunk(b"data: " + json.dumps(ev).encode() + b"\n\n")
            time.sleep(self.server.token_delay)
        prompt_len = len(body["prompt"]) if isinstance(body.get("prompt"), list) else 5
        usage = {"id": "cmpl-1", "object": "text_completion", "choices": [], "usage": {"prompt_tokens": prompt_len, "completion_tokens": ntok, "total_tokens": prompt_len + ntok}}
        chunk(b"data: " + json.dumps(usage).encode() + b"\n\n")
        chunk(b"data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


class LoopbackServer(ThreadingHTTPServer):
    """A threaded HTTP server on a free loopback port, served from a thread inside ``with``."""

    daemon_threads = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *a):
        self.shutdown()
        self.server_close()


class FakeServer(LoopbackServer):

    def __init__(self, modes: dict | None = None, default: str = "ok", token_delay: float = 0.002):
        super().__init__(("127.0.0.1", 0), Handler)
        self.token_delay = token_delay
        self.modes = modes or {}
        self.default = default
        self.count = 0
        self.lock = threading.Lock()

    def mode_for(self, body: dict) -> str:
        with self.lock:
            self.count += 1
            k = self.count
        # request number k (1 = the preflight) → mode
        return self.modes.get(k, self.default)
