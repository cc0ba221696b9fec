"""gate: GATE in the tuning state machine — accept, reject or leave undecided a candidate
configuration against the kept one, with the numbers behind the decision.

Sits after the measurements: ``bench_stream … -o B1.json`` repeated for baseline and candidate
(interleaved ABBA), then ``gate --baseline B*.json --candidate C*.json``; or ``gate --trial ID``
on the runs a trial recorded in the state file. Every input goes through check_invariants
first and both sides must share the gauge and the environment (driver, accelerator, server
version, model, dtype, quantisation). Sequential by default: call it after every new
pair of runs; it stops as soon as the answer is clear with the type-I error held at --alpha.
JSON on stdout, a table for people on stderr. Exit 0 accept, 1 reject, 6 undecided (with how
many more runs), 3 invalid input.
"""

from __future__ import annotations

import argparse
import math

from vkit.cli._common import IO, fraction_arg, int_at_least, load_policy, make_parser, run
from vkit.decide.gate import (
    DEFAULT_PRIMARY,
    EXIT_CODE,
    GateInput,
    Settings,
    decide,
    parse_date,
    parse_guards,
    parse_metric,
    parse_sigma,
    trial_inputs,
)
from vkit.errors import ExitCode, UsageError

TOOL = "gate"


_pos_int = int_at_least(1)


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(
        TOOL,
        "Accept, reject or leave undecided a candidate configuration against the baseline from repeated benchmark "
        "summaries: per-metric effects with always-valid confidence sequences, threshold max(2σ, floor), power analysis.",
        examples=[
            "gate --baseline B1.json B2.json B3.json --candidate C1.json C2.json C3.json",
            "gate --baseline B*.json --candidate C*.json --guard p95_ttft_ms:-:5%,mean_tpot_ms:-",
            "gate --baseline B*.json --fresh F1.json F2.json F3.json F4.json --selected-from 16   # confirm a search winner",
            "gate --baseline B*.json --candidate C*.json --fixed        # one classical test at the planned n",
            "gate --baseline B*.json --candidate C*.json --sigma output_throughput=2%   # σ pooled from earlier A/A runs",
            "gate --state vkit-state/vkit.json --trial t7 --record",
            "gate --baseline B*.json --candidate C*.json -q | jq '.decision, .primary.change, .more_runs'",
        ],
    )
    i = p.add_argument_group("inputs")
    i.add_argument("--baseline", nargs="+", action="extend", default=[], metavar="FILE", help="summaries of the kept configuration's repeats (bench_stream or vllm bench serve JSON)")
    i.add_argument("--candidate", nargs="+", action="extend", default=[], metavar="FILE", help="summaries of the candidate's repeats")
    i.add_argument("--fresh", nargs="+", action="extend", default=[], metavar="FILE",
                   help="candidate runs measured after it was selected (fresh confirmation runs); when given, only they are evidence")
    i.add_argument("--trial", metavar="ID", help="read baseline, candidate and fresh runs of trial ID from the state file (--state)")
    i.add_argument("--selected-from", type=_pos_int, default=None, metavar="K",
                   help="the candidate won a search over K configurations: its screening runs are not evidence (default 1)")
    d = p.add_argument_group("decision")
    d.add_argument("--primary", default=None, metavar="METRIC[:+|-]", help=f"metric that must improve (default {DEFAULT_PRIMARY})")
    d.add_argument("--guard", action="append", default=[], metavar="METRIC[:+|-][:TOL]",
                   help="metric that must not worsen beyond TOL (e.g. p95_ttft_ms:-:5%%; default TOL max(2σ, floor)); repeatable, comma-separated")
    d.add_argument("--report", default=None, metavar="M1,M2", help="metrics to report with FDR control (default: the standard throughput and latency keys present)")
    d.add_argument("--alpha", type=fraction_arg(open_unit=False), default=0.05, metavar="A", help="type-I error of each one-sided test (default 0.05)")
    d.add_argument("--power", type=fraction_arg(open_unit=False), default=0.8, metavar="P", help="power for the sample size and the futility bound (default 0.8)")
    d.add_argument("--floor", type=fraction_arg(open_unit=False), default=0.03, metavar="REL", help="smallest relative gain that counts; threshold = max(2σ, floor) (default 3%%)")
    d.add_argument("--sigma", action="append", default=[], metavar="METRIC=REL",
                   help="relative σ pooled from earlier A/A runs (uses the normal-mixture sequence); default: the state file's sigma_baseline with --trial")
    mode = d.add_mutually_exclusive_group()
    mode.add_argument("--sequential", dest="sequential", action="store_true", default=True,
                      help="always-valid confidence sequences: call after every new run (default)")
    mode.add_argument("--fixed", dest="sequential", action="store_false", help="classical t-test at the planned n (one look only)")
    lay = d.add_mutually_exclusive_group()
    lay.add_argument("--interleaved", dest="layout", action="store_const", const="interleaved", default=None,
                     help="declare baseline and candidate runs interleaved (ABBA) (default: from the run dates)")
    lay.add_argument("--blocked", dest="layout", action="store_const", const="blocked", help="declare the runs blocked (all of one arm, then the other)")
    g = p.add_argument_group("refusals")
    g.add_argument("--allow-anomaly", action="store_true", help="decide even when check_invariants reports an anomaly (never for invalid)")
    g.add_argument("--changed-at", metavar="DATE", help="a detected change point (ISO time or YYYYmmdd-HHMMSS): older baseline runs are refused (default: the state file's drift.change_date)")
    g.add_argument("--ignore-drift", action="store_true", help="do not refuse a baseline older than a detected change point")
    g.add_argument("--ran", action="append", default=[], metavar="CHECK",
                   help="a must-run check of the parameter policy that was run outside gate (e.g. a site's soak rule); "
                        "repeatable, written to the result")
    o = p.add_argument_group("output")
    o.add_argument("--human", action="store_true", help="write the table to stdout instead of JSON")
    o.add_argument("--record", action="store_true", help="with --trial: write the verdict into the trial in the state file")
    return p


def _inputs(args: argparse.Namespace, io: IO) -> tuple[GateInput, dict | None]:
    settings = Settings(alpha=args.alpha, power=args.power, floor=args.floor, sequential=args.sequential, allow_anomaly=args.allow_anomaly)
    primary = parse_metric(args.primary or DEFAULT_PRIMARY, "primary")
    guards = parse_guards(args.guard)
    report = [m.strip() for m in args.report.split(",") if m.strip()] if args.report is not None else None
    sigma = parse_sigma(args.sigma)
    changed_at = None
    if args.changed_at:
        changed_at = parse_date(args.changed_at)
        if changed_at is None:
            raise UsageError(f"--changed-at {args.changed_at!r}: not a date (ISO 8601 or YYYYmmdd-HHMMSS)")
    trial = None
    if args.trial:
        if args.baseline or args.candidate or args.fresh:
            raise UsageError("--trial reads the runs from the state file; do not combine it with --baseline/--candidate/--fresh")
        from vkit.state import StateFile

        sf = StateFile(args.state)
        t = trial_inputs(sf.read(), args.trial, sf.dir)
        trial = {"id": args.trial, "state": sf, "config": t["config"]}
        baseline, candidate, fresh = t["baseline"], t["candidate"], t["fresh"]
        selected = args.selected_from or t["selected_from"]
        layout = args.layout or t["layout"]
        sigma = {**t["sigma_pool"], **sigma}
        changed_at = changed_at or t["changed_at"]
    else:
        if args.record:
            raise UsageError("--record needs --trial (it writes the verdict into that trial)")
        baseline, candidate, fresh = args.baseline, args.candidate, args.fresh
        selected = args.selected_from or 1
        layout = args.layout
    inp = GateInput(baseline=baseline, candidate=candidate, fresh=fresh, primary=primary, guards=guards, report=report,
                    settings=settings, layout=layout, selected_from=selected, sigma_pool=sigma,
                    changed_at=None if args.ignore_drift else changed_at, check_drift=not args.ignore_drift,
                    ran=list(args.ran), policy=load_policy())
    return inp, trial


def _pct(x, signed=True) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def render(res: dict) -> str:
    """The short table for people."""
    lines = [f"gate: {res['decision'].upper()} — {res['why']}"]
    head = f"  {'metric':<22} {'role':<8} {'change':>7} {'interval':>17} {'thresh':>7} {'σ':>6} {'n had/need':>10} {'p':>7}  decision"
    lines.append(head)
    for m in res["metrics"]:
        lo, hi = m.get("interval") or [None, None]
        iv = f"[{_pct(lo)}, {_pct(hi)}]"
        thr = m.get("threshold")
        if m["role"] == "primary" and thr is not None:
            th = ("+" if m["direction"] == "+" else "−") + f"{thr:.1%}"
        elif thr is not None and m["role"] == "guard":
            th = ("−" if m["direction"] == "+" else "+") + f"{thr:.1%}"
        else:
            th = "-"
        had = m["n_had"]["pairs"] if res["mode"] == "sequential" else min(m["n_had"]["baseline"], m["n_had"]["candidate"])
        need = m.get("n_needed")
        p = m.get("p_value")
        ptxt = "n/a" if p is None or not math.isfinite(p) else (f"{p:.3f}" if p >= 0.001 else "<0.001")
        dec = m.get("decision") or ("changed" if m.get("changed") else "-")
        sig = m.get("sigma")
        lines.append(
            f"  {m['metric']:<22} {m['role']:<8} {_pct(m.get('change')):>7} {iv:>17} {th:>7} {_pct(sig, False) if sig else 'n/a':>6} "
            f"{str(had) + '/' + (str(need) if need else '?'):>10} {ptxt:>7}  {dec}"
        )
    ch = res.get("changed") or {}
    lines.append(f"  changed ({ch.get('method')} at {ch.get('level')}): {', '.join(ch.get('metrics') or []) or 'none'}")
    mr = res.get("more_runs")
    if mr:
        lines.append(f"  more runs: {mr.get('baseline', 0)} baseline, {mr.get('candidate', 0)} candidate (interleaved)")
    for w in res.get("warnings") or []:
        lines.append(f"  warning: {w}")
    return "\n".join(lines) + "\n"


def _run(args: argparse.Namespace, io: IO) -> int:
    inp, trial = _inputs(args, io)
    res = decide(inp)
    if trial is not None:
        res["trial"] = trial["id"]
        sf = trial["state"]
        summary = {"decision": res["decision"], "why": res["why"], "primary": {k: res["primary"].get(k) for k in ("metric", "change", "interval", "threshold", "sigma", "n_needed", "n_had")},
                   "more_runs": res["more_runs"], "mode": res["mode"]}
        did = sf.log.append(TOOL, "gate", trial=trial["id"], config=trial["config"], **summary)
        res["decision_id"] = did
        if args.record:
            sf.tune.record_trial_verdict(trial["id"], res["decision"], {**summary, "decision_id": did})
            io.progress(f"verdict recorded in trial {trial['id']} ({did})")
    human = args.human or (io.is_tty() and not args.json)
    if human:
        io.out.write(render(res))
    else:
        io.emit_json(res)
        if io.verbosity >= 1:
            io.err.write(render(res))
    return EXIT_CODE.get(res["decision"], ExitCode.UNDECIDED)


def main(argv: list[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    return run(build_parser(), _run, argv, stdout, stderr, stdin)
