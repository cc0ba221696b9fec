"""AIPerf's ``profile_export_aiperf.json``."""

from __future__ import annotations

import re

from vkit.validate.formats.common import _finish, _median_alias, _num, _pkey, empty_report

NOTE_AIPERF = (
    "AIPerf: time_to_first_token (first content chunk - request start), request_latency (last content chunk - request "
    "start, usage chunk excluded) and inter_token_latency = (request_latency - TTFT)/(OSL - 1) match vLLM's TTFT, E2EL "
    "and TPOT; inter_chunk_latency (pooled gaps between content chunks) is read as vLLM's ITL; its base metrics cover "
    "successful requests only (the adj_* ones count failures as +inf and are not used); output_token_throughput_per_user "
    "= 1/ITL per request is vLLM's 1/TPOT; prefill_throughput_per_user = ISL/TTFT (queue time included)."
)

_AIPERF_MS = {"ms": 1.0, "sec": 1000.0, "s": 1000.0, "us": 0.001, "ns": 1e-6}


def _ap_stats(doc: dict, tag: str) -> dict | None:
    """One AIPerf metric as statistics in ms: avg/std/min/max/pNN/count ("unit" says what the numbers are in)."""
    d = doc.get(tag)
    if not isinstance(d, dict):
        return None
    f = _AIPERF_MS.get(str(d.get("unit", "ms")).lower())
    if f is None:
        return None
    st: dict[str, float] = {}
    for k, v in d.items():
        n = _num(v)
        if n is None or k == "unit" or k == "sum":
            continue
        if k == "avg":
            st["mean"] = n * f
        elif k in ("std", "min", "max"):
            st[k] = n * f
        elif k == "count":
            st["count"] = n
        elif re.fullmatch(r"p\d+(?:\.\d+)?", k):
            st[_pkey(float(k[1:]))] = n * f
    return st or None


def _ap_value(doc: dict, tag: str) -> float | None:
    d = doc.get(tag)
    return _num(d.get("avg")) if isinstance(d, dict) else None


def _ap_rate(doc: dict, tag: str) -> dict | None:
    """A per-request rate distribution (tokens/sec/user) as statistics."""
    d = doc.get(tag)
    if not isinstance(d, dict):
        return None
    st = {("mean" if k == "avg" else k): _num(v) for k, v in d.items()
          if k in ("avg", "std", "min", "max", "count") or re.fullmatch(r"p\d+(?:\.\d+)?", k)}
    st = {(_pkey(float(k[1:])) if re.fullmatch(r"p\d+(?:\.\d+)?", k) else k): v for k, v in st.items() if v is not None}
    return _median_alias(st) if st else None


def _aiperf(doc: dict, name: str) -> dict:
    rep = empty_report("aiperf", name)
    rep["notes"].append(NOTE_AIPERF)
    cfg = doc.get("input_config") if isinstance(doc.get("input_config"), dict) else {}
    ep = cfg.get("endpoint") if isinstance(cfg.get("endpoint"), dict) else {}
    if isinstance(ep.get("streaming"), bool):
        rep["stream"] = ep["streaming"]
        rep["stream_source"] = "input_config.endpoint.streaming"
    ok = _ap_value(doc, "request_count")  # valid (successful) requests
    err = _ap_value(doc, "error_request_count") or 0.0
    done = _ap_value(doc, "completed_request_count")  # successful + failed
    rep["completed"] = ok
    rep["failed"] = err if ok is not None else None
    if ok is None and done is not None:
        rep["completed"] = done - err
    rep["errors"] = {}
    for e in doc.get("error_summary") or []:
        if isinstance(e, dict):
            det = e.get("error_details") if isinstance(e.get("error_details"), dict) else {}
            key = str(det.get("message") or det.get("type") or det.get("code") or "error")[:160]
            rep["errors"][key] = rep["errors"].get(key, 0) + int(_num(e.get("count")) or 0)
    phases = [p for p in (cfg.get("phases") or []) if isinstance(p, dict) and p.get("kind", p.get("name")) == "profiling"]
    ph = phases[0] if phases else {}
    rep["num_prompts"] = _num(ph.get("requests"))
    if doc.get("was_cancelled") is True or doc.get("is_complete") is False:
        rep["partial"] = True
        rep["notes"].append("AIPerf marks this run cancelled or incomplete (was_cancelled / is_complete).")
    if ph.get("type") == "concurrency" and _num(ph.get("concurrency")):
        rep["max_concurrency"] = _num(ph.get("concurrency"))
        rep["load"] = "closed"
    elif _num(ph.get("rate", ph.get("request_rate"))):
        rep["request_rate"] = _num(ph.get("rate", ph.get("request_rate")))
        rep["load"] = "open"
    dur = doc.get("benchmark_duration")
    if isinstance(dur, dict) and _num(dur.get("avg")) is not None:
        rep["duration_s"] = _num(dur["avg"]) * _AIPERF_MS.get(str(dur.get("unit", "sec")).lower(), 1000.0) / 1000.0
    rep["request_throughput"] = _ap_value(doc, "request_throughput")
    rep["output_throughput"] = _ap_value(doc, "output_token_throughput")
    # Token totals: the server's usage figures when AIPerf recorded them (--use-server-token-count, vLLM's own
    # counts), else its client-side tokenisation (total_isl / total_osl).
    tin, tout = _ap_value(doc, "total_usage_prompt_tokens"), _ap_value(doc, "total_usage_completion_tokens")
    if tin is None or tout is None:
        tin, tout = _ap_value(doc, "total_isl"), _ap_value(doc, "total_osl")
        if tin is not None:
            rep["notes"].append("AIPerf token totals from its own tokenizer (total_isl/total_osl), not the server's usage.")
    rep["total_input_tokens"], rep["total_output_tokens"] = tin, tout
    rep["mean_in_flight"] = _ap_value(doc, "effective_concurrency")
    for tag, m in (("time_to_first_token", "ttft"), ("inter_token_latency", "tpot"), ("inter_chunk_latency", "itl"),
                   ("request_latency", "e2el")):
        rep["metrics"][m] = _ap_stats(doc, tag)
    extra = ep.get("extra") if isinstance(ep.get("extra"), dict) else {}
    if extra.get("ignore_eos") in (True, "true", "True", 1):
        rep["ignore_eos"] = True
        osl = None
        for ds in cfg.get("datasets") or []:
            o = ((ds.get("prompts") or {}).get("osl") or {}) if isinstance(ds, dict) else {}
            if _num(o.get("mean")) and not _num(o.get("stddev")):
                osl = _num(o["mean"])
        if osl is not None and rep["completed"]:
            rep["requested_output_tokens"] = osl * rep["completed"]
    phase = rep["phase"]
    pre, dec = _ap_rate(doc, "prefill_throughput_per_user"), _ap_rate(doc, "output_token_throughput_per_user")
    if pre:
        phase["prefill_tok_s"] = pre
        phase["source_prefill_tok_s"] = dict(pre)
    if dec:
        phase["decode_tok_s"] = dec
        phase["source_decode_tok_s"] = dict(dec)
    if pre or dec:
        phase["definitions"] = ("prefill = ISL/TTFT per request (AIPerf prefill_throughput_per_user, queue time included); "
                                "decode = 1/TPOT per request (AIPerf output_token_throughput_per_user = 1/ITL)")
        phase["source_definitions"] = phase["definitions"]
    return _finish(rep)
