"""The capacity a tune promises, verified by long runs on a fresh start."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from typing import TYPE_CHECKING

from vkit.errors import ExitCode, VkitError
from vkit.state import now_iso
from vkit.tune import capacity as _cap
from vkit.tune.summaries import relative

if TYPE_CHECKING:
    from vkit.tune.context import Tune


# Runs at one load before it is called unclear, and in all. Two runs' spread is one degree of freedom:
# measured on bench_capacity_tune's qwen7b-l40s (tune --search twin, seeds 11 and 12), two 40-second runs at
# 14.83 req/s held at margins +0.18 and +0.40 (mean clear of twice their standard error), and three fresh
# runs there read -0.43, -0.35, +0.31 (the steady truth: 13.8).
PROMISE_REPEATS = 4
PROMISE_RUNS = 12
# Runs re-run longer because a hold was shorter than STEADY_LIFETIMES of its requests' lifetimes, beside PROMISE_RUNS:
# they size the run, they are no verdict. Counted in PROMISE_RUNS, they ended the demo's promise unverified on a
# busy machine (tests/test_demo.py in a full make test): 3 of its 12 runs were re-sized, and the load that held
# once (margin +0.34) had no run left for its second.
PROMISE_RESIZES = 4
# Open loop, a promise's run lasts this many request lifetimes (its mean E2EL) at least: a run starts on an
# empty server, and its first lifetime is the batch filling. Measured on bench_capacity_tune's
# 70b-h100x4-fp8 in the hidden world (hidden effects 6, 2048 / 256, 13.96 req/s, 0.6 % above the steady
# truth, 4 runs of each length, lifetime 3.8-5.1 s): mean-TPOT margins +0.25 to +0.40 at 10 s (2
# lifetimes), -0.12 to +0.17 at 20 s, 0.00 to +0.19 at 40 s (8), -0.05 to +0.18 at 80 s: the short runs'
# margin is a bias of the fill, which is mostly gone by 8 lifetimes. A promise verified on 10-s runs
# there broke on fresh 40-s runs in 2 of 8 tunes.
STEADY_LIFETIMES = 8.0
MAX_STRETCH = 8.0  # ... and at most this many times --verify-seconds (a lifetime read under overload is the queue's)
Z_CLEAR = 2.0  # a search's point: clear at twice the standard error (normal); the promise's t matches its level
# A promise is a claim about the next run, not only about the mean: a run at the promised load holds 9 times in 10
# (its mean margin clears this many sd of one run, at the level above). Measured on bench_capacity_tune's
# 70b-h100x4-fp8 in the hidden world (2048 / 256 at 13.96 req/s, 0.6 % above the steady truth): over nine fresh
# starts (36 runs of 40 s), the mean margin was +0.075 and one run's sd 0.076, so a run failed about one time in
# six and a fresh check of three runs failed two of them about one time in fourteen, though the mean held; four
# promise runs (+0.15, +0.08, +0.15, +0.28) cleared a test of the mean alone there and broke afresh.
RUN_HOLDS_Z = 1.2815515655446004  # the normal's 90th percentile
HOLD_RUNS = 3  # a hold's runs at least: two runs' spread is one degree of freedom, no claim about the next run


def run_floor(point: _cap.Point) -> float:
    """The least sd of one run's margin at ``point``: each run's own sampling error of its binding
    margin (``se``: from its requests, their autocorrelation included), root mean square. A few
    runs' own spread can fall far below it: measured on bench_capacity_tune's 70b-h100x4-fp8 in the
    hidden world (2048 / 256 at 13.96 req/s, 0.6 % above the steady truth, 40-s runs), the mean-TPOT
    margin's own SE was 0.06-0.12 per run and nine runs spread by sd 0.08-0.11, where three promise
    runs (+0.15, +0.09, +0.19; sd 0.05) held against the 0.03 prior and then broke afresh in 2 of 4
    tunes. The prior between-run spread (``--capacity-noise``) is no floor here: it is the search's
    guess, and on a TPOT-bound knee whose runs differ by 0.01 (their own SE 0.005-0.016) a floor of
    0.03 made every load unclear and the promise held nowhere; it still decides, as for any load
    point, whether a mean clears zero (``capacity.verdict_of``)."""
    se2 = [float((r.get("se") or {}).get(min(r["margins"], key=r["margins"].get), 0.0)) ** 2
           for r in point.runs if r["valid"] and r.get("margins")]
    return math.sqrt(sum(se2) / len(se2)) if se2 else 0.0


def promise_verdict(point: _cap.Point, plan: _cap.Plan) -> str | None:
    """A load point's verdict (``capacity.verdict_of``) with a hold that needs a run there to hold 9
    times in 10: its mean margin less Student's t (k - 1 degrees of freedom, at the one-sided level of
    2 normal sd) times its standard error clears RUN_HOLDS_Z sd of one run (the runs' own spread, at
    least :func:`run_floor`). HOLD_RUNS runs at least; a hold not that clear is measured again (None),
    or unclear after ``plan.repeats`` runs."""
    v = _cap.verdict_of(point, plan)
    if v != _cap.HOLDS:
        return v
    m = point.margins()
    k = m.size
    if k < HOLD_RUNS:
        return None
    from scipy.stats import norm, t

    sd = max(float(m.std(ddof=1)), run_floor(point))
    reach = float(t.ppf(norm.cdf(Z_CLEAR), k - 1)) * sd / math.sqrt(k)
    need = RUN_HOLDS_Z * sd
    if m.mean() - reach > need:
        return _cap.HOLDS
    return _cap.UNCLEAR if k >= plan.repeats else None


def run_seconds(verify_seconds: float, lifetime: float | None) -> float:
    """How long a promise's open-loop run lasts: ``verify_seconds``, or STEADY_LIFETIMES request
    lifetimes (``lifetime``: the mean E2EL in s of the last run that held) where that is longer, up to
    MAX_STRETCH x ``verify_seconds``."""
    if lifetime is None or not lifetime > 0:
        return verify_seconds
    return min(max(verify_seconds, STEADY_LIFETIMES * lifetime), MAX_STRETCH * verify_seconds)


def next_load(plan: _cap.Plan, load: float, verified: float | None, above: float | None, down: int,
              runs_left: int) -> float | None:
    """The promise's next load after a verdict at ``load`` (None: done). Before any hold, one step down
    that accelerates (the tolerance, then twice and four times it: ``down`` steps taken): a promise far
    above what a long run holds is found in a few runs, one just above it loses one tolerance only.
    After a hold (``verified``), the geometric middle between it and the lowest load that did not hold
    (``above``) while they are more than a tolerance apart and a hold's runs (HOLD_RUNS) are left: the
    accelerated steps can land far below the boundary, and every run spent in the gap raises what is
    promised, never risks it (the verified load stays the highest clear hold)."""
    if verified is None:
        return plan.snap(load / (1 + plan.tolerance) ** (2 ** down))
    if above is None or runs_left < HOLD_RUNS or above <= verified * (1 + plan.tolerance):
        return None
    mid = plan.snap(math.sqrt(verified * above))
    return mid if verified < mid < above else None


class Promise:
    """The capacity objective's promise, verified."""

    def __init__(self, r: Tune):
        self.r = r

    def verify(self, config: dict, rate: float) -> dict:
        """The capacity promised for ``config`` (the highest clear hold of its short searches) run
        for ``verify_seconds`` on a fresh start of it: a short point cannot show a queue that grows
        slowly, a long run can. Each load gets the three-way verdict of any load point
        (:func:`promise_verdict`, up to PROMISE_REPEATS runs at a load): it holds only on three valid runs
        or more whose mean margin, less Student's t times its standard error, clears RUN_HOLDS_Z sd of
        one run (a run there holds 9 times in 10; the sd is their own spread, at least each run's own
        sampling error), and is run again while neither
        holds nor fails is clear (a margin inside the noise, or a run that could not measure the
        server: the client behind its schedule). A load that fails, or stays unclear after the
        repeats, steps down by the tolerance, then by twice and four times it; after a hold, the
        geometric middle of it and the lowest load above it that did not hold is tried while they are
        more than a tolerance apart (:func:`next_load`; PROMISE_RUNS runs with a verdict at most, beside
        up to PROMISE_RESIZES runs re-run longer). The verified load is the highest that clearly held: a
        promise at the boundary itself fails every other fresh run. Open loop, a run lasts ``verify_seconds`` or STEADY_LIFETIMES request
        lifetimes (the mean E2EL of the last run that held) where that is longer (:func:`run_seconds`): a hold
        on a run shorter than that of its own lifetimes is the batch still filling and is run again,
        that long. The server is left on the kept configuration."""
        c = self.r.s.capacity
        assert c is not None
        plan = replace(c.plan, point_seconds=c.verify_seconds, repeats=max(PROMISE_REPEATS, c.plan.repeats))
        w = self.r.s.workload
        opts = replace(w.options, seed=w.seed + 50_000)
        out_dir = os.path.join(self.r.runs_dir, "promise")
        run = _cap.live_measure(opts, self.r.served.url(), out_dir, plan, command=["--state", self.r.sf.path],
                                interrupts=self.r.interrupts, launch_argv=self.r.ledger.server().launch_argv, bench=self.r.measurer.bench)
        ok, res = self.r.seat.apply(dict(config), fresh=True)
        if not ok:
            raise VkitError(f"the recommended configuration does not start: {res.get('message')}", ExitCode.UNAVAILABLE)
        runs, verified, above, load, down, life = [], None, None, plan.snap(rate), 0, None
        point = _cap.Point(load)
        k = verdicts = resized = 0
        while verdicts < PROMISE_RUNS:
            secs = run_seconds(c.verify_seconds, life) if plan.mode == "rate" else c.verify_seconds
            s = run(load, k, math.ceil(load * secs) if plan.mode == "rate" else None)
            k += 1
            where = relative((s.get("vkit") or {}).get("capacity_check", {}).get("path") or out_dir, self.r.sf.dir)
            self.r.measurer.note_environment(where, s)
            j = _cap.judge_run(s, c.slo, plan, load)
            e2el = (s or {}).get("mean_e2el_ms")
            rec = {"load": load, "margin": j["margin"], "seconds": secs,
                   "binding": min(j["margins"], key=j["margins"].get) if j["margins"] else None,
                   "metrics": j["metrics"], "path": where}
            if isinstance(e2el, (int, float)) and e2el > 0 and j["valid"] and j["margin"] > 0:
                life = e2el / 1000.0  # a run that fails reads its queue's wait, not a request's life
                if plan.mode == "rate" and (need := run_seconds(c.verify_seconds, life)) > secs * 1.05:
                    # a hold on a run shorter than STEADY_LIFETIMES of its own requests' lifetimes is the
                    # batch filling, not the server's steady state: the same load again, on a run that long
                    runs.append({**rec, "holds": False, "verdict": None,
                                 "why": f"shorter than {STEADY_LIFETIMES:g} request lifetimes ({life:.3g} s each): not steady"})
                    self.r.progress(f"promise {load:g}: a {secs:.3g}-s run is shorter than {STEADY_LIFETIMES:g} request "
                                    f"lifetimes ({life:.3g} s each): again for {need:.3g} s")
                    resized += 1
                    verdicts += resized > PROMISE_RESIZES  # past its own budget, a re-sized run spends a verdict's
                    continue
            verdicts += 1
            point.runs.append(j)
            # a load point's three-way verdict, measured again while unclear; a hold takes two valid runs
            # or more whose mean clears Student's t for their spread's degrees of freedom (promise_verdict):
            # one run's margin says nothing of how far the next one falls
            verdict = promise_verdict(point, plan)
            held = verdict == _cap.HOLDS
            runs.append({**rec, "holds": held, "verdict": verdict, "why": j["why"]})
            self.r.progress(f"promise {load:g}: {verdict or 'not yet clear'} over {secs:.3g} s"
                          + (f" (margin {j['margin']:+.3f}, {runs[-1]['binding']})" if j["margin"] is not None else f" ({j['why']})"))
            if verdict is None:
                # not yet a verdict (a margin inside the noise, or a run that could not measure the
                # server: the client behind its schedule, a failed request): the same load again
                continue
            if held:
                verified = load
            else:
                above = load if above is None else min(above, load)
            nxt = next_load(plan, load, verified, above, down, PROMISE_RUNS - verdicts)
            if nxt is None:
                break
            down += verified is None
            load, point = nxt, _cap.Point(nxt)
        if config != self.r.ledger.kept_config():
            self.r.seat.restore_kept()
        longest = max((x["seconds"] for x in runs if x["load"] == verified), default=c.verify_seconds)
        out = {"config": dict(config), "searched": rate, "verified": verified, "seconds": c.verify_seconds,
               "held_seconds": longest if verified is not None else None, "runs": runs,
               "finished": now_iso()}
        self.r.log("promise", **out)
        return out
