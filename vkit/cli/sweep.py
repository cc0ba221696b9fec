"""sweep: run one step of the tuning order (or a Bayesian search) through the per-trial state
machine, deliver the Pareto front, or replay logged proposals.

`tune` drives every step; `sweep --step N` is the same step alone, for a field engineer
following the runbook. Resumable: rerun the same command after an interruption.
"""

from __future__ import annotations

import argparse

from vkit.cli import _tuneargs as ta
from vkit.cli._common import IO, make_parser, run
from vkit.errors import ExitCode, UsageError
from vkit.state import StateFile
from vkit.tune import driver

TOOL = "sweep"


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(
        TOOL,
        "Run one tuning step (staged) or a Bayesian search through apply/verify/validate/gate/keep; JSON on stdout.",
        examples=[
            "sweep --step 2 --sandbox          # max-num-batched-tokens with max-num-seqs fixed",
            "sweep --step 3 --sandbox          # max-num-seqs at the best budget, knee detection",
            "sweep --mode bo --budget 12 --sandbox",
            "sweep --deliver                   # Pareto front, knee, recommendation from the trials so far",
            "sweep --deliver --sandbox         # ... after re-confirming the front on fresh interleaved runs",
            "sweep --replay vkit-state/decisions.jsonl   # re-derive logged proposals and compare",
            "sweep --ablate --sandbox          # which switch of a multi-parameter change produced the gain",
        ],
    )
    ta.add_args(p)
    s = p.add_argument_group("search")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--step", choices=["2", "3", "4"], help="run one staged step (1 and 5 are run by tune)")
    g.add_argument("--deliver", action="store_true", help="print the Pareto front, knee and recommendation of the trials so far; with --yes or "
                   "--sandbox, first re-confirm up to --confirm-front of its members against the kept configuration")
    g.add_argument("--replay", metavar="LOG", help="re-run the logged proposals of a decision log and report any that differ")
    g.add_argument("--ablate", action="store_true",
                   help="the last kept change moved several parameters: measure each alone against the configuration it replaced")
    s.add_argument("--mode", choices=["staged", "bo"], default="staged", help=ta.MODE_HELP)
    s.add_argument("--budget", type=int, default=8, metavar="N", help="trials at most (default 8)")
    return p


def _run(args: argparse.Namespace, io: IO) -> int:
    if args.replay:
        rep = driver.replay(args.replay)
        io.emit_json(rep.to_dict())
        return ExitCode.OK if not rep.differences else ExitCode.REJECTED
    if not (args.deliver or args.ablate or args.step or args.mode == "bo"):
        raise UsageError("give --step N (2, 3 or 4), --mode bo, --ablate, --deliver or --replay LOG")
    if not args.deliver:
        ta.check_confirmation(args)
    sf = StateFile(args.state)
    main, _ = ta.workloads(args, sf.read()["service"]["model"])
    settings = ta.settings(args, main)
    ctx = ta.context(args, io, TOOL)
    if args.deliver:
        confirm = (args.yes or args.sandbox) and args.confirm_front > 0
        io.emit_json(driver.deliver(sf, settings, ctx, confirm_front=args.confirm_front if confirm else 0))
    elif args.ablate:
        io.emit_json(driver.ablate(sf, settings, ctx))
    else:
        step = driver.sweep_step(sf, settings, ctx, args.step, mode=args.mode, budget=args.budget, seed=args.seed,
                                 staged_candidates=args.staged_candidates)
        io.emit_json(step.to_dict())
    return ExitCode.OK


def main(argv: list[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    return run(build_parser(), _run, argv, stdout, stderr, stdin)
