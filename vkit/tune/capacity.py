"""SLO capacity of one configuration: the highest offered load at which every SLO holds.

The load is an open-loop request rate (Poisson or gamma arrivals: production traffic is open
loop) or a closed-loop concurrency ladder. The search brackets the boundary (doubling or halving
from a start), then narrows it by interpolating the SLO margin in log load (regula falsi, kept
inside the middle 30 % of the bracket, when both ends bind on the same SLO; bisection otherwise), until the bracket is within a relative tolerance.

Each load point gets a three-way verdict. Its margin is ``min over SLOs of log(limit / value)``
(positive: every SLO holds); a point is measured again while ``|mean margin| < 2 SE`` (SE from
the repeats' spread, never below the prior ``noise / sqrt(k)``), at most ``repeats`` times, then
called ``holds``, ``fails`` or ``unclear``. A run that did not measure the server — requests
failed, the client fell behind its own arrival schedule (p99 send lag over the limit), the run
was cut short — is ``invalid`` and never enters a verdict.

The capacity is the highest load that clearly holds below every load that does not; the upper
end of its interval is the lowest load that clearly fails (unclear points lie between). The
binding SLO is the one with the smallest margin at that upper end.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from vkit.apply.backend import PROCESS
from vkit.decide.runs import GAUGE_TOP, GAUGE_VKIT
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
    keep = None
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
        # (the model's searches only: tune's bracket searches keep the rule they were measured with)
        if plan.method == "model" and growth.get("growing") and material and rt > 0:
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
            "keep": keep, "se": se, "requests": metrics.get("completed", 0.0),
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
    plan: Plan
    slo: Slo
    points: list[Point]
    capacity: float | None  # highest load that clearly holds below every load that does not
    upper: float | None  # lowest load that clearly fails (model: the interval's upper end)
    stop: str
    model: boundary.Estimate | None = None  # the boundary model's estimate (method "model")

    def measured_at(self) -> tuple[Point | None, Point | None]:
        """(the point the figures at the capacity come from, the point above it): the highest held
        load at or below the capacity and the lowest failing one (model: by the fitted curve)."""
        pts = sorted(self.points, key=lambda p: p.load)
        if self.model is None:
            return (next((p for p in pts if p.load == self.capacity), None), next((p for p in pts if p.load == self.upper), None))
        held = [p for p in pts if p.verdict == HOLDS]
        return (held[-1] if held else None), next((p for p in pts if p.verdict == FAILS), None)

    def as_dict(self, accelerators: int | None = None, prices: capenergy.Prices | None = None) -> dict:
        pts = sorted(self.points, key=lambda p: p.load)
        at, up = self.measured_at()
        m = at.as_dict()["metrics"] if at else {}
        unit = {"rate": "req/s", "concurrency": "streams", "trace": "x trace speed-up"}[self.plan.mode]
        out = {
            "mode": self.plan.mode, "unit": unit, "slo": dict(self.slo.limits), "goodput_fraction": self.slo.goodput,
            "capacity": self.capacity, "upper": self.upper,
            "interval": [self.capacity, self.upper],
            "capacity_req_s": m.get("request_throughput"), "capacity_output_tok_s": m.get("output_throughput"),
            "binding_slo": (up.binding() if up else None) or (at.binding() if at else None),
            "stop": self.stop,
            "curve": [p.as_dict() for p in pts],
            "runs": sum(len(p.runs) for p in pts),
            "points": len(pts),
            "method": self.plan.method,
        }
        valid = [(p.load, r) for p in pts for r in p.runs if r["valid"]]
        out["requests"] = int(sum(r["metrics"].get("completed", 0) for _, r in valid))
        if self.plan.mode == "rate":  # requests over the offered rate: the seconds of load the search cost
            out["request_seconds"] = float(sum(r["metrics"].get("completed", 0) / load for load, r in valid))
        if self.model is not None:
            e = self.model
            out.update({"estimate": e.as_dict(), "interval": [e.lo, e.hi], "capacity": e.capacity, "upper": e.hi,
                        "at_least": e.lo, "level": e.level, "precision": self.plan.precision,
                        "boundary": e.shape, "holds": at.load if at else None, "fails": up.load if up else None,
                        "binding_slo": e.binding or out["binding_slo"]})
        if accelerators:
            out["accelerators"] = accelerators
            out["per_accelerator"] = {k: (v / accelerators if v is not None else None)
                                      for k, v in (("req_s", out["capacity_req_s"]), ("output_tok_s", out["capacity_output_tok_s"]))}
        out["energy"] = capenergy.at_capacity(m, accelerators, prices)
        return out


def _bounds(points: list[Point]) -> tuple[Point | None, Point | None]:
    """(highest point that holds below every point that does not, lowest point that fails)."""
    pts = sorted((p for p in points if p.verdict != INVALID), key=lambda p: p.load)
    lo = None
    for p in pts:
        if p.verdict != HOLDS:
            break
        lo = p
    hi = next((p for p in pts if p.verdict == FAILS and (lo is None or p.load > lo.load)), None)
    return lo, hi


def _next_load(plan: Plan, lo: Point | None, hi: Point | None, points: list[Point], anchor: float | None = None) -> float | None:
    """The next load to offer: step down below the lowest point while nothing holds, up above
    the highest while nothing else is measured there (by ``plan.step``, accelerating), else narrow between the highest clear
    hold and the lowest point above it that does not hold (fails, unclear or not measurable). Steps
    count from ``anchor`` when it was measured (the hint), else from the first point."""
    tried = {p.load for p in points}
    # Bracketing from a warm start accelerates: the k-th step the same way is step^(2^(k-1)), at most
    # a doubling (1.25, 1.56, 2, 2, ...), so a configuration far from its neighbour is bracketed in few points.
    first = anchor if anchor is not None and anchor in tried else points[0].load

    def factor(k: int) -> float:
        return max(plan.step, min(2.0, plan.step ** (2 ** k)))

    if lo is None:
        low = min(points, key=lambda p: p.load)
        k = sum(1 for p in points if p.load < first)
        nxt = plan.snap(low.load / factor(k))
        return None if nxt in tried or low.load <= plan.lo_limit else nxt
    above = sorted((p for p in points if p.load > lo.load), key=lambda p: p.load)
    # Narrow the lowest gap above the clear hold; once a gap is within the tolerance and its top
    # is unclear, the next gap up (towards a clear failure) is the one to narrow.
    below = lo
    for p in above:
        nxt = _between(plan, below, p, tried)
        if nxt is not None or p.verdict != UNCLEAR:
            return nxt
        below = p
    if above:
        return None
    k = sum(1 for p in points if p.load > first)
    nxt = plan.snap(lo.load * factor(k))
    return None if nxt in tried or lo.load >= plan.hi_limit else nxt


def _between(plan: Plan, lo: Point, hi: Point, tried: set[float]) -> float | None:
    if hi.load / lo.load - 1 <= plan.tolerance:
        return None
    a, b = math.log(lo.load), math.log(hi.load)
    m_lo, m_hi = lo.mean_margin(), hi.mean_margin()
    f = 0.5
    # the secant only when both ends' margins are of one SLO (comparable); else plain bisection
    if m_lo is not None and m_hi is not None and m_lo > 0 > m_hi and lo.binding() == hi.binding():
        # regula falsi on the margin in log load, kept near the middle: a tail latency's margin is far
        # from linear near the knee, and an unclamped secant creeps in from one side
        f = min(0.65, max(0.35, m_lo / (m_lo - m_hi)))
    nxt = plan.snap(math.exp(a + f * (b - a)))
    if nxt in tried or not lo.load < nxt < hi.load:
        nxt = plan.snap(math.exp((a + b) / 2))
    return None if nxt in tried or not lo.load < nxt < hi.load else nxt


def search(measure: Measure, slo: Slo, plan: Plan, progress: Callable[[str], None] = lambda s: None,
           hint: float | None = None) -> Capacity:
    """The capacity: by ``plan.method``, the boundary model's estimate with its interval
    (:mod:`vkit.tune.capsearch`) or the bracket (:func:`bracket_search`)."""
    if plan.method == "model":
        from vkit.tune import capsearch

        return capsearch.search(measure, slo, plan, progress, hint=hint)
    return bracket_search(measure, slo, plan, progress, hint)


def bracket_search(measure: Measure, slo: Slo, plan: Plan, progress: Callable[[str], None] = lambda s: None,
                   hint: float | None = None) -> Capacity:
    """Bracket and narrow the SLO boundary; every run through ``measure(load, k)``. With ``hint``
    (where the answer probably is: the kept configuration's capacity) above the start, the second
    point is the hint when the start holds, and the bracketing steps count from there: the start
    still measures what it must (interactivity at the reference load), and no points are spent
    climbing from it."""
    points: list[Point] = []
    load: float | None = plan.snap(plan.start)
    anchor = plan.snap(hint) if hint is not None and load is not None and plan.snap(hint) > load * plan.step else None
    stop = ""
    while load is not None:
        if len(points) >= plan.max_points:
            stop = f"{plan.max_points} load points measured (the most allowed)"
            break
        p = Point(load)
        points.append(p)
        while True:
            p.runs.append(judge_run(measure(load, len(p.runs)), slo, plan, load))
            v = verdict_of(p, plan)
            if v is not None:
                p.verdict = v
                break
        d = p.as_dict()
        progress(f"load {load:g}: {p.verdict} (margin {d['margin']:+.3f} over {d['valid_runs']} run(s), binding "
                 f"{d['binding']})" if d["margin"] is not None else f"load {load:g}: {p.verdict} ({'; '.join(d['invalid'])})")
        lo, hi = _bounds(points)
        if anchor is not None and len(points) == 1 and p.verdict == HOLDS:
            load = min(anchor, plan.hi_limit)
            progress(f"load {load:g} next: the kept configuration's capacity (the hint)")
            continue
        load = _next_load(plan, lo, hi, points, anchor)
    lo, hi = _bounds(points)
    if not stop:
        if lo is None:
            stop = ("no load clearly holds the SLO" + (f" down to {plan.lo_limit:g}" if hi is not None else "")
                    + " (every valid point fails or is unclear)")
        elif hi is None:
            above = sorted((p for p in points if p.load > lo.load), key=lambda p: p.load)
            if not above:
                stop = f"every load up to {lo.load:g} holds (the most allowed)"
            elif above[0].verdict == INVALID:
                stop = (f"above {lo.load:g} no run could measure the server ({'; '.join(above[0].as_dict()['invalid'][:1])}"
                        f" at {above[0].load:g}): the capacity is at least {lo.load:g}")
            else:
                stop = f"between {lo.load:g} (holds) and {above[0].load:g} the SLO sits within the noise; more repeats would narrow it"
        elif hi.load / lo.load - 1 <= plan.tolerance:
            stop = f"bracket within {100 * plan.tolerance:g} %: holds at {lo.load:g}, fails at {hi.load:g}"
        else:
            stop = f"unclear points between {lo.load:g} (holds) and {hi.load:g} (fails): the SLO sits within the noise there"
    return Capacity(plan, slo, points, lo.load if lo else None, hi.load if hi else None, stop)


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


# -- a configuration's capacity as one measurement (tune's capacity objective) ------------------
# The summary fields of one point that describe how it was measured (the gauge), copied into the
# capacity document so that gate compares two capacities only when they were searched the same way.
# (gate's own gauge keys, vkit.decide.runs; the document sets the load's keys itself, and the dataset
# without the per-point request count)
_OWN_TOP = ("num_prompts", "max_concurrency", "request_rate")
_GAUGE_TOP = tuple(k for k in GAUGE_TOP if k not in _OWN_TOP)
_GAUGE_VKIT = tuple(dict.fromkeys(k.split(".")[0] for k in GAUGE_VKIT if k != "dataset"))


def estimate(doc_capacity: dict, plan: Plan) -> tuple[float, float]:
    """(point estimate, its own sd in log units) of a capacity search's answer. The boundary lies
    somewhere in [capacity, upper]: the estimate is that interval's geometric middle and its sd
    that of a uniform position in it, log(upper / capacity) / sqrt(12). Nothing clearly held: half
    the lowest load offered (the estimate is then a bound); no clear failure: the capacity itself,
    with the tolerance as the interval."""
    model = doc_capacity.get("estimate")
    if model is not None:
        return _model_estimate(doc_capacity, model, plan)
    lo, hi = doc_capacity.get("capacity"), doc_capacity.get("upper")
    if lo is None:
        low = min((p["load"] for p in doc_capacity.get("curve") or []), default=plan.lo_limit)
        return max(plan.lo_limit, low) / 2.0, math.log(2.0) / math.sqrt(12.0)
    if hi is None or hi <= lo:
        return float(lo), math.log1p(plan.tolerance) / math.sqrt(12.0)
    return float(math.sqrt(lo * hi)), math.log(hi / lo) / math.sqrt(12.0)


def _model_estimate(doc_capacity: dict, model: dict, plan: Plan) -> tuple[float, float]:
    """The boundary model's (estimate, sd in log units): its interval as a normal sd. An interval
    open at one end around a crossing: the side the data bound, taken as both; an interval open
    above (every load held): its lower end, with the precision as the sd; nothing held: half the
    lowest load, with a doubling as the sd."""
    lo, hi = model["interval"]
    c = model.get("capacity")
    if c is not None and lo and hi:
        return float(c), math.log(hi / lo) / (2 * boundary.Z95)
    if c is not None and (lo or hi):
        return float(c), abs(math.log((lo or hi) / c)) / boundary.Z95
    if lo:
        return float(lo), math.log1p(plan.precision)
    low = min((p["load"] for p in doc_capacity.get("curve") or []), default=plan.lo_limit)
    return max(plan.lo_limit, min(low, hi or low)) / 2.0, math.log(2.0) / math.sqrt(12.0)


def capacity_document(result: Capacity, first: dict | None, opts, seed: int, reference: float | None,
                      accelerators: int | None = None, prices: capenergy.Prices | None = None) -> dict:
    """A capacity search as one run the gate can compare: ``slo_capacity`` (the estimate) with
    ``slo_capacity_sd`` (its own uncertainty), the figures at the capacity (throughput, latencies)
    and ``ref_*`` at the reference load (interactivity: per-user output tok/s, mean TPOT), the
    whole search under ``vkit.capacity``, and the gauge of the runs it was made of."""
    d = result.as_dict(accelerators, prices)
    est, sd = estimate(d, result.plan)
    pts = {p["load"]: p for p in d["curve"]}
    held, _ = result.measured_at()
    at = (pts.get(held.load) or {}).get("metrics") or {} if held else {}
    if reference is None:
        # the first search of a tune: its own capacity (the highest load it held) becomes the reference load
        reference = held.load if held else None
    ref_pt = pts.get(reference) if reference is not None else None
    ref = (ref_pt or {}).get("metrics") or {}
    valid = [r for p in result.points for r in p.runs if r["valid"]]
    # The most requests in flight at the loads that decide the answer (every point up to the lowest
    # clear failure): a max_num_seqs at or above it never bound there, so it cannot change the answer.
    top = d.get("fails", d["upper"])
    deciding = [r for p in result.points if top is None or p.load <= top for r in p.runs if r["valid"]]
    peak = max((r["metrics"].get("max_concurrent_requests", 0) for r in deciding), default=0)
    first = first or {}
    fv = first.get("vkit") or {}
    doc: dict = {k: first.get(k) for k in _GAUGE_TOP if k in first}
    doc.update({
        "date": time.strftime("%Y%m%d-%H%M%S"),
        "completed": int(sum(r["metrics"].get("completed", 0) for r in valid)),
        "failed": 0,
        "num_prompts": opts.num_prompts,
        "max_concurrency": None,
        "request_rate": f"capacity:{result.plan.mode}",
        "slo_capacity": est,
        "slo_capacity_sd": sd,
        # a load the server holds and one it fails: the model's interval ends, else the bracket's
        "capacity_holds": d["interval"][0] if "estimate" in d else d["capacity"],
        "capacity_fails": d["upper"],
        "capacity_req_s": d["capacity_req_s"],
        "capacity_output_tok_s": d["capacity_output_tok_s"],
        "output_throughput": at.get("output_throughput"),
        "request_throughput": at.get("request_throughput"),
        "p95_ttft_ms": at.get("p95_ttft_ms"),
        "mean_ttft_ms": at.get("mean_ttft_ms"),
        "mean_tpot_ms": at.get("mean_tpot_ms"),
        "peak_in_flight": peak,
    })
    doc.update(capenergy.document_metrics(d.get("energy") or {}, est))
    if ref_pt is not None:
        doc["reference_load"] = reference
        # interactivity at the reference load means something only where that load holds the SLO
        doc["ref_holds"] = ref_pt.get("verdict") == HOLDS
        for k in ("mean_tpot_ms", "p95_tpot_ms", "p95_ttft_ms", "per_user_output_tok_s", "j_per_output_token"):
            if isinstance(ref.get(k), (int, float)):
                doc[f"ref_{k}"] = ref[k]
    dataset = dict(fv.get("dataset") or {})
    dataset.pop("num_prompts", None)  # a point sends load x point_seconds requests: not part of the gauge
    dataset.pop("trace_speedup", None)  # a trace's points differ in it: the load, not the gauge
    # the gauge, the server facts (its version, the simulator's profile) and the environment's
    # fingerprint of the search's first run
    kept = (*_GAUGE_VKIT, "model", "server", "lengths", "fingerprint")
    doc["vkit"] = {**{k: fv.get(k) for k in kept if k in fv}, "dataset": dataset, "seed": seed,
                   "schema": "vkit.capacity/1", "capacity": d,
                   "valid": d["capacity"] is not None or d["upper"] is not None}
    return doc


def measure_configuration(opts, url: str, out_dir: str, slo: Slo, plan: Plan, reference: float | None,
                          command: list[str] | None = None, api_key: str | None = None, interrupts=None,
                          progress: Callable[[str], None] = lambda s: None, accelerators: int | None = None,
                          seed: int | None = None, hint: float | None = None, launch_argv: list[str] | None = None,
                          bench: Callable[[BenchConfig, str, str], dict] | None = None,
                          prices: capenergy.Prices | None = None) -> dict:
    """One configuration's capacity, searched from the reference load (the neighbouring
    configuration's capacity: the bracket starts where the answer probably is, and the first point
    measures interactivity at that load; ``hint``, the kept configuration's capacity, is where the
    bracketing goes next), as :func:`capacity_document`. Its runs use dataset seeds
    from ``opts.seed`` up, one per run; ``seed`` is the measurement's own (the gate pairs on it)."""
    start = reference if reference is not None else plan.start
    # warm start: the answer is probably near the neighbour's, so bracket in small steps around it
    step = max(1.25, 1 + 2 * plan.tolerance) if reference is not None else plan.step
    # a cold start brackets from afar (doublings): four more points than a warm one
    p = replace(plan, start=min(plan.hi_limit, max(plan.lo_limit, start)), step=step,
                max_points=plan.max_points if reference is not None else plan.max_points + 4)
    inner = live_measure(opts, url, out_dir, p, command=command, api_key=api_key, interrupts=interrupts,
                         launch_argv=launch_argv, bench=bench)
    first: list[dict] = []

    def run(load: float, k: int, requests: int | None = None) -> dict | None:
        s = inner(load, k, requests)  # the search sizes each run: its percentile's error, near the crossing longer
        if s is not None and not first:
            first.append(s)
        return s

    res = search(run, slo, p, progress, hint=hint if reference is not None else None)
    return capacity_document(res, first[0] if first else None, opts, opts.seed if seed is None else seed,
                             p.snap(start) if reference is not None else None, accelerators, prices)
