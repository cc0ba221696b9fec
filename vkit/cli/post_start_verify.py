"""post_start_verify: after every restart, prove the service works — not only that the process runs.

Runs right after restart_with_rollback (which calls the same checks) or by hand:
``post_start_verify --url URL --model NAME``. JSON on stdout with --json, a table otherwise.
"""

from __future__ import annotations

import argparse

from vkit.apply.policy import canonical
from vkit.apply.verify import verify
from vkit.cli._common import IO, make_parser, run
from vkit.errors import ExitCode, StateMissing, UsageError
from vkit.state import StateFile

TOOL = "post_start_verify"


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(
        TOOL,
        "Check that a vLLM server really serves: health, model name, a real forward pass, /metrics, accelerator memory.",
        examples=[
            "post_start_verify --url http://127.0.0.1:8000 --model /models/x",
            "post_start_verify --url $URL --model sim-8b --expect max_model_len=8192 --expect enable_prefix_caching=True",
            "post_start_verify --json | jq '.checks[] | select(.status==\"fail\")'",
        ],
    )
    p.add_argument("--model", help="served model name the server must answer to (default: the state file's)")
    p.add_argument("--expect", action="append", default=[], metavar="K=V",
                   help="configuration the server must report: max_model_len (from /v1/models) or cache_config_info labels "
                        "(block_size, gpu_memory_utilization, enable_prefix_caching, num_gpu_blocks); repeatable")
    p.add_argument("--timeout", type=float, default=30.0, metavar="S", help="per-request timeout in seconds (default 30)")
    return p


def render(v, io: IO) -> None:
    w = io.out.write
    for c in v.checks:
        ev = " ".join(f"{k}={val}" for k, val in c.evidence.items())
        mark = {"pass": "PASS", "fail": "FAIL", "not_applicable": "n/a "}[c.status]
        w(f"{mark}  {c.id:<12} {ev}" + (f"  -- {c.why}" if c.why else "") + "\n")
    w(("OK: " if v.ok else "NOT OK: ") + v.summary_line() + f" ({v.seconds:.1f} s)\n")


def _run(args: argparse.Namespace, io: IO) -> int:
    url, model = args.url, args.model
    if not (url and model):
        try:
            svc = StateFile(args.state).read()["service"]
            svc["url"], svc["model"]  # noqa: B018 - a service without them is the same as none
        except (StateMissing, KeyError, TypeError):  # a corrupted state file is exit 3, said as such
            raise UsageError("give --url and --model (or a state file with the service)") from None
        url, model = url or svc["url"], model or svc["model"]
    expect = {}
    for item in args.expect:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise UsageError(f"--expect takes K=V, got {item!r}")
        expect[canonical(k)] = v
    v = verify(url, model, expect, timeout_s=args.timeout)
    if args.json:
        io.emit_json(v.as_dict())
    else:
        render(v, io)
    if v.unreachable:
        return ExitCode.UNAVAILABLE
    return ExitCode.OK if v.ok else ExitCode.REJECTED


def main(argv: list[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    return run(build_parser(), _run, argv, stdout, stderr, stdin)
