"""``propose``: the next configuration to evaluate, for every search mode, and ``replay``.

Modes (every one deterministic given its inputs and seed; none re-proposes a configuration
already in the history; each returns None when it has nothing left or the budget is spent —
``budget`` counts every observation in the history):

- ``"bo"``: Bayesian optimisation. The first n₀ = max(4, budget // 4) proposals are the
  points of a scrambled Sobol sequence (``scipy.stats.qmc.Sobol``, seeded) snapped to the
  lattice. After that, every fifth proposal is drawn uniformly at random from the unevaluated
  lattice (seed 004 §8: keeps the surrogate from talking itself into a local optimum); the
  others maximise an acquisition over the lattice (enumerated when it has ≤ 20 000 points,
  else 2048 Sobol points plus the lattice neighbours of the five best observations):

  * GPs (:class:`vkit.search.gp.GP`) model the **log** of every objective and SLO metric on
    [0, 1]-encoded, log-scaled parameters (the noise becomes roughly homoscedastic);
  * one objective, an SLO, or four or five objectives (``acquisition="auto"``; at most five,
    seed 004 §10): constrained log-EI on the first maximised one, log EI(target; f* = best posterior mean among the configs that meet
    the SLO at the recommendation's one-sided confidence, i.e. the incumbent ``recommend``
    would keep) + Σ log Φ((log SLO − μ_c)/σ_c) (Gardner et al. 2014; Gelbart et al. 2014);
    before any config meets the SLO, the probability of meeting it alone;
  * two or three objectives and no SLO (``acquisition="auto"``), or ``"ehvi"``: exact EHVI on the
    (sign-adjusted) log objectives (closed form for two, the grid decomposition for three),
    front = posterior means of the measured non-dominated configs, reference = their nadir +
    10% of the range; SLOs and start-up failures multiply in as P(feasible), as above;
  * ``"ucb"``: GP-UCB on the first maximised objective, ``"ei"``: plain log-EI on it (the
    incumbent the best measured posterior mean, SLO or not), each + log P(feasible);
  * failures (start-up, invalid measurement) are learned by a least-squares GP classifier
    (Rasmussen & Williams 2006, §6.5) on labels 0 (started) / −2 (failed) with a zero prior
    mean: log Φ((m + 1)/s) is added to the acquisition, so the neighbourhood of a failure is
    avoided (m → −2) while an unexplored region keeps P(starts) ≈ 0.8 (m → 0).
- ``"random"``: uniform over the unevaluated lattice points.
- ``"grid"``: a full factorial with as many levels per numeric axis as the budget allows
  (levels spread evenly on each axis's scale, end points included; booleans and choices take
  all values), visited in a seeded random order so that stopping early still spreads out.
- ``"staged"``: :class:`vkit.search.staged.StagedPlan` (seed 000's steps 2–4).

Every proposal carries an audit: the sha256 of its inputs, the mode and phase, the seed,
whether it was random, the surrogate's hyperparameters, the acquisition value of the chosen
and the runner-up candidates, and the duration. :func:`replay` re-runs logged inputs.
"""

from __future__ import annotations

import math
import time
import warnings

import numpy as np
from scipy import special
from scipy.stats import qmc

from vkit.errors import UsageError
from vkit.search.front import DEFAULT_CONFIDENCE, slo_status
from vkit.search.gp import GP, Prior, ehvi, ehvi_2d, log_ei
from vkit.search.space import (
    MAX_ENUMERATE,
    Param,
    config_of,
    encode,
    from_units,
    key_of,
    lattice,
    lattice_size,
    param_from_dict,
)
from vkit.search.staged import StagedPlan
from vkit.search.types import Objective, Observation, Proposal, digest, history_from, jsonable, objectives_from

MODES = ("bo", "random", "grid", "staged")
ACQUISITIONS = ("auto", "cei", "ehvi", "ei", "ucb")
MAX_OBJECTIVES = 5  # seed 004 §10: beyond five the front is mostly ties and no one can read it
UCB_DELTA = 0.1  # GP-UCB's confidence parameter (Srinivas et al. 2010, theorem 1)
VERSION = "vkit.search/1"
RANDOM_EVERY = 5


def n_initial(budget: int) -> int:
    """Size of the Sobol start: max(4, budget // 4) (STATS.md: the recipe that worked)."""
    return max(4, int(budget) // 4)


def propose(mode: str, space: list[Param], history: list[Observation], base_config: dict, objectives: list[Objective],
            slo: dict | None, budget: int, seed: int, **options) -> Proposal | None:
    """The next configuration to evaluate (module docstring), or None when there is none.

    ``options``: ``n_init`` (bo; default :func:`n_initial`), ``random_every`` (bo; default 5, 0
    for never), ``acquisition`` (bo: one of :data:`ACQUISITIONS`), and for staged the
    :class:`StagedPlan` keywords (``gain_threshold``, ``steps``, ``safe_seqs``)."""
    t0 = time.perf_counter()
    if mode not in MODES:
        raise UsageError(f"search mode {mode!r} is not one of {', '.join(MODES)}")
    space = [p if isinstance(p, Param) else param_from_dict(p) for p in space]
    history = history_from(history)
    objectives = objectives_from(objectives)
    if not space:
        raise UsageError("the search space is empty: every parameter is frozen or none was named")
    if len(objectives) > MAX_OBJECTIVES:
        raise UsageError(f"{len(objectives)} objectives: at most {MAX_OBJECTIVES} (seed 004 §10); "
                         f"measure the others as guards or in the report")
    inputs = {"version": VERSION, "mode": mode, "space": [p.to_dict() for p in space],
              "history": [o.to_dict() for o in history], "base_config": base_config,
              "objectives": [o.to_dict() for o in objectives], "slo": slo, "budget": budget, "seed": seed,
              "options": options}
    dig = digest(inputs)
    if len(history) >= budget:
        return None
    if mode == "staged":
        prop = StagedPlan(space, base_config, objectives, slo, **options).next(history)
        extra = {}
    else:
        usable = [o for o in history if _same_rest(o.config, base_config, space)]
        evaluated = {key_of(o.config, space) for o in usable}
        if mode == "random":
            prop, extra = _random(space, evaluated, base_config, seed, len(history), "random")
        elif mode == "grid":
            prop, extra = _grid(space, evaluated, base_config, seed, budget)
        else:
            prop, extra = _bo(space, usable, evaluated, base_config, objectives, slo or {}, budget, seed,
                              len(history), **options)
    if prop is None:
        return None
    prop.audit.update(extra)
    prop.audit.update({"version": VERSION, "mode": mode, "seed": seed, "inputs_digest": dig, "n_history": len(history),
                       "budget": budget, "duration_s": round(time.perf_counter() - t0, 4)})
    prop.audit = jsonable(prop.audit)
    return prop


LIES = ("kb", "cl-best", "cl-worst", "cl-mean")


def batch_lies(space: list[Param], history: list[Observation], base_config: dict, objectives: list[Objective],
               slo: dict | None, seed: int, pending: list[dict], kind: str = "kb") -> list[Observation]:
    """Batch proposals of ``bo``: the configurations proposed but not yet measured (``pending``), as
    observations ``propose`` reads as measured, so that the next proposal of the same batch goes
    elsewhere. ``kb`` (Kriging believer, the default): each objective and SLO metric at the surrogate's
    posterior median there (conditioning on it leaves the surrogate's mean unchanged, so the believed
    values of a whole batch are taken at once); the constant liars put every pending point at one
    observed value: ``cl-best`` (the best so far: batches cluster), ``cl-worst`` (the worst: they
    spread out), ``cl-mean`` (the geometric mean). With fewer than two usable observations (the Sobol
    start) there is no surrogate and ``kb`` lies as ``cl-mean``. Step ``pending``, never recorded."""
    if kind not in LIES:
        raise UsageError(f"batch lie {kind!r} is not one of {', '.join(LIES)}")
    if not pending:
        return []
    space = [p if isinstance(p, Param) else param_from_dict(p) for p in space]
    history, objectives = history_from(history), objectives_from(objectives)
    slo = slo or {}
    usable = [o for o in history if _same_rest(o.config, base_config, space)]
    ok = [o for o in usable if o.feasible and all(_pos(o.objectives.get(ob.name)) for ob in objectives)]
    names = [ob.name for ob in objectives] + [m for m in sorted(slo) if m not in {ob.name for ob in objectives}]
    sign = {ob.name: (1.0 if ob.direction == "max" else -1.0) for ob in objectives}
    values: list[dict] = [{} for _ in pending]
    if kind == "kb" and len(ok) >= 2:
        _, gps, slo_gps, _ = _surrogates(space, usable, ok, objectives, slo, seed)
        C = encode([dict(base_config, **c) for c in pending], space)
        for m in names:
            gp = gps.get(m) or slo_gps.get(m)
            if gp is not None:
                mu, _ = gp.predict(C)
                for i, v in enumerate(mu):
                    values[i][m] = float(math.exp(v))
    for m in names:
        seen = [o.objectives[m] for o in ok if _pos(o.objectives.get(m))]
        if not seen:
            continue
        s_ = sign.get(m, -1.0)  # an SLO metric: lower is better
        lie = {"cl-best": max(seen, key=lambda v: s_ * v), "cl-worst": min(seen, key=lambda v: s_ * v)}.get(
            kind, float(np.exp(np.mean(np.log(seen)))))
        for row in values:
            row.setdefault(m, lie)
    return [Observation(config=dict(c), objectives=v, repeats=[], feasible=len([ob for ob in objectives if ob.name in v]) == len(objectives),
                        slo_ok=None, step="pending", trial_id=f"pending-{i}") for i, (c, v) in enumerate(zip(pending, values, strict=True))]


def _same_rest(config: dict, base: dict, space: list[Param]) -> bool:
    names = {p.name for p in space}
    return all(config.get(k, v) == v for k, v in base.items() if k not in names)


# -- random and grid ---------------------------------------------------------
def _unevaluated_random(space, evaluated, rng) -> tuple | None:
    if lattice_size(space) <= MAX_ENUMERATE:
        free = [v for v in lattice(space) if v not in evaluated]
        return free[int(rng.integers(len(free)))] if free else None
    for _ in range(10000):
        v = from_units(rng.random(len(space)), space)
        if v not in evaluated:
            return v
    return None


def _random(space, evaluated, base, seed, n_hist, step):
    rng = np.random.default_rng([int(seed), n_hist, 11])
    v = _unevaluated_random(space, evaluated, rng)
    if v is None:
        return None, {}
    return Proposal(config=config_of(v, space, base), step=step,
                    reason="uniformly random point of the unevaluated lattice",
                    audit={"phase": "random", "random": True}), {}


def grid_levels(space: list[Param], budget: int) -> list[list]:
    """Levels per parameter for grid mode: booleans and choices take all values; numeric axes
    share what the budget leaves, adding a level to the axis with the fewest while the full
    factorial still fits (each axis at least 2 levels, at most its lattice)."""
    fixed = 1
    for p in space:
        if p.kind in ("bool", "choice"):
            fixed *= len(p.levels())
    num = [i for i, p in enumerate(space) if p.kind in ("int", "float")]
    counts = {i: min(2, len(space[i].levels())) for i in num}
    while True:
        order = sorted((counts[i], i) for i in num if counts[i] < len(space[i].levels()))
        grown = False
        for _, i in order:
            trial = dict(counts)
            trial[i] += 1
            if fixed * math.prod(trial.values()) <= budget:
                counts = trial
                grown = True
                break
        if not grown:
            break
    out = []
    for i, p in enumerate(space):
        if p.kind in ("bool", "choice"):
            out.append(p.levels())
        else:
            m = counts[i]
            vals = []
            for u in np.linspace(0.0, 1.0, m):
                v = p.from_unit(float(u))
                if v not in vals:
                    vals.append(v)
            out.append(vals)
    return out


def _grid(space, evaluated, base, seed, budget):
    levels = grid_levels(space, budget)
    idx = np.indices([len(lv) for lv in levels]).reshape(len(levels), -1).T
    pts = [tuple(levels[j][i] for j, i in enumerate(row)) for row in idx]
    order = np.random.default_rng([int(seed), 13]).permutation(len(pts))
    for n, j in enumerate(order):
        if pts[j] not in evaluated:
            return Proposal(config=config_of(pts[j], space, base), step="grid",
                            reason=f"grid point {n + 1} of {len(pts)} ({' x '.join(str(len(lv)) for lv in levels)})",
                            audit={"phase": "grid", "random": False, "grid_shape": [len(lv) for lv in levels]}), {}
    return None, {}


# -- Bayesian optimisation ---------------------------------------------------
def _sobol_point(space, evaluated, seed, n_hist):
    d = len(space)
    m = max(5, math.ceil(math.log2(n_hist + 16)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pts = qmc.Sobol(d=d, scramble=True, seed=np.random.default_rng([int(seed), 17])).random_base2(m)
    seen = set(evaluated)
    for j, u in enumerate(pts):
        v = from_units(u, space)
        if v not in seen:
            return v, j
        seen.add(v)
    return None, None


def _dim_names(space: list[Param]) -> list[str]:
    out = []
    for p in space:
        if p.width() == 1:
            out.append(p.name)
        else:
            out += [f"{p.name}={c}" for c in p.choices]
    return out


def _candidates(space, usable, evaluated, seed, scores) -> list[tuple]:
    if lattice_size(space) <= MAX_ENUMERATE:
        return [v for v in lattice(space) if v not in evaluated]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pts = qmc.Sobol(d=len(space), scramble=True, seed=np.random.default_rng([int(seed), 19])).random_base2(11)
    cands = {from_units(u, space) for u in pts}
    top = [usable[i] for i in np.argsort(-np.asarray(scores), kind="stable")[:5]] if len(scores) else []
    for o in top:
        k = key_of(o.config, space)
        for j, p in enumerate(space):
            lv = p.levels()
            if k[j] in lv:
                pos = lv.index(k[j])
                for q in (pos - 1, pos + 1):
                    if 0 <= q < len(lv):
                        cands.add(k[:j] + (lv[q],) + k[j + 1:])
    return sorted((c for c in cands if c not in evaluated), key=repr)


def _fit(X, y, seed, prior=None, standardize=True) -> GP:
    return GP(prior=prior or Prior(), standardize=standardize).fit(X, y, seed=seed, restarts=2)


def _bo(space, usable, evaluated, base, objectives, slo, budget, seed, n_hist, n_init=None, random_every=RANDOM_EVERY,
        acquisition="auto", confidence=DEFAULT_CONFIDENCE):
    if acquisition not in ACQUISITIONS:
        raise UsageError(f"acquisition {acquisition!r} is not one of {', '.join(ACQUISITIONS)}")
    n0 = n_init if n_init is not None else n_initial(budget)
    opts = {"n_init": n0, "random_every": random_every, "acquisition": acquisition, "confidence": confidence}
    if n_hist < n0:
        v, j = _sobol_point(space, evaluated, seed, n_hist)
        if v is None:
            return _random(space, evaluated, base, seed, n_hist, "bo")[0], {"options": opts}
        return Proposal(config=config_of(v, space, base), step="bo",
                        reason=f"Sobol start point {n_hist + 1} of {n0} (sequence index {j})",
                        audit={"phase": "sobol", "random": False, "sobol_index": j}), {"options": opts}
    k = n_hist - n0
    if random_every and k % random_every == random_every - 1:
        prop, _ = _random(space, evaluated, base, seed, n_hist, "random")
        if prop is not None:
            prop.reason = f"every {random_every}th proposal after the start is uniformly random (seed 004 §8)"
        return prop, {"options": opts}
    return _acquire(space, usable, evaluated, base, objectives, slo, seed, n_hist, acquisition, confidence, opts)


def _acquire(space, usable, evaluated, base, objectives, slo, seed, n_hist, acquisition, confidence, opts):
    ok = [o for o in usable if o.feasible and all(_pos(o.objectives.get(ob.name)) for ob in objectives)]
    if len(ok) < 2:
        prop, _ = _random(space, evaluated, base, seed, n_hist, "random")
        if prop is not None:
            prop.reason = f"only {len(ok)} usable observation(s): too few for a surrogate, random point"
        return prop, {"options": opts}
    X, gps, slo_gps, clf = _surrogates(space, usable, ok, objectives, slo, seed)
    first = objectives[0]
    scores = np.array([(1 if first.direction == "max" else -1) * math.log(o.objectives[first.name]) for o in ok])
    cands = _candidates(space, usable, evaluated, seed, scores)
    if not cands:
        return None, {}
    C = encode([config_of(v, space, base) for v in cands], space)
    log_pof, pof_parts = _log_pof(C, slo, slo_gps, clf)
    # auto: EHVI for two or three objectives without an SLO; with one, constrained EI (bench_tuner:
    # 7.0 median restarts to 98 % of the constrained optimum against EHVI's 13.25)
    use_ehvi = acquisition == "ehvi" or (acquisition == "auto" and len(objectives) in (2, 3) and not slo)
    if use_ehvi and len(objectives) not in (2, 3):
        raise UsageError("EHVI needs two or three objectives; use acquisition 'cei', 'ei' or 'ucb' for one or more than three")
    suffix = "+log_pof" if slo or clf is not None else ""
    if use_ehvi:
        acq, name, info = _ehvi_acquisition(gps, objectives, C, X, log_pof, suffix)
    elif acquisition == "ucb":
        acq, name, info = _ucb_acquisition(gps, objectives, C, log_pof, len(usable), suffix)
    elif acquisition == "ei":
        acq, name, info = _ei_acquisition(gps, objectives, C, X, log_pof, suffix)
    else:
        acq, name, info = _cei_acquisition(gps, objectives, ok, C, X, log_pof, slo, confidence, suffix)
    order = np.argsort(-acq, kind="stable")
    ch, ru = int(order[0]), (int(order[1]) if len(order) > 1 else None)
    chosen = config_of(cands[ch], space, base)
    pred = {}
    for ob in objectives:
        mu, var = gps[ob.name].predict(C[ch:ch + 1])
        pred[ob.name] = {"median": float(math.exp(mu[0])), "log_sd": float(math.sqrt(var[0]))}
    names = _dim_names(space)
    surrogate = {ob.name: gps[ob.name].summary(names) for ob in objectives}
    for metric, gp in slo_gps.items():
        if metric not in surrogate:
            surrogate[metric] = gp.summary(names)
    if clf is not None:
        surrogate["startup_classifier"] = clf.summary(names)
    audit = {
        "phase": "acquisition", "random": False,
        "surrogate": surrogate,
        "acquisition": {
            "name": name, "n_candidates": len(cands), **info,
            "chosen": float(acq[ch]),
            "chosen_log_pof": {k_: float(v_[ch]) for k_, v_ in pof_parts.items()},
            "runner_up": None if ru is None else {"config": {p.name: cands[ru][j] for j, p in enumerate(space)},
                                                  "value": float(acq[ru])},
        },
        "predicted": pred,
    }
    what = ", ".join(f"{k_} ~{v_['median']:.4g}" for k_, v_ in pred.items())
    reason = f"max {name} over {len(cands)} unevaluated lattice points (predicted {what})"
    return Proposal(config=chosen, step="bo", reason=reason, audit=audit), {"options": opts}


def _surrogates(space, usable, ok, objectives, slo, seed) -> tuple[np.ndarray, dict[str, GP], dict[str, GP], GP | None]:
    """The encoded usable observations, a GP per objective and per SLO metric (on logs), and the
    start-up classifier (None when nothing failed)."""
    X_all = encode([o.config for o in usable], space)
    X = encode([o.config for o in ok], space)
    gps: dict[str, GP] = {}
    for j, ob in enumerate(objectives):
        gps[ob.name] = _fit(X, np.log([o.objectives[ob.name] for o in ok]), seed + 101 * j)
    slo_gps: dict[str, GP] = {}
    for j, (metric, _) in enumerate(sorted(slo.items())):
        if metric in gps:
            slo_gps[metric] = gps[metric]
        else:
            rows = [o for o in ok if _pos(o.objectives.get(metric))]
            if len(rows) >= 2:
                slo_gps[metric] = _fit(encode([o.config for o in rows], space),
                                       np.log([o.objectives[metric] for o in rows]), seed + 997 + j)
    labels = np.array([0.0 if (o.feasible and all(_pos(o.objectives.get(ob.name)) for ob in objectives)) else -2.0
                       for o in usable])
    clf = None
    if (labels < 0).any():
        clf = _fit(X_all, labels, seed + 7, prior=Prior(log_sn2_mean=math.log(0.1), log_sn2_sd=1.0), standardize=False)
    return X, gps, slo_gps, clf


def _log_pof(C, slo, slo_gps, clf) -> tuple[np.ndarray, dict]:
    """log P(feasible) of each candidate: Σ log Φ over the SLOs, plus log P(starts); and its parts."""
    log_pof = np.zeros(len(C))
    pof_parts = {}
    for metric, gp in slo_gps.items():
        mu_c, var_c = gp.predict(C)
        part = special.log_ndtr((math.log(float(slo[metric])) - mu_c) / np.sqrt(var_c))
        log_pof += part
        pof_parts[metric] = part
    if clf is not None:
        m, v = clf.predict(C)
        part = special.log_ndtr((m + 1.0) / np.sqrt(v + clf.sn2))
        log_pof += part
        pof_parts["startup"] = part
    return log_pof, pof_parts


def _ehvi_acquisition(gps, objectives, C, X, log_pof, suffix) -> tuple[np.ndarray, str, dict]:
    """log EHVI (two objectives, sign-adjusted logs) + log P(feasible)."""
    mus, sds, obs_mu = [], [], []
    for ob in objectives:
        mu, var = gps[ob.name].predict(C)
        sgn = 1.0 if ob.direction == "min" else -1.0
        mus.append(sgn * mu)
        sds.append(np.sqrt(var))
        obs_mu.append(sgn * gps[ob.name].predict(X)[0])
    MU, SD, F = np.stack(mus, 1), np.stack(sds, 1), np.stack(obs_mu, 1)
    nd = _nondominated(F)
    span = np.maximum(F.max(0) - F.min(0), 1e-3)
    ref = F.max(0) + 0.1 * span
    val = ehvi_2d(F[nd], ref, MU, SD) if len(objectives) == 2 else ehvi(F[nd], ref, MU, SD)
    acq = np.log(np.maximum(val, 1e-300)) + log_pof
    return acq, "ehvi" + suffix, {"ref": ref.tolist(), "front_size": int(nd.sum()), "objectives": len(objectives)}


def _target(gps, objectives, C) -> tuple[Objective, np.ndarray, np.ndarray]:
    """The first maximised objective (else the first), and its sign-adjusted log posterior at ``C``."""
    target = next((ob for ob in objectives if ob.direction == "max"), objectives[0])
    sgn = 1.0 if target.direction == "max" else -1.0
    mu, var = gps[target.name].predict(C)
    return target, sgn * mu, np.sqrt(var)


def _ucb_acquisition(gps, objectives, C, log_pof, t, suffix) -> tuple[np.ndarray, str, dict]:
    """GP-UCB on the first maximised objective's log, μ + √β·σ with β = 2 log(|C| t² π² / 6δ)
    (Srinivas et al. 2010; t the observations so far, δ = 0.1), + log P(feasible): the bound's
    objective times the probability that the point starts and meets the SLO."""
    target, mu, sd = _target(gps, objectives, C)
    beta = 2.0 * math.log(max(len(C), 1) * max(t, 1) ** 2 * math.pi ** 2 / (6.0 * UCB_DELTA))
    acq = mu + math.sqrt(beta) * sd + log_pof
    return acq, "ucb" + suffix, {"beta": beta, "target": target.name}


def _ei_acquisition(gps, objectives, C, X, log_pof, suffix) -> tuple[np.ndarray, str, dict]:
    """Plain log-EI on the first maximised objective over the best posterior mean measured (the
    SLO does not choose the incumbent, unlike ``cei``), + log P(feasible)."""
    target, mu, sd = _target(gps, objectives, C)
    sgn = 1.0 if target.direction == "max" else -1.0
    f_star = float((sgn * gps[target.name].predict(X)[0]).max())
    return log_ei(mu, sd, f_star) + log_pof, "log_ei" + suffix, {"f_star": f_star, "target": target.name}


def _cei_acquisition(gps, objectives, ok, C, X, log_pof, slo, confidence, suffix) -> tuple[np.ndarray, str, dict]:
    """Constrained log-EI on the first maximised objective; before any config meets the SLO,
    log P(feasible) alone."""
    target = next((ob for ob in objectives if ob.direction == "max"), objectives[0])
    sgn = 1.0 if target.direction == "max" else -1.0
    gp = gps[target.name]
    mu, var = gp.predict(C)
    mu, sd = sgn * mu, np.sqrt(var)
    mu_obs = sgn * gp.predict(X)[0]
    # the incumbent is what recommend() would keep now: SLO met at the same one-sided confidence
    status = slo_status(ok, objectives, {"subject_to": slo, "confidence": confidence})
    meets = np.array([status.get(i, (False, ""))[0] for i in range(len(ok))])
    if meets.any():
        f_star = float(mu_obs[meets].max())
        acq = log_ei(mu, sd, f_star) + log_pof
        info = {"f_star": f_star, "f_star_is": f"best posterior mean of log {target.name} among configs meeting "
                                               f"the SLO at {confidence:.0%} confidence"}
        return acq, "log_ei" + suffix, info
    # nothing meets the SLO yet: find the feasible region first, best predicted target as tie-break
    acq = log_pof + 1e-6 * (mu - mu.mean()) / (mu.std() + 1e-12)
    return acq, "log_pof (no config meets the SLO yet)", {}


def _pos(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _nondominated(F: np.ndarray) -> np.ndarray:
    le = (F[:, None, :] <= F[None, :, :]).all(-1)
    lt = (F[:, None, :] < F[None, :, :]).any(-1)
    return ~(le & lt).any(0)


# -- audit and replay --------------------------------------------------------
def log_record(mode: str, space: list[Param], history: list[Observation], base_config: dict,
               objectives: list[Objective], slo: dict | None, budget: int, seed: int, proposal: Proposal | None,
               **options) -> dict:
    """A JSON-able decision-log record: the inputs of one ``propose`` call and its answer."""
    return jsonable({
        "version": VERSION, "mode": mode, "space": [p.to_dict() if isinstance(p, Param) else p for p in space],
        "history": [o.to_dict() if isinstance(o, Observation) else o for o in history],
        "base_config": base_config, "objectives": [o.to_dict() if isinstance(o, Objective) else o for o in objectives],
        "slo": slo, "budget": budget, "seed": seed, "options": options,
        "proposal": proposal.to_dict() if proposal is not None else None,
    })


def replay(log_records: list[dict]) -> list[Proposal | None]:
    """Re-run ``propose`` from each logged record's inputs (see :func:`log_record`) and return
    the proposals, in order, for the runner to compare with the logged ones."""
    out = []
    for r in log_records:
        out.append(propose(r["mode"], [param_from_dict(p) for p in r["space"]], history_from(r["history"]),
                           r["base_config"], objectives_from(r["objectives"]), r.get("slo"), r["budget"], r["seed"],
                           **(r.get("options") or {})))
    return out


def replay_mismatches(log_records: list[dict]) -> list[dict]:
    """The records whose replayed proposal differs from the logged one (config, step or the
    inputs digest); an empty list means the log replays exactly."""
    bad = []
    for n, (r, p) in enumerate(zip(log_records, replay(log_records), strict=True)):
        want = r.get("proposal")
        got = p.to_dict() if p is not None else None
        same = (want is None and got is None) or (
            want is not None and got is not None and jsonable(want["config"]) == jsonable(got["config"])
            and str(want["step"]) == str(got["step"])
            and want.get("audit", {}).get("inputs_digest") == got["audit"].get("inputs_digest"))
        if not same:
            bad.append({"record": n, "logged": want and {"config": want["config"], "step": want["step"]},
                        "replayed": got and {"config": got["config"], "step": got["step"]}})
    return bad
