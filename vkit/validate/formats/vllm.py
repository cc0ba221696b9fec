"""vkit bench_stream summaries and ``vllm bench serve --save-result`` JSON: vLLM's own keys."""

from __future__ import annotations

import math
import os
import re

from vkit.validate.formats.common import (
    METRICS,
    _div,
    _finish,
    _median_alias,
    _norm_record,
    _num,
    _pkey,
    dist_of,
    empty_report,
    read_records,
)

NOTE_VLLM = "vllm bench serve: vLLM's own definitions; nothing converted."


def _vllm_stats(doc: dict, metric: str) -> dict | None:
    st: dict[str, float] = {}
    for k, v in doc.items():
        m = re.fullmatch(rf"(mean|median|std|p\d+(?:\.\d+)?)_{metric}_ms", k)
        if m and _num(v) is not None:
            key = m.group(1)
            st[key if not key.startswith("p") else _pkey(float(key[1:]))] = float(_num(v))
    return st or None


def _vllm_common(doc: dict, rep: dict) -> None:
    rep["completed"] = _num(doc.get("completed"))
    rep["failed"] = _num(doc.get("failed"))
    rep["num_prompts"] = _num(doc.get("num_prompts"))
    rep["duration_s"] = _num(doc.get("duration"))
    rep["max_concurrency"] = _num(doc.get("max_concurrency"))
    rr = doc.get("request_rate")
    rep["request_rate"] = math.inf if rr in ("inf", "Infinity", None) or (isinstance(rr, float) and math.isinf(rr)) else _num(rr)
    rep["request_throughput"] = _num(doc.get("request_throughput"))
    rep["output_throughput"] = _num(doc.get("output_throughput"))
    rep["total_input_tokens"] = _num(doc.get("total_input_tokens"))
    rep["total_output_tokens"] = _num(doc.get("total_output_tokens"))
    n = rep["completed"] or 0
    for m in METRICS:
        st = _vllm_stats(doc, m)
        if st is not None and m != "itl":
            st["count"] = n
        rep["metrics"][m] = st


def _vkit(doc: dict, name: str, base_dir: str, records: str | None) -> dict:
    rep = empty_report("vkit", name)
    rep["notes"].append("vkit bench_stream: vLLM's definitions (same keys as vllm bench serve --save-result).")
    _vllm_common(doc, rep)
    v = doc["vkit"]
    rep["stream"] = v.get("stream")
    rep["stream_source"] = "vkit.stream" if v.get("stream") is not None else None
    rep["partial"] = v.get("partial")
    rep["mean_in_flight"] = _num(v.get("mean_in_flight"))
    rep["ignore_eos"] = v.get("ignore_eos")
    rep["requested_output_tokens"] = _num(v.get("requested_output_tokens"))
    rep["warmups"] = _num(v.get("warmups"))
    rep["errors"] = v.get("errors")
    rep["server"] = v.get("server") if isinstance(v.get("server"), dict) else None
    rep["client"] = v.get("client") if isinstance(v.get("client"), dict) else None
    if isinstance(v.get("energy"), dict):
        rep["energy"] = v["energy"]  # board power and energy over the run, read by the energy checks
    ph = v.get("phase") or {}
    for k in ("prefill_tok_s", "prefill_isolated_tok_s", "decode_tok_s"):
        d = ph.get(k)
        rep["phase"][k] = _median_alias(dict(d)) if isinstance(d, dict) else None
    if ph:
        rep["phase"]["definitions"] = ph.get("definitions") or (
            "prefill = input/TTFT; isolated = input/(TTFT - server mean queue time); decode = 1/TPOT (per request)"
        )
        rep["phase"]["queue_ms_server_mean"] = _num(ph.get("queue_ms_server_mean"))
    path = records
    if path is None and v.get("records"):
        named = str(v["records"])
        cand = named if os.path.isabs(named) else os.path.join(base_dir, named)
        if os.path.exists(cand):
            path = cand
        else:
            rep["notes"].append(f"the records file the summary names ({named}) is not there; per-request checks use the summary only.")
    if path is not None:
        rep["records"] = [_norm_record(r) for r in read_records(path)]
        rep["records_source"] = records if records is not None else str(v["records"])
    return _finish(rep)


def _vllm_bench(doc: dict, name: str) -> dict:
    rep = empty_report("vllm-bench", name)
    rep["notes"].append(NOTE_VLLM)
    _vllm_common(doc, rep)
    rep["stream"] = None  # vllm bench serve always streams; it does not record it
    # --save-detailed arrays → per-request records (seconds → ms).
    ttfts, lats = doc.get("ttfts"), doc.get("latencies")
    if isinstance(ttfts, list) and isinstance(lats, list) and len(ttfts) == len(lats) and ttfts:
        ins = doc.get("input_lens") or [None] * len(ttfts)
        outs = doc.get("output_lens") or [None] * len(ttfts)
        errs = doc.get("errors") or [""] * len(ttfts)
        starts = doc.get("start_times") or [None] * len(ttfts)
        recs = []
        for i, (t, lat) in enumerate(zip(ttfts, lats, strict=False)):  # vLLM drops failed requests from some arrays
            err = errs[i] if i < len(errs) else ""
            out = _num(outs[i]) if i < len(outs) else None
            tt, ll = _num(t), _num(lat)
            tpot = None
            if tt is not None and ll is not None and out and out > 1:
                tpot = (ll - tt) / (out - 1) * 1000
            recs.append(_norm_record({
                "i": i, "ok": not err, "error": err or None,
                "start_s": _num(starts[i]) if i < len(starts) else None,
                "ttft_ms": None if tt is None else tt * 1000, "e2el_ms": None if ll is None else ll * 1000,
                "tpot_ms": tpot, "prompt_tokens": _num(ins[i]) if i < len(ins) else None, "completion_tokens": out,
            }))
        if recs and all(r["start_s"] is not None for r in recs):
            t0 = min(r["start_s"] for r in recs)
            for r in recs:
                r["start_s"] -= t0
        rep["records"] = recs
        rep["records_source"] = "--save-detailed arrays"
        ok = [r for r in recs if r["ok"]]
        pre = [_div(r["prompt_tokens"], (r["ttft_ms"] or 0) / 1000) for r in ok]
        dec = [1000 / r["tpot_ms"] for r in ok if r["tpot_ms"]]
        rep["phase"]["prefill_tok_s"] = dist_of(pre)
        rep["phase"]["decode_tok_s"] = dist_of(dec)
        rep["phase"]["definitions"] = "prefill = input/TTFT (queue time included); decode = 1/TPOT (per request, --save-detailed)"
        if rep["metrics"]["e2el"] is None:
            rep["metrics"]["e2el"] = dist_of([r["e2el_ms"] for r in ok])
    elif isinstance(lats, list) and lats and rep["metrics"]["e2el"] is None:
        rep["metrics"]["e2el"] = dist_of([(_num(x) or 0) * 1000 for x in lats])
    return _finish(rep)
