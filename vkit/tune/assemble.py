"""The tune result assembled from the state as it is: the goal, each configuration's capacity over its
searches, the recommendation (with its verified promise), the soak advice and where the time went."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from vkit.decide.components import capacity_sigma
from vkit.state import now_iso
from vkit.tune import steps as tuning
from vkit.tune.boundary import Z95
from vkit.tune.compare import Versus
from vkit.tune.config import Settings
from vkit.tune.context import Tune
from vkit.tune.ledger import Status, first
from vkit.tune.result import TuneResult
from vkit.tune.steps.twinsearch import restarts_spent, twin_table


def goal(s: Settings) -> dict:
    """The tuning goal: max SLO capacity (the highest request rate meeting every SLO), interactivity
    at the reference load second; or, with the throughput objective, max output throughput subject
    to the SLO at the workload's one load."""
    slo = ", ".join(f"{k} <= {v:g}" for k, v in s.slo.items())
    energy = "; and fewest J per output token (board power)" if s.energy_axis else ""
    if s.capacity is not None and s.required_capacity is not None:
        unit = "x the trace's speed" if s.capacity.plan.mode == "trace" else "req/s"
        return {"minimize": "ref_j_per_output_token", "subject_to": s.slo, "objective": s.objective,
                "required_capacity": s.required_capacity,
                "text": f"fewest J per output token (board power) while carrying {s.required_capacity:g} {unit} with {slo}"
                        + ("; J per output token at each capacity on the front too" if s.energy_axis else "")}
    if s.capacity is not None:
        gp = s.capacity.slo.goodput
        per_kw = s.objective == "capacity-per-kw"
        return {"maximize": "slo_capacity_per_kw" if per_kw else "slo_capacity", "subject_to": s.slo, "objective": s.objective,
                "text": f"max SLO capacity{' per kW of board power at it' if per_kw else ''} "
                        f"({'the trace replayed faster: its speed-up' if s.capacity.plan.mode == 'trace' else 'req/s offered, open loop'}) with {slo}"
                        + (f" and >= {gp:.0%} of requests meeting them" if gp else "")
                        + "; then interactivity (mean TPOT at the reference load)" + energy}
    return {"maximize": "output_throughput", "subject_to": s.slo, "objective": "throughput",
            "text": "max output throughput with " + slo + energy}


def sigma_text(comp: dict) -> str:
    """σ's parts as one line: within one process and between restarts, with 90 % intervals."""
    if comp.get("between") is None:
        return f"{comp.get('total') or 0:.1%} ({comp.get('measured') or 'not split'})"
    def pct(x: Any) -> str:
        return f"{x:.1%}" if isinstance(x, (int, float)) else "unbounded"

    wl, wh = comp.get("within_ci") or (None, None)
    bl, bh = comp.get("between_ci") or (None, None)
    return (f"within one process {pct(comp['within'])} (90 % {pct(wl)}-{pct(wh)}), between restarts {pct(comp['between'])} "
            f"(90 % {pct(bl)}-{pct(bh)}); one run on a new process {pct(comp['total'])}; "
            f"{comp.get('runs')} runs on {comp.get('groups')} starts")


def recommended_capacity(runner: Tune, rec: dict) -> dict:
    """The recommendation's capacity over its searches: the kept configuration's (its baseline, or the
    trial that became it), or the goal's other pick's (its trial and its delivery confirmation)."""
    st = runner.ledger.tune()
    if rec.get("kept_config") is not None:
        t = first(st.trials(), id=rec.get("trial_id")) or {}
        conf = first(st.confirmations("delivery_confirmations"), trial_id=rec.get("trial_id")) or {}
        return capacity_of(runner, [*(t.get("runs") or []), *(conf.get("b_runs") or [])])
    b = st.record("baseline")
    kept_runs = b.get("runs") if b.get("config") == st.kept_config else None
    kept_trial = next((t for t in reversed(st.trials()) if t.get("kept") and t["config"] == st.kept_config
                       and t["step"] not in ("1", "5")), None)
    return capacity_of(runner, kept_runs or (kept_trial or {}).get("runs") or [])


def server_info(runner: Tune) -> dict:
    """The server's version facts, from the baseline's first run ({} when there is none)."""
    b = runner.ledger.record("baseline")
    try:
        return runner.ledger.load(b["runs"][0])["vkit"]["server"].get("version_info") or {}
    except (KeyError, IndexError, OSError, ValueError):
        return {}


def build_result(runner: Tune, settings: Settings, t0: float) -> TuneResult:
    """The tune result of the state as it is now (``t0``: when the run started)."""
    st = runner.ledger.tune()
    svc = st.server
    g = goal(settings)
    delivered = tuning.deliver(runner, g)
    b = st.record("baseline")
    version = server_info(runner)
    opts = settings.workload.options
    restarts = restarts_spent(runner)
    trials = []
    for t in st.trials():
        row = {k: t.get(k) for k in ("id", "step", "config", "changes", "status", "verdict", "why", "valid", "metrics",
                                     "kept", "decision_id", "diagnosis")}
        row["status"] = "measured" if t["status"] == Status.DONE else t["status"]
        row["repeats"] = len(t.get("runs") or [])
        if settings.capacity is not None and t.get("runs") and t["step"] not in ("1", "5"):
            row["capacity"] = capacity_of(runner, t["runs"])
        if t.get("same_as"):
            row["same_as"] = t["same_as"]
        trials.append(row)
    warnings = []
    for t in st.trials():
        for w in ((t.get("gate") or {}).get("warnings") or []):
            if w not in warnings:
                warnings.append(w)
    tune_run = st.tune
    rec = delivered.get("recommendation")
    cap_block = None
    if settings.capacity is not None:
        kc = recommended_capacity(runner, {})
        # the kept configuration's unless the goal picked another one: read its runs once
        rc = recommended_capacity(runner, rec) if rec is not None and rec.get("kept_config") is not None else kc
        if rec is not None and rc:
            capd = {k: rc.get(k) for k in ("req_s", "interval", "output_tok_s", "per_accelerator", "estimate", "sd", "fails",
                                           "searches", "energy")}
            promise = tune_run.get("promise") or {}
            if promise.get("config") == rec.get("config") and promise.get("finished"):
                # the figure to promise is the one a long run held; the searches' own is kept beside it
                held = next((r for r in reversed(promise["runs"]) if r["holds"] and r["load"] == promise.get("verified")), None)
                capd.update(searched_req_s=rc.get("req_s"), req_s=promise.get("verified"),
                            output_tok_s=(held or {}).get("metrics", {}).get("output_throughput"),
                            verified={"seconds": promise.get("seconds"), "held_seconds": promise.get("held_seconds"),
                                      "runs": promise.get("runs")})
                acc = settings.capacity.accelerators
                if acc:
                    capd["per_accelerator"] = {"req_s": capd["req_s"] / acc if capd["req_s"] else None,
                                               "output_tok_s": capd["output_tok_s"] / acc if capd["output_tok_s"] else None}
            rec = dict(rec, capacity=capd, binding_slo=rc.get("binding_slo"))
        cap_block = {"reference_load": st.record("capacity_reference").get("load"),
                     "settings": settings.capacity.describe(), "kept": kc}
        start = st.record("start_baseline")
        if start.get("runs"):
            cap_block["achieved"] = achieved({"config": start.get("config"), **capacity_of(runner, start["runs"])},
                                             (rec or {}).get("config"), rc if rec is not None else {}, (rec or {}).get("capacity") or {})
        twin = twin_table(runner)
        if twin is not None:  # tune --search twin: its predictions beside the measurements
            cap_block["twin"] = twin
    return TuneResult(
        title="vkit tuning report",
        generated=now_iso(),
        simulated=bool((version or {}).get("sim")),
        server={"url": svc.url, "model": svc.model, "version": (version or {}).get("version"),
                "sim": ({"gpu": version.get("sim_gpu"), "model": version.get("sim_model"), "speed": version.get("sim_speed"),
                         "noise": version.get("sim_noise"), "seed": version.get("sim_seed"),
                         # virtual: no process ran; every time (latencies, restarts, the run's) is the simulated accelerator's
                         "virtual": bool(version.get("virtual"))} if (version or {}).get("sim") else None),
                "launch_argv": svc.argv},
        workload={"dataset": opts.dataset_name if not opts.dataset_path else f"{opts.dataset_name} {opts.dataset_path}",
                  "input_len": opts.random_input_len if not opts.dataset_path else None,
                  "output_len": opts.random_output_len, "max_concurrency": opts.max_concurrency if settings.capacity is None else None,
                  "num_prompts": opts.num_prompts, "slo": settings.slo, "lengths": lengths(runner, b)},
        goal=g,
        baseline={"config": b.get("config"), "repeats": len(b.get("runs") or []),
                  "metrics": {k: {"mean": v, "sigma_rel": (b.get("sigma") or {}).get(k)} for k, v in (b.get("metrics") or {}).items()},
                  "sigma_components": b.get("components") or {}},
        trials=trials,
        steps=[{"step": s["step"], "name": s.get("name"), "stop_rule": s.get("stop_rule"), "result": s.get("result"),
                **({"kv_cache": s["kv_cache"]} if s.get("kv_cache") else {})} for s in st.steps],
        knee=delivered.get("knee"),
        pareto=delivered.get("pareto"),
        not_confirmed=delivered.get("not_confirmed") or [],
        recommendation=rec,
        capacity=cap_block,
        stop_rule="; ".join(f"step {s['step']}: {s.get('stop_rule')}" for s in st.steps),
        drift=[{"after_trial": d.get("after_trial"), "changed": d.get("changed"), "runs": d.get("runs"),
                "min_runs": d.get("min_runs"), "detail": d.get("why")} for d in st.drift_checks],
        warnings=warnings + [f"knowledge base: {x}" for x in (tune_run.get("knowledge") or {}).get("ignored", [])[:3]],
        knowledge=tune_run.get("knowledge"),
        soak=soak(runner),
        timings=timings(st.timing, runner.backend.now() - t0, restarts),
    )


def soak(runner: Tune) -> str:
    """The soak recommendation from the drift rate measured on the kept configuration's runs (the
    series the sentinel judges), against the gate's threshold on output throughput at the σ its
    confirmations use (``drift.soak_advice``)."""
    from vkit.decide.drift import soak_advice
    from vkit.decide.runs import parse_date
    from vkit.decide.specs import Settings as GateSettings

    rows = []  # (when, output tok/s, seconds) of each dated run
    for _, doc in runner.sentinel.kept_series():
        when, v, s = parse_date(doc.get("date")), doc.get("output_throughput"), doc.get("duration")
        if when is not None and all(isinstance(x, (int, float)) and x > 0 for x in (v, s)):
            rows.append((when, float(v), float(s)))
    t0 = min((w for w, _, _ in rows), default=None)
    hours = [(w - t0).total_seconds() / 3600 for w, _, _ in rows]
    run_s = float(np.median([s for _, _, s in rows])) if rows else 1.0
    floor = GateSettings().floor
    plan = runner.budget.confirm_plan(Versus(primary="output_throughput:+", guards=()))
    thr = next((m["threshold"] for m in plan.get("metrics") or [] if m["metric"] == "output_throughput"), None)
    return soak_advice(hours, [v for _, v, _ in rows], thr or floor, run_s,
                       threshold_rule=f"max(2σ, {floor:.0%})" if thr else f"the {floor:.0%} floor: no σ measured")["text"]


def timings(t: dict, total_s: float, restarts: int) -> dict:
    """Where the run's wall time went (``t``: the state's time accounting): restarts, measurements, and the rest (gates, waiting)."""
    r, m = t.get("restart") or {}, t.get("run") or {}
    rs, ms = float(r.get("s") or 0.0), float(m.get("s") or 0.0)
    return {"total_s": round(total_s, 1), "restarts": restarts, "restart_s": round(rs, 1), "runs": int(m.get("n") or 0),
            "run_s": round(ms, 1), "other_s": round(max(0.0, total_s - rs - ms), 1)}


def lengths(runner: Tune, baseline: dict) -> dict | None:
    """The request set's token-length distributions, from the baseline's first run."""
    try:
        return (runner.ledger.load((baseline.get("runs") or [])[0]).get("vkit") or {}).get("lengths")
    except (IndexError, OSError, ValueError):
        return None


def achieved(start: dict, config: dict | None, searched: dict, delivered: dict) -> dict | None:
    """What the tune achieved: the starting configuration's capacity and the recommendation's (the
    searches' estimates, each with its 95 % interval; the recommendation's verified promise beside
    it), and the gain, their ratio, with its interval (the two estimates' sds in quadrature)."""
    if not start.get("req_s") or not searched.get("req_s"):
        return None

    def sd(c: dict) -> float:
        lo, hi = c.get("interval") or (None, None)
        return math.log(hi / lo) / (2 * Z95) if lo and hi else 0.0

    g = math.log(searched["req_s"] / start["req_s"])
    s = math.hypot(sd(start), sd(searched))
    return {"start": {"config": start.get("config"), "req_s": start["req_s"], "interval": start.get("interval")},
            "recommendation": {"config": config, "req_s": searched["req_s"], "interval": searched.get("interval"),
                               "verified_req_s": delivered.get("req_s") if delivered.get("verified") else None},
            "gain": math.exp(g) - 1, "gain_interval": [math.exp(g - Z95 * s) - 1, math.exp(g + Z95 * s) - 1]}


def capacity_of(runner: Tune, runs: list[str]) -> dict:
    """A configuration's capacity over its searches (capacity documents): the estimate (the geometric
    mean of the searches' estimates: the figure the promise verifies and the gate compares) with its
    95 % interval (its sd σ of one search as the gate takes it, ``capacity_sigma``: their spread from
    three searches on, else at least their own sd; over the square root of their number), the output tok/s measured at the search nearest it, the binding SLO, and the curve of its
    first search (every load point: verdict, margin, latencies, throughput)."""
    docs = []
    for p in runs or []:
        try:
            d = runner.ledger.load(p)
        except (OSError, ValueError):
            continue
        if isinstance(d.get("slo_capacity"), (int, float)) and d["slo_capacity"] > 0:
            docs.append(d)
    if not docs:
        return {}
    logs = [math.log(d["slo_capacity"]) for d in docs]
    est = float(math.exp(sum(logs) / len(logs)))
    spread = float(np.std(logs, ddof=1)) if len(logs) > 1 else 0.0
    # the gate's rule for σ of one search (its spread from three searches on, else at least their own sd)
    se = capacity_sigma(spread if len(logs) > 1 else None, docs) / math.sqrt(len(docs))
    at = min(docs, key=lambda d: abs(math.log(d["slo_capacity"] / est)))
    vc = (at.get("vkit") or {}).get("capacity") or {}
    holds = [d.get("capacity_holds") for d in docs if isinstance(d.get("capacity_holds"), (int, float))]
    out = {"req_s": est, "interval": [est * math.exp(-Z95 * se), est * math.exp(Z95 * se)],
           "output_tok_s": vc.get("capacity_output_tok_s"), "achieved_req_s": vc.get("capacity_req_s"),
           "at_least": min(holds, default=None),
           "fails": min((d["capacity_fails"] for d in docs if isinstance(d.get("capacity_fails"), (int, float))), default=None),
           "estimate": est, "searches": len(docs),
           "sd": spread if len(logs) > 1 else None,
           "resolution_sd": docs[0].get("slo_capacity_sd"),
           "binding_slo": vc.get("binding_slo"), "stop": vc.get("stop"),
           "per_accelerator": vc.get("per_accelerator"),
           "energy": vc.get("energy"),
           "reference_load": docs[0].get("reference_load"),
           "ref_per_user_output_tok_s": docs[0].get("ref_per_user_output_tok_s"),
           "peak_in_flight": max((d.get("peak_in_flight") or 0) for d in docs),
           "curve": ((docs[0].get("vkit") or {}).get("capacity") or {}).get("curve") or []}
    return out
