"""Per-metric analysis of gate (``analyze_metric``): on logs, the effect, its interval, the p-
or e-value, the threshold t = max(2σ_baseline, floor), σ, runs needed vs had, and the
metric's decision with a sentence saying why."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vkit.decide import stats as st
from vkit.decide.rule import (
    MAX_PROJECT,
    MIN_FIXED_RUNS,
    Boundaries,
    call_guard,
    call_primary,
    n_needed,
    seq_bounds,
    threshold_log,
    tolerance_log,
)
from vkit.decide.runs import Run, metric_logs
from vkit.decide.specs import UNDECIDED, MetricSpec, Settings


@dataclass
class Context:
    settings: Settings
    bnd: Boundaries
    base: list[Run]
    cand: list[Run]  # the evidence: fresh runs when any are fresh
    pairs: list[tuple[int, int]]
    layout: str
    sigma_pool: dict = field(default_factory=dict)
    # σ of one run for the threshold max(2σ, floor) where it differs from the test's σ (a tune's
    # evidence clusters runs on server processes: the test needs the clustered σ, the practical bar
    # the noise of one measurement of a configuration); absent, the test's σ
    sigma_threshold: dict = field(default_factory=dict)


def _pct(x: float | None, signed: bool = True) -> str:
    if x is None or not math.isfinite(x):
        return "n/a" if x is None or math.isnan(x) else ("+inf" if x > 0 else "-inf")
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def _rel(g: float) -> float:
    return math.expm1(g) if math.isfinite(g) else g


def _change_bounds(direction: int, lo: float, hi: float) -> list[float | None]:
    """Relative change c/b − 1 bounds from bounds on g = direction·log(c/b)."""
    a, b = (lo, hi) if direction > 0 else (-hi, -lo)
    return [_finite(_rel(a)), _finite(_rel(b))]


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _project(bnd: Boundaries, k: int, est: float, sd: float, sigma_d: float | None, target: float, ok_above: bool,
             n_need: int, sequential: bool, alpha: float) -> int | None:
    """Smallest number of pairs k' > k at which, if the current estimate and spread held, the
    sequential rule would decide the component; None beyond MAX_PROJECT."""
    ks = np.arange(max(k + 1, 2), MAX_PROJECT + 1)
    if len(ks) == 0 or not math.isfinite(est):
        return None
    spread = sd if sigma_d is None else sigma_d
    if not (spread > 0):
        return None
    lo, _hi, hf, hc = seq_bounds(bnd, ks, est, spread if sigma_d is None else np.nan, sigma_d)
    if ok_above:  # heading for "improves"/"ok": lower bound above target
        hit = lo > target
    else:  # heading for "not enough"/"worse"
        hit = (hf < target) | ((ks >= n_need) & (hc < target))
    idx = np.flatnonzero(hit)
    return int(ks[idx[0]]) if len(idx) else None


@dataclass
class _Test:
    """One metric's test on g: the estimate of its mean, the efficacy bounds (``lo``, ``hi``),
    the futility and classical upper bounds (``hf``, ``hc``), the spread ``sd``, the known σ of
    a pair difference (``sigma_d``, None when estimated) and the pairs or runs per arm it rests on."""

    est: float
    lo: float
    hi: float
    hf: float
    hc: float
    sd: float
    sigma_d: float | None
    n_had: int


def analyze_metric(ctx: Context, spec: MetricSpec) -> dict:
    s = ctx.settings
    b, c = metric_logs(ctx.base, spec.name), metric_logs(ctx.cand, spec.name)
    nb, nc = len(b), len(c)
    sigma_now = float(np.std(b, ddof=1)) if nb >= 2 else math.nan
    pool = ctx.sigma_pool.get(spec.name)
    known = pool is not None
    sigma_t = pool if known else sigma_now
    res: dict[str, Any] = {
        "metric": spec.name,
        "role": spec.role,
        "direction": spec.sign,
        "baseline_gmean": float(math.exp(b.mean())) if nb else None,
        "candidate_gmean": float(math.exp(c.mean())) if nc else None,
        "sigma": _finite(sigma_t) if sigma_t == sigma_t else None,
        "sigma_source": "pooled (earlier A/A runs)" if known else "baseline runs",
        "sigma_baseline_runs": _finite(sigma_now) if nb >= 2 else None,
        "n_had": {"baseline": nb, "candidate": nc, "pairs": len(ctx.pairs)},
    }
    sigma_thr = ctx.sigma_threshold.get(spec.name) if known else None
    if isinstance(sigma_thr, (int, float)) and 0 < sigma_thr < 1:
        res["threshold_sigma"] = _finite(sigma_thr)
    else:
        sigma_thr = sigma_t
    t, target = _threshold(spec, sigma_thr, s, res)
    sb = b * spec.direction
    sc = c * spec.direction
    paired_fixed = ctx.layout == "interleaved" and nb == nc
    if s.sequential:
        tst = _sequential_test(ctx, sb, sc, pool, sigma_now, res)
    else:
        tst = _fixed_test(ctx, sb, sc, paired_fixed, res)
    est = tst.est
    res["estimate_log"] = _finite(est) if est == est else None
    raw = est * spec.direction
    res["change"] = _finite(_rel(raw)) if raw == raw else None
    res["interval"] = _change_bounds(spec.direction, tst.lo, tst.hi)
    res["interval_level"] = f"one-sided {1 - s.alpha:.0%} bounds (jointly {1 - 2 * s.alpha:.0%})"
    res["improvement"] = _finite(_rel(est) if spec.direction > 0 else -math.expm1(-est)) if est == est else None
    if target is None or not math.isfinite(sigma_t):
        res.update({"n_needed": None, "n_needed_normal": None, "decision": UNDECIDED, "more_runs": max(2 - nb, 2 - nc, 1),
                    "why": f"{spec.name}: σ needs at least 2 baseline runs (or a pooled σ)"})
        return res
    paired_analysis = s.sequential or paired_fixed
    if sigma_t > 0:
        need, need_normal = n_needed(sigma_t, abs(target), s, known, paired_analysis)
    else:
        need, need_normal = 2, 2
    res["n_needed"], res["n_needed_normal"] = need, need_normal
    if spec.role == "report":
        res["decision"] = None
        return res
    if not s.sequential:
        # A fixed design decides once, at its planned n (never fewer than MIN_FIXED_RUNS per arm).
        need = max(need, MIN_FIXED_RUNS)
        res["n_needed"] = need
    code = _call(spec, tst, need, target, s)
    res["decision"] = _decision_name(spec.role, code)
    res["why"] = _why(spec, res, code, t, tst.n_had, need, s)
    if code == 0:
        res["more_runs"], res["more_runs_capped"] = _more_runs(ctx.bnd, spec, tst, target, need, s)
    else:
        res["more_runs"] = 0
    return res


def threshold_of(spec: MetricSpec, sigma_t: float, s: Settings) -> tuple[float | None, float | None]:
    """Threshold (primary) or tolerance (guards, report): max(2σ, floor) unless given, at most 0.99;
    and the log-scale g it means (None when there is none)."""
    t = spec.tolerance
    if t is None and math.isfinite(sigma_t):
        t = max(2 * sigma_t, s.floor)
    if t is not None and t >= 1:
        t = 0.99
    target = None
    if t is not None and t > 0:
        target = threshold_log(t, spec.direction) if spec.role == "primary" else tolerance_log(t, spec.direction)
    return t, target


def _threshold(spec: MetricSpec, sigma_t: float, s: Settings, res: dict) -> tuple[float | None, float | None]:
    """``threshold_of``, with both rules recorded in ``res``."""
    t, target = threshold_of(spec, sigma_t, s)
    res["threshold"] = t
    res["threshold_rule"] = "given" if spec.tolerance is not None else ("max(2σ, floor)" if t is not None else None)
    return t, target


def _sequential_test(ctx: Context, sb: np.ndarray, sc: np.ndarray, pool: float | None, sigma_now: float, res: dict) -> _Test:
    """The confidence sequences on the pair differences, and the e-value (recorded in ``res``)."""
    bnd = ctx.bnd
    known = pool is not None
    k = len(ctx.pairs)
    g = np.array([sc[j] - sb[i] for i, j in ctx.pairs]) if k else np.array([])
    est = float(g.mean()) if k else math.nan
    sd = float(g.std(ddof=1)) if k >= 2 else math.nan
    sigma_d = None
    if known:
        sigma_d = math.sqrt(2) * max(pool, sigma_now if math.isfinite(sigma_now) else 0.0)
        method = "normal-mixture confidence sequence (σ pooled)"
    else:
        method = "t-mixture confidence sequence"
    if k >= 1 and (known or k >= 2):
        lo, hi, hf, hc = (float(x) for x in seq_bounds(bnd, k, est, sd, sigma_d))
    else:
        lo, hi, hf, hc = -math.inf, math.inf, math.inf, math.inf
    if k >= 1 and known:
        log_e = float(bnd.eff_n.log_e_two_sided(g.sum() * 1.0, k, sigma_d))
    elif k >= 2:
        log_e = float(bnd.eff_t.log_e_two_sided(g.sum(), float((g * g).sum()), k))
    else:
        log_e = 0.0
    e_val = math.exp(min(log_e, 700.0))
    p_val = min(1.0, 1.0 / e_val)
    res.update({"method": method, "e_value": e_val, "p_value": p_val, "p_value_kind": "anytime-valid (1/e)"})
    return _Test(est, lo, hi, hf, hc, sd, sigma_d, k)


def _fixed_test(ctx: Context, sb: np.ndarray, sc: np.ndarray, paired_fixed: bool, res: dict) -> _Test:
    """Welch's or the paired t-test (``--fixed``), its p-values recorded in ``res``."""
    s = ctx.settings
    nb, nc = len(sb), len(sc)
    k = min(nb, nc)
    if paired_fixed:
        order_b = [i for i, _ in ctx.pairs]
        order_c = [j for _, j in ctx.pairs]
        ft = st.fixed_test(sc[order_c], sb[order_b], s.alpha, paired=True)
    else:
        ft = st.fixed_test(sc, sb, s.alpha, paired=False)
    if ft is None:
        est, lo, hi, p_val = (float(sc.mean() - sb.mean()) if nb and nc else math.nan), -math.inf, math.inf, math.nan
        method = "paired t" if paired_fixed else "Welch t"
        p_two = math.nan
    else:
        est, lo, hi, p_val, method, p_two = ft.estimate, ft.lower, ft.upper, ft.p_greater, ft.method, ft.p_two_sided
    if paired_fixed and k >= 2:
        sd = float(np.std(sc[[j for _, j in ctx.pairs]] - sb[[i for i, _ in ctx.pairs]], ddof=1))
    elif nb >= 2 and nc >= 2:
        sd = math.sqrt(float(np.var(sb, ddof=1) + np.var(sc, ddof=1)))
    else:
        sd = math.nan
    res.update({"method": method, "p_value": p_val, "p_value_two_sided": p_two, "p_value_kind": "one-sided, fixed n"})
    return _Test(est, lo, hi, hi, hi, sd, None, k)


def _call(spec: MetricSpec, tst: _Test, need: int, target: float, s: Settings) -> int:
    """+1 (improves / ok), −1 (not enough / worse) or 0 (undecided); a fixed design decides only at its n."""
    est = tst.est
    if spec.role == "primary":
        code = int(call_primary(est, tst.lo, tst.hf, tst.hc, tst.n_had, need, target)) if est == est else 0
    else:
        code = int(call_guard(tst.lo, tst.hf, tst.hc, tst.n_had, need, target)) if est == est else 0
    if not s.sequential:
        code = 0 if tst.n_had < need else (1 if code == 1 else -1)
    return code


def _more_runs(bnd: Boundaries, spec: MetricSpec, tst: _Test, target: float, need: int, s: Settings) -> tuple[int, bool]:
    """How many more runs an undecided metric needs, and whether that is a floor (the projection
    found no decision within MAX_PROJECT pairs)."""
    est, n_had = tst.est, tst.n_had
    if not s.sequential:  # a fixed design runs to its planned n
        kk = need
    else:
        ok_above = (est >= target) if est == est else True
        kk = _project(bnd, n_had, est, tst.sd, tst.sigma_d, (0.0 if spec.role == "primary" else target) if ok_above else target,
                      ok_above, need, True, s.alpha)
    more = max(1, (kk - n_had) if kk is not None else need - n_had)
    if n_had < 2:
        more = max(more, 2 - n_had)
    return more, kk is None


def _decision_name(role: str, code: int) -> str:
    if role == "primary":
        return {1: "improves", -1: "not_enough", 0: UNDECIDED}[code]
    return {1: "ok", -1: "worse", 0: UNDECIDED}[code]


def _why(spec: MetricSpec, r: dict, code: int, t: float, n_had: int, need: int, s: Settings) -> str:
    lo, hi = r["interval"]
    ch = f"{spec.name} {_pct(r['change'])} [{_pct(lo)}, {_pct(hi)}]"
    kind = "always-valid" if s.sequential else "one-sided"
    if spec.role == "primary":
        need_txt = f"{'+' if spec.direction > 0 else '−'}{t:.1%}"
        bound = lo if spec.direction > 0 else hi
        if code == 1:
            return f"{ch}: at least the {need_txt} threshold, and the {kind} bound {_pct(bound)} clears zero"
        if code == -1:
            if not s.sequential and n_had >= need:
                return f"{ch}: no gain of {need_txt} at the planned {need} runs per arm"
            return f"{ch}: the gain cannot reach the {need_txt} threshold"
        if n_had < need:
            return f"{ch}: {n_had} run(s) per arm, {need} needed to resolve a {need_txt} change at σ = {r['sigma']:.1%}; not yet a verdict"
        if r.get("improvement") is not None and r["improvement"] >= t:
            return f"{ch}: above the {need_txt} threshold but the {kind} bound does not yet clear zero"
        return f"{ch}: neither clear of zero nor ruled out below the {need_txt} threshold"
    worse = f"{'−' if spec.direction > 0 else '+'}{t:.1%}"
    if code == 1:
        return f"{ch}: no worse than the {worse} tolerance"
    if code == -1:
        return f"{ch}: worse than the {worse} tolerance"
    return f"{ch}: cannot yet rule out a worsening beyond {worse}"
