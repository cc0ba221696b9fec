"""sim_predict: what would this vLLM configuration do? The simulated engine in virtual time, no server.

``bin/sim_predict --sim-model M --sim-gpu G -tp N [--quantization fp8] [vllm serve flags]
--random-input-len I --random-output-len O (--max-concurrency C | --request-rate R) [--sim-profile F]``
prints JSON with the steady-state TTFT, TPOT, ITL and E2EL (mean, P50, P95, P99, seconds),
output and total throughput, the KV-cache capacity and the regime (queue-, prefill- or
decode-bound, from the engine's counters). ``--grid FLAG=v1,v2`` predicts every combination.
Every figure is simulated. See runbook/sim_predict.md.
"""

from __future__ import annotations

import argparse
import itertools
import sys

from vkit.cli._common import IO, int_at_least, make_parser, run
from vkit.cli.sim_server import human_readable_int, human_readable_int_or_auto, normalize_argv
from vkit.errors import ExitCode, UsageError
from vkit.sim.calibrated import load_profile
from vkit.sim.config import SimStartupError
from vkit.sim.predict import Scenario, predict
from vkit.sim.profiles import DEFAULT_GPU, DEFAULT_MODEL, GPUS, KV_DTYPE_BYTES, MODELS, WEIGHT_QUANT_BYTES

# flag dest -> ServeOptions field, for the vllm serve flags a scenario passes on
_SERVE_DESTS = (
    "max_model_len", "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "enable_prefix_caching",
    "scheduling_policy", "gpu_memory_utilization", "block_size", "kv_cache_dtype", "num_gpu_blocks_override",
    "long_prefill_token_threshold",
)
_GRID_OK = _SERVE_DESTS + ("tensor_parallel_size", "quantization", "max_concurrency", "request_rate",
                           "random_input_len", "random_output_len", "sim_gpu", "sim_model", "ramp_steps")


_positive_int, _non_negative_int = int_at_least(1), int_at_least(0)


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {v}")
    return v


def build_parser() -> argparse.ArgumentParser:
    p = make_parser(
        "sim_predict",
        "Predict a vLLM configuration's steady-state latency, throughput, KV capacity and regime on the "
        "simulated engine, in virtual time (no server, no sockets). Every figure is simulated.",
        examples=[
            "sim_predict --sim-model qwen3-32b --sim-gpu H100-80G -tp 2 --random-input-len 1024 "
            "--random-output-len 128 --max-concurrency 32",
            "sim_predict --sim-model llama-3.1-70b --sim-gpu H100-80G -tp 4 --quantization fp8 "
            "--random-input-len 8192 --random-output-len 1024 --request-rate 2",
            "sim_predict --random-input-len 2048 --random-output-len 256 --max-concurrency 64 "
            "--grid max-num-batched-tokens=2048,8192 --grid max-num-seqs=64,256",
            "sim_predict ... --sim-profile h100.json   # a profile fitted by sim_calibrate",
        ],
        exit_notes={1: "the configuration would not start (vLLM's start-up error, one line)",
                    2: "bad flag, bad value, unreadable --sim-profile"},
        common=False,
    )
    p.add_argument("--traceback", action="store_true", help="print a Python traceback on internal errors")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr, errors only")
    s = p.add_argument_group("simulated deployment")
    s.add_argument("--sim-model", choices=list(MODELS), default=DEFAULT_MODEL,
                   help=f"model architecture (default: {DEFAULT_MODEL})")
    s.add_argument("--sim-gpu", choices=list(GPUS), default=DEFAULT_GPU, help=f"accelerator, per device (default: {DEFAULT_GPU})")
    s.add_argument("-tp", "--tensor-parallel-size", type=_positive_int, default=1, metavar="N",
                   help="devices the model is split over (default: 1)")
    s.add_argument("--quantization", choices=sorted(WEIGHT_QUANT_BYTES), default=None,
                   help="weight quantisation: fp8 = 1-byte weights, FP8 GEMMs where the GPU has FP8 tensor cores "
                        "(default: none, the model's dtype)")
    s.add_argument("--sim-profile", metavar="FILE", default=None,
                   help="cost parameters fitted by sim_calibrate (default: the built-in roofline)")
    v = p.add_argument_group("vllm serve options (vLLM's spelling and V1 defaults; underscores accepted)")
    v.add_argument("--max-model-len", type=human_readable_int_or_auto, default=None, metavar="N",
                   help="context length (1k, 1K, auto) (default: the model's max_position_embeddings)")
    v.add_argument("--max-num-seqs", type=_positive_int, default=None, metavar="N",
                   help="most running requests (default: vLLM V1's for the GPU)")
    v.add_argument("--max-num-batched-tokens", type=human_readable_int, default=None, metavar="N",
                   help="token budget per step (default: vLLM V1's for the GPU)")
    v.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="split long prompts across steps (default: on)")
    v.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="reuse KV blocks of shared prefixes (default: on)")
    v.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs", help="(default: fcfs)")
    v.add_argument("--gpu-memory-utilization", type=float, default=0.92, metavar="F",
                   help="fraction of device memory vLLM may use (default: 0.92)")
    v.add_argument("--block-size", type=int, choices=[1, 8, 16, 32, 64, 128, 256], default=16,
                   help="tokens per KV block (default: 16)")
    v.add_argument("--kv-cache-dtype", choices=list(KV_DTYPE_BYTES), default="auto",
                   help="KV cache element type (default: auto)")
    v.add_argument("--num-gpu-blocks-override", type=_positive_int, default=None, metavar="N",
                   help="force the number of KV blocks (default: from memory)")
    v.add_argument("--long-prefill-token-threshold", type=_non_negative_int, default=0, metavar="N",
                   help="cap on one prompt's tokens per step, 0 = none (default: 0)")
    w = p.add_argument_group("workload (vllm bench serve's spelling)")
    w.add_argument("--random-input-len", type=_positive_int, required=True, metavar="I", help="prompt tokens per request")
    w.add_argument("--random-output-len", type=_positive_int, required=True, metavar="O",
                   help="output tokens per request (ignore_eos)")
    m = w.add_mutually_exclusive_group(required=True)
    m.add_argument("--max-concurrency", type=_positive_int, default=None, metavar="C",
                   help="closed loop: a new request as soon as one of the C in flight finishes")
    m.add_argument("--request-rate", type=_positive_float, default=None, metavar="R",
                   help="open loop: Poisson arrivals at R requests/s")
    w.add_argument("--num-prompts", type=_positive_int, default=None, metavar="N",
                   help="requests simulated (default: 10 x C closed loop, 400 Poisson)")
    w.add_argument("--warmup", type=_non_negative_int, default=None, metavar="N",
                   help="first requests left out of every figure (default: 2 x C closed loop, N/10 Poisson)")
    w.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the prompts and Poisson arrivals (default: 0)")
    w.add_argument("--ramp-steps", type=_positive_int, default=None, metavar="N",
                   help="closed loop: the first C requests enter over N engine steps; their phases persist "
                        "(default: the profile's, else one request's lifetime = O steps)")
    w.add_argument("--exact-rate", action="store_true",
                   help="open loop: scale the Poisson gaps so the run offers exactly R on average, as bench_stream "
                        "--exact-rate and capacity do")
    w.add_argument("--burst-start", action="store_true",
                   help="closed loop: the C first requests reach an idle engine together, as a benchmark client "
                        "sends them (bench_stream, vllm bench serve); the first runs alone at once, the others "
                        "join in the next step; all N are measured unless --warmup (instead of --ramp-steps)")
    p.add_argument("--grid", action="append", default=[], metavar="FLAG=V1,V2,...",
                   help="predict every combination of these flag values (repeatable), e.g. max-num-seqs=64,256")
    return p


def _parse_grid(parser: argparse.ArgumentParser, specs: list[str]) -> list[tuple[str, list]]:
    actions = {opt: a for a in parser._actions for opt in a.option_strings}
    axes: list[tuple[str, list]] = []
    for spec in specs:
        flag, eq, values = spec.partition("=")
        flag = "--" + flag.strip().lstrip("-").replace("_", "-")
        if flag == "--tp":
            flag = "-tp"
        act = actions.get(flag)
        if not eq or not values.strip():
            raise UsageError(f"--grid {spec!r}: expected FLAG=V1,V2,...")
        if act is None or act.dest not in _GRID_OK:
            raise UsageError(f"--grid: {flag} is not a flag that can be varied; one of "
                             + ", ".join("--" + d.replace("_", "-") for d in _GRID_OK))
        out = []
        for text in values.split(","):
            text = text.strip()
            try:
                if isinstance(act, argparse.BooleanOptionalAction):
                    low = text.lower()
                    if low not in ("true", "false", "on", "off", "1", "0"):
                        raise ValueError(text)
                    val = low in ("true", "on", "1")
                else:
                    val = act.type(text) if act.type else text
            except (ValueError, argparse.ArgumentTypeError) as e:
                raise UsageError(f"--grid {flag}: invalid value {text!r} ({e})") from None
            if act.choices is not None and val not in act.choices:
                raise UsageError(f"--grid {flag}: invalid choice {text!r} (choose from {', '.join(map(str, act.choices))})")
            out.append(val)
        if any(d == act.dest for d, _ in axes):
            raise UsageError(f"--grid {flag} given twice")
        axes.append((act.dest, out))
    return axes


def _scenario(a: dict) -> Scenario:
    serve = {k: a[k] for k in _SERVE_DESTS if a.get(k) is not None}
    return Scenario(
        model=a["sim_model"], gpu=a["sim_gpu"], isl=a["random_input_len"], osl=a["random_output_len"],
        tp=a["tensor_parallel_size"], quantization=a["quantization"], concurrency=a["max_concurrency"],
        rate=a["request_rate"], num_prompts=a["num_prompts"], warmup=a["warmup"], seed=a["seed"], serve=serve,
        ramp_steps=a["ramp_steps"], burst_start=bool(a.get("burst_start")),
        exact_rate=bool(a.get("exact_rate")),
    )


def _run(args: argparse.Namespace, io: IO, parser: argparse.ArgumentParser) -> int:
    doc = load_profile(args.sim_profile) if args.sim_profile else None
    params = doc["cost_params"] if doc else None
    axes = _parse_grid(parser, args.grid)
    base = dict(vars(args))
    if base["ramp_steps"] is None and doc:
        base["ramp_steps"] = doc["ramp_steps"]
    if not axes:
        io.emit_json(predict(_scenario(base), params))
        return ExitCode.OK
    if any(d == "max_concurrency" for d, _ in axes) and base["request_rate"] is not None or \
            any(d == "request_rate" for d, _ in axes) and base["max_concurrency"] is not None:
        raise UsageError("--grid over --max-concurrency needs a closed loop, over --request-rate an open one")
    points = []
    combos = list(itertools.product(*[vals for _, vals in axes]))
    for k, combo in enumerate(combos, start=1):
        a = dict(base)
        flags = {}
        for (dest, _), val in zip(axes, combo, strict=True):
            a[dest] = val
            flags[dest] = val
        io.progress(f"grid point {k}/{len(combos)}: {flags}")
        try:
            points.append({"flags": flags, "result": predict(_scenario(a), params)})
        except SimStartupError as e:
            points.append({"flags": flags, "error": " ".join(e.message.split()), "error_type": e.exc_type})
    io.emit_json({"axes": {d: v for d, v in axes}, "points": points})
    return ExitCode.OK


def main(argv: list[str] | None = None, stdin=None, stdout=None, stderr=None) -> int:
    argv = normalize_argv(list(sys.argv[1:] if argv is None else argv))
    parser = build_parser()
    return run(parser, lambda args, io: _run(args, io, parser), argv, stdout, stderr, stdin)


if __name__ == "__main__":
    sys.exit(main())
