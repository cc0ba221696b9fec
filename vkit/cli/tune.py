"""tune: the whole tuning run — LEASE → BASELINE → the staged steps (or Bayesian search) with a
drift check between them → CONVERGE — and the report.

The main job a field engineer runs (`make tune`, or `make demo` on the simulator). It composes
the single-purpose tools through vkit.tune.runner; every step can also be run alone with
`sweep --step N`. Killed at any point, the same command continues from the state file.
"""

from __future__ import annotations

import argparse
import os
import time

from vkit.cli import _tuneargs as ta
from vkit.cli._common import IO, kb_path, load_policy, make_parser, run
from vkit.errors import ExitCode, UsageError, VkitError
from vkit.state import now_iso
from vkit.tune import knowledge

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
        ],
    )
    ta.add_args(p)
    s = p.add_argument_group("search")
    s.add_argument("--mode", choices=["staged", "bo"], default="staged", help=ta.MODE_HELP)
    s.add_argument("--steps", default="1,2,3,4,5", help="steps to run, comma-separated (default 1,2,3,4,5)")
    s.add_argument("--budget", type=int, default=8, metavar="N", help="trials per step (staged) or in all (bo) at most (default 8)")
    s.add_argument("--business-len", type=int, default=None, metavar="N",
                   help="step 1: the context the business needs (default (longest prompt + output) x 1.25)")
    s.add_argument("--max-model-len-candidates", default="1024,2048,4096,8192", metavar="L,L",
                   help="step 1 candidates (default 1024,2048,4096,8192)")
    s.add_argument("--report-dir", default=None, metavar="DIR", help="where report.md/.html/result.json go (default: reports/ beside the state)")
    s.add_argument("--restart", action="store_true", help="start a new tuning run even if the state holds an unfinished one")
    return p


def _run(args: argparse.Namespace, io: IO) -> int:
    from vkit.tune import steps as tuning

    try:
        steps = [x.strip() for x in args.steps.split(",") if x.strip()]
        cands = [int(x) for x in args.max_model_len_candidates.split(",") if x.strip()]
    except ValueError:
        raise UsageError("--steps and --max-model-len-candidates take comma-separated numbers") from None
    bad = [x for x in steps if x not in ("1", "2", "3", "4", "5")]
    if bad:
        raise UsageError(f"unknown step(s) {', '.join(bad)}: steps are 1 to 5")
    ta.check_confirmation(args)
    t0 = time.time()
    with ta.held(args, io, TOOL) as (sf, owner):
        st = sf.read()
        model = st["service"]["model"]
        main, mixed = ta.workloads(args, model)
        settings = ta.settings(args, main)
        cfg = {"mode": args.mode, "steps": steps, "budget": args.budget, "workload": main.describe(), "slo": settings.slo,
               "guards": settings.guards, "baseline_repeats": settings.baseline_repeats, "screen_repeats": settings.screen_repeats}
        prev = st.get("tune") or {}
        if args.restart or not prev or prev.get("finished"):
            cfg["run_id"] = time.strftime("run-%Y%m%dT%H%M%S", time.gmtime())
            cfg["started"] = now_iso()
            sf.start_tune_run(cfg, archive=bool(prev))
        else:
            mine = {k: v for k, v in cfg.items()}
            theirs = {k: prev.get(k) for k in mine}
            if mine != theirs:
                diff = sorted(k for k in mine if mine[k] != theirs[k])
                raise UsageError(f"this state holds an unfinished tuning run with other settings ({', '.join(diff)}); resume it "
                                 "with the same flags, or pass --restart")
            io.progress(f"resuming tuning run {prev.get('run_id')} ({len(st['trials'])} trials recorded)")
        run_id = sf.read()["tune"]["run_id"]
        runner = ta.runner_for(sf, settings, io, TOOL, owner, run_id=run_id)
        policy = load_policy()
        try:
            sf.set_machine_state("LEASE")
            if "1" in steps:
                longest = ta.mixed_long_len(args) if "5" in steps else args.input_len
                need = args.business_len or int((longest + args.output_len) * 1.25)
                tuning.run_step1(runner, cands, need, args.concurrency, io.progress)
            sf.set_machine_state("BASELINE")
            b = runner.baseline()
            io.progress("baseline: " + ", ".join(f"{k} {v:.1f} (σ {b['sigma'].get(k, 0):.1%})" for k, v in b["metrics"].items()
                                                   if k in ("output_throughput", "p95_ttft_ms", "mean_tpot_ms")))
            staged = [x for x in steps if x in ("2", "3", "4")]
            if staged:
                tuning.guard_anomalies(runner)
            kb = kb_path(sf.dir)
            kb_key = knowledge.fingerprint_key(sf.read(), _server_info(runner))
            kb_work = {"bench_args": main.options.flags(), "slo": settings.slo}
            matched, ignored = knowledge.match(kb, kb_key, kb_work)
            if matched or ignored:
                io.progress(f"knowledge base {kb}: {len(matched)} earlier run(s) of this environment"
                            + (" (used to warm-start the Bayesian search)" if args.mode == "bo" else " (shown; staged mode does not warm-start)")
                            + (f"; {len(ignored)} ignored because the environment changed: " + "; ".join(ignored[:3]) if ignored else ""))
            sf.update_tune_run(knowledge={"path": kb, "matched": [e.get("run_id") for e in matched], "ignored": ignored})
            if args.mode == "bo" and staged:
                sf.set_machine_state("PROPOSE")
                nxt, stop = tuning.bo_proposer(runner, policy, args.budget, args.seed, prior=tuning.prior_observations(matched))
                tuning.run_screening_step(runner, "bo", nxt, io.progress, args.budget, stop)
                _drift(runner, io)
            else:
                for step in staged:
                    sf.set_machine_state("PROPOSE")
                    nxt, stop = tuning.staged_proposer(runner, policy, step, args.staged_candidates)
                    tuning.run_screening_step(runner, step, nxt, io.progress, args.budget, stop)
                    _drift(runner, io)
            if "5" in steps:
                tuning.run_step5(runner, mixed, io.progress)
            sf.set_machine_state("CONVERGE")
            if args.confirm_front > 0:
                tuning.confirm_front(runner, ta.goal(settings), args.confirm_front, io.progress)
            result = build_result(runner, args, settings, t0)
            if not (sf.read().get("tune") or {}).get("kb_recorded"):
                knowledge.record(kb, kb_key, kb_work, tuning.kb_observations(runner), result.get("recommendation"), run_id)
                sf.update_tune_run(kb_recorded=True)
        except VkitError as e:
            if e.code == ExitCode.UNAVAILABLE:
                ab = (sf.read().get("abnormal") or {})
                if ab.get("flag"):
                    io.err.write(f"{TOOL}: ABNORMAL: {ab.get('reason')}\n{TOOL}: what to do: read the server log in "
                                 f"{os.path.join(sf.dir, 'logs')}, fix the cause, then `state --clear-abnormal --reason ...` "
                                 f"and rerun the same command to continue\n")
            raise
    from vkit.report import render as report

    out_dir = args.report_dir or os.path.join(sf.dir, "reports", run_id)
    paths = report.write_report(result, out_dir)
    sf.update_tune_run(finished=now_iso(), report=paths)
    sf.log.append(TOOL, "converge", recommendation=result.get("recommendation"), report=paths)
    if args.json:
        io.emit_json(result)
    else:
        io.out.write(report.render_terminal(result, color=io.is_tty()))
        io.out.write(f"\nreport: {paths.get('html')}  ({paths.get('md')})\n")
    return ExitCode.OK


def _server_info(runner) -> dict:
    b = runner.sf.read().get("baseline") or {}
    try:
        return runner.load(b["runs"][0])["vkit"]["server"].get("version_info") or {}
    except (KeyError, IndexError, OSError, ValueError):
        return {}


def _drift(runner, io: IO) -> None:
    d = runner.sentinel()
    if d["changed"]:
        io.warn(f"drift: the kept configuration's throughput moved {d.get('shift') or 0:+.1%}; re-measuring the baseline")
        runner.baseline(force=True)


def build_result(runner, args, settings, t0: float) -> dict:
    from vkit.tune import steps as tuning

    st = runner.sf.read()
    svc = st["service"]
    goal = ta.goal(settings)
    delivered = tuning.deliver(runner, goal)
    b = st.get("baseline") or {}
    version = _server_info(runner)
    restarts = sum(1 for e in runner.sf.log.read() if e.get("event") in ("applied", "rolled_back", "start_failed"))
    trials = []
    for t in st["trials"]:
        row = {k: t.get(k) for k in ("id", "step", "config", "changes", "status", "verdict", "why", "valid", "metrics",
                                     "kept", "decision_id", "diagnosis")}
        row["status"] = "measured" if t["status"] == "done" else t["status"]
        row["repeats"] = len(t.get("runs") or [])
        trials.append(row)
    warnings = []
    for t in st["trials"]:
        for w in ((t.get("gate") or {}).get("warnings") or []):
            if w not in warnings:
                warnings.append(w)
    return {
        "schema": "vkit.tune/1",
        "title": "vkit tuning report",
        "generated": now_iso(),
        "simulated": bool((version or {}).get("sim")),
        "server": {"url": svc["url"], "model": svc["model"], "version": (version or {}).get("version"),
                   "sim": ({"gpu": version.get("sim_gpu"), "model": version.get("sim_model"), "speed": version.get("sim_speed"),
                            "noise": version.get("sim_noise"), "seed": version.get("sim_seed")} if (version or {}).get("sim") else None),
                   "launch_argv": svc["launch"].get("argv")},
        "workload": {"dataset": "random", "input_len": args.input_len, "output_len": args.output_len,
                     "max_concurrency": args.concurrency, "num_prompts": args.num_prompts, "slo": settings.slo},
        "goal": goal,
        "baseline": {"config": b.get("config"), "repeats": len(b.get("runs") or []),
                     "metrics": {k: {"mean": v, "sigma_rel": (b.get("sigma") or {}).get(k)} for k, v in (b.get("metrics") or {}).items()}},
        "trials": trials,
        "steps": [{"step": s["step"], "name": s.get("name"), "stop_rule": s.get("stop_rule"), "result": s.get("result")}
                  for s in st.get("steps", [])],
        "knee": delivered.get("knee"),
        "pareto": delivered.get("pareto"),
        "not_confirmed": delivered.get("not_confirmed") or [],
        "recommendation": delivered.get("recommendation"),
        "stop_rule": "; ".join(f"step {s['step']}: {s.get('stop_rule')}" for s in st.get("steps", [])),
        "drift": [{"after_trial": d.get("after_trial"), "changed": d.get("changed"), "runs": d.get("runs"),
                   "min_runs": d.get("min_runs"), "detail": d.get("why")} for d in st.get("drift_checks", [])],
        "warnings": warnings + [f"knowledge base: {x}" for x in ((st.get("tune") or {}).get("knowledge") or {}).get("ignored", [])[:3]],
        "knowledge": (st.get("tune") or {}).get("knowledge"),
        "soak": "recommended before delivery: a long bench_stream (30 min or more) at the recommended configuration, with "
                "drift detection over its windows (a short benchmark is not production)",
        "timings": {"total_s": round(time.time() - t0, 1), "restarts": restarts},
    }


def main(argv: list[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    return run(build_parser(), _run, argv, stdout, stderr, stdin)
