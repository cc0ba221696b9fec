"""A capacity search's own drift check: its anchor load measured again at the end.

A search's points are measured one after another, minutes apart; the boundary model assumes the
server stayed the same machine meanwhile. A level change during the search (a slow stretch, a
neighbour's load, thermals) shifts every later run's margins, and the monotone fit folds that shift
into the curve, so the answer moves without any single point looking wrong.

The check: the *anchor*, the lowest load measured in the first half of the search (its first run
excepted: a process's first run reads slow or odd, as real vLLM's stalled one did), is measured once
more at the end (no extra run when the search itself measured it again in its last third). On the SLO
that binds the search's answer (no check where the keep-up margin binds: a load that held has none), the
late run's margin against the mean of the anchor's early runs:

    z = (late - early) / sqrt(σ² (1 + 1/n) + se_late² + mean(se_early²) / n)

with σ the search's prior sd of a margin between runs (``plan.noise``; the keep-up margin's own), not
the replicates' spread: a load measured before the change and again after it would widen σ by the very
shift it is meant to judge. The level moved when |z| exceeds ``Z`` (3) and the shift exceeds the search's
precision (a smaller change moves the answer less than the interval already allows). The search then says it could not decide; tune
measures it again (a transient finding, as a busy client's).
"""

from __future__ import annotations

import math

from vkit.tune.capacity import Point

Z = 3.0
MIN_RUNS = 4  # a shorter search is too short for a level change inside it to be told from its noise


def order_of(run: dict) -> int | None:
    return run.get("order") if isinstance(run.get("order"), int) else None


def _early(order: int, total: int) -> bool:
    """A run of the search's first half, its first run excepted: a process's first run reads slow or odd
    (a stalled first run on real vLLM)."""
    return 1 <= order < total / 2


def anchor(points: list[Point], binding: str | None = None) -> tuple[float, bool] | None:
    """(the anchor load, whether it needs one more run) for this search's runs (those with an
    ``order``); None when the search is too short for the check, or (``binding`` given) when the
    anchor's early runs do not carry the binding SLO's margin (the keep-up's, at a load that held)."""
    runs = [(order_of(r), p.load, r) for p in points for r in p.runs if order_of(r) is not None]
    total = len(runs)
    if total < MIN_RUNS:
        return None
    early = [(load, o) for o, load, r in runs if r["valid"] and _early(o, total)]
    if not early:
        return None
    load = min(early)[0]
    if binding is not None and not any(_early(o, total) and x == load and binding in r["margins"]
                                       for o, x, r in runs if r["valid"]):
        return None
    late = [o for o, x, r in runs if x == load and r["valid"] and o >= math.ceil(2 * total / 3)]
    return load, not late


def judge(points: list[Point], load: float, sigma: dict[str, float], precision: float, binding: str | None) -> dict:
    """The anchor's late run against its early runs (see the module's docstring), on the SLO that binds the
    search's answer (``binding``; a margin far from binding moves the answer nothing, and its noise away from
    the prior's would only raise false alarms): ``moved`` with the SLO, both margins, the shift (log units)
    and z."""
    p = next(q for q in points if q.load == load)
    runs = sorted((r for r in p.runs if r["valid"] and order_of(r) is not None), key=order_of)
    total = sum(1 for q in points for r in q.runs if order_of(r) is not None)
    early = [r for r in runs if _early(order_of(r), total)]
    late = runs[-1]
    out: dict = {"load": load, "moved": False, "slo": None, "z": 0.0}
    n = len(early)
    e = [r["margins"].get(binding, math.nan) for r in early]
    m = late["margins"].get(binding, math.nan)
    sd_run = sigma.get(binding or "", sigma.get("*"))
    if not early or late in early or not all(map(math.isfinite, [*e, m])) or sd_run is None:
        return out
    mean = sum(e) / n
    se_e = sum(((r.get("se") or {}).get(binding, 0.0)) ** 2 for r in early) / n
    se_l = ((late.get("se") or {}).get(binding, 0.0)) ** 2
    sd = math.sqrt(sd_run ** 2 * (1 + 1 / n) + se_l + se_e / n)
    z = (m - mean) / sd if sd > 0 else 0.0
    return {"load": load, "slo": binding, "early": mean, "late": m, "shift": m - mean, "z": z, "early_runs": n,
            "moved": abs(z) > Z and abs(m - mean) > math.log1p(precision)}


def said(d: dict) -> str:
    """The check's finding in one line (for a search whose level moved)."""
    way = "slower" if d["shift"] < 0 else "faster"
    return (f"the level moved during the search: {d['load']:g} read a {d['slo']} margin of {d['early']:+.3f} early and "
            f"{d['late']:+.3f} at the end ({way}, z {d['z']:+.1f}): the points do not measure one server, no capacity decided")
