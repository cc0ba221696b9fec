"""bench_stream's summary of one run (``summarize``): ``vllm bench serve``'s keys, vkit's own
fields under ``"vkit"``, and one record per request (warm-ups included, marked)."""

from __future__ import annotations

import datetime as _dt
import math
from typing import Any

from vkit.measure.benchconfig import BenchConfig
from vkit.measure.client import Result
from vkit.measure.runse import run_log_se
from vkit.measure.summary import (
    describe_ms,
    dist,
    goodput_ok,
    max_overlap,
    mean_in_flight,
    peak_per_second,
    queue_growth,
    tpot_of,
)


def summarize(
    cfg: BenchConfig,
    model: str,
    results: list[Result],
    warm: list[Result],
    t0: float,
    t_end: float,
    partial: bool,
    server_delta: dict | None,
    extra: dict,
) -> tuple[dict, list[dict]]:
    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    duration = t_end - t0
    if ok:
        duration = max(r.start + (r.done or r.latency or 0) for r in ok) - t0  # send of the first to end of the last
    duration = max(duration, 1e-9)  # interrupted before anything was sent: no time, no throughput
    intervals = [(r.start - t0, r.start - t0 + (r.done or r.latency)) for r in ok]
    s = _vllm_keys(cfg, model, results, ok, failed, t0, duration, intervals)
    queue_ms = ((server_delta or {}).get("queue") or {}).get("mean_ms")
    records, phase = _records(results, warm, ok, t0, queue_ms)
    s["vkit"] = _vkit_fields(cfg, model, results, warm, ok, failed, partial, duration, intervals, phase, queue_ms, extra)
    return s, records


def _vllm_keys(cfg: BenchConfig, model: str, results: list[Result], ok: list[Result], failed: list[Result], t0: float,
               duration: float, intervals: list[tuple[float, float]]) -> dict[str, Any]:
    """The keys and definitions of ``vllm bench serve --save-result``."""
    ttfts = [r.ttft for r in ok]
    e2els = [r.latency for r in ok]
    tpots = [t for t in (tpot_of(r.latency, r.ttft, r.completion_tokens) for r in ok) if t is not None]
    itls = [g for r in ok for g in r.itl]
    in_tok = sum(r.prompt_tokens or 0 for r in ok)
    out_tok = sum(r.completion_tokens or 0 for r in ok)
    good = None
    if cfg.goodput_slo_ms:
        good = sum(goodput_ok(r.ttft, tpot_of(r.latency, r.ttft, r.completion_tokens), r.latency, cfg.goodput_slo_ms) for r in ok)
    rate = cfg.request_rate
    s: dict[str, Any] = {
        "date": _dt.datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": "openai-chat" if cfg.endpoint == "chat" else "vllm",
        "backend": "openai-chat" if cfg.endpoint == "chat" else "vllm",
        "label": None,
        "model_id": model,
        "tokenizer_id": model,
        "num_prompts": len(cfg.requests) if cfg.duration_s is None else len(results),
        "request_rate": "inf" if math.isinf(rate) else rate,
        "burstiness": cfg.burstiness,
        "max_concurrency": cfg.max_concurrency,
        "duration": duration,
        "completed": len(ok),
        "failed": len(failed),
        "total_input_tokens": in_tok,
        "total_output_tokens": out_tok,
        "request_throughput": len(ok) / duration,
        "request_goodput": None if good is None else good / duration,
        "output_throughput": out_tok / duration,
        "total_token_throughput": (in_tok + out_tok) / duration,
        "max_output_tokens_per_s": peak_per_second(r.start + t for r in ok for t in r.event_times),
        "max_concurrent_requests": max_overlap(intervals),
    }
    s.update(describe_ms(ttfts, "ttft"))
    s.update(describe_ms(tpots, "tpot"))
    s.update(describe_ms(itls, "itl"))
    s.update(describe_ms(e2els, "e2el"))
    return s


def _records(results: list[Result], warm: list[Result], ok: list[Result], t0: float,
             queue_ms: float | None) -> tuple[list[dict], dict[str, list[float]]]:
    """One record per request, and the per-request prefill, isolated prefill and decode speeds
    of the successful measured ones."""
    records = []
    phase: dict[str, list[float]] = {"prefill_tok_s": [], "prefill_isolated_tok_s": [], "decode_tok_s": []}
    warm_ids, ok_ids = {id(x) for x in warm}, {id(x) for x in ok}  # each request's own result (a list's `in` compared fields: n² of them)
    for r in results + warm:
        req = getattr(r, "request", None)
        tp = tpot_of(r.latency, r.ttft, r.completion_tokens) if r.ok else None
        rec = {
            "i": r.index,
            "id": r.rid,
            "warmup": id(r) in warm_ids,
            "ok": r.ok,
            "status": r.status,
            "error": r.error,
            "start_s": r.start - t0 if r.start else None,
            "ttft_ms": None if r.ttft is None else r.ttft * 1000,
            "e2el_ms": None if r.latency is None else r.latency * 1000,
            "done_ms": None if r.done is None else r.done * 1000,
            "tpot_ms": None if tp is None else tp * 1000,
            "itl_ms": [g * 1000 for g in r.itl],
            "events": r.events,
            "input_len": getattr(req, "input_len", None),
            "output_len": getattr(req, "output_len", None),
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens,
            "finish_reason": r.finish_reason,
            "dispatch_lag_ms": getattr(r, "dispatch_lag", 0.0) * 1000,
            "class": (getattr(req, "extra", None) or {}).get("class"),
            "priority": (getattr(req, "extra", None) or {}).get("priority"),
        }
        if r.ok and id(r) in ok_ids:
            if r.prompt_tokens and r.ttft:
                rec["prefill_tok_s"] = r.prompt_tokens / r.ttft
                phase["prefill_tok_s"].append(rec["prefill_tok_s"])
                if queue_ms is not None and r.ttft * 1000 > queue_ms:
                    rec["prefill_isolated_tok_s"] = r.prompt_tokens / (r.ttft - queue_ms / 1000)
                    phase["prefill_isolated_tok_s"].append(rec["prefill_isolated_tok_s"])
            if tp:
                rec["decode_tok_s"] = 1.0 / tp
                phase["decode_tok_s"].append(rec["decode_tok_s"])
        records.append(rec)
    return records, phase


def completion_rate(intervals: list[tuple[float, float]]) -> float | None:
    """Requests completed per second between the first completion and the last: the offered rate
    when the server keeps up (completions follow the arrivals), the server's own service rate when
    it does not (the queue grows and the completions come as fast as the server can make them),
    however short the run."""
    return _rate([e for _, e in intervals])


def send_rate(intervals: list[tuple[float, float]]) -> float | None:
    """Requests sent per second between the first send and the last: the rate these requests
    actually arrived at. A Poisson schedule's realised rate over n requests departs from its nominal
    rate by about 1/sqrt(n) (16 % over 40), so a server is judged to keep up by its completions
    against this rate, not against the nominal one."""
    return _rate([s for s, _ in intervals])


def _rate(times: list[float]) -> float | None:
    t = sorted(times)
    if len(t) < 2 or t[-1] <= t[0]:
        return None
    return (len(t) - 1) / (t[-1] - t[0])


def _vkit_fields(cfg: BenchConfig, model: str, results: list[Result], warm: list[Result], ok: list[Result],
                 failed: list[Result], partial: bool, duration: float, intervals: list[tuple[float, float]],
                 phase: dict[str, list[float]], queue_ms: float | None, extra: dict) -> dict:
    """The summary's ``"vkit"`` object: the gauge, errors, phase speeds, the TTFT trend over the run
    (``queue_growth``: did the server's queue grow within it), and ``cfg.meta`` and ``extra``."""
    errors: dict[str, int] = {}
    for r in failed:
        key = (r.error or "unknown")[:160]
        errors[key] = errors.get(key, 0) + 1
    requested = [getattr(getattr(r, "request", None), "output_len", None) for r in ok]
    return {
        "schema": "vkit.bench_stream/1",
        "stream": cfg.stream,
        "partial": partial,
        "endpoint": cfg.endpoint,
        "model": model,
        "warmups": len(warm),
        "goodput_slo_ms": cfg.goodput_slo_ms,
        "errors": errors,
        "mean_in_flight": mean_in_flight(intervals, duration),
        "completion_rate": completion_rate(intervals),
        "send_rate": send_rate(intervals),
        "queue_growth": queue_growth([r.start for r in ok], [r.ttft for r in ok]),
        "se_log": _se_log(ok),
        "requested_output_tokens": sum(x for x in requested if x) if all(requested) else None,
        "ignore_eos": bool(cfg.requests and cfg.requests[0].ignore_eos),
        "time_to_done": describe_ms([r.done for r in ok if r.done is not None], "done"),
        "phase": {
            "prefill_tok_s": dist(phase["prefill_tok_s"]),
            "prefill_isolated_tok_s": dist(phase["prefill_isolated_tok_s"]),
            "decode_tok_s": dist(phase["decode_tok_s"]),
            "queue_ms_server_mean": queue_ms,
            "definitions": "prefill = input/TTFT; isolated = input/(TTFT - server mean queue time); decode = 1/TPOT (per request)",
        },
        "dispatch_lag_ms": dist([getattr(r, "dispatch_lag", 0.0) * 1000 for r in results if hasattr(r, "dispatch_lag")]),
        **cfg.meta,
        **extra,
    }


def _se_log(ok: list[Result]) -> dict[str, float]:
    """The SE of each latency statistic's log, autocorrelation included (vkit.measure.runse), requests in send order."""
    order = sorted(ok, key=lambda r: r.start)
    return run_log_se({"ttft": [r.ttft for r in order],
                       "tpot": [tpot_of(r.latency, r.ttft, r.completion_tokens) for r in order],
                       "e2el": [r.latency for r in order]})
