"""GuideLLM's benchmarks JSON."""

from __future__ import annotations

import re
from typing import Any

from vkit.validate.formats.common import _clean, _finish, _num, _pkey, _scale, empty_report

NOTE_GUIDELLM = (
    "GuideLLM: its time_per_output_token_ms includes the first token ((last - start)/n = E2EL/n) and is not used; "
    "its inter_token_latency_ms = (last - first)/(n - 1) is vLLM's TPOT and is read as TPOT; "
    "vLLM's per-gap ITL is not reported; request_latency is converted from s to ms."
)
NOTE_GUIDELLM_TOKEN_WEIGHTED = (
    "GuideLLM weights its inter_token_latency_ms distribution by tokens (each request counts n - 1 times: count {n} for "
    "{c} requests); its mean equals vLLM's per-request mean TPOT only when every request has the same output length "
    "(ignore_eos): the count is taken as the {c} requests."
)

_GL_PCT = re.compile(r"p(\d+)")


def _gl_pkey(k: str) -> str | None:
    """GuideLLM percentile names: p001 = 0.1, p01 = 1, p05 = 5, p10 = 10, p999 = 99.9."""
    m = _GL_PCT.fullmatch(k)
    if not m:
        return None
    s = m.group(1)
    if s == "001":
        return "p0.1"
    if s == "999":
        return "p99.9"
    return _pkey(float(s))


def _gl_stats(metric: Any, which: str = "successful") -> dict | None:
    if not isinstance(metric, dict):
        return None
    d = metric.get(which) if isinstance(metric.get(which), dict) else (metric if "mean" in metric else None)
    if d is None:
        return None
    st = {"mean": _num(d.get("mean")), "median": _num(d.get("median")), "std": _num(d.get("std_dev")),
          "min": _num(d.get("min")), "max": _num(d.get("max")), "count": _num(d.get("count"))}
    for k, v in (d.get("percentiles") or {}).items():
        pk = _gl_pkey(str(k))
        if pk and _num(v) is not None:
            st[pk] = _num(v)
    return _clean(st)


def _find_strategy(obj: Any, depth: int = 0) -> dict | None:
    if depth > 4 or not isinstance(obj, dict):
        return None
    t = obj.get("type_") or obj.get("type")
    if t in ("concurrent", "synchronous", "throughput", "constant", "poisson", "async", "asynchronous"):
        return obj
    for k in ("strategy", "scheduler", "config", "args", "profile"):
        s = _find_strategy(obj.get(k), depth + 1)
        if s:
            return s
    return None


def _guidellm(doc: dict, name: str) -> dict:
    rep = empty_report("guidellm", name)
    rep["notes"].append(NOTE_GUIDELLM)
    benches = [b for b in doc["benchmarks"] if isinstance(b, dict) and isinstance(b.get("metrics"), dict)]
    if len(benches) > 1:
        rep["notes"].append(f"the report holds {len(benches)} benchmarks; the last one is checked.")
    b = benches[-1]
    m = b["metrics"]
    totals = m.get("request_totals") or b.get("request_totals") or (b.get("run_stats") or {}).get("requests_made") or {}
    rep["completed"] = _num(totals.get("successful"))
    errored, incomplete = _num(totals.get("errored")) or 0, _num(totals.get("incomplete")) or 0
    rep["failed"] = errored + incomplete if totals else None
    rep["num_prompts"] = _num(totals.get("total"))
    dur = _num(b.get("duration"))
    if dur is None:
        for holder in (b.get("scheduler_metrics"), b.get("run_stats"), b):
            if isinstance(holder, dict):
                s = _num(holder.get("measure_start_time", holder.get("start_time")))
                e = _num(holder.get("measure_end_time", holder.get("end_time")))
                if s is not None and e is not None and e > s:
                    dur = e - s
                    break
    rep["duration_s"] = dur
    lat = _gl_stats(m.get("request_latency"))
    rep["metrics"]["e2el"] = _scale(lat, 1000.0)
    rep["metrics"]["ttft"] = _gl_stats(m.get("time_to_first_token_ms"))
    rep["metrics"]["tpot"] = _gl_stats(m.get("inter_token_latency_ms"))  # GuideLLM's ITL is vLLM's TPOT
    rep["metrics"]["itl"] = None
    tp, c = rep["metrics"]["tpot"], rep["completed"]
    # Real GuideLLM files weight this distribution by tokens: more samples than requests made at all cannot be requests.
    if tp and c and (tp.get("count") or 0) > c + (rep["failed"] or 0):
        rep["notes"].append(NOTE_GUIDELLM_TOKEN_WEIGHTED.format(n=_f0(tp["count"]), c=_f0(c)))
        tp["count"] = c
    pin = _gl_stats(m.get("prompt_token_count"))
    pout = _gl_stats(m.get("output_token_count"))
    rep["mean_input_tokens"] = pin.get("mean") if pin else None
    rep["mean_output_tokens"] = pout.get("mean") if pout else None
    conc = _gl_stats(m.get("request_concurrency"), "total") or _gl_stats(m.get("request_concurrency"))
    rep["mean_in_flight"] = conc.get("mean") if conc else None
    _guidellm_config(doc, b, rep)
    strat = _find_strategy(b) or {}
    kind = strat.get("type_") or strat.get("type")
    if kind == "concurrent":
        streams = strat.get("streams")
        rep["max_concurrency"] = _num(streams[0] if isinstance(streams, list) and streams else streams)
        rep["load"] = "closed"
    elif kind == "synchronous":
        rep["max_concurrency"] = 1
        rep["load"] = "closed"
    elif kind in ("constant", "poisson", "async", "asynchronous"):
        rep["load"] = "open"
        rep["request_rate"] = _num(strat.get("rate"))
    elif kind == "throughput":
        rep["load"] = "burst"
    return _finish(rep)


def _f0(x: float) -> str:
    return f"{x:.0f}"


def _guidellm_config(doc: dict, b: dict, rep: dict) -> None:
    """What GuideLLM 0.8's run configuration says (hand-made or older reports carry none of it):

    - ``benchmarks[].config.backend.stream`` (the backend's ``stream`` setting, default true);
    - the planned request count, ``benchmarks[].config.constraints.max_requests.args.count``: its request_totals
      only count requests that were made, so a run stopped early (max_duration, an interrupt) is visible only here;
    - ``config.spec.data[]`` synthetic_text with a fixed ``output_tokens`` (no stdev/min/max): GuideLLM then sends
      ``max_tokens`` = output_tokens with ``ignore_eos`` true (backends/openai/request_handlers.py)."""
    cfg = b.get("config") if isinstance(b.get("config"), dict) else {}
    spec = ((doc.get("config") or {}).get("spec") or {}) if isinstance(doc.get("config"), dict) else {}
    backend = cfg.get("backend") if isinstance(cfg.get("backend"), dict) else spec.get("backend")
    if isinstance(backend, dict) and isinstance(backend.get("stream"), bool):
        rep["stream"] = backend["stream"]
        rep["stream_source"] = "GuideLLM backend stream setting"
    mr = (cfg.get("constraints") or {}).get("max_requests") if isinstance(cfg.get("constraints"), dict) else None
    planned = _num(((mr or {}).get("args") or {}).get("count")) if isinstance(mr, dict) else None
    if planned is not None:
        rep["num_prompts"] = planned
    data = spec.get("data")
    if isinstance(data, list) and data and all(isinstance(d, dict) for d in data):
        fixed = [d for d in data if d.get("kind") == "synthetic_text" and _num(d.get("output_tokens"))
                 and not any(d.get(k) for k in ("output_tokens_stdev", "output_tokens_min", "output_tokens_max"))]
        if len(fixed) == len(data) and len({d["output_tokens"] for d in fixed}) == 1:
            rep["ignore_eos"] = True
            if rep["completed"]:
                rep["requested_output_tokens"] = _num(fixed[0]["output_tokens"]) * rep["completed"]
