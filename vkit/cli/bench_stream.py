"""bench_stream: the streaming gauge — a load generator whose TTFT means something.

First in the measurement pipeline: ``bench_stream ... | check_invariants | gate``.
Writes a summary JSON on stdout whose keys match ``vllm bench serve --save-result``,
plus vkit's own fields under ``"vkit"``; per-request records as JSON Lines with
``--records``. When the state file's service is the URL measured, the run's environment
fingerprint becomes the state's last seen one; a change since the run before is said on stderr
and logged (``environment_changed``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from vkit import environment
from vkit.cli._common import IO, int_at_least, make_parser, positive_float, run
from vkit.errors import ExitCode, StateCorrupt, StateMissing, UsageError
from vkit.measure.gauge import BenchOptions, build_config, check, measure
from vkit.state import StateFile, launch_argv

TOOL = "bench_stream"


def _rate(s: str) -> float:
    if s.lower() in ("inf", "infinity"):
        return math.inf
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid rate: {s!r} (a number of requests/s, or inf)") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"rate must be > 0, got {s}")
    return v


_pos_int = int_at_least(1)
_nonneg_int = int_at_least(0)


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(
        TOOL,
        "Benchmark a vLLM-compatible server with streaming requests; summary JSON (vllm bench serve keys) on stdout.",
        examples=[
            "bench_stream --url http://127.0.0.1:8000 --dataset-name random --random-input-len 512 --random-output-len 128 \\\n"
            "      --num-prompts 200 --max-concurrency 16 --seed 1 --records run1.jsonl > run1.json",
            "bench_stream --url $URL --dataset-name random --request-rate 4 --burstiness 0.5 --num-prompts 300",
            "bench_stream --url $URL --endpoint chat --dataset-name jsonl --dataset-path gsm8k.jsonl --max-concurrency 16",
            "bench_stream --url $URL --dataset-name mixed --max-concurrency 32 --goodput ttft:500 tpot:50 | check_invariants",
        ],
    )
    g = p.add_argument_group("target")
    g.add_argument("--model", help="served model name (default: the first one /v1/models lists)")
    g.add_argument("--endpoint", choices=["completions", "chat"], default="completions", help="API to call (default completions)")
    g.add_argument("--api-key-env", metavar="VAR", help="read the API key from environment variable VAR (never logged)")
    g.add_argument("--no-stream", action="store_true", help="send stream=false (TTFT then equals E2EL: for demonstrating the broken gauge only)")
    d = p.add_argument_group("dataset")
    d.add_argument("--dataset-name", choices=["random", "jsonl", "mixed", "trace"], default="random",
                   help="request set (default random); trace: --dataset-path rows with a 'timestamp' (s) replayed open loop "
                        "at the recorded offsets / --trace-speedup, each row's optional 'priority' sent with it")
    d.add_argument("--dataset-path", metavar="FILE", help="prompt file for --dataset-name jsonl: JSON Lines or one JSON array; fields prompt, messages or "
                   "ShareGPT-style conversations (sent up to the first human turn), optional output_len; its content "
                   "hash is part of the gauge")
    d.add_argument("--random-input-len", type=_pos_int, default=1024, metavar="N", help="input tokens per prompt (default 1024)")
    d.add_argument("--random-output-len", type=_pos_int, default=128, metavar="N", help="output tokens per request (default 128)")
    d.add_argument("--random-range-ratio", type=float, default=0.0, metavar="R", help="lengths uniform in [N(1-R), N(1+R)] (default 0: fixed)")
    d.add_argument("--shared-prefix-len", type=_nonneg_int, default=0, metavar="N", help="tokens of a prefix shared by every prompt (default 0)")
    d.add_argument("--mixed-long-len", type=_pos_int, default=None, metavar="N", help="long prompt length for mixed (default 8x --random-input-len)")
    d.add_argument("--mixed-long-fraction", type=float, default=0.2, metavar="F", help="share of long prompts for mixed (default 0.2)")
    d.add_argument("--vocab-size", type=_pos_int, default=1000, metavar="N", help="token ids are drawn from [10, N) (default 1000; must be below the model's vocab)")
    d.add_argument("--num-prompts", type=_pos_int, default=1000, metavar="N", help="measured requests (default 1000)")
    d.add_argument("--seed", type=int, default=0, help="seed of the dataset and arrivals (default 0)")
    ld = p.add_argument_group("load")
    ld.add_argument("--max-concurrency", type=_pos_int, default=None, metavar="N", help="at most N requests in flight (closed loop with --request-rate inf)")
    ld.add_argument("--request-rate", type=_rate, default=math.inf, metavar="R", help="requests/s for an open loop, or inf (default inf)")
    ld.add_argument("--burstiness", type=float, default=1.0, metavar="B", help="gamma shape of inter-arrivals; 1 = Poisson (default 1)")
    ld.add_argument("--trace-speedup", type=positive_float, default=1.0, metavar="F",
                    help="--dataset-name trace: replay the recorded arrivals F times faster (default 1)")
    ld.add_argument("--exact-rate", action="store_true",
                    help="scale the drawn inter-arrival gaps so the run offers exactly --request-rate on average "
                         "(a 200-request Poisson run is off by ~7%% by chance; capacity searches use this)")
    ld.add_argument("--duration", type=float, default=None, metavar="S", help="stop sending after S seconds, cycling the request set")
    ld.add_argument("--num-warmups", type=_nonneg_int, default=0, metavar="N", help="unmeasured requests first (default 0)")
    ld.add_argument("--stall-timeout", type=float, default=60.0, metavar="S", help="a stream silent for S seconds is a failed request (default 60)")
    ld.add_argument("--drain-timeout", type=float, default=60.0, metavar="S", help="after Ctrl-C, wait up to S seconds for in-flight requests (default 60)")
    ld.add_argument("--transport", choices=["auto", "loop", "threads"], default="auto",
                    help="client transport: loop = every stream on one thread (selectors), threads = one thread and "
                         "connection per stream; auto = loop for http, threads for https (default auto)")
    ld.add_argument("--scrape-interval", type=float, default=1.0, metavar="S", help="/metrics scrape period during the run, 0 = only before/after (default 1)")
    o = p.add_argument_group("output")
    o.add_argument("--goodput", nargs="+", metavar="KEY:MS", help="SLOs for request_goodput, e.g. ttft:500 tpot:50 e2el:10000")
    o.add_argument("--records", metavar="FILE", help="write per-request records as JSON Lines")
    o.add_argument("-o", "--output", metavar="FILE", help="also write the summary to FILE")
    o.add_argument("--label", help="free text stored in the summary's label")
    o.add_argument("--idle-power-w", type=positive_float, default=None, metavar="W",
                   help="the boards' idle power (all of them, W) to judge the run's board power against (default: the "
                        "one post_start_verify measured at this server's start, from --state)")
    return p


def parse_goodput(items: list[str] | None) -> dict | None:
    if not items:
        return None
    out = {}
    for it in items:
        k, sep, v = it.partition(":")
        if not sep or k not in ("ttft", "tpot", "e2el"):
            raise UsageError(f"--goodput takes ttft:MS tpot:MS e2el:MS, got {it!r}")
        try:
            out[k] = float(v)
        except ValueError:
            raise UsageError(f"--goodput {k}: {v!r} is not a number of milliseconds") from None
    return out


def options(args: argparse.Namespace) -> BenchOptions:
    return BenchOptions(
        model=args.model, endpoint=args.endpoint, no_stream=args.no_stream, dataset_name=args.dataset_name,
        dataset_path=args.dataset_path, random_input_len=args.random_input_len, random_output_len=args.random_output_len,
        random_range_ratio=args.random_range_ratio, shared_prefix_len=args.shared_prefix_len, mixed_long_len=args.mixed_long_len,
        mixed_long_fraction=args.mixed_long_fraction, vocab_size=args.vocab_size, num_prompts=args.num_prompts, seed=args.seed,
        max_concurrency=args.max_concurrency, request_rate=args.request_rate, burstiness=args.burstiness,
        exact_rate=args.exact_rate, duration=args.duration,
        num_warmups=args.num_warmups, stall_timeout=args.stall_timeout, drain_timeout=args.drain_timeout,
        transport=args.transport, scrape_interval=args.scrape_interval, goodput=parse_goodput(args.goodput),
        api_key_env=args.api_key_env,
        trace_speedup=args.trace_speedup,
    )


def service_url(args: argparse.Namespace) -> str:
    """--url, else the state file's service URL (a usage error when neither is there)."""
    if args.url:
        return args.url
    try:
        return StateFile(args.state).read()["service"]["url"]
    except (StateMissing, KeyError, TypeError):  # a corrupted state file is exit 3, said as such
        raise UsageError("no --url given and no service in the state file") from None


def _service_state(args: argparse.Namespace, url: str) -> tuple[StateFile, dict] | None:
    """The state file whose service this run measures (None when there is none, or it holds
    another URL), and its document: the run's fingerprint is compared with the last one it saw."""
    sf = StateFile(args.state)
    try:
        st = sf.read() if sf.exists() else None
    except (StateMissing, StateCorrupt):
        return None
    if st is None or str(st["service"].get("url") or "").rstrip("/") != url.rstrip("/"):
        return None
    return sf, st


def api_key(args: argparse.Namespace) -> str | None:
    """The key from ``--api-key-env VAR`` (never logged); a usage error when VAR is not set."""
    if not args.api_key_env:
        return None
    key = os.environ.get(args.api_key_env)
    if not key:
        raise UsageError(f"--api-key-env {args.api_key_env}: that environment variable is not set")
    return key


def _run(args: argparse.Namespace, io: IO) -> int:
    opts = options(args)
    check(opts)
    url = service_url(args)
    cfg = build_config(opts, url, args.command_argv)
    cfg.api_key = api_key(args)
    service = _service_state(args, url)
    if service is not None:
        cfg.launch_argv = launch_argv(service[1])  # the service's dtype, quantisation and model in the fingerprint
        cfg.idle_w = (service[1]["service"].get("startup") or {}).get("idle_w")
    if args.idle_power_w is not None:
        cfg.idle_w = args.idle_power_w
    if not cfg.stream:
        io.warn("streaming is OFF (--no-stream): TTFT will equal E2EL and every TTFT figure is void")

    def progress(p: dict) -> None:
        tot = p["total"] if p["total"] is not None else "?"
        io.progress(f"{p['done']}/{tot} done, {p['output_tok_s']:.0f} out tok/s, {p['errors']} errors, {p['elapsed_s']:.1f} s")

    io.progress(f"{cfg.url}: {len(cfg.requests)} requests, "
                + (f"{cfg.max_concurrency} in flight" if cfg.max_concurrency else "no concurrency limit")
                + (f", {cfg.request_rate:g} req/s" if not math.isinf(cfg.request_rate) else ""))
    out = measure(cfg, records=args.records, output=args.output, label=args.label, progress=progress, interrupts=io.interrupts,
                  on_interrupt=lambda: io.warn("interrupted: no new requests; waiting for in-flight ones (Ctrl-C again to stop waiting)"))
    s = out.summary
    if service is not None:
        found = service[0].service.note_fingerprint(TOOL, s["vkit"]["fingerprint"], run=os.path.abspath(args.output) if args.output else None)
        if found:
            io.warn(environment.warning(found, args.output))
    io.emit_json(s)
    io.progress(
        f"done: {s['completed']} ok, {s['failed']} failed in {s['duration']:.1f} s; {s['output_throughput']:.1f} out tok/s; "
        f"TTFT mean {s['mean_ttft_ms']:.1f} ms, TPOT mean {s['mean_tpot_ms']:.2f} ms"
        + ("; PARTIAL (interrupted)" if out.partial else "")
    )
    if s["failed"]:
        top = sorted(s["vkit"]["errors"].items(), key=lambda kv: -kv[1])[:3]
        io.warn("failed requests: " + "; ".join(f"{c}x {m}" for m, c in top))
    return ExitCode.INTERRUPTED if out.partial else ExitCode.OK


def main(argv: list[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    parser.set_defaults(command_argv=argv)
    return run(parser, _run, argv, stdout, stderr, stdin)
