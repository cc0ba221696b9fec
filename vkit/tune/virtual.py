"""The virtual backend: the lifecycle and the tune on the simulator in virtual time.

:class:`VirtualBackend` answers what :class:`vkit.apply.backend.Backend` asks — start, wait for
ready, post-start verification, stop, alive, health, one bench_stream run — from one
:class:`vkit.sim.virtual.VirtualServer`. A start is the state's launch argv with the configuration's
flags, as a process start is, read by sim_server's own parser (``parse``: the CLI hands it in) into
the engine's options and the simulator's settings; vLLM's refusals reach the server log (the one the
lifecycle diagnoses) in vLLM's words. The lifecycle, the state it writes, the gate and every rule
above run unchanged; only time is simulated: restarts and runs are timed on the virtual clock.

A started engine is recorded in the state like a process, under a number no process can have
(``VIRTUAL_PID_BASE`` + its start number, above Linux's highest pid): nothing ever signals it, and
only this backend says whether it is alive.
"""

from __future__ import annotations

import os
from typing import Callable

from vkit.apply import launcher
from vkit.apply.launcher import ReadyResult, Running
from vkit.apply.policy import same_value
from vkit.apply.verify import CACHE_CONFIG_KEYS, Check, Verification
from vkit.errors import UsageError
from vkit.measure.benchconfig import BenchConfig
from vkit.sim.config import ServeOptions
from vkit.sim.settings import SimSettings
from vkit.sim.virtual import VirtualServer

VIRTUAL_PID_BASE = 1 << 30  # above /proc/sys/kernel/pid_max's ceiling (2^22): never a process's pid

# sim_server's argv (without the program) and a start number -> the engine's options and the simulator's settings
Parse = Callable[[list[str], int], tuple[ServeOptions, SimSettings]]


class VirtualRunning(Running):
    """A virtual start as the lifecycle sees a process: alive while its engine is."""

    backend: VirtualBackend | None = None

    def is_alive(self) -> bool:
        return self.backend is not None and self.backend.alive(self.pid, self.ticks)

    def exit_code(self) -> int | None:
        return None if self.is_alive() else 1


class VirtualBackend:
    """The simulator behind the lifecycle and the tune (see the module's docstring)."""

    name = "virtual"

    def __init__(self, parse: Parse):
        self.parse = parse
        self.server: VirtualServer | None = None
        self.pid: int | None = None
        self.refused: str | None = None  # vLLM's last words when the latest start failed

    @property
    def tally(self):
        return self.server.tally if self.server is not None else None

    def now(self) -> float:
        return self.server.clock if self.server is not None else 0.0

    def _program(self, argv: list[str]) -> list[str]:
        """The arguments after sim_server's program in a launch argv."""
        for i, a in enumerate(argv):
            if os.path.basename(a) in ("sim_server", "sim_server.py"):
                return argv[i + 1:]
        raise UsageError("the virtual backend runs the simulator: the state's launch argv must start bin/sim_server "
                         f"(it is {' '.join(argv[:3])} ...)")

    def start(self, launch: dict, config: dict, log_path: str, tag: str | None = None) -> Running:
        argv = launcher.serve_argv(launch, config)
        index = 0 if self.server is None else self.server.next_start
        opts, settings = self.parse(self._program(argv), index)
        if self.server is None:
            self.server = VirtualServer(opts, settings)
        st = self.server.start_options(opts, settings, dict(config))
        self.refused = None if st.ok else st.message
        with open(log_path, "a", encoding="utf-8") as f:
            if st.ok:
                f.write(f"(virtual start {st.start_index}: the simulator's engine in virtual time)\n"
                        "INFO: Application startup complete.\n")
            else:  # as sim_server reports a start-up failure: the traceback's last line carries vLLM's words
                f.write("Traceback (most recent call last):\n  (virtual start: simulated vLLM start-up failure)\n"
                        f"{st.message}\n")
        self.pid = VIRTUAL_PID_BASE + st.start_index
        run = VirtualRunning(pid=self.pid, pgid=self.pid, ticks=st.start_index, log=log_path, argv=argv,
                             started=self.now())
        run.backend = self
        return run

    def wait_ready(self, url: str, run: Running, timeout_s: float, on_wait: Callable[[float], None] | None = None,
                   stop_flag: Callable[[], bool] | None = None) -> ReadyResult:
        if self.alive(run.pid, run.ticks):
            return ReadyResult(True, self.server.settings.startup_s if self.server else 0.0)
        d = launcher.diagnose(launcher.tail(run.log))
        return ReadyResult(False, 0.0, f"the server exited during start-up (exit 1): {d['quote']}", d, 1)

    def verify(self, url: str, model: str, expect: dict, timeout_s: float) -> Verification:
        """post_start_verify's checks, answered by the engine that runs: the model and its
        max_model_len, and cache_config_info against what the configuration asked for."""
        app = self.server.app if self.server is not None else None
        if app is None or app.dead:
            return Verification(url, model, [Check("health", "fail", {}, "the virtual engine is not running")],
                                unreachable=True)
        expect = dict(expect)
        checks = [Check("health", "pass", {"status": 200})]
        mml = app.cfg.max_model_len
        want = expect.pop("max_model_len", None)
        if model not in app.names:
            checks.append(Check("model", "fail", {"served": app.names}, f"the server serves {app.names}, not {model!r}"))
        elif want is not None and not same_value(want, mml):
            checks.append(Check("model", "fail", {"max_model_len": mml, "expected_max_model_len": want},
                                f"max_model_len is {mml}, the configuration asked for {want}"))
        else:
            checks.append(Check("model", "pass", {"served": app.names, "max_model_len": mml}))
        checks.append(Check("forward", "pass", {"virtual": True}))
        cc = app.cache_info()
        wrong = {k: {"expected": expect.pop(k), "server": cc[k]} for k in CACHE_CONFIG_KEYS
                 if k in expect and k in cc and not same_value(expect[k], cc[k])}
        checks.append(Check("metrics", "fail" if wrong else "pass", {"cache_config": wrong} if wrong else {},
                            "cache_config_info differs: " + ", ".join(f"{k}={v['server']} (wanted {v['expected']})"
                                                                      for k, v in wrong.items()) if wrong else ""))
        checks.append(Check("accelerator", "not_applicable", {}, "a simulated accelerator"))
        return Verification(url, model, checks)

    def stop(self, run: dict | Running | None, launch: dict | None = None, grace_s: float = 15.0) -> str:
        pid = run.pid if isinstance(run, Running) else (run or {}).get("pid")
        if pid is not None and pid == self.pid and self.server is not None and self.server.app is not None:
            self.server.stop()
            return f"stopped virtual start {pid - VIRTUAL_PID_BASE}"
        return f"virtual start {pid} was not running"

    def stop_tagged(self, tag: str, grace_s: float = 15.0) -> list[str]:
        return []

    def alive(self, pid: int | None, ticks: int | None = None) -> bool:
        return pid is not None and pid == self.pid and self.server is not None and self.server.healthy()

    def tail(self, path: str, n: int = 200) -> list[str]:
        return launcher.tail(path, n)

    def healthy(self, url: str) -> bool:
        return self.server is not None and self.server.healthy()

    def bench(self, cfg: BenchConfig, records: str, output: str, interrupts=None) -> dict:
        if self.server is None:
            raise UsageError("the virtual backend has started nothing yet")
        return self.server.bench(cfg, records, output)
