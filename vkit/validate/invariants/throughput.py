"""Throughput checks: Little's law in a closed loop (throughput × mean E2EL ≈ requests in flight) and,
against a second run (--compare), throughput gain matching the E2EL drop."""

from __future__ import annotations

from vkit.validate.invariants.common import ANOMALY, FAIL, INFO, NA, PASS, Thresholds, _f, _res, _sg, _stat


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
