"""What restart_with_rollback and rollback share: their flags, the lease owner, progress, output."""

from __future__ import annotations

import argparse
import json
from typing import Callable

from vkit.apply.lifecycle import Held, Interrupted, Lifecycle, Outcome, run_held
from vkit.cli._common import IO, lease_owner, load_policy
from vkit.errors import ExitCode
from vkit.state import StateFile


def add_lifecycle_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ready-timeout", type=float, default=600.0, metavar="S",
                   help="seconds to wait for /health 200 after a start (default 600; real vLLM takes 30-120 s)")
    p.add_argument("--grace", type=float, default=15.0, metavar="S", help="seconds between SIGTERM and SIGKILL when stopping (default 15)")
    p.add_argument("--lease-ttl", type=float, default=3600.0, metavar="S", help="lease lifetime in seconds (default 3600)")


def with_lifecycle(args: argparse.Namespace, io: IO, tool: str, body: Callable[[Lifecycle], Outcome]) -> int:
    how = Held(owner=lease_owner(tool), ready_timeout_s=args.ready_timeout, grace_s=args.grace, lease_ttl_s=args.lease_ttl,
               progress=io.progress, interrupts=io.interrupts, policy=load_policy(),
               on_interrupt=lambda: io.warn("interrupt received: finishing safely (restoring the kept configuration if a restart is under way)"))
    try:
        code, out = run_held(StateFile(args.state), tool, how, body)
    except Interrupted as e:
        io.err.write(f"{tool}: {e}\n")
        return ExitCode.INTERRUPTED
    emit(io, out)
    return code


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
