"""The report's words and numbers: names, units and rounding, shared by every format.

Everything here is pure text: no markup, no escaping (each format escapes its own), and a
value of the wrong type reads as missing instead of raising.
"""

from __future__ import annotations

import json
import math
import shlex
from typing import Any

SCHEMA = "vkit.tune/1"
BANNER = "SIMULATED server: figures are simulated, not measured"
X_KEY = "p95_ttft_ms"  # the latency axis of both plots
Y_DEFAULT = "output_throughput"

# key: (label, unit). Keys not listed get a label from their name and a unit from the suffix.
METRIC_INFO = {
    "output_throughput": ("output throughput", "tok/s"),
    "total_token_throughput": ("total throughput", "tok/s"),
    "request_throughput": ("request throughput", "req/s"),
    "request_goodput": ("goodput", "req/s"),
    "p95_ttft_ms": ("P95 TTFT", "ms"),
    "p99_ttft_ms": ("P99 TTFT", "ms"),
    "mean_ttft_ms": ("mean TTFT", "ms"),
    "median_ttft_ms": ("median TTFT", "ms"),
    "mean_tpot_ms": ("mean TPOT", "ms"),
    "p95_tpot_ms": ("P95 TPOT", "ms"),
    "mean_itl_ms": ("mean ITL", "ms"),
    "p95_e2el_ms": ("P95 E2EL", "ms"),
    "slo_capacity": ("SLO capacity", "req/s"),
    "ref_mean_tpot_ms": ("mean TPOT at the reference load", "ms"),
    "ref_per_user_output_tok_s": ("per-user output at the reference load", "tok/s"),
    "capacity_output_tok_s": ("output throughput at capacity", "tok/s"),
    "j_per_output_token": ("energy per output token", "J"),
    "ref_j_per_output_token": ("energy per output token at the reference load", "J"),
    "mean_power_w": ("board power", "W"),
    "slo_capacity_per_kw": ("SLO capacity per kW", "req/s"),
}
TRIAL_METRICS = ("slo_capacity", "capacity_output_tok_s", "ref_per_user_output_tok_s", "output_throughput", "request_goodput",
                 "p95_ttft_ms", "mean_ttft_ms", "mean_tpot_ms")
MAX_TRIAL_METRICS = 6


def num(v: Any) -> float | None:
    """A finite float, or None for anything else (bools, strings, NaN, missing)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def as_dict(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def as_list(v: Any) -> list:
    return v if isinstance(v, list) else []


def as_text(v: Any) -> str:
    """Text for a value given as text; empty for None."""
    if v is None:
        return ""
    return v if isinstance(v, str) else str(v)


def fmt_num(v: Any) -> str:
    """A number as a person reads it: at most 4 significant digits, integers kept whole."""
    f = num(v)
    if f is None:
        return "–" if v is None or isinstance(v, (int, float)) and not isinstance(v, bool) else as_text(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    if abs(f) >= 1e4:
        return f"{f:.0f}"
    if f != 0 and abs(f) < 1e-3:
        return f"{f:.2e}"
    out = f"{f:.4g}"
    return "0" if out == "-0" else out


def fmt_pct(v: Any) -> str:
    f = num(v)
    return "–" if f is None else f"{fmt_num(float(f'{100 * f:.3g}'))}%"


def upper_first(s: str) -> str:
    """The first letter in upper case, the rest as it is ("SLO capacity" stays, "mean TPOT" → "Mean TPOT")."""
    return s[:1].upper() + s[1:]


def metric_label(key: str) -> str:
    if key in METRIC_INFO:
        return METRIC_INFO[key][0]
    name = key
    for suf in ("_tok_s", "_ms", "_s"):
        if name.endswith(suf):
            name = name[: -len(suf)]
            break
    words = name.split("_")
    if words and words[0][:1] == "p" and words[0][1:].isdigit():
        words[0] = words[0].upper()
    return " ".join(words)


def metric_unit(key: str) -> str:
    if key in METRIC_INFO:
        return METRIC_INFO[key][1]
    if key.endswith("_tok_s"):
        return "tok/s"
    if key.endswith("_ms"):
        return "ms"
    if key.endswith("_s"):
        return "s"
    return ""


def axis_label(key: str) -> str:
    unit = metric_unit(key)
    return f"{metric_label(key)} ({unit})" if unit else metric_label(key)


def fmt_metric(v: Any, key: str) -> str:
    if num(v) is None:
        return "–"
    unit = metric_unit(key)
    return f"{fmt_num(v)} {unit}" if unit else fmt_num(v)


def value_text(v: Any) -> str:
    """A config or workload value as it reads in ``key=value``."""
    if isinstance(v, str):
        return v
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, (int, float)):
        return fmt_num(v) if isinstance(v, float) else str(v)
    return json.dumps(v, sort_keys=True, default=str)


def config_text(cfg: Any) -> str:
    """``max_num_seqs=64, max_num_batched_tokens=8192`` in the config's own order."""
    if isinstance(cfg, dict):
        return ", ".join(f"{k}={value_text(v)}" for k, v in cfg.items()) or "(defaults)"
    return as_text(cfg) or "–"


CONFIRMATION_NOTE = ("confirmed: kept = the kept configuration; confirmed on M = the gate accepted its advantage in "
                     "metric M over the kept configuration on fresh interleaved runs (each objective's change on those "
                     "runs in brackets); undecided = more runs needed; "
                     "screening only = never re-confirmed (its numbers carry the winner's curse).")


def confirmation_text(p: dict) -> str:
    """How a delivered configuration was confirmed, in a few words."""
    c = p.get("confirmation") if isinstance(p.get("confirmation"), dict) else {}
    d = c.get("decision")
    if d == "kept" or (p.get("confirmed") is True and not c):
        return "kept"
    if d == "accept":
        claim = as_text(c.get("claim")).split(":")[0]
        vs = c.get("vs_kept") if isinstance(c.get("vs_kept"), dict) else {}
        parts = [f"{metric_label(k)} {v:+.1%}" for k, v in sorted(vs.items(), key=lambda kv: kv[0] != claim)
                 if isinstance(v, (int, float))]
        return f"confirmed on {metric_label(claim)}" + (f" ({', '.join(parts)} vs kept)" if parts else "")
    if d == "undecided":
        return "undecided"
    if d == "underpowered":
        return "not measured: the budget cannot decide it"
    if d is None and "confirmed" in p:
        return "screening only"
    return as_text(d) if d else "–"


def flags_text(flags: Any) -> str:
    """A flag list as one shell-quoted string; empty when there is none."""
    if isinstance(flags, list) and flags:
        return shlex.join(as_text(f) for f in flags)
    return ""
