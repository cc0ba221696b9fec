"""Where a configuration runs: the :class:`Backend` a lifecycle starts, watches and stops servers
through, and a tune measures through.

:data:`PROCESS` is the real thing: a server process (``vkit.apply.launcher``), its /health, the
post-start verification (``vkit.apply.verify``), bench_stream over HTTP and the wall clock. A virtual
backend (``vkit.tune.virtual``) gives the same answers from the simulator in virtual time, so the
lifecycle (candidate, rollback, ABNORMAL), the state it writes and every decision above it run
unchanged on either.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol

from vkit.apply import launcher
from vkit.apply.launcher import ReadyResult, Running
from vkit.apply.verify import Verification, verify
from vkit.measure.benchconfig import BenchConfig


class Backend(Protocol):
    """What the lifecycle and the tune ask of the place a server runs."""

    name: str  # "process" | "virtual"

    def now(self) -> float:
        """Seconds on this backend's clock (restarts and runs are timed on it)."""
        ...

    def start(self, launch: dict, config: dict, log_path: str, tag: str | None = None) -> Running: ...

    def wait_ready(self, url: str, run: Running, timeout_s: float, on_wait: Callable[[float], None] | None = None,
                   stop_flag: Callable[[], bool] | None = None) -> ReadyResult: ...

    def verify(self, url: str, model: str, expect: dict, timeout_s: float) -> Verification: ...

    def stop(self, run: dict | Running | None, launch: dict | None = None, grace_s: float = 15.0) -> str: ...

    def stop_tagged(self, tag: str, grace_s: float = 15.0) -> list[str]: ...

    def alive(self, pid: int | None, ticks: int | None = None) -> bool: ...

    def tail(self, path: str, n: int = 200) -> list[str]: ...

    def healthy(self, url: str) -> bool: ...

    def bench(self, cfg: BenchConfig, records: str, output: str, interrupts=None) -> dict:
        """One bench_stream run: its records and summary written to their files, the summary returned."""
        ...


class ProcessBackend:
    """Server processes on this machine, measured over HTTP."""

    name = "process"

    def now(self) -> float:
        return time.time()

    def start(self, launch: dict, config: dict, log_path: str, tag: str | None = None) -> Running:
        return launcher.start(launch, config, log_path, tag=tag)

    def wait_ready(self, url: str, run: Running, timeout_s: float, on_wait: Callable[[float], None] | None = None,
                   stop_flag: Callable[[], bool] | None = None) -> ReadyResult:
        return launcher.wait_ready(url, run, timeout_s, on_wait=on_wait, stop_flag=stop_flag)

    def verify(self, url: str, model: str, expect: dict, timeout_s: float) -> Verification:
        return verify(url, model, expect, timeout_s=timeout_s)

    def stop(self, run: dict | Running | None, launch: dict | None = None, grace_s: float = 15.0) -> str:
        return launcher.stop(run, launch, grace_s=grace_s)

    def stop_tagged(self, tag: str, grace_s: float = 15.0) -> list[str]:
        return launcher.stop_tagged(tag, grace_s=grace_s)

    def alive(self, pid: int | None, ticks: int | None = None) -> bool:
        return launcher.alive(pid, ticks)

    def tail(self, path: str, n: int = 200) -> list[str]:
        return launcher.tail(path, n)

    def healthy(self, url: str) -> bool:
        import requests

        try:
            return requests.get(url.rstrip("/") + "/health", timeout=5).status_code == 200
        except requests.RequestException:
            return False

    def bench(self, cfg: BenchConfig, records: str, output: str, interrupts=None) -> dict:
        from vkit.measure.gauge import measure

        return measure(cfg, records=records, output=output, interrupts=interrupts).summary


PROCESS: Backend = ProcessBackend()
