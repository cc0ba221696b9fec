"""sweep: run one step of the tuning order (or a Bayesian search) through the per-trial state
machine, deliver the Pareto front, or replay logged proposals.

`tune` drives every step; `sweep --step N` is the same step alone, for a field engineer
following the runbook. Resumable: rerun the same command after an interruption. With
``--advisor URL`` an OpenAI-compatible model is asked for some of the Bayesian search's proposals
and for an explanation of the result (``vkit.tune.advisor``); every call is in the decision log,
and ``--replay`` re-derives its proposals from the log without calling the model.
"""

from __future__ import annotations

import argparse
import os

from vkit.cli import _tuneargs as ta
from vkit.cli._common import IO, make_parser, run
from vkit.errors import ExitCode, UsageError
from vkit.jsonio import load_json_lines
from vkit.state import StateFile
from vkit.tune import advisor, driver

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
            "sweep --mode bo --budget 12 --sandbox --advisor http://127.0.0.1:8000   # every 2nd proposal asked of the served model",
            "sweep --advise --advisor http://10.0.0.5:8000 --advisor-key-env ADVISOR_KEY   # one proposal, logged, nothing run",
            "sweep --replay vkit-state      # the state directory's log: the advisor's proposals re-derived without calling it",
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
    g.add_argument("--advise", action="store_true",
                   help="ask the --advisor once for the next configuration from the trials so far: logged and printed, nothing run")
    s.add_argument("--mode", choices=["staged", "bo"], default="staged", help="default staged; " + ta.MODE_HELP)
    s.add_argument("--budget", type=int, default=8, metavar="N", help="trials at most (default 8)")
    ta.add_bo_args(s)
    ta.add_advisor_args(p)
    return p


def _replay(path: str, io: IO) -> int:
    """Re-derive the logged proposals (a log, or a state directory's decisions.jsonl); no model is called."""
    if os.path.isdir(path):
        path = os.path.join(path, "decisions.jsonl")
    records = [r for _, r in load_json_lines(path, "decision log")]
    if not advisor.holds_advice(records):
        rep = driver.replay(path)
        io.emit_json(rep.to_dict())
        return ExitCode.OK if not rep.differences else ExitCode.REJECTED
    out = advisor.replay(records)
    io.progress(f"replayed {out['advisor']['calls']} advisor call(s) and {out['proposals']} Bayesian proposal(s) from {path}; "
                "no model was called")
    io.emit_json(out)
    return ExitCode.OK if advisor.replay_ok(out) else ExitCode.REJECTED


def _run(args: argparse.Namespace, io: IO) -> int:
    if args.replay:
        if args.advisor:
            raise UsageError("--replay never calls the advisor: it re-derives the logged answers; drop --advisor")
        return _replay(args.replay, io)
    if args.advisor and not args.advise and (args.deliver or args.ablate or args.step or args.mode != "bo"):
        raise UsageError("--advisor joins the Bayesian search (--mode bo) or answers --advise; the staged steps' fixed "
                         "order has no slot for its proposals")
    if args.advise and not args.advisor:
        raise UsageError("--advise asks the advisor: give --advisor URL")
    if not (args.deliver or args.ablate or args.step or args.mode == "bo" or args.advise):
        raise UsageError("give --step N (2, 3 or 4), --mode bo, --ablate, --deliver, --advise or --replay LOG")
    if not (args.deliver or args.advise):
        ta.check_confirmation(args)
    sf = StateFile(args.state)
    main, _ = ta.workloads(args, sf.read()["service"]["model"])
    settings = ta.settings(args, main)
    ctx = ta.context(args, io, TOOL)
    adv = ta.advisor_of(args, sf, io, TOOL)
    if args.advise:
        io.emit_json(advisor.advise_once(driver.make_tune(sf, settings, ctx), adv))
    elif args.deliver:
        confirm = (args.yes or args.sandbox) and args.confirm_front > 0
        io.emit_json(driver.deliver(sf, settings, ctx, confirm_front=args.confirm_front if confirm else 0))
    elif args.ablate:
        io.emit_json(driver.ablate(sf, settings, ctx))
    else:
        step = driver.sweep_step(sf, settings, ctx, args.step, mode=args.mode, budget=args.budget, seed=args.seed,
                                 staged_candidates=args.staged_candidates, acquisition=args.acquisition, patience=args.bo_patience,
                                 batch_lie=args.batch_lie,
                                 advise=advisor.advised_proposer(adv) if adv is not None else None)
        out = step.to_dict()
        if adv is not None:
            out["advisor"] = advisor.summary(sf, adv, step.step, settings.slo)
        io.emit_json(out)
    return ExitCode.OK


def main(argv: list[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    return run(build_parser(), _run, argv, stdout, stderr, stdin)
