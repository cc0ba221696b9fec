"""What-if prediction on the simulated engine, in virtual time (no sockets, no clocks).

``predict(scenario)`` configures the engine exactly as ``sim_server`` would for the same flags,
drives it with a fixed-length workload — closed loop at ``concurrency`` (a new request the moment
one finishes, like ``vllm bench serve --max-concurrency`` / AIPerf ``--concurrency``) or Poisson
arrivals at ``rate`` — and reports the steady state: the first ``warmup`` requests are left out
of every figure.

Closed loop with fixed lengths has a property the calibration uses: which requests every step
schedules does not depend on how long the steps take (a request arrives exactly when another
finishes, i.e. at a step boundary), so one run records the schedule (:class:`Trace`) and any
cost model's durations can be replayed on it with numpy (``Trace.summary(durations)``), exactly
what a new run would give. With Poisson arrivals the schedule depends on time and each cost
model needs its own run.

Regimes, from the engine's own counters over the measured window:

- ``queue-bound``: admission was blocked by capacity (KV blocks or max-num-seqs: requests kept
  waiting although the step had token budget left) in at least 10% of the steps, and the mean
  queue time (first scheduled − arrival) exceeds the mean time from first schedule to first token;
- ``prefill-bound``: otherwise, if steps that carry prompt tokens take at least half of the
  window's time;
- ``decode-bound``: otherwise.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field

import numpy as np

from vkit.errors import UsageError
from vkit.measure.runse import run_log_se
from vkit.measure.summary import describe_ms, queue_growth
from vkit.sim.calibrated import CostParams, PhysCost
from vkit.sim.config import ServeOptions, resolve
from vkit.sim.engine import CostModel, Engine, EngineConfig, Request
from vkit.sim.profiles import get_gpu, get_model
from vkit.sim.steptime import Noise

# ServeOptions fields a scenario may set (vllm serve flags, in ServeOptions' names).
SERVE_FIELDS = (
    "max_model_len", "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill", "enable_prefix_caching",
    "scheduling_policy", "gpu_memory_utilization", "block_size", "kv_cache_dtype", "num_gpu_blocks_override",
    "long_prefill_token_threshold", "max_num_partial_prefills",
)
REGIMES = ("queue-bound", "prefill-bound", "decode-bound")


@dataclass
class Scenario:
    model: str
    gpu: str
    isl: int
    osl: int
    tp: int = 1
    quantization: str | None = None
    concurrency: int | None = None
    rate: float | None = None
    num_prompts: int | None = None  # default: 10 x concurrency (closed loop), 400 (Poisson)
    warmup: int | None = None  # default: 2 x concurrency (closed loop), num_prompts // 10 (Poisson)
    seed: int = 0
    serve: dict = field(default_factory=dict)
    ramp_steps: int | None = None  # closed loop: the slots' first requests enter over this many steps
    # closed loop: the client's C first requests reach an idle engine together; the first is
    # scheduled alone at once, the others join in the next step (how a benchmark client starts)
    burst_start: bool = False
    # Poisson: gaps scaled so the run offers exactly ``rate`` on average (bench_stream --exact-rate)
    exact_rate: bool = False
    # Poisson: judge the run on its steady state (see :func:`bench_summary`): arrivals go on,
    # unmeasured, past the measured requests until every one of them has finished, and the warm-up
    # is at least the requests that arrive within two of the run's 90th-percentile request lifetimes
    steady: bool = False
    # the simulator's noise (vkit.sim.steptime.Noise): sd of a run's level, sd of a start's level,
    # the run's draw key and the start's (runs of one start share its level, each run draws its own)
    noise: float = 0.0
    restart_noise: float = 0.0
    noise_seed: str = "0"
    start_seed: str = "0"

    def counts(self) -> tuple[int, int]:
        if self.concurrency:
            n = self.num_prompts if self.num_prompts is not None else 10 * self.concurrency
            w = self.warmup if self.warmup is not None else 2 * self.concurrency
        else:
            n = self.num_prompts if self.num_prompts is not None else 400
            w = self.warmup if self.warmup is not None else n // 10
        return n, w

    def check(self) -> None:
        if self.isl < 1 or self.osl < 1:
            raise UsageError("input and output lengths must be >= 1")
        if (self.concurrency is None) == (self.rate is None):
            raise UsageError("give exactly one of --max-concurrency C and --request-rate R")
        if self.concurrency is not None and self.concurrency < 1:
            raise UsageError(f"--max-concurrency must be >= 1, got {self.concurrency}")
        if self.rate is not None and not self.rate > 0:
            raise UsageError(f"--request-rate must be > 0, got {self.rate}")
        n, w = self.counts()
        if n < 1 or w < 0 or w >= n:
            raise UsageError(f"need 0 <= warmup < num-prompts (got warmup {w}, num-prompts {n})")
        unknown = sorted(set(self.serve) - set(SERVE_FIELDS))
        if unknown:
            raise UsageError(f"unknown serve option(s): {', '.join(unknown)}")


class _Recorder:
    """Wraps a cost model and records each step's features (the engine calls it once per step)."""

    def __init__(self, cost):
        self.cost = cost
        self.rows: list[tuple[int, int, int, int, int]] = []

    def step_time(self, tokens, pairs, kv_tokens, sampled, nreqs):
        self.rows.append((tokens, pairs, kv_tokens, sampled, nreqs))
        return self.cost.step_time(tokens, pairs, kv_tokens, sampled, nreqs)


def build(sc: Scenario, params: CostParams | None = None):
    """(engine, resolved, recorder) configured as sim_server configures them for these flags."""
    sc.check()
    model, gpu = get_model(sc.model), get_gpu(sc.gpu)
    opts = ServeOptions(model=model.hf_id, gpu=gpu, model_profile=model, tensor_parallel_size=sc.tp,
                        quantization=sc.quantization, **sc.serve)
    r = resolve(opts)
    cfg = EngineConfig(
        max_model_len=r.max_model_len, max_num_seqs=r.max_num_seqs, max_num_batched_tokens=r.max_num_batched_tokens,
        num_gpu_blocks=r.num_gpu_blocks, block_size=r.block_size, enable_chunked_prefill=r.enable_chunked_prefill,
        enable_prefix_caching=r.enable_prefix_caching, policy=r.scheduling_policy,
        long_prefill_token_threshold=r.long_prefill_token_threshold,
    )
    if params is None and not sc.quantization:
        cost = CostModel(model, gpu, r.tensor_parallel_size, r.kv_dtype_bytes)
    else:
        cost = PhysCost(model, gpu, r.tensor_parallel_size, r.kv_dtype_bytes, params, sc.quantization)
    rec = _Recorder(cost)
    if sc.isl + sc.osl > r.max_model_len:
        raise UsageError(f"input + output length {sc.isl + sc.osl} exceeds max_model_len {r.max_model_len}")
    noise = None
    if sc.noise > 0 or sc.restart_noise > 0:
        # a new run level after 10 ms of idle virtual time, as sim_server at --sim-speed 1
        noise = Noise(sc.noise, seed=sc.noise_seed, regime_gap_s=0.01)
        noise.x_start = random.Random(f"start:{sc.start_seed}").gauss(0.0, sc.restart_noise) if sc.restart_noise > 0 else 0.0
    engine = Engine(cfg, rec, lambda req: 1000 + (req.num_output % 97), 2, noise)
    return engine, r, rec


@dataclass
class Trace:
    """One run's schedule: per step its features and counters, per request its steps."""

    scenario: Scenario
    resolved: object
    feats: np.ndarray  # (steps, 5): tokens, pairs, kv tokens, sampled, requests
    blocked: np.ndarray  # (steps,) bool: admission blocked by capacity after this step
    preempted: np.ndarray  # (steps,) preemptions in the step
    running: np.ndarray  # (steps,) requests scheduled
    kv_usage: np.ndarray  # (steps,) KV usage after the step
    arrival_step: np.ndarray  # (N,) index of the first step that could schedule the request
    sched_step: np.ndarray  # (N,) step that first scheduled it
    token_steps: np.ndarray  # (N, osl) steps whose end emitted each output token
    arrival_time: np.ndarray | None  # (N,) Poisson arrivals (None for closed loop)
    step_start: np.ndarray | None  # (steps,) start times of the run (Poisson)
    durations: np.ndarray  # (steps,) the run's own durations
    warmup: int

    @property
    def closed_loop(self) -> bool:
        return self.arrival_time is None

    def step_times(self, cost: PhysCost) -> np.ndarray:
        f = self.feats
        return cost.step_times(f[:, 0], f[:, 1], f[:, 2], f[:, 3], f[:, 4])

    def means(self, durations: np.ndarray, frontend_s: float = 0.0) -> tuple[float, float]:
        """(mean TTFT, mean TPOT) of the measured requests for these step durations (closed loop)."""
        end = np.cumsum(durations)
        start = end - durations
        w = self.warmup
        arr = start[self.arrival_step[w:]]
        first = end[self.token_steps[w:, 0]]
        last = end[self.token_steps[w:, -1]]
        osl = self.token_steps.shape[1]
        tpot = float(((last - first) / (osl - 1)).mean()) if osl > 1 else 0.0
        return float((first - arr).mean()) + frontend_s, tpot

    def summary(self, durations: np.ndarray | None = None, frontend_s: float = 0.0) -> dict:
        """Steady-state figures for these step durations (closed loop: any cost model's; Poisson:
        only the run's own)."""
        d = self.durations if durations is None else np.asarray(durations, dtype=float)
        if self.closed_loop:
            end = np.cumsum(d)
            start = end - d
            arr = start[self.arrival_step]
        else:
            if durations is not None:
                raise ValueError("a Poisson trace can only be summarised with its own durations")
            start = self.step_start
            end = start + d
            arr = self.arrival_time
        arr = arr - frontend_s  # the client sent it this much earlier than the engine saw it
        w = self.warmup
        tok = end[self.token_steps[w:]]
        a = arr[w:]
        ttft = tok[:, 0] - a
        e2el = tok[:, -1] - a
        osl = tok.shape[1]
        tpot = (tok[:, -1] - tok[:, 0]) / (osl - 1) if osl > 1 else np.zeros(len(a))
        itl = np.diff(tok, axis=1).ravel() if osl > 1 else np.zeros(0)
        first = start[self.sched_step[w:]]
        queue = first - a
        t0, t1 = float(a.min()), float(tok[:, -1].max())
        span = max(t1 - t0, 1e-12)
        win = (start >= t0) & (end <= t1 + 1e-12)
        if not win.any():
            win = np.ones(len(d), dtype=bool)
        dw = d[win]
        f = self.feats[win]
        prefill_share = float(dw[f[:, 0] != f[:, 4]].sum() / max(dw.sum(), 1e-12))
        blocked_share = float(self.blocked[win].mean())
        mean_queue = float(queue.mean())
        mean_prefill = float((ttft - queue).mean())
        if blocked_share >= 0.10 and mean_queue > mean_prefill:
            regime = "queue-bound"
        elif prefill_share >= 0.5:
            regime = "prefill-bound"
        else:
            regime = "decode-bound"
        n = len(a)
        sc = self.scenario
        r = self.resolved
        return {
            "requests": n,
            "duration_s": span,
            "ttft_s": _dist(ttft),
            "tpot_s": _dist(tpot),
            "itl_s": _dist(itl),
            "e2el_s": _dist(e2el),
            "queue_s": _dist(queue),
            "output_throughput_tok_s": n * sc.osl / span,
            "total_throughput_tok_s": n * (sc.isl + sc.osl) / span,
            "request_throughput_req_s": n / span,
            "regime": regime,
            "counters": {
                "steps": int(win.sum()),
                "preemptions": int(self.preempted[win].sum()),
                "prefill_time_share": prefill_share,
                "capacity_blocked_step_share": blocked_share,
                "mean_queue_s": mean_queue,
                "mean_prefill_s": mean_prefill,
                "mean_running": float(self.running[win].mean()),
                "mean_step_tokens": float(f[:, 0].mean()),
                "kv_usage_mean": float(self.kv_usage[win].mean()),
            },
            "kv_cache": {
                "num_gpu_blocks": r.num_gpu_blocks,
                "tokens": r.kv_cache_tokens,
                "max_concurrency_at_max_model_len": r.max_concurrency,
                "max_concurrency_at_workload_len": r.kv_cache_tokens / (sc.isl + sc.osl),
            },
        }


def _dist(x: np.ndarray) -> dict:
    if len(x) == 0:
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0}
    p50, p95, p99 = np.percentile(x, [50, 95, 99])
    return {"mean": float(x.mean()), "p50": float(p50), "p95": float(p95), "p99": float(p99)}


def _poisson_arrivals(rng: random.Random, rate: float, n: int, exact: bool = False, tail: int = 0) -> list[float]:
    """``n`` Poisson arrivals (``exact``: their gaps scaled to offer exactly ``rate``), then ``tail``
    more of the same stream, unscaled: the unmeasured arrivals of a steady run."""
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    if exact and n > 1 and out[-1] > out[0]:
        k = ((n - 1) / rate) / (out[-1] - out[0])
        out = [out[0] + (a - out[0]) * k for a in out]
    t = out[-1] if out else 0.0
    for _ in range(tail):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def _first_slots(sc: Scenario, n_req: int) -> list[tuple[int, int]]:
    """Closed loop: (step it reaches the engine, request id) of the C slots' first requests.

    Evenly over ``ramp_steps`` steps (default: one request's lifetime, osl steps); with fixed
    lengths the phases a ramp sets persist (slots that start in the same step finish, and come
    back, together). ``burst_start``: the first alone at once, the others in the next step."""
    c = min(sc.concurrency, n_req)
    if sc.burst_start:
        return [(0 if i == 0 else 1, i) for i in range(c)]
    span = sc.ramp_steps if sc.ramp_steps is not None else sc.osl
    return [(i * span // c, i) for i in range(c)]


def _capacity_blocked(engine, left: int, chunked: bool, max_num_seqs: int) -> bool:
    """A request waits although the step had token budget for it: KV blocks (or seqs) held it back."""
    if not engine.num_waiting():
        return False
    head = engine.waiting.peek()
    need = 1 if chunked else len(head.token_ids) - head.num_computed
    return left >= need or engine.num_running() >= max_num_seqs


def run_trace(sc: Scenario, params: CostParams | None = None, max_steps: int = 5_000_000) -> Trace:
    """Drive the engine through the scenario and record its schedule."""
    engine, r, rec = build(sc, params)
    n_req, warmup = sc.counts()
    vocab = get_model(sc.model).vocab
    rng = random.Random(sc.seed)
    base = [rng.randrange(256, vocab) for _ in range(sc.isl)]
    # steady: the tail, as many again at most, arrives after the measured requests
    arrivals = _poisson_arrivals(rng, sc.rate, n_req, sc.exact_rate, n_req if sc.steady else 0) if sc.rate else None
    total = n_req if arrivals is None else len(arrivals)
    budget = r.max_num_batched_tokens
    chunked = r.enable_chunked_prefill
    a_stamp: dict[int, int] = {}
    arrival_step = np.zeros(total, dtype=np.int64)
    sched_step = np.full(total, -1, dtype=np.int64)
    token_steps = np.zeros((total, sc.osl), dtype=np.int64)
    blocked, preempted, running, kv_usage, starts, actual = [], [], [], [], [], []
    nxt = 0
    done = 0
    t = 0.0
    step = 0
    pending: list[tuple[int, int]] = []  # closed loop: (step it reaches the engine, request id)
    if arrivals is None:
        pending = _first_slots(sc, n_req)
        nxt = len(pending)

    def admit(i: int, arrival_step: int) -> None:
        prompt = list(base)
        prompt[0] = 256 + i % (vocab - 256)
        req = Request(str(i), prompt, sc.osl, ignore_eos=True, arrival=t if arrivals is None else arrivals[i])
        req.user = i
        arrival_step_of[i] = arrival_step
        engine.add_request(req)

    arrival_step_of = arrival_step
    if arrivals is not None:
        nxt = 0
    while done < n_req:
        if arrivals is None:
            if pending and not engine.has_work():
                # an idle engine runs the next request the moment it arrives: pull the queue forward
                shift = min(a for a, _ in pending) - step
                if shift > 0:
                    pending = [(a - shift, i) for a, i in pending]
            due = [p for p in pending if p[0] <= step]
            if due:
                pending = [p for p in pending if p[0] > step]
                for _a, i in due:
                    # arrival stamped at the start of the step after the one that freed the slot
                    admit(i, min(step, a_stamp.get(i, step)))
        else:
            while nxt < total and arrivals[nxt] <= t:
                admit(nxt, step)
                nxt += 1
            if not engine.has_work():
                t = arrivals[nxt]
                continue
        res = engine.step(t)
        if not res.scheduled:
            if arrivals is not None and nxt < total:
                t = max(t, arrivals[nxt])
                continue
            raise UsageError("the engine cannot schedule the waiting requests (KV cache too small for one prompt?)")
        for q in res.new_scheduled:
            sched_step[q.user] = step
        for q in res.token_reqs:
            token_steps[q.user, q.num_output - 1] = step
        for q in res.finished:
            done += q.user < n_req  # the tail's requests are not waited for
            if arrivals is None and nxt < n_req:
                # the client sees the last token after this step; its next request reaches the
                # engine while step+1 runs, so step+2 is the first that can schedule it
                a_stamp[nxt] = step + 1
                pending.append((step + 2, nxt))
                nxt += 1
        blocked.append(_capacity_blocked(engine, budget - res.num_tokens, chunked, r.max_num_seqs))
        preempted.append(res.num_preempted)
        running.append(len(res.scheduled))
        kv_usage.append(engine.kv_usage())
        starts.append(t)
        actual.append(res.duration)
        t += res.duration
        step += 1
        if step > max_steps:
            raise RuntimeError("simulation did not finish")
    feats = np.asarray(rec.rows, dtype=float)
    if total > n_req:  # the tail's requests leave the run's figures
        arrival_step, sched_step, token_steps = arrival_step[:n_req], sched_step[:n_req], token_steps[:n_req]
        arrivals = arrivals[:n_req]
    return Trace(
        scenario=sc, resolved=r, feats=feats, blocked=np.asarray(blocked), preempted=np.asarray(preempted),
        running=np.asarray(running), kv_usage=np.asarray(kv_usage), arrival_step=arrival_step,
        sched_step=sched_step, token_steps=token_steps,
        arrival_time=np.asarray(arrivals) if arrivals is not None else None,
        step_start=np.asarray(starts) if arrivals is not None else None,
        # with noise, the durations the run had (a replay with another cost model would drop it)
        durations=np.asarray(actual) if engine.noise is not None else np.asarray([rec.cost.step_time(*row) for row in rec.rows]),
        warmup=warmup,
    )


def predict(sc: Scenario, params: CostParams | None = None) -> dict:
    """The scenario's steady-state figures, plus what was simulated."""
    tr = run_trace(sc, params)
    out = tr.summary(frontend_s=params.frontend_s(sc.isl) if params is not None else 0.0)
    n, w = sc.counts()
    r = tr.resolved
    out["scenario"] = {
        "model": get_model(sc.model).name, "gpu": get_gpu(sc.gpu).name, "tensor_parallel_size": sc.tp,
        "quantization": sc.quantization, "input_len": sc.isl, "output_len": sc.osl,
        "max_concurrency": sc.concurrency, "request_rate": sc.rate, "num_prompts": n, "warmup": w,
        "seed": sc.seed, "serve": dict(sc.serve), "ramp_steps": sc.ramp_steps,
        "burst_start": sc.burst_start, "exact_rate": sc.exact_rate,
    }
    out["resolved"] = {
        "max_model_len": r.max_model_len, "max_num_seqs": r.max_num_seqs,
        "max_num_batched_tokens": r.max_num_batched_tokens, "enable_chunked_prefill": r.enable_chunked_prefill,
        "enable_prefix_caching": r.enable_prefix_caching, "gpu_memory_utilization": r.gpu_memory_utilization,
        "kv_cache_dtype": r.kv_cache_dtype, "weights_gib_per_gpu": r.weights_bytes_per_gpu / (1 << 30),
    }
    out["cost_params"] = asdict(params) if params is not None else None
    out["time"] = "virtual seconds (simulated, not measured)"
    return out


def _steady_warmup(arrival: np.ndarray, finish: np.ndarray, w: int) -> int:
    """The warm-up of a steady-state run: at least ``w``, and every request that arrived within two
    90th-percentile request lifetimes of the first arrival, at most half the run. From an empty
    start the server's concurrency rises over one lifetime (by Little's law it is the rate times the
    lifetimes still running), and the requests that arrive during that rise share their batches with
    it for one more. Measured on the TPOT-bound scenario of bench_capacity_interval at its true
    capacity, 450-request runs against 6,000: mean TPOT 5.1 % low with a tenth of the run as
    warm-up and no tail, 1.7 % low with one lifetime and the tail, 0.4 % with two."""
    life = float(np.percentile(finish[w:] - arrival[w:], 90))
    ramp = int(np.searchsorted(arrival, arrival[0] + 2 * life, side="left"))
    return int(min(max(w, ramp), len(arrival) // 2))


def bench_summary(sc: Scenario, params: CostParams | None = None) -> dict:
    """One open-loop run of the scenario as bench_stream would summarise it (its keys, in virtual
    milliseconds): latency statistics of the measured requests (the warm-up left out; with
    ``sc.steady``, a warm-up of two request lifetimes at least and a tail of unmeasured arrivals that
    keeps the server loaded until the last measured request has finished), throughput,
    the completion rate, a send lag of 0 (virtual time never falls behind) and, where the summary
    module has it, the queue's growth over the run. For searches run on the predictor directly."""
    if sc.rate is None:
        raise UsageError("bench_summary is for open-loop (--request-rate) scenarios")
    tr = run_trace(sc, params)
    w = tr.warmup
    end = tr.step_start + tr.durations
    if sc.steady:
        w = _steady_warmup(tr.arrival_time, end[tr.token_steps[:, -1]], w)
    arr = tr.arrival_time[w:]
    tok = end[tr.token_steps[w:]]
    ttft, e2el = tok[:, 0] - arr, tok[:, -1] - arr
    osl = tok.shape[1]
    tpot = (tok[:, -1] - tok[:, 0]) / (osl - 1) if osl > 1 else np.zeros(len(arr))
    itl = np.diff(tok, axis=1).ravel() if osl > 1 else np.zeros(1)
    n = len(arr)
    dur = max(float(tok[:, -1].max() - arr.min()), 1e-9)
    ends = np.sort(tok[:, -1])
    s = {"completed": n, "failed": 0, "num_prompts": n, "request_rate": sc.rate, "duration": dur,
         "request_throughput": n / dur, "output_throughput": n * sc.osl / dur,
         "total_token_throughput": n * (sc.isl + sc.osl) / dur, "total_input_tokens": n * sc.isl,
         "total_output_tokens": n * sc.osl, "max_concurrent_requests": None}
    for x, m in ((ttft, "ttft"), (tpot, "tpot"), (itl, "itl"), (e2el, "e2el")):
        s.update(describe_ms(x, m))  # bench_stream's own statistics
    vk = {"completion_rate": (n - 1) / (ends[-1] - ends[0]) if n > 1 and ends[-1] > ends[0] else None,
          "send_rate": (n - 1) / (arr[-1] - arr[0]) if n > 1 and arr[-1] > arr[0] else None,
          "dispatch_lag_ms": {"p99": 0.0}, "partial": False, "virtual": True}
    vk["queue_growth"] = queue_growth(arr.tolist(), ttft.tolist())
    vk["se_log"] = run_log_se({"ttft": ttft.tolist(), "tpot": tpot.tolist(), "e2el": e2el.tolist()})
    s["vkit"] = vk
    return s
