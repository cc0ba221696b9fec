"""Two sets of runs compared by the gate, with the σ the tune measured."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vkit.decide import gate as _gate
from vkit.decide.components import comparison_sigma
from vkit.errors import ExitCode, VkitError
from vkit.tune.summaries import capacity_checker, plain

if TYPE_CHECKING:
    from vkit.tune.config import Settings, Workload
    from vkit.tune.context import Tune


@dataclass(frozen=True)
class Versus:
    """What a trial or a confirmation is compared on: the workload that measures both sides (None: the tune's),
    the baseline record the candidate is gated against (its runs, its σ), the primary metric and the guards
    (None: the tune's). Step 5's flips are judged on their own workload, baseline and metrics; an ablation
    against its own baseline; a delivered configuration on its own claim."""

    workload: Workload | None = None
    key: str = "baseline"
    primary: str | None = None
    guards: tuple[str, ...] | None = None

    def primary_of(self, s: Settings) -> str:
        """The primary metric (its spec), the tune's where this comparison leaves it open."""
        return self.primary or s.primary

    def metrics(self, s: Settings) -> tuple[str, list[str]]:
        """(primary, guards) as the gate takes them, the tune's where this comparison leaves them open."""
        return self.primary_of(s), list(self.guards) if self.guards is not None else list(s.guards)

    def on_main_workload(self, s: Settings) -> bool:
        """Both sides measured with the tune's own workload (a keep then rebases the main baseline)."""
        return self.workload is None or self.workload.name == s.workload.name


MAIN = Versus()  # the tune's workload, its baseline, primary and guards


# The least pooled σ: a measured 0 becomes this (the normal mixture divides by it).
SIGMA_FLOOR = 1e-12


class Compare:
    """gate's verdict on two sets of runs, at the σ components of the baseline they are measured against (and
    the devices' spread when the two sides ran on different slots)."""

    def __init__(self, r: Tune):
        self.r = r

    def gate(self, baseline: list[str], candidate: list[str], fresh: bool = False, selected_from: int = 1,
             versus: Versus = MAIN) -> dict:
        primary, guards = versus.metrics(self.r.s)
        key = versus.key
        # σ pooled from the repeats of baseline ``key`` (the same workload as the evidence), for the
        # primary and every guard (normal-mixture sequences)
        st = self.r.ledger.tune()
        sig = st.record(key).get("sigma") or (st.sigma["baseline"] if key == "baseline" else None) or {}
        comps = self.r.budget.components(key)
        # runs per server start on the evidence side: screening runs share one process (its level
        # does not average out over them); a confirmation's arms change process every one or two runs
        per_start = 2 if fresh else max(1, len(candidate))
        device = self.slot_sigma(baseline, candidate)
        pool, thr = {}, {}
        for spec in [primary, *guards]:
            m = spec.split(":")[0]
            v = comparison_sigma(comps.get(m), per_start) if comps.get(m) else sig.get(m)
            if isinstance(v, (int, float)) and device.get(m):
                v = math.sqrt(v * v + device[m] ** 2)  # the two sides ran on different devices: their A/A spread
            if isinstance(v, (int, float)) and 0 <= v < 1:
                # identical runs (a simulator with its noise off) measure σ 0: known to be nil, not missing, so
                # the normal mixture (exact at any number of pairs) and not the t-mixture (no bound before a
                # third pair) judges it
                pool[m] = max(float(v), SIGMA_FLOOR)
                # the practical bar max(2σ, floor) is twice the noise of one run on a fresh start
                # (σ_baseline as the seeds define it), not the clustered σ the test must use
                one = comparison_sigma(comps[m], 1) if comps.get(m) else v
                thr[m] = float(min(one, v)) if isinstance(one, (int, float)) and one > 0 else float(v)
        runs = {"fresh" if fresh else "candidate": [self.r.ledger.abs_path(p) for p in candidate]}
        try:
            inp = _gate.GateInput(baseline=[self.r.ledger.abs_path(p) for p in baseline], primary=_gate.parse_metric(primary, "primary"),
                                  guards=_gate.parse_guards(guards), selected_from=selected_from, sigma_pool=pool, sigma_threshold=thr,
                                  policy=self.r.policy, **runs)
            res = plain(_gate.decide(inp, checker=capacity_checker if self.r.s.capacity is not None else None))
        except VkitError as e:
            return {"decision": "invalid", "why": f"gate: error: {' '.join(str(e).split())}", "exit_code": int(e.code)}
        res["exit_code"] = int(_gate.EXIT_CODE.get(res["decision"], ExitCode.UNDECIDED))
        return res

    def slots_of(self, runs: list[str]) -> set[str]:
        """The slots whose servers measured ``runs`` (their folder under runs/), empty without slots."""
        names = {s["name"] for s in self.r.ledger.slots(live=False)}
        return {part for p in runs for part in p.replace(os.sep, "/").split("/") if part in names}

    def slot_sigma(self, baseline: list[str], candidate: list[str]) -> dict:
        """σ_device per metric from the slots' A/A pass when the two sides were not measured on the same
        slot(s), else {}: a comparison across devices carries their spread, one within a slot does not."""
        a, b = self.slots_of(baseline), self.slots_of(candidate)
        if not a or not b or a == b:
            return {}
        eff = self.r.ledger.tune().slot_effects
        return {m: e["sigma_device"] for m, e in eff.items() if e.get("sigma_device")}
