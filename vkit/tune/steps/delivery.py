"""Delivery: the Pareto front of measured configurations, each claim confirmed against the kept one; the recommendation."""

from __future__ import annotations

import math
import shlex
from typing import Callable

from vkit import search
from vkit.apply.launcher import serve_argv
from vkit.apply.policy import to_serve_flags
from vkit.tune.compare import Versus
from vkit.tune.config import Workload
from vkit.tune.context import Tune
from vkit.tune.ledger import TuneView, first
from vkit.tune.steps.common import objectives, observations


def _front(runner: Tune, goal: dict) -> tuple[dict, list[search.Observation]]:
    """The search's delivery over every screened configuration plus the kept one."""
    st = runner.ledger.tune()
    # a member whose claim the gate rejected on fresh runs was a screening artefact: out of the front
    gone = {c["trial_id"] for c in _current_checks(st) if c.get("decision") in _NOT_CONFIRMED}
    hist = [h for h in observations(runner) if h.step in ("2", "3", "4", "bo") and h.trial_id not in gone]
    if runner.s.capacity is not None:
        # interactivity is measured at the reference load: a configuration that does not carry that load
        # within the SLO has no interactivity to trade, so it is not deliverable on this front
        trials = {t["id"]: t for t in st.trials()}
        hist = [h for h in hist if _carries_reference(runner, trials.get(h.trial_id) or {})]
    b = st.record("baseline")
    kept = st.kept_config
    # the kept configuration (confirmed) is always a candidate for delivery
    objs = objectives(runner)
    if b.get("metrics") and b.get("config") == kept:  # the baseline measured the kept configuration itself
        hist.append(search.Observation(config=dict(kept), objectives={o.name: b["metrics"].get(o.name) for o in objs},
                                       repeats=[], feasible=True, slo_ok=None, step="kept", trial_id="kept"))
    out = search.deliver(hist, objs, goal) if hist else {"front": [], "knee": None, "recommendation": None}
    return out, hist


_NOT_CONFIRMED = ("reject", "invalid", "start_failed")


def _carries_reference(runner: Tune, trial: dict) -> bool:
    """Every capacity search of the trial (or of the one it is the same as) held the SLO at the reference load."""
    if trial.get("same_as"):
        src = first(runner.ledger.trials(), id=trial["same_as"])
        trial = src if src is not None else {"runs": runner.ledger.record("baseline").get("runs") or []}
    docs = []
    for p in trial.get("runs") or []:
        try:
            docs.append(runner.ledger.load(p))
        except (OSError, ValueError):
            return False
    return bool(docs) and all(d.get("ref_holds", True) for d in docs)


def _kept_ids(st: TuneView) -> set:
    """Trials whose confirmation ended in a keep."""
    return {c["trial_id"] for c in st.confirmations() if c.get("decision") == "kept"}


def _current_checks(st: TuneView) -> list[dict]:
    """Delivery confirmations made against the configuration kept now (older ones no longer apply)."""
    kept = st.kept_config
    return [c for c in st.confirmations("delivery_confirmations") if c.get("against", kept) == kept]


def _claim(point: dict, kept_obj: dict, objs: list[search.Objective]) -> tuple[str, float]:
    """The objective a front member screened best on relative to the kept configuration, as a gate
    primary spec, and that relative advantage (in the objective's good direction)."""
    best, gain = None, -math.inf
    for o in objs:
        a, b = kept_obj.get(o.name), (point.get("objectives") or {}).get(o.name)
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)) or a == 0:
            continue
        rel = (b - a) / abs(a) * (1 if o.direction == "max" else -1)
        if rel > gain:
            best, gain = o, rel
    best = best or objs[0]
    return f"{best.name}:{'+' if best.direction == 'max' else '-'}", gain


# Capacity objective: a front member claiming better interactivity is confirmed with its capacity guarded,
# so an accepted claim means "as much traffic, within this, and faster tokens per user".
CAPACITY_GUARD = 0.05


def claim_guards(runner: Tune, primary: str) -> list[str]:
    # j-per-token: capacity may be traded for joules down to the required load, which every search measures
    # (ref_holds); no guard relative to the kept configuration's capacity
    if runner.s.capacity is not None and not primary.startswith("slo_capacity") and runner.s.objective != "j-per-token":
        return [f"slo_capacity:+:{CAPACITY_GUARD:.0%}"]
    return []


def confirm_front(runner: Tune, goal: dict, limit: int, progress: Callable[[str], None]) -> list[dict]:
    """Re-confirm (measure) up to ``limit`` delivered configurations that are not the kept one, each on its own
    claim (the objective it screened better on) against the kept configuration, on fresh interleaved
    runs with the gate (the winner's curse: a screening mean is biased up). Resumable; the
    decisions go into the state file (``delivery_confirmations``) for :func:`deliver`."""
    done: list[dict] = []
    tried: set = set()
    measured = 0
    while measured < limit:
        # the front is recomputed after every rejection: a member that was a noise artefact leaves it,
        # and whatever takes its place is confirmed in turn
        out, hist = _front(runner, goal)
        st = runner.ledger.tune()
        kept_ids = _kept_ids(st)
        kept_cfg = st.kept_config
        # the kept configuration's own numbers: its baseline, else the screening of the trial that became it
        kept_obj = next((h.objectives for h in hist if h.trial_id == "kept"), None) or \
            next((h.objectives for h in hist if h.trial_id in kept_ids and h.config == kept_cfg), None)
        if not kept_obj:
            break
        finished = {c["trial_id"] for c in _current_checks(st) if c.get("finished") or c.get("decision")}
        todo = [p for p in out.get("front", []) if p.get("trial_id") not in (None, "kept")
                and p["trial_id"] not in kept_ids and p["trial_id"] not in finished and p["trial_id"] not in tried]
        if not todo:
            break
        p = todo[0]
        tid = p["trial_id"]
        tried.add(tid)
        primary, gain = _claim(p, kept_obj, objectives(runner))
        if gain <= 0:  # on the front only through the pooled means: no claim over the kept configuration to test
            conf = runner.confirmer.drop_point(tid, max(1, len(hist)), primary,
                                     f"no advantage over the kept configuration on screening (best: {primary} {gain:+.1%}); "
                                     "not measured again")
            progress(f"deliver: {tid} dropped: {conf['why']}")
            done.append(conf)
            continue
        progress(f"deliver: confirming {tid} ({' '.join(to_serve_flags(p.get('config') or {}))}) on its claim {primary} "
                 f"({gain:+.1%} on screening) against the kept configuration")
        claim = Versus(primary=primary, guards=tuple(claim_guards(runner, primary)))
        conf = runner.confirmer.confirm_point(tid, selected_from=max(1, len(hist)), claim=claim)
        measured += 1 if conf.get("b_runs") else 0  # one refused before any run (underpowered) cost nothing
        progress(f"deliver: {tid} {'confirmed' if conf.get('decision') == 'accept' else conf.get('decision')}: {conf.get('why')}")
        done.append(conf)
    srv = runner.served.server()
    if measured or srv.running.get("config") not in (None, srv.kept["config"]):
        runner.seat.settle()  # once, after the last candidate (or one left running by an interrupted run)
    return done


def versus_kept(runner: Tune, conf: dict) -> dict:
    """Each objective's relative difference, candidate vs kept, over a confirmation's fresh runs (the
    claim is the gate's; the others are shown so a trade-off's price is seen on the same runs)."""
    out: dict = {}
    try:
        a = [runner.ledger.load(p) for p in conf.get("a_runs") or []]
        b = [runner.ledger.load(p) for p in conf.get("b_runs") or []]
    except (OSError, ValueError):
        return out
    for o in objectives(runner):
        va = [d[o.name] for d in a if isinstance(d.get(o.name), (int, float))]
        vb = [d[o.name] for d in b if isinstance(d.get(o.name), (int, float))]
        if va and vb and sum(va):
            out[o.name] = (sum(vb) / len(vb)) / (sum(va) / len(va)) - 1
    return out


def deliver(runner: Tune, goal: dict) -> dict:
    """3–5 Pareto configurations with dominance rates, the knee, the recommendation, the flags.
    Reads the state only: a member is ``confirmed`` when it is the kept configuration or the gate
    accepted its claim on fresh interleaved runs (:func:`confirm_front`); one whose claim the gate
    rejected is moved to ``not_confirmed`` and no longer offered as better."""
    st = runner.ledger.tune()
    out, _ = _front(runner, goal)
    kept = st.kept_config
    confirmed = _kept_ids(st)
    checks = {c["trial_id"]: c for c in _current_checks(st)}
    pareto = []
    for p in out.get("front", []):
        cfg = p.get("config") or {}
        tid = p.get("trial_id")
        row = dict(p, metrics=p.get("objectives"), serve_flags=to_serve_flags(cfg),
                   confirmed=tid in confirmed or tid == "kept")
        c = checks.get(tid)
        if row["confirmed"]:
            row["confirmation"] = {"decision": "kept", "why": "the kept configuration"}
        elif c is not None:
            row["confirmation"] = {"claim": c.get("primary"), "decision": c.get("decision"), "why": c.get("why"),
                                   "pairs": len(c.get("b_runs") or []), "vs_kept": versus_kept(runner, c)}
            row["confirmed"] = c.get("decision") == "accept"
        else:
            row["confirmation"] = {"decision": None, "why": "screening only: not re-confirmed on fresh runs"}
        pareto.append(row)
    trials = {t["id"]: t for t in st.trials()}
    dropped = [{"trial_id": c["trial_id"], "config": c.get("config"), "serve_flags": to_serve_flags(c.get("config") or {}),
                "screening": (trials.get(c["trial_id"]) or {}).get("metrics"), "claim": c.get("primary"),
                "decision": c.get("decision"), "why": c.get("why")}
               for c in _current_checks(st) if c.get("decision") in _NOT_CONFIRMED]
    out["pareto"] = pareto
    out["not_confirmed"] = dropped
    if runner.s.objective == "j-per-token":
        out["recommendation"] = energy_pick(runner, pareto, st)
        return out
    better = more_interactive(runner, pareto) if runner.s.capacity is not None else None
    if better is not None:
        # The business goal is max capacity, then interactivity: a member confirmed faster per user at
        # the reference load, its capacity guarded within CAPACITY_GUARD of the kept one's, is that goal's pick.
        cfg = better.get("config") or {}
        out["recommendation"] = {
            **deployment(st, cfg, better["trial_id"], None), "kept_config": dict(kept),
            "why": (f"the goal is the most SLO capacity, then interactivity: {better['trial_id']} was confirmed on fresh "
                    "interleaved runs against the kept configuration with a lower mean TPOT at the reference load "
                    f"({better['confirmation'].get('why')}), its capacity guarded within {CAPACITY_GUARD:.0%} of the kept "
                    "one's; the kept configuration (the server runs it now) is the one every keep decision confirmed, "
                    "deploy this one for the stated goal")}
        return out
    # The recommendation is the kept configuration: the only one confirmed on fresh interleaved runs.
    searched = out.get("recommendation") or {}
    rec = {**deployment(st, kept, kept_trial_id(st), st.kept.get("decision_id")),
           "why": "the kept configuration: every change in it was accepted by the gate on fresh, interleaved runs "
                  "against the configuration it replaced",
           "search_pick": {"trial_id": searched.get("trial_id"), "config": searched.get("config"), "why": searched.get("why")}}
    out["recommendation"] = rec
    return out


def kept_trial_id(st: TuneView) -> str:
    """The last trial that was kept with the configuration kept now ("kept": its baseline, when none)."""
    return next((t["id"] for t in reversed(st.trials()) if t.get("kept") and t["config"] == st.kept_config), "kept")


def deployment(st: TuneView, cfg: dict, trial_id: str, decision_id: str | None) -> dict:
    """A recommendation's configuration and how to deploy it: its vllm serve flags and whole command."""
    return {"config": dict(cfg), "trial_id": trial_id, "decision_id": decision_id, "serve_flags": to_serve_flags(cfg),
            "serve_command": shlex.join(serve_argv(st.server.launch, cfg))}


def energy_pick(runner: Tune, pareto: list[dict], st: TuneView) -> dict:
    """--objective j-per-token: the configuration with the fewest J per output token at the required load among
    those that carry it. A front member qualifies when the gate accepted its J/token claim on fresh interleaved
    runs against the kept configuration and every search of it, screening and confirmation, held the SLO at
    the required load; else the kept configuration, when its searches held there; else none carries it."""
    req = runner.s.required_capacity
    metric = "ref_j_per_output_token"
    kept = st.kept_config
    kept_trial = kept_trial_id(st)
    trials = {t["id"]: t for t in st.trials()}
    checks = {c["trial_id"]: c for c in _current_checks(st)}
    ok = [p for p in pareto if (p.get("confirmation") or {}).get("decision") == "accept"
          and str((p.get("confirmation") or {}).get("claim") or "").startswith(metric)
          and _carries_reference(runner, trials.get(p["trial_id"]) or {})
          and _carries_reference(runner, {"runs": (checks.get(p["trial_id"]) or {}).get("b_runs") or []})]
    best = min(ok, key=lambda p: (p.get("metrics") or {}).get(metric, math.inf)) if ok else None
    kept_row = next((p for p in pareto if p.get("trial_id") == "kept"), None)
    b = st.record("baseline")
    kept_carries = _carries_reference(runner, {"runs": b.get("runs") or []}) if b.get("config") == kept else \
        _carries_reference(runner, trials.get(kept_trial) or {})
    cfg = dict((best or {}).get("config") or kept)
    rec = {**deployment(st, cfg, best["trial_id"] if best else kept_trial, None if best else st.kept.get("decision_id")),
           "required_capacity": req,
           "carries_required": bool(best) or kept_carries}
    if best is not None:
        j = (best.get("metrics") or {}).get(metric)
        kj = ((kept_row or {}).get("metrics") or {}).get(metric)
        rec["kept_config"] = dict(kept)
        rec["why"] = (f"the goal is the fewest J per output token while carrying {req:g}: {best['trial_id']} was confirmed "
                      f"on fresh interleaved runs against the kept configuration with fewer J per output token at that "
                      f"load ({(best['confirmation'] or {}).get('why')}), {j:.4g} J/token"
                      + (f" against {kj:.4g}" if isinstance(kj, (int, float)) and isinstance(j, (int, float)) else "")
                      + f", and every search of it held the SLO at {req:g}; the kept configuration (the server runs it "
                      "now) has the most capacity the gate confirmed, deploy this one for the stated goal")
    elif kept_carries:
        rec["why"] = (f"the kept configuration: it carries {req:g} within the SLO in every search, and no configuration "
                      "was confirmed on fresh interleaved runs with fewer J per output token there")
    else:
        rec["why"] = (f"no measured configuration carries {req:g} within the SLO in every search: the kept one has the "
                      "most capacity the gate confirmed; serve less, or on more accelerators")
    return rec


def more_interactive(runner: Tune, pareto: list[dict]) -> dict | None:
    """The front member whose interactivity claim (guarded on capacity) the gate accepted on fresh
    interleaved runs, the lowest mean TPOT at the reference load among them; None when there is none."""
    ok = [p for p in pareto if (p.get("confirmation") or {}).get("decision") == "accept"
          and str((p.get("confirmation") or {}).get("claim") or "").startswith("ref_mean_tpot_ms")]
    return min(ok, key=lambda p: (p.get("metrics") or {}).get("ref_mean_tpot_ms", math.inf)) if ok else None


def workload_concurrency(w: Workload) -> int | None:
    return w.options.max_concurrency
