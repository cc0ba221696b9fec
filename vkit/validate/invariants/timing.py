"""Timing checks on the latency statistics: phase order (prefill tok/s from TTFT above decode tok/s from
TPOT), enough requests behind each reported percentile, and no warm-up outliers in the first wave."""

from __future__ import annotations

import math

from vkit.validate.invariants.common import ANOMALY, FAIL, INFO, NA, PASS, Thresholds, _f, _ok_records, _res, _stat


def check_phase_order(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """Prefill tok/s per request above decode tok/s. Why: prefill is compute-bound (all
    prompt tokens in one pass), decode is memory-bound (one token a step); prefill slower than
    decode is wrong, not slow (seed 004: 7.07 vs 16.78 before the fix, 70.35 vs 18.36 after).
    Judged with phase-isolated definitions (input/(TTFT − queue) vs 1/TPOT) and only once
    the TTFT ≡ E2EL identity is ruled out: with it, both figures share E2EL and prefill <
    decode follows from input < output tokens whatever the hardware did."""
    cid, title = "phase_order", "prefill faster than decode"
    ph = rep["phase"]
    mi, mo = rep.get("mean_input_tokens"), rep.get("mean_output_tokens")
    if ctx["identity"]["holds"] or rep.get("stream") is False:
        sp, sd = ph.get("source_prefill_tok_s"), ph.get("source_decode_tok_s")
        sp_v = _stat(sp, "mean", "p50") or _stat(ph.get("prefill_tok_s"), "mean", "p50")
        sd_v = _stat(sd, "mean", "p50")
        e = _stat(rep["metrics"].get("e2el"), "mean")
        if sd_v is None and mo and e:
            sd_v = mo / (e / 1000)
        numbers = ""
        if sp_v is not None and sd_v is not None:
            numbers = f" ('prefill' {_f(sp_v)} tok/s = input/TTFT vs 'decode' {_f(sd_v)} tok/s = output/E2EL)"
        cause = f", so prefill < decode follows from {_f(mi)} input < {_f(mo)} output tokens" if mi and mo and mi < mo else ""
        return _res(cid, title, NA, INFO,
                    "not applicable — the source's definitions make it meaningless: with TTFT ≡ E2EL (no streaming) both "
                    f"speeds share one denominator, E2EL{numbers}{cause}, whatever the hardware did. Rerun with streaming "
                    "on and judge input/(TTFT − queue) against 1/TPOT.",
                    source_prefill_tok_s=sp_v, source_decode_tok_s=sd_v, mean_input_tokens=mi, mean_output_tokens=mo)
    iso = ph.get("prefill_isolated_tok_s")
    pre = iso or ph.get("prefill_tok_s")
    dec = ph.get("decode_tok_s")
    if not pre or not dec:
        return _res(cid, title, NA, INFO, "needs per-request prefill (input tokens and TTFT) and decode (TPOT) figures; the report lacks them.")
    key = "p50" if pre.get("p50") is not None and dec.get("p50") is not None else "mean"
    p, d = pre.get(key), dec.get(key)
    if p is None or d is None or d <= 0:
        return _res(cid, title, NA, INFO, "prefill or decode speed is missing from the report.")
    ratio = p / d
    defn = "input/(TTFT − server queue time)" if iso else "input/TTFT (queue time included)"
    ev = dict(prefill_tok_s=p, decode_tok_s=d, ratio=ratio, statistic=key, isolated=bool(iso),
              min_ratio=th.min_prefill_decode_ratio, mean_input_tokens=mi)
    if ratio >= th.min_prefill_decode_ratio:
        return _res(cid, title, PASS, INFO,
                    f"prefill {_f(p)} tok/s ({defn}) is {ratio:.1f}× decode {_f(d)} tok/s (1/TPOT), per request ({key}).", **ev)
    hint = "" if iso else (" TTFT here includes queue time (the source has no server queue figure): confirm with "
                           "vllm:request_queue_time_seconds before blaming prefill.")
    return _res(cid, title, FAIL, ANOMALY,
                f"prefill {_f(p)} tok/s ({defn}) is below decode {_f(d)} tok/s (1/TPOT), per request ({key}): prefill is "
                "compute-bound and should be several times faster, so this is wrong, not slow. Look at the prefill path "
                f"(chunked prefill off, short-prompt kernels, prefill mixed into decode batches) before tuning anything.{hint}", **ev)


def _needed(p: float, n99: int) -> float:
    """Requests a pNN needs so that about as many samples lie beyond it as a p99 gets from n99."""
    return n99 * 0.01 / (1 - p / 100)


def check_percentile_samples(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """A high percentile from too few requests (p99 from < 100). Why: p99 of 50 requests is
    the maximum, one outlier; gating on it compares noise."""
    cid, title = "percentile_samples", "enough requests for the reported percentiles"
    if th.min_samples_p99 <= 0:
        return _res(cid, title, NA, INFO, "disabled (--min-samples-p99 0).")
    short, seen = [], []
    for m, st in rep["metrics"].items():
        if not st:
            continue
        n = st.get("count") if m != "itl" else None
        n = n if n is not None else rep.get("completed")
        if n is None:
            continue
        for k in st:
            if not k.startswith("p"):
                continue
            p = float(k[1:])
            if p <= 50 or p > 99:  # beyond p99 (GuideLLM's p99.9) vkit never gates on
                continue
            need = _needed(p, th.min_samples_p99)
            seen.append(f"{m} {k}")
            if n < need:
                short.append({"statistic": f"{m} {k}", "samples": n, "needed": math.ceil(need)})
    if not seen:
        return _res(cid, title, NA, INFO, "the report gives no percentile above the median.")
    if short:
        worst = max(short, key=lambda s: s["needed"] - s["samples"])
        names = ", ".join(s["statistic"] for s in short[:6]) + (" …" if len(short) > 6 else "")
        return _res(cid, title, FAIL, ANOMALY,
                    f"{names} computed from {_f(worst['samples'])} requests; {worst['statistic'].split()[-1]} needs at least "
                    f"{worst['needed']}: it is one or two extreme requests, not a tail. Run more requests (or gate on "
                    "mean/median) before comparing these percentiles.",
                    insufficient=short, min_samples_p99=th.min_samples_p99)
    return _res(cid, title, PASS, INFO, f"{len(seen)} percentiles, each from enough requests.",
                samples=rep.get("completed"), min_samples_p99=th.min_samples_p99)


def check_warmup_outliers(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """The first wave of requests far slower than the rest. Why: compile, cache and connection
    warm-up then sits inside the statistics and inflates the tail."""
    cid, title = "warmup_outliers", "no warm-up outliers inside the statistics"
    recs = sorted((r for r in _ok_records(rep) if r["ttft_ms"] is not None and r["start_s"] is not None),
                  key=lambda r: r["start_s"])
    if not recs:
        return _res(cid, title, NA, INFO, "needs per-request records with start times and TTFT (--records FILE).",
                    warmups=rep.get("warmups"))
    wave = int(min(max(rep.get("max_concurrency") or 0, math.ceil(0.05 * len(recs)), 1), len(recs) // 4 or 1))
    first = sorted(r["ttft_ms"] for r in recs[:wave])
    rest = sorted(r["ttft_ms"] for r in recs[wave:])
    if len(rest) < 4:
        return _res(cid, title, NA, INFO, "too few requests to compare the first wave with the rest.")
    med = lambda a: a[len(a) // 2] if len(a) % 2 else (a[len(a) // 2 - 1] + a[len(a) // 2]) / 2  # noqa: E731
    m1, m2 = med(first), med(rest)
    ratio = m1 / m2 if m2 > 0 else math.inf
    # A start burst: the requests that entered before any first token came back (a closed loop's C
    # streams start at once). Their prompts are prefilled together, up to `burst` times a lone
    # request's prefill work, so up to that multiple of the rest's median is the burst itself, not
    # warm-up (measured on real vLLM, 8 streams: 80 ms vs 24 ms, and 56 ms for the second wave).
    first_token = min(r["start_s"] + r["ttft_ms"] / 1000.0 for r in recs)
    burst = sum(1 for r in recs if r["start_s"] < first_token)
    max_ratio = max(th.warmup_outlier_ratio, float(burst)) if burst >= 2 else th.warmup_outlier_ratio
    ev = dict(first_wave=wave, first_wave_ttft_p50_ms=m1, rest_ttft_p50_ms=m2, ratio=ratio, max_ratio=max_ratio,
              start_burst=burst, warmups=rep.get("warmups"))
    if ratio > max_ratio:
        return _res(cid, title, FAIL, ANOMALY,
                    f"the first {wave} requests have median TTFT {_f(m1)} ms, {ratio:.1f}× the rest ({_f(m2)} ms): warm-up "
                    f"(compilation, caches, connections) is inside the statistics"
                    + (" and no warm-up requests were sent" if not rep.get("warmups") else "")
                    + ". Send warm-ups first (bench_stream --warmups N) and rerun.", **ev)
    burst_note = (f" ({burst} of them started together before any first token: a start burst, allowed up to {max_ratio:g}×)"
                  if max_ratio > th.warmup_outlier_ratio else "")
    return _res(cid, title, PASS, INFO,
                f"first {wave} requests: median TTFT {_f(m1)} ms vs {_f(m2)} ms for the rest{burst_note}.", **ev)
