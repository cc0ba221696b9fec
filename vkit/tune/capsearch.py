"""The capacity search: every run enters the boundary model, the answer is an estimate with its interval.

Each run enters :func:`vkit.tune.boundary.estimate`; the search goes on until the capacity's
interval is as narrow as ``plan.precision`` asks, measuring next where that interval narrows most:

1. a point the curve calls suspect (its centre over 3 SE from the fitted curve: a stalled run, or a
   bend the points cannot resolve) is measured again first, up to ``plan.model_repeats`` runs;
2. nothing crossed yet (every load holds): up, towards the crossing extrapolated from the last two
   fitted margins (never further than ``plan.step`` at once, never closer than twice the precision);
   nothing holds: down by ``plan.step``;
3. an interval open at one end (the bootstrap's curves cross beyond the loads measured): a load just
   beyond the measured end on that side;
4. else the estimated crossing itself, nudged towards the side whose nearest load is further away, so
   that loads close to the crossing stand on both sides of it; where a load is already that close,
   that load is measured again (the one of the two straddling loads with the larger SE).

Run lengths size themselves (open loop): a run sends enough requests for the binding SLO's sampling
error (its percentile's, from the nearest earlier run's own spread) to be at most ``plan.noise``,
at least ``load x plan.point_seconds`` and at most ``load x plan.max_point_seconds``. Near the
estimated crossing (within its interval, or within four precision steps where the interval is narrower)
a run lasts ``plan.crossing_factor`` (2) times as long at least (up to the most): there the queue relaxes slowly, and a short run that
starts it empty reads the boundary on one side (in the benchmark's cliff scenario a run's P95 TTFT
reads 29 % low at 275 requests, 10 % at 800; its completion rate 3 % low at 100 requests, 0.4 % at 400).

When the stop rule is met, the search checks that it measured one server throughout
(:mod:`vkit.tune.capanchor`): the lowest load of its first half is measured once more (one run
beyond ``plan.max_runs``, unless the search measured it again in its last third itself); a margin
that moved by more than the noise and the precision allow means the level changed during the
search, and the search says it could not decide (``drift``, and its stop rule says why).
"""

from __future__ import annotations

import inspect
import math
from typing import Callable

from vkit.tune import boundary, capanchor, pooled
from vkit.tune.capacity import FAILS, HOLDS, INVALID, UNCLEAR, Capacity, Measure, Plan, Point, Slo, judge_run

NOISE_THROUGHPUT = 0.03  # prior sd of the keep-up margin between runs (measured: 0.024 over ten 80-190-request runs below a keep-up boundary)
# Near the crossing a run lasts this many request lifetimes (mean E2EL) at least: its first lifetime is the
# batch filling from an empty server, which reads a latency low. Measured on bench_capacity_tune's 8b-h200-chat
# in the hidden world (tune --virtual, 4-s points at 8 s near the crossing, lifetimes about 5 s): the 512-sequence
# configuration's searches read 51.7-52.5 req/s where 40-s promise runs held 32.1 (steady truth about 35).
LIFETIMES = 4.0
KEEP_UP_REACH = 1.25  # the keep-up margin enters from the lowest load that fell short of it / this


def model_runs(points: list[Point]) -> list[boundary.Run]:
    """The valid runs of every point as the boundary model's runs: the keep-up margin of every run at
    and above the lowest load where a run fell short of it (and a little below). A run that kept up by a hair and one that
    fell short by a hair are the same load's noise, and a short run's completion rate is noisy (72
    requests: about 12 %): a load that fell short by chance below loads that kept up must meet their
    margins in the monotone fit, or it alone would set the capacity. Further below the margin is
    left out (a server that keeps up sits at log(1 / keep_up) whatever its load: no distance to
    the boundary)."""
    out = []
    short = [p.load for p in points for r in p.runs if r["valid"] and r.get("keep") is not None and r["keep"] < 0]
    # and the loads just below it (within KEEP_UP_REACH): a load that kept up close to one that fell short
    # may have kept up by chance (its margin, with its noise, bounds the crossing from below; alone, the
    # load itself would be a hard bound)
    first = min(short, default=math.inf) / KEEP_UP_REACH
    for p in points:
        valid = [r for r in p.runs if r["valid"]]
        shift = pooled_shifts(valid)
        for r in valid:
            m = {k: v + shift.get(k, 0.0) for k, v in r["margins"].items() if k != boundary.THROUGHPUT}
            if p.load >= first and r.get("keep") is not None:
                m[boundary.THROUGHPUT] = r["keep"]
            out.append(boundary.Run(p.load, m, dict(r.get("se") or {})))
    return out


def pooled_shifts(runs: list[dict]) -> dict[str, float]:
    """Per percentile SLO, the shift that moves the mean of one load's run margins to the margin of
    the percentile over all their requests (:mod:`vkit.tune.pooled`: a short run's tail percentile
    reads low; the pooled one much less). Only over runs that all carry the percentiles and a finite
    margin; nothing for a single run."""
    out = {}
    for key in {k for r in runs for k in r.get("quantiles") or {}}:
        level = pooled.percentile_key(key)
        ok = [r for r in runs if key in (r.get("quantiles") or {}) and math.isfinite(r["margins"].get(key, math.nan))]
        if level and len(ok) == len(runs) >= 2:
            out[key] = pooled.pooled_shift([(max(r.get("requests") or 1.0, 1.0), r["quantiles"][key]) for r in ok], level[0])
    return out


def noise_of(plan: Plan) -> dict[str, float]:
    return {"*": plan.noise, boundary.THROUGHPUT: NOISE_THROUGHPUT}


def near_crossing(plan: Plan, load: float, est: boundary.Estimate) -> bool:
    """Whether ``load`` lies within the estimate's interval, or within four precision steps of its
    capacity (``(1 + precision)^4``: as far as :func:`next_load` places a load to pin the crossing
    from one side)."""
    if est.where != "between" or not est.capacity:
        return False
    reach = (1 + plan.precision) ** 4
    lo, hi = est.capacity / reach, est.capacity * reach
    return min(lo, est.lo or lo) <= load <= max(hi, est.hi or hi)


def lifetime(points: list[Point], load: float) -> float | None:
    """A request's lifetime (mean E2EL, s) at the nearest load below ``load`` whose run held its SLO
    (a failing run's latency is its queue's wait, not a request's life); None before one."""
    best, dist = None, math.inf
    for p in points:
        for r in p.runs:
            e2el = (r.get("metrics") or {}).get("mean_e2el_ms")
            if r["valid"] and (r.get("margin") or -1) > 0 and e2el and p.load <= load * (1 + 1e-9):
                d = math.log(load / p.load)
                if d < dist:
                    best, dist = e2el / 1000.0, d
    return best


def requests_for(plan: Plan, load: float, points: list[Point], key: str | None, near: bool = False) -> int | None:
    """Open loop: the requests a run at ``load`` sends (None: the measurement's default); ``near``:
    the load is near the estimated crossing (``plan.crossing_factor`` x the seconds of load)."""
    if plan.mode != "rate":
        return None
    seconds = max(plan.point_seconds, min(plan.crossing_factor * plan.point_seconds, plan.max_point_seconds)) if near \
        else plan.point_seconds
    life = lifetime(points, load)
    if near and life:
        # a run starts on an empty server and its first lifetime is the batch filling: near the crossing
        # it lasts LIFETIMES request lifetimes at least (as far as the most a run may last)
        seconds = max(seconds, min(LIFETIMES * life, plan.max_point_seconds))
    floor = math.ceil(load * seconds)
    cap = max(floor, math.ceil(load * plan.max_point_seconds))
    best, dist = None, math.inf
    for p in points:
        for r in p.runs:
            se = (r.get("se") or {}).get(key) if key else None
            if r["valid"] and se and r.get("requests"):
                d = abs(math.log(p.load / load))
                if d < dist:
                    best, dist = (se, r["requests"]), d
    if best is None:
        return floor
    se, n = best
    need = math.ceil(n * (se / max(plan.noise, 1e-3)) ** 2)
    return int(min(cap, max(floor, need)))


def _verdicts(points: list[Point], est: boundary.Estimate) -> None:
    for p in points:
        valid = [r for r in p.runs if r["valid"]]
        if not valid:
            p.verdict = INVALID if len(p.runs) >= 2 else UNCLEAR
            continue
        g = est.fitted.get(p.load)
        p.verdict = UNCLEAR if g is None else (HOLDS if g >= 0 else FAILS)


def next_load(plan: Plan, est: boundary.Estimate, points: list[Point]) -> tuple[float | None, str]:
    """(the next load, why) or (None, the stop rule)."""
    by = {p.load: p for p in points}
    measured = sorted(x for x, p in by.items() if any(r["valid"] for r in p.runs))
    ceiling = min((x for x, p in by.items() if p.verdict == INVALID), default=None)
    runs = sum(len(p.runs) for p in points)
    if runs >= plan.max_runs:
        return None, f"{plan.max_runs} runs measured (the most allowed)"
    close = math.log1p(plan.precision)

    def new(load: float, why: str) -> tuple[float | None, str]:
        load = plan.snap(load)
        if ceiling is not None and load >= ceiling:
            # no run could measure the server there (the client, not the server): between it and the highest valid load
            below = [m for m in measured if m < ceiling]
            mid = plan.snap(math.sqrt(below[-1] * ceiling)) if below else None
            if mid is None or ceiling / below[-1] - 1 <= plan.precision or (mid in by and by[mid].verdict == INVALID):
                return None, f"above {ceiling:g} no run could measure the server: the capacity is at least {measured[-1]:g}" \
                    if measured else f"no load could be measured (at {ceiling:g})"
            load, why = mid, why + f" (below {ceiling:g}, where no run could measure the server)"
        if load in by:
            return again(load, why)
        if len(by) >= plan.max_points:
            return None, f"{plan.max_points} load points measured (the most allowed)"
        return load, why

    def again(load: float, why: str) -> tuple[float | None, str]:
        if len(by[load].runs) >= plan.model_repeats:
            return None, f"{load:g} measured {plan.model_repeats} times (the most a load gets): the interval cannot narrow further"
        return load, why + " (again)"

    for s in est.suspect:
        if s in by and len(by[s].runs) < plan.model_repeats:
            return s, f"{s:g} again: its runs lie far from the curve through the other loads"
    if not measured:
        top = max(by) if by else plan.start
        return new(top / plan.step, "no run could measure the server: lower")
    if est.where == "above":
        top = measured[-1]
        if top >= plan.hi_limit:
            return None, f"every load up to {top:g} holds (the most allowed)"
        lx = sorted(est.fitted)
        step = math.log(plan.step)
        if len(lx) >= 2 and est.fitted[lx[-1]] < est.fitted[lx[-2]]:
            slope = (est.fitted[lx[-1]] - est.fitted[lx[-2]]) / math.log(lx[-1] / lx[-2])
            ext = -est.fitted[lx[-1]] / slope + close  # just past the extrapolated crossing
            step = min(step, max(2 * close, ext))
        return new(min(plan.hi_limit, top * math.exp(step)), "every load so far holds: up")
    if est.where == "below":
        low = measured[0]
        if low <= plan.lo_limit:
            return None, f"no load holds the SLO down to {plan.lo_limit:g}"
        return new(max(plan.lo_limit, low / plan.step), "no load holds: down")
    hw = est.half_width()
    # replicates at both loads that straddle the crossing before an interval is trusted: a run's own
    # SE understates a tail latency's spread near the knee (its queue's excursions outlast any batch)
    thin = [x for x in est.bracket if x in by and sum(r["valid"] for r in by[x].runs) < 2]
    if hw is not None and hw <= plan.precision and thin:
        return again(thin[0], f"{thin[0]:g} straddles the crossing: a second run before the interval is trusted")
    if hw is not None and hw <= plan.precision:
        return None, f"the {est.level:.0%} interval is within ±{100 * plan.precision:g} % (±{100 * hw:.1f} %)"
    if est.lo is None:
        return new(measured[0] / (1 + 2 * plan.precision), "the interval is open below the lowest load: lower")
    if est.hi is None:
        return new(measured[-1] * (1 + 2 * plan.precision), "the interval is open above the highest load: higher")
    x = math.log(est.capacity)
    key = est.binding or ""
    sd = math.sqrt(est.sigma.get(key, plan.noise) ** 2 + _se2(points, key))
    slope = abs(est.slope or 0.0)
    # a load whose margin is about 2 SE from zero on each side pins the crossing best
    delta = min(4 * close, max(close / 4, 2 * sd / slope if slope > 0 else close))
    for side in (-1, 1):
        if not _clear_on(side, x, delta, est, points):
            return new(math.exp(x + side * delta), f"{'below' if side < 0 else 'above'} the estimated crossing "
                                                     f"{est.capacity:.4g}, where the margin is about 2 SE from zero")
    for load in sorted(est.bracket, key=lambda b: len(by[b].runs)):
        if len(by[load].runs) < plan.model_repeats:
            return again(load, f"{load:g} straddles the crossing")
    return None, "the loads on both sides of the crossing were measured as often as allowed: the interval cannot narrow further"


def _se2(points: list[Point], key: str) -> float:
    se = [(r.get("se") or {}).get(key, 0.0) ** 2 for p in points for r in p.runs if r["valid"]]
    return float(sum(se) / len(se)) if se else 0.0


def _clear_on(side: int, x: float, delta: float, est: boundary.Estimate, points: list[Point]) -> bool:
    """A measured load on this side of the crossing, within 2 delta of it, whose fitted margin is
    clearly (2 SE of its point) on its side."""
    for p in points:
        d = side * (math.log(p.load) - x)
        z = est.z.get(p.load)
        if z is not None and 0 < d <= 2 * delta and -side * z >= 2:
            return True
    return False


def _accepts_requests(measure: Measure) -> bool:
    try:
        return len(inspect.signature(measure).parameters) >= 3
    except (TypeError, ValueError):
        return False


def search(measure: Measure, slo: Slo, plan: Plan, progress: Callable[[str], None] = lambda s: None,
           hint: float | None = None, earlier: list[Point] | None = None, seed: int = 0) -> Capacity:
    """The model search (see the module's docstring). ``hint``: where the answer probably is (this
    configuration's last estimate, the twin's prediction, the kept configuration's capacity): the second
    load when the start holds and the hint is above it, or fails and the hint is below it. ``earlier``: points of
    earlier searches of this configuration on this gauge, whose runs enter the model too."""
    sized = _accepts_requests(measure)
    points: list[Point] = [Point(p.load, list(p.runs), p.verdict) for p in earlier or []]
    noise = noise_of(plan)
    load: float | None = plan.snap(plan.start)
    est = boundary.estimate([], noise)
    stop = ""
    first = True
    order = 0  # the runs of this search in the order they ran (the anchor's check reads it)
    while load is not None:
        p = next((q for q in points if q.load == load), None)
        if p is None:
            p = Point(load)
            points.append(p)
        n = requests_for(plan, load, points, est.binding or next(iter(slo.limits)), near_crossing(plan, load, est))
        summary = measure(load, len(p.runs), n) if sized else measure(load, len(p.runs))
        p.runs.append(judge_run(summary, slo, plan, load))
        est = boundary.estimate(model_runs(points), noise, seed=seed)
        _verdicts(points, est)
        r = p.runs[-1]
        r["order"] = order
        order += 1
        progress(f"load {load:g}: margin {r['margin']:+.3f}" + (f" ({int(r['requests'])} requests)" if r.get("requests") else "")
                 + f"; {_said(est)}" if r["valid"] else f"load {load:g}: invalid ({r['why']})")
        if first and hint is not None and _towards(plan, hint, load, est.where):
            first = False
            load = plan.snap(min(hint, plan.hi_limit))
            progress(f"load {load:g} next: where the capacity probably is (the hint)")
            continue
        first = False
        load, why = next_load(plan, est, points)
        if load is None:
            stop = why
        else:
            progress(f"next {load:g}: {why}")
    est, drift = _check_level(measure, sized, slo, plan, points, est, order, progress, seed)
    if drift is not None and drift["moved"]:
        stop = capanchor.said(drift)
        progress(stop)
    return Capacity(plan, slo, points, stop, est, drift)


def _check_level(measure: Measure, sized: bool, slo: Slo, plan: Plan, points: list[Point], est: boundary.Estimate,
                 order: int, progress: Callable[[str], None], seed: int) -> tuple[boundary.Estimate, dict | None]:
    """The anchor's check at the search's end (:mod:`vkit.tune.capanchor`): (the estimate, with the
    anchor's late run when it needed one; the check, None for a search too short for it)."""
    at = capanchor.anchor(points, est.binding)
    if at is None:
        return est, None
    load, again = at
    if again:  # one run more than the plan's most: the check, not the estimate, needs it
        progress(f"load {load:g} again: the search's first loads measured once more (did the level move?)")
        p = next(q for q in points if q.load == load)
        # as many requests as its first run sent: the two runs read a percentile with the same sampling error
        n = next((int(r["requests"]) for r in p.runs if r["valid"] and r.get("requests")), None) \
            or requests_for(plan, load, points, est.binding or next(iter(slo.limits)))
        summary = measure(load, len(p.runs), n) if sized else measure(load, len(p.runs))
        p.runs.append(dict(judge_run(summary, slo, plan, load), order=order))
        est = boundary.estimate(model_runs(points), noise_of(plan), seed=seed)
        _verdicts(points, est)
    return est, capanchor.judge(points, load, noise_of(plan), plan.precision, est.binding)


def _towards(plan: Plan, hint: float, load: float, where: str) -> bool:
    """Whether the hint lies on the side of ``load`` that the first run points to, more than the
    precision away: up when the start held, down when it failed."""
    h = plan.snap(min(hint, plan.hi_limit))
    return (where == "above" and h > load * (1 + plan.precision)) or (where == "below" and h < load / (1 + plan.precision))


def _said(est: boundary.Estimate) -> str:
    if est.where == "between":
        lo = f"{est.lo:.4g}" if est.lo is not None else "?"
        hi = f"{est.hi:.4g}" if est.hi is not None else "?"
        return f"capacity {est.capacity:.4g} [{lo}, {hi}], binding {est.binding}"
    if est.where == "above":
        return f"every load holds (capacity above {est.lo:.4g})"
    if est.where == "below":
        return "no load holds"
    return "no valid run yet"
