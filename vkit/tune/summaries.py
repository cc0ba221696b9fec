"""What a run's summary (or a capacity document) says, in the forms the tune reads it."""

from __future__ import annotations

import json
import math
import os
from typing import Any

from vkit.errors import ExitCode, VkitError
from vkit.jsonio import read_json_file

KEY_METRICS = ("output_throughput", "request_throughput", "request_goodput", "p95_ttft_ms", "p99_ttft_ms", "mean_ttft_ms",
               "mean_tpot_ms", "p95_tpot_ms", "mean_e2el_ms", "p95_e2el_ms",
               # the capacity objective's measurement (vkit.tune.capacity.capacity_document)
               "slo_capacity", "capacity_output_tok_s", "ref_mean_tpot_ms", "ref_per_user_output_tok_s",
               # board energy, where power was read (vkit.measure.energy; at the capacity: vkit.tune.capenergy)
               "j_per_output_token", "j_per_request", "mean_power_w", "slo_capacity_per_kw", "ref_j_per_output_token")


def plain(obj: Any) -> Any:
    """``obj`` as the JSON a tool writes and a state file holds (tuples as lists, numbers as
    JSON numbers, anything else as its string)."""
    return json.loads(json.dumps(obj, default=str))


def relative(p: str, base: str) -> str:
    return os.path.relpath(p, base)


def brief(doc: dict) -> str:
    """A run in one phrase for progress lines: a capacity search's answer, else throughput and P95 TTFT."""
    if "slo_capacity" in doc:
        lo, hi, ref = doc.get("capacity_holds"), doc.get("capacity_fails"), doc.get("ref_per_user_output_tok_s")
        unit = capacity_unit(doc)
        return (f"capacity {doc['slo_capacity']:.3g} {unit} (holds {lo if lo is not None else '-'}, fails "
                f"{hi if hi is not None else '-'})" + (f", {ref:.0f} tok/s per user at {doc.get('reference_load'):g} {unit}"
                                                       if isinstance(ref, (int, float)) else ""))
    return f"{doc['output_throughput']:.0f} out tok/s, P95 TTFT {doc['p95_ttft_ms']:.0f} ms"


def bench_failed(e: VkitError) -> VkitError:
    """A measurement's error as the tune reports it: bench_stream's exit code, unreachable as 4."""
    return VkitError(f"bench_stream failed (exit {int(e.code)}): {' '.join(str(e).split())}",
                     ExitCode.UNAVAILABLE if e.code == 4 else e.code)


def capacity_unit(doc: dict) -> str:
    """The load unit of a capacity document's search (req/s, streams, or a trace's speed-up)."""
    return ((doc.get("vkit") or {}).get("capacity") or {}).get("unit") or "req/s"


def capacity_checker(path: str) -> tuple[int, dict | None, str]:
    """gate's check of a capacity document: its load points were each checked by check_invariants
    inside the search (invalid runs entered no verdict); the document is invalid when no point
    gave a clear verdict."""
    try:
        doc = read_json_file(path)[0]
    except (OSError, ValueError, VkitError) as e:
        return int(ExitCode.USAGE), None, str(e)
    ok = bool((doc.get("vkit") or {}).get("valid"))
    return (0 if ok else int(ExitCode.INVALID)), {"checks": [] if ok else [{"id": "capacity_search", "status": "fail"}]}, ""


def cut_by_the_client(doc: dict) -> bool:
    """A capacity search that found no failing load because the load above its highest hold could not
    be measured (the client fell behind its schedule, or check_invariants refused the runs): its
    capacity is a lower bound, not an estimate."""
    curve = ((doc.get("vkit") or {}).get("capacity") or {}).get("curve") or []
    holds = doc.get("capacity_holds")
    if doc.get("capacity_fails") is not None or not isinstance(holds, (int, float)):
        return False
    return any(p.get("verdict") == "invalid" and (p.get("load") or 0) > holds for p in curve)


def summary_metrics(doc: dict) -> dict:
    return {k: doc.get(k) for k in KEY_METRICS if isinstance(doc.get(k), (int, float))}


def gmean(values: list[float]) -> float | None:
    v = [x for x in values if isinstance(x, (int, float)) and x > 0]
    return float(math.exp(sum(math.log(x) for x in v) / len(v))) if v else None


def aggregate(docs: list[dict]) -> dict:
    """Geometric means of the key metrics over repeats (effects are relative)."""
    out = {}
    for k in KEY_METRICS:
        g = gmean([d.get(k) for d in docs])
        if g is not None:
            out[k] = g
    return out
