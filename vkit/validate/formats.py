"""Read a benchmark report in any of the formats vkit meets and normalise it to one set of
definitions: vLLM's (``vllm bench serve``), so that check_invariants judges every source
with the same invariants.

Formats (``detect`` tells them apart from the content alone):

- ``vkit``: a bench_stream summary (vLLM's ``--save-result`` keys plus ``"vkit"``), with its
  per-request records (JSON Lines) when given or named in ``vkit.records``.
- ``vllm-bench``: ``vllm bench serve --save-result`` JSON, with or without the
  ``--save-detailed`` per-request arrays.
- ``aisbench``: AISBench's perf result ``performances/<model>/<dataset>.json`` (the common
  metrics, values such as ``{"total": "788100.0 ms"}``) with the per-request statistics of
  ``<dataset>.csv`` beside it; the CSV alone, or one JSON holding both tables, also works.
- ``evalscope``: ``evalscope perf``'s ``benchmark_summary.json`` (old and new key names), with
  ``benchmark_percentile.json`` and ``benchmark_args.json`` read from the same directory.
- ``guidellm``: GuideLLM's benchmarks JSON (``benchmarks[].metrics.*`` distributions split into
  successful / incomplete / errored / total).
- ``aiperf``: AIPerf's (NVIDIA, successor of genai-perf) ``profile_export_aiperf.json``: one object per
  metric tag (``{"unit", "avg", "p50", ..., "count"}``) plus ``input_config``, ``was_cancelled``,
  ``is_complete`` and ``error_summary``.

Where a source defines a figure differently from vLLM the normaliser converts it when the
source carries enough to do so, and always says so in ``notes``. Nothing here prints; an
unreadable or unknown input raises ``UsageError`` with a sentence saying what and why.

The normalised report is a plain dict (see ``empty_report``): times in ms unless the key says
``_s``; ``metrics`` holds TTFT, TPOT, ITL and E2EL statistics (``mean``, ``median``, ``std``,
``min``, ``max``, ``pNN``, ``count``) with vLLM's definitions; ``phase`` holds per-request
prefill and decode speeds (tok/s) as distributions.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from typing import Any, Iterable

from vkit.errors import UsageError
from vkit.jsonio import load_json_lines

FORMATS = ("vkit", "vllm-bench", "aisbench", "evalscope", "guidellm", "aiperf")
METRICS = ("ttft", "tpot", "itl", "e2el")

NOTE_VLLM = "vllm bench serve: vLLM's own definitions; nothing converted."
NOTE_AIS = (
    "AISBench: per-request OutputTokenThroughput = output tokens / E2EL (not a decode speed) and "
    "PrefillTokenThroughput = input tokens / TTFT (queue time included); decode is taken as 1/TPOT instead. "
    "AISBench drops the TPOT and ITL rows when every value is zero: a missing row is read as 0."
)
NOTE_EVALSCOPE = (
    "evalscope: TTFT, TPOT = (latency - TTFT)/(tokens - 1) and pooled ITL match vLLM; "
    "'Output (tok/s)' per request is tokens / latency, not a decode speed; 'Input throughput' is "
    "sum(prompt tokens) / sum(TTFT)."
)
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
NOTE_AIPERF = (
    "AIPerf: time_to_first_token (first content chunk - request start), request_latency (last content chunk - request "
    "start, usage chunk excluded) and inter_token_latency = (request_latency - TTFT)/(OSL - 1) match vLLM's TTFT, E2EL "
    "and TPOT; inter_chunk_latency (pooled gaps between content chunks) is read as vLLM's ITL; its base metrics cover "
    "successful requests only (the adj_* ones count failures as +inf and are not used); output_token_throughput_per_user "
    "= 1/ITL per request is vLLM's 1/TPOT; prefill_throughput_per_user = ISL/TTFT (queue time included)."
)


# --------------------------------------------------------------------------- helpers


def _num(v: Any) -> float | None:
    """A number from a number or a string with a unit ("9557.6 ms", "1.67 req/s")."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        f = float(v)
        return f if math.isfinite(f) else None
    m = re.match(r"^\s*(-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)", str(v))
    return float(m.group(1)) if m else None


def _div(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _pkey(p: float) -> str:
    """50 -> 'p50', 99.9 -> 'p99.9'."""
    return "p" + (str(int(p)) if float(p).is_integer() else f"{p:g}")


def _clean(stats: dict) -> dict | None:
    out = {k: v for k, v in stats.items() if v is not None}
    return out or None


def _scale(stats: dict | None, factor: float) -> dict | None:
    if stats is None:
        return None
    return {k: (v if k == "count" else v * factor) for k, v in stats.items()}


def _median_alias(stats: dict | None) -> dict | None:
    """Give ``p50`` and ``median`` each other's value when only one is there."""
    if stats is None:
        return None
    if "median" in stats and "p50" not in stats:
        stats["p50"] = stats["median"]
    elif "p50" in stats and "median" not in stats:
        stats["median"] = stats["p50"]
    return stats


def dist_of(values: Iterable[float | None]) -> dict | None:
    """count/mean/median/std/min/max/p5…p99 of the finite values, or None when none."""
    import numpy as np

    a = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if a.size == 0:
        return None
    out = {"count": int(a.size), "mean": float(a.mean()), "median": float(np.median(a)), "std": float(a.std()),
           "min": float(a.min()), "max": float(a.max())}
    for p in (5, 50, 90, 95, 99):
        out[_pkey(p)] = float(np.percentile(a, p))
    return out


def empty_report(fmt: str, source: str) -> dict:
    return {
        "format": fmt,
        "source": source,
        "notes": [],
        "stream": None,  # what the source says about streaming; None = not recorded
        "stream_source": None,
        "partial": None,
        "completed": None,
        "failed": None,
        "num_prompts": None,
        "duration_s": None,
        "max_concurrency": None,
        "request_rate": None,  # req/s; math.inf = unlimited
        "load": None,  # "closed" (N in flight), "open" (arrival rate), "burst" (all at once), "unknown"; None = infer
        "request_throughput": None,
        "output_throughput": None,
        "total_input_tokens": None,
        "total_output_tokens": None,
        "mean_input_tokens": None,
        "mean_output_tokens": None,
        "metrics": {m: None for m in METRICS},
        "phase": {
            "prefill_tok_s": None,
            "prefill_isolated_tok_s": None,
            "decode_tok_s": None,
            "definitions": None,
            "source_prefill_tok_s": None,  # the source's own per-request figures, as it defines them
            "source_decode_tok_s": None,
            "source_definitions": None,
        },
        "mean_in_flight": None,
        "ignore_eos": None,
        "requested_output_tokens": None,
        "warmups": None,
        "errors": None,
        "server": None,
        "client": None,
        "records": None,
        "records_source": None,
    }


def _finish(rep: dict) -> dict:
    """Fill what follows from what is there (means from totals, rates from duration, load mode)."""
    c = rep["completed"]
    if rep["mean_input_tokens"] is None:
        rep["mean_input_tokens"] = _div(rep["total_input_tokens"], c)
    if rep["mean_output_tokens"] is None:
        rep["mean_output_tokens"] = _div(rep["total_output_tokens"], c)
    if rep["total_input_tokens"] is None and rep["mean_input_tokens"] is not None and c:
        rep["total_input_tokens"] = rep["mean_input_tokens"] * c
    if rep["total_output_tokens"] is None and rep["mean_output_tokens"] is not None and c:
        rep["total_output_tokens"] = rep["mean_output_tokens"] * c
    if rep["request_throughput"] is None:
        rep["request_throughput"] = _div(c, rep["duration_s"])
    if rep["output_throughput"] is None:
        rep["output_throughput"] = _div(rep["total_output_tokens"], rep["duration_s"])
    if rep["duration_s"] is None:
        rep["duration_s"] = _div(c, rep["request_throughput"])
    if rep["load"] is None:
        rate = rep["request_rate"]
        if rep["max_concurrency"] and (rate is None or math.isinf(rate) or rate <= 0):
            rep["load"] = "closed"
        elif rate is not None and math.isfinite(rate) and rate > 0:
            rep["load"] = "open"
        elif rate is not None and math.isinf(rate):
            rep["load"] = "burst"
    for m in METRICS:
        rep["metrics"][m] = _median_alias(rep["metrics"][m])
    _phase_from_summary(rep)
    return rep


def _phase_from_summary(rep: dict) -> None:
    """Per-request prefill/decode from summary statistics when the source gave none.

    prefill = mean input / TTFT (queue time included), decode = 1/TPOT; the median is mapped
    through the same formula (a monotone transform keeps the median a median)."""
    ph = rep["phase"]
    t, tp = rep["metrics"]["ttft"], rep["metrics"]["tpot"]
    mi = rep["mean_input_tokens"]
    if ph["prefill_tok_s"] is None and t and mi:
        d = {k: mi / (t[k] / 1000) for k in ("mean", "p50") if t.get(k)}
        ph["prefill_tok_s"] = d or None
    if ph["decode_tok_s"] is None and tp:
        d = {k: 1000 / tp[k] for k in ("mean", "p50") if tp.get(k)}
        ph["decode_tok_s"] = d or None
    if ph["definitions"] is None:
        ph["definitions"] = "prefill = input/TTFT (queue time included); decode = 1/TPOT (from summary statistics)"


# --------------------------------------------------------------------------- records


def read_records(path: str) -> list[dict]:
    """Per-request records, JSON Lines (bench_stream ``--records``)."""
    out = []
    for n, rec in load_json_lines(path, "records file", "expected one request record a line"):
        if not isinstance(rec, dict):
            raise UsageError(f"{path} line {n} is not a JSON object; expected one request record a line")
        out.append(rec)
    return out


def _norm_record(r: dict) -> dict:
    """A record in vkit's field names, whatever produced it."""
    return {
        "i": r.get("i"),
        "ok": bool(r.get("ok", True)),
        "warmup": bool(r.get("warmup", False)),
        "start_s": _num(r.get("start_s")),
        "ttft_ms": _num(r.get("ttft_ms")),
        "e2el_ms": _num(r.get("e2el_ms")),
        "tpot_ms": _num(r.get("tpot_ms")),
        "prompt_tokens": _num(r.get("prompt_tokens")),
        "completion_tokens": _num(r.get("completion_tokens")),
        "output_len": _num(r.get("output_len")),
        "prefill_tok_s": _num(r.get("prefill_tok_s")),
        "prefill_isolated_tok_s": _num(r.get("prefill_isolated_tok_s")),
        "decode_tok_s": _num(r.get("decode_tok_s")),
        "error": r.get("error"),
    }


# --------------------------------------------------------------------------- detection


_EVALSCOPE_KEYS = {
    "Time taken for tests (s)", "Test Duration (s)", "Succeed requests", "Success Requests",
    "Number of concurrency", "Average latency (s)", "Avg Latency (s)", "Request throughput (req/s)",
    "Req Throughput (req/s)", "Average time to first token (s)", "Expected number of requests",
}
_AIS_COMMON = {"Benchmark Duration", "Total Requests", "Success Requests", "Failed Requests", "Request Throughput",
               "Total Generated Tokens", "Total generated tokens", "Prefill Token Throughput", "Concurrency"}
_AIS_PER_REQ = {"E2EL", "TTFT", "TPOT", "ITL", "InputTokens", "OutputTokens", "OutputTokenThroughput",
                "PrefillTokenThroughput"}


def _is_stage_dict(v: Any) -> bool:
    return isinstance(v, dict) and bool(v) and all(isinstance(k, str) for k in v)


def detect(doc: Any) -> str | None:
    """The format of a parsed report, from its content alone; None when unknown."""
    if isinstance(doc, list):
        if doc and all(isinstance(r, dict) and "Percentiles" in r for r in doc):
            return "evalscope"
        return None
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("vkit"), dict) and "completed" in doc:
        return "vkit"
    if "aiperf_version" in doc or (isinstance(doc.get("input_config"), dict) and isinstance(doc.get("request_latency"), dict)):
        return "aiperf"
    if isinstance(doc.get("benchmarks"), list) and any(
        isinstance(b, dict) and isinstance(b.get("metrics"), dict) for b in doc["benchmarks"]
    ):
        return "guidellm"
    if "completed" in doc and "request_throughput" in doc and any(k.startswith("mean_") and k.endswith("_ms") for k in doc):
        return "vllm-bench"
    ais = [k for k in doc if k in _AIS_COMMON or k in _AIS_PER_REQ]
    if ais and all(_is_stage_dict(doc[k]) for k in ais):
        return "aisbench"
    if any(k in doc for k in _EVALSCOPE_KEYS) or ("Percentiles" in doc and isinstance(doc["Percentiles"], list)):
        return "evalscope"
    return None


# --------------------------------------------------------------------------- loading


def load_report(path: str, fmt: str = "auto", stdin: io.TextIOBase | None = None, records: str | None = None) -> dict:
    """Read, detect and normalise one report. ``path`` ``-`` reads ``stdin``.

    ``records`` (a JSON Lines path) overrides the records file a vkit summary names."""
    if fmt != "auto" and fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}; one of auto, {', '.join(FORMATS)}")
    name = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            import sys

            text = (stdin or sys.stdin).read()
        else:
            with open(path, encoding="utf-8-sig") as f:
                text = f.read()
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory; give the report file (e.g. benchmark_summary.json)") from None
    except OSError as e:
        raise UsageError(f"cannot read {name}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{name} is not a text file; expected a JSON report (or an AISBench CSV)") from None
    if not text.strip():
        raise UsageError(f"{name} is empty; expected a JSON report (did the benchmark before the pipe fail?)")
    base_dir = os.path.dirname(os.path.abspath(path)) if path != "-" else os.getcwd()
    stem_path = None if path == "-" else path
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        if _looks_like_ais_csv(text):
            doc = {"__ais_csv__": text}
            if fmt not in ("auto", "aisbench"):
                raise UsageError(f"{name} is an AISBench CSV, not a {fmt} report") from None
            return _aisbench(doc, name, stem_path)
        raise UsageError(f"{name} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    got = detect(doc)
    if fmt == "auto":
        if got is None:
            raise UsageError(
                f"cannot tell the format of {name}: not a vkit summary, vllm bench serve --save-result JSON, AISBench perf "
                f"result, evalscope perf summary, GuideLLM JSON or AIPerf profile_export_aiperf.json; name it with --format"
            )
        fmt = got
    if fmt == "vkit":
        if not isinstance(doc, dict) or not isinstance(doc.get("vkit"), dict):
            raise UsageError(f"{name} is not a vkit summary (no \"vkit\" object); try --format auto")
        rep = _vkit(doc, name, base_dir, records)
    elif fmt == "vllm-bench":
        if not isinstance(doc, dict) or "completed" not in doc:
            raise UsageError(f"{name} is not a vllm bench serve result (no \"completed\"); try --format auto")
        rep = _vllm_bench(doc, name)
    elif fmt == "aisbench":
        if not isinstance(doc, dict):
            raise UsageError(f"{name} is not an AISBench perf result (expected a JSON object)")
        rep = _aisbench(doc, name, stem_path)
    elif fmt == "evalscope":
        rep = _evalscope(doc, name, stem_path)
    elif fmt == "aiperf":
        if not isinstance(doc, dict) or not isinstance(doc.get("request_latency", doc.get("request_count")), dict):
            raise UsageError(f"{name} is not an AIPerf profile_export_aiperf.json (no \"request_latency\"); try --format auto")
        rep = _aiperf(doc, name)
    else:
        if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
            raise UsageError(f"{name} is not a GuideLLM report (no \"benchmarks\" list); try --format auto")
        rep = _guidellm(doc, name)
    if records is not None and fmt != "vkit":
        rep["records"] = [_norm_record(r) for r in read_records(records)]
        rep["records_source"] = records
    return rep


# --------------------------------------------------------------------------- vLLM keys (vkit, vllm-bench)


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


# --------------------------------------------------------------------------- AISBench

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


# --------------------------------------------------------------------------- evalscope

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


# --------------------------------------------------------------------------- GuideLLM

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


# --------------------------------------------------------------------------- AIPerf

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
