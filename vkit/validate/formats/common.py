"""What every reader shares: the normalised report (``empty_report``, filled in by ``_finish``),
number parsing, statistics keys, distributions (``dist_of``) and per-request records
(``read_records``, ``_norm_record``)."""

from __future__ import annotations

import math
import re
from typing import Any, Iterable

from vkit.errors import UsageError
from vkit.jsonio import load_json_lines

FORMATS = ("vkit", "vllm-bench", "aisbench", "evalscope", "guidellm", "aiperf")
METRICS = ("ttft", "tpot", "itl", "e2el")


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
