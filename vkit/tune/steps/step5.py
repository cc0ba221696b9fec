"""Step 5: behaviour flags validated on their own workloads (a mixed long/short one; priorities)."""

from __future__ import annotations

import math
from typing import Any, Callable

from vkit.state import now_iso
from vkit.tune.compare import Versus
from vkit.tune.config import Workload
from vkit.tune.context import Tune
from vkit.tune.ledger import Status
from vkit.tune.steps.common import STEP_NAMES, finished_step, record_step
from vkit.tune.steps.screening import refuse_underpowered, screened_effect
from vkit.tune.steps.step1 import step1_workload

# Seed 000's step 5 adds the production flags and validates them; vLLM V1 has chunked prefill and
# prefix caching on unless told otherwise, so only a configuration that turned one off has a flip.
PRODUCTION_FLAGS = ("enable_chunked_prefill", "enable_prefix_caching")


def workload_priorities(w: Workload) -> list[int]:
    """The distinct ``priority`` values of the workload's own prompt file (none for synthetic prompts)."""
    o = w.options
    if o.dataset_name not in ("jsonl", "trace") or not o.dataset_path:
        return []
    from vkit.measure.datasets import jsonl_requests
    reqs = jsonl_requests(o.dataset_path, None, o.random_output_len, False)
    return sorted({r.extra["priority"] for r in reqs if "priority" in (r.extra or {})})


def step5_flips(kept: dict, priorities: list[int]) -> tuple[list[tuple[str, Any]], list[str]]:
    """What step 5 validates: each production flag turned on where the kept configuration has it off,
    and ``scheduling_policy priority`` only when the workload carries two or more priority classes
    (on any other workload it cannot differ from fcfs). Returns (flips, why each other one is not run)."""
    flips, not_run = [], []
    for f in PRODUCTION_FLAGS:
        if kept.get(f, True) is False:
            flips.append((f, True))
        else:
            not_run.append(f"{f} is already on")
    if kept.get("scheduling_policy", "fcfs") == "priority":
        not_run.append("scheduling_policy is already priority")
    elif len(priorities) >= 2:
        flips.append(("scheduling_policy", "priority"))
    else:
        not_run.append("scheduling_policy priority: the workload has "
                       + (f"one priority class ({priorities[0]})" if priorities else "no priority classes"))
    return flips, not_run


def run_step5(runner: Tune, mixed: Workload, progress: Callable[[str], None]) -> dict:
    """Behaviour flags as a validation (seed 000, step 5): each production flag the kept configuration
    has off is turned on and measured on a mixed long/short workload; the priority policy is measured
    on the business's own prompts, and only when they carry priority classes. A flip must not buy
    P99 TTFT with a throughput loss; it is kept only if the gate accepts it. Nothing to validate:
    no baseline, no restart."""
    done = finished_step(runner, "5")
    if done:
        return done
    kept = runner.ledger.kept_config()
    prios = workload_priorities(runner.s.workload)
    flips, not_run = step5_flips(kept, prios)
    rec: dict[str, Any] = {"step": "5", "name": STEP_NAMES["5"], "not_run": not_run}
    if not flips:
        rec.update(trials=[], result="nothing to validate: " + "; ".join(not_run),
                   stop_rule="the production flags are on and the workload has no priority classes", finished=now_iso())
        record_step(runner, rec)
        progress(f"step 5: {rec['result']}")
        return rec
    primary, guards = "p99_ttft_ms:-", ("output_throughput:+:5%",)
    prio_w = step1_workload(runner) or runner.s.workload  # the business prompts, closed loop
    workloads = {"baseline_mixed": mixed, "baseline_priority": prio_w}  # each flip's workload, by its baseline key
    arms: dict[str, list] = {}
    for n, v in flips:
        arms.setdefault("baseline_priority" if n == "scheduling_policy" else "baseline_mixed", []).append((n, v))
    results, trials = [], []
    for key, arm_flips in arms.items():
        w = workloads[key]
        versus = Versus(workload=w, key=key, primary=primary, guards=guards)
        runner.baselines.measure(versus=versus)
        ids = []
        for name, value in arm_flips:
            st = runner.ledger.tune()
            cfg = dict(st.kept_config, **{name: value})
            t = next((x for x in st.trials(step="5") if x["config"] == cfg), None)
            if t is None:
                t = runner.trials.new("5", cfg, f"validate {name}={value} on the {w.name} workload: P99 TTFT, throughput loss <= 5%")
            runner.trials.run(t["id"], versus)
            ids.append(t["id"])
        arm_trials = [t for t in runner.ledger.trials() if t["id"] in ids]
        trials += arm_trials
        best = None
        for t in arm_trials:
            if t["status"] == Status.DONE and t.get("valid") and t.get("verdict") == "accept":
                if best is None or t["metrics"].get("p99_ttft_ms", math.inf) < best["metrics"].get("p99_ttft_ms", math.inf):
                    best = t
        if best is not None:
            conf = runner.confirmer.confirm_and_keep(best["id"], selected_from=len(arm_trials), versus=versus,
                                                     effect=screened_effect(runner, best, arm_trials, versus))
            rec.setdefault("confirmed", []).append({"trial_id": best["id"], "decision": conf.get("decision"), "why": conf.get("why")})
            refuse_underpowered(runner, rec, conf, progress)
            results.append(f"{best['id']} {conf.get('decision')}")
        else:
            results.append(f"{', '.join(f'{n}={v}' for n, v in arm_flips)}: no flip improved P99 TTFT without costing throughput")
    rec.update(trials=[t["id"] for t in trials], result="; ".join(results),
               stop_rule=f"{len(flips)} flag flip(s) validated ({', '.join(f'{n}={v}' for n, v in flips)}); not run: {'; '.join(not_run) or 'none'}")
    runner.seat.settle()
    rec["finished"] = now_iso()
    record_step(runner, rec)
    progress(f"step 5 done: {rec['result']}")
    return rec
