"""sim_calibrate: fit the simulator's cost model to measured vLLM runs and write a sim profile.

``bin/sim_calibrate RUNS.csv... -o PROFILE.json`` reads measured runs (the calibration CSV
format: closed loop at batch_size, fixed ISL/OSL, mean TTFT and TPOT), simulates each at its
batch size, fits the free cost parameters by bounded least squares on log errors and prints
per-metric MAPE and signed bias on the fitted rows and on held-out rows (k-fold and
leave-one-group-out), and every parameter with its standard error. ``sim_server --sim-profile``
and ``sim_predict --sim-profile`` load the profile. See runbook/sim_calibrate.md.

``--load-points STATE`` fits instead to the open-loop load points of the capacity searches a tune state
recorded (its baseline's, and its trials' with ``--with-trials``), each replayed as the run it was
(:mod:`vkit.sim.loadfit`); it says which parameters the points identify and refuses, one line each, the
points that cannot calibrate.
"""

from __future__ import annotations

import argparse
import sys

from vkit.cli._common import IO, make_parser, run
from vkit.errors import ExitCode, InvalidData, UsageError
from vkit.sim import loadfit
from vkit.sim.calibrate import FREE, Target, calibrate
from vkit.sim.calibrated import CostParams, load_profile, write_profile


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(
        "sim_calibrate",
        "Fit the simulator's step-cost parameters to measured vLLM runs (least squares on log errors) and "
        "write a sim profile for sim_server / sim_predict --sim-profile.",
        examples=[
            "sim_calibrate ../shared/calibration/vllm_measured_runs.csv -o h100.json",
            "sim_calibrate runs.csv -o p.json --folds 0 --group-by none     # fit only, no held-out refits",
            "sim_calibrate runs.csv -o p.json --free mfu,mbu,decode_step_overhead_s --json",
            "sim_calibrate runs.csv -o qwen.json --select qwen3-32b/H100-80G/bf16   # one model's twin",
            "sim_calibrate vkit-state/runs/*.json --state vkit-state/vkit.json --sim-model llama-3.1-8b --sim-gpu H100-80G "
            "-tp 1 -o twin.json   # this server's own baseline runs",
            "sim_calibrate --load-points vkit-state/vkit.json -o twin.json   # the capacity searches' load points "
            "(the simulator names its model and GPU; a real server: --sim-model M --sim-gpu G -tp N)",
        ],
        exit_notes={2: "unreadable or malformed runs file, unknown parameter",
                    3: "the fit did not converge; --load-points: no load point could calibrate"},
        common=False,
    )
    p.add_argument("runs", nargs="*", metavar="RUNS",
                   help="measured runs: calibration CSV files and/or bench_stream summaries (*.json: closed loop, "
                        "fixed lengths, no failed request)")
    lp = p.add_argument_group("open-loop load points (instead of RUNS)")
    lp.add_argument("--load-points", metavar="STATE", default=None,
                    help="fit to the load points of the capacity searches this tune state recorded (its baseline's): "
                         "each replayed at its send times through the engine")
    lp.add_argument("--with-trials", action="store_true", help="--load-points: the trials' searches too")
    lp.add_argument("--start-profile", metavar="PROFILE.json", default=None,
                    help="--load-points: start the fit from this profile's parameters (default: the built-in roofline)")
    t = p.add_argument_group("the server the bench_stream summaries measured (CSV rows name their own)")
    t.add_argument("--state", metavar="FILE", default=None,
                   help="tune state that recorded the summaries: each run's vllm serve flags are its baseline or "
                        "trial configuration there (default: the flags the server's cache_config_info reports)")
    t.add_argument("--sim-model", default=None, metavar="M",
                   help="the simulator's model profile of the served model (default: the simulator's own report)")
    t.add_argument("--sim-gpu", default=None, metavar="G", help="accelerator profile (default: as --sim-model)")
    t.add_argument("-tp", "--tensor-parallel-size", type=int, default=None, metavar="N",
                   help="tensor-parallel size of the server (default: the state's configuration, else 1)")
    t.add_argument("--quantization", choices=["fp8"], default=None, help="weight quantisation of the server")
    p.add_argument("-o", "--output", required=True, metavar="PROFILE.json", help="where to write the fitted profile")
    p.add_argument("--folds", type=int, default=5, metavar="K", help="k-fold held-out check, 0 = none (default: 5)")
    p.add_argument("--group-by", choices=["group", "model_group", "none"], default="group",
                   help="leave-one-group-out check: group = model/GPU/precision/TP, model_group = model/GPU/precision "
                        "(default: group)")
    p.add_argument("--free", default=None, metavar="P1,P2,...",
                   help=f"parameters to fit (default: all: {', '.join(FREE)}; with --load-points: "
                        f"{', '.join(loadfit.DEFAULT_FREE)}, on the host CPU {', '.join(loadfit.CPU_FREE)})")
    p.add_argument("--waves", type=int, default=6, metavar="N",
                   help="simulated requests per row = N x batch size, the first 2 x batch size left out (default: 6)")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the k-fold split (default: 0)")
    p.add_argument("--ramp-steps", default="0,20,40,80", metavar="N1,N2,...",
                   help="closed-loop ramp lengths to try: the batch's first requests enter over N steps "
                        "(0 = one request's lifetime); the best fit is kept (default: 0,20,40,80)")
    p.add_argument("--select", default="", metavar="GROUP[,GROUP...]",
                   help="use only runs whose group (model/GPU/precision/TP, e.g. qwen3-32b/H100-80G/bf16) "
                        "starts with one of these (default: all runs)")
    p.add_argument("--json", action="store_true", help="write the report as JSON to stdout instead of text")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr, errors only")
    p.add_argument("--traceback", action="store_true", help="print a Python traceback on internal errors")
    return p


def _text(report: dict, out) -> None:
    def stats(d: dict) -> str:
        return "  ".join(f"{m.upper()} MAPE {d[m]['mape_pct']:5.1f}% bias {d[m]['bias_pct']:+5.1f}%" for m in ("ttft", "tpot"))

    out.write(f"{report['rows']} measured runs (simulated figures vs measured means)\n")
    out.write(f"  default (uncalibrated)   {stats(report['default'])}\n")
    out.write(f"  fitted rows              {stats(report['fitted'])}\n")
    if "kfold" in report:
        out.write(f"  held out, k-fold         {stats(report['kfold'])}\n")
    if "leave_group_out" in report:
        out.write(f"  held out, leave-one-{report['leave_group_out']['by']}-out {stats(report['leave_group_out'])}\n")
    r = report["closed_loop_ramp_steps"]
    out.write(f"closed-loop ramp kept: {'one request lifetime' if not r else f'{r} steps'} "
              f"(residual cost per ramp: {report['ramp_costs']})\n")
    out.write("parameters (± standard error from the Jacobian):\n")
    for n, v in report["params"].items():
        se = report["stderr"].get(n)
        mark = "  (at its bound)" if n in report["at_bound"] else ""
        out.write(f"  {n:24s} {v:12.6g}" + (f" ± {se:.3g}" if se is not None else "") + mark + "\n")
    out.write("per group (fitted / held-out leave-one-group-out):\n")
    for g, e in report["groups"].items():
        h = e.get("logo")
        out.write(f"  {g:36s} n={e['rows']:3d}  {stats(e['fitted'])}" + (f"  | held out {stats(h)}" if h else "") + "\n")
    for b in report["below_memory_floor"]:
        out.write(f"measured TPOT below the HBM floor of the simulated configuration: {b['run']}: "
                  f"{b['measured_tpot_s'] * 1e3:.1f} ms < {b['floor_s'] * 1e3:.1f} ms (with an FP8 KV cache: "
                  f"{b['floor_fp8_kv_s'] * 1e3:.1f} ms)\n")
    q = report["queue_bound_rows"]
    out.write(f"queue-bound rows (by the measurement): {q['measured']}, reproduced as queue-bound: {q['reproduced']}\n")


def _free(args: argparse.Namespace) -> list[str] | None:
    """--free's parameters, checked; None for load points without --free (the device that served them decides)."""
    if args.free is None and args.load_points:
        return None
    given = args.free if args.free is not None else ",".join(FREE)
    free = [n.strip() for n in given.split(",") if n.strip()]
    unknown = [n for n in free if n not in FREE]
    if unknown or not free:
        raise UsageError(f"--free: unknown parameter(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(FREE)}")
    return free


def _load_points(args: argparse.Namespace, io: IO, free: list[str] | None) -> int:
    """--load-points: the capacity searches' open-loop points of a tune state, fitted (vkit.sim.loadfit)."""
    if args.runs:
        raise UsageError("give RUNS or --load-points STATE, not both")
    target = Target(model=args.sim_model, gpu=args.sim_gpu, tp=args.tensor_parallel_size, quantization=args.quantization)
    points, refused = loadfit.points_from_state(args.load_points, target,
                                                ("baseline", "trials") if args.with_trials else ("baseline",))
    for r in refused:
        io.progress(f"refused: {r}")
    if not points:
        why = f"; {len(refused)} refused, e.g. {refused[0]}" if refused else " (no capacity search's load points recorded)"
        raise InvalidData(f"{args.load_points}: no load point can calibrate{why}")
    free = free or list(loadfit.free_for(points[0].gpu))  # without --free: the default for the device that served them
    base = load_profile(args.start_profile)["cost_params"] if args.start_profile else CostParams()
    io.progress(f"{len(points)} load point(s) ({sum(len(p.arrivals) for p in points)} requests); fitting "
                f"{', '.join(free)}: each point replayed through the engine per evaluation (minutes for many points)")
    res = loadfit.fit_points(loadfit.PointProblem(points), free, base, progress=io.progress)
    report = {"load_points": len(points), "refused": refused, "state": args.load_points, "free": free,
              "table": res["table"], "at_bound": res["at_bound"], "errors": res["errors"],
              "rms_log_error": res["rms_log_error"], "points": [p.label() for p in points]}
    write_profile(args.output, res["params"], {n: res["table"][n]["stderr"] for n in free},
                  {"load_points": args.load_points, "free": free, "report": report})
    io.progress(f"wrote {args.output}")
    if args.json:
        io.emit_json(report)
        return ExitCode.OK
    e = res["errors"]
    io.out.write(f"{len(points)} load points ({len(refused)} refused), mean TTFT and mean TPOT per point\n")
    for name in ("before", "after"):
        io.out.write(f"  {'default (uncalibrated)' if name == 'before' else 'fitted':24s} "
                     + "  ".join(f"{m.upper()} MAPE {e[name][m]['mape_pct']:5.1f}% bias {e[name][m]['bias_pct']:+5.1f}%"
                                 for m in ("ttft", "tpot")) + "\n")
    io.out.write(f"parameters (± standard error; identified: relative standard error < {loadfit.IDENTIFIED_RSE:.0%}):\n")
    for n, row in res["table"].items():
        se = f" ± {row['stderr']:.3g}" if row["stderr"] is not None else ""
        verdict = "identified" if row["identified"] else (
            "at its bound" if n in res["at_bound"] else "NOT identified: the points do not pin it down")
        io.out.write(f"  {n:24s} {row['value']:12.6g}{se:14s} {verdict}\n")
    return ExitCode.OK


def _run(args: argparse.Namespace, io: IO) -> int:
    free = _free(args)
    if args.load_points:
        return _load_points(args, io, free)
    if not args.runs:
        raise UsageError("give the measured runs (RUNS...) or --load-points STATE")
    if args.waves < 3:
        raise UsageError(f"--waves must be >= 3, got {args.waves}")
    try:
        ramps = tuple(int(x) for x in args.ramp_steps.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--ramp-steps: expected integers >= 0, got {args.ramp_steps!r}") from None
    if not ramps or min(ramps) < 0:
        raise UsageError(f"--ramp-steps: expected integers >= 0, got {args.ramp_steps!r}")
    select = tuple(x.strip() for x in args.select.split(",") if x.strip())
    target = Target(model=args.sim_model, gpu=args.sim_gpu, tp=args.tensor_parallel_size, quantization=args.quantization)
    report, params, stderr = calibrate(args.runs, free, args.folds, args.group_by, args.waves, args.seed, io.progress,
                                       ramps, select, target, args.state)
    summary = {k: v for k, v in report.items() if k != "per_row"}
    write_profile(args.output, params, {n: stderr.get(n) for n in free},
                  {"runs": args.runs, "free": free, "report": summary},
                  workload={"closed_loop_ramp_steps": report["closed_loop_ramp_steps"] or None})
    io.progress(f"wrote {args.output}")
    if args.json:
        io.emit_json(report)
    else:
        _text(report, io.out)
    return ExitCode.OK


def main(argv: list[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    return run(build_parser(), _run, list(sys.argv[1:] if argv is None else argv), stdout, stderr, stdin)


if __name__ == "__main__":
    sys.exit(main())
