"""Flags shared by sweep and tune, and the typed inputs of vkit.tune.driver built from them:
the workload (gauge), budgets, SLO, the run's context (lease owner, policy, callbacks)."""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from typing import Any

from vkit.cli import capacity as capacity_cli
from vkit.cli._common import IO, fraction_arg, int_at_least, kb_path, lease_owner, load_policy, non_negative_float, positive_float
from vkit.errors import UsageError
from vkit.measure.gauge import BenchOptions
from vkit.tune import capacity as cap
from vkit.tune.config import CapacityObjective, Settings, Workload
from vkit.tune.runplan import RunContext, TunePlan

OBJECTIVE_HELP = ("capacity (default): each configuration's SLO capacity, the highest open-loop request rate at which every "
                  "--slo holds (a capacity search per measurement: an estimate with its 95 %% interval, searched from the reference load, the first baseline "
                  "search's capacity), with mean TPOT at that reference load as the second objective; throughput: output "
                  "throughput at one closed-loop --concurrency, the SLO a constraint on it; capacity-per-kw: the SLO "
                  "capacity per kW of board power at it (searched as capacity is; needs nvidia-smi, npu-smi or rocm-smi "
                  "power on the server's machine, or the simulator's); j-per-token: the fewest J per output token while "
                  "carrying --required-capacity within the SLO (searched as capacity is, every search measuring that "
                  "load; the recommendation is the configuration confirmed with the fewest J/token there)")

# objectives measured by SLO-capacity searches
CAPACITY_KINDS = ("capacity", "capacity-per-kw", "j-per-token")


def is_capacity(args: argparse.Namespace, default: str = "capacity") -> bool:
    return getattr(args, "objective", default) in CAPACITY_KINDS


def add_args(p: argparse.ArgumentParser) -> None:
    w = p.add_argument_group("workload (the gauge: identical for every trial)")
    w.add_argument("--concurrency", type=int, default=64, metavar="N", help="requests in flight, closed loop (default 64)")
    w.add_argument("--input-len", type=int, default=512, metavar="N", help="prompt tokens (default 512)")
    w.add_argument("--output-len", type=int, default=128, metavar="N", help="output tokens, ignore_eos (default 128)")
    w.add_argument("--num-prompts", type=int, default=200, metavar="N", help="requests per measurement, >= 100 for a P99 (default 200)")
    w.add_argument("--vocab-size", type=int, default=1000, metavar="N", help="token ids drawn below N; keep under the model's vocabulary (default 1000)")
    w.add_argument("--seed", type=int, default=1, help="dataset seed of repeat 0; repeat k uses seed+k (default 1)")
    w.add_argument("--stall-timeout", type=float, default=60.0, metavar="S",
                   help="a stream silent for S seconds is a failed request (bench_stream's flag; default 60)")
    w.add_argument("--mixed-long-len", type=int, default=None, metavar="N", help="long prompts of the step-5 mixed workload (default 4x --input-len)")
    w.add_argument("--api-key-env", default=None, metavar="VAR",
                   help="read the server's API key from environment variable VAR; sent as a bearer token, never logged or stored (default: none)")
    w.add_argument("--dataset-path", default=None, metavar="FILE",
                   help="the business's own prompts instead of random tokens: JSON Lines or a JSON array (prompt or messages, "
                        "optional output length per request) or ShareGPT conversations; its sha256 is part of the gauge")
    w.add_argument("--trace", default=None, metavar="FILE",
                   help="the business's own traffic: --dataset-path rows with a 'timestamp' (s), replayed open loop; the "
                        "capacity is then the trace's speed-up at which every SLO holds (rows' 'priority' sent with them)")
    c = p.add_argument_group("objective")
    c.add_argument("--objective", choices=["capacity", "throughput", "capacity-per-kw", "j-per-token"], default="capacity",
                   help=OBJECTIVE_HELP)
    c.add_argument("--required-capacity", type=positive_float, default=None, metavar="R",
                   help="j-per-token: the load the deployment must carry within every --slo, req/s offered (with --trace, "
                        "its speed-up); every capacity search starts there and measures its J per output token there")
    c.add_argument("--energy-axis", action="store_true",
                   help="add J per output token (board power, at the capacity or the run's load) to the Pareto front as an "
                        "objective to minimise: the configuration with the fewest J/token is delivered beside the one "
                        "with the most capacity (needs board power, as capacity-per-kw does)")
    c.add_argument("--goodput-fraction", type=fraction_arg(), default=None, metavar="F",
                   help="capacity: also require this share of requests to meet every per-request limit, e.g. 0.99")
    c.add_argument("--capacity-start", type=positive_float, default=None, metavar="R",
                   help="capacity: the first baseline search's first load: req/s (default 4), or with --trace its speed-up "
                        "(default 1)")
    capacity_cli.add_search_flags(c, "capacity-", max_points=8, max_runs=8)
    c.add_argument("--verify-seconds", type=non_negative_float, default=60.0, metavar="S",
                   help="capacity: at the end, the recommendation's promised load run once for S seconds on a fresh start "
                        "(a short load point cannot show a queue that grows slowly): it holds where a run holds 9 times in 10 "
                        "(three runs or more whose mean margin, less Student's t times its standard error, clears 1.28 sd of "
                        "one run), is run again while unclear (4 runs at a load); a failure steps down by the tolerance, "
                        "then twice and four times it, a hold tries the middle of the gap above it, 12 runs at most; the "
                        "promise is the highest load that clearly held (0: not verified; default 60)")
    c.add_argument("--accelerators", type=int_at_least(1), default=None, metavar="N",
                   help="capacity: accelerators the server uses, for capacity per accelerator")
    capacity_cli.add_price_flags(c)
    d = p.add_argument_group("decisions")
    d.add_argument("--slo", action="append", default=[], metavar="METRIC=VALUE", help="constraint, e.g. p95_ttft_ms=2000 (default p95_ttft_ms=2000)")
    d.add_argument("--baseline-repeats", type=int, default=4, metavar="N", help="runs of the kept configuration for σ (default 4)")
    d.add_argument("--baseline-starts", type=int_at_least(1), default=None, metavar="S",
                   help="server starts the baseline's runs are spread over, as evenly as possible (default 3, or "
                        "repeats - 1 when fewer: one start keeps two runs, for σ within a process). Two starts give σ's "
                        "between-restart part one degree of freedom, three give two; 1 measures no between part")
    d.add_argument("--screen-repeats", type=int_at_least(1), default=2, metavar="N", help="runs per screened candidate at most (default 2; fewer when σ's between-restart part dominates)")
    d.add_argument("--confirm-blocks", type=int_at_least(1), default=6, metavar="N",
                   help="B A A B confirmation blocks at most (default 6: at 2%% noise within a process and 1.5%% between "
                        "starts the power analysis asks for 5): the power analysis at the measured σ plans the blocks, and "
                        "the gate stops after any block that decides; one that needs more is not measured (--yes grants it, "
                        "up to 4x)")
    d.add_argument("--staged-candidates", choices=["policy", "octaves"], default="policy",
                   help="staged steps 2-3 sweep the policy's candidate lists (default) or every power of two in "
                        "max_num_batched_tokens 256-32768 and max_num_seqs 8-512. Measured on the simulator "
                        "(bench/results/tuner.json, 2 scenarios x 8 seeds): policy lists reach 98%% of the optimum in a median "
                        "1 / 3 restarts but their front covers 92 / 97.5%% of the true hypervolume; octaves take 5 / 7 "
                        "restarts for 97.4 / 97.5%%")
    d.add_argument("--confirm-front", type=int_at_least(0), default=4, metavar="N",
                   help="delivered Pareto configurations (other than the kept one) re-confirmed on fresh interleaved runs "
                        "against the kept one before delivery; 0 = none, they are then marked screening-only (default 4)")
    d.add_argument("--ablation", choices=["auto", "off"], default="auto",
                   help="auto (default): after a step keeps a change of several parameters at once (step 2 keeps the "
                        "token budget and the safe max_num_seqs together), each parameter is measured alone against the "
                        "configuration it replaced, so the report says which one paid (seed 000's one-switch control; "
                        "about one baseline and 3 runs a parameter); off: only by hand (sweep --ablate)")
    d.add_argument("--guard", action="append", default=None, metavar="SPEC", help="gate guard, e.g. p95_ttft_ms:-:15%% (default that one)")
    d.add_argument("--time-budget", type=duration_arg, default=None, metavar="T",
                   help="wall time for the whole run (simulated time with --virtual), e.g. 8h, 90m, 600s: a step starts "
                        "no candidate that cannot finish, "
                        "with the step's confirmation, within it (timed from this run's own restarts and measurements), and "
                        "its stop rule says what was given up (default: no limit; the ETA is on stderr either way)")
    r = p.add_argument_group("server")
    r.add_argument("--ready-timeout", type=float, default=600.0, metavar="S", help="seconds to wait for a restarted server (default 600)")
    m = r.add_mutually_exclusive_group()
    m.add_argument("--yes", action="store_true", help="production: confirm every restart without asking")
    m.add_argument("--sandbox", action="store_true", help="offline sandbox: restarts need no confirmation")
    r.add_argument("--lease-ttl", type=float, default=6 * 3600, metavar="S", help="lease lifetime (default 6 h)")
    r.add_argument("--virtual", action="store_true",
                   help="run the state's simulator in virtual time instead of starting it: the launch argv must be "
                        "bin/sim_server's; every restart and run is the simulator's engine with no socket and no wall "
                        "clock (seconds per trial), timed in simulated seconds; every figure simulated")
    r.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="many machines: serve and measure each slot of the state on a node of this Ray cluster (e.g. "
                        "10.0.0.5:6379, or auto), pinned to a node holding the slot's accelerators; the state and the "
                        "decisions stay here. Needs pip install 'vkit[fleet]' here and on the nodes (default: this machine)")


AUTO_HELP = ("auto (default): twin under --objective capacity (without --energy-axis or --trace, with step 2, 3 or 4 "
             "in --steps), falling back to staged when the twin cannot calibrate on the baseline's load points or its fit "
             "fails (the reason logged as twin_fallback and on stderr); staged otherwise. Measured on the virtual backend "
             "(bench/results/capacity_tune_virtual.json, 7 scenarios x 8 seeds): median server starts twin 5-10, staged "
             "20-37; within 98%% of the best capacity twin 38 of 56 tunes, staged 32; a promise broken when measured "
             "afresh 1 each. ")


MODE_HELP = ("staged (seed 000's steps; see --staged-candidates) or bo (Gaussian-process search over every "
             "situational parameter). Measured on the simulator (bench/results/tuner.json): median restarts to 98%% of "
             "the optimum, mean of 2 scenarios: staged 3.0 (policy lists, max_num_seqs above the load in step 2), staged "
             "with octaves 6.25, bo 7.0 (constrained EI), random 14.5, grid 19.75")


TWIN_HELP = ("; twin (--objective capacity only): the simulator, fitted to the baseline's load points, predicts every "
             "configuration's SLO capacity with a 90%% interval and the server screens only those whose interval reaches "
             "past the best measured (vkit.tune.steps.twinsearch); it replaces steps 2-4")


def add_bo_args(s: Any) -> None:  # an argument group of tune's or sweep's parser
    """--mode bo's acquisition and early stop (tune and sweep)."""
    s.add_argument("--acquisition", choices=["auto", "cei", "ehvi", "ei", "ucb"], default="auto",
                   help="--mode bo: what the next proposal maximises. auto: under tune's capacity objective cei; otherwise "
                        "constrained EI under an SLO or with one or four to five objectives, EHVI for two or three without "
                        "an SLO; ehvi (start failures and the SLO as P(feasible)), cei, ei (plain EI), ucb (GP-UCB) on the "
                        "first maximised objective. Median restarts to 98%% of the optimum on the simulator, mean of 2 "
                        "scenarios: throughput under an SLO, 2 parameters (bench/results/tuner.json): cei 7.0, ei 7.5, ucb "
                        "9.75, ehvi 13.25; SLO capacity, tune's 5 parameters (bench/results/tuner_capacity.json, 21 = not "
                        "within 20): cei and ei 14.0, ehvi 16.75, ucb 21 (default auto)")
    s.add_argument("--batch-lie", choices=["kb", "cl-best", "cl-worst", "cl-mean"], default="kb",
                   help="--mode bo with slots: how a proposal made while other trials run treats those not yet measured. kb: "
                        "Kriging believer (at the surrogate's median); cl-best, cl-worst, cl-mean: a constant liar at the "
                        "best, worst or geometric-mean value seen (default kb)")
    s.add_argument("--bo-patience", type=int_at_least(0), default=4, metavar="K",
                   help="--mode bo: stop after K evaluations in a row whose screening found no gain over the kept "
                        "configuration, once the Sobol start is done; 0 never stops early (default 4)")


def add_advisor_args(p: argparse.ArgumentParser) -> None:
    """The advisor's flags (tune and sweep): an OpenAI-compatible model asked for proposals."""
    a = p.add_argument_group("advisor (an OpenAI-compatible model; its answers are proposals like any other)")
    a.add_argument("--advisor", metavar="URL", default=None,
                   help="base URL of an OpenAI-compatible endpoint (e.g. the served model itself) asked for proposals of --mode bo "
                        "and an explanation of the result, at temperature 0 with --seed; every call is in the decision log (default: none)")
    a.add_argument("--advisor-model", metavar="ID", default=None, help="the model to ask (default: the first of the endpoint's /v1/models)")
    a.add_argument("--advisor-key-env", metavar="VAR", default=None,
                   help="read the advisor's API key from environment variable VAR; sent as a bearer token, never logged (default: none)")
    a.add_argument("--advisor-every", type=int_at_least(0), default=2, metavar="N",
                   help="every N-th proposal is asked of the advisor first; a refused or failed answer falls back to the search's "
                        "own (0: explanations only; default 2)")
    a.add_argument("--advisor-timeout", type=positive_float, default=60.0, metavar="S", help="seconds to wait for one answer (default 60)")
    a.add_argument("--advisor-max-tokens", type=int_at_least(16), default=256, metavar="N", help="tokens one answer may take (default 256)")


def advisor_of(args: argparse.Namespace, sf, io: IO, tool: str):
    """The advisor the flags describe (``vkit.tune.advisor.Advisor``, logging to ``sf``'s decision log), or None."""
    if not args.advisor:
        return None
    from vkit.tune import advisor

    s = advisor.AdvisorSettings(url=args.advisor, model=args.advisor_model, key_env=args.advisor_key_env, seed=args.seed,
                                every=args.advisor_every, timeout_s=args.advisor_timeout, max_tokens=args.advisor_max_tokens)
    return advisor.Advisor(s, log=lambda event, **kw: sf.log.append(tool, event, **kw), warn=io.warn)


def duration_arg(text: str) -> float:
    """``8h``, ``90m``, ``600s`` or a number of seconds, as seconds (> 0)."""
    t = text.strip().lower()
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0}.get(t[-1:], None)
    try:
        v = float(t[:-1] if scale else t) * (scale or 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 8h, 90m, 600s)") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a duration must be positive")
    return v


def parse_slo(items: list[str]) -> dict:
    out = {}
    for it in items or ["p95_ttft_ms=2000"]:
        k, sep, v = it.partition("=")
        if not sep:
            raise UsageError(f"--slo takes METRIC=VALUE, got {it!r}")
        try:
            out[k.strip()] = float(v)
        except ValueError:
            raise UsageError(f"--slo {k}: {v!r} is not a number") from None
    return out


def workloads(args: argparse.Namespace, model: str) -> tuple[Workload, Workload]:
    if args.num_prompts < 1 or args.concurrency < 1 or args.input_len < 1 or args.output_len < 1:
        raise UsageError("--num-prompts, --concurrency, --input-len and --output-len must be >= 1")
    key_env = getattr(args, "api_key_env", None)
    if key_env is not None and not os.environ.get(key_env):
        raise UsageError(f"--api-key-env {key_env}: that environment variable is not set")
    common = dict(model=model, random_input_len=args.input_len, random_output_len=args.output_len, num_prompts=args.num_prompts,
                  api_key_env=key_env,
                  max_concurrency=args.concurrency, vocab_size=args.vocab_size, stall_timeout=args.stall_timeout)
    path, trace = getattr(args, "dataset_path", None), getattr(args, "trace", None)
    if path is not None and trace is not None:
        raise UsageError("give --dataset-path (prompts) or --trace (prompts with their arrival times), not both")
    for flag, f in (("--dataset-path", path), ("--trace", trace)):
        if f is not None and not os.path.isfile(f):
            raise UsageError(f"{flag} {f}: no such file")
    if trace is not None and not is_capacity(args):
        raise UsageError("--trace replays recorded arrivals: it needs --objective capacity (the load is its speed-up)")
    main_opts = (BenchOptions(dataset_name="trace", dataset_path=os.path.abspath(trace), **common) if trace else
                 BenchOptions(dataset_name="jsonl", dataset_path=os.path.abspath(path), **common) if path else
                 BenchOptions(dataset_name="random", **common))
    main = Workload(main_opts, seed=args.seed, name="main")
    mixed = Workload(BenchOptions(dataset_name="mixed", mixed_long_len=mixed_long_len(args), **common), seed=args.seed, name="mixed")
    return main, mixed


def mixed_long_len(args: argparse.Namespace) -> int:
    return args.mixed_long_len or 4 * args.input_len


def settings(args: argparse.Namespace, main: Workload) -> Settings:
    need = load_policy().min_repeats()
    if args.baseline_repeats < need:
        raise UsageError(f"--baseline-repeats {args.baseline_repeats}: the parameter policy asks for at least {need} "
                         "repeats of the kept configuration before any gate (rule R3: σ_baseline is measured, not guessed)")
    starts = args.baseline_starts
    if starts is not None and starts > 1 and starts > args.baseline_repeats - 1:
        raise UsageError(f"--baseline-starts {starts}: needs at least {starts + 1} --baseline-repeats (got "
                         f"{args.baseline_repeats}): one start measures two runs, for σ within a process")
    slo = parse_slo(args.slo)
    required = getattr(args, "required_capacity", None)
    if (getattr(args, "objective", None) == "j-per-token") != (required is not None):
        raise UsageError("--objective j-per-token needs --required-capacity R (the load to carry within the SLO), and "
                         "--required-capacity belongs to that objective only")
    objective = capacity_objective(args, slo)
    if objective is not None:
        per_request = objective.slo.per_request()
        if objective.slo.goodput is not None:
            main.options = replace(main.options, goodput=per_request)
        return Settings(workload=main, baseline_repeats=args.baseline_repeats, screen_repeats=args.screen_repeats,
                        confirm_blocks=args.confirm_blocks,
                        primary="slo_capacity_per_kw:+" if args.objective == "capacity-per-kw" else "slo_capacity:+",
                        guards=args.guard or [], slo=slo, energy_axis=bool(getattr(args, "energy_axis", False)),
                        ready_timeout_s=args.ready_timeout, sandbox=not args.yes, capacity=objective, grant_budget=args.yes,
                        time_budget_s=args.time_budget, baseline_starts=starts, required_capacity=required)
    return Settings(workload=main, baseline_repeats=args.baseline_repeats, screen_repeats=args.screen_repeats,
                    confirm_blocks=args.confirm_blocks, guards=args.guard or ["p95_ttft_ms:-:15%"], slo=slo,
                    ready_timeout_s=args.ready_timeout, sandbox=not args.yes, time_budget_s=args.time_budget,
                    grant_budget=args.yes, baseline_starts=starts, energy_axis=bool(getattr(args, "energy_axis", False)))


def capacity_objective(args: argparse.Namespace, slo: dict) -> CapacityObjective | None:
    """The capacity objective from the flags (None with --objective throughput)."""
    if not is_capacity(args, "throughput"):
        return None
    s = cap.Slo(dict(slo), args.goodput_fraction)
    if args.goodput_fraction is not None and not s.per_request():
        raise UsageError("--goodput-fraction needs a per-request limit on ttft, tpot or e2el in --slo")
    mode = "trace" if getattr(args, "trace", None) else "rate"
    start = args.capacity_start if args.capacity_start is not None else (1.0 if mode == "trace" else 4.0)
    plan = capacity_cli.search_plan(args, "capacity-", mode, start)
    return CapacityObjective(slo=s, plan=plan, accelerators=args.accelerators, verify_seconds=args.verify_seconds,
                             prices=capacity_cli.prices_of(args))


def check_confirmation(args: argparse.Namespace) -> None:
    if not (args.yes or args.sandbox):
        raise UsageError("a tuning run restarts the server many times: pass --yes (production) or --sandbox (offline sandbox)")


def context(args: argparse.Namespace, io: IO, tool: str) -> RunContext:
    """The driver's context: ``tool``'s lease owner ($VKIT_LEASE_OWNER), the policy ($VKIT_POLICY), io's callbacks."""
    backend = None
    if getattr(args, "virtual", False):
        if getattr(args, "ray", None):
            raise UsageError("--virtual runs the simulator here, in virtual time: leave out --ray")
        from vkit.cli.sim_server import parse_virtual
        from vkit.tune.virtual import VirtualBackend

        backend = VirtualBackend(parse_virtual)
    return RunContext(tool=tool, owner=lease_owner(tool), policy=load_policy(), lease_ttl_s=args.lease_ttl,
                      progress=io.progress, warn=io.warn, interrupts=io.interrupts, ray=getattr(args, "ray", None),
                      backend=backend)


def tune_plan(args: argparse.Namespace) -> TunePlan:
    """tune's search flags as a plan; the knowledge base is $VKIT_KB, else beside the state."""
    try:
        steps = [x.strip() for x in args.steps.split(",") if x.strip()]
        cands = [int(x) for x in args.max_model_len_candidates.split(",") if x.strip()]
    except ValueError:
        raise UsageError("--steps and --max-model-len-candidates take comma-separated numbers") from None
    bad = [x for x in steps if x not in ("1", "2", "3", "4m", "4", "5")]
    if bad:
        raise UsageError(f"unknown step(s) {', '.join(bad)}: steps are 1 to 5, and 4m (gpu_memory_utilization)")
    if args.mode == "twin" and (getattr(args, "objective", None) != "capacity" or getattr(args, "energy_axis", False)):
        raise UsageError("--search twin predicts SLO capacity, not board power: it needs --objective capacity without "
                         "--energy-axis")
    if args.mode == "twin" and getattr(args, "trace", None):
        raise UsageError("--search twin predicts req/s offered open loop; a --trace's capacity is its speed-up: search "
                         "it with --search staged")
    mode = search_mode(args, steps)
    max_restarts = getattr(args, "max_restarts", None)
    if max_restarts is not None and max_restarts < 1:
        raise UsageError(f"--max-restarts must be >= 1, got {max_restarts}")
    return TunePlan(mode=mode, twin_fallback=args.mode == "auto" and mode == "twin", max_restarts=max_restarts, twin_refit=bool(getattr(args, "twin_refit", False)),
                    twin_design=getattr(args, "twin_design", "off"),
                    steps=steps, budget=args.budget, seed=args.seed, staged_candidates=args.staged_candidates,
                    business_len=args.business_len, max_model_len_candidates=cands, confirm_front=args.confirm_front,
                    ablate=getattr(args, "ablation", "auto") == "auto", restart=args.restart, report_dir=args.report_dir,
                    acquisition=args.acquisition, patience=args.bo_patience, batch_lie=args.batch_lie,
                    kb_path=kb_path(os.path.dirname(os.path.abspath(args.state))))


def search_mode(args: argparse.Namespace, steps: list[str]) -> str:
    """--search as the run's mode: auto is twin where the twin can search (the capacity objective in req/s, no energy
    axis, a step it replaces among --steps), else staged; twin, staged and bo as asked."""
    if args.mode != "auto":
        return args.mode
    twin = (getattr(args, "objective", None) == "capacity" and not getattr(args, "energy_axis", False)
            and not getattr(args, "trace", None) and any(x in steps for x in ("2", "3", "4")))
    return "twin" if twin else "staged"
