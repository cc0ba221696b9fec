"""Log lines in vLLM's format, written to the streams the caller passes in.

vLLM's logger writes to stdout as ``(APIServer pid=N) INFO MM-DD HH:MM:SS [file.py:line] msg``
(engine-core lines carry ``(EngineCore_DP0 pid=N)``), uvicorn's as
``(APIServer pid=N) INFO:     msg``. Continuation lines of a multi-line message repeat the
prefix, as vLLM's NewLineFormatter does. Every line is flushed: launchers tail the log.

Once serving, ``start_background()`` hands the writes to a thread, so that a reader that
does not keep up (a pipe nobody drains) can never stall the event loop and its token timing;
``close()`` drains it.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import TextIO

API = "APIServer"
ENGINE = "EngineCore_DP0"


class VllmLog:
    def __init__(self, out: TextIO, err: TextIO, pid: int | None = None):
        self.out = out
        self.err = err
        self.pid = os.getpid() if pid is None else pid
        self._q: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None

    def start_background(self) -> None:
        if self._q is None:
            self._q = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._drain, name="sim-log", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        q, t = self._q, self._thread
        if q is None:
            return
        self._q = None
        q.put(None)
        t.join(timeout)

    def _drain(self) -> None:
        q = self._q
        while True:
            item = q.get()
            if item is None:
                return
            self._write_now(*item)

    def _write(self, stream: TextIO, text: str) -> None:
        q = self._q
        if q is not None:
            q.put((stream, text))
        else:
            self._write_now(stream, text)

    @staticmethod
    def _write_now(stream: TextIO, text: str) -> None:
        try:
            stream.write(text)
            stream.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass  # the reader went away; a server keeps serving

    def log(self, level: str, src: str, msg: str, proc: str = API) -> None:
        prefix = f"({proc} pid={self.pid}) {level} {time.strftime('%m-%d %H:%M:%S')} [{src}] "
        self._write(self.out, "".join(prefix + line + "\n" for line in msg.split("\n")))

    def info(self, src: str, msg: str, proc: str = API) -> None:
        self.log("INFO", src, msg, proc)

    def warning(self, src: str, msg: str, proc: str = API) -> None:
        self.log("WARNING", src, msg, proc)

    def error(self, src: str, msg: str, proc: str = API) -> None:
        self.log("ERROR", src, msg, proc)

    def uvicorn(self, msg: str, level: str = "INFO") -> None:
        self._write(self.out, f"({API} pid={self.pid}) {level + ':':<9} {msg}\n")

    def stderr(self, text: str) -> None:
        self._write(self.err, text if text.endswith("\n") else text + "\n")
