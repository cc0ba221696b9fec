"""The confirmation's budget: how many B A A B blocks a confirmation plans, and when the budget is refused.

``Budget.confirm_plan`` measures one row per gated metric (σ a confirmation's runs carry, the threshold or
tolerance, the pairs the sequential rule needs to decide it); :func:`budget_plan` turns the rows into
blocks against the budget. Two plans:

- *At the threshold* (no effect given): the pairs that separate a true 0 from a true +t, t the gate's
  threshold max(2σ, floor). This is the plan of a confirmation with no screening behind it (a Pareto
  member's claim, ``confirm_point``).
- *At the winner's effect* (a step's best screened candidate): its screening showed an effect, so the
  confirmation is planned for that effect, corrected for the winner's curse (:class:`Effect`), not for
  the threshold. A noisy primary (σ 15 %, threshold 30 %) whose winner carries 3x the traffic is then
  confirmed in a block or two, where a plan at the threshold would refuse the step before screening.

A step is refused (``fits`` false, ``underpowered``) only when even at the low end of σ's 90 % interval
its winner's corrected effect cannot be confirmed within the budget. σ measured on few degrees of
freedom (2 between-restart df from three starts) therefore never vetoes on its own: between the point
estimate and the favourable end, the budget is run (the sequential rule stops as soon as it decides).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

from scipy import integrate
from scipy import stats as _sps

from vkit.decide.rule import MAX_PROJECT, Boundaries, pairs_to_decide
from vkit.decide.specs import Settings as GateSettings

WINNERS_CURSE_RULE = "observed − σ_screen·E[max of k standard normals]"


@lru_cache(maxsize=64)
def expected_max_normal(k: int) -> float:
    """E[max of k independent standard normals]: 0 for k = 1, 0.564 for 2, 0.846 for 3, 1.163 for 5,
    1.539 for 10."""
    if k <= 1:
        return 0.0
    val, _ = integrate.quad(lambda x: x * k * _sps.norm.pdf(x) * _sps.norm.cdf(x) ** (k - 1), -12.0, 12.0)
    return float(val)


@dataclass(frozen=True)
class Effect:
    """A step's best screened candidate's effect on the primary, and its correction for the winner's curse.

    ``observed``: the log ratio (positive: better) of its screening mean against the kept configuration's
    baseline, as the screening gate estimated it. ``sigma``: the sd of one candidate's screening mean
    (its own runs on one process: within²/n + between², the noise that differs between candidates;
    the shared baseline's error shifts every candidate alike and selects none). ``k``: the candidates
    it contended with, itself included (``steps.screened_effect``: those screened within 3 sd of it;
    one further below could not have come first by luck).

    The correction subtracts σ_screen·E[max of k standard normals]: the expected excess of the best of k
    candidates whose true effects are all equal. That is the worst case of selection (a winner that
    truly stands out is selected on its effect, not on its noise, and gains less from luck), so the
    corrected effect errs low; it is simple, needs no prior on the effects, and with k = 1 it is the
    screened effect itself. ``sigma_low``: the same sd at the low end of σ's 90 % interval (the plan's
    favourable end)."""

    observed: float
    k: int
    sigma: float
    sigma_low: float
    trial_id: str | None = None

    def shrink(self, low: bool = False) -> float:
        return (self.sigma_low if low else self.sigma) * expected_max_normal(max(1, self.k))

    def corrected(self, low: bool = False) -> float:
        return self.observed - self.shrink(low)

    def as_dict(self) -> dict:
        return {**{k: (round(v, 5) if isinstance(v, float) else v) for k, v in asdict(self).items()},
                "shrink": round(self.shrink(), 5), "corrected": round(self.corrected(), 5),
                "corrected_low": round(self.corrected(True), 5), "rule": WINNERS_CURSE_RULE}


def pairs_for_effect(sigma: float, effect: float, gap: float, gs: GateSettings, bnd: Boundaries) -> int | None:
    """The fewest pairs at which a true ``effect`` (log) is accepted with the gate's power: the sequential
    rule's own ``pairs_to_decide`` with the effect as its gap (the always-valid lower bound clears 0), and,
    since the gate accepts only an estimate at or above its threshold (``gap``, log), enough pairs for
    the estimate to clear it too: z(power)·√2·σ/√k ≤ effect − gap. None when the effect does not clear
    the threshold (no number of pairs confirms it) or when it takes more than ``MAX_PROJECT`` pairs."""
    if not (sigma > 0) or effect <= max(gap, 0.0):
        return None
    n = pairs_to_decide(sigma, effect, gs, futility=True, bnd=bnd)
    if n is None:
        return None
    n_est = math.ceil((_sps.norm.ppf(gs.power) * math.sqrt(2.0) * sigma / (effect - gap)) ** 2)
    k = max(n, n_est)
    return k if k <= MAX_PROJECT else None


def _pct(g: float) -> str:
    return f"{math.expm1(g):+.0%}"


def _at_effect(row: dict, eff: Effect, gs: GateSettings, bnd: Boundaries) -> dict:
    """The primary's row planned at the winner's corrected effect (point σ and the low end of its interval)."""
    e, e_low = eff.corrected(), eff.corrected(True)
    return dict(row, pairs_threshold=row["pairs"], effect=round(e, 5), effect_low=round(e_low, 5),
                pairs=pairs_for_effect(row["sigma"], e, row["gap"], gs, bnd),
                pairs_low=pairs_for_effect(row["sigma_low"], e_low, row["gap_low"], gs, bnd))


def _blocks(pairs: int | None) -> int | None:
    return None if pairs is None else max(1, math.ceil(pairs / 2))


def _most(rows: list[dict], key: str) -> int | None:
    """The most pairs any row needs (at least 2), None when one cannot be decided within reach."""
    n: int | None = 2
    for r in rows:
        n = None if r.get(key) is None or n is None else max(n, r[key])
    return n


def _effect_text(eff: Effect, lead: str = "the best screened candidate's effect") -> str:
    return (f"{lead} {_pct(eff.corrected())} ({_pct(eff.observed)} screened, divided by {math.exp(eff.shrink()):.2f} "
            f"for the winner's curse of the best of {eff.k})")


def _refusal(rows: list[dict], eff: Effect | None, need_low: int | None, blocks_low: int | None) -> str:
    """Why the budget cannot decide, naming the metric that needs the most even at σ's favourable end."""
    worst = max(rows, key=lambda r: r["pairs_low"] if r["pairs_low"] is not None else math.inf, default=None)
    need = "more than 200 pairs" if need_low is None else f"{need_low} pairs ({blocks_low} B A A B blocks)"
    if eff is not None and worst is not None and worst["role"] == "primary":
        if worst["effect_low"] <= worst["gap_low"]:
            return (f"cannot confirm the best screened candidate: {_effect_text(eff, 'its effect')} does not clear the gate's "
                    f"{worst['threshold']:.0%} threshold, not even at the low end of σ's 90 % interval "
                    f"({_pct(worst['effect_low'])} against {worst['threshold_low']:.0%})")
        return (f"cannot confirm the best screened candidate within the budget: {_effect_text(eff, 'its effect')} needs {need} "
                f"even at the low end of σ's 90 % interval ({worst['metric']} σ {worst['sigma_low']:.1%} per run; "
                f"{worst['sigma']:.1%} measured)")
    return (f"cannot reach a verdict within the budget: {need} even at the low end of σ's 90 % interval"
            + (f" ({worst['metric']} σ {worst['sigma_low']:.1%} per run against its {worst['threshold']:.0%} "
               f"{'threshold' if worst['role'] == 'primary' else 'tolerance'}; {worst['sigma']:.1%} measured)" if worst else ""))


def budget_plan(rows: list[dict], cap: int, grant: bool, effect: Effect | None = None,
                gs: GateSettings | None = None, bnd: Boundaries | None = None) -> dict:
    """Blocks for a confirmation from its metrics' rows (``Budget.confirm_plan``): ``fits`` within ``cap``,
    or granted (``grant``, --yes: up to 4x), or within it at the low end of σ's interval (the budget is
    run, and may end undecided); otherwise not, with ``why`` saying what it would take.

    With ``effect`` (a step's winner), the primary is planned at its corrected effect, and a plan that fits
    runs at least the blocks the plan at the threshold would (capped by the budget): the gate stops at the
    first block that decides, and a winner that was only lucky still gets the blocks its rejection needs."""
    gs = gs or GateSettings()
    bnd = bnd or Boundaries.build(gs)
    at_thr = rows
    if effect is not None:
        rows = [_at_effect(r, effect, gs, bnd) if r["role"] == "primary" else r for r in rows]
    pairs, need_low = _most(rows, "pairs"), _most(rows, "pairs_low")
    hard = 4 * max(cap, 1)  # even --yes does not grant a confirmation of more than 4x the budget
    blocks, blocks_low = _blocks(pairs), _blocks(need_low)
    out = {"pairs": pairs, "blocks": blocks, "pairs_low": need_low, "cap": cap, "metrics": rows, "granted": False}
    what = "decide at the measured σ" if effect is None else f"confirm {_effect_text(effect)} at the measured σ"
    if effect is not None:
        out["effect"] = effect.as_dict()
    if blocks is not None and blocks <= cap:
        out.update(fits=True, why=f"{pairs} pairs ({blocks} B A A B block(s)) {what}; budget {cap}")
    elif blocks is not None and grant and blocks <= hard:
        out.update(fits=True, granted=True, why=f"{pairs} pairs ({blocks} blocks) {what}, over the budget of {cap}: granted by --yes")
    elif blocks_low is not None and blocks_low <= cap:
        # over the budget at the point estimate, within it at the low end of σ's interval: the budget is run
        # (the sequential rule stops early if σ was overestimated), and said to be possibly short
        out.update(fits=True, blocks=cap,
                   why=f"{pairs if pairs is not None else 'more than 200'} pairs {what}, {need_low} at the low end of its "
                       f"90 % interval: the budget of {cap} block(s) may end undecided")
    else:
        hint = "" if blocks is None or blocks > hard else f"; rerun with --confirm-blocks {blocks} (or --yes)"
        out["fits"] = False
        out["why"] = _refusal(rows, effect, need_low, blocks_low) + f", the budget is {cap} block(s){hint}"
        return out
    if effect is not None and not out["granted"]:
        at_threshold = _blocks(_most(at_thr, "pairs"))
        out["blocks"] = max(out["blocks"], min(cap, at_threshold or cap))
        out["why"] += f"; up to {out['blocks']} block(s) are run (the gate stops at the first that decides)"
    return out
