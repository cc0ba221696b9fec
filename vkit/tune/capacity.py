"""SLO capacity of one configuration: the highest offered load at which every SLO holds.

The load is an open-loop request rate (Poisson or gamma arrivals: production traffic is open
loop), a closed-loop concurrency ladder or a trace's speed-up. This module holds what a search is
made of: one run's margins per SLO (:func:`judge_run`: ``log(limit / value)``, positive where it
holds, with each margin's sampling error; open loop, the keep-up margin), a load point and its
runs (:class:`Point`), the search's answer (:class:`Capacity`), and the measurement of a run on a
server (:func:`live_measure`). The search itself is :func:`vkit.tune.capsearch.search`: every run
enters the boundary model (:mod:`vkit.tune.boundary`), and the answer is the load where the binding
margin crosses zero, with a 95 % interval. A run that did not measure the server (requests failed,
the client fell behind its own arrival schedule, the run was cut short) is ``invalid`` and enters
nothing. :func:`verdict_of` is the three-way verdict of one load measured again and again (holds,
fails, unclear): the promise's and the sentinel's test at a fixed load.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from vkit.apply.backend import PROCESS
from vkit.measure.benchconfig import BenchConfig
from vkit.measure.gauge import build_config
from vkit.tune import boundary, capenergy, pooled
from vkit.tune.capplan import Plan, Slo
from vkit.validate import invariants

HOLDS, FAILS, UNCLEAR, INVALID = "holds", "fails", "unclear", "invalid"


@dataclass
class Point:
    load: float
    runs: list[dict] = field(default_factory=list)  # per run: margins, metrics, valid, why
    verdict: str = UNCLEAR

    def margins(self) -> np.ndarray:
        return np.array([r["margin"] for r in self.runs if r["valid"]], dtype=float)

    def mean_margin(self) -> float | None:
        m = self.margins()
        return float(m.mean()) if m.size else None

    def binding(self) -> str | None:
        """The SLO with the smallest mean margin over the valid runs."""
        valid = [r for r in self.runs if r["valid"]]
        if not valid:
            return None
        keys = sorted({k for r in valid for k in r["margins"]})
        # a margin a run lacks held there (throughput is recorded only when the server fell short)
        return min(keys, key=lambda k: np.mean([r["margins"].get(k, 0.0) for r in valid]))

    def as_dict(self) -> dict:
        valid = [r for r in self.runs if r["valid"]]
        means = {}
        for r in valid:
            for k, v in r["metrics"].items():
                means.setdefault(k, []).append(v)
        return {"load": self.load, "verdict": self.verdict, "runs": len(self.runs), "valid_runs": len(valid),
                "margin": self.mean_margin(), "binding": self.binding(),
                "metrics": {k: float(np.mean(v)) for k, v in means.items()},
                "invalid": [r["why"] for r in self.runs if not r["valid"]]}


CURVE_KEYS = ("completed", "max_concurrent_requests", "request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms", "p50_ttft_ms",
              "p95_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p95_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p95_itl_ms",
              "p99_itl_ms", "mean_e2el_ms", "p95_e2el_ms", "p99_e2el_ms", "request_goodput")


def sending_rate(summary: dict) -> float:
    """The rate the server completed requests at: bench_stream's ``completion_rate`` (completions
    per second from the first to the last: the offered rate when the server keeps up, its own
    service rate when the queue grows, however short the run); for a summary without it, requests
    completed per second of the sending window (the duration less the mean latency)."""
    cr = (summary.get("vkit") or {}).get("completion_rate")
    if isinstance(cr, (int, float)) and cr > 0:
        return float(cr)
    done, dur, e2el = summary.get("completed"), summary.get("duration"), summary.get("mean_e2el_ms")
    if not isinstance(done, (int, float)) or not isinstance(dur, (int, float)) or dur <= 0:
        return 0.0
    window = dur - (e2el / 1000.0 if isinstance(e2el, (int, float)) else 0.0)
    return done / max(window, 0.5 * dur)


def keep_up_se(summary: dict) -> float:
    """The SE of a run's keep-up margin ``log(completion rate / send rate)`` from its own requests:
    the completions' span is the sends' span plus the last request's latency less the first's, so
    the margin moves by about ``sqrt(2) x sd(E2EL) / (send span)``: 0.1 in a 100-request run near
    saturation, where latencies spread by seconds. 0 when the summary cannot say (the prior noise
    then carries it)."""
    sd, n = summary.get("std_e2el_ms"), summary.get("completed")
    sent = (summary.get("vkit") or {}).get("send_rate")
    if not all(isinstance(x, (int, float)) and x > 0 for x in (sd, n, sent)) or n < 2:
        return 0.0
    return math.sqrt(2.0) * float(sd) / 1000.0 * float(sent) / (float(n) - 1.0)


def judge_run(summary: dict | None, slo: Slo, plan: Plan, load: float | None = None) -> dict:
    """One run's margins and curve figures, or why it cannot count. Open loop, the server must
    also keep up: ``throughput`` margin ``log(achieved / (keep_up x offered))``."""
    why = None
    if summary is None:
        why = "the run did not complete"
    elif summary.get("failed"):
        why = f"{summary['failed']} request(s) failed"
    elif (summary.get("vkit") or {}).get("partial"):
        why = "the run was cut short"
    elif ((summary.get("vkit") or {}).get("capacity_check") or {}).get("verdict") == "invalid":
        why = "check_invariants: invalid (" + ", ".join(summary["vkit"]["capacity_check"].get("findings") or []) + ")"
    elif plan.mode in ("rate", "trace"):
        lag = ((summary.get("vkit") or {}).get("dispatch_lag_ms") or {}).get("p99")
        if isinstance(lag, (int, float)) and lag > plan.max_send_lag_ms:
            why = f"the client fell behind its arrival schedule (p99 send lag {lag:.1f} ms > {plan.max_send_lag_ms:g} ms)"
    if why:
        return {"valid": False, "why": why, "margin": None, "margins": {}, "metrics": {}}
    margins = slo.margins(summary)
    # a trace's load is its speed-up: the rate it offered is the summary's (the trace's own mean x speed-up);
    # either way, where the summary has it, the rate these requests were actually sent at
    offered = load if plan.mode == "rate" else summary.get("request_rate") if plan.mode == "trace" else None
    sent = (summary.get("vkit") or {}).get("send_rate")
    if offered is not None and isinstance(sent, (int, float)) and sent > 0:
        offered = float(sent)
    keep, grew = None, False
    if isinstance(offered, (int, float)) and offered > 0 and math.isfinite(offered):
        # Overload shows as a server that cannot complete what is offered: a failure whatever the
        # latencies say (a short run may end before the queue has grown), never a binding margin.
        rt = sending_rate(summary)
        keep = math.log(rt / (plan.keep_up * offered)) if rt > 0 else -math.inf
        growth = (summary.get("vkit") or {}).get("queue_growth") or {}
        # material only where TTFT rose by a quarter of its tightest limit (a trend of a few ms at a light
        # load is a growing queue by the test, not a threat to the SLO)
        ttft_limit = min((v for k, v in slo.limits.items() if "_ttft_" in k), default=None)
        material = ttft_limit is None or (growth.get("rise_ms") or 0.0) >= 0.25 * ttft_limit
        grew = bool(growth.get("growing") and material)
        if grew and rt > 0:
            # a queue that grew through the run: the load is not sustainable, whatever share of it
            # completed before the run ended: the margin is the completed share itself (no allowance)
            keep = min(keep, math.log(rt / offered), -0.01)
        if keep < 0:
            margins["throughput"] = keep
    metrics = {k: float(summary[k]) for k in CURVE_KEYS if isinstance(summary.get(k), (int, float))}
    metrics.update(capenergy.run_metrics(summary))
    tpot = summary.get("mean_tpot_ms")
    if isinstance(tpot, (int, float)) and tpot > 0:
        metrics["per_user_output_tok_s"] = 1000.0 / tpot
    se = {k: boundary.sampling_se(summary, k) for k in slo.limits}
    if keep is not None:
        se[boundary.THROUGHPUT] = keep_up_se(summary)
    # a percentile SLO's run percentiles: the model pools the runs of a load (vkit.tune.pooled)
    pk = {k: pooled.percentile_key(k) for k in slo.limits}
    qs = {k: pooled.quantiles(summary, pk[k][1]) for k in slo.limits if pk[k]}
    return {"valid": True, "why": None, "margin": min(margins.values()), "margins": margins, "metrics": metrics,
            "keep": keep, "queue_grew": grew, "se": se, "requests": metrics.get("completed", 0.0),
            "quantiles": {k: q for k, q in qs.items() if q}}


def verdict_of(point: Point, plan: Plan) -> str | None:
    """holds / fails when clear, unclear after the last repeat, None: measure once more."""
    m = point.margins()
    invalid = len(point.runs) - m.size
    if m.size == 0:
        return INVALID if invalid >= 2 else None
    k = m.size
    se = max(float(m.std(ddof=1)) if k > 1 else 0.0, plan.noise) / math.sqrt(k)
    if m.mean() - 2 * se > 0:
        return HOLDS
    if m.mean() + 2 * se < 0:
        return FAILS
    return UNCLEAR if k >= plan.repeats or invalid >= 2 else None


Measure = Callable[[float, int], "dict | None"]  # (load, repeat index) -> a bench_stream summary


@dataclass
class Capacity:
    """A search's answer: its points, the boundary model's estimate (capacity, 95 % interval) and
    why it stopped."""

    plan: Plan
    slo: Slo
    points: list[Point]
    stop: str
    model: boundary.Estimate
    drift: dict | None = None  # the anchor's check (vkit.tune.capanchor); moved: no capacity decided

    @property
    def capacity(self) -> float | None:
        return self.model.capacity

    @property
    def upper(self) -> float | None:
        return self.model.hi

    def measured_at(self) -> tuple[Point | None, Point | None]:
        """(the point the figures at the capacity come from, the point above it): the highest load
        that holds and the lowest that fails, by the fitted curve."""
        pts = sorted(self.points, key=lambda p: p.load)
        held = [p for p in pts if p.verdict == HOLDS]
        return (held[-1] if held else None), next((p for p in pts if p.verdict == FAILS), None)

    def as_dict(self, accelerators: int | None = None, prices: capenergy.Prices | None = None) -> dict:
        pts = sorted(self.points, key=lambda p: p.load)
        at, up = self.measured_at()
        m = at.as_dict()["metrics"] if at else {}
        unit = {"rate": "req/s", "concurrency": "streams", "trace": "x trace speed-up"}[self.plan.mode]
        e = self.model
        out = {
            "mode": self.plan.mode, "unit": unit, "slo": dict(self.slo.limits), "goodput_fraction": self.slo.goodput,
            "capacity": e.capacity, "upper": e.hi, "at_least": e.lo, "interval": [e.lo, e.hi], "level": e.level,
            "precision": self.plan.precision, "estimate": e.as_dict(), "boundary": e.shape,
            "capacity_req_s": m.get("request_throughput"), "capacity_output_tok_s": m.get("output_throughput"),
            "binding_slo": e.binding or (up.binding() if up else None) or (at.binding() if at else None),
            "holds": at.load if at else None, "fails": up.load if up else None,
            "stop": self.stop,
            "curve": [p.as_dict() for p in pts],
            "runs": sum(len(p.runs) for p in pts),
            "points": len(pts),
            "method": "model",
            "drift": self.drift,
        }
        valid = [(p.load, r) for p in pts for r in p.runs if r["valid"]]
        out["requests"] = int(sum(r["metrics"].get("completed", 0) for _, r in valid))
        if self.plan.mode == "rate":  # requests over the offered rate: the seconds of load the search cost
            out["request_seconds"] = float(sum(r["metrics"].get("completed", 0) / load for load, r in valid))
        if accelerators:
            out["accelerators"] = accelerators
            out["per_accelerator"] = {k: (v / accelerators if v is not None else None)
                                      for k, v in (("req_s", out["capacity_req_s"]), ("output_tok_s", out["capacity_output_tok_s"]))}
        out["energy"] = capenergy.at_capacity(m, accelerators, prices)
        return out


def live_measure(opts, url: str, out_dir: str, plan: Plan, command: list[str] | None = None, api_key: str | None = None,
                 interrupts=None, launch_argv: list[str] | None = None,
                 bench: Callable[[BenchConfig, str, str], dict] | None = None) -> Measure:
    """``measure(load, k)`` against a server: bench_stream's run at that load (dataset seed + the
    run's number, so no run finds its prompts in the prefix cache; open loop at exactly that mean
    rate (``--exact-rate``: a short run's own rate would otherwise vary by chance), with at least ``load x plan.point_seconds`` requests, closed loop at least
    5 per stream), its summary and records under ``out_dir/<mode>-<load>/rep<k>.json``, checked by
    check_invariants (an invalid verdict marks the run, which then counts for nothing). ``launch_argv``:
    the server's launch argv for each run's fingerprint (None: unknown). ``bench(cfg, records, output)``:
    what makes a run and writes its files, returning its summary (default: bench_stream's over HTTP;
    vkit.sim.virtual's ``VirtualServer.bench`` runs it in virtual time)."""
    if bench is None:
        def bench(cfg: BenchConfig, records: str, output: str) -> dict:
            return PROCESS.bench(cfg, records, output, interrupts)

    mode = plan.mode
    runs = [0]

    def run(load: float, k: int, requests: int | None = None) -> dict | None:
        # every run its own prompts (dataset seed + the run's number): none finds its prefixes cached
        seed = opts.seed + runs[0]
        runs[0] += 1
        if mode == "rate":
            n = max(opts.num_prompts, math.ceil(load * plan.point_seconds), requests or 0)
            o = replace(opts, seed=seed, request_rate=load, max_concurrency=None, num_prompts=n, exact_rate=True)
        elif mode == "trace":  # the recorded arrivals, load times faster (the trace's own prompts, every run)
            o = replace(opts, seed=seed, trace_speedup=load, request_rate=math.inf, max_concurrency=None)
        else:
            o = replace(opts, seed=seed, max_concurrency=int(load), request_rate=math.inf,
                        num_prompts=max(opts.num_prompts, 5 * int(load)))
        d = os.path.join(out_dir, f"{mode}-{load:g}")
        os.makedirs(d, exist_ok=True)
        path, rec = os.path.join(d, f"rep{k}.json"), os.path.join(d, f"rep{k}.jsonl")
        cfg = build_config(o, url, [*(command or []), *o.flags(), "--seed", str(o.seed), "-o", path])
        if api_key is not None:
            cfg.api_key = api_key
        cfg.launch_argv = launch_argv
        s = bench(cfg, rec, path)
        c = invariants.check_file(path, records=rec)
        s["vkit"]["capacity_check"] = {"verdict": c.verdict, "findings": c.findings, "path": path}
        return s

    return run
