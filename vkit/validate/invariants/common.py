"""What every invariant check shares: the result vocabulary (``PASS``/``FAIL``/``NA``, ``INVALID``/``ANOMALY``/``INFO``),
the tolerances (``Thresholds``), the result builder (``_res``) with its number formatting, statistic
look-up and record helpers, and the TTFT ≡ E2EL finding (``identity``) several checks read."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

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
