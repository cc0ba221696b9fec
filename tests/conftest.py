"""Shared test helpers: the repo root, a fresh state path, and calling a tool's main()."""

from __future__ import annotations

import importlib
import io
import os
import sys
import threading
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(path: str, name: str):
    """A script that is not a package module (bench/, tests/golden/), loaded as module ``name``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
if REPO not in sys.path:
    sys.path.insert(0, REPO)


class Result:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    def __repr__(self) -> str:  # shown when an assertion fails
        return f"Result(code={self.code}, out={self.out[-800:]!r}, err={self.err[-800:]!r})"


def call(tool: str, *argv: str) -> Result:
    """Run ``vkit.cli.<tool>.main(argv)`` in-process and capture its streams."""
    mod = importlib.import_module(f"vkit.cli.{tool}")
    out, err = io.StringIO(), io.StringIO()
    code = mod.main(list(argv), stdout=out, stderr=err)
    return Result(code, out.getvalue(), err.getvalue())


@pytest.fixture(autouse=True)
def sim_start_count(tmp_path, monkeypatch):
    """Every simulator a test starts counts its starts in the test's own file, so the
    between-restart noise draws are the same on every run of the suite (starts 1, 2, ...)."""
    monkeypatch.setenv("VKIT_SIM_START_FILE", str(tmp_path / "sim-starts"))


@pytest.fixture
def state_path(tmp_path):
    return str(tmp_path / "st" / "vkit.json")


@pytest.fixture
def repo():
    return REPO


# -- test tiers ---------------------------------------------------------------------------------
# unit: no process, no socket; e2e: starts processes (the simulator, scripts, bin/ tools); vllm:
# real vLLM; peers: the peer tools against real vLLM; unmarked: in-process (a tool's main, a fake server on a thread). `make test-fast`
# runs everything that is neither e2e nor vllm. A test that starts a process without the e2e
# marker fails, so the fast tier stays fast. The host probes bench_stream's fingerprint and the
# platform module run (nvidia-smi, npu-smi, rocm-smi, uname: milliseconds, skipped where absent)
# do not count.
HOST_PROBES = {"nvidia-smi", "npu-smi", "rocm-smi", "uname"}

_SPAWNS: dict[str, list] = {}
_NOW = {"test": None}


def pytest_configure(config):
    import subprocess

    real_init = subprocess.Popen.__init__

    def init(self, args, *a, **k):
        real_init(self, args, *a, **k)  # only a process that started counts
        prog = args[0] if isinstance(args, (list, tuple)) and args else args
        if _NOW["test"] is not None and os.path.basename(str(prog)) not in HOST_PROBES:
            _SPAWNS.setdefault(_NOW["test"], []).append(args)

    subprocess.Popen.__init__ = init


def pytest_runtest_logstart(nodeid, location):
    _NOW["test"] = nodeid
    _NOW["threads"] = set(threading.enumerate())


def threads_left(before: set, grace_s: float = 5.0) -> list[str]:
    """The threads started since ``before`` still alive after up to ``grace_s`` (each given time to end)."""
    deadline = time.monotonic() + grace_s
    for t in set(threading.enumerate()) - before:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    return sorted(t.name for t in set(threading.enumerate()) - before if t.is_alive())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if call.when != "teardown" or any(item.get_closest_marker(m) for m in ("e2e", "vllm", "peers")):
        return
    started = _SPAWNS.get(item.nodeid)
    if started and rep.passed:
        rep.outcome = "failed"
        rep.longrepr = f"{item.nodeid} starts processes ({str(started[0])[:160]}) but is not marked e2e"
    # a thread an in-process test leaves running stays in the suite's process: every later fan-out there (the
    # twin's fit and ranking, vkit.sim.fanout) then runs serially, as it must beside another thread
    left = threads_left(_NOW.get("threads") or set())
    if left and rep.passed:
        rep.outcome = "failed"
        rep.longrepr = f"{item.nodeid} leaves thread(s) running: {', '.join(left)[:200]}"
