"""What restart_with_rollback and rollback share: lease, signals, progress, output."""

from __future__ import annotations

import argparse
import json
import signal
import threading
from typing import Callable

from vkit.cli._common import IO
from vkit.errors import ExitCode
from vkit.lifecycle import Interrupted, Lifecycle, Outcome
from vkit.state import StateFile, default_owner


def add_lifecycle_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ready-timeout", type=float, default=600.0, metavar="S",
                   help="seconds to wait for /health 200 after a start (default 600; real vLLM takes 30-120 s)")
    p.add_argument("--grace", type=float, default=15.0, metavar="S", help="seconds between SIGTERM and SIGKILL when stopping (default 15)")
    p.add_argument("--lease-ttl", type=float, default=3600.0, metavar="S", help="lease lifetime in seconds (default 3600)")


def with_lifecycle(args: argparse.Namespace, io: IO, tool: str, body: Callable[[Lifecycle], Outcome]) -> int:
    sf = StateFile(args.state)
    sf.read()  # missing/corrupt state → exit 4/3 before anything is touched
    owner = default_owner(tool)
    hits = {"n": 0}

    def on_signal(signum, frame):  # noqa: ARG001
        hits["n"] += 1
        if hits["n"] == 1:
            io.warn("interrupt received: finishing safely (restoring the kept configuration if a restart is under way)")

    old = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, on_signal)
    lc = Lifecycle(sf, tool, owner, progress=io.progress, ready_timeout_s=args.ready_timeout, grace_s=args.grace,
                   interrupted=lambda: hits["n"] > 0)
    try:
        with sf.lease(owner, ttl_s=args.lease_ttl, tool=tool):
            rec = lc.recover_orphan()
            if rec is not None:
                io.progress(f"recovery: {rec.message}")
                if not rec.ok:
                    emit(io, rec)
                    return rec.code
            out = body(lc)
    except Interrupted as e:
        io.err.write(f"{tool}: {e}\n")
        return ExitCode.INTERRUPTED
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
    emit(io, out)
    if hits["n"] and out.ok:
        return ExitCode.INTERRUPTED
    return out.code


def emit(io: IO, out: Outcome) -> None:
    if io.json:
        io.emit_json(out.as_dict())
    else:
        line = f"{out.action.upper()}: {out.message}"
        io.out.write(line + "\n")
        if out.diagnosis and out.diagnosis.get("quote"):
            io.out.write(f"  vLLM said: {out.diagnosis['quote']}\n")
            if out.diagnosis.get("advice"):
                io.out.write(f"  what to do: {out.diagnosis['advice']}\n")
        if out.startup:
            io.out.write("  startup: " + json.dumps(out.startup, sort_keys=True) + "\n")
    io.out.flush()
