"""The gpu-memory-utilization step: the highest value that starts, then one that survives the load, validated."""

from __future__ import annotations

from typing import Any, Callable

from vkit.apply import launcher
from vkit.apply.policy import Policy
from vkit.search import gpumem
from vkit.state import now_iso
from vkit.tune.context import Tune
from vkit.tune.ledger import PROBING, Status
from vkit.tune.steps.common import STEP_NAMES, finished_step, primary_metric, record_step
from vkit.tune.steps.delivery import versus_kept
from vkit.tune.steps.screening import refuse_underpowered, screened_effect

# -- step 4m: gpu_memory_utilization ------------------------------------------------------------------
GMU = "gpu_memory_utilization"
# Start failures that answer a gpu_memory_utilization probe (more memory asked for than there is), as the
# launcher diagnoses them from vLLM's own lines: not an environment fault, so not counted toward ABNORMAL.
MEMORY_KINDS = ("oom", "gpu_memory_taken")


def gpu_memory_bounds(runner: Tune, policy: Policy) -> tuple[float, float, str]:
    """(the value known to start, the highest allowed, where the first came from): the kept
    configuration's value, else what the kept server reported (``cache_config_info``) in its baseline's
    runs or, after a keep, in the kept trial's, else the policy's min; the policy's max (S4: 0.98,
    auto_tune.sh's first value)."""
    rule = policy.rule(GMU) or {}
    hi = float(rule.get("max", gpumem.TOP))
    st = runner.ledger.tune()
    kept = st.kept_config
    if kept.get(GMU) is not None:
        return float(kept[GMU]), hi, "the kept configuration's"
    b = st.record("baseline")
    runs = [*((b.get("runs") or []) if b.get("config") == kept else []),
            *(p for t in reversed(st.trials()) if t.get("config") == kept for p in (t.get("runs") or [])[:1])]
    for path in runs:
        try:
            cc = ((runner.ledger.load(path).get("vkit") or {}).get("server") or {}).get("cache_config") or {}
            return float(cc[GMU]), hi, "the kept server's default, from its cache_config_info"
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return float(rule.get("min", 0.5)), hi, "the policy's min (the kept server's own value is not known)"


def kept_kv_tokens(runner: Tune) -> int | None:
    """The KV-cache size (tokens) the kept configuration's last start logged (vLLM's ``GPU KV cache size``):
    the running server's when it is the kept one, else the latest start of it in the decision log."""
    st = runner.served.server()
    kept = st.kept["config"]
    if runner.seat.running_config() == kept and st.startup.get("kv_cache_tokens"):
        return st.startup["kv_cache_tokens"]
    for e in reversed(runner.svc.log.read()):
        cfg = e.get("kept") if e.get("event") == "rolled_back" else e.get("candidate") if e.get("event") == "applied" else None
        if cfg == kept and (e.get("startup") or {}).get("kv_cache_tokens"):
            return e["startup"]["kv_cache_tokens"]
    return None


def _probe_record(t: dict) -> gpumem.Probe:
    diag = t.get("diagnosis") or {}
    return gpumem.Probe(value=float(t["config"][GMU]), started=t["status"] == Status.PROBE_STARTED,
                        kv_cache_tokens=(t.get("startup") or {}).get("kv_cache_tokens"), kind=diag.get("kind"),
                        quote=diag.get("quote"))


def _probes(runner: Tune, kept: dict) -> list[dict]:
    """This step's start probes of the kept configuration (every parameter but the value the same)."""
    rest = {k: v for k, v in kept.items() if k != GMU}
    return [t for t in runner.ledger.trials(step="4m") if t.get("probe")
            and {k: v for k, v in t["config"].items() if k != GMU} == rest]


def probe_start(runner: Tune, value: float, progress: Callable[[str], None]) -> gpumem.Probe:
    """One start of the kept configuration at ``gpu_memory_utilization`` ``value`` (restart_with_rollback:
    a failure rolls back to the kept configuration), recorded as a probe trial; resumable. A failure
    diagnosed as memory (``MEMORY_KINDS``) is the answer the probe asks for: it is logged and not
    counted toward the two-failures-in-a-row ABNORMAL rule (the rollback verified the kept
    configuration); any other failure counts as usual."""
    kept = runner.ledger.kept_config()
    cfg = dict(kept, **{GMU: value})
    t = next((x for x in _probes(runner, kept) if x["config"] == cfg), None)
    if t is not None and t["status"] in PROBING:
        return _probe_record(t)
    if t is None:
        t = runner.trials.new("4m", cfg, f"start probe: does {GMU} {value} start, and what KV cache does it log?")
        runner.sf.tune.update_trial(t["id"], probe=True)
    progress(f"{t['id']} step 4m: start probe {GMU} {value}")
    ok, res = runner.seat.apply(cfg, fresh=True)
    if ok:
        su = res.get("startup") or {}
        kv = su.get("kv_cache_tokens")
        t = runner.sf.tune.update_trial(t["id"], status=Status.PROBE_STARTED, startup=su, finished=now_iso(),
                                why=f"started; GPU KV cache size {kv:,} tokens" if kv else "started (no KV cache size in the log)")
    else:
        diag = res.get("diagnosis") or {}
        t = runner.sf.tune.update_trial(t["id"], status=Status.PROBE_FAILED, valid=False, diagnosis=diag, finished=now_iso(),
                                why=f"does not start ({diag.get('kind')}): {diag.get('quote') or res.get('message')}")
        if diag.get("kind") in MEMORY_KINDS:
            runner.svc.service.forgive_start_failure()
            runner.log("probe_failure", trial=t["id"], config=cfg, kind=diag.get("kind"),
                       why="a gpu_memory_utilization start probe refused for memory: the answer sought, not counted "
                           "toward the two-failures-in-a-row rule (the rollback verified the kept configuration)")
    progress(f"{t['id']} step 4m: {GMU} {value}: {t['why']}")
    return _probe_record(t)


def find_highest_start(runner: Tune, lo: float, hi: float, progress: Callable[[str], None]) -> dict:
    """The highest ``gpu_memory_utilization`` in [lo, hi] that starts (``lo`` known to start), to 0.01, by
    bisection on real starts (``vkit.search.gpumem``): the answer, its KV-cache size, the probes, the
    starts used and auto_tune.sh's count for the same answer. A probe that fails for another reason than
    memory stops the search below it (the answer is then the highest value seen to start)."""
    kept = runner.ledger.kept_config()
    lo_h, hi_h = gpumem.hundredths(lo), gpumem.hundredths(hi)
    probes = [p for p in (_probe_record(t) for t in _probes(runner, kept) if t["status"] in PROBING)
              if lo_h < gpumem.hundredths(p.value) <= hi_h]
    stopped = None
    while True:
        other = next((p for p in probes if not p.started and p.kind not in MEMORY_KINDS), None)
        if other is not None:
            stopped = f"a probe failed for another reason than memory ({other.value}: {other.kind}): the search stops there"
            break
        v = gpumem.next_value(lo, hi, probes)
        if v is None:
            break
        probes.append(probe_start(runner, v, progress))
    best = gpumem.answer(lo, probes)
    kv = next((p.kv_cache_tokens for p in probes if p.started and gpumem.hundredths(p.value) == gpumem.hundredths(best)), None)
    return {"lo": lo, "hi": hi, "value": best, "kv_cache_tokens": kv, "probes": [p.as_dict() for p in probes],
            "starts": len(probes), "rollbacks": sum(1 for p in probes if not p.started),
            "step_down_starts": gpumem.step_down_starts(best, hi), "monotone": gpumem.monotone(lo, probes), "stopped": stopped}


def load_failure(runner: Tune, t: dict) -> list[str]:
    """The evidence that a configuration which started failed under the load (empty: none): the engine
    died during one of its measurements (the tune's ``server_died`` log event, once is enough; check_invariants'
    ``server_died`` when it died again after the restart), requests failed (a run's failed count, or a capacity
    search's load points refused for failed requests), or the server no longer answers /health after the
    measurement (its log's last error quoted)."""
    ev: list[str] = []
    findings = sorted({f for c in t.get("checks") or [] for f in (c.get("findings") or [])})
    if "server_died" in findings:
        ev.append("the engine died during a measurement, and again after a restart (server_died)")
    for e in runner.sf.log.read():
        if e.get("event") == "server_died" and e.get("label") in (t["id"], f"confirm-{t['id']}-B"):
            errs = ", ".join(f"{n}x {m}" for m, n in sorted((e.get("errors") or {}).items(), key=lambda kv: -kv[1])[:2])
            ev.append(f"the engine died during run {e.get('run')}" + (f" ({errs})" if errs else "") + ": restarted and measured again")
    for p in t.get("runs") or []:
        try:
            d = runner.ledger.load(p)
        except (OSError, ValueError):
            continue
        if isinstance(d.get("failed"), int) and d["failed"] > 0:
            errs = "; ".join(f"{n}x {m}" for m, n in sorted(((d.get("vkit") or {}).get("errors") or {}).items(), key=lambda kv: -kv[1])[:2])
            ev.append(f"{p}: {d['failed']} request(s) failed" + (f" ({errs})" if errs else ""))
        for pt in ((d.get("vkit") or {}).get("capacity") or {}).get("curve") or []:
            bad = [w for w in pt.get("invalid") or [] if "request(s) failed" in str(w)]
            if bad:
                ev.append(f"{p}: at load {pt.get('load')}: {bad[0]}")
    st = runner.served.server()
    run = st.running
    if run.get("config") == t["config"] and t.get("runs") and not runner.seat.healthy(st.url):
        quote = launcher.diagnose(launcher.tail(run["log"]))["quote"] if run.get("log") else ""
        ev.append("the server no longer answers /health after the measurement" + (f"; its log: {quote}" if quote else ""))
    return ev


def _rel_gain(new: Any, old: Any) -> float | None:
    return new / old - 1 if isinstance(new, (int, float)) and isinstance(old, (int, float)) and old else None


def _kv_text(kv: dict) -> str:
    a, b = kv.get("kept_tokens"), kv.get("tokens")
    if not a or not b:
        return f"KV cache {b:,} tokens" if b else "KV cache size not logged"
    return f"KV cache {a:,} -> {b:,} tokens ({b - a:+,}, {b / a - 1:+.1%})"


def run_gpu_memory_step(runner: Tune, policy: Policy, progress: Callable[[str], None], budget: int) -> dict:
    """Step 4m (policy S4, before step 4's grid): the highest ``gpu_memory_utilization`` that starts
    (:func:`find_highest_start`), then validated under the load through the normal trial path
    (screening against the kept configuration, then the fresh interleaved confirmation and KEEP or
    REVERT). A value that starts but fails under the load (:func:`load_failure`) is rejected with its
    evidence, and the search steps down by bisection between the kept value and it (at most ``budget``
    validations). The record carries the KV capacity gained (tokens, from vLLM's logged KV size) next
    to the capacity (the primary objective) gained."""
    done = finished_step(runner, "4m")
    if done:
        return done
    st = runner.ledger.tune()
    kept0 = dict(st.kept_config)
    lo, hi, lo_why = gpu_memory_bounds(runner, policy)
    kv_kept = kept_kv_tokens(runner)
    pm = primary_metric(runner)
    b = st.record("baseline")
    base_pm = (b.get("metrics") or {}).get(pm) if b.get("config") == kept0 else None
    rec: dict[str, Any] = {"step": "4m", "name": STEP_NAMES["4m"], "lo": lo, "lo_from": lo_why, "hi": hi}
    if gpumem.hundredths(lo) >= gpumem.hundredths(hi):
        found = {"value": lo, "kv_cache_tokens": kv_kept, "probes": [], "starts": 0, "rollbacks": 0,
                 "step_down_starts": gpumem.step_down_starts(lo, hi), "monotone": True, "stopped": None}
    else:
        found = find_highest_start(runner, lo, hi, progress)
    rec["bisection"] = found
    search_text = (f"bisection between {lo} ({lo_why}) and {hi} (the policy's max) to 0.01: the highest that starts is "
                   f"{found['value']} in {found['starts']} start(s) (+{found['rollbacks']} rollback(s) to the kept configuration); "
                   f"auto_tune.sh's step-down from {hi} by 0.01 would take {found['step_down_starts']}"
                   + (f"; {found['stopped']}" if found.get("stopped") else "")
                   + ("" if found.get("monotone", True) else "; WARNING: a value failed below one that started (not monotone)"))
    kv = {"kept_value": lo, "kept_tokens": kv_kept, "value": found["value"], "tokens": found["kv_cache_tokens"],
          "gained_tokens": (found["kv_cache_tokens"] - kv_kept) if found["kv_cache_tokens"] and kv_kept else None,
          "metric": pm, "metric_gain_screening": None, "metric_gain_confirmed": None, "decision": None}
    validations: list[dict] = []
    result = None
    if gpumem.hundredths(found["value"]) <= gpumem.hundredths(lo):
        result = f"no value above {lo} starts (or {lo} is the policy's max): nothing to validate"
    elif found["kv_cache_tokens"] and kv_kept and found["kv_cache_tokens"] <= kv_kept:
        result = (f"{found['value']} starts but its logged KV cache ({found['kv_cache_tokens']:,} tokens) is no larger than the "
                  f"kept configuration's ({kv_kept:,}): nothing to gain, not validated")
    else:
        result, kv = _validate_gpu_memory(runner, lo, found, kv, kv_kept, base_pm, budget, validations, progress)
    rec.update(kv_cache=kv, validations=validations, result=result,
               trials=[t["id"] for t in runner.ledger.trials(step="4m")],
               stop_rule=search_text + (f"; validated under the load: {'; '.join(v['summary'] for v in validations)}" if validations else ""))
    runner.seat.settle()
    rec["finished"] = now_iso()
    record_step(runner, rec)
    progress(f"step 4m done: {result}; {search_text}")
    return rec


def _validation_trial(runner: Tune, cfg: dict, value: float) -> dict:
    """The validation trial of ``cfg`` (resumed when recorded). When the server runs ``cfg`` on the process
    a start probe left (it served post_start_verify's short request only), that process is measured:
    no restart."""
    st = runner.ledger.tune()
    t = next((x for x in st.trials(step="4m") if not x.get("probe") and x["config"] == cfg), None)
    if t is not None:
        return t
    last_start = st.server.candidate.get("config")  # the service's candidate, as the same read found it
    t = runner.trials.new("4m", cfg, f"validate {GMU} {value} under the load: screening against the kept configuration")
    probe = next((x for x in reversed(_probes(runner, st.kept_config)) if x["status"] == Status.PROBE_STARTED), None)
    if probe is not None and probe["config"] == cfg and runner.seat.running_config() == cfg and last_start == cfg:
        t = runner.sf.tune.update_trial(t["id"], status=Status.APPLIED, startup=probe.get("startup") or {}, reused_probe=probe["id"])
    return t


def _validate_gpu_memory(runner: Tune, lo: float, found: dict, kv: dict, kv_kept: int | None, base_pm: float | None,
                         budget: int, validations: list[dict], progress: Callable[[str], None]) -> tuple[str, dict]:
    """Screen, then confirm, the found value; a load failure rejects it with its evidence and the next
    candidate is the midpoint (0.01 grid) between the kept value and it."""
    pm = kv["metric"]
    ok_h, cand = gpumem.hundredths(lo), found["value"]
    kept = runner.ledger.kept_config()
    while True:
        if len(validations) >= budget:
            return f"budget of {budget} validation(s) spent; nothing kept", kv
        cfg = dict(kept, **{GMU: cand})
        t = _validation_trial(runner, cfg, cand)
        t = runner.trials.run(t["id"])
        ev = load_failure(runner, t)
        cand_kv = (t.get("startup") or {}).get("kv_cache_tokens") or (found["kv_cache_tokens"] if cand == found["value"] else None)
        row: dict[str, Any] = {"trial_id": t["id"], "value": cand, "kv_cache_tokens": cand_kv, "verdict": t.get("verdict"),
                               "metric_gain_screening": _rel_gain((t.get("metrics") or {}).get(pm), base_pm)}
        if not ev and t["status"] == Status.DONE and t.get("valid") and t.get("verdict") in ("accept", "undecided"):
            # the value was chosen by its starts (the bisection), not by its screening: no winner's curse to correct
            conf = runner.confirmer.confirm_and_keep(t["id"], selected_from=len(validations) + 1, effect=screened_effect(runner, t, []))
            row["confirmation"] = {"decision": conf.get("decision"), "why": conf.get("why")}
            refuse_underpowered(runner, {"step": "4m"}, conf, progress)
            row["metric_gain_confirmed"] = versus_kept(runner, conf).get(pm)
            after = load_failure(runner, dict(t, runs=[*(conf.get("b_runs") or [])]))
            if conf.get("decision") == "kept" and after:
                row["warnings"] = after  # kept by the gate, its engine died once in a run measured again: said, not hidden
            elif after:
                ev = after
        if ev:
            runner.sf.tune.update_trial(t["id"], verdict="reject", load_failure=ev,
                                why=f"starts but fails under the load: {'; '.join(ev)}")
            row.update(rejected=True, evidence=ev, summary=f"{cand} rejected under the load ({ev[0]})")
            validations.append(row)
            progress(f"step 4m: {GMU} {cand} starts but fails under the load: {'; '.join(ev)}")
            bad_h = gpumem.hundredths(cand)
            if bad_h - ok_h <= 1:
                return f"{cand} starts but fails under the load, and no value lies between it and the kept {lo}: nothing kept", kv
            cand = gpumem.grid_value(ok_h + (bad_h - ok_h) // 2)  # the bisection steps down
            continue
        kv.update(value=cand, tokens=cand_kv, gained_tokens=(cand_kv - kv_kept) if cand_kv and kv_kept else None,
                  metric_gain_screening=row["metric_gain_screening"], metric_gain_confirmed=row.get("metric_gain_confirmed"),
                  decision=(row.get("confirmation") or {}).get("decision") or f"screening {t.get('verdict') or t['status']}")
        if row.get("metric_gain_confirmed") is not None:
            gain_text = f"{pm} {row['metric_gain_confirmed']:+.1%} on the confirmation's fresh runs"
        elif row["metric_gain_screening"] is not None:
            gain_text = f"{pm} {row['metric_gain_screening']:+.1%} on screening"
        else:
            gain_text = f"{pm} not measured"
        row["summary"] = f"{cand}: {_kv_text(kv)}, {gain_text}, {kv['decision']}"
        validations.append(row)
        if kv["decision"] == "kept":
            warn = f"; WARNING: {'; '.join(row['warnings'])}" if row.get("warnings") else ""
            return f"kept {t['id']} (--gpu-memory-utilization {cand}): {_kv_text(kv)}, {gain_text}{warn}", kv
        why = (row.get("confirmation") or {}).get("why") or t.get("why")
        return f"{cand} not kept ({kv['decision']}: {why}): {_kv_text(kv)}, {gain_text}", kv
