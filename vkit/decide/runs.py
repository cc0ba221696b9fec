"""The runs gate compares: loading summaries (``load_summary``), check_invariants on each
(``validate``), the gauge (``gauge_of``, ``check_same_gauge``, ``check_seeds``: the same
measurement on both sides), the environment (``check_same_environment``: the same driver,
accelerator, server version, model, dtype and quantisation on both sides), the design
(``detect_layout``, ``pair_indices``, ``drift_warning``) and the metric values (``metric_logs``).
``vkit.cli.drift`` and the tune runner use them too."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from scipy import stats as _sps

from vkit import environment
from vkit.errors import InvalidData, UsageError, VkitError
from vkit.jsonio import load_json_file
from vkit.validate import invariants

# The gauge: what must match between baseline and candidate (vkit summaries).
GAUGE_TOP = ("endpoint_type", "backend", "model_id", "num_prompts", "max_concurrency", "request_rate", "burstiness")
GAUGE_VKIT = ("stream", "endpoint", "ignore_eos", "warmups", "goodput_slo_ms", "client.name", "client.version", "dataset",
              "exact_rate")


@dataclass
class Run:
    path: str
    doc: dict
    arm: str  # baseline | candidate
    fresh: bool = False
    when: _dt.datetime | None = None
    verdict: str | None = None
    digest: str = ""


def parse_date(value: Any) -> _dt.datetime | None:
    """A summary's ``date`` (vLLM's ``%Y%m%d-%H%M%S``, or ISO 8601); None when absent or odd."""
    if not isinstance(value, str) or not value:
        return None
    for fmt in ("%Y%m%d-%H%M%S",):
        try:
            return _dt.datetime.strptime(value, fmt)
        except ValueError:
            pass
    try:
        d = _dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    return d.replace(tzinfo=None) if d.tzinfo is None else d.astimezone(_dt.timezone.utc).replace(tzinfo=None)


def load_summary(path: str, arm: str, fresh: bool = False) -> Run:
    doc, raw = load_json_file(path)  # a missing, unreadable or bad file: UsageError
    if not isinstance(doc, dict) or "completed" not in doc:
        from vkit.validate.formats import detect

        fmt = detect(doc)
        hint = f" (it looks like {fmt})" if fmt else ""
        raise UsageError(
            f"{path} is not a bench_stream summary or a `vllm bench serve --save-result` JSON{hint}; gate compares those"
        )
    return Run(path, doc, arm, fresh, parse_date(doc.get("date")), digest=hashlib.sha256(raw).hexdigest())


Checker = Callable[[str], tuple[int, dict | None, str]]


def check_invariants(path: str) -> tuple[int, dict | None, str]:
    """check_invariants' verdict on one file: its exit code, its result and, when the file
    cannot be read, the reason."""
    try:
        c = invariants.check_file(path)
    except VkitError as e:
        return int(e.code), None, " ".join(str(e).split())
    return int(c.code), c.result, ""


def validate(runs: list[Run], allow_anomaly: bool, checker: Checker | None = None) -> list[str]:
    """check_invariants on every run: invalid → InvalidData; anomaly → InvalidData unless
    allowed (then a warning). Returns the warnings. Sets ``run.verdict``."""
    checker = checker or check_invariants
    warnings = []
    for r in runs:
        code, doc, err = checker(r.path)
        failed = []
        if isinstance(doc, dict):
            failed = [c.get("id") for c in doc.get("checks", []) if c.get("status") == "fail"]
        if code == 0:
            r.verdict = "valid"
        elif code == 1:
            r.verdict = "anomaly"
            msg = f"{r.path} ({r.arm}) has an anomaly by check_invariants ({', '.join(failed) or 'see check_invariants'})"
            if not allow_anomaly:
                raise InvalidData(f"{msg}; explain it and re-measure, or pass --allow-anomaly to decide anyway")
            warnings.append(msg + "; deciding anyway (--allow-anomaly)")
        elif code == 3:
            r.verdict = "invalid"
            raise InvalidData(
                f"{r.path} ({r.arm}) is invalid by check_invariants ({', '.join(failed) or 'see check_invariants'}): "
                "the data cannot support any verdict; fix the gauge and re-measure"
            )
        elif code == 2:
            raise UsageError(f"check_invariants could not read {r.path}: {err or 'usage error'}")
        else:
            raise VkitError(f"check_invariants failed on {r.path} (exit {code}): {err}")
    return warnings


def _flatten(prefix: str, obj: Any, out: dict) -> None:
    if isinstance(obj, dict):
        for k in sorted(obj):
            _flatten(f"{prefix}.{k}" if prefix else k, obj[k], out)
    else:
        out[prefix] = _norm_value(obj)


def _norm_value(v: Any) -> Any:
    if isinstance(v, float):
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if v.is_integer():
            return int(v)
    if isinstance(v, str) and v.lower() in ("inf", "infinity"):
        return "inf"
    return v


def gauge_of(doc: dict) -> tuple[str, dict]:
    """("vkit" | "vllm-bench", the measured-the-same-way fields flattened)."""
    g: dict = {}
    v = doc.get("vkit")
    timed = isinstance(v, dict) and isinstance(v.get("dataset"), dict) and v["dataset"].get("duration_s") is not None
    for k in GAUGE_TOP:
        if k in doc and not (timed and k == "num_prompts"):  # a timed run sends what fits in its duration
            g[k] = _norm_value(doc[k])
    if not isinstance(v, dict):
        return "vllm-bench", g
    for k in GAUGE_VKIT:
        cur: Any = v
        for part in k.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        _flatten(f"vkit.{k}", cur, g)
    return "vkit", g


def check_same_gauge(runs: list[Run]) -> tuple[dict, list[str]]:
    """Compare every run's gauge with the first baseline's; InvalidData naming the first
    difference. Returns a description and warnings (plain vLLM files cannot be fully compared)."""
    ref = runs[0]
    kind0, g0 = gauge_of(ref.doc)
    for r in runs[1:]:
        kind, g = gauge_of(r.doc)
        if kind != kind0:
            raise InvalidData(
                f"different gauge: {ref.path} ({ref.arm}) is a {kind0} summary but {r.path} ({r.arm}) is a {kind} one; "
                f"they differ in {cross_gauge_differences(ref.doc, g0, r.doc, g)}; "
                "measure baseline and candidate with the same client (vkit never compares across a gauge change)"
            )
        for key in sorted(set(g0) | set(g)):
            a, b = g0.get(key, "<absent>"), g.get(key, "<absent>")
            if a != b:
                raise InvalidData(
                    f"different gauge: {key} is {json.dumps(a)} in {ref.path} ({ref.arm}) but {json.dumps(b)} in "
                    f"{r.path} ({r.arm}); re-measure both sides the same way (a gauge change and a real change cannot be told apart)"
                )
    check_seeds(runs)
    warnings = []
    if kind0 == "vllm-bench":
        warnings.append(
            "plain `vllm bench serve` results: streaming, dataset, seed and client version are not recorded, so the gauge "
            "could be compared only on " + (", ".join(sorted(g0)) or "nothing") + "; prefer bench_stream summaries"
        )
    return {"kind": kind0, "compared": sorted(g0)}, warnings


def fingerprint_of(r: Run) -> dict | None:
    v = r.doc.get("vkit")
    fp = v.get("fingerprint") if isinstance(v, dict) else None
    return fp if isinstance(fp, dict) else None


def check_same_environment(runs: list[Run]) -> None:
    """Every run's environment fingerprint against every other's; InvalidData naming the fields of the
    first pair that differs (a field one side does not record, e.g. a plain vLLM file's, is not compared)."""
    seen: list[tuple[Run, dict]] = []
    for r in runs:
        fp = fingerprint_of(r)
        if fp is None:
            continue
        for ref, fp0 in seen:
            found = environment.changes(fp0, fp)
            if found:
                raise InvalidData(
                    f"different environment: {environment.describe(found)} from {ref.path} ({ref.arm}) to {r.path} "
                    f"({r.arm}); re-measure both sides in one environment (an environment change and a real change "
                    "cannot be told apart)"
                )
        seen.append((r, fp))


CLIENT_NAMES = {"vkit": "vkit bench_stream", "vllm-bench": "vllm bench serve"}


def _client_of(kind: str, doc: dict) -> str:
    v = doc.get("vkit")
    client = v.get("client") if isinstance(v, dict) else None
    if isinstance(client, dict) and client.get("name"):
        return f"{client['name']} {client.get('version') or ''}".strip()
    return CLIENT_NAMES.get(kind, kind)


def _input_per_request(doc: dict) -> float | None:
    n, tok = doc.get("completed"), doc.get("total_input_tokens")
    return tok / n if isinstance(n, (int, float)) and n > 0 and isinstance(tok, (int, float)) else None


def cross_gauge_differences(doc_a: dict, g_a: dict, doc_b: dict, g_b: dict) -> str:
    """What differs, by name, between two summaries written by different clients: the client,
    the fields both record with other values, the input tokens per request (token ids vs text the
    server re-tokenises), and what only one side records (so cannot be compared)."""
    kind_a = "vkit" if isinstance(doc_a.get("vkit"), dict) else "vllm-bench"
    kind_b = "vkit" if isinstance(doc_b.get("vkit"), dict) else "vllm-bench"
    parts = [f"client ({_client_of(kind_a, doc_a)} vs {_client_of(kind_b, doc_b)})"]
    for key in sorted(set(g_a) & set(g_b)):
        if g_a[key] != g_b[key]:
            parts.append(f"{key} ({json.dumps(g_a[key])} vs {json.dumps(g_b[key])})")
    ia, ib = _input_per_request(doc_a), _input_per_request(doc_b)
    if ia is not None and ib is not None and abs(ia - ib) > 1e-9:
        parts.append(f"input tokens per request ({ia:.6g} vs {ib:.6g})")
    for side, only in ((kind_a, set(g_a) - set(g_b)), (kind_b, set(g_b) - set(g_a))):
        if only:
            groups = sorted({".".join(k.split(".")[:2]) for k in only})
            parts.append(f"recorded only by the {side} summary: " + ", ".join(groups))
    return "; ".join(parts)


def seed_of(r: Run) -> Any:
    v = r.doc.get("vkit")
    return v.get("seed") if isinstance(v, dict) else None


def check_seeds(runs: list[Run]) -> None:
    """Same request sets on both sides. Repeat k of each side may use its own seed k (distinct
    seeds per repeat keep a repeat from finding its prompts in the prefix cache of the repeat
    before), so seeds may differ between runs of one arm; but the shorter arm's seeds must all
    appear in the other arm, so that every compared request set was measured on both sides."""
    base = [seed_of(r) for r in runs if r.arm == "baseline"]
    cand = [seed_of(r) for r in runs if r.arm != "baseline"]
    if not base or not cand:
        return
    short, long_, sname, lname = (cand, base, "candidate", "baseline") if len(cand) <= len(base) else (base, cand, "baseline", "candidate")
    missing = sorted({json.dumps(x) for x in short} - {json.dumps(x) for x in long_})
    if missing:
        raise InvalidData(
            f"different gauge: the {sname} runs used dataset seed(s) {', '.join(missing)} that no {lname} run used; "
            "measure repeat k of both sides with the same seed (a different request set and a real change cannot be told apart)"
        )


def detect_layout(base: list[Run], cand: list[Run]) -> tuple[str, str]:
    """interleaved | blocked | unknown, from the run dates."""
    if not base or not cand or any(r.when is None for r in base + cand):
        return "unknown", "some runs carry no date"
    if max(r.when for r in base) < min(r.when for r in cand) or max(r.when for r in cand) < min(r.when for r in base):
        return "blocked", "run dates: one arm entirely before the other"
    return "interleaved", "run dates: the arms alternate"


def pair_indices(base: list[Run], cand: list[Run]) -> list[tuple[int, int]]:
    """Pairs (baseline index, candidate index), never looking at the values: with dates,
    each candidate run (in time order) takes the nearest unused baseline run in time; without,
    the candidate runs in the order given pair with the last baseline runs in order."""
    k = min(len(base), len(cand))
    if k == 0:
        return []
    if len({json.dumps(seed_of(r)) for r in base + cand}) > 1:
        # Repeats with their own seeds: pair the same request sets, nearest in time (or in order).
        free = list(range(len(base)))
        pairs = []
        c_order = sorted(range(len(cand)), key=lambda i: (cand[i].when is None, cand[i].when or 0, i)) \
            if all(r.when is not None for r in cand) else list(range(len(cand)))
        for ic in c_order:
            same = [ib for ib in free if seed_of(base[ib]) == seed_of(cand[ic])]
            if not same:
                continue
            if cand[ic].when is not None and all(base[ib].when is not None for ib in same):
                ib = min(same, key=lambda i: (abs((base[i].when - cand[ic].when).total_seconds()), i))
            else:
                ib = same[0]
            free.remove(ib)
            pairs.append((ib, ic))
        return pairs
    if all(r.when is not None for r in base + cand):
        c_order = sorted(range(len(cand)), key=lambda i: cand[i].when)
        free = set(range(len(base)))
        pairs = []
        for ic in c_order[:k] if len(cand) <= len(base) else c_order[-k:]:
            ib = min(free, key=lambda i: (abs((base[i].when - cand[ic].when).total_seconds()), i))
            free.discard(ib)
            pairs.append((ib, ic))
        return sorted(pairs, key=lambda p: cand[p[1]].when)
    off_b, off_c = len(base) - k, len(cand) - k
    return [(off_b + i, off_c + i) for i in range(k)]


def metric_logs(runs: list[Run], name: str) -> np.ndarray:
    vals = []
    for r in runs:
        v = r.doc.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise InvalidData(f"{r.path} has no numeric {name!r}; pick a metric every run reports")
        if v <= 0:
            raise InvalidData(f"{r.path}: {name} = {v}; a relative comparison needs a positive value")
        vals.append(math.log(v))
    return np.asarray(vals)


def has_metric(runs: list[Run], name: str) -> bool:
    for r in runs:
        v = r.doc.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
            return False
    return True


def drift_warning(base: list[Run], cand: list[Run], name: str, layout: str) -> str | None:
    """A linear drift within the arms (log metric against run order, common slope with one
    level per arm, OLS t-test at 5%): with blocked runs it reads as an effect."""
    runs = base + cand
    if len(base) < 3 or len(cand) < 3 or any(r.when is None for r in runs):
        return None
    order = sorted(range(len(runs)), key=lambda i: runs[i].when)
    pos = np.empty(len(runs))
    pos[order] = np.arange(len(runs))
    y = np.concatenate([metric_logs(base, name), metric_logs(cand, name)])
    arm = np.r_[np.zeros(len(base)), np.ones(len(cand))]
    x = np.column_stack([np.ones(len(runs)), arm, pos])
    coef, _res, rank, _sv = np.linalg.lstsq(x, y, rcond=None)
    dof = len(runs) - 3
    if rank < 3 or dof < 2:
        return None
    resid = y - x @ coef
    s2 = float(resid @ resid) / dof
    cov = s2 * np.linalg.pinv(x.T @ x)
    se = math.sqrt(max(cov[2, 2], 0.0))
    if se == 0:
        return None
    p = float(2 * _sps.t.sf(abs(coef[2]) / se, dof))
    if p >= 0.05:
        return None
    slope = math.expm1(coef[2])
    gap = float(pos[len(base):].mean() - pos[: len(base)].mean())
    if layout == "blocked":
        return (
            f"blocked runs under drift: {name} drifts {slope:+.2%} per run (p = {p:.3f}); between the blocks "
            f"({gap:.1f} runs apart) that alone reads as {math.expm1(coef[2] * gap):+.2%}; interleave baseline and candidate (ABBA)"
        )
    return f"{name} drifts {slope:+.2%} per run (p = {p:.3f}); interleaving cancels its linear part"
