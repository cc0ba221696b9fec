"""Build the golden input reports of tests/test_check_invariants.py (run on purpose only):

    python3 tests/golden/invariants/_make.py

Each report is written by hand-rules from a simulated closed-loop run (seeded, so the files
are stable), in the format of the tool it imitates: vkit bench_stream summaries (+ records),
``vllm bench serve --save-result`` JSON (+ ``--save-detailed`` arrays), AISBench perf results
(<dataset>.json common metrics + <dataset>.csv per-request statistics), evalscope perf
directories (benchmark_summary/percentile/args.json) and GuideLLM benchmarks JSON.
Healthy ones must pass every check; each broken one breaks one invariant on purpose.
The seed's report (seeds/004: 1319 requests at concurrency 16, 62.95 input / 158.54 output
tokens, TTFT ≡ E2EL = 9557.6 ms, prefill 7.07 vs decode 16.78 tok/s; after the fix E2EL
8.96 s, TTFT -88.1%, prefill 70.35 vs decode 18.36) is rebuilt from its numbers as AISBench.
Per-request ITL lists are left out of vkit records to keep the files small.
"""

from __future__ import annotations

import csv
import heapq
import io
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))

from vkit.measure.summary import describe_ms, dist  # noqa: E402


def write(name: str, obj) -> None:
    path = os.path.join(HERE, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        if isinstance(obj, str):
            f.write(obj)
        else:
            f.write(json.dumps(obj, indent=2, sort_keys=False) + "\n")


# --------------------------------------------------------------------------- simulated run


def simulate(n=200, conc=8, in_len=128, out_len=64, ttft_ms=45.0, tpot_ms=12.0, seed=1, stream=True,
             warmups=4, first_wave_extra_ms=0.0, fail=0, fail_kind="503", slots=None):
    """Closed loop: ``slots`` (default conc) workers send back to back. Returns records (vkit fields)."""
    rng = np.random.default_rng(seed)
    slots = slots or conc
    recs = []
    for w in range(warmups):
        recs.append(_rec(-1 - w, True, True, 0.0, 300.0, 300.0 + (out_len - 1) * tpot_ms, in_len, out_len, stream, warm=True))
    free = [(0.0, k) for k in range(slots)]
    heapq.heapify(free)
    fail_at = set(rng.choice(np.arange(10, n), size=fail, replace=False).tolist()) if fail else set()
    for i in range(n):
        t, k = heapq.heappop(free)
        start = t + 0.0002
        ttft = float(ttft_ms * rng.lognormal(0, 0.25))
        if i < conc:
            ttft += first_wave_extra_ms
        tpot = float(tpot_ms * rng.normal(1, 0.04))
        e2el = ttft + (out_len - 1) * tpot
        ok = i not in fail_at
        if not ok and fail_kind == "stall":
            r = _rec(i, False, stream, start, None, 60000.0, in_len, out_len, stream, error="no data for 60 s (stream stalled)")
            r["e2el_ms"] = 60000.0
            dur = 60.0
        elif not ok:
            r = _rec(i, False, stream, start, None, None, in_len, out_len, stream, error="HTTP 503: Service Unavailable")
            dur = 0.003
        else:
            r = _rec(i, True, stream, start, ttft, e2el, in_len, out_len, stream)
            dur = (e2el + 0.4) / 1000
        heapq.heappush(free, (start + dur, k))
        recs.append(r)
    return recs


def _rec(i, ok, stream, start, ttft, e2el, in_len, out_len, _s, warm=False, error=None):
    if ok and not stream:
        ttft = e2el
    tpot = None
    if ok and ttft is not None and e2el is not None and out_len > 1:
        tpot = (e2el - ttft) / (out_len - 1)
    return {
        "i": i, "warmup": warm, "ok": ok, "status": 200 if ok else 503 if error and "503" in error else 200,
        "error": error, "start_s": round(start, 6), "ttft_ms": ttft, "e2el_ms": e2el,
        "done_ms": None if e2el is None else e2el + 0.4, "tpot_ms": tpot, "itl_ms": [],
        "events": out_len if ok and stream else (1 if ok else 0),
        "input_len": in_len, "output_len": out_len, "prompt_tokens": in_len if ok else None,
        "completion_tokens": out_len if ok else None, "finish_reason": "length" if ok else None, "class": None,
    }


def vkit_summary(recs, conc=8, stream=True, queue_ms=5.0, records_name=None, stats_over_all=False, rate="inf",
                 server_ttft_gap_ms=7.0, cpu=0.24, lag_p99=0.8, server_tokens_factor=1.0, num_prompts=None,
                 partial=False, max_model_len=4096):
    runs = [r for r in recs if not r["warmup"]]
    ok = [r for r in runs if r["ok"]]
    failed = [r for r in runs if not r["ok"]]
    warm = [r for r in recs if r["warmup"]]
    duration = max(r["start_s"] + r["done_ms"] / 1000 for r in ok)
    base = runs if stats_over_all else ok
    ttfts = [(r["ttft_ms"] if r["ttft_ms"] is not None else r["e2el_ms"]) / 1000 for r in base if r["e2el_ms"] is not None]
    e2els = [r["e2el_ms"] / 1000 for r in base if r["e2el_ms"] is not None]
    tpots = [r["tpot_ms"] / 1000 for r in ok if r["tpot_ms"] is not None]
    rng = np.random.default_rng(7)
    itls = [] if not stream else list(
        np.repeat([r["tpot_ms"] / 1000 for r in ok], ok[0]["output_len"] - 1) * rng.normal(1, 0.08, len(ok) * (ok[0]["output_len"] - 1)))
    in_tok = sum(r["prompt_tokens"] for r in ok)
    out_tok = sum(r["completion_tokens"] for r in ok)
    s = {
        "date": "20261011-101500", "endpoint_type": "vllm", "backend": "vllm", "label": None, "model_id": "sim-8b",
        "tokenizer_id": "sim-8b", "num_prompts": num_prompts or len(runs), "request_rate": rate, "burstiness": 1.0,
        "max_concurrency": conc, "duration": duration, "completed": len(ok), "failed": len(failed),
        "total_input_tokens": in_tok, "total_output_tokens": out_tok, "request_throughput": len(ok) / duration,
        "request_goodput": None, "output_throughput": out_tok / duration,
        "total_token_throughput": (in_tok + out_tok) / duration,
        "max_output_tokens_per_s": float(round(out_tok / duration * 1.2)), "max_concurrent_requests": conc,
    }
    s.update(describe_ms(ttfts, "ttft"))
    s.update(describe_ms(tpots, "tpot"))
    s.update(describe_ms(itls, "itl"))
    s.update(describe_ms(e2els, "e2el"))
    prefill = [r["prompt_tokens"] / (r["ttft_ms"] / 1000) for r in ok]
    iso = [r["prompt_tokens"] / ((r["ttft_ms"] - queue_ms) / 1000) for r in ok if r["ttft_ms"] > queue_ms]
    decode = [1000 / r["tpot_ms"] for r in ok if r["tpot_ms"]]
    ttft_mean = float(np.mean([r["ttft_ms"] for r in ok]))
    errors: dict = {}
    for r in failed:
        errors[r["error"]] = errors.get(r["error"], 0) + 1
    s["vkit"] = {
        "schema": "vkit.bench_stream/1", "stream": stream, "partial": partial, "endpoint": "completions", "model": "sim-8b",
        "warmups": len(warm), "goodput_slo_ms": None, "errors": errors,
        "mean_in_flight": sum(r["done_ms"] / 1000 for r in ok) / duration,
        "requested_output_tokens": sum(r["output_len"] for r in ok), "ignore_eos": True,
        "time_to_done": describe_ms([r["done_ms"] / 1000 for r in ok], "done"),
        "phase": {
            "prefill_tok_s": dist(prefill), "prefill_isolated_tok_s": dist(iso), "decode_tok_s": dist(decode),
            "queue_ms_server_mean": queue_ms,
            "definitions": "prefill = input/TTFT; isolated = input/(TTFT - server mean queue time); decode = 1/TPOT (per request)",
        },
        "dispatch_lag_ms": {"count": len(runs), "mean": 0.05, "p5": 0.01, "p50": 0.04, "p95": 0.12, "min": 0.0, "max": 0.4},
        "dataset": "random", "seed": 1,
        "server": {
            "url": "http://127.0.0.1:8000", "version": "0.11.0", "model": "sim-8b", "max_model_len": max_model_len,
            "cache_config": {"block_size": "16", "cache_dtype": "auto", "enable_prefix_caching": "False",
                             "gpu_memory_utilization": "0.9", "num_gpu_blocks": "2048", "num_gpu_blocks_override": "None"},
            "metrics_available": True, "families": ["vllm:e2e_request_latency_seconds", "vllm:time_to_first_token_seconds"],
            "peaks": {"scrapes": int(duration), "running_max": conc, "waiting_max": 0, "kv_cache_usage_max": 0.31},
            "delta": {
                "prompt_tokens": in_tok * server_tokens_factor, "generation_tokens": out_tok * server_tokens_factor,
                "preemptions": 0.0, "prefix_cache_queries": in_tok, "prefix_cache_hits": 0.0,
                "request_success": {"length": float(len(ok))},
                "ttft": {"count": len(ok), "mean_ms": ttft_mean - server_ttft_gap_ms, "p50_ms": 40.0, "p95_ms": 75.0, "p99_ms": 95.0},
                "queue": {"count": len(ok), "mean_ms": queue_ms, "p50_ms": 2.5, "p95_ms": 9.5, "p99_ms": 9.9},
                "e2el": {"count": len(ok), "mean_ms": float(np.mean([r["e2el_ms"] for r in ok])) - 6.0,
                         "p50_ms": 750.0, "p95_ms": 950.0, "p99_ms": 990.0},
            },
        },
        "client": {"name": "vkit bench_stream", "version": "0.1.0", "threads": conc, "cpu_s": cpu * duration,
                   "wall_s": duration, "cpu_frac_of_one_core": cpu,
                   "sched_lag": {"p50_ms": 0.08, "p99_ms": lag_p99, "max_ms": lag_p99 * 3, "samples": 4000}},
        "records": records_name,
    }
    return s


def write_records(name, recs):
    write(name, "".join(json.dumps(r, sort_keys=True, separators=(",", ":")) + "\n" for r in recs))


def vllm_bench_of(s, detailed_recs=None, default_percentiles=True):
    """The summary as ``vllm bench serve --save-result`` writes it (vLLM's default: p99 of ttft,tpot,itl only)."""
    out = {k: v for k, v in s.items() if k != "vkit"}
    if default_percentiles:
        for k in list(out):
            if k.startswith("p") and k.endswith("_ms") and not k.startswith("p99_") or k.startswith("p99_e2el"):
                del out[k]
    if detailed_recs is not None:
        runs = [r for r in detailed_recs if not r["warmup"]]
        out["input_lens"] = [r["input_len"] for r in runs]
        out["output_lens"] = [r["completion_tokens"] or 0 for r in runs]
        out["ttfts"] = [(r["ttft_ms"] or 0) / 1000 for r in runs]
        out["latencies"] = [(r["e2el_ms"] or 0) / 1000 for r in runs]
        out["start_times"] = [1760000000.0 + r["start_s"] for r in runs]
        out["itls"] = [[] for _ in runs]
        out["generated_texts"] = ["" for _ in runs]
        out["errors"] = [r["error"] or "" for r in runs]
    return out


# --------------------------------------------------------------------------- AISBench


def ais_stats(values=None, unit="", n=None, **fixed):
    """AISBench row: Average/Min/Max/Median/P75/P90/P99/N, values with their unit."""
    if values is not None:
        a = np.asarray(values, dtype=float)
        st = {"Average": a.mean(), "Min": a.min(), "Max": a.max(), "Median": np.percentile(a, 50),
              "P75": np.percentile(a, 75), "P90": np.percentile(a, 90), "P99": np.percentile(a, 99)}
        n = len(a) if n is None else n
    else:
        st = dict(fixed)
    row = {k: f"{round(float(v), 4)}{unit}" for k, v in st.items()}
    row["N"] = n
    return row


def ais_write(name, common: dict, rows: dict):
    write(f"{name}.json", {k: {"total": v} for k, v in common.items()})
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    heads = ["Average", "Min", "Max", "Median", "P75", "P90", "P99", "N"]
    w.writerow(["Performance Parameters", "Stage"] + heads)
    for metric, row in rows.items():
        w.writerow([metric, "total"] + [row.get(h, "") for h in heads])
    write(f"{name}.csv", buf.getvalue())


def ais_common(n_ok, n_fail, duration_s, e2el_sum_s, in_total, out_total, ttft_sum_s, max_conc=16, total=None):
    return {
        "Benchmark Duration": f"{round(duration_s * 1000, 4)} ms",
        "Total Requests": total or n_ok + n_fail, "Failed Requests": n_fail, "Success Requests": n_ok,
        "Concurrency": round(e2el_sum_s / duration_s, 4), "Max Concurrency": max_conc,
        "Request Throughput": f"{round(n_ok / duration_s, 4)} req/s",
        "Total Input Tokens": in_total,
        "Prefill Token Throughput": f"{round(in_total / ttft_sum_s, 4)} token/s",
        "Total Generated Tokens": out_total,
        "Input Token Throughput": f"{round(in_total / duration_s, 4)} token/s",
        "Output Token Throughput": f"{round(out_total / duration_s, 4)} token/s",
        "Total Token Throughput": f"{round((in_total + out_total) / duration_s, 4)} token/s",
    }


def ais_from_recs(name, recs, max_conc=16, stats_n=None, failed_inside=0, total=None, dur_factor=1.0):
    """``failed_inside``: that many of the timed requests are reported as failed, yet stay in the statistics.
    ``total``: the planned request count when fewer ended (an interrupted run). ``dur_factor``: the benchmark
    duration mismeasured by that factor (every figure AISBench derives from it follows)."""
    ok = [r for r in recs if r["ok"] and not r["warmup"]]
    fail = sum(1 for r in recs if not r["ok"] and not r["warmup"]) + failed_inside
    dur = max(r["start_s"] + r["done_ms"] / 1000 for r in ok) * dur_factor
    e2 = [r["e2el_ms"] for r in ok]
    tt = [r["ttft_ms"] for r in ok]
    rows = {
        "E2EL": ais_stats(e2, " ms", n=stats_n), "TTFT": ais_stats(tt, " ms", n=stats_n),
        "TPOT": ais_stats([r["tpot_ms"] for r in ok], " ms", n=stats_n),
        "ITL": ais_stats([r["tpot_ms"] for r in ok], " ms", n=stats_n),
        "InputTokens": ais_stats([r["prompt_tokens"] for r in ok], n=stats_n),
        "OutputTokens": ais_stats([r["completion_tokens"] for r in ok], n=stats_n),
        "OutputTokenThroughput": ais_stats([r["completion_tokens"] / (r["e2el_ms"] / 1000) for r in ok], " token/s", n=stats_n),
        "PrefillTokenThroughput": ais_stats([r["prompt_tokens"] / (r["ttft_ms"] / 1000) for r in ok], " token/s", n=stats_n),
    }
    common = ais_common(len(ok) - failed_inside, fail, dur, sum(e2) / 1000, sum(r["prompt_tokens"] for r in ok),
                        sum(r["completion_tokens"] for r in ok), sum(tt) / 1000, max_conc, total=total)
    ais_write(name, common, rows)


def seed_aisbench():
    """seeds/004 rebuilt: 1319 requests, 16 in flight, streaming off (TTFT ≡ E2EL = 9557.6 ms)."""
    n, conc = 1319, 16
    e2el = dict(Average=9557.6, Min=3120.4, Max=18876.9, Median=9321.8, P75=11520.3, P90=13890.2, P99=17002.5)
    in_mean, out_mean = 62.95, 158.54
    in_total, out_total = round(in_mean * n), round(out_mean * n)  # 83031, 209114
    duration = 788.1  # s: 1319 / 788.1 = 1.6736 req/s, × 9.5576 s = 15.996 in flight
    rows = {
        "E2EL": ais_stats(None, " ms", n, **e2el),
        "TTFT": ais_stats(None, " ms", n, **e2el),  # identical at every statistic: streaming off
        "InputTokens": ais_stats(None, "", n, Average=in_mean, Min=28, Max=189, Median=59, P75=74, P90=91, P99=131),
        "OutputTokens": ais_stats(None, "", n, Average=out_mean, Min=41, Max=512, Median=147, P75=191, P90=243, P99=398),
        "OutputTokenThroughput": ais_stats(None, " token/s", n, Average=16.78, Min=9.85, Max=28.2, Median=16.41,
                                           P75=18.62, P90=20.95, P99=25.1),
        "PrefillTokenThroughput": ais_stats(None, " token/s", n, Average=7.07, Min=2.31, Max=21.4, Median=6.52,
                                            P75=8.44, P90=10.9, P99=15.8),
    }
    ais_write("aisbench_seed", ais_common(n, 0, duration, n * 9.5576, in_total, out_total, n * 9.5576, conc), rows)

    # After the fix (streaming on, chunked prefill): E2EL 8.96 s (-6.25%), TTFT -88.1%, prefill 70.35 vs decode 18.36.
    ttft = 9557.6 * (1 - 0.881)  # 1137.3 ms
    tpot = (8960 - ttft) / (out_mean - 1)  # 49.66 ms
    e2el_a = dict(Average=8960.0, Min=2950.2, Max=17650.4, Median=8731.9, P75=10790.6, P90=13012.8, P99=15930.3)
    ttft_a = dict(Average=ttft, Min=402.7, Max=3110.8, Median=1089.4, P75=1380.2, P90=1702.5, P99=2480.9)
    rows_a = {
        "E2EL": ais_stats(None, " ms", n, **e2el_a),
        "TTFT": ais_stats(None, " ms", n, **ttft_a),
        "TPOT": ais_stats(None, " ms", n, Average=tpot, Min=38.1, Max=71.9, Median=49.2, P75=53.8, P90=58.7, P99=66.4),
        "ITL": ais_stats(None, " ms", n, Average=49.55, Min=0.9, Max=512.7, Median=48.8, P75=53.1, P90=58.4, P99=79.6),
        "InputTokens": rows["InputTokens"], "OutputTokens": rows["OutputTokens"],
        "OutputTokenThroughput": ais_stats(None, " token/s", n, Average=18.36, Min=10.9, Max=30.1, Median=17.95,
                                           P75=20.31, P90=22.8, P99=27.4),
        "PrefillTokenThroughput": ais_stats(None, " token/s", n, Average=70.35, Min=12.8, Max=190.2, Median=57.1,
                                            P75=84.3, P90=121.6, P99=170.4),
    }
    dur_a = n * 8.960 / 15.996  # the same 16 in flight
    ais_write("aisbench_seed_after", ais_common(n, 0, dur_a, n * 8.960, in_total, out_total, n * ttft / 1000, conc), rows_a)


# --------------------------------------------------------------------------- evalscope


def evalscope_dir(name, recs, conc=16, stream=True, old_keys=False, max_tokens=None, ignore_eos=False, number=None,
                  dur_factor=1.0):
    """``number``: the planned request count (benchmark_args.json); ``dur_factor``: the test duration
    mismeasured by that factor (evalscope's throughputs follow it)."""
    ok = [r for r in recs if r["ok"] and not r["warmup"]]
    fail = sum(1 for r in recs if not r["ok"] and not r["warmup"])
    dur = max(r["start_s"] + r["done_ms"] / 1000 for r in ok) * dur_factor
    tt = np.array([r["ttft_ms"] for r in ok])
    e2 = np.array([r["e2el_ms"] for r in ok])
    tp = np.array([r["tpot_ms"] for r in ok])
    outs = np.array([r["completion_tokens"] for r in ok], dtype=float)
    ins = np.array([r["prompt_tokens"] for r in ok], dtype=float)
    itl = tp if stream else np.zeros_like(tp)
    if old_keys:
        summary = {
            "Time taken for tests (s)": round(dur, 4), "Number of concurrency": conc, "Total requests": len(ok) + fail,
            "Succeed requests": len(ok), "Failed requests": fail,
            "Output token throughput (tok/s)": round(outs.sum() / dur, 4),
            "Total token throughput (tok/s)": round((ins.sum() + outs.sum()) / dur, 4),
            "Request throughput (req/s)": round(len(ok) / dur, 4), "Average latency (s)": round(e2.mean() / 1000, 4),
            "Average time to first token (s)": round(tt.mean() / 1000, 4),
            "Average time per output token (s)": round(tp.mean() / 1000, 4),
            "Average inter-token latency (s)": round(itl.mean() / 1000, 4),
            "Average input tokens per request": round(ins.mean(), 4), "Average output tokens per request": round(outs.mean(), 4),
            "Expected number of requests": number or len(ok) + fail,
        }
        unit, f = "s", 0.001
    else:
        summary = {
            "Test Duration (s)": round(dur, 4), "Concurrency": conc, "Request Rate (req/s)": -1,
            "Total Requests": len(ok) + fail, "Success Requests": len(ok), "Failed Requests": fail,
            "Req Throughput (req/s)": round(len(ok) / dur, 4), "Avg Latency (s)": round(e2.mean() / 1000, 4),
            "Avg Input Tokens": round(ins.mean(), 4), "Output Throughput (tok/s)": round(outs.sum() / dur, 4),
            "Total Throughput (tok/s)": round((ins.sum() + outs.sum()) / dur, 4), "TTFT (ms)": round(tt.mean(), 2),
            "TPOT (ms)": round(tp.mean(), 2), "ITL (ms)": round(itl.mean(), 2), "Avg Output Tokens": round(outs.mean(), 4),
        }
        unit, f = "ms", 1.0
    rows = []
    for p in (10, 25, 50, 66, 75, 80, 90, 95, 98, 99):
        rows.append({
            "Percentiles": f"{p}%", f"TTFT ({unit})": round(float(np.percentile(tt, p)) * f, 4),
            f"ITL ({unit})": round(float(np.percentile(itl, p)) * f, 4), f"TPOT ({unit})": round(float(np.percentile(tp, p)) * f, 4),
            "Latency (s)": round(float(np.percentile(e2, p)) / 1000, 4), "Input tokens": float(np.percentile(ins, p)),
            "Output tokens": float(np.percentile(outs, p)),
            "Output (tok/s)": round(float(np.percentile(outs / (e2 / 1000), p)), 4),
            "Decode (tok/s)": round(float(np.percentile(1000 / tp, 100 - p)), 4) if stream else 0.0,
        })
    args = {"model": "sim-8b", "parallel": conc, "number": number or len(ok) + fail, "rate": -1, "stream": stream,
            "api": "openai", "dataset": "random", "max_tokens": max_tokens or int(outs.max()),
            "min_tokens": max_tokens if ignore_eos else 0}
    if ignore_eos:
        args["extra_args"] = {"ignore_eos": True}
    write(f"{name}/benchmark_summary.json", summary)
    write(f"{name}/benchmark_percentile.json", rows)
    write(f"{name}/benchmark_args.json", args)


# --------------------------------------------------------------------------- GuideLLM


def gl_dist(values):
    a = np.asarray(values, dtype=float)
    pct = {"p001": 0.1, "p01": 1, "p05": 5, "p10": 10, "p25": 25, "p50": 50, "p75": 75, "p90": 90, "p95": 95, "p99": 99, "p999": 99.9}
    return {"mean": float(a.mean()), "median": float(np.median(a)), "mode": float(a[0]), "variance": float(a.var()),
            "std_dev": float(a.std()), "min": float(a.min()), "max": float(a.max()), "count": int(a.size),
            "total_sum": float(a.sum()), "percentiles": {k: float(np.percentile(a, q)) for k, q in pct.items()}}


def gl_status(ok_values, err_values=()):
    out = {"successful": gl_dist(ok_values)}
    out["incomplete"] = gl_dist([0.0]) | {"count": 0}
    out["errored"] = gl_dist(list(err_values) or [0.0]) | ({"count": 0} if not err_values else {})
    out["total"] = gl_dist(list(ok_values) + list(err_values))
    return out


def guidellm_file(name, recs, streams=16, stream=True, mean_conc=None, succ_count_override=None, dur_factor=1.0):
    """``dur_factor``: the benchmark duration mismeasured by that factor (rates and mean concurrency follow it)."""
    ok = [r for r in recs if r["ok"] and not r["warmup"]]
    errs = [r for r in recs if not r["ok"] and not r["warmup"]]
    dur = max(r["start_s"] + r["done_ms"] / 1000 for r in ok) * dur_factor
    tt = [r["ttft_ms"] for r in ok]
    e2 = [r["e2el_ms"] / 1000 for r in ok]
    outs = [r["completion_tokens"] for r in ok]
    itl = [r["tpot_ms"] if stream else 0.0 for r in ok]
    conc = mean_conc if mean_conc is not None else sum(r["done_ms"] / 1000 for r in ok) / dur
    metrics = {
        "request_totals": {"successful": succ_count_override or len(ok), "incomplete": 0, "errored": len(errs),
                           "total": (succ_count_override or len(ok)) + len(errs)},
        "requests_per_second": gl_status([len(ok) / dur]),
        "request_concurrency": gl_status([conc]),
        "request_latency": gl_status(e2),
        "prompt_token_count": gl_status([r["prompt_tokens"] for r in ok]),
        "output_token_count": gl_status(outs),
        "time_to_first_token_ms": gl_status(tt),
        "time_per_output_token_ms": gl_status([r["e2el_ms"] / r["completion_tokens"] for r in ok]),
        "inter_token_latency_ms": gl_status(itl),
        "output_tokens_per_second": gl_status([sum(outs) / dur]),
        "tokens_per_second": gl_status([(sum(outs) + sum(r["prompt_tokens"] for r in ok)) / dur]),
    }
    if succ_count_override:
        metrics["request_latency"]["successful"]["count"] = succ_count_override
        metrics["time_to_first_token_ms"]["successful"]["count"] = succ_count_override
    doc = {"metadata": {"version": 1, "guidellm_version": "0.4.0"},
           "benchmarks": [{"type_": "generative_benchmark", "id_": f"bench-{name}",
                           "config": {"strategy": {"type_": "concurrent", "streams": streams}},
                           "start_time": 1760000000.0, "end_time": 1760000000.0 + dur, "duration": dur,
                           "metrics": metrics}]}
    write(f"{name}.json", doc)


# --------------------------------------------------------------------------- all of them


def main() -> None:
    for f in os.listdir(HERE):
        p = os.path.join(HERE, f)
        if f.startswith("expected") or f == "_make.py" or f.startswith("."):
            continue
        shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)

    # vkit ------------------------------------------------------------------------------
    healthy = simulate()
    write_records("vkit_healthy.records.jsonl", healthy)
    write("vkit_healthy.json", vkit_summary(healthy, records_name="vkit_healthy.records.jsonl"))
    write("vkit_stream_off.json", vkit_summary(simulate(stream=False), stream=False))
    slow = simulate(n=200, conc=16, in_len=63, out_len=158, ttft_ms=9000.0, tpot_ms=59.6, seed=2)
    write("vkit_prefill_slow.json", vkit_summary(slow, conc=16))
    little = simulate(conc=16, slots=10, seed=3)
    write("vkit_little.json", vkit_summary(little, conc=16))
    after = simulate(tpot_ms=11.0, seed=1)
    write("vkit_after_consistent.json", vkit_summary(after))
    bad = vkit_summary(after)
    for k in list(bad):
        if k.endswith("_e2el_ms") and not k.startswith("std"):
            bad[k] *= 0.75
    write("vkit_after_inconsistent.json", bad)
    short = vkit_summary(healthy)
    short["total_output_tokens"] = 11000
    short["output_throughput"] = 11000 / short["duration"]
    short["vkit"]["server"]["delta"]["generation_tokens"] = 11000.0
    write("vkit_tokens_short.json", short)
    write("vkit_tokens_server.json", vkit_summary(healthy, server_tokens_factor=1.5))
    write("vkit_few_samples.json", vkit_summary(simulate(n=50, seed=4)))
    warm = simulate(warmups=0, first_wave_extra_ms=2500.0, seed=5)
    write_records("vkit_warmup.records.jsonl", warm)
    write("vkit_warmup.json", vkit_summary(warm, records_name="vkit_warmup.records.jsonl"))
    errs = simulate(fail=20, seed=6)
    write("vkit_errors.json", vkit_summary(errs))
    stall = simulate(fail=2, fail_kind="stall", seed=8)
    write_records("vkit_failed_in_stats.records.jsonl", stall)
    write("vkit_failed_in_stats.json", vkit_summary(stall, records_name="vkit_failed_in_stats.records.jsonl", stats_over_all=True))
    write("vkit_client_saturated.json", vkit_summary(healthy, cpu=0.97, lag_p99=24.0))
    write("vkit_ttft_gap.json", vkit_summary(healthy, server_ttft_gap_ms=180.0))
    part = [r for r in healthy if r["warmup"] or r["i"] < 120]
    write("vkit_partial.json", vkit_summary(part, num_prompts=200, partial=True))
    write("expect_config.json", {"config": {"max_model_len": 4096, "block_size": 16, "gpu_memory_utilization": 0.9,
                                            "enable_prefix_caching": False, "max_num_seqs": 64}})
    write("vkit_seed.json", vkit_summary(simulate(n=200, conc=16, in_len=63, out_len=158, ttft_ms=700.0, tpot_ms=56.0,
                                                  stream=False, seed=9), conc=16, stream=False))

    # vllm bench serve --------------------------------------------------------------------
    write("vllm_bench_healthy.json", vllm_bench_of(vkit_summary(healthy)))
    write("vllm_bench_detailed.json", vllm_bench_of(vkit_summary(healthy), detailed_recs=healthy))
    write("vllm_bench_nonstream.json", vllm_bench_of(vkit_summary(simulate(stream=False), stream=False)))
    tz = vllm_bench_of(vkit_summary(healthy))
    for k in list(tz):
        if k.endswith("_tpot_ms") or k.endswith("_itl_ms"):
            tz[k] = 0.0
    write("vllm_bench_tpot_zero.json", tz)
    write("vllm_bench_prefill_slow.json", vllm_bench_of(vkit_summary(slow, conc=16)))
    write("vllm_bench_little.json", vllm_bench_of(vkit_summary(little, conc=16)))
    write("vllm_bench_errors.json", vllm_bench_of(vkit_summary(errs)))
    write("vllm_bench_few_samples.json", vllm_bench_of(vkit_summary(simulate(n=50, seed=4))))
    write("vllm_bench_after_inconsistent.json", vllm_bench_of(bad))
    write("vllm_bench_failed_in_stats.json", vllm_bench_of(vkit_summary(stall, stats_over_all=True), detailed_recs=stall))
    write("vllm_bench_after_consistent.json", vllm_bench_of(vkit_summary(after)))
    # the healthy --save-detailed run with its first wave 2.5 s slower to first token (no warm-up sent)
    vwarm = simulate(first_wave_extra_ms=2500.0)
    write("vllm_bench_warmup.json", vllm_bench_of(vkit_summary(vwarm), detailed_recs=vwarm))
    # the healthy run stopped after 120 of its 200 prompts; vLLM's keys keep the planned num_prompts
    write("vllm_bench_partial.json", vllm_bench_of(vkit_summary(part, num_prompts=200, partial=True)))

    # AISBench ----------------------------------------------------------------------------
    seed_aisbench()
    big = simulate(n=1319, conc=16, in_len=63, out_len=158, ttft_ms=1100.0, tpot_ms=49.0, seed=10, warmups=0)
    ais_from_recs("aisbench_healthy", big)
    ais_from_recs("aisbench_prefill_slow", simulate(n=1319, conc=16, in_len=63, out_len=158, ttft_ms=9000.0, tpot_ms=59.6,
                                                     seed=11, warmups=0))
    ais_from_recs("aisbench_errors", simulate(n=400, conc=16, in_len=63, out_len=158, ttft_ms=1100.0, tpot_ms=49.0, seed=12,
                                              warmups=0, fail=40))
    ais_from_recs("aisbench_few_samples", simulate(n=30, conc=16, in_len=63, out_len=158, ttft_ms=1100.0, tpot_ms=49.0,
                                                   seed=13, warmups=0))
    ais_from_recs("aisbench_failed_in_stats", big, failed_inside=10)
    ais_from_recs("aisbench_little", simulate(n=1319, conc=16, slots=11, in_len=63, out_len=158, ttft_ms=1100.0,
                                              tpot_ms=49.0, seed=14, warmups=0))
    # the healthy run stopped after 800 of its 1319 requests: Total Requests is the planned count
    ais_from_recs("aisbench_partial", [r for r in big if r["i"] < 800], total=1319)
    # the healthy request set with a faster decode (TPOT 45 ms, E2EL about -7%), whose benchmark duration
    # includes 8% idle time: throughput does not rise with the E2EL drop (Little's law alone stays inside 10%)
    ais_from_recs("aisbench_after_inconsistent", simulate(n=1319, conc=16, in_len=63, out_len=158, ttft_ms=1100.0,
                                                          tpot_ms=45.0, seed=10, warmups=0), dur_factor=1.08)

    # evalscope ---------------------------------------------------------------------------
    es = simulate(n=400, conc=16, in_len=128, out_len=128, ttft_ms=60.0, tpot_ms=14.0, seed=20, warmups=0)
    evalscope_dir("evalscope_healthy", es)
    evalscope_dir("evalscope_nonstream", simulate(n=400, conc=16, in_len=128, out_len=128, ttft_ms=60.0, tpot_ms=14.0,
                                                  seed=21, warmups=0, stream=False), stream=False, old_keys=True)
    evalscope_dir("evalscope_errors", simulate(n=400, conc=16, in_len=128, out_len=128, ttft_ms=60.0, tpot_ms=14.0,
                                               seed=22, warmups=0, fail=30))
    evalscope_dir("evalscope_few_samples", simulate(n=40, conc=16, in_len=128, out_len=128, ttft_ms=60.0, tpot_ms=14.0,
                                                    seed=23, warmups=0))
    evalscope_dir("evalscope_tokens_short", es, max_tokens=160, ignore_eos=True)
    es_kw = dict(n=400, conc=16, in_len=128, out_len=128, ttft_ms=60.0, tpot_ms=14.0, seed=20, warmups=0)
    evalscope_dir("evalscope_little", simulate(**{**es_kw, "slots": 10}))  # 10 of the 16 slots kept busy
    evalscope_dir("evalscope_prefill_slow", simulate(**{**es_kw, "ttft_ms": 9000.0}))
    evalscope_dir("evalscope_partial", [r for r in es if r["i"] < 240], number=400)  # stopped after 240 of 400
    es_after = simulate(**{**es_kw, "tpot_ms": 13.0})
    evalscope_dir("evalscope_after_consistent", es_after)
    evalscope_dir("evalscope_after_inconsistent", es_after, dur_factor=1.08)  # duration includes 8% idle time

    # GuideLLM ----------------------------------------------------------------------------
    gl = simulate(n=500, conc=16, in_len=256, out_len=128, ttft_ms=80.0, tpot_ms=15.0, seed=30, warmups=0)
    guidellm_file("guidellm_healthy", gl)
    guidellm_file("guidellm_nonstream", simulate(n=500, conc=16, in_len=256, out_len=128, ttft_ms=80.0, tpot_ms=15.0,
                                                 seed=31, warmups=0, stream=False), stream=False)
    guidellm_file("guidellm_errors", simulate(n=500, conc=16, in_len=256, out_len=128, ttft_ms=80.0, tpot_ms=15.0,
                                              seed=32, warmups=0, fail=50))
    guidellm_file("guidellm_few_samples", simulate(n=40, conc=16, in_len=256, out_len=128, ttft_ms=80.0, tpot_ms=15.0,
                                                   seed=33, warmups=0))
    guidellm_file("guidellm_little", simulate(n=500, conc=16, slots=9, in_len=256, out_len=128, ttft_ms=80.0,
                                              tpot_ms=15.0, seed=34, warmups=0))
    gl_kw = dict(n=500, conc=16, in_len=256, out_len=128, ttft_ms=80.0, tpot_ms=15.0, seed=30, warmups=0)
    guidellm_file("guidellm_prefill_slow", simulate(**{**gl_kw, "ttft_ms": 9000.0}))
    gl_after = simulate(**{**gl_kw, "tpot_ms": 14.0})
    guidellm_file("guidellm_after_consistent", gl_after)
    guidellm_file("guidellm_after_inconsistent", gl_after, dur_factor=1.08)  # duration includes 8% idle time
    guidellm_file("guidellm_failed_in_stats", gl, succ_count_override=None)
    doc = json.load(open(os.path.join(HERE, "guidellm_failed_in_stats.json")))
    m = doc["benchmarks"][0]["metrics"]
    m["request_totals"] = {"successful": 480, "incomplete": 0, "errored": 20, "total": 500}
    write("guidellm_failed_in_stats.json", doc)


if __name__ == "__main__":
    main()
