"""A configuration's capacity as one measurement (tune's capacity objective): one search
(:func:`vkit.tune.capsearch.search`) on the running server as a document the gate compares
(``slo_capacity`` with its own sd, ``capacity_holds`` and ``capacity_fails``: its 95 % interval), with the figures
at the capacity and at the reference load, the gauge of its runs, and the whole search under
``vkit.capacity``."""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Callable

from vkit.decide.runs import GAUGE_TOP, GAUGE_VKIT
from vkit.measure.benchconfig import BenchConfig
from vkit.tune import boundary, capenergy, capsearch
from vkit.tune.capacity import HOLDS, Capacity, live_measure
from vkit.tune.capplan import Plan, Slo

# The summary fields of one point that describe how it was measured (the gauge), copied into the
# capacity document so that gate compares two capacities only when they were searched the same way.
# (gate's own gauge keys, vkit.decide.runs; the document sets the load's keys itself, and the dataset
# without the per-point request count)
_OWN_TOP = ("num_prompts", "max_concurrency", "request_rate")
_GAUGE_TOP = tuple(k for k in GAUGE_TOP if k not in _OWN_TOP)
_GAUGE_VKIT = tuple(dict.fromkeys(k.split(".")[0] for k in GAUGE_VKIT if k != "dataset"))


def estimate(doc_capacity: dict, plan: Plan) -> tuple[float, float]:
    """(point estimate, its own sd in log units) of a capacity search's answer: the boundary model's
    estimate with its 95 % interval read as a normal sd (:func:`_model_estimate`). A document from
    before the model (no ``estimate``) is read as an interval [capacity, upper] around its middle."""
    model = doc_capacity.get("estimate")
    if model is None:
        lo, hi = doc_capacity.get("capacity"), doc_capacity.get("upper")
        model = {"interval": [lo, hi], "capacity": math.sqrt(lo * hi) if lo and hi else lo or None}
    return _model_estimate(doc_capacity, model, plan)


def _model_estimate(doc_capacity: dict, model: dict, plan: Plan) -> tuple[float, float]:
    """The boundary model's (estimate, sd in log units): its interval as a normal sd. An interval
    open at one end around a crossing: the side the data bound, taken as both; an interval open
    above (every load held): its lower end, with the precision as the sd; nothing held: half the
    lowest load, with a doubling as the sd."""
    lo, hi = model["interval"]
    c = model.get("capacity")
    if c is not None and lo and hi:
        return float(c), math.log(hi / lo) / (2 * boundary.Z95)
    if c is not None and (lo or hi):
        return float(c), abs(math.log((lo or hi) / c)) / boundary.Z95
    if lo:
        return float(lo), math.log1p(plan.precision)
    low = min((p["load"] for p in doc_capacity.get("curve") or []), default=plan.lo_limit)
    return max(plan.lo_limit, min(low, hi or low)) / 2.0, math.log(2.0) / math.sqrt(12.0)


def capacity_document(result: Capacity, first: dict | None, opts, seed: int, reference: float | None,
                      accelerators: int | None = None, prices: capenergy.Prices | None = None) -> dict:
    """A capacity search as one run the gate can compare: ``slo_capacity`` (the estimate) with
    ``slo_capacity_sd`` (its own uncertainty), the figures at the capacity (throughput, latencies)
    and ``ref_*`` at the reference load (interactivity: per-user output tok/s, mean TPOT), the
    whole search under ``vkit.capacity``, and the gauge of the runs it was made of."""
    d = result.as_dict(accelerators, prices)
    est, sd = estimate(d, result.plan)
    pts = {p["load"]: p for p in d["curve"]}
    held, _ = result.measured_at()
    at = (pts.get(held.load) or {}).get("metrics") or {} if held else {}
    if reference is None:
        # the first search of a tune: its own capacity (the highest load it held) becomes the reference load
        reference = held.load if held else None
    ref_pt = pts.get(reference) if reference is not None else None
    ref = (ref_pt or {}).get("metrics") or {}
    valid = [r for p in result.points for r in p.runs if r["valid"]]
    # The most requests in flight at the loads that decide the answer (every point up to the lowest
    # clear failure): a max_num_seqs at or above it never bound there, so it cannot change the answer.
    top = d.get("fails", d["upper"])
    deciding = [r for p in result.points if top is None or p.load <= top for r in p.runs if r["valid"]]
    peak = max((r["metrics"].get("max_concurrent_requests", 0) for r in deciding), default=0)
    first = first or {}
    fv = first.get("vkit") or {}
    doc: dict = {k: first.get(k) for k in _GAUGE_TOP if k in first}
    doc.update({
        "date": time.strftime("%Y%m%d-%H%M%S"),
        "completed": int(sum(r["metrics"].get("completed", 0) for r in valid)),
        "failed": 0,
        "num_prompts": opts.num_prompts,
        "max_concurrency": None,
        "request_rate": f"capacity:{result.plan.mode}",
        "slo_capacity": est,
        "slo_capacity_sd": sd,
        # the ends of the 95 % interval: a load the server holds and one it fails
        "capacity_holds": d["interval"][0],
        "capacity_fails": d["interval"][1],
        "capacity_req_s": d["capacity_req_s"],
        "capacity_output_tok_s": d["capacity_output_tok_s"],
        "output_throughput": at.get("output_throughput"),
        "request_throughput": at.get("request_throughput"),
        "p95_ttft_ms": at.get("p95_ttft_ms"),
        "mean_ttft_ms": at.get("mean_ttft_ms"),
        "mean_tpot_ms": at.get("mean_tpot_ms"),
        "peak_in_flight": peak,
    })
    doc.update(capenergy.document_metrics(d.get("energy") or {}, est))
    if ref_pt is not None:
        doc["reference_load"] = reference
        # interactivity at the reference load means something only where that load holds the SLO
        doc["ref_holds"] = ref_pt.get("verdict") == HOLDS
        for k in ("mean_tpot_ms", "p95_tpot_ms", "p95_ttft_ms", "per_user_output_tok_s", "j_per_output_token"):
            if isinstance(ref.get(k), (int, float)):
                doc[f"ref_{k}"] = ref[k]
    dataset = dict(fv.get("dataset") or {})
    dataset.pop("num_prompts", None)  # a point sends load x point_seconds requests: not part of the gauge
    dataset.pop("trace_speedup", None)  # a trace's points differ in it: the load, not the gauge
    # the gauge, the server facts (its version, the simulator's profile) and the environment's
    # fingerprint of the search's first run
    kept = (*_GAUGE_VKIT, "model", "server", "lengths", "fingerprint")
    doc["vkit"] = {**{k: fv.get(k) for k in kept if k in fv}, "dataset": dataset, "seed": seed,
                   "schema": "vkit.capacity/1", "capacity": d,
                   "valid": d["capacity"] is not None or any(x is not None for x in d["interval"])}
    return doc


def measure_configuration(opts, url: str, out_dir: str, slo: Slo, plan: Plan, reference: float | None,
                          command: list[str] | None = None, api_key: str | None = None, interrupts=None,
                          progress: Callable[[str], None] = lambda s: None, accelerators: int | None = None,
                          seed: int | None = None, hint: float | None = None, launch_argv: list[str] | None = None,
                          bench: Callable[[BenchConfig, str, str], dict] | None = None,
                          prices: capenergy.Prices | None = None) -> dict:
    """One configuration's capacity, searched from the reference load (the neighbouring
    configuration's capacity: the bracket starts where the answer probably is, and the first point
    measures interactivity at that load; ``hint``, where this configuration's capacity probably is, is
    where the search goes next), as :func:`capacity_document`. Its runs use dataset seeds
    from ``opts.seed`` up, one per run; ``seed`` is the measurement's own (the gate pairs on it)."""
    start = reference if reference is not None else plan.start
    # warm start: the answer is probably near the neighbour's, so bracket in small steps around it
    step = max(1.25, 1 + 2 * plan.tolerance) if reference is not None else plan.step
    # a cold start searches from afar (doublings): four more loads and six more runs than a warm one
    p = replace(plan, start=min(plan.hi_limit, max(plan.lo_limit, start)), step=step,
                max_points=plan.max_points if reference is not None else plan.max_points + 4,
                max_runs=plan.max_runs if reference is not None else plan.max_runs + 6)
    inner = live_measure(opts, url, out_dir, p, command=command, api_key=api_key, interrupts=interrupts,
                         launch_argv=launch_argv, bench=bench)
    first: list[dict] = []

    def run(load: float, k: int, requests: int | None = None) -> dict | None:
        s = inner(load, k, requests)  # the search sizes each run: its percentile's error, near the crossing longer
        if s is not None and not first:
            first.append(s)
        return s

    res = capsearch.search(run, slo, p, progress, hint=hint if reference is not None else None)
    return capacity_document(res, first[0] if first else None, opts, opts.seed if seed is None else seed,
                             p.snap(start) if reference is not None else None, accelerators, prices)
