"""Pareto front, hypervolume, knee, dominance rate, the recommendation and the delivery.

Definitions (they are what the report prints):

- **dominated**: a dominates b when a is no worse in every objective and strictly better
  in at least one (Pareto 1896; e.g. Deb 2001, *Multi-Objective Optimization using
  Evolutionary Algorithms*, Def. 2.5), on the aggregated (mean) objectives.
- **dominance rate** of a configuration: the share of the *other* feasible evaluated
  configurations that it dominates (0 … 1). A front member with rate 0.8 beats 80% of
  everything tried; a rate near 0 says the front member is only "non-dominated" because
  little else was measured near it.
- **P(non-dominated)**: the probability that a configuration stays non-dominated when
  every configuration's mean objectives are redrawn from their measured repeat noise
  (log-normal; the covariance of the log objectives pooled within every configuration with
  two or more repeats — a run's throughput and latency move together, as one slow run is
  slow in both — divided by n for a mean of n repeats; 400 draws from a fixed seed). Below
  0.5 the point is more likely a noise artefact than a real front member.
- **knee**: by default the front member with the largest expected marginal utility (Branke
  et al. 2004, "Finding knees in multi-objective optimization", PPSN VIII): with the
  objectives normalised to the front's range and linear utilities λ·f₁ + (1−λ)·f₂ with
  λ ~ U[0, 1], a member's marginal utility is how much the best utility worsens if it is
  removed; the knee is the member whose removal would cost most on average. Also available:
  ``"distance"`` (the largest distance below the line through the two extremes, Das 1999,
  "On characterizing the 'knee' of the Pareto curve based on normal-boundary intersection",
  Struct. Optim. 18) and ``"hv"`` (the largest exclusive hypervolume contribution).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as _sps

from vkit.search.types import Objective, Observation, jsonable

KNEE_METHODS = {
    "emu": "expected marginal utility (Branke et al. 2004): linear utilities, weight ~ U[0,1], objectives normalised to the front's range",
    "distance": "largest distance below the line through the extremes (Das 1999), objectives normalised to the front's range",
    "hv": "largest exclusive hypervolume contribution (objectives normalised to the front's range, reference 1.1)",
}
ND_DRAWS = 400
DEFAULT_CONFIDENCE = 0.95  # one-sided, for "meets the SLO" (bench/bench_tuner.py measured 0.9 vs 0.95)


# -- plain point sets ------------------------------------------------------
def _as_min(points, directions) -> np.ndarray:
    P = np.asarray(points, dtype=float)
    if P.ndim == 1:
        P = P.reshape(-1, len(directions))
    sign = np.array([1.0 if d == "min" else -1.0 for d in directions])
    return P * sign


def pareto_indices(points, directions: list[str]) -> list[int]:
    """Indices of the non-dominated rows of ``points`` (n × m), each column maximised or
    minimised as ``directions`` says. Equal rows do not dominate each other: both stay."""
    F = _as_min(points, directions)
    n = len(F)
    if n == 0:
        return []
    le = (F[:, None, :] <= F[None, :, :]).all(-1)  # le[j, i]: j no worse than i everywhere
    lt = (F[:, None, :] < F[None, :, :]).any(-1)
    dominated = (le & lt).any(0)
    return [i for i in range(n) if not dominated[i]]


def dominates(a, b, directions) -> bool:
    F = _as_min([a, b], directions)
    return bool((F[0] <= F[1]).all() and (F[0] < F[1]).any())


def hypervolume_2d(points, directions: list[str], ref) -> float:
    """Area dominated by ``points`` and bounded by ``ref`` (Zitzler & Thiele 1998, "Multiobjective
    optimization using evolutionary algorithms — a comparative case study", PPSN V), by the
    usual sweep: sort by f₁, add the slab (r₁ − f₁)·(previous best f₂ − f₂) of each new step."""
    F = _as_min(points, directions)
    R = _as_min([ref], directions)[0]
    F = F[(F[:, 0] < R[0]) & (F[:, 1] < R[1])] if len(F) else F
    if len(F) == 0:
        return 0.0
    F = F[np.lexsort((F[:, 1], F[:, 0]))]
    hv, cur = 0.0, R[1]
    for f1, f2 in F:
        if f2 < cur:
            hv += (R[0] - f1) * (cur - f2)
            cur = f2
    return float(hv)


def _normalised_front(points, directions) -> tuple[list[int], np.ndarray]:
    idx = pareto_indices(points, directions)
    F = _as_min(points, directions)[idx]
    lo, hi = F.min(0), F.max(0)
    span = np.where(hi - lo > 0, hi - lo, 1.0)
    return idx, (F - lo) / span


def marginal_utilities(Fn: np.ndarray, seed: int = 0) -> np.ndarray:
    """Expected marginal utility of each row of a normalised minimisation front (Branke et al.
    2004). Two objectives: λ on a 2001-point grid of [0, 1]; more: 4000 Dirichlet(1) weights."""
    n, m = Fn.shape
    if n == 1:
        return np.ones(1)
    if m == 2:
        lam = np.linspace(0.0, 1.0, 2001)
        W = np.stack([lam, 1.0 - lam], 1)
    else:
        W = np.random.default_rng(seed).dirichlet(np.ones(m), 4000)
    U = Fn @ W.T  # n × w, lower is better
    order = np.argsort(U, 0, kind="stable")
    best, second = order[0], order[1]
    cols = np.arange(U.shape[1])
    gain = U[second, cols] - U[best, cols]
    return np.bincount(best, weights=gain, minlength=n) / U.shape[1]


def exclusive_hv_2d(Fn: np.ndarray, ref: float = 1.1) -> np.ndarray:
    """Exclusive hypervolume contribution of each point of a 2-D minimisation front."""
    order = np.argsort(Fn[:, 0], kind="stable")
    S = Fn[order]
    out = np.zeros(len(S))
    for k in range(len(S)):
        right = S[k + 1, 0] if k + 1 < len(S) else ref
        up = S[k - 1, 1] if k > 0 else ref
        out[k] = max(right - S[k, 0], 0.0) * max(up - S[k, 1], 0.0)
    res = np.zeros(len(S))
    res[order] = out
    return res


def knee_point(points, directions: list[str], method: str = "emu") -> tuple[int, str]:
    """The knee of the non-dominated subset of ``points``: (row index into ``points``, method).

    ``method``: ``"emu"`` (default, expected marginal utility), ``"distance"`` (Das 1999) or
    ``"hv"`` (largest exclusive hypervolume contribution); see the module docstring."""
    if method not in KNEE_METHODS:
        raise ValueError(f"knee method {method!r} is not one of {', '.join(KNEE_METHODS)}")
    P = np.asarray(points, dtype=float)
    if len(P) == 0:
        raise ValueError("no points")
    idx, Fn = _normalised_front(P, directions)
    if len(idx) <= 2 and method != "emu":
        method = "emu"
    if method == "emu" or Fn.shape[1] != 2 and method == "hv":
        score = marginal_utilities(Fn)
    elif method == "distance":
        if Fn.shape[1] == 2:
            a = Fn[np.lexsort((Fn[:, 1], Fn[:, 0]))[0]]
            b = Fn[np.lexsort((Fn[:, 0], Fn[:, 1]))[0]]
            d = b - a
            nrm = math.hypot(*d) or 1.0
            cross = (d[0] * (Fn[:, 1] - a[1]) - d[1] * (Fn[:, 0] - a[0])) / nrm
            toward_ideal = d[0] * (0.0 - a[1]) - d[1] * (0.0 - a[0])  # the ideal corner (0, 0) is on this side
            score = cross * (1.0 if toward_ideal >= 0 else -1.0)
        else:
            score = -np.linalg.norm(Fn, axis=1)
    else:
        score = exclusive_hv_2d(Fn)
    return idx[int(np.argmax(score))], KNEE_METHODS[method]


# -- histories -------------------------------------------------------------
def _usable(o: Observation, names: list[str]) -> bool:
    if not o.feasible:
        return False
    for n in names:
        v = o.objectives.get(n)
        if v is None or not isinstance(v, (int, float)) or not math.isfinite(v):
            return False
    return True


def objective_matrix(history: list[Observation], objectives: list[Objective]) -> tuple[list[int], np.ndarray]:
    """(indices of the usable observations, their aggregated objective values)."""
    names = [o.name for o in objectives]
    idx = [i for i, o in enumerate(history) if _usable(o, names)]
    M = np.array([[history[i].objectives[n] for n in names] for i in idx], dtype=float).reshape(len(idx), len(names))
    return idx, M


def front_indices(history: list[Observation], objectives: list[Objective]) -> list[int]:
    """History indices of the non-dominated feasible observations."""
    idx, M = objective_matrix(history, objectives)
    return [idx[j] for j in pareto_indices(M, [o.direction for o in objectives])]


def dominance_rate(history: list[Observation], objectives: list[Objective]) -> dict[int, float]:
    """For every feasible observation (by history index): the share of the other feasible
    evaluated configurations it dominates, on the aggregated objectives (module docstring)."""
    idx, M = objective_matrix(history, objectives)
    F = _as_min(M, [o.direction for o in objectives])
    n = len(idx)
    if n == 0:
        return {}
    dom = (F[:, None, :] <= F[None, :, :]).all(-1) & (F[:, None, :] < F[None, :, :]).any(-1)  # dom[i, j]: i dominates j
    return {idx[i]: (float(dom[i].sum()) / (n - 1) if n > 1 else 0.0) for i in range(n)}


def _log_repeats(o: Observation, metric: str) -> np.ndarray:
    vals = [r.get(metric) for r in o.repeats]
    return np.log([v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0])


def pooled_log_sigma(history: list[Observation], metric: str) -> tuple[float, int]:
    """(σ of the log repeat values pooled within configurations, degrees of freedom).

    Configurations whose own variance exceeds 10 × the median one (a P95 caught by a tail
    event; for normal repeats of 3 that happens about once in a thousand) are left out, so
    one wild configuration does not widen every other's bound; it gets its own, larger
    spread in :func:`constraint_bound`."""
    rows = []
    for o in history:
        lv = _log_repeats(o, metric)
        if len(lv) >= 2:
            rows.append((float(((lv - lv.mean()) ** 2).sum()), len(lv) - 1))
    if not rows:
        return 0.0, 0
    med = float(np.median([ss / df for ss, df in rows]))
    kept = [(ss, df) for ss, df in rows if ss / df <= 10.0 * med] or rows
    ss, df = sum(r[0] for r in kept), sum(r[1] for r in kept)
    return math.sqrt(ss / df), int(df)


def _n_repeats(o: Observation, metric: str) -> int:
    return max(1, sum(1 for r in o.repeats if isinstance(r.get(metric), (int, float))))


def pooled_log_cov(history: list[Observation], names: list[str]) -> tuple[np.ndarray, int]:
    """(covariance of the log repeat values of ``names`` pooled within configurations, degrees
    of freedom). One run's throughput and latency share its speed, so they are correlated."""
    m = len(names)
    S, df = np.zeros((m, m)), 0
    for o in history:
        rows = [[r.get(n) for n in names] for r in o.repeats]
        rows = [r for r in rows if all(isinstance(v, (int, float)) and v > 0 for v in r)]
        if len(rows) >= 2:
            L = np.log(np.array(rows, dtype=float))
            C = L - L.mean(0)
            S += C.T @ C
            df += len(rows) - 1
    return (S / df if df else S), df


def nondominated_probability(history: list[Observation], objectives: list[Objective], draws: int = ND_DRAWS,
                             seed: int = 0) -> dict[int, float]:
    """For every feasible observation: P(non-dominated) under the measured repeat noise
    (module docstring). With no repeats anywhere the answer is 1 or 0 (no noise known)."""
    idx, M = objective_matrix(history, objectives)
    n = len(idx)
    if n == 0:
        return {}
    dirs = [o.direction for o in objectives]
    names = [o.name for o in objectives]
    cov, df = pooled_log_cov(history, names)
    if df == 0 or not np.any(np.diag(cov) > 0) or np.any(M <= 0):
        front = set(pareto_indices(M, dirs))
        return {idx[i]: (1.0 if i in front else 0.0) for i in range(n)}
    w, V = np.linalg.eigh(cov)
    root = V * np.sqrt(np.maximum(w, 0.0))  # cov = root @ root.T, also when singular
    nrep = np.array([max(1, sum(1 for r in history[i].repeats
                                if all(isinstance(r.get(k), (int, float)) for k in names))) for i in idx], dtype=float)
    rng = np.random.default_rng(seed)
    L = np.log(M)
    sign = np.array([1.0 if d == "min" else -1.0 for d in dirs])
    count = np.zeros(n)
    for _ in range(draws):
        E = (rng.standard_normal(L.shape) @ root.T) / np.sqrt(nrep)[:, None]
        F = (L + E) * sign
        dominated = ((F[:, None, :] <= F[None, :, :]).all(-1) & (F[:, None, :] < F[None, :, :]).any(-1)).any(0)
        count += ~dominated
    return {idx[i]: float(count[i] / draws) for i in range(n)}


# -- the recommendation ----------------------------------------------------
def _goal(goal: dict | None, objectives: list[Objective]) -> tuple[str, str, list, float, float]:
    """(target, direction, [(metric, bound, is_ceiling)], confidence, default σ) of a goal."""
    goal = dict(goal or {})
    if "maximize" in goal:
        target, direction = goal["maximize"], "max"
    elif "minimize" in goal:
        target, direction = goal["minimize"], "min"
    else:
        first = next((o for o in objectives if o.direction == "max"), objectives[0])
        target, direction = first.name, first.direction
    dirs = {o.name: o.direction for o in objectives}
    cons = []
    for metric, b in dict(goal.get("subject_to") or {}).items():
        if isinstance(b, dict):  # {"max": ceiling} or {"min": floor}
            if "max" in b:
                cons.append((metric, float(b["max"]), True))
            if "min" in b:
                cons.append((metric, float(b["min"]), False))
        else:  # a plain number: a ceiling, unless the metric is a maximised objective
            cons.append((metric, float(b), dirs.get(metric, "min") == "min"))
    return target, direction, cons, float(goal.get("confidence", DEFAULT_CONFIDENCE)), float(goal.get("sigma", 0.0))


def constraint_bound(history: list[Observation], i: int, metric: str, upper: bool, confidence: float,
                     sigma_default: float = 0.0) -> float | None:
    """One-sided ``confidence`` bound of a config's metric (upper for a ceiling, lower for a
    floor): log value ± t·σ/√n with σ the larger of the pooled σ (:func:`pooled_log_sigma`)
    and the config's own repeat spread; ``sigma_default`` when nothing has repeats."""
    o = history[i]
    v = o.objectives.get(metric)
    if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        return None
    sig, df = pooled_log_sigma(history, metric)
    if df == 0:
        sig, q = sigma_default, _sps.norm.ppf(confidence)
    else:
        q = _sps.t.ppf(confidence, df)
        own = _log_repeats(o, metric)
        if len(own) >= 2:
            sig = max(sig, float(own.std(ddof=1)))
    half = q * sig / math.sqrt(_n_repeats(o, metric)) if confidence > 0.5 else 0.0
    return float(math.exp(math.log(v) + (half if upper else -half)))


def slo_status(history: list[Observation], objectives: list[Objective], goal: dict | None) -> dict[int, tuple[bool, str]]:
    """For every feasible observation: (meets every constraint of the goal, why not)."""
    _, _, cons, conf, sig0 = _goal(goal, objectives)
    out = {}
    for i, o in enumerate(history):
        if not o.feasible:
            continue
        if o.slo_ok is False:
            out[i] = (False, "the runner marked it as breaking the SLO")
            continue
        ok, why = True, ""
        for metric, bound, upper in cons:
            b = constraint_bound(history, i, metric, upper, conf, sig0)
            if b is None:
                ok, why = False, f"{metric} not measured"
                break
            if (upper and b > bound) or (not upper and b < bound):
                ok = False
                why = f"{metric} {'upper' if upper else 'lower'} {conf:.0%} bound {b:.4g} {'>' if upper else '<'} {bound:.4g}"
                break
        out[i] = (ok, why)
    return out


def recommend(history: list[Observation], objectives: list[Objective], goal: dict | None = None) -> tuple[int | None, str]:
    """The evaluated configuration to deploy for ``goal``: (history index or None, one-line why).

    ``goal`` (default: maximise the first maximised objective, no constraint)::

        {"maximize": "goodput", "subject_to": {"p95_ttft_ms": 2000}, "confidence": 0.95}

    A constraint on a minimised metric is a ceiling, on a maximised one a floor. A config
    meets it only when its one-sided ``confidence`` bound does (log value ± t·σ/√n, σ pooled
    from the repeats), so a config measured just under the SLO by luck is not picked; with
    ``confidence`` 0.5 the measured value itself is compared. Among the configs that meet
    every constraint, the best aggregated value of the target wins.
    """
    target, direction, cons, conf, _ = _goal(goal, objectives)
    status = slo_status(history, objectives, goal)
    cands = [i for i, (ok, _) in status.items() if ok and isinstance(history[i].objectives.get(target), (int, float))]
    cons_txt = ", ".join(f"{m} {'<=' if up else '>='} {b:g}" for m, b, up in cons)
    if not cands:
        if not status:
            return None, "no feasible configuration has been evaluated"
        return None, f"no evaluated configuration meets {cons_txt} at {conf:.0%} confidence"
    sgn = 1.0 if direction == "max" else -1.0
    best = max(cands, key=lambda i: (sgn * history[i].objectives[target], -i))
    v = history[best].objectives[target]
    why = f"best {target} ({v:.4g}) among {len(cands)} of {len(status)} feasible configs"
    if cons:
        why += f" meeting {cons_txt} (one-sided {conf:.0%} bound)"
    others = sorted((sgn * history[i].objectives[target] for i in cands if i != best), reverse=True)
    if others:
        why += f"; runner-up {sgn * others[0]:.4g} ({(sgn * v / others[0] - 1) * 100 if others[0] else 0:+.1f}%)"
    return best, why


def deliver(history: list[Observation], objectives: list[Objective], goal: dict | None = None, k: int = 5,
            knee_method: str = "emu") -> dict:
    """The delivery: up to ``k`` (3–5) Pareto configurations with their dominance rate and
    P(non-dominated), the knee (index and method) and the recommendation — JSON-able.

    Front members with P(non-dominated) < 0.5 are flagged ``likely_noise``: they neither define
    the knee nor take a place while real members are left. Of the rest, the extremes, the knee
    and the recommendation are kept first and the others chosen by expected marginal utility,
    up to ``k``; below 3, the likely-noise members and then the next non-dominated layer fill
    up to 3 (the latter marked ``"pareto": false``)."""
    k = max(1, int(k))
    dirs = [o.direction for o in objectives]
    names = [o.name for o in objectives]
    idx, M = objective_matrix(history, objectives)
    rec, why = recommend(history, objectives, goal)
    out: dict = {
        "objectives": [o.to_dict() for o in objectives],
        "n_evaluated": len(history),
        "n_feasible": len(idx),
        "front": [],
        "front_size": 0,
        "knee": None,
        "recommendation": {"index": rec, "why": why,
                           "config": history[rec].config if rec is not None else None,
                           "objectives": history[rec].objectives if rec is not None else None,
                           "trial_id": history[rec].trial_id if rec is not None else None},
        "definitions": {
            "dominance_rate": "share of the other feasible evaluated configurations this one dominates (aggregated means)",
            "p_nondominated": "probability of staying non-dominated when every mean is redrawn from the pooled repeat noise",
            "knee": KNEE_METHODS[knee_method],
        },
        "notes": ["re-confirm every delivered configuration against the kept baseline on fresh interleaved runs "
                  "with gate before calling it better (winner's curse)"],
    }
    if not idx:
        return jsonable(out)
    local_front = pareto_indices(M, dirs)
    front = [idx[j] for j in local_front]
    rates = dominance_rate(history, objectives)
    pnd = nondominated_probability(history, objectives)
    # members more likely than not to be noise artefacts neither define the knee nor take a place
    # among the delivered configurations while real members are left
    solid = [j for j in local_front if pnd.get(idx[j], 0.0) >= 0.5] or local_front
    kj, method = knee_point(M[solid], dirs, knee_method)
    knee = idx[solid[kj]]
    out["front_size"] = len(front)
    out["knee"] = {"index": knee, "method": method, "config": history[knee].config,
                   "objectives": history[knee].objectives, "trial_id": history[knee].trial_id}
    keep: list[int] = []
    for j in range(len(objectives)):  # the extremes
        col = M[solid][:, j] * (-1 if dirs[j] == "max" else 1)
        keep.append(idx[solid[int(np.argmin(col))]])
    keep += [knee] + ([rec] if rec in (idx[j] for j in solid) else [])
    emu = marginal_utilities(_normalised_front(M[solid], dirs)[1]) if len(solid) > 1 else np.ones(1)
    keep += [idx[solid[int(j)]] for j in np.argsort(-emu, kind="stable")]
    chosen: list[int] = []
    for i in keep:
        if i not in chosen:
            chosen.append(i)
    chosen = chosen[:k]
    fill = [i for i in front if i not in chosen and i not in (idx[j] for j in solid)][: max(0, 3 - len(chosen))]
    if len(chosen) + len(fill) < 3:
        rest = [j for j in range(len(idx)) if idx[j] not in front]
        while rest and len(chosen) + len(fill) < 3:
            layer = [rest[j] for j in pareto_indices(M[rest], dirs)]
            for j in layer[: 3 - len(chosen) - len(fill)]:
                fill.append(idx[j])
            rest = [j for j in rest if j not in layer]
    slo = slo_status(history, objectives, goal)
    items = []
    for i in chosen + fill:
        o = history[i]
        items.append({
            "index": i, "trial_id": o.trial_id, "step": o.step, "pareto": i in front,
            "config": o.config, "objectives": {n: o.objectives[n] for n in names},
            "dominance_rate": round(rates.get(i, 0.0), 4), "p_nondominated": round(pnd.get(i, 0.0), 4),
            "likely_noise": pnd.get(i, 0.0) < 0.5 and i in front,
            "meets_goal": slo.get(i, (False, ""))[0], "knee": i == knee, "recommended": i == rec,
        })
    first = objectives[0]
    items.sort(key=lambda it: (not it["pareto"], (-1 if first.direction == "max" else 1) * it["objectives"][first.name]))
    out["front"] = items
    return jsonable(out)
