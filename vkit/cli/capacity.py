"""capacity: the SLO capacity of the running server — the highest offered load at which every
SLO holds — with the load–latency curve and the binding SLO; JSON on stdout.

Open loop by default (``--mode rate``: Poisson arrivals, ``--burstiness`` for gamma), or a
closed-loop concurrency ladder (``--mode concurrency``). The dataset flags are bench_stream's.
Each load point's runs are kept under ``--run-dir`` and checked by check_invariants.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from dataclasses import replace

from vkit.cli import bench_stream
from vkit.cli._common import IO, _epilog, fraction_arg, int_at_least, non_negative_float, positive_float, run
from vkit.errors import ExitCode, UsageError, VkitError
from vkit.measure.gauge import check
from vkit.state import atomic_write_text
from vkit.tune import capacity as cap
from vkit.tune import capenergy, capsearch

TOOL = "capacity"
EXAMPLES = [
    "capacity --url http://127.0.0.1:8000 --random-input-len 512 --random-output-len 128 --num-prompts 200 \\\n"
    "      --slo p95_ttft_ms=1000 --slo mean_tpot_ms=50",
    "capacity --url $URL --dataset-name jsonl --dataset-path prompts.jsonl --slo p99_ttft_ms=2000 --goodput-fraction 0.99",
    "capacity --url $URL --mode concurrency --start 8 --slo p95_e2el_ms=20000 --accelerators 8 -o capacity.json",
    "capacity --url $URL --mode trace --dataset-name trace --dataset-path traffic.jsonl --slo p95_ttft_ms=1000",
    "capacity --virtual 'm --sim-model llama-3.1-8b --sim-gpu H200 --max-num-seqs 64' --random-input-len 2048 \\\n"
    "      --random-output-len 64 --slo p95_ttft_ms=500   # what-if: a simulated deployment, in simulated time",
    "capacity --url $URL --slo p95_ttft_ms=1000 --accelerators 4 --price-per-accelerator-hour 2.5 --price-per-kwh 0.15"
    "   # and its cost per million output tokens",
]


def _slo(items: list[str]) -> dict[str, float]:
    out = {}
    for it in items or []:
        k, sep, v = it.partition("=")
        try:
            out[k.strip()] = float(v)
        except ValueError:
            raise UsageError(f"--slo takes METRIC=MS, e.g. p95_ttft_ms=1000; got {it!r}") from None
        if not sep:
            raise UsageError(f"--slo takes METRIC=MS, e.g. p95_ttft_ms=1000; got {it!r}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = bench_stream.build_parser()  # the dataset, target and client flags are bench_stream's own
    p.prog = TOOL
    p.description = ("Find the highest load (open-loop req/s or closed-loop streams) at which every SLO holds, with each "
                     "point's three-way verdict, the curve and the binding SLO; JSON on stdout.")
    p.epilog = ("The load flags of bench_stream (--request-rate, --max-concurrency, --records, --label) are the "
                "search's own and are refused here.\n\n" + _epilog(EXAMPLES, {
                    0: "capacity found (an estimate with its interval closed on both sides)",
                    1: "no load holds the SLO, or the interval is open above (every load up to --max-load holds)",
                    2: "bad flag, unknown SLO metric, a load flag given",
                    4: "the server is unreachable, or the --virtual deployment would not start (vLLM's words)",
                    6: "the level moved during the search (its first load read another margin at the end): no "
                       "capacity decided; the document's 'drift' says by how much"}))
    c = p.add_argument_group("capacity")
    c.add_argument("--virtual", metavar="SIM_SERVER_ARGS",
                   help="search a simulated deployment in virtual time instead of a server: sim_server's command line "
                        "(MODEL, vllm serve flags, --sim-* flags) as one quoted string; no socket, no wall clock, every "
                        "figure simulated (the document's 'virtual' says so, with the simulated seconds it cost)")
    c.add_argument("--slo", action="append", default=[], metavar="METRIC=MS",
                   help="an upper limit, repeatable: p50/p90/p95/p99/mean/median of ttft, tpot, itl, e2el, e.g. p95_ttft_ms=1000")
    c.add_argument("--goodput-fraction", type=fraction_arg(), default=None, metavar="F",
                   help="also require this share of requests to meet every per-request limit (ttft, tpot, e2el), e.g. 0.99")
    c.add_argument("--mode", choices=["rate", "concurrency", "trace"], default="rate",
                   help="rate: open loop, Poisson (or gamma with --burstiness) arrivals; concurrency: closed loop; trace: "
                        "the --dataset-name trace file's own arrivals, the load its speed-up (default rate)")
    c.add_argument("--start", type=positive_float, default=None, metavar="L",
                   help="first load offered (default 4 req/s, 8 streams, or the trace at 1x)")
    c.add_argument("--max-load", type=positive_float, default=10_000.0, metavar="L", help="never offer more (default 10000)")
    add_search_flags(c, "", max_points=12)
    c.add_argument("--accelerators", type=int_at_least(1), default=None, metavar="N", help="divide the capacity by N accelerators too")
    add_price_flags(c)
    c.add_argument("--run-dir", default=None, metavar="DIR", help="where the runs go (default capacity-<time>/ here)")
    return p


def add_price_flags(c) -> None:
    """What serving costs, for the cost per million output tokens at the capacity (capenergy)."""
    c.add_argument("--price-per-accelerator-hour", type=positive_float, default=None, metavar="P",
                   help="what one accelerator costs per hour (needs --accelerators): the cost per million output tokens "
                        "at the capacity is shown")
    c.add_argument("--price-per-kwh", type=positive_float, default=None, metavar="P",
                   help="what a kWh of board energy costs, added to that cost (board power only: no host or cooling)")


def prices_of(args) -> capenergy.Prices:
    if args.price_per_accelerator_hour is not None and not args.accelerators:
        raise UsageError("--price-per-accelerator-hour needs --accelerators N (how many accelerators the server uses)")
    return capenergy.Prices(args.price_per_accelerator_hour, args.price_per_kwh)


def add_search_flags(c, prefix: str, max_points: int, max_runs: int = 24) -> None:
    """The search's own flags, shared with tune (which names them ``--capacity-...``, ``prefix``
    "capacity-"; the point-level ones keep their names there)."""
    what = "capacity: " if prefix else ""
    c.add_argument(f"--{prefix}precision", type=fraction_arg(), default=0.05, metavar="F",
                   help=f"{what}stop when the 95 %% interval's larger side is within F of the capacity (default 0.05)")
    c.add_argument(f"--{prefix}max-runs", type=int_at_least(2), default=max_runs, metavar="N",
                   help=f"{what}runs in all at most (default {max_runs}" + ("; the first search, started cold, 6 more)" if prefix
                                                                           else ")")
                        + "; then one more: the first loads' lowest again, to see that the level did not move")
    c.add_argument("--max-point-seconds", type=positive_float, default=60.0, metavar="S",
                   help=f"{what}open loop: a run sized for its percentile's sampling error sends at most load x S "
                        "requests (default 60)")
    if prefix:  # tune's promise: a load that failed on the fresh start steps down by F
        c.add_argument(f"--{prefix}tolerance", type=fraction_arg(), default=0.10, metavar="F",
                       help=f"{what}the promise steps down from a load that failed by F, then 2F and 4F, and "
                            "stops narrowing within F (default 0.10)")
    c.add_argument(f"--{prefix}max-points", type=int_at_least(2), default=max_points, metavar="N",
                   help=f"{what}distinct loads at most (default {max_points})")
    c.add_argument(f"--{prefix}repeats", type=int_at_least(1), default=6, metavar="N",
                   help=f"{what}runs per load at most: replicates near the crossing are how the interval narrows "
                        "(default 6)")
    c.add_argument(f"--{prefix}noise", type=non_negative_float, default=0.05, metavar="SD",
                   help=f"{what}prior sd of a point's SLO margin between runs, in log units (default 0.05)")
    c.add_argument("--max-send-lag-ms", type=positive_float, default=5.0, metavar="MS",
                   help=f"{what}open loop: a run whose p99 send lag exceeds this measured the client, not the server (default 5)")
    c.add_argument("--point-seconds", type=non_negative_float, default=20.0, metavar="S",
                   help=f"{what}open loop: each run sends at least load x S requests (--num-prompts is the floor), so an "
                        "overloaded server's queue has time to show (default 20)")
    c.add_argument("--crossing-factor", type=positive_float, default=2.0, metavar="F",
                   help=f"{what}open loop: a run near the estimated crossing lasts at least F x --point-seconds (at "
                        "most --max-point-seconds): a queue near saturation relaxes slowly, and a short run there reads "
                        "the boundary on one side (default 2)")
    c.add_argument("--keep-up", type=fraction_arg(), default=0.95, metavar="F",
                   help=f"{what}open loop: a load holds only if the server completes requests at least at F x the offered "
                        "rate, first completion to last (default 0.95)")


def search_plan(args: argparse.Namespace, prefix: str, mode: str, start: float, hi_limit: float = 10_000.0) -> cap.Plan:
    """The search's plan from the flags :func:`add_search_flags` added under ``prefix``."""
    dest = prefix.replace("-", "_")
    return cap.Plan(mode=mode, start=start, lo_limit={"rate": 0.05, "concurrency": 1.0, "trace": 0.01}[mode],
                    hi_limit=hi_limit, tolerance=getattr(args, f"{dest}tolerance", 0.10),
                    max_points=getattr(args, f"{dest}max_points"), model_repeats=getattr(args, f"{dest}repeats"),
                    noise=getattr(args, f"{dest}noise"), max_send_lag_ms=args.max_send_lag_ms, keep_up=args.keep_up,
                    point_seconds=args.point_seconds,
                    precision=getattr(args, f"{dest}precision"), max_runs=getattr(args, f"{dest}max_runs"),
                    max_point_seconds=args.max_point_seconds, crossing_factor=args.crossing_factor)


def _run(args: argparse.Namespace, io: IO) -> int:
    if args.max_concurrency is not None or not math.isinf(args.request_rate) or args.records or args.label:
        raise UsageError("--request-rate, --max-concurrency, --records and --label belong to the search; leave them out")
    slo = cap.Slo(_slo(args.slo), args.goodput_fraction)
    if (args.mode == "trace") != (args.dataset_name == "trace"):
        raise UsageError("--mode trace and --dataset-name trace go together (the load is the trace's speed-up)")
    start = args.start if args.start is not None else {"rate": 4.0, "concurrency": 8.0, "trace": 1.0}[args.mode]
    plan = search_plan(args, "", args.mode, start, hi_limit=args.max_load)
    prices = prices_of(args)  # checked before the search, not after it
    opts = bench_stream.options(args)
    per_request = slo.per_request()
    if args.goodput_fraction is not None:
        if not per_request:
            raise UsageError("--goodput-fraction needs a per-request limit on ttft, tpot or e2el in --slo")
        opts = replace(opts, goodput=per_request)
    check(opts)
    api_key = bench_stream.api_key(args)
    run_dir = args.run_dir or f"capacity-{time.strftime('%Y%m%dT%H%M%S')}"
    virtual = _virtual(args.virtual) if args.virtual is not None else None
    if virtual is not None:
        if args.url:
            raise UsageError("--virtual searches a simulated deployment: leave out --url")
        url = f"virtual://{virtual.opts.model}"
        measure = cap.live_measure(opts, url, run_dir, plan, command=["--virtual", args.virtual], bench=virtual.bench)
    else:
        url = bench_stream.service_url(args)
        measure = cap.live_measure(opts, url, run_dir, plan, command=["--url", url], api_key=api_key,
                                   interrupts=io.interrupts)
    io.progress(f"{url}: capacity search, {args.mode}, SLO {', '.join(f'{k} <= {v:g}' for k, v in slo.limits.items())}"
                + (f", goodput >= {args.goodput_fraction:g}" if args.goodput_fraction else "") + f"; runs in {run_dir}")
    res = capsearch.search(measure, slo, plan, io.progress)
    doc = res.as_dict(args.accelerators, prices)
    doc["run_dir"] = os.path.abspath(run_dir)
    if virtual is not None:
        doc["virtual"] = {"sim_server": args.virtual, **virtual.tally.as_dict(),
                          "time": "simulated seconds of the simulated accelerator; every figure simulated, not measured"}
    if args.output:
        atomic_write_text(args.output, json.dumps(doc, indent=2, sort_keys=True) + "\n")
    io.emit_json(doc)
    io.progress(said(doc))
    if (doc.get("drift") or {}).get("moved"):
        return ExitCode.UNDECIDED  # the level moved during the search: measure again on a quiet machine
    if doc["capacity"] is None:
        return ExitCode.REJECTED
    return ExitCode.OK if doc["upper"] is not None else ExitCode.REJECTED


def _virtual(text: str):
    """The simulated deployment sim_server's command line ``text`` describes, started (vLLM's words
    and exit 4 when it would not start)."""
    from vkit.cli.sim_server import parse_virtual
    from vkit.sim.virtual import VirtualServer

    try:
        argv = shlex.split(text)
    except ValueError as e:
        raise UsageError(f"--virtual: not a sim_server command line ({e}): {text!r}") from None
    vs = VirtualServer(*parse_virtual(argv, 0))
    st = vs.start({})
    if not st.ok:
        raise VkitError(f"the simulated deployment does not start: {' '.join((st.message or '').split())}",
                        ExitCode.UNAVAILABLE)
    return vs


def said(doc: dict) -> str:
    """The search's answer in one line: the estimate and its interval, the binding SLO, the boundary's
    shape, and what it cost; its energy and cost at the capacity on a second line where power was read."""
    e = doc.get("energy") or {}
    if not e.get("available"):
        return _said(doc)
    line = (f"at the capacity: {e['j_per_output_token']:.4g} J per output token, {e['mean_w']:,.0f} W of board power"
            + (f", {e['output_tok_s_per_kw']:,.0f} output tok/s per kW" if e.get("output_tok_s_per_kw") else ""))
    cost = (e.get("cost_per_m_output_tokens") or {}).get("total")
    if cost is not None:
        line += f", {cost:.4g} per million output tokens"
    return _said(doc) + "\n" + line


def _said(doc: dict) -> str:
    unit = doc["unit"]
    cost = f"{doc['points']} loads, {doc['runs']} runs, {doc.get('requests', 0):,} requests"
    if doc.get("request_seconds") is not None:
        cost += f" ({doc['request_seconds']:,.0f} request-seconds)"
    lo, hi = doc["interval"]
    if (doc.get("drift") or {}).get("moved"):
        return f"no capacity decided: {doc['stop']}; {cost}"
    if doc["capacity"] is None:
        where = f"at least {lo:.4g} {unit}" if lo is not None else "no load holds the SLO"
        return f"no capacity: {where}; {doc['stop']}; {cost}"
    side = doc["estimate"].get("half_width")
    ci = "[" + ", ".join(f"{x:.4g}" if x is not None else "?" for x in (lo, hi)) + "]"
    return (f"capacity {doc['capacity']:.4g} {unit}, {100 * doc['level']:.0f} % interval {ci}"
            + (f" (±{100 * side:.1f} %)" if side is not None else "")
            + f", binding {doc['binding_slo']}, {doc.get('boundary') or '?'} boundary; {cost}; stop: {doc['stop']}")


def main(argv: list[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run(build_parser(), _run, argv, stdout, stderr, stdin)
