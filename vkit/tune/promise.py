"""The capacity a tune promises, verified by long runs on a fresh start."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING

from vkit.errors import ExitCode, VkitError
from vkit.state import now_iso
from vkit.tune import capacity as _cap
from vkit.tune.summaries import relative

if TYPE_CHECKING:
    from vkit.tune.runner import Runner


class Promise:
    """The capacity objective's promise, verified."""

    def __init__(self, r: Runner):
        self.r = r

    def verify(self, config: dict, rate: float) -> dict:
        """The capacity promised for ``config`` (the highest clear hold of its short searches) run
        for ``verify_seconds`` on a fresh start of it: a short point cannot show a queue that grows
        slowly, a long run can. Each load gets the three-way verdict of any load point
        (``capacity.verdict_of``, at least 2 repeats): it holds only on two valid runs whose mean
        margin clears twice its standard error (their own spread, at least the margins' prior noise),
        and is run again while neither holds nor fails is clear (a margin inside the noise, or a run
        that could not measure the server: the client behind its schedule). A load that fails, or
        stays unclear after the repeats, steps down by the tolerance, then by twice and four times it
        (8 runs at most). The verified load is the one that clearly held: a promise at the boundary
        itself fails every other fresh run. The server is left on the kept configuration."""
        c = self.r.s.capacity
        assert c is not None
        plan = replace(c.plan, point_seconds=c.verify_seconds, repeats=max(2, c.plan.repeats))
        w = self.r.s.workload
        opts = replace(w.options, seed=w.seed + 50_000)
        out_dir = os.path.join(self.r.runs_dir, "promise")
        run = _cap.live_measure(opts, self.r.served.url(), out_dir, plan, command=["--state", self.r.sf.path],
                                interrupts=self.r.interrupts, launch_argv=self.r.ledger.server().launch_argv, bench=self.r.measurer.bench)
        ok, res = self.r.apply(dict(config), fresh=True)
        if not ok:
            raise VkitError(f"the recommended configuration does not start: {res.get('message')}", ExitCode.UNAVAILABLE)
        runs, verified, load, down = [], None, plan.snap(rate), 0
        point = _cap.Point(load)
        for k in range(8):
            s = run(load, k)
            where = relative((s.get("vkit") or {}).get("capacity_check", {}).get("path") or out_dir, self.r.sf.dir)
            self.r.measurer.note_environment(where, s)
            j = _cap.judge_run(s, c.slo, plan, load)
            point.runs.append(j)
            # the same three-way verdict as any load point: holds only when the margin clears the
            # margins' noise (2 se), measured again while unclear; and a hold takes two valid runs,
            # whose own spread enters se: one run's margin says nothing of how far the next one falls
            verdict = _cap.verdict_of(point, plan)
            if verdict == _cap.HOLDS and point.margins().size < 2:
                verdict = None
            held = verdict == _cap.HOLDS
            runs.append({"load": load, "holds": held, "verdict": verdict, "margin": j["margin"],
                         "binding": min(j["margins"], key=j["margins"].get) if j["margins"] else None, "why": j["why"],
                         "metrics": j["metrics"],
                         "path": where})
            self.r.progress(f"promise {load:g}: {verdict or 'not yet clear'} over {c.verify_seconds:g} s"
                          + (f" (margin {j['margin']:+.3f}, {runs[-1]['binding']})" if j["margin"] is not None else f" ({j['why']})"))
            if held:
                verified = load
                break
            if verdict is None:
                # not yet a verdict (a margin inside the noise, or a run that could not measure the
                # server: the client behind its schedule, a failed request): the same load again
                continue
            # stepping down accelerates (the tolerance, then twice it, ...): a promise far above what
            # a long run holds is found in a few runs, one just above it loses one tolerance only
            load = plan.snap(load / (1 + plan.tolerance) ** (2 ** down))
            point = _cap.Point(load)
            down += 1
        if config != self.r.ledger.kept_config():
            self.r.restore_kept()
        out = {"config": dict(config), "searched": rate, "verified": verified, "seconds": c.verify_seconds, "runs": runs,
               "finished": now_iso()}
        self.r.log("promise", **out)
        return out
