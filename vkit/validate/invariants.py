"""The invariants check_invariants applies to a normalised report (``vkit.validate.formats``):
VALIDATE in the tuning state machine — no analysis on a broken gauge.

Each check is a small pure function ``check(rep, th, ctx) -> dict`` returning::

    {"id", "title", "status": "pass" | "fail" | "not_applicable",
     "severity": "invalid" | "anomaly" | "info", "evidence": {numbers}, "explanation": str}

``severity`` is what this result means for the verdict: a failed check carries ``invalid``
(the numbers cannot support any verdict: streaming off, TTFT ≡ E2EL, …) or ``anomaly``
(a measurement or physics violation to explain before trusting the run); passes and
not-applicable results carry ``info``. ``evaluate`` runs them all and gives the verdict:
``invalid`` if any failure is invalid, else ``anomaly`` if any is an anomaly, else ``valid``.

Nothing here prints or exits.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from typing import Any, Callable

from vkit.apply.policy import same_value
from vkit.errors import ExitCode, UsageError
from vkit.jsonio import read_json
from vkit.validate.formats import load_report

PASS, FAIL, NA = "pass", "fail", "not_applicable"
INVALID, ANOMALY, INFO = "invalid", "anomaly", "info"


@dataclass
class Thresholds:
    """Tolerances of the checks; every one is a command-line flag of check_invariants."""

    ttft_e2el_tol: float = 0.005  # relative: TTFT and E2EL statistics closer than this are "equal"
    min_prefill_decode_ratio: float = 1.0  # prefill tok/s must be at least this many times decode tok/s
    little_tol: float = 0.10  # relative gap allowed between throughput × E2EL and requests in flight
    consistency_tol: float = 0.03  # between two runs: |(T/T0)·(E/E0) − 1| allowed
    token_tol: float = 0.01  # relative gap allowed between token counts (usage vs requested, client vs server)
    min_samples_p99: int = 100  # requests a p99 needs (p95 needs a fifth of it, p99.9 ten times it); 0 disables
    warmup_outlier_ratio: float = 3.0  # first-wave median TTFT over the rest's above this = warm-up outliers
    max_error_rate: float = 0.01  # failed / sent above this is an anomaly
    client_cpu_max: float = 0.8  # client CPU, fraction of one core, above this = saturated client
    sched_lag_max_ms: float = 10.0  # client p99 scheduling lag above this = saturated client
    client_server_ttft_tol_ms: float = 50.0  # |client TTFT − server TTFT| (means) allowed
    closed_loop: int | None = None  # declare N in flight for sources that do not record their load mode


# --------------------------------------------------------------------------- helpers


def _r(x: Any) -> Any:
    """Evidence numbers rounded to 6 significant digits (stable golden files); recursive."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        if not math.isfinite(x):
            return None if math.isnan(x) else ("inf" if x > 0 else "-inf")
        if x.is_integer() and abs(x) < 1e15:
            return int(x)
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: _r(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_r(v) for v in x]
    return x


def _f(x: float | None, nd: int = 2) -> str:
    """A number for a sentence: integers as such, one decimal from 1000 up, else ``nd`` decimals."""
    if x is None:
        return "n/a"
    if float(x).is_integer():
        return str(int(x))
    if abs(x) >= 1000:
        return f"{x:.1f}"
    return f"{x:.{nd}f}"


def _sg(x: float, fmt: str = "+.1%") -> str:
    """A signed relative change, without printing "-0.0%"."""
    return format(0.0 if abs(x) < 5e-4 else x, fmt)


def _pct(x: float) -> str:
    return f"{x * 100:.2f}%"


def _res(cid: str, title: str, status: str, severity: str, explanation: str, **evidence: Any) -> dict:
    return {"id": cid, "title": title, "status": status, "severity": severity if status == FAIL else INFO,
            "evidence": _r({k: v for k, v in evidence.items() if v is not None}), "explanation": explanation}


def _stat(st: dict | None, *keys: str) -> float | None:
    if not st:
        return None
    for k in keys:
        if st.get(k) is not None:
            return st[k]
    return None


def _close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= max(tol * max(abs(a), abs(b)), 0.01)


def _ok_records(rep: dict) -> list[dict]:
    return [r for r in (rep.get("records") or []) if r["ok"] and not r["warmup"]]


# --------------------------------------------------------------------------- shared finding


def identity(rep: dict, th: Thresholds) -> dict:
    """Is TTFT ≡ E2EL? Compares every statistic both report (and the records when there).

    Returns {"known": bool, "holds": bool, "compared": [...], "equal": [...], ...}."""
    t, e = rep["metrics"].get("ttft"), rep["metrics"].get("e2el")
    out: dict[str, Any] = {"known": False, "holds": False}
    if t and e:
        keys = [k for k in t if k != "count" and k in e and t[k] is not None and e[k] is not None
                and not (k == "p50" and "median" in t and "median" in e)]  # p50 is the median under another name
        if keys and (_stat(e, "mean", "median", "p50") or 0) > 0:
            equal = [k for k in keys if _close(t[k], e[k], th.ttft_e2el_tol)]
            out.update(known=True, holds=len(equal) == len(keys), compared=keys, equal=equal)
    recs = [r for r in _ok_records(rep) if r["ttft_ms"] is not None and r["e2el_ms"] is not None
            and (r["completion_tokens"] or 0) > 1]
    if recs:
        same = sum(1 for r in recs if _close(r["ttft_ms"], r["e2el_ms"], th.ttft_e2el_tol))
        out["records_compared"], out["records_equal"] = len(recs), same
        if same >= 0.99 * len(recs):
            out.update(known=True, holds=True)
        elif not out["known"]:
            out["known"] = True
    return out


# --------------------------------------------------------------------------- the checks


def check_streaming(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """The source's own record of streaming. Why: with streaming off the client sees two time
    points only, so TTFT is the total latency; nothing derived from TTFT means anything."""
    cid, title = "streaming", "the benchmark streamed"
    s = rep.get("stream")
    if s is None:
        return _res(cid, title, NA, INFO,
                    f"{rep['format']} does not record whether it streamed; ttft_e2el_identity judges from the numbers.")
    if s:
        return _res(cid, title, PASS, INFO, f"the run streamed ({rep.get('stream_source')}).", stream=True)
    return _res(cid, title, FAIL, INVALID,
                f"the run did not stream ({rep.get('stream_source')}): TTFT is the whole latency and every TTFT-derived "
                "figure (TTFT percentiles, prefill tok/s, TTFT SLOs, goodput) is void. Rerun with streaming on "
                "(bench_stream streams unless --no-stream; evalscope needs --stream).", stream=False)


def check_ttft_e2el_identity(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """TTFT ≡ E2EL at every statistic while requests produce more than one token. Why: that
    is an identity, not a coincidence — the client did not time the first token (seed 004)."""
    cid, title = "ttft_e2el_identity", "TTFT is not identical to E2EL"
    idn = ctx["identity"]
    out_mean = rep.get("mean_output_tokens")
    t, e = rep["metrics"].get("ttft"), rep["metrics"].get("e2el")
    if not idn["known"]:
        missing = [n for n, v in (("TTFT", t), ("E2EL", e)) if not v]
        return _res(cid, title, NA, INFO, f"needs TTFT and E2EL statistics; the report lacks {' and '.join(missing) or 'comparable ones'}.")
    if out_mean is not None and out_mean <= 1:
        return _res(cid, title, NA, INFO, "at most one output token per request: TTFT equals E2EL by definition.",
                    mean_output_tokens=out_mean)
    ev = dict(ttft_mean_ms=_stat(t, "mean"), e2el_mean_ms=_stat(e, "mean"), ttft_p99_ms=_stat(t, "p99"),
              e2el_p99_ms=_stat(e, "p99"), statistics_compared=len(idn.get("compared", [])),
              statistics_equal=len(idn.get("equal", [])), records_compared=idn.get("records_compared"),
              records_equal=idn.get("records_equal"), mean_output_tokens=out_mean, tol_rel=th.ttft_e2el_tol)
    if idn["holds"]:
        where = (f"at every reported statistic ({len(idn['equal'])} of {len(idn['compared'])}; mean {_f(ev['ttft_mean_ms'], 1)} ms = "
                 f"{_f(ev['e2el_mean_ms'], 1)} ms)") if idn.get("compared") else (
                 f"in {idn.get('records_equal')} of {idn.get('records_compared')} requests")
        return _res(cid, title, FAIL, INVALID,
                    f"TTFT ≡ E2EL {where} while requests produced {_f(out_mean)} output tokens on average: the client did "
                    "not stream, so 'TTFT' is the total latency. Every TTFT-derived figure (TTFT percentiles, prefill tok/s, "
                    "TTFT SLOs) is void; rerun with streaming on before drawing any conclusion.", **ev)
    return _res(cid, title, PASS, INFO,
                f"TTFT differs from E2EL (mean {_f(ev['ttft_mean_ms'])} vs {_f(ev['e2el_mean_ms'])} ms): the first token was timed on its own.",
                **ev)


def check_decode_timing(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """TPOT (and ITL where the source defines it) present and above zero while requests
    produce more than one token. Why: zero means the tokens were not timed one by one."""
    cid, title = "decode_timing", "TPOT and ITL measured"
    out_mean = rep.get("mean_output_tokens")
    if out_mean is None:
        return _res(cid, title, NA, INFO, "the report gives no output token count.")
    if out_mean <= 1:
        return _res(cid, title, NA, INFO, "at most one output token per request: there is no decode to time.",
                    mean_output_tokens=out_mean)
    tpot, itl = rep["metrics"].get("tpot"), rep["metrics"].get("itl")
    if not (tpot or itl or rep["metrics"].get("ttft") or rep["metrics"].get("e2el")):
        return _res(cid, title, NA, INFO, "the report carries no latency statistics.")
    tpot_mean, itl_mean = _stat(tpot, "mean", "median", "p50"), _stat(itl, "mean", "median", "p50")
    bad = []
    if tpot_mean is None:
        bad.append("TPOT missing")
    elif tpot_mean <= 1e-6:
        bad.append(f"TPOT {_f(tpot_mean)} ms")
    if itl is not None and (itl_mean is None or itl_mean <= 1e-6):
        bad.append(f"ITL {_f(itl_mean)} ms")
    ev = dict(tpot_mean_ms=tpot_mean, itl_mean_ms=itl_mean, itl_reported=itl is not None, mean_output_tokens=out_mean)
    if bad:
        return _res(cid, title, FAIL, INVALID,
                    f"{' and '.join(bad)} while requests produced {_f(out_mean)} output tokens on average: the tokens were not "
                    "timed one by one (streaming off, or a proxy buffering the stream), so TPOT, ITL and decode speed are void. "
                    "Stream end to end and rerun.", **ev)
    itl_txt = f", ITL {_f(itl_mean)} ms" if itl is not None else " (the source reports no per-gap ITL)"
    return _res(cid, title, PASS, INFO, f"TPOT {_f(tpot_mean)} ms{itl_txt}: decode was timed token by token.", **ev)


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


def check_error_rate(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """Failed requests above a threshold. Why: the statistics then describe the survivors only."""
    cid, title = "error_rate", "error rate within limit"
    c, f = rep.get("completed"), rep.get("failed")
    if c is None or f is None:
        return _res(cid, title, NA, INFO, "the report gives no completed/failed counts.")
    total = c + f
    top = sorted((rep.get("errors") or {}).items(), key=lambda kv: -kv[1])[:3]
    tops = "; ".join(f"{k} (×{v})" for k, v in top)
    if c == 0:
        return _res(cid, title, FAIL, INVALID,
                    f"no request completed ({_f(f)} failed): there is nothing to measure." + (f" Errors: {tops}." if tops else ""),
                    completed=c, failed=f)
    rate = f / total if total else 0.0
    ev = dict(completed=c, failed=f, error_rate=rate, max_error_rate=th.max_error_rate)
    if rate > th.max_error_rate:
        return _res(cid, title, FAIL, ANOMALY,
                    f"{_f(f)} of {_f(total)} requests failed ({_pct(rate)} > {_pct(th.max_error_rate)}): latency and throughput "
                    "describe the survivors only. Fix the cause" + (f" (top errors: {tops})" if tops else "") +
                    " or raise --max-error-rate on purpose.", **ev)
    return _res(cid, title, PASS, INFO, f"{_f(f)} of {_f(total)} requests failed ({_pct(rate)}).", **ev)


_EXCLUDES_FAILED = {"vkit": "bench_stream", "vllm-bench": "vllm bench serve", "evalscope": "evalscope",
                    "guidellm": "GuideLLM (its 'successful' split)", "aiperf": "AIPerf (its base metrics; the adj_* ones hold failures)"}


def check_failed_in_latency_stats(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """Failed requests inside the latency statistics. Why: a timed-out request's 60 s
    "latency" or an error's 2 ms one drags means and percentiles anywhere."""
    cid, title = "failed_in_latency_stats", "failed requests kept out of latency statistics"
    c, f = rep.get("completed"), rep.get("failed")
    if f is not None and f == 0:
        return _res(cid, title, PASS, INFO, "no failed requests.", failed=0)
    if c is None:
        return _res(cid, title, NA, INFO, "the report gives no completed count.")
    over = {m: st["count"] for m, st in rep["metrics"].items() if st and m != "itl" and (st.get("count") or 0) > c}
    if over:
        m, n = next(iter(over.items()))
        return _res(cid, title, FAIL, ANOMALY,
                    f"{m.upper()} statistics cover {_f(n)} samples but only {_f(c)} requests completed: failed requests are "
                    "inside the latency statistics. Recompute from successful requests only.",
                    completed=c, failed=f, samples=over)
    recs = [r for r in (rep.get("records") or []) if not r["warmup"]]
    bad = [r for r in recs if not r["ok"] and r["e2el_ms"] is not None]
    rep_mean = _stat(rep["metrics"].get("e2el"), "mean")
    if bad and rep_mean:
        ok = [r["e2el_ms"] for r in recs if r["ok"] and r["e2el_ms"] is not None]
        allv = ok + [r["e2el_ms"] for r in bad]
        ok_mean = sum(ok) / len(ok) if ok else None
        all_mean = sum(allv) / len(allv)
        ev = dict(reported_e2el_mean_ms=rep_mean, successful_e2el_mean_ms=ok_mean, all_e2el_mean_ms=all_mean,
                  failed_with_latency=len(bad), completed=c, failed=f)
        if ok_mean is not None and abs(rep_mean - ok_mean) > 0.01 * ok_mean and abs(rep_mean - all_mean) < abs(rep_mean - ok_mean):
            return _res(cid, title, FAIL, ANOMALY,
                        f"the reported mean E2EL {_f(rep_mean)} ms matches all {len(allv)} requests ({_f(all_mean)} ms) rather than "
                        f"the {len(ok)} successful ones ({_f(ok_mean)} ms): failed requests are inside the latency statistics. "
                        "Recompute from successful requests only.", **ev)
        return _res(cid, title, PASS, INFO,
                    f"the reported mean E2EL matches the successful requests only ({_f(ok_mean)} ms); {len(bad)} failed ones are left out.", **ev)
    src = _EXCLUDES_FAILED.get(rep["format"])
    if src:
        return _res(cid, title, PASS, INFO, f"{src} computes latency statistics over successful requests only.", completed=c, failed=f)
    return _res(cid, title, NA, INFO, "cannot tell without per-request records or per-statistic sample counts.", completed=c, failed=f)


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


def _closed_n(rep: dict, th: Thresholds) -> float | None:
    if th.closed_loop:
        return float(th.closed_loop)
    if rep.get("load") == "closed" and rep.get("max_concurrency"):
        return float(rep["max_concurrency"])
    return None


def check_littles_law(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """Closed loop: request throughput × mean E2EL ≈ requests in flight (Little's law).
    Why: when it fails, duration, throughput or latency is mismeasured, or the client did not
    keep N requests in flight (it was the bottleneck)."""
    cid, title = "littles_law", "Little's law (closed loop)"
    n = _closed_n(rep, th)
    if n is None:
        why = {"open": "an open-loop run (fixed arrival rate)", "burst": "a burst run (all requests at once)"}.get(
            rep.get("load") or "", "a run whose load mode the source does not record (declare it with --closed-loop N)")
        return _res(cid, title, NA, INFO, f"applies to closed-loop runs (N requests kept in flight); this is {why}.")
    lam = rep.get("request_throughput")
    w = _stat(rep["metrics"].get("e2el"), "mean")
    if not lam or not w:
        return _res(cid, title, NA, INFO, "needs request throughput and mean E2EL.")
    lw = lam * w / 1000
    target = min(n, rep["num_prompts"]) if rep.get("num_prompts") else n
    dev = lw / target - 1
    # The last wave drains: slots finish staggered over about one E2EL, so a run of n requests
    # averages up to N/(2n) fewer in flight than N without anything being wrong.
    count = rep.get("completed") or rep.get("num_prompts")
    tail = target / (2 * count) if count else 0.0
    L = rep.get("mean_in_flight")
    dev_l = (lw / L - 1) if L else None
    ev = dict(request_throughput=lam, e2el_mean_ms=w, throughput_x_e2el=lw, concurrency=target, mean_in_flight=L,
              deviation=dev, deviation_from_mean_in_flight=dev_l, tol=th.little_tol, tail_allowance=tail)
    if dev < -(th.little_tol + tail) or dev > th.little_tol:
        if dev < 0:
            why = (f"only {_f(lw)} of {_f(target)} requests were in flight on average: the client did not keep the loop full "
                   "(client saturated, slow request dispatch, failed requests freeing slots), or the duration includes time "
                   "without requests. Check client_saturation and the error rate.")
        else:
            why = (f"{_f(lw)} requests in flight on average, more than the {_f(target)} the loop allows: duration, throughput "
                   "or E2EL is mismeasured.")
        return _res(cid, title, FAIL, ANOMALY,
                    f"throughput {_f(lam, 3)} req/s × mean E2EL {_f(w / 1000, 3)} s = {_f(lw)} vs {_f(target)} in flight "
                    f"({_sg(dev)}, allowed {_sg(-(th.little_tol + tail))} … {th.little_tol:+.0%}): {why}", **ev)
    if dev_l is not None and abs(dev_l) > th.little_tol:
        return _res(cid, title, FAIL, ANOMALY,
                    f"throughput × mean E2EL = {_f(lw)} but the measured mean in flight is {_f(L)} ({_sg(dev_l)}): the summary's "
                    "duration, throughput and latency do not describe the same requests.", **ev)
    return _res(cid, title, PASS, INFO,
                f"throughput {_f(lam, 3)} req/s × mean E2EL {_f(w / 1000, 3)} s = {_f(lw)} ≈ {_f(target)} in flight ({_sg(dev)}).", **ev)


def check_throughput_latency_consistency(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """Between two closed-loop runs of the same request set: relative throughput gain ≈
    relative E2EL drop, i.e. (T/T0)·(E/E0) ≈ 1 (seed 004: both about 6%). Why: when they
    disagree, one of the two runs is mismeasured."""
    cid, title = "throughput_latency_consistency", "throughput gain matches E2EL drop (vs --compare)"
    other = ctx.get("other")
    if other is None:
        return _res(cid, title, NA, INFO, "needs a second run of the same request set: --compare OTHER.")
    n0, n1 = _closed_n(other, th), _closed_n(rep, th)
    if n0 is None or n1 is None:
        return _res(cid, title, NA, INFO, "applies to two closed-loop runs (declare the loop with --closed-loop N when the source does not record it).")
    if n0 != n1:
        return _res(cid, title, NA, INFO, f"the runs kept different numbers of requests in flight ({_f(n0)} vs {_f(n1)}).")
    p0, p1 = other.get("num_prompts"), rep.get("num_prompts")
    if p0 and p1 and p0 != p1:
        return _res(cid, title, NA, INFO, f"the runs sent different request sets ({_f(p0)} vs {_f(p1)} prompts).")
    t0, t1 = other.get("request_throughput"), rep.get("request_throughput")
    e0, e1 = _stat(other["metrics"].get("e2el"), "mean"), _stat(rep["metrics"].get("e2el"), "mean")
    if not (t0 and t1 and e0 and e1):
        return _res(cid, title, NA, INFO, "needs request throughput and mean E2EL in both runs.")
    gain, drop = t1 / t0 - 1, 1 - e1 / e0
    mismatch = (t1 / t0) * (e1 / e0) - 1
    ev = dict(throughput_gain=gain, e2el_drop=drop, expected_gain_from_e2el=e0 / e1 - 1, mismatch=mismatch,
              baseline_request_throughput=t0, request_throughput=t1, baseline_e2el_mean_ms=e0, e2el_mean_ms=e1,
              tol=th.consistency_tol, baseline=other.get("source"))
    if abs(mismatch) > th.consistency_tol:
        return _res(cid, title, FAIL, ANOMALY,
                    f"throughput changed {_sg(gain)} but mean E2EL changed {_sg(-drop)} (it should have moved to {e0 / (1 + gain):.1f} ms "
                    f"for the same requests in flight; mismatch {_sg(mismatch)} > ±{th.consistency_tol:.0%}): one of the two runs is "
                    "mismeasured (duration, failed requests, different request set, client limits). Do not compare them.", **ev)
    return _res(cid, title, PASS, INFO,
                f"throughput {_sg(gain)} and mean E2EL {_sg(-drop)} agree (mismatch {_sg(mismatch)}).", **ev)


def check_tokens_vs_requested(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """Under ignore_eos the server's usage counts equal the requested output lengths. Why:
    otherwise the runs did not do the work the throughput figure claims (truncation by
    max-model-len, a server ignoring ignore_eos, a client counting events not tokens)."""
    cid, title = "tokens_vs_requested", "output tokens = requested (ignore_eos)"
    if rep.get("ignore_eos") is not True:
        return _res(cid, title, NA, INFO,
                    "applies when ignore_eos fixes the output length; " +
                    ("this run let the model stop at EOS." if rep.get("ignore_eos") is False else "the report does not say it was set."))
    req, got = rep.get("requested_output_tokens"), rep.get("total_output_tokens")
    if not req or got is None:
        return _res(cid, title, NA, INFO, "the report gives no requested output token total.")
    rel = got / req - 1
    ev = dict(requested_output_tokens=req, output_tokens=got, deviation=rel, tol=th.token_tol)
    recs = [r for r in _ok_records(rep) if r["output_len"] is not None and r["completion_tokens"] is not None]
    if recs:
        ev["records_mismatched"] = sum(1 for r in recs if r["completion_tokens"] != r["output_len"])
        ev["records_compared"] = len(recs)
    if abs(rel) > th.token_tol:
        return _res(cid, title, FAIL, ANOMALY,
                    f"the server reported {_f(got)} output tokens for {_f(req)} requested under ignore_eos ({_sg(rel)}): the "
                    "requests did not produce the lengths asked for (max-model-len truncation, ignore_eos not honoured, or token "
                    "counts not taken from usage). Throughput per token is not comparable until this matches.", **ev)
    return _res(cid, title, PASS, INFO, f"{_f(got)} output tokens for {_f(req)} requested ({_sg(rel, '+.2%')}).", **ev)


def check_tokens_client_vs_server(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """Client token totals vs the server's /metrics counter deltas over the run. Why: more on
    the server means other traffic shared it during the run; fewer means the client counts
    tokens differently (re-tokenisation, special tokens, events instead of tokens)."""
    cid, title = "tokens_client_vs_server", "client token counts = server counters"
    d = (rep.get("server") or {}).get("delta")
    if not isinstance(d, dict):
        return _res(cid, title, NA, INFO, "needs the server's /metrics counter deltas over the run (a vkit summary with /metrics).")
    f = rep.get("failed") or 0
    ev: dict[str, Any] = {"failed": f, "tol": th.token_tol}
    bad = []
    for key, ckey in (("prompt_tokens", "total_input_tokens"), ("generation_tokens", "total_output_tokens")):
        s, c = d.get(key), rep.get(ckey)
        if s is None or not c:
            continue
        ev[f"client_{key}"], ev[f"server_{key}"] = c, s
        rel = s / c - 1
        ev[f"{key}_deviation"] = rel
        allow_hi = th.token_tol + (f * (c / max(rep.get("completed") or 1, 1)) / c if f else 0.0)
        if rel < -th.token_tol or rel > allow_hi:
            bad.append((key, c, s, rel))
    if len(ev) <= 2:
        return _res(cid, title, NA, INFO, "the server counters or the client totals are missing.")
    if bad:
        key, c, s, rel = bad[0]
        why = ("the server processed more than this client sent: other traffic shared the server during the run, so its "
               "load and latency are not this benchmark's alone" if rel > 0 else
               "the client counts more than the server processed: token counts are not taken from usage (re-tokenised text, "
               "counted events)")
        return _res(cid, title, FAIL, ANOMALY,
                    f"{key.replace('_', ' ')}: client {_f(c)} vs server {_f(s)} ({_sg(rel)}): {why}.", **ev)
    return _res(cid, title, PASS, INFO, "client token totals match the server's counters over the run.", **ev)


def check_client_saturation(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """The load generator's own CPU and scheduling lag. Why: a saturated client delays sends
    and reads, so every latency it reports is inflated by itself, not by the server."""
    cid, title = "client_saturation", "client not saturated"
    cl = rep.get("client")
    if not cl:
        return _res(cid, title, NA, INFO, "the report carries no client CPU or scheduling-lag figures (a vkit summary does).")
    cpu = cl.get("cpu_frac_of_one_core")
    lag = (cl.get("sched_lag") or {}).get("p99_ms")
    if cpu is None and lag is None:
        return _res(cid, title, NA, INFO, "the report carries no client CPU or scheduling-lag figures.")
    ev = dict(cpu_frac_of_one_core=cpu, sched_lag_p99_ms=lag, cpu_max=th.client_cpu_max, sched_lag_max_ms=th.sched_lag_max_ms)
    bad = []
    if cpu is not None and cpu > th.client_cpu_max:
        bad.append(f"the client used {cpu:.0%} of a core (> {th.client_cpu_max:.0%})")
    if lag is not None and lag > th.sched_lag_max_ms:
        bad.append(f"its p99 scheduling lag was {_f(lag)} ms (> {_f(th.sched_lag_max_ms)} ms)")
    if bad:
        return _res(cid, title, FAIL, ANOMALY,
                    f"{' and '.join(bad)}: the load generator was saturated, so latency figures include its own delays. Run it "
                    "on a less loaded machine or with less concurrency per process; a server on the same machine runs "
                    "better niced in the client's session, or with its autogroup lowered (echo 10 > /proc/PID/autogroup).",
                    **ev)
    return _res(cid, title, PASS, INFO, f"client CPU {cpu:.0%} of a core, p99 scheduling lag {_f(lag)} ms." if cpu is not None and lag is not None
                else "client CPU and scheduling lag within limits.", **ev)


def check_client_server_ttft_gap(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """Client mean TTFT vs the server's own (/metrics histogram delta). Why: a gap beyond the
    usual few tens of ms is network, proxy or client overhead, not the engine being tuned."""
    cid, title = "client_server_ttft_gap", "client TTFT close to server TTFT"
    d = (rep.get("server") or {}).get("delta")
    st = (d or {}).get("ttft") if isinstance(d, dict) else None
    srv = (st or {}).get("mean_ms")
    cli = _stat(rep["metrics"].get("ttft"), "mean")
    if srv is None or cli is None:
        return _res(cid, title, NA, INFO, "needs the server's TTFT histogram over the run (a vkit summary with /metrics).")
    if ctx["identity"]["holds"] or rep.get("stream") is False:
        return _res(cid, title, NA, INFO, "the client's TTFT is the total latency here (no streaming); nothing to compare.",
                    client_ttft_mean_ms=cli, server_ttft_mean_ms=srv)
    gap = cli - srv
    ev = dict(client_ttft_mean_ms=cli, server_ttft_mean_ms=srv, gap_ms=gap, tol_ms=th.client_server_ttft_tol_ms,
              server_requests=st.get("count"), client_requests=rep.get("completed"))
    if abs(gap) > th.client_server_ttft_tol_ms:
        why = ("time spent outside the engine (network, proxy, client overhead): tuning the server cannot remove it"
               if gap > 0 else "the client reports a faster first token than the server measured: the client's clock or "
               "TTFT definition is wrong")
        return _res(cid, title, FAIL, ANOMALY,
                    f"client TTFT {_f(cli)} ms vs server {_f(srv)} ms (gap {gap:+.1f} ms > ±{_f(th.client_server_ttft_tol_ms)} ms): {why}.",
                    **ev)
    return _res(cid, title, PASS, INFO, f"client TTFT {_f(cli)} ms vs server {_f(srv)} ms (gap {gap:+.1f} ms).", **ev)


_ALIASES = {"cache_dtype": "kv_cache_dtype"}


def reported_config(server: dict | None) -> dict:
    """What the server says it runs: max_model_len (/v1/models), cache_config labels (/metrics)
    and any ``config`` object, under vLLM's names."""
    from vkit.apply.policy import canonical

    out: dict[str, Any] = {}
    if not server:
        return out
    for k, v in (server.get("cache_config") or {}).items():
        out[_ALIASES.get(canonical(k), canonical(k))] = v
    for k, v in (server.get("config") or {}).items() if isinstance(server.get("config"), dict) else []:
        out[_ALIASES.get(canonical(k), canonical(k))] = v
    if server.get("max_model_len") is not None:
        out["max_model_len"] = server["max_model_len"]
    return out


def check_server_config(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """The configuration the server reports vs the one the trial meant to apply. Why: a
    restart that did not take the change measures the old configuration; any verdict about
    the candidate drawn from it is wrong."""
    cid, title = "server_config", "server runs the intended configuration"
    want = ctx.get("expect") or {}
    if not want:
        return _res(cid, title, NA, INFO, "no intended configuration given (--expect-config K=V ... or FILE.json).")
    have = reported_config(rep.get("server"))
    if not have:
        return _res(cid, title, NA, INFO, "the report carries no server-reported configuration (a vkit summary does).",
                    expected=want)
    from vkit.apply.policy import canonical

    mism, matched, unverified = {}, [], []
    for k, v in sorted(want.items()):
        key = _ALIASES.get(canonical(k), canonical(k))
        if key not in have:
            unverified.append(key)
        elif same_value(v, have[key]):
            matched.append(key)
        else:
            mism[key] = {"expected": v, "reported": have[key]}
    ev = dict(mismatched=mism, matched=matched, unverified=unverified)
    if mism:
        txt = ", ".join(f"{k} = {m['reported']} (meant {m['expected']})" for k, m in mism.items())
        return _res(cid, title, FAIL, INVALID,
                    f"the server reports {txt}: this run measured another configuration than the trial's. Check that the "
                    "restart applied the change (restart_with_rollback, post_start_verify) and measure again.", **ev)
    if not matched:
        return _res(cid, title, NA, INFO,
                    f"the server reports none of {', '.join(unverified)}; nothing to confirm.", **ev)
    extra = f"; not reported by the server, so unverified: {', '.join(unverified)}" if unverified else ""
    return _res(cid, title, PASS, INFO, f"server reports {', '.join(matched)} as intended{extra}.", **ev)


def check_complete_run(rep: dict, th: Thresholds, ctx: dict) -> dict:
    """Every request sent ended (completed or failed) and the run was not interrupted. Why: an
    interrupted run's summary covers a different, shorter request set."""
    cid, title = "complete_run", "run complete"
    c, f, n = rep.get("completed"), rep.get("failed"), rep.get("num_prompts")
    ev = dict(completed=c, failed=f, num_prompts=n, partial=rep.get("partial"))
    if rep.get("partial"):
        return _res(cid, title, FAIL, ANOMALY,
                    "the run was interrupted (partial): the summary covers the requests that ended before the stop, not the "
                    "planned set. Rerun it to the end before comparing.", **ev)
    if c is not None and f is not None and n and c + f < n:
        return _res(cid, title, FAIL, ANOMALY,
                    f"{_f(c + f)} of {_f(n)} requests ended: the rest never finished, so the summary covers another request set.", **ev)
    if c is not None and f is None and n and c < n:
        return _res(cid, title, FAIL, ANOMALY,
                    f"{_f(c)} of {_f(n)} requests completed and the report gives no failed count: the other {_f(n - c)} "
                    "failed or never ended, and either way the summary covers another request set.", **ev)
    if c is None or not n:
        return _res(cid, title, NA, INFO, "the report gives no planned request count.", **ev)
    return _res(cid, title, PASS, INFO, f"{_f(c + (f or 0))} of {_f(n)} requests ended.", **ev)


CHECKS: tuple[tuple[str, Callable[[dict, Thresholds, dict], dict]], ...] = (
    ("streaming", check_streaming),
    ("ttft_e2el_identity", check_ttft_e2el_identity),
    ("decode_timing", check_decode_timing),
    ("phase_order", check_phase_order),
    ("error_rate", check_error_rate),
    ("failed_in_latency_stats", check_failed_in_latency_stats),
    ("percentile_samples", check_percentile_samples),
    ("warmup_outliers", check_warmup_outliers),
    ("littles_law", check_littles_law),
    ("throughput_latency_consistency", check_throughput_latency_consistency),
    ("tokens_vs_requested", check_tokens_vs_requested),
    ("tokens_client_vs_server", check_tokens_client_vs_server),
    ("client_saturation", check_client_saturation),
    ("client_server_ttft_gap", check_client_server_ttft_gap),
    ("server_config", check_server_config),
    ("complete_run", check_complete_run),
)


# --------------------------------------------------------------------------- evaluate


def summary_of(rep: dict) -> dict:
    m = rep["metrics"]
    return _r({
        "completed": rep.get("completed"), "failed": rep.get("failed"), "duration_s": rep.get("duration_s"),
        "request_throughput": rep.get("request_throughput"), "output_throughput": rep.get("output_throughput"),
        "mean_input_tokens": rep.get("mean_input_tokens"), "mean_output_tokens": rep.get("mean_output_tokens"),
        "max_concurrency": rep.get("max_concurrency"), "load": rep.get("load"),
        "ttft_mean_ms": _stat(m.get("ttft"), "mean"), "ttft_p99_ms": _stat(m.get("ttft"), "p99"),
        "tpot_mean_ms": _stat(m.get("tpot"), "mean"), "itl_mean_ms": _stat(m.get("itl"), "mean"),
        "e2el_mean_ms": _stat(m.get("e2el"), "mean"), "e2el_p99_ms": _stat(m.get("e2el"), "p99"),
    })


def evaluate(rep: dict, th: Thresholds | None = None, other: dict | None = None, expect: dict | None = None) -> dict:
    """Run every check on a normalised report; the verdict and the per-check results."""
    th = th or Thresholds()
    ctx = {"identity": identity(rep, th), "other": other, "expect": expect or {}}
    checks = [fn(rep, th, ctx) for _, fn in CHECKS]
    sev = {c["severity"] for c in checks if c["status"] == FAIL}
    verdict = "invalid" if INVALID in sev else ("anomaly" if ANOMALY in sev else "valid")
    out = {
        "tool": "check_invariants",
        "source": rep.get("source"),
        "format": rep.get("format"),
        "valid": verdict == "valid",
        "verdict": verdict,
        "findings": [c["id"] for c in checks if c["status"] == FAIL and c["severity"] in (INVALID, ANOMALY)],
        "notes": list(rep.get("notes") or []),
        "summary": summary_of(rep),
        "thresholds": _r(asdict(th)),
        "checks": checks,
    }
    if other is not None:
        out["compare"] = other.get("source")
    if rep.get("records_source"):
        out["records"] = rep["records_source"]
    return out


def worst(verdicts: list[str]) -> str:
    order = {"valid": 0, "anomaly": 1, "invalid": 2}
    return max(verdicts, key=lambda v: order[v]) if verdicts else "valid"


VERDICT_CODE = {"valid": ExitCode.OK, "anomaly": ExitCode.REJECTED, "invalid": ExitCode.INVALID}


@dataclass
class Check:
    """check_invariants' verdict on one report: ``code`` is the exit code the tool gives it."""

    verdict: str
    result: dict

    @property
    def code(self) -> ExitCode:
        return VERDICT_CODE[self.verdict]

    @property
    def findings(self) -> list[str]:
        return list(self.result.get("findings") or [])

    @property
    def failed(self) -> list[str]:
        return [c.get("id") for c in self.result.get("checks", []) if c.get("status") == FAIL]


def check_file(path: str, th: Thresholds | None = None, fmt: str = "auto", records: str | None = None,
               stdin: Any = None, other: dict | None = None, expect: dict | None = None) -> Check:
    """Read, normalise and check one report (``-`` reads ``stdin``): what check_invariants does
    for each REPORT. Unreadable input raises ``UsageError``."""
    res = evaluate(load_report(path, fmt, stdin=stdin, records=records), th, other=other, expect=expect)
    return Check(res["verdict"], res)


def parse_expected_config(items: list[str]) -> dict:
    """``k=v`` items and JSON files (a config object, or one holding ``"config"``) → dict."""
    from vkit.apply.policy import canonical

    out: dict[str, Any] = {}
    for item in items or []:
        if "=" in item and not os.path.exists(item):
            k, v = item.split("=", 1)
            if not canonical(k):
                raise UsageError(f"empty parameter name in --expect-config {item!r}")
            out[canonical(k)] = v
            continue
        try:
            doc = read_json(item, "--expect-config file")
        except FileNotFoundError:
            raise UsageError(f"--expect-config takes K=V items or a JSON file; {item!r} is neither") from None
        if isinstance(doc, dict) and isinstance(doc.get("config"), dict):
            doc = doc["config"]
        if not isinstance(doc, dict) or "vkit" in doc or "completed" in doc:
            raise UsageError(f"--expect-config file {item} is not a configuration object (put REPORT before --expect-config)")
        out.update({canonical(k): v for k, v in doc.items()})
    return out


# --------------------------------------------------------------------------- human table

_MARK = {PASS: "pass", FAIL: "FAIL", NA: "n/a"}


def render_table(result: dict, width: int = 118) -> str:
    """The result as a table for people: one row per check, failures with their explanation."""
    import textwrap

    lines = [f"{result.get('source')} ({result.get('format')}): {result['verdict'].upper()}"
             + (f" — {', '.join(result['findings'])}" if result["findings"] else "")]
    lines.append(f"  {'status':<6} {'severity':<8} {'check':<31} finding")
    for c in result["checks"]:
        sev = c["severity"] if c["status"] == FAIL else "-"
        head = f"  {_MARK[c['status']]:<6} {sev:<8} {c['id']:<31} "
        text = c["explanation"]
        if c["status"] == FAIL or text.startswith("not applicable —"):
            wrapped = textwrap.wrap(text, width=max(40, width - len(head))) or [""]
            lines.append(head + wrapped[0])
            lines += [" " * len(head) + w for w in wrapped[1:]]
        else:
            room = max(20, width - len(head))
            lines.append(head + (text if len(text) <= room else text[: room - 1] + "…"))
    for n in result.get("notes") or []:
        lines += textwrap.wrap(n, width=width, initial_indent="  note: ", subsequent_indent="        ")
    return "\n".join(lines) + "\n"
