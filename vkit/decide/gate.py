"""GATE in the tuning state machine: accept, reject or leave undecided a candidate
configuration against the kept one, from repeated benchmark summaries of each.

Pipeline: ``bench_stream … > run.json`` (repeated, interleaved ABBA) → ``gate --baseline
B*.json --candidate C*.json`` (which runs check_invariants on every input itself). Order of
work, each step able to stop with a refusal:

1. every input valid by check_invariants (invalid → no verdict; anomaly → refused unless
   allowed);
2. the same gauge on both sides (streaming, endpoint, dataset and its seed, lengths,
   concurrency or rate, number of prompts, client version), the first difference named; and
   the same environment (accelerator model, count and driver, server version, model hash,
   dtype, quantisation: ``vkit.environment``), every difference named;
3. design: interleaved or blocked (from the run dates), the winner of a search confirmed on
   fresh runs only, no baseline run older than a detected change point;
4. per metric, on logs (relative effects): the effect, its interval, p- or e-value,
   threshold t = max(2σ_baseline, floor), σ, runs needed vs had, and a decision;
5. the joint decision: accept = primary improves by ≥ t AND no guard worse than its
   tolerance (intersection-union, each one-sided at α); which metrics changed with e-BH
   (sequential) or BH/BY (fixed).

``vkit.decide.rule`` states the decision rule (sequential by default, ``--fixed`` otherwise).
This module holds the decision (``decide``, steps 3 and 5) and the state-file glue
(``trial_inputs``, ``sigma_from_state``); it also exports, as before the split, the names of
``specs`` (metrics, settings), ``rule`` (the vectorised rule), ``runs`` (steps 1–2, pairing) and
``analysis`` (step 4).

Nothing here prints or exits; refusals raise ``InvalidData``/``UsageError`` with a sentence.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vkit.apply.policy import Policy
from vkit.decide import drift as _drift
from vkit.decide import stats as st
from vkit.decide.analysis import Context, _finite, _pct, analyze_metric
from vkit.decide.rule import Boundaries, n_needed
from vkit.decide.runs import (
    CLIENT_NAMES,
    GAUGE_TOP,
    GAUGE_VKIT,
    Checker,
    Run,
    check_invariants,
    check_same_environment,
    check_same_gauge,
    check_seeds,
    cross_gauge_differences,
    detect_layout,
    drift_warning,
    gauge_of,
    has_metric,
    load_summary,
    metric_logs,
    pair_indices,
    parse_date,
    seed_of,
    validate,
)
from vkit.decide.specs import (
    ACCEPT,
    DEFAULT_PRIMARY,
    REJECT,
    REPORT_METRICS,
    UNDECIDED,
    MetricSpec,
    Settings,
    infer_direction,
    parse_guards,
    parse_metric,
    parse_sigma,
)
from vkit.errors import ExitCode, InvalidData, UsageError

__all__ = [
    "ACCEPT", "CLIENT_NAMES", "DEFAULT_PRIMARY", "EXIT_CODE", "GAUGE_TOP", "GAUGE_VKIT",
    "REJECT", "REPORT_METRICS", "UNDECIDED", "Boundaries", "Checker", "Context", "GateInput", "MetricSpec", "Run",
    "Settings", "analyze_metric", "check_invariants", "check_same_environment", "check_same_gauge", "check_seeds",
    "cross_gauge_differences", "decide", "detect_layout", "drift_warning", "gauge_of", "has_metric", "infer_direction",
    "load_summary", "metric_logs", "n_needed", "pair_indices", "parse_date", "parse_guards", "parse_metric",
    "parse_sigma", "seed_of", "sigma_from_state", "stale_refusal",
    "trial_inputs", "validate",
]

EXIT_CODE = {ACCEPT: ExitCode.OK, REJECT: ExitCode.REJECTED}  # anything else: undecided


# --------------------------------------------------------------------------- the decision


@dataclass
class GateInput:
    baseline: list[str]
    candidate: list[str] = field(default_factory=list)
    fresh: list[str] = field(default_factory=list)
    primary: MetricSpec = field(default_factory=lambda: parse_metric(DEFAULT_PRIMARY, "primary"))
    guards: list[MetricSpec] = field(default_factory=list)
    report: list[str] | None = None
    settings: Settings = field(default_factory=Settings)
    layout: str | None = None  # interleaved | blocked | None (from the dates)
    selected_from: int = 1
    sigma_pool: dict = field(default_factory=dict)
    sigma_threshold: dict = field(default_factory=dict)  # σ of one run, for max(2σ, floor) (default: sigma_pool's)
    changed_at: _dt.datetime | None = None
    check_drift: bool = True
    policy: Policy | None = None  # None: the packaged parameter policy (the CLI passes $VKIT_POLICY's)
    ran: list[str] = field(default_factory=list)  # must-run checks the caller ran outside gate (--ran)


def decide(inp: GateInput, checker: Checker | None = None) -> dict:
    """The whole gate: load, validate, compare gauges, check the design, analyse, decide.
    Returns the result document (see module docstring); raises on refusals."""
    s = inp.settings
    base, cand = _load_runs(inp)
    allruns = base + cand
    warnings = validate(allruns, s.allow_anomaly, checker)
    gauge, w = check_same_gauge(allruns)
    check_same_environment(allruns)
    warnings += w
    design, screening, evidence, layout = _design(inp, base, cand, warnings)
    n_fresh = design["fresh_runs"]
    # Stale baseline: older than a detected change point.
    stale_refusal(base, inp.primary.name, inp.changed_at, inp.sigma_pool.get(inp.primary.name), inp.check_drift)
    min_reps, few = _must_run(inp, base)
    pairs = pair_indices(base, evidence)
    design["pairs"] = len(pairs)
    ctx = Context(s, Boundaries.build(s), base, evidence, pairs, layout, dict(inp.sigma_pool), dict(inp.sigma_threshold))
    dw = drift_warning(base, evidence, inp.primary.name, layout)
    if dw:
        warnings.append(dw)
    if not s.sequential:
        warnings.append("--fixed: the classical test is valid only at one look at the planned n; looking after every run needs the default --sequential")
    primary, guards, metrics = _analyze_all(ctx, inp)
    changed = _changed(metrics, s)
    # Winner of a search: screening runs are no evidence.
    winner_block = inp.selected_from > 1 and n_fresh == 0
    if inp.selected_from > 1 and n_fresh:
        scr = _screening_effect(base, screening, inp.primary) if screening else None
        if scr is not None:
            design["screening_change"] = scr
    decision, why, more = _combine(primary, guards)
    if few and decision != UNDECIDED:
        decision, why, more = _too_few_repeats(primary, base, evidence, min_reps)
    if winner_block:
        decision, why, more = _winner_unconfirmed(primary, base, inp.selected_from)
    result = {
        "tool": "gate",
        "decision": decision,
        "why": why,
        "mode": "sequential" if s.sequential else "fixed",
        "alpha": s.alpha,
        "power": s.power,
        "floor": s.floor,
        "primary": primary,
        "guards": guards,
        "metrics": metrics,
        "changed": changed,
        "design": design,
        "gauge": gauge,
        "runs": {"baseline": [r.path for r in base], "candidate": [r.path for r in evidence],
                 "screening": [r.path for r in screening] if n_fresh else []},
        "validity": [{"path": r.path, "verdict": r.verdict} for r in allruns],
        "more_runs": more,
        "warnings": warnings,
        "must_run": {"ran_in_gate": ["check_invariants"], "declared": list(inp.ran), "repeats": len(base),
                     "min_repeats": min_reps},
    }
    return result


def _load_runs(inp: GateInput) -> tuple[list[Run], list[Run]]:
    """The baseline and candidate runs (fresh ones marked), each file counted once."""
    if not inp.baseline:
        raise UsageError("no baseline runs; give --baseline B.json ... (the kept configuration's repeats)")
    if not inp.candidate and not inp.fresh:
        raise UsageError("no candidate runs; give --candidate C.json ... and/or --fresh C.json ...")
    if inp.selected_from < 1:
        raise UsageError("--selected-from K needs K >= 1")
    base = [load_summary(p, "baseline") for p in inp.baseline]
    fresh_set = {os.path.abspath(p) for p in inp.fresh}
    cand_paths = list(inp.candidate) + [p for p in inp.fresh if os.path.abspath(p) not in {os.path.abspath(q) for q in inp.candidate}]
    cand = [load_summary(p, "candidate", fresh=os.path.abspath(p) in fresh_set) for p in cand_paths]
    seen: dict[str, str] = {}
    for r in base + cand:
        if r.digest in seen:
            raise InvalidData(f"{r.path} and {seen[r.digest]} are the same run (identical files); every run counts once")
        seen[r.digest] = r.path
    return base, cand


def _design(inp: GateInput, base: list[Run], cand: list[Run], warnings: list[str]) -> tuple[dict, list[Run], list[Run], str]:
    """Which candidate runs are evidence, and the layout: (design, screening runs, evidence,
    layout). Appends to ``warnings``."""
    n_fresh = sum(r.fresh for r in cand)
    screening = [r for r in cand if not r.fresh]
    evidence = [r for r in cand if r.fresh] if n_fresh else cand
    design: dict[str, Any] = {"selected_from": inp.selected_from, "fresh_runs": n_fresh,
                              "screening_runs_ignored": len(screening) if n_fresh else 0}
    if n_fresh and screening:
        warnings.append(f"{len(screening)} screening run(s) of the candidate are not used as evidence; only the {n_fresh} fresh run(s) are")
    layout_auto, layout_why = detect_layout(base, evidence)
    layout = inp.layout or layout_auto
    design["layout"] = layout
    design["layout_source"] = "declared" if inp.layout else layout_why
    if inp.layout and layout_auto != "unknown" and inp.layout != layout_auto:
        warnings.append(f"declared --{inp.layout} but the run dates say {layout_auto}")
    if layout == "blocked":
        warnings.append("blocked runs (all of one arm, then the other): drift between the blocks reads as an effect; interleave baseline and candidate (ABBA)")
    elif layout == "unknown":
        warnings.append("cannot tell whether the runs were interleaved (no dates); declare --interleaved or --blocked")
    return design, screening, evidence, layout


def _must_run(inp: GateInput, base: list[Run]) -> tuple[int, bool]:
    """The policy's must-run rules for a gate (the runbook's table, as data): check_invariants ran on every
    input (validate); the baseline σ rests on enough repeats — these runs, or a pooled σ given for the primary.
    Too few repeats is not a refusal but no verdict yet (``_too_few_repeats``). Returns (minimum repeats,
    whether the baseline has fewer)."""
    policy = inp.policy or Policy.load()
    min_reps = policy.min_repeats()
    few = len(base) < min_reps and inp.primary.name not in inp.sigma_pool
    policy.require({"check_invariants", "repeats", *inp.ran}, before="gate")
    return min_reps, few


def _analyze_all(ctx: Context, inp: GateInput) -> tuple[dict, list[dict], list[dict]]:
    """The primary, the guards, and every metric (primary, guards, then the reported ones)."""
    primary = analyze_metric(ctx, inp.primary)
    guards = [analyze_metric(ctx, g) for g in inp.guards]
    names = [inp.primary.name] + [g.name for g in inp.guards]
    report_names = inp.report if inp.report is not None else [m for m in REPORT_METRICS if has_metric(ctx.base + ctx.cand, m)]
    reports = []
    for m in report_names:
        if m in names:
            continue
        d = infer_direction(m) or 1
        reports.append(analyze_metric(ctx, MetricSpec(m, d, "report")))
    return primary, guards, [primary] + guards + reports


def _too_few_repeats(primary: dict, base: list[Run], evidence: list[Run], min_reps: int) -> tuple[str, str, dict]:
    need = max(min_reps, primary.get("n_needed") or 0)
    why = (f"{len(base)} baseline run(s) and no pooled σ: the policy asks for at least {min_reps} repeats before a "
           f"gate verdict (rule R3), so σ_baseline is measured, not guessed; run {need - len(base)} more of the baseline")
    return UNDECIDED, why, {"baseline": need - len(base), "candidate": max(0, need - len(evidence))}


def _winner_unconfirmed(primary: dict, base: list[Run], selected_from: int) -> tuple[str, str, dict]:
    need = primary.get("n_needed") or 2
    why = (f"the candidate is the winner of a search over {selected_from} configurations: its screening runs are "
           f"not evidence (winner's curse); run {need} fresh confirmation runs interleaved with the baseline (ABBA) "
           "and pass them with --fresh")
    return UNDECIDED, why, {"baseline": max(0, need - len(base)), "candidate": need}


def _combine(primary: dict, guards: list[dict]) -> tuple[str, str, dict | None]:
    bad = [g for g in guards if g["decision"] == "worse"]
    if primary["decision"] == "not_enough":
        return REJECT, primary["why"], None
    if bad:
        return REJECT, bad[0]["why"], None
    open_ = [m for m in [primary] + guards if m["decision"] == UNDECIDED]
    if not open_:
        if guards:
            return ACCEPT, primary["why"] + f"; {len(guards)} guard(s) within tolerance", None
        return ACCEPT, primary["why"], None
    more = max(int(m.get("more_runs") or 1) for m in open_)
    first = open_[0]
    nb, nc = first["n_had"]["baseline"], first["n_had"]["candidate"]
    k = first["n_had"]["pairs"]
    target = k + more
    more_d = {"baseline": max(0, target - nb), "candidate": max(0, target - nc)}
    if more_d["baseline"] == 0 and more_d["candidate"] == 0:
        more_d["candidate"] = more
    capped = any(m.get("more_runs_capped") for m in open_)
    tail = (f"; about {more} more run(s) of each, interleaved" if not capped
            else f"; at least {more} more run(s) of each (the effect sits close to the threshold)")
    return UNDECIDED, first["why"] + tail, more_d


def _changed(metrics: list[dict], s: Settings) -> dict:
    tested = [m for m in metrics if m.get("p_value") is not None and m.get("change") is not None]
    names = [m["metric"] for m in tested]
    if s.sequential:
        es = [m.get("e_value") or 0.0 for m in tested]
        rej = st.e_bh(es, s.alpha) if es else []
        for m, r in zip(tested, rej, strict=True):
            m["changed"] = bool(r)
        return {"method": "e-BH", "level": s.alpha, "metrics": [n for n, r in zip(names, rej, strict=True) if r]}
    ps = [m.get("p_value_two_sided", math.nan) for m in tested]
    signs = {math.copysign(1, m["change"]) for m in tested if m["change"]}
    method = "by" if len(signs) > 1 else "bh"
    adj, rej = st.fdr(ps, s.alpha, method) if ps else ([], [])
    for m, a, r in zip(tested, adj, rej, strict=True):
        m["q_value"] = _finite(a) if a == a else None
        m["changed"] = bool(r)
    return {"method": method.upper(), "level": s.alpha, "metrics": [n for n, r in zip(names, rej, strict=True) if r],
            "why": "BY: the changes have opposite signs" if method == "by" else "BH: the changes share a sign"}


def _screening_effect(base: list[Run], screening: list[Run], spec: MetricSpec) -> float | None:
    try:
        b, c = metric_logs(base, spec.name), metric_logs(screening, spec.name)
    except InvalidData:
        return None
    return float(math.expm1(c.mean() - b.mean()))


def stale_refusal(base: list[Run], metric: str, changed_at: _dt.datetime | None, sigma: float | None, check_drift: bool) -> None:
    """Refuse a baseline older than a detected change point: one given (``changed_at``, e.g.
    from the state file), or one drift.detect finds in the baseline series itself."""
    if not check_drift:
        return
    dates = [r.when for r in base]
    if changed_at is not None:
        stale = _drift.stale_runs(dates, changed_at)
        if stale:
            names = ", ".join(base[i].path for i in stale[:3]) + (" …" if len(stale) > 3 else "")
            raise InvalidData(
                f"{len(stale)} baseline run(s) predate the change point detected at {changed_at.isoformat(sep=' ')} ({names}); "
                "re-measure the baseline (pass --ignore-drift to decide anyway)"
            )
    if len(base) >= _drift.MIN_RUNS and all(d is not None for d in dates):
        order = sorted(range(len(base)), key=lambda i: dates[i])
        series = metric_logs([base[i] for i in order], metric)
        res = _drift.detect(np.exp(series), sigma=sigma)
        if res["changed"]:
            cp = res["change_index"]
            stale_paths = [base[order[i]].path for i in range(cp)]
            raise InvalidData(
                f"the baseline's {metric} changed level at run {cp + 1} of {len(base)} ({_pct(res['shift'])}, {res['detector']}); "
                f"the {len(stale_paths)} earlier run(s) ({', '.join(stale_paths[:3])}{' …' if len(stale_paths) > 3 else ''}) "
                "measure another server state: re-baseline with the later runs only (or pass --ignore-drift)"
            )


# --------------------------------------------------------------------------- state file


def trial_inputs(state: dict, trial_id: str, state_dir: str) -> dict:
    """What gate reads from a trial in the state file (``state["trials"]``):

    ``id``; ``baseline`` and ``candidate`` (lists of summary paths, relative to the state
    file's directory when not absolute); ``fresh`` (list of paths of fresh confirmation
    runs, or entries of ``candidate`` given as ``{"path": ..., "fresh": true}``);
    ``selected_from`` (K, the size of the search the candidate won; default 1); ``design``
    (``interleaved``/``blocked``; default from the run dates); ``valid`` (False refuses).
    From the state: ``sigma_baseline`` (per metric, a relative σ pooled from earlier A/A runs,
    a number or ``{"sigma": x, "n": k}``) and ``drift.change_date`` (ISO time of the last
    detected change point; older baseline runs are refused).
    """
    trials = state.get("trials") or []
    matches = [t for t in trials if isinstance(t, dict) and str(t.get("id")) == str(trial_id)]
    if not matches:
        known = ", ".join(str(t.get("id")) for t in trials[-5:] if isinstance(t, dict)) or "none"
        raise UsageError(f"no trial {trial_id!r} in the state file (last trials: {known})")
    t = matches[-1]
    if t.get("valid") is False:
        raise InvalidData(f"trial {trial_id} is marked invalid in the state file; no verdict on invalid data")

    def resolve(p: Any) -> str:
        p = p.get("path") if isinstance(p, dict) else p
        if not isinstance(p, str):
            raise InvalidData(f"trial {trial_id}: a run entry is not a path: {p!r}")
        return p if os.path.isabs(p) else os.path.join(state_dir, p)

    cand_entries = t.get("candidate") or []
    fresh = [resolve(p) for p in (t.get("fresh") or [])]
    fresh += [resolve(e) for e in cand_entries if isinstance(e, dict) and e.get("fresh")]
    cand = [resolve(e) for e in cand_entries if not (isinstance(e, dict) and e.get("fresh"))]
    out = {
        "baseline": [resolve(p) for p in (t.get("baseline") or [])],
        "candidate": cand,
        "fresh": fresh,
        "selected_from": int(t.get("selected_from") or 1),
        "layout": t.get("design") if t.get("design") in ("interleaved", "blocked") else None,
        "sigma_pool": sigma_from_state(state),
        "changed_at": parse_date(((state.get("drift") or {}).get("change_date"))),
        "config": t.get("config"),
    }
    return out


def sigma_from_state(state: dict) -> dict:
    out = {}
    for k, v in (state.get("sigma_baseline") or {}).items():
        x = v.get("sigma") if isinstance(v, dict) else v
        if isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < 1:
            out[k] = float(x)
    return out
