"""tune: the whole tuning run — LEASE → BASELINE → the staged steps (or Bayesian search) with a
drift check between them → CONVERGE — and the report.

The main job a field engineer runs (`make tune`, or `make demo` on the simulator). It composes
the single-purpose tools through vkit.tune.driver; every step can also be run alone with
`sweep --step N`. Killed at any point, the same command continues from the state file.
"""

from __future__ import annotations

import argparse
import os

from vkit.cli import _tuneargs as ta
from vkit.cli._common import IO, make_parser, run
from vkit.errors import ExitCode, UsageError
from vkit.state import StateFile
from vkit.tune import advisor, driver

TOOL = "tune"


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(
        TOOL,
        "Tune the service in the state file end to end: baseline, staged search (or BO) with gates and rollback, "
        "Pareto front, knee, recommendation, report.",
        examples=[
            "tune --sandbox                                  # simulator or offline sandbox",
            "tune --yes --concurrency 32 --input-len 1024 --output-len 256 --slo p95_ttft_ms=1500",
            "tune --sandbox --steps 2,3 --report-dir reports/today",
            "tune --sandbox --mode bo --budget 12",
            "tune --sandbox --mode bo --budget 12 --advisor http://127.0.0.1:8000   # every 2nd proposal asked of the served model",
            "tune --yes --time-budget 8h                      # production: back on the kept config between trials",
            "tune --virtual --sandbox --objective capacity   # a sim_server state tuned in virtual time: seconds, no process",
            "tune --sandbox --max-restarts 8                 # capacity: the calibrated twin ranks, the server confirms (the default)",
            "tune --sandbox --search staged                   # seed 000's staged steps, every candidate restarted",
            "state init --slots 4 ... && tune --sandbox       # screening 4 candidates at a time, one per slot",
            "tune --yes --objective j-per-token --required-capacity 20 --slo p95_ttft_ms=1000   # fewest J/token carrying 20 req/s",
        ],
    )
    ta.add_args(p)
    s = p.add_argument_group("search")
    s.add_argument("--mode", "--search", dest="mode", choices=["auto", "staged", "bo", "twin"], default="auto",
                   help=ta.AUTO_HELP + ta.MODE_HELP + ta.TWIN_HELP)
    s.add_argument("--max-restarts", type=int, default=None, metavar="N",
                   help="--search twin: propose no trial that would take the run's server starts past N (the trial's start, "
                        "its confirmation's first block (three starts) and the promise's one reserved; a confirmation "
                        "whose sequential test needs another block adds two starts and is never cut short; default: no limit)")
    s.add_argument("--twin-refit", action="store_true",
                   help="--search twin: after each measured trial, refit the twin on its load points too (the baseline's "
                        "and every trial's) and re-rank; each fit is a new profile in the log (default: the baseline's fit "
                        "throughout, each prediction corrected by its nearest measured configuration)")
    s.add_argument("--twin-design", choices=["auto", "always", "off"], default="off",
                   help="--search twin: designed calibration runs on the configuration already running (no restart): "
                        "closed loop at concurrency 1 and at the KV-bound one (max_num_seqs, or the whole requests the KV "
                        "cache holds), and one request at a time with prompts 8x the workload's where the model length "
                        "allows, fitted with the baseline's load points; auto: only when those leave a parameter "
                        "unidentified (default: off)")
    s.add_argument("--steps", default="1,2,3,4m,4,5",
                   help="steps to run, comma-separated (default 1,2,3,4m,4,5). 4m: the highest gpu_memory_utilization "
                        "that starts, by bisection between the kept value and the policy's max (0.98) on real starts and "
                        "vLLM's logged KV cache size, then validated under the load (a value that starts but fails under it "
                        "is rejected with the evidence, and the search steps down); runs before step 4's grid")
    s.add_argument("--budget", type=int, default=8, metavar="N", help="trials per step (staged) or in all (bo) at most (default 8)")
    ta.add_bo_args(s)
    ta.add_advisor_args(p)
    s.add_argument("--business-len", type=int, default=None, metavar="N",
                   help="step 1: the context the business needs (default (longest prompt + output) x 1.25)")
    s.add_argument("--max-model-len-candidates", default="1024,2048,4096,8192", metavar="L,L",
                   help="step 1 candidates (default 1024,2048,4096,8192)")
    s.add_argument("--report-dir", default=None, metavar="DIR", help="where report.md/.html/result.json go (default: reports/ beside the state)")
    s.add_argument("--restart", action="store_true", help="start a new tuning run even if the state holds an unfinished one")
    return p


def _run(args: argparse.Namespace, io: IO) -> int:
    from vkit.report import render as report

    plan = ta.tune_plan(args)
    ta.check_confirmation(args)
    sf = StateFile(args.state)
    main, mixed = ta.workloads(args, sf.read()["service"]["model"])
    settings = ta.settings(args, main)

    def abnormal(reason: str | None) -> None:
        io.err.write(f"{TOOL}: ABNORMAL: {reason}\n{TOOL}: what to do: read the server log in {os.path.join(sf.dir, 'logs')}, "
                     "fix the cause, then `state --clear-abnormal --reason ...` and rerun the same command to continue\n")

    if args.advisor and args.mode != "bo":
        raise UsageError("--advisor joins the Bayesian search (--mode bo): the staged steps' fixed order has no slot for its proposals")
    adv = ta.advisor_of(args, sf, io, TOOL)
    tuned = driver.tune(sf, settings, mixed, plan, ta.context(args, io, TOOL), write_report=report.write_report, on_abnormal=abnormal,
                        advise=advisor.advised_proposer(adv) if adv is not None else None)
    if args.json:
        io.emit_json(tuned.result.to_dict())
    else:
        io.out.write(report.render_terminal(tuned.result, color=io.is_tty()))
        io.out.write(f"\nreport: {tuned.report.get('html')}  ({tuned.report.get('md')})\n")
    return ExitCode.OK


def main(argv: list[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    return run(build_parser(), _run, argv, stdout, stderr, stdin)
