"""sim_server: a vLLM-faithful server simulator on loopback, the default target of the demo and tests.

``bin/sim_server MODEL [vllm serve flags] [--sim-* flags]`` behaves like ``vllm serve MODEL``:
same flags and defaults, same HTTP contract, /metrics, log lines and start-up failures,
with a simulated accelerator and model (``--sim-gpu``, ``--sim-model``). Every vkit tool
talks to it exactly as it would to real vLLM; /version and the start-up log say it is a
simulator so no report is mistaken for a real measurement. See runbook/sim_server.md.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping

from vkit.cli._common import IO, loop_signals, make_parser, non_negative_float, positive_float, run
from vkit.errors import ExitCode, UsageError
from vkit.sim.config import ServeOptions
from vkit.sim.power import BOARDS
from vkit.sim.profiles import DEFAULT_GPU, DEFAULT_MODEL, GPUS, KV_DTYPE_BYTES, MODELS, WEIGHT_QUANT_BYTES, get_gpu, get_model
from vkit.sim.server import SimSettings, serve
from vkit.sim.starts import next_start
from vkit.sim.vlog import VllmLog

_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def human_readable_int(value: str) -> int:
    """vLLM's parser for large integers: ``1k`` = 1000, ``1K`` = 1024 (also m/M, g/G, t/T)."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match:
        number, suffix = match.groups()
        decimal = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
        binary = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
        if suffix in decimal:
            return int(float(number) * decimal[suffix])
        try:
            return int(number) * binary[suffix]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. "
                f"Did you mean to use {number}{suffix.lower()} instead?"
            ) from None
    return int(value)


def human_readable_int_or_auto(value: str) -> int:
    """``human_readable_int``, plus ``auto`` / ``-1``: fit the KV cache."""
    if value.strip().lower() in ("auto", "-1"):
        return -1
    return human_readable_int(value)


def probability(value: str) -> float:
    v = float(value)
    if not 0 <= v <= 1:
        raise ValueError(value)
    return v


def slowdown(value: str) -> float:
    """A slowdown factor: a number >= 1 (1: none)."""
    v = float(value)
    if not v >= 1:
        raise argparse.ArgumentTypeError(f"{value!r}: a slowdown is a factor >= 1")
    return v


def non_negative_int(value: str) -> int:
    v = int(value)
    if v < 0:
        raise ValueError(value)
    return v


def data_parallel_size(value: str) -> int:
    """``-dp/--data-parallel-size``: vLLM's int, but only 1 is simulated (one engine, ``Engine 000``)."""
    try:
        v = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {value!r}") from None
    if v != 1:
        raise argparse.ArgumentTypeError(
            f"the simulator runs one engine; only 1 is supported (got {v}): "
            "start one sim_server per data-parallel rank instead")
    return v


def normalize_argv(argv: list[str]) -> list[str]:
    """vLLM's FlexibleArgumentParser: ``--max_num_seqs`` means ``--max-num-seqs``."""
    out = []
    for a in argv:
        if a.startswith("--") and len(a) > 2:
            key, eq, val = a.partition("=")
            out.append("--" + key[2:].replace("_", "-") + eq + val)
        else:
            out.append(a)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(
        "sim_server",
        "Serve a simulated vLLM (OpenAI-compatible HTTP, /metrics, logs, start-up failures) on loopback.",
        examples=[
            "sim_server llama-8b --port 8001",
            "sim_server m --max-model-len 8k --max-num-seqs 64 --max-num-batched-tokens 4096",
            "sim_server m --sim-gpu A100-80G --sim-model llama-3.1-70b -tp 4",
            "sim_server m --sim-speed 20 --sim-startup-s 0 --sim-seed 1   # fast, reproducible test server",
            "sim_server m --no-enable-chunked-prefill --sim-pathology short-prefill --sim-gpu Ascend-910B",
            "sim_server m --sim-crash-after 10   # engine dies at request 11: exit 1, as vllm serve on a dead engine",
        ],
        exit_notes={0: "stopped by SIGTERM/SIGINT", 1: "start-up failure or engine death, as vllm serve exits"},
        common=False,
    )
    p.add_argument("model_tag", nargs="?", metavar="MODEL", help="served model id (vllm serve's MODEL)")
    p.add_argument("--model", dest="model_opt", metavar="MODEL", help="the same as the positional MODEL")
    p.add_argument("--traceback", action="store_true", help="print a Python traceback on internal errors")
    v = p.add_argument_group("vllm serve options (vLLM's spelling and V1 defaults; underscores accepted)")
    v.add_argument("--host", default=None, help="address to bind; only loopback is served (default: 127.0.0.1)")
    v.add_argument("--port", type=int, default=8000, help="TCP port (default: 8000)")
    v.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="model name(s) the API accepts; the first is reported (default: MODEL)")
    v.add_argument("--max-model-len", type=human_readable_int_or_auto, default=None, metavar="N",
                   help="context length in tokens; accepts 1k (1000), 1K (1024), auto/-1 (fit the KV cache) "
                        "(default: the model's max_position_embeddings)")
    v.add_argument("--max-num-seqs", type=int, default=None, metavar="N",
                   help="most requests running at once (default: 1024 on >= 70 GiB non-A100 GPUs, else 256)")
    v.add_argument("--max-num-batched-tokens", type=human_readable_int, default=None, metavar="N",
                   help="token budget of one engine step (default: 8192 on >= 70 GiB non-A100 GPUs, else 2048; "
                        "with chunked prefill off, at least max-model-len)")
    v.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="split long prompts across steps (default: on)")
    v.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="reuse KV blocks of shared prompt prefixes (default: on)")
    v.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs",
                   help="fcfs, or priority (the request's 'priority', lower first) (default: fcfs)")
    v.add_argument("--gpu-memory-utilization", type=float, default=0.92, metavar="F",
                   help="fraction of device memory vLLM may use, 0 < F <= 1 (default: 0.92)")
    v.add_argument("--block-size", type=int, choices=[1, 8, 16, 32, 64, 128, 256], default=16,
                   help="tokens per KV block (default: 16)")
    v.add_argument("-tp", "--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="accelerators the model is split over (default: 1)")
    v.add_argument("-dp", "--data-parallel-size", type=data_parallel_size, default=1, metavar="N",
                   help="engine replicas; the simulator runs one engine, so only 1 is accepted (default: 1)")
    v.add_argument("--kv-cache-dtype", choices=list(KV_DTYPE_BYTES), default="auto",
                   help="KV cache element type; fp8 halves its size (default: auto = the model's dtype)")
    v.add_argument("--num-gpu-blocks-override", type=int, default=None, metavar="N",
                   help="force the number of KV blocks, e.g. to provoke preemption (default: from memory)")
    v.add_argument("--long-prefill-token-threshold", type=int, default=0, metavar="N",
                   help="cap on the tokens one prompt takes per step, 0 = none (default: 0)")
    v.add_argument("--max-num-partial-prefills", type=int, default=1, metavar="N",
                   help="only 1 is supported, as in vLLM V1 (default: 1)")
    v.add_argument("--disable-log-stats", action="store_true", help="no periodic 'Engine 000: Avg ...' line")
    v.add_argument("--disable-uvicorn-access-log", action="store_true", help="no per-request access log line")
    ig = p.add_argument_group("accepted and ignored, so that vllm serve command lines run unchanged")
    for flag in ("--load-format", "--dtype", "--seed", "--distributed-executor-backend", "--uvicorn-log-level",
                 "--tokenizer", "--generation-config", "--swap-space", "--download-dir"):
        ig.add_argument(flag, default=None, metavar="X", help=argparse.SUPPRESS)
    v.add_argument("--quantization", default=None, metavar="METHOD",
                   help="fp8: 1-byte weights and FP8 GEMMs (memory, KV capacity and step time follow); "
                        "other methods are accepted and not modelled (default: none)")
    for flag in ("--enforce-eager", "--async-scheduling", "--trust-remote-code"):
        ig.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=argparse.SUPPRESS)
    for flag in ("--disable-log-requests", "--enable-log-requests"):
        ig.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    ig.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1, help=argparse.SUPPRESS)
    add_sim_args(p.add_argument_group("simulator (sim_server only)"))
    f = p.add_argument_group("fault injection (sim_server only)")
    add_fault_args(f)
    f.add_argument("--sim-fault-plan", default=None, metavar="FILE",
                   help="JSON object mapping a start number of --sim-start-file to the fault flags that start gets, "
                        'e.g. {"3": ["--sim-crash-after", "40"]}: faults at chosen moments of a whole tune (default: none)')
    return p


def add_sim_args(s) -> None:
    """The simulator's own flags: the hardware and model simulated, speed, noise, drift and seed."""
    s.add_argument("--sim-gpu", choices=[g for g in GPUS if g in BOARDS], default=DEFAULT_GPU,
                   help=f"simulated accelerator, per device; times -tp (default: {DEFAULT_GPU}). The host CPU "
                        "device is the twin's, for fits to a real server's runs: it has no board to draw power")
    s.add_argument("--sim-model", choices=list(MODELS), default=DEFAULT_MODEL,
                   help=f"simulated model architecture (default: {DEFAULT_MODEL})")
    s.add_argument("--sim-speed", type=positive_float, default=1.0, metavar="K",
                   help="virtual time runs K times faster than wall time; all reported times are wall times "
                        "(default: 1)")
    s.add_argument("--sim-startup-s", type=non_negative_float, default=1.0, metavar="S",
                   help="wall seconds of 'model loading' before the socket listens (default: 1)")
    s.add_argument("--sim-noise", type=non_negative_float, default=0.02, metavar="SIGMA",
                   help="run-to-run sd of the step time, so of throughput, between back-to-back runs on one "
                        "process (per-run level, slow wander, jitter); 0 with --sim-restart-noise 0: "
                        "deterministic (default: 0.02)")
    s.add_argument("--sim-restart-noise", type=non_negative_float, default=None, metavar="SIGMA",
                   help="sd of a level drawn once per process start, from the seed and the start count: two "
                        "starts of one configuration differ by this much more (default: 0.75 x --sim-noise)")
    s.add_argument("--sim-start-file", default=os.environ.get("VKIT_SIM_START_FILE"), metavar="FILE",
                   help="counter of this server's starts (created if missing, locked, replaced atomically): "
                        "the same seed and start count give the same between-restart draw (default: "
                        "$VKIT_SIM_START_FILE, else a random start, printed in the log)")
    s.add_argument("--sim-drift", type=float, default=0.0, metavar="D",
                   help="step time grows by the fraction D per hour of simulated time (default: 0)")
    s.add_argument("--sim-drift-since", type=float, default=None, metavar="UNIX_TIME",
                   help="count the drift from this wall-clock time (x --sim-speed) instead of the first step, so a "
                        "restart does not reset it, as a machine's thermals or neighbours would not (default: first step)")
    s.add_argument("--sim-slowdown", type=slowdown, default=1.0, metavar="X",
                   help="one step change: every step takes X times as long once the drift's clock (as --sim-drift "
                        "counts it, restarts included) reaches --sim-slowdown-after: a neighbour's load, a clock "
                        "throttled (default: 1, none)")
    s.add_argument("--sim-slowdown-after", type=non_negative_float, default=0.0, metavar="SECONDS",
                   help="simulated seconds from the drift's start to --sim-slowdown's step (default: 0)")
    s.add_argument("--sim-seed", type=int, default=None, metavar="N",
                   help="seed of the noise and the faults (default: random, printed in the log)")
    s.add_argument("--sim-pathology", choices=["short-prefill"], default=None,
                   help="short-prefill: with chunked prefill off, prompts <= 512 tokens prefill "
                        "--sim-pathology-slowdown times slower (the seed's NPU case) (default: none)")
    s.add_argument("--sim-pathology-slowdown", type=slowdown, default=10.0, metavar="X",
                   help="how many times its own time a short prefill takes under --sim-pathology short-prefill; "
                        "10 puts prefill near the decode rate on the seed's shape, 25 near 0.4x decode, the seed's "
                        "reading (runbook/sim_server.md) (default: 10)")
    s.add_argument("--sim-output-len-mean", type=non_negative_int, default=128, metavar="N",
                   help="without ignore_eos, responses stop at EOS after 1..2N tokens, fixed per prompt "
                        "(default: 128)")
    s.add_argument("--sim-stats-interval-s", type=positive_float, default=10.0, metavar="S",
                   help="wall seconds between 'Engine 000: Avg prompt throughput ...' log lines (default: 10, as vLLM)")
    s.add_argument("--sim-mfu", type=probability, default=0.5, metavar="F",
                   help="achieved fraction of peak FLOP/s in compute-bound steps (default: 0.5)")
    s.add_argument("--sim-mbu", type=probability, default=0.8, metavar="F",
                   help="achieved fraction of peak memory bandwidth in memory-bound steps (default: 0.8)")
    s.add_argument("--sim-profile", default=None, metavar="FILE",
                   help="step-cost parameters fitted by sim_calibrate to measured runs; --sim-mfu / --sim-mbu "
                        "given explicitly override its values (default: the built-in roofline)")
    s.add_argument("--sim-hidden-effects", type=non_negative_int, default=None, metavar="SEED",
                   help="add step-time effects the twin's cost model does not express (CUDA-graph padding, eager steps "
                        "past the largest captured size, per-sequence CPU time, detokenization, attention that grows "
                        "with context), their sizes drawn from SEED: a world to measure the twin against "
                        "(runbook/virtual.md) (default: none)")


def add_fault_args(f) -> None:
    """The fault flags, on the parser or on the fault plan's own parser."""
    f.add_argument("--sim-fail-at-start", action="store_true",
                   help="fail while loading the model with CUDA out of memory, exit 1")
    f.add_argument("--sim-memory-in-use-gib", type=non_negative_float, default=0.0, metavar="G",
                   help="device memory other processes hold at start-up: a gpu_memory_utilization asking for more than "
                        "is free fails to start with vLLM's 'Free memory on device ...' error (default: 0)")
    f.add_argument("--sim-oom-under-load-gib", type=non_negative_float, default=0.0, metavar="G",
                   help="memory the engine needs outside its gpu_memory_utilization budget once it serves concurrent "
                        "requests: where less is left, the first step of more than one request dies of CUDA out of "
                        "memory (a value that starts but fails under load; default: 0, off)")
    f.add_argument("--sim-crash-after", type=non_negative_int, default=None, metavar="N",
                   help="the engine dies when request N+1 arrives: in-flight requests get 500, /health 503, "
                        "then exit 1")
    f.add_argument("--sim-hang-health", action="store_true", help="/health and /ping never answer")
    f.add_argument("--sim-stall-stream-after", type=non_negative_int, default=None, metavar="N",
                   help="every stream goes silent after N tokens and never ends")
    f.add_argument("--sim-error-rate", type=probability, default=0.0, metavar="P",
                   help="answer each generation request with a 500 with probability P (default: 0)")
    f.add_argument("--sim-error-burst", type=error_burst, default=None, metavar="N:M",
                   help="a burst of 5xx: generation requests N+1 to N+M are answered 500 (default: none)")
    f.add_argument("--sim-malformed-sse-after", type=non_negative_int, default=None, metavar="N",
                   help="the stream of generation request N+1 opens with an event that is not JSON, then goes on")


def error_burst(text: str) -> tuple[int, int]:
    """``N:M`` as (N, M): after N requests, M answered 500."""
    n, sep, m = text.partition(":")
    try:
        after, count = int(n), int(m)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not N:M (e.g. 40:5)") from None
    if not sep or after < 0 or count < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: N >= 0 and M >= 1")
    return after, count


def apply_fault_plan(args: argparse.Namespace, path: str, start: int) -> list[str]:
    """The fault flags ``--sim-fault-plan`` gives start number ``start`` set on ``args``; returns them."""
    from vkit.jsonio import read_json

    try:
        plan = read_json(path, "--sim-fault-plan")
    except FileNotFoundError:
        raise UsageError(f"--sim-fault-plan {path}: no such file") from None
    flags = (plan if isinstance(plan, dict) else {}).get(str(start)) or []
    if not isinstance(flags, list) or not all(isinstance(x, str) for x in flags):
        raise UsageError(f"--sim-fault-plan {path}: start {start} must map to a list of flags")
    fp = argparse.ArgumentParser(prog="sim_server --sim-fault-plan", add_help=False)
    add_fault_args(fp)
    try:
        got = fp.parse_args(flags)
    except SystemExit:
        raise UsageError(f"--sim-fault-plan {path}: start {start}: not fault flags: {flags}") from None
    for k, v in vars(got).items():
        if v != fp.get_default(k):
            setattr(args, k, v)
    return flags


def profile_cost_params(args: argparse.Namespace, parser: argparse.ArgumentParser):
    """The CostParams of ``--sim-profile`` (None without one), with explicit --sim-mfu/--sim-mbu applied."""
    if not args.sim_profile:
        return None
    from dataclasses import replace

    from vkit.sim.calibrated import load_profile

    params = load_profile(args.sim_profile)["cost_params"]
    over = {k: getattr(args, "sim_" + k) for k in ("mfu", "mbu") if getattr(args, "sim_" + k) != parser.get_default("sim_" + k)}
    return replace(params, **over) if over else params


def _non_default_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    out = {}
    for k, val in vars(args).items():
        if k in ("model_tag", "model_opt"):
            continue
        if val != p.get_default(k):
            out[k] = val
    return out


def _run(args: argparse.Namespace, io: IO, parser: argparse.ArgumentParser) -> int:
    model = args.model_tag or args.model_opt
    if not model:
        parser.print_usage(io.err)
        io.err.write("sim_server: error: the following arguments are required: MODEL\n")
        return ExitCode.USAGE
    log = VllmLog(io.out, io.err)
    host = args.host or "127.0.0.1"
    if host not in _LOOPBACK:
        log.warning("sim_server.py:1", f"sim_server only serves loopback; binding 127.0.0.1 instead of {host}")
    start = next_start(args.sim_start_file) if args.sim_start_file else int.from_bytes(os.urandom(4), "big")
    if args.sim_fault_plan:
        if not args.sim_start_file:
            raise UsageError("--sim-fault-plan needs --sim-start-file: its faults are given to start numbers")
        planned = apply_fault_plan(args, args.sim_fault_plan, start)
        if planned:
            log.warning("sim_server.py:1", f"fault plan: start {start} gets {' '.join(planned)}")
    opts, settings = options(args, parser, model, start, os.environ)
    return serve(opts, settings, log, on_loop=loop_signals)


def parse_virtual(argv: list[str], start: int) -> tuple[ServeOptions, SimSettings]:
    """sim_server's command line (without the program) as the virtual backend starts it
    (vkit.tune.virtual): the engine's options and the simulator's settings for start ``start``, a
    fault plan's faults for that start applied. A bad command line is a usage error."""
    parser = build_parser()
    try:
        args = parser.parse_args(normalize_argv(list(argv)))
    except SystemExit:
        raise UsageError(f"not a sim_server command line: {' '.join(argv)}") from None
    model = args.model_tag or args.model_opt
    if not model:
        raise UsageError("the sim_server command line names no MODEL")
    if args.sim_fault_plan:
        apply_fault_plan(args, args.sim_fault_plan, start)
    return options(args, parser, model, start, os.environ)


def options(args: argparse.Namespace, parser: argparse.ArgumentParser, model: str, start: int,
            env: Mapping[str, str]) -> tuple[ServeOptions, SimSettings]:
    """The engine's options and the simulator's settings that these flags (and vLLM's environment
    variables in ``env``) ask for: what a live start serves, and what a virtual one (vkit.sim.virtual) runs."""
    host = "127.0.0.1"
    seed = args.sim_seed if args.sim_seed is not None else int.from_bytes(os.urandom(4), "big")
    opts = ServeOptions(
        model=model,
        gpu=get_gpu(args.sim_gpu),
        model_profile=get_model(args.sim_model),
        served_model_name=args.served_model_name,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_chunked_prefill=args.enable_chunked_prefill,
        enable_prefix_caching=args.enable_prefix_caching,
        scheduling_policy=args.scheduling_policy,
        gpu_memory_utilization=args.gpu_memory_utilization,
        block_size=args.block_size,
        tensor_parallel_size=args.tensor_parallel_size,
        kv_cache_dtype=args.kv_cache_dtype,
        num_gpu_blocks_override=args.num_gpu_blocks_override,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        max_num_partial_prefills=args.max_num_partial_prefills,
        allow_long_max_model_len=env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").lower() in ("1", "true"),
        quantization=args.quantization if args.quantization in WEIGHT_QUANT_BYTES else None,
        memory_in_use_bytes=int(args.sim_memory_in_use_gib * (1 << 30)),
    )
    cost_params = profile_cost_params(args, parser)
    nd = {"model": model, **_non_default_args(parser, args)}
    settings = SimSettings(
        host=host, port=args.port, gpu_name=opts.gpu.name, model_name=opts.model_profile.name,
        speed=args.sim_speed, startup_s=args.sim_startup_s, noise=args.sim_noise,
        restart_noise=args.sim_restart_noise, start_index=start, drift_per_hour=args.sim_drift,
        drift_since=args.sim_drift_since, slowdown=args.sim_slowdown, slowdown_after_s=args.sim_slowdown_after,
        seed=seed, pathology=args.sim_pathology, pathology_slowdown=args.sim_pathology_slowdown,
        output_len_mean=args.sim_output_len_mean,
        mfu=args.sim_mfu, mbu=args.sim_mbu, cost_params=cost_params, profile_path=args.sim_profile,
        hidden_seed=args.sim_hidden_effects,
        fail_at_start=args.sim_fail_at_start, oom_under_load_bytes=int(args.sim_oom_under_load_gib * (1 << 30)),
        crash_after=args.sim_crash_after, hang_health=args.sim_hang_health,
        stall_stream_after=args.sim_stall_stream_after, error_rate=args.sim_error_rate,
        error_burst=args.sim_error_burst, malformed_sse_after=args.sim_malformed_sse_after,
        access_log=not args.disable_uvicorn_access_log, log_stats=not args.disable_log_stats,
        stats_interval_s=args.sim_stats_interval_s,
        dev_mode=env.get("VLLM_SERVER_DEV_MODE", "") in ("1", "true", "True"),
        non_default_args=nd,
    )
    return opts, settings


def main(argv: list[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    argv = normalize_argv(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    return run(parser, lambda args, io: _run(args, io, parser), argv, stdout, stderr, stdin)


if __name__ == "__main__":
    sys.exit(main())
