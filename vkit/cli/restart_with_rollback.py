"""restart_with_rollback: APPLY a candidate configuration; any failure rolls back to the kept one.

Sits between the search (which proposes) and the measurement (which judges): it changes
the server, so it says so in its name. Whether an applied candidate is *kept* is the
gate's decision, recorded later, or a human's (``--keep``).
"""

from __future__ import annotations

import argparse

from vkit.apply.policy import parse_assignments
from vkit.cli._common import IO, isatty, load_policy, make_parser, run
from vkit.cli._lifecycle import add_lifecycle_args, with_lifecycle
from vkit.errors import UsageError
from vkit.jsonio import read_json

TOOL = "restart_with_rollback"


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(
        TOOL,
        "Restart the server with a candidate configuration; on any failure roll back to the kept configuration and verify it.",
        examples=[
            "restart_with_rollback --set max_num_seqs=64 --set max_num_batched_tokens=16384 --yes",
            "restart_with_rollback --config candidate.json --sandbox --ready-timeout 300",
            "restart_with_rollback --set max_num_seqs=32 --yes --keep     # manual path: keep it once verified",
        ],
    )
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--set", dest="sets", action="append", metavar="K=V", help="a parameter of the candidate (vLLM names), repeatable")
    g.add_argument("--config", metavar="FILE", help="JSON object of candidate parameters")
    m = p.add_mutually_exclusive_group()
    m.add_argument("--yes", action="store_true", help="production: confirm the restart without asking")
    m.add_argument("--sandbox", action="store_true", help="offline sandbox: no confirmation needed")
    p.add_argument("--keep", action="store_true", help="keep the candidate once verified (a manual decision, logged)")
    p.add_argument("--allow", action="append", default=[], metavar="PARAM", help="override the policy's refusal for PARAM (logged)")
    add_lifecycle_args(p)
    return p


def _confirm(io: IO, changes: dict) -> None:
    if not io.stdin or not isatty(io.stdin):
        raise UsageError("a production restart needs --yes (or --sandbox on an offline sandbox)")
    io.err.write(f"{TOOL}: restart the server with {changes}? [y/N] ")
    io.err.flush()
    if io.stdin.readline().strip().lower() not in ("y", "yes"):
        raise UsageError("restart not confirmed")


def _run(args: argparse.Namespace, io: IO) -> int:
    policy = load_policy()
    if args.config:
        try:
            raw = read_json(args.config, "--config file")
        except FileNotFoundError:
            raise UsageError(f"no such file: {args.config}") from None
        if not isinstance(raw, dict):
            raise UsageError(f"{args.config} must hold a JSON object of parameters")
        changes = {k.replace("-", "_"): policy.coerce(k, v) for k, v in raw.items()}
    else:
        changes = parse_assignments(args.sets, policy)
    if not (args.yes or args.sandbox):
        _confirm(io, changes)
    return with_lifecycle(args, io, TOOL, lambda lc: lc.restart(changes, allow=args.allow, keep=args.keep))


def main(argv: list[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    return run(build_parser(), _run, argv, stdout, stderr, stdin)
