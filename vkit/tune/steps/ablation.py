"""Ablation: each kept change switched back on its own, to show which of them carried the gain."""

from __future__ import annotations

from typing import Callable

from vkit import search
from vkit.errors import Rejected
from vkit.state import now_iso
from vkit.tune.compare import Versus
from vkit.tune.context import Tune
from vkit.tune.steps.common import finished_step, primary_metric, record_step


def _last_multi_keep(runner: Tune) -> tuple[dict, dict, dict, list] | None:
    """The latest keep whose change moved several parameters: (its log event, the configuration
    before, the one kept, the one-parameter variants), or None."""
    keeps = [e for e in runner.sf.log.read() if e.get("event") == "keep"]
    for e in reversed(keeps):
        prev = (e.get("previous") or {}).get("config") or {}
        new = e.get("config") or {}
        variants = search.ablation_configs(prev, new)
        if variants:
            return e, prev, new, variants
    return None


def auto_ablate(runner: Tune, step: str, progress: Callable[[str], None]) -> dict | None:
    """After ``step`` kept a change of several parameters at once, the attribution runs by itself
    (seed 000's one-switch control): once per keep, resumable, recorded with the step."""
    rec = finished_step(runner, step) or {}
    if (rec.get("confirmed") or {}).get("decision") != "kept":
        return None
    found = _last_multi_keep(runner)
    if found is None or found[2] != runner.ledger.kept_config():
        return None
    if (rec.get("ablation") or {}).get("decision_id") == found[0]["id"] or any(
            a.get("decision_id") == found[0]["id"] for a in runner.ledger.tune().ablations):
        return None  # attributed, or refused, already (a resumed run)
    progress(f"step {step} kept {len(found[3])} parameters changed at once: measuring each alone (attribution)")
    try:
        out = run_ablation(runner, progress)
    except Rejected as ex:
        progress(f"step {step}: no attribution: {ex}")
        runner.log("ablation_skipped", decision_id=found[0]["id"], why=str(ex))
        record_step(runner, dict(rec, ablation={"decision_id": found[0]["id"], "skipped": str(ex)}))
        return None
    parts = [f"{r['param']} {r['from']}→{r['to']} alone " + (f"{r['change']:+.1%} {r['metric']}, " if r["change"] is not None else "")
             + f"gate {r['verdict']}" for r in out["switches"]]
    text = ("attribution: " + ", ".join(out["attribution"]) + " paid" if out["attribution"] else
            "attribution: no parameter alone paid (the gain needs them together, or is within the noise)")
    record_step(runner, dict(rec, ablation={k: out[k] for k in ("decision_id", "switches", "attribution")},
                              stop_rule=f"{rec.get('stop_rule')}; {text} ({'; '.join(parts)})"))
    return out


def run_ablation(runner: Tune, progress: Callable[[str], None]) -> dict:
    """The seed's missing one-switch control: when the last kept change moved several parameters
    at once, measure each one alone against the configuration it replaced, so the report can say
    which switch produced the gain (on the run's primary metric: throughput or SLO capacity)."""
    found = _last_multi_keep(runner)
    if found is None:
        raise Rejected("no kept change moved several parameters at once: nothing to ablate")
    e, prev, new, variants = found
    if runner.ledger.kept_config() != new:
        raise Rejected("the configuration kept by that decision is no longer the kept one: ablate right after the keep")
    unset = sorted(k for k in new if k not in prev)
    if unset:
        raise Rejected(f"the configuration before {e['id']} left {', '.join(unset)} at the server's own default, which a "
                       "candidate cannot set back (vkit only knows values it set): set it explicitly in the kept "
                       "configuration first (restart_with_rollback --set ... --keep) to attribute such a change")
    pm = primary_metric(runner)
    key = f"ablate-{e['id']}"
    versus = Versus(key=key)
    runner.baselines.measure(versus=versus, config=prev)
    rows = []
    for param, cfg in variants:
        t = next((x for x in runner.ledger.trials(step="ablate") if x["config"] == cfg), None)
        if t is None:
            t = runner.trials.new("ablate", cfg, f"{param} alone: {prev.get(param)} -> {new.get(param)}, against the configuration before {e['id']}")
        # an attribution needs a verdict, not a screening glance
        t = runner.trials.run(t["id"], versus, repeats=max(runner.s.screen_repeats, 3))
        base = runner.ledger.record(key)["metrics"]
        gain = (t["metrics"].get(pm) or 0) / base[pm] - 1 if base.get(pm) else None
        rows.append({"param": param, "from": prev.get(param), "to": new.get(param), "trial_id": t["id"], "verdict": t.get("verdict"),
                     "metric": pm, "change": gain, "why": t.get("why")})
        progress(f"ablate {param}: {prev.get(param)} -> {new.get(param)} alone: "
                 + (f"{gain:+.1%} {pm}, " if gain is not None else "") + f"gate {t.get('verdict')}")
    runner.seat.restore_kept()
    out = {"decision_id": e["id"], "previous": prev, "kept": new, "switches": rows,
           "attribution": [r["param"] for r in rows if r["verdict"] == "accept"]}
    runner.sf.tune.record_ablation(dict(out, finished=now_iso()))
    runner.log("ablation", **out)
    return out
