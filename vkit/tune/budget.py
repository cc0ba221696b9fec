"""How many runs and how much time: the power analysis at the measured σ, and the costs so far."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from vkit.decide import gate as _gate
from vkit.decide.components import SIGMA_RESOLUTION, comparison_sigma, comparison_sigma_low
from vkit.decide.power import Effect, budget_plan
from vkit.tune.compare import MAIN, Versus

if TYPE_CHECKING:
    from vkit.tune.context import Tune


class Budget:
    """Runs per candidate, blocks per confirmation and seconds per trial, from the σ components and the costs measured so far."""

    def __init__(self, r: Tune):
        self.r = r

    def costs(self) -> tuple[float, float] | None:
        """Mean seconds of one restart and of one measurement so far (None before both were timed)."""
        t = self.r.ledger.tune().timing
        r, m = t.get("restart") or {}, t.get("run") or {}
        if not r.get("n") or not m.get("n"):
            return None
        return r["s"] / r["n"], m["s"] / m["n"]

    def trial_cost(self) -> float | None:
        """Seconds one screened candidate takes: a restart and its screening runs."""
        c = self.costs()
        return None if c is None else c[0] + self.screen_size()[0] * c[1]

    def confirm_cost(self) -> float | None:
        """Seconds the step's confirmation takes: its planned B A A B blocks (at the threshold; the whole
        budget where that plan does not fit: a winner far above the threshold is still confirmed), each two
        restarts and four runs, and one restart into the first."""
        c = self.costs()
        if c is None:
            return None
        plan = self.confirm_plan()
        blocks = plan["blocks"] if plan["fits"] else plan["cap"]
        return (c[0] + blocks * (2 * c[0] + 4 * c[1])) if blocks else 0.0

    # -- how many runs: the power analysis at the measured σ components ---------------
    def components(self, key: str = "baseline") -> dict:
        """σ components per metric of baseline ``key`` (the main one's are also the run's)."""
        st = self.r.ledger.tune()
        comps = st.record(key).get("components")
        if comps is None and key == "baseline":
            comps = st.sigma["components"]
        return comps or {}

    def screen_size(self, key: str = "baseline") -> tuple[int, str]:
        """Screening runs per candidate, and why. They share one server process, so a mean over n of
        them has variance within²/n + between²: past n = within²/between² another run buys less than
        the restart-to-restart part it cannot touch. At most ``screen_repeats`` (the budget), at least 1."""
        cap = max(1, self.r.s.screen_repeats)
        comp = self.components(key).get(self.r.s.primary.split(":")[0]) or {}
        w, b = comp.get("within"), comp.get("between")
        if not isinstance(w, (int, float)) or not isinstance(b, (int, float)):
            return cap, f"σ not split into within and between restarts: {cap} (the budget)"
        if b <= 0:
            return cap, f"no between-restart part measured: {cap} (the budget)"
        n = max(1, min(cap, math.ceil((w / b) ** 2 - 1e-9)))
        return n, (f"σ within {w:.1%}, between restarts {b:.1%}: {n} run(s) on one process "
                   f"(within²/between² = {(w / b) ** 2:.2f}; budget {cap})")

    def confirm_plan(self, versus: Versus = MAIN, effect: Effect | None = None) -> dict:
        """B A A B blocks for a confirmation, from the gate's own sequential power analysis
        (``rule.pairs_to_decide``) at the σ a confirmation's runs carry (two runs to a process:
        ``comparison_sigma(…, 2)``), for the primary at its threshold max(2σ, floor) (σ of one run on a
        fresh start, ``comparison_sigma(…, 1)``), or at ``effect`` (a step's winner: its screened effect
        corrected for the winner's curse), and each guard at its tolerance; blocks against the budget by
        ``power.budget_plan``. ``fits``: within ``confirm_blocks``, or granted (``--yes``); otherwise
        ``why`` says what it would take, and nothing is measured."""
        from vkit.decide.analysis import threshold_of
        from vkit.decide.rule import Boundaries, pairs_to_decide
        from vkit.decide.specs import Settings as GateSettings

        gs = GateSettings()
        bnd = Boundaries.build(gs)
        comps = self.components(versus.key)
        sig0 = self.r.ledger.record(versus.key).get("sigma") or {}
        rows = []
        primary, guards = versus.metrics(self.r.s)
        specs = [_gate.parse_metric(primary, "primary"), *_gate.parse_guards(guards)]
        for sp in specs:
            comp = comps.get(sp.name)
            sigma = comparison_sigma(comp, 2) if comp else sig0.get(sp.name)
            if not isinstance(sigma, (int, float)) or not sigma >= 0:
                continue
            # a server that measures the same every time (the simulator with its noise off) has σ 0: planned at
            # the rows' resolution, never at 0 (no power analysis divides by it, nor reads a row rounded to it)
            sigma = min(max(float(sigma), SIGMA_RESOLUTION), 0.99)
            low = max(min(sigma, comparison_sigma_low(comp, 2) or sigma), SIGMA_RESOLUTION) if comp else sigma
            # the gate's own threshold (or tolerance) from the σ of one run on a fresh start, as the
            # log-scale gap the pairs (at the clustered σ) must resolve
            one = max(min(sigma, comparison_sigma(comp, 1) or sigma), SIGMA_RESOLUTION) if comp else sigma
            one_low = max(min(low, comparison_sigma_low(comp, 1) or low), SIGMA_RESOLUTION) if comp else low
            t, gap = threshold_of(sp, one, gs)
            n = pairs_to_decide(sigma, abs(gap), gs, futility=sp.role == "primary", bnd=bnd)
            # the σ of a few runs is itself uncertain: at its favourable end, with the threshold it would then have
            t_low, gap_low = threshold_of(sp, one_low, gs)
            n_low = pairs_to_decide(low, abs(gap_low), gs, futility=sp.role == "primary", bnd=bnd)
            rows.append({"metric": sp.name, "role": sp.role, "sigma": round(sigma, 5), "sigma_low": round(low, 5),
                         "threshold": round(t, 4), "threshold_low": round(t_low, 4), "gap": round(abs(gap), 5),
                         "gap_low": round(abs(gap_low), 5), "pairs": n, "pairs_low": n_low})
        return budget_plan(rows, self.r.s.confirm_blocks, self.r.s.grant_budget, effect, gs, bnd)

    def elapsed_s(self) -> float | None:
        """Seconds since the tuning run under way started (None outside a tune). On the virtual backend, in
        simulated time: what the run's restarts and measurements took on the simulated accelerator (nothing
        else costs time there; the wall clock, seconds for hours of a real tune, would never meet a budget)."""
        import datetime as _dt

        st = self.r.ledger.tune()
        started = _gate.parse_date(st.tune.get("started"))  # naive UTC
        if started is None:
            return None
        if self.r.backend.name == "virtual":
            t = st.timing
            return float(sum((t.get(k) or {}).get("s") or 0.0 for k in ("restart", "run")))
        return max(0.0, time.time() - started.replace(tzinfo=_dt.timezone.utc).timestamp())
