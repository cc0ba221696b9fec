"""evalscope perf: ``benchmark_summary.json``, with ``benchmark_percentile.json`` and ``benchmark_args.json`` beside it."""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

from vkit.validate.formats.common import METRICS, _finish, _median_alias, _num, _pkey, empty_report

NOTE_EVALSCOPE = (
    "evalscope: TTFT, TPOT = (latency - TTFT)/(tokens - 1) and pooled ITL match vLLM; "
    "'Output (tok/s)' per request is tokens / latency, not a decode speed; 'Input throughput' is "
    "sum(prompt tokens) / sum(TTFT)."
)

_ES_SUMMARY = {
    "duration_s": ("Time taken for tests (s)", "Test Duration (s)"),
    "concurrency": ("Number of concurrency", "Concurrency"),
    "rate": ("Request rate (req/s)", "Request Rate (req/s)"),
    "total": ("Total requests", "Total Requests"),
    "succeed": ("Succeed requests", "Success Requests"),
    "failed": ("Failed requests", "Failed Requests"),
    "req_tput": ("Request throughput (req/s)", "Req Throughput (req/s)"),
    "out_tput": ("Output token throughput (tok/s)", "Output Throughput (tok/s)"),
    "latency_s": ("Average latency (s)", "Avg Latency (s)"),
    "in_tok": ("Average input tokens per request", "Avg Input Tokens"),
    "out_tok": ("Average output tokens per request", "Avg Output Tokens"),
}
# (key, factor to ms)
_ES_MEANS = {
    "ttft": (("Average time to first token (s)", 1000.0), ("TTFT (ms)", 1.0)),
    "tpot": (("Average time per output token (s)", 1000.0), ("TPOT (ms)", 1.0)),
    "itl": (("Average inter-token latency (s)", 1000.0), ("ITL (ms)", 1.0)),
}
_ES_PCT = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "Latency"}


def _es_get(d: dict, names: tuple[str, ...]) -> Any:
    for n in names:
        if n in d:
            return d[n]
    return None


def _es_rows(pct: Any) -> list[dict]:
    """benchmark_percentile.json as a list of rows (it is written transposed; older ones are columns)."""
    if isinstance(pct, list):
        return [r for r in pct if isinstance(r, dict)]
    if isinstance(pct, dict) and isinstance(pct.get("Percentiles"), list):
        n = len(pct["Percentiles"])
        return [{k: (v[i] if isinstance(v, list) and i < len(v) else None) for k, v in pct.items()} for i in range(n)]
    return []


def _es_column(rows: list[dict], col: str, factor: float = 1.0) -> dict | None:
    """One column of the percentile rows as statistics: {"p50": …, "p99": …, "min": …, "max": …}."""
    st: dict[str, float] = {}
    for r in rows:
        p = str(r.get("Percentiles", "")).strip()
        v = _num(r.get(col))
        if v is None:
            continue
        if p.endswith("%"):
            q = _num(p[:-1])
            if q is not None:
                st[_pkey(q)] = v * factor
        elif p.lower() in ("min", "max"):
            st[p.lower()] = v * factor
    return st or None


def _es_percentiles(rows: list[dict], label: str) -> dict | None:
    """Statistics of a timing column: 'TTFT (s)' or 'TTFT (ms)', in ms."""
    for r in rows:
        for k in r:
            m = re.fullmatch(rf"{re.escape(label)} \((s|ms)\)", str(k))
            if m:
                return _es_column(rows, k, 1000.0 if m.group(1) == "s" else 1.0)
    return None


def _evalscope(doc: Any, name: str, path: str | None) -> dict:
    rep = empty_report("evalscope", name)
    rep["notes"].append(NOTE_EVALSCOPE)
    summary: dict = {}
    rows: list[dict] = []
    args: dict = {}
    if isinstance(doc, list) or (isinstance(doc, dict) and "Percentiles" in doc):
        rows = _es_rows(doc)
    elif isinstance(doc, dict):
        summary = doc
    d = os.path.dirname(os.path.abspath(path)) if path else None
    if d:
        for fname, kind in (("benchmark_summary.json", "summary"), ("benchmark_percentile.json", "pct"), ("benchmark_args.json", "args")):
            p = os.path.join(d, fname)
            if not os.path.exists(p) or os.path.abspath(p) == os.path.abspath(path or ""):
                continue
            try:
                with open(p, encoding="utf-8") as f:
                    side = json.load(f)
            except (OSError, json.JSONDecodeError):
                rep["notes"].append(f"{fname} beside the report could not be read; ignored.")
                continue
            if kind == "summary" and not summary and isinstance(side, dict):
                summary = side
            elif kind == "pct" and not rows:
                rows = _es_rows(side)
            elif kind == "args" and isinstance(side, dict):
                args = side
    g = lambda key: _num(_es_get(summary, _ES_SUMMARY[key]))  # noqa: E731
    c = g("succeed")
    rep["completed"] = c
    rep["failed"] = g("failed")
    # Planned count: benchmark_args "number" (evalscope's "Total Requests" counts only requests that ended).
    rep["num_prompts"] = _num(args.get("number")) or g("total")
    rep["duration_s"] = g("duration_s")
    rep["request_throughput"] = g("req_tput")
    rep["output_throughput"] = g("out_tput")
    rep["mean_input_tokens"] = g("in_tok")
    rep["mean_output_tokens"] = g("out_tok")
    conc = g("concurrency") or _num(args.get("parallel"))
    rep["max_concurrency"] = conc
    rate = g("rate")
    if rate is None:
        rate = _num(args.get("rate"))
    rep["request_rate"] = math.inf if rate is None or rate <= 0 else rate
    for m, alts in _ES_MEANS.items():
        for key, factor in alts:
            v = _num(summary.get(key))
            if v is not None and v >= 0:  # evalscope writes -1 for "not computed"
                rep["metrics"][m] = {"mean": v * factor}
                break
    lat = g("latency_s")
    if lat is not None and lat >= 0:
        rep["metrics"]["e2el"] = {"mean": lat * 1000}
    for m, label in _ES_PCT.items():
        st = _es_percentiles(rows, label)
        if st:
            rep["metrics"][m] = {**(rep["metrics"][m] or {}), **st}
    for m in METRICS:
        if rep["metrics"][m] is not None and c is not None:
            rep["metrics"][m]["count"] = c
    dec = _es_column(rows, "Decode (tok/s)")
    if dec:
        rep["phase"]["decode_tok_s"] = _median_alias(dec)
    out_rate = _es_column(rows, "Output (tok/s)")
    if out_rate:
        rep["phase"]["source_decode_tok_s"] = _median_alias(out_rate)
        rep["phase"]["source_definitions"] = "evalscope: 'Output (tok/s)' = output tokens / latency (per request)"
    # Streaming: benchmark_args.json says it; newer summaries count non-streamed requests.
    if "stream" in args:
        rep["stream"] = bool(args["stream"])
        rep["stream_source"] = "benchmark_args.json stream"
    for k, v in summary.items():
        if re.search(r"non.?stream", str(k), re.I) and (_num(v) or 0) > 0:
            rep["stream"] = False
            rep["stream_source"] = f"summary {k!r} = {v}"
    extra = args.get("extra_args") if isinstance(args.get("extra_args"), dict) else {}
    mx, mn = _num(args.get("max_tokens")), _num(args.get("min_tokens"))
    if extra.get("ignore_eos") or (mx is not None and mn is not None and mx == mn):
        rep["ignore_eos"] = True
        if mx is not None and c:
            rep["requested_output_tokens"] = mx * c
    if not args:
        rep["notes"].append("no benchmark_args.json beside the summary: whether it streamed is judged from the numbers alone.")
    return _finish(rep)
