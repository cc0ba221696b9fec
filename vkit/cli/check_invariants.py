"""check_invariants: VALIDATE a benchmark report before any analysis — no analysis on a
broken gauge.

Sits between the measurement and the decision: ``bench_stream ... | check_invariants | gate``.
Reads a vkit summary (with its per-request records), a ``vllm bench serve --save-result``
JSON, an AISBench perf result, an evalscope perf summary, a GuideLLM JSON or an AIPerf
``profile_export_aiperf.json``; normalises it to vLLM's definitions (``vkit.validate.formats``) and
applies the invariants (``vkit.validate.invariants``):
TTFT ≡ E2EL, decode timing, prefill faster than decode, Little's law, token accounting,
sample sufficiency, errors, client saturation, client vs server TTFT, intended configuration.
JSON verdict on stdout, a table for people on stderr. Exit 0 valid, 1 anomaly, 3 invalid.
"""

from __future__ import annotations

import argparse

from vkit.cli._common import IO, isatty, make_parser, run
from vkit.errors import UsageError
from vkit.validate.formats import FORMATS, load_report
from vkit.validate.invariants import VERDICT_CODE, Thresholds, check_file, parse_expected_config, render_table, worst

TOOL = "check_invariants"


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(
        TOOL,
        "Validate a benchmark report (vkit, vllm bench serve, AISBench, evalscope, GuideLLM, AIPerf) against measurement "
        "invariants before any analysis; verdict valid, anomaly or invalid.",
        examples=[
            "bench_stream --url http://127.0.0.1:8000 --num-prompts 200 --max-concurrency 16 | check_invariants",
            "check_invariants run1.json --records run1.jsonl",
            "check_invariants after.json --compare before.json          # throughput gain vs E2EL drop",
            "check_invariants trial.json --expect-config max_num_seqs=64 block_size=16",
            "check_invariants outputs/default/20260101_120000/performances/vllm-api/gsm8k.json --closed-loop 16",
            "check_invariants evalscope_out/parallel_16_number_1319/benchmark_summary.json",
            "check_invariants artifacts/my-run/profile_export_aiperf.json --min-samples-p99 0   # AIPerf, 48 requests",
            "check_invariants report.json --human        # the table on stdout, no JSON",
            "check_invariants report.json -q | jq '.checks[] | select(.status == \"fail\")'",
        ],
    )
    p.add_argument("reports", nargs="*", metavar="REPORT", help="report file(s); - or none reads stdin")
    p.add_argument("--records", metavar="FILE", help="per-request records, JSON Lines (default: the file vkit.records names, if there)")
    p.add_argument("--format", default="auto", choices=("auto",) + FORMATS, help="input format (default auto: detected from the content)")
    p.add_argument("--compare", metavar="OTHER", help="baseline run of the same request set, for throughput gain vs E2EL drop")
    p.add_argument("--compare-format", default="auto", choices=("auto",) + FORMATS, metavar="FMT", help="format of OTHER (default auto)")
    p.add_argument("--expect-config", nargs="+", action="extend", default=[], metavar="K=V|FILE",
                   help="configuration the trial meant to apply (vLLM names, e.g. max_num_seqs=64), or a JSON file; put it after REPORT")
    p.add_argument("--human", action="store_true", help="write the table to stdout instead of JSON")
    t = p.add_argument_group("thresholds")
    d = Thresholds()
    t.add_argument("--ttft-e2el-tol", type=float, default=d.ttft_e2el_tol, metavar="REL",
                   help=f"TTFT and E2EL statistics closer than this (relative) count as identical (default {d.ttft_e2el_tol})")
    t.add_argument("--min-prefill-decode-ratio", type=float, default=d.min_prefill_decode_ratio, metavar="X",
                   help=f"prefill tok/s must be at least X times decode tok/s, per request (default {d.min_prefill_decode_ratio})")
    t.add_argument("--little-tol", type=float, default=d.little_tol, metavar="REL",
                   help=f"closed loop: allowed relative gap between throughput × mean E2EL and requests in flight (default {d.little_tol})")
    t.add_argument("--consistency-tol", type=float, default=d.consistency_tol, metavar="REL",
                   help=f"with --compare: allowed |(T/T0)·(E/E0) − 1| (default {d.consistency_tol})")
    t.add_argument("--token-tol", type=float, default=d.token_tol, metavar="REL",
                   help=f"allowed relative gap of token counts: usage vs requested, client vs server (default {d.token_tol})")
    t.add_argument("--min-samples-p99", type=int, default=d.min_samples_p99, metavar="N",
                   help=f"requests a p99 needs; p95 a fifth, p99.9 ten times; 0 disables (default {d.min_samples_p99})")
    t.add_argument("--warmup-outlier-ratio", type=float, default=d.warmup_outlier_ratio, metavar="X",
                   help=f"first-wave median TTFT above X times the rest's = warm-up outliers (default {d.warmup_outlier_ratio})")
    t.add_argument("--max-error-rate", type=float, default=d.max_error_rate, metavar="FRAC",
                   help=f"failed / sent above this is an anomaly (default {d.max_error_rate})")
    t.add_argument("--client-cpu-max", type=float, default=d.client_cpu_max, metavar="FRAC",
                   help=f"client CPU above this fraction of one core = saturated client (default {d.client_cpu_max})")
    t.add_argument("--sched-lag-max-ms", type=float, default=d.sched_lag_max_ms, metavar="MS",
                   help=f"client p99 scheduling lag above this = saturated client, ms (default {d.sched_lag_max_ms:g})")
    t.add_argument("--client-server-ttft-tol-ms", type=float, default=d.client_server_ttft_tol_ms, metavar="MS",
                   help=f"allowed |client − server| mean TTFT, ms (default {d.client_server_ttft_tol_ms:g})")
    t.add_argument("--closed-loop", type=int, default=None, metavar="N",
                   help="declare that the run kept N requests in flight, for sources that do not record it (AISBench)")
    return p


def _thresholds(args: argparse.Namespace) -> Thresholds:
    th = Thresholds(
        ttft_e2el_tol=args.ttft_e2el_tol, min_prefill_decode_ratio=args.min_prefill_decode_ratio,
        little_tol=args.little_tol, consistency_tol=args.consistency_tol, token_tol=args.token_tol,
        min_samples_p99=args.min_samples_p99, warmup_outlier_ratio=args.warmup_outlier_ratio,
        max_error_rate=args.max_error_rate, client_cpu_max=args.client_cpu_max, sched_lag_max_ms=args.sched_lag_max_ms,
        client_server_ttft_tol_ms=args.client_server_ttft_tol_ms, closed_loop=args.closed_loop,
    )
    for name in ("ttft_e2el_tol", "little_tol", "consistency_tol", "token_tol", "max_error_rate", "client_cpu_max",
                 "sched_lag_max_ms", "client_server_ttft_tol_ms", "min_prefill_decode_ratio", "warmup_outlier_ratio"):
        if getattr(th, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must not be negative")
    if th.min_samples_p99 < 0:
        raise UsageError("--min-samples-p99 must not be negative (0 disables the check)")
    if th.closed_loop is not None and th.closed_loop < 1:
        raise UsageError("--closed-loop N needs N >= 1")
    return th


def _run(args: argparse.Namespace, io: IO) -> int:
    reports = args.reports or ["-"]
    if reports.count("-") > 1:
        raise UsageError("stdin (-) can be read only once")
    if args.records and len(reports) > 1:
        raise UsageError("--records belongs to one REPORT; check the reports one at a time")
    if "-" in reports and io.stdin is not None and isatty(io.stdin):
        raise UsageError("no REPORT given and stdin is a terminal; pass a report file or pipe one in (bench_stream ... | check_invariants)")
    th = _thresholds(args)
    expect = parse_expected_config(args.expect_config)
    other = load_report(args.compare, args.compare_format) if args.compare else None
    results = [check_file(path, th, args.format, records=args.records, stdin=io.stdin, other=other, expect=expect).result
               for path in reports]
    verdict = worst([r["verdict"] for r in results])
    human = args.human or (io.is_tty() and not args.json)
    if human:
        for r in results:
            io.out.write(render_table(r))
    else:
        io.emit_json(results[0] if len(results) == 1 else {"tool": TOOL, "valid": verdict == "valid", "verdict": verdict, "reports": results})
        if io.verbosity >= 1:
            for r in results:
                io.err.write(render_table(r))
    return VERDICT_CODE[verdict]


def main(argv: list[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    return run(build_parser(), _run, argv, stdout, stderr, stdin)
