"""σ components of a measurement (within one server process, between restarts) and the σ a comparison
of runs measured that way carries."""

from __future__ import annotations

import math

import numpy as np

SIGMA_RESOLUTION = 1e-5  # the confirmation plan's rows carry σ to 5 decimals: the least σ it plans with


def sigma_parts(logs: list[float], starts: list[str | None]) -> dict:
    """σ of log values from runs grouped by server start: ``within`` one process, ``between``
    restarts, ``total`` (one run on a new process), with 90 % intervals, from the one-way
    random-effects estimate; with runs from one start only, ``between`` is None (not measured)
    and ``total`` is the plain sd."""
    from vkit.decide.stats import variance_components

    groups: dict = {}
    for i, (v, s) in enumerate(zip(logs, starts, strict=True)):
        groups.setdefault(s if s is not None else f"unknown-{i}", []).append(v)
    sd = float(np.std(logs, ddof=1))
    if len(groups) >= 2 and any(len(g) >= 2 for g in groups.values()):
        vc = variance_components(list(groups.values()))
        out = vc.as_dict()
        for k in ("within_ci", "between_ci"):  # JSON has no infinity: an unbounded end is None
            out[k] = [x if math.isfinite(x) else None for x in out[k]]
        return dict(out, measured="within and between restarts")
    if len(groups) >= 2:  # one run per start: the sd of runs on new processes, not split
        return {"within": None, "between": None, "total": sd, "groups": len(groups), "runs": len(logs),
                "measured": "one run per start: within and between not separated"}
    return {"within": sd, "between": None, "total": sd, "groups": 1, "runs": len(logs),
            "measured": "one server start: the between-restart part is not measured"}


def comparison_sigma(comp: dict, per_start: int) -> float | None:
    """The per-run σ the gate uses for evidence measured ``per_start`` runs to a server process:
    sqrt(within² + per_start · between²), so that a mean over those runs carries the whole
    process-level variance (within²/n + between²). Without a split, the total. A capacity's
    search sd (``resolution``, where fewer than three searches measured the spread) is its floor."""
    w, b = comp.get("within"), comp.get("between")
    if w is None or b is None:
        base = comp.get("total")
    else:
        base = math.sqrt(w * w + per_start * b * b)
    if base is None:
        return None
    return float(max(base, comp.get("resolution") or 0.0))


def comparison_sigma_low(comp: dict, per_start: int) -> float | None:
    """``comparison_sigma`` at the low ends of the components' 90 % intervals: the most favourable σ
    the baseline's few runs allow. A budget is refused only when even this one cannot decide."""
    from scipy import stats as _sps

    w, b = comp.get("within_ci"), comp.get("between_ci")
    if isinstance(w, list) and isinstance(b, list) and w and b and w[0] is not None:
        base = math.sqrt(w[0] ** 2 + per_start * (b[0] or 0.0) ** 2)
    elif isinstance(comp.get("total"), (int, float)) and (comp.get("runs") or 0) >= 2:
        df = comp["runs"] - 1
        base = comp["total"] * math.sqrt(df / _sps.chi2.ppf(0.95, df))
    else:
        return comparison_sigma(comp, per_start)
    return float(max(base, comp.get("resolution") or 0.0))


MIN_SPREAD_SEARCHES = 3  # searches whose spread alone is capacity's σ


def capacity_sigma(sample: float | None, docs: list[dict]) -> float:
    """σ of ``slo_capacity`` between two searches. From three searches or more on fresh starts, their
    own spread, as for any metric: it already holds each search's own error (its interval), and a
    search's 95 % interval is conservative by construction (the bootstrap widened by the curvature), so
    adding it again would count that error twice. From fewer, the spread at least the searches' own sd
    (``slo_capacity_sd``, root mean square): two searches can agree by chance."""
    res = [d["slo_capacity_sd"] for d in docs if isinstance(d.get("slo_capacity_sd"), (int, float))]
    q = math.sqrt(float(np.mean(np.square(res)))) if res else 0.0
    if sample is not None and len(docs) >= MIN_SPREAD_SEARCHES:
        return float(sample)
    return float(max(sample or 0.0, q))
