"""Count and token checks: the error rate, failed requests kept out of the latency statistics, output
tokens equal to the requested lengths under ignore_eos, and every planned request ended."""

from __future__ import annotations

from vkit.validate.invariants.common import (
    ANOMALY,
    FAIL,
    INFO,
    INVALID,
    NA,
    PASS,
    Thresholds,
    _f,
    _ok_records,
    _pct,
    _res,
    _sg,
    _stat,
)


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
