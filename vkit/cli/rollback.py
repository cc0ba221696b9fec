"""rollback: restore the last *kept* configuration and verify it.

The one command to get back to safety by hand; restart_with_rollback calls the same code
on every failure. A rollback that fails marks the environment ABNORMAL.
"""

from __future__ import annotations

import argparse

from vkit.cli._common import IO, make_parser, run
from vkit.cli._lifecycle import add_lifecycle_args, with_lifecycle

TOOL = "rollback"


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(
        TOOL,
        "Restart the server with the last kept configuration and verify it.",
        examples=["rollback", "rollback --state vkit-state/vkit.json --ready-timeout 300 --json"],
    )
    p.add_argument("--reason", default="manual rollback", help="why, for the decision log")
    add_lifecycle_args(p)
    return p


def _run(args: argparse.Namespace, io: IO) -> int:
    return with_lifecycle(args, io, TOOL, lambda lc: lc.rollback(reason=args.reason))


def main(argv: list[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    return run(build_parser(), _run, argv, stdout, stderr, stdin)
