"""AISBench: the perf result JSON and the per-request statistics CSV beside it."""

from __future__ import annotations

import csv
import io
import json
import os
import re
from typing import Any

from vkit.validate.formats.common import _finish, _median_alias, _num, _pkey, empty_report

NOTE_AIS = (
    "AISBench: per-request OutputTokenThroughput = output tokens / E2EL (not a decode speed) and "
    "PrefillTokenThroughput = input tokens / TTFT (queue time included); decode is taken as 1/TPOT instead. "
    "AISBench drops the TPOT and ITL rows when every value is zero: a missing row is read as 0."
)

_AIS_STATS = {"Average": "mean", "Min": "min", "Max": "max", "Median": "median", "N": "count"}


def _looks_like_ais_csv(text: str) -> bool:
    return text.lstrip().startswith("Performance Parameters")


def _ais_stats(row: dict) -> dict:
    st: dict[str, float] = {}
    for k, v in row.items():
        if k in ("Stage", "Performance Parameters") or k is None:
            continue
        key = _AIS_STATS.get(k)
        if key is None:
            m = re.fullmatch(r"P(\d+(?:\.\d+)?)", str(k))
            if not m:
                continue
            key = _pkey(float(m.group(1)))
        n = _num(v)
        if n is not None:
            st[key] = n
    return st


def _ais_stage(v: Any) -> Any:
    """AISBench values are keyed by stage: {"total": x}; take "total" (or the only stage)."""
    if isinstance(v, dict):
        if "total" in v:
            return v["total"]
        if len(v) == 1:
            return next(iter(v.values()))
    return v


def _aisbench(doc: dict, name: str, path: str | None) -> dict:
    rep = empty_report("aisbench", name)
    rep["notes"].append(NOTE_AIS)
    per_req: dict[str, dict] = {}
    common: dict[str, Any] = {}
    csv_text = doc.get("__ais_csv__")
    if csv_text is not None and path is not None:
        side = os.path.splitext(path)[0] + ".json"
        if os.path.exists(side):
            try:
                with open(side, encoding="utf-8-sig") as f:
                    side_doc = json.load(f)
            except (OSError, json.JSONDecodeError):
                side_doc = None
            if isinstance(side_doc, dict):
                doc = {**side_doc, "__ais_csv__": csv_text}
                rep["notes"].append(f"common metrics read from {os.path.basename(side)} beside the CSV.")
    if csv_text is None and path is not None:
        side = os.path.splitext(path)[0] + ".csv"
        if os.path.exists(side):
            with open(side, encoding="utf-8-sig") as f:
                csv_text = f.read()
            rep["notes"].append(f"per-request statistics read from {os.path.basename(side)} beside the JSON.")
    if csv_text is not None:
        for row in csv.DictReader(io.StringIO(csv_text)):
            metric = (row.get("Performance Parameters") or "").strip()
            stage = (row.get("Stage") or "total").strip()
            if metric and stage == "total":
                per_req[metric] = _ais_stats(row)
    for k, v in doc.items():
        if k == "__ais_csv__":
            continue
        val = _ais_stage(v)
        if isinstance(val, dict):  # a per-request metric table in the JSON itself
            per_req.setdefault(k, _ais_stats(val))
        else:
            common[k] = val
    if not per_req:
        rep["notes"].append("no AISBench per-request statistics (the <dataset>.csv beside the JSON): latency checks are skipped.")
    c = _num(common.get("Success Requests"))
    total = _num(common.get("Total Requests"))
    f = _num(common.get("Failed Requests"))
    if c is None and total is not None and f is not None:
        c = total - f
    if c is None and per_req.get("E2EL", {}).get("count") is not None:
        c = per_req["E2EL"]["count"]
    rep["completed"] = c
    rep["failed"] = f if f is not None else (total - c if total is not None and c is not None else None)
    rep["num_prompts"] = total
    dur = _num(common.get("Benchmark Duration"))
    rep["duration_s"] = None if dur is None else dur / 1000
    rep["request_throughput"] = _num(common.get("Request Throughput"))
    rep["output_throughput"] = _num(common.get("Output Token Throughput"))  # Σ output / duration, as vLLM's
    rep["total_input_tokens"] = _num(common.get("Total Input Tokens"))
    rep["total_output_tokens"] = _num(common.get("Total Generated Tokens", common.get("Total generated tokens")))
    rep["mean_in_flight"] = _num(common.get("Concurrency"))  # Σ E2EL / duration
    mc = _num(common.get("Max Concurrency"))
    rep["max_concurrency"] = mc
    # AISBench's JSON does not record the load mode (batch_size and request_rate live in its config), and
    # "Max Concurrency" is the peak observed; Little's law needs --closed-loop N.
    rep["load"] = "unknown"
    rep["mean_input_tokens"] = per_req.get("InputTokens", {}).get("mean")
    rep["mean_output_tokens"] = per_req.get("OutputTokens", {}).get("mean")
    for src, m in (("TTFT", "ttft"), ("TPOT", "tpot"), ("ITL", "itl"), ("E2EL", "e2el")):
        if src in per_req:
            rep["metrics"][m] = dict(per_req[src])
    if "E2EL" in per_req:
        for src, m in (("TPOT", "tpot"), ("ITL", "itl")):
            if src not in per_req:
                rep["metrics"][m] = {"mean": 0.0, "count": per_req["E2EL"].get("count", c)}
                rep["notes"].append(f"AISBench reported no {src} row: read as 0 (it drops rows whose values are all zero).")
    ph = rep["phase"]
    if "PrefillTokenThroughput" in per_req:
        ph["prefill_tok_s"] = _median_alias(dict(per_req["PrefillTokenThroughput"]))
        ph["source_prefill_tok_s"] = dict(per_req["PrefillTokenThroughput"])
    if "OutputTokenThroughput" in per_req:
        ph["source_decode_tok_s"] = dict(per_req["OutputTokenThroughput"])
    ph["source_definitions"] = "AISBench: prefill = input/TTFT, 'decode' = OutputTokenThroughput = output/E2EL (per request)"
    ph["definitions"] = "prefill = input/TTFT per request (AISBench PrefillTokenThroughput, queue time included); decode = 1/TPOT"
    return _finish(rep)
