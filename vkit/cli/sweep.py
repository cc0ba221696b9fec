"""sweep: run one step of the tuning order (or a Bayesian search) through the per-trial state
machine, deliver the Pareto front, or replay logged proposals.

`tune` drives every step; `sweep --step N` is the same step alone, for a field engineer
following the runbook. Resumable: rerun the same command after an interruption.
"""

from __future__ import annotations

import argparse
import contextlib

from vkit.cli import _tuneargs as ta
from vkit.cli._common import IO, load_policy, make_parser, run
from vkit.errors import ExitCode, UsageError
from vkit.jsonio import load_json_lines
from vkit.state import StateFile

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
    from vkit.tune import steps as tuning

    if args.replay:
        return _replay(args, io)
    if args.deliver:
        confirm = (args.yes or args.sandbox) and args.confirm_front > 0
        # re-confirming the front restarts the server: under the lease, like any trial; reading needs none
        with (ta.held(args, io, TOOL) if confirm else contextlib.nullcontext((StateFile(args.state), None))) as (sf, owner):
            main, _ = ta.workloads(args, sf.read()["service"]["model"])
            settings = ta.settings(args, main)
            runner = ta.runner_for(sf, settings, io, TOOL, owner, run_id="deliver" if confirm else None)
            if confirm:
                tuning.confirm_front(runner, ta.goal(settings), args.confirm_front, io.progress)
            out = tuning.deliver(runner, ta.goal(settings))
        io.emit_json(out)
        return ExitCode.OK
    if args.ablate:
        ta.check_confirmation(args)
        with ta.held(args, io, TOOL) as (sf, owner):
            main, _ = ta.workloads(args, sf.read()["service"]["model"])
            runner = ta.runner_for(sf, ta.settings(args, main), io, TOOL, owner, run_id="ablate")
            out = tuning.run_ablation(runner, io.progress)
        io.emit_json(out)
        return ExitCode.OK
    if not args.step and args.mode != "bo":
        raise UsageError("give --step N (2, 3 or 4), --mode bo, --ablate, --deliver or --replay LOG")
    ta.check_confirmation(args)
    with ta.held(args, io, TOOL) as (sf, owner):
        st = sf.read()
        main, _ = ta.workloads(args, st["service"]["model"])
        settings = ta.settings(args, main)
        runner = ta.runner_for(sf, settings, io, TOOL, owner, run_id=(st.get("tune") or {}).get("run_id") or "sweep")
        runner.baseline()
        tuning.guard_anomalies(runner)
        policy = load_policy()
        if args.mode == "bo":
            nxt, stop = tuning.bo_proposer(runner, policy, args.budget, args.seed)
            rec = tuning.run_screening_step(runner, "bo", nxt, io.progress, args.budget, stop)
        else:
            nxt, stop = tuning.staged_proposer(runner, policy, args.step, args.staged_candidates)
            rec = tuning.run_screening_step(runner, args.step, nxt, io.progress, args.budget, stop)
    step = rec["step"]
    trials = [t for t in sf.read()["trials"] if t["step"] == step]
    io.emit_json({"step": rec, "trials": trials, "kept": sf.read()["kept"]})
    return ExitCode.OK


def _replay(args: argparse.Namespace, io: IO) -> int:
    from vkit import search

    recs = [r for _, r in load_json_lines(args.replay, "decision log")]
    records = [r["audit"]["replay"] for r in recs if r.get("event") == "propose" and (r.get("audit") or {}).get("replay")]
    if not records:
        raise UsageError(f"{args.replay} holds no replayable proposals (Bayesian-search proposals carry their inputs)")
    bad = search.replay_mismatches(records)
    io.emit_json({"proposals": len(records), "identical": len(records) - len(bad), "differences": bad})
    return ExitCode.OK if not bad else ExitCode.REJECTED


def main(argv: list[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    return run(build_parser(), _run, argv, stdout, stderr, stdin)
