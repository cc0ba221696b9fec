"""Streaming checks: the source's record of streaming, the TTFT ≡ E2EL identity and whether decode
was timed token by token (TPOT, ITL). A failure here is ``invalid``: no TTFT- or decode-derived
figure means anything."""

from __future__ import annotations

from vkit.validate.invariants.common import FAIL, INFO, INVALID, NA, PASS, Thresholds, _f, _res, _stat


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
