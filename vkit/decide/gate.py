"""GATE in the tuning state machine: accept, reject or leave undecided a candidate
configuration against the kept one, from repeated benchmark summaries of each.

Pipeline: ``bench_stream … > run.json`` (repeated, interleaved ABBA) → ``gate --baseline
B*.json --candidate C*.json`` (which runs check_invariants on every input itself). Order of
work, each step able to stop with a refusal:

1. every input valid by check_invariants (invalid → no verdict; anomaly → refused unless
   allowed);
2. the same gauge on both sides (streaming, endpoint, dataset and its seed, lengths,
   concurrency or rate, number of prompts, client version), the first difference named;
3. design: interleaved or blocked (from the run dates), the winner of a search confirmed on
   fresh runs only, no baseline run older than a detected change point;
4. per metric, on logs (relative effects): the effect, its interval, p- or e-value,
   threshold t = max(2σ_baseline, floor), σ, runs needed vs had, and a decision;
5. the joint decision: accept = primary improves by ≥ t AND no guard worse than its
   tolerance (intersection-union, each one-sided at α); which metrics changed with e-BH
   (sequential) or BH/BY (fixed).

The decision rule, sequential (default; ``stats`` has the formulas and their sources):
pairs (baseline, candidate) in time order; g = direction × (log c − log b).

- improves: the always-valid one-sided (1−α) lower bound of the confidence sequence on the
  mean of g is above 0, and the estimate is at least log(1 + t) (t the practical floor on
  top of the test, not the test itself);
- not enough (reject): the (1−β) upper confidence-sequence bound is below log(1 + t)
  (β = 1 − power; a time-uniform futility test), or, once the pairs reach the power
  analysis' n, the classical one-sided (1−α) upper bound is below it;
- otherwise undecided, with the number of further runs projected from the current estimate.

The confidence sequence is the normal mixture with σ_d = √2·max(σ_pooled, σ̂_now) when a
pooled σ from earlier A/A runs is given (state ``sigma_baseline`` or ``--sigma``), else the
scale-invariant t-mixture on the pair differences. Guards use the same machinery with the
tolerance in place of t: ok when the lower bound on g is above log(1 − tol). ``--fixed``
replaces the sequences with Welch's (blocked) or the paired (interleaved) t-test and
decides once, at the power analysis' n (at least 3 per arm): accept when p < α and the
estimate is at least log(1 + t), else reject; undecided before.

Nothing here prints or exits; refusals raise ``InvalidData``/``UsageError`` with a sentence.
The vectorised rule (``seq_bounds``, ``call_primary``, ``call_guard``) is shared with
``bench/bench_gate.py`` so that the benchmark measures this code, not a copy.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
from scipy import stats as _sps

from vkit.apply.policy import Policy
from vkit.decide import drift as _drift
from vkit.decide import stats as st
from vkit.decide.percent import parse_fraction
from vkit.errors import ExitCode, InvalidData, UsageError, VkitError
from vkit.validate import invariants

DEFAULT_PRIMARY = "output_throughput:+"
# Metrics reported (not decided on) when every run has them; primary and guards are added.
REPORT_METRICS = (
    "output_throughput",
    "request_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "p95_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p95_tpot_ms",
    "mean_itl_ms",
    "mean_e2el_ms",
    "p95_e2el_ms",
    "p99_e2el_ms",
)
# The gauge: what must match between baseline and candidate (vkit summaries).
GAUGE_TOP = ("endpoint_type", "backend", "model_id", "num_prompts", "max_concurrency", "request_rate", "burstiness")
GAUGE_VKIT = ("stream", "endpoint", "ignore_eos", "warmups", "goodput_slo_ms", "client.name", "client.version", "dataset")

ACCEPT, REJECT, UNDECIDED = "accept", "reject", "undecided"
EXIT_CODE = {ACCEPT: ExitCode.OK, REJECT: ExitCode.REJECTED}  # anything else: undecided
MAX_PROJECT = 200  # furthest look-ahead for "how many more runs"
MIN_FIXED_RUNS = 3  # --fixed never decides on fewer runs per arm


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class MetricSpec:
    """A metric and how to judge it: ``direction`` +1 when higher is better, −1 when lower is;
    ``tolerance`` (guards) the relative worsening allowed, None for max(2σ, floor)."""

    name: str
    direction: int
    role: str = "primary"
    tolerance: float | None = None

    @property
    def sign(self) -> str:
        return "+" if self.direction > 0 else "-"


def infer_direction(name: str) -> int | None:
    """+1 for rates (throughput, goodput, tok/s), −1 for times (``_ms``, ``_s``), else None."""
    if "throughput" in name or "goodput" in name or name.endswith("tok_s") or name.endswith("per_s"):
        return 1
    if name.endswith("_ms") or name.endswith("_s"):
        return -1
    return None


def parse_metric(text: str, role: str) -> MetricSpec:
    """``name``, ``name:+``, ``name:-`` or (guards) ``name:-:5%``."""
    parts = [p.strip() for p in text.split(":")]
    name = parts[0]
    if not name:
        raise UsageError(f"--{role} {text!r}: no metric name")
    if len(parts) > 3:
        raise UsageError(f"--{role} {text!r}: expected NAME[:+|-][:TOLERANCE]")
    if len(parts) >= 2 and parts[1]:
        if parts[1] not in ("+", "-"):
            raise UsageError(f"--{role} {text!r}: direction must be + (higher is better) or - (lower is better)")
        direction = 1 if parts[1] == "+" else -1
    else:
        d = infer_direction(name)
        if d is None:
            raise UsageError(f"--{role} {text!r}: cannot tell whether higher or lower is better; write {name}:+ or {name}:-")
        direction = d
    tol = None
    if len(parts) == 3 and parts[2]:
        if role == "primary":
            raise UsageError(f"--primary {text!r}: a tolerance belongs to a guard; the primary's threshold is max(2σ, --floor)")
        tol = parse_fraction(parts[2], f"--guard {text}")
    return MetricSpec(name, direction, role, tol)


def parse_guards(values: Iterable[str]) -> list[MetricSpec]:
    out = []
    for v in values:
        for part in v.split(","):
            if part.strip():
                out.append(parse_metric(part, "guard"))
    return out


@dataclass(frozen=True)
class Settings:
    """How gate decides. ``c`` and ``rho0`` tune the two confidence sequences (chosen by
    simulation in bench/bench_gate.py: c = 0.5, ρ₀ = 1 pair)."""

    alpha: float = 0.05
    power: float = 0.8
    floor: float = 0.03
    sequential: bool = True
    c: float = 0.5
    rho0: float = 1.0
    allow_anomaly: bool = False

    def __post_init__(self) -> None:
        if not (0 < self.alpha < 0.5):
            raise UsageError(f"--alpha {self.alpha}: must be in (0, 0.5)")
        if not (0.5 <= self.power < 1):
            raise UsageError(f"--power {self.power}: must be in [0.5, 1)")
        if not (0 <= self.floor < 1):
            raise UsageError(f"--floor {self.floor}: must be in [0, 1)")


@dataclass(frozen=True)
class Boundaries:
    """The four boundary tables a decision needs (efficacy at α, futility at β = 1 − power;
    normal mixture for a pooled σ, t-mixture otherwise). Build once, reuse."""

    eff_t: st.TMixture
    fut_t: st.TMixture
    eff_n: st.NormalMixture
    fut_n: st.NormalMixture
    alpha: float
    beta: float

    @classmethod
    def build(cls, s: Settings, kmax: int = MAX_PROJECT) -> Boundaries:
        beta = 1 - s.power
        return cls(
            st.TMixture(s.alpha, s.c, kmax), st.TMixture(beta, s.c, kmax),
            st.NormalMixture(s.alpha, s.rho0, kmax), st.NormalMixture(beta, s.rho0, kmax), s.alpha, beta,
        )


# --------------------------------------------------------------------------- the rule (vectorised)


def seq_bounds(bnd: Boundaries, k, est, sd, sigma_d=None):
    """Bounds on the mean of the pair differences after ``k`` pairs: the efficacy lower and
    upper bounds (one-sided 1−α each, always valid), the futility upper bound (1−β, always
    valid) and the classical one-sided (1−α) upper bound. ``sigma_d`` (known σ of a pair
    difference) selects the normal mixture; None the t-mixture on the sample sd ``sd``.
    Works elementwise on numpy arrays."""
    k = np.asarray(k)
    kk = np.maximum(k, 1)
    if sigma_d is not None:
        he = bnd.eff_n.half_width(k, sigma_d)
        hf = bnd.fut_n.half_width(k, sigma_d)
        hc = st.z(1 - bnd.alpha) * np.asarray(sigma_d) / np.sqrt(kk)
    else:
        he = bnd.eff_t.half_width(k, sd)
        hf = bnd.fut_t.half_width(k, sd)
        q = _sps.t.ppf(1 - bnd.alpha, np.maximum(k - 1, 1))
        hc = np.where(k >= 2, q * np.asarray(sd) / np.sqrt(kk), np.inf)
    est = np.asarray(est)
    return est - he, est + he, est + hf, est + hc


def call_primary(est, lo, hi_fut, hi_fixed, k, n_needed, thr):
    """+1 improves (lower bound > 0 and estimate ≥ threshold), −1 not enough (the futility
    bound, or at the planned n the classical bound, is below the threshold), 0 undecided."""
    ok = (np.asarray(lo) > 0) & (np.asarray(est) >= thr)
    futile = (np.asarray(hi_fut) < thr) | ((np.asarray(k) >= n_needed) & (np.asarray(hi_fixed) < thr))
    return np.where(ok, 1, np.where(futile, -1, 0))


def call_guard(lo, hi_fut, hi_fixed, k, n_needed, tol_log):
    """+1 ok (lower bound above −tolerance), −1 worse (futility bound, or at the planned n the
    classical bound, below −tolerance), 0 undecided. ``tol_log`` is negative."""
    ok = np.asarray(lo) > tol_log
    bad = (np.asarray(hi_fut) < tol_log) | ((np.asarray(k) >= n_needed) & (np.asarray(hi_fixed) < tol_log))
    return np.where(ok, 1, np.where(bad, -1, 0))


def threshold_log(t: float, direction: int) -> float:
    """log-scale improvement g that a relative improvement ``t`` means: higher-better
    c/b ≥ 1 + t; lower-better c/b ≤ 1 − t."""
    return math.log1p(t) if direction > 0 else -math.log1p(-t)


def tolerance_log(tol: float, direction: int) -> float:
    """log-scale g at the worst allowed worsening: c/b ≥ 1 − tol, or c/b ≤ 1 + tol."""
    return math.log1p(-tol) if direction > 0 else -math.log1p(tol)


def n_needed(sigma: float, d: float, s: Settings, known_sigma: bool, paired: bool) -> tuple[int, int]:
    """(n for the decision, n by the normal formula) per arm: exact t (paired when the
    analysis is on pairs) when σ is estimated, the normal formula when σ is known."""
    normal = st.n_per_arm_normal(sigma, d, s.alpha, s.power)
    if known_sigma:
        return normal, normal
    return st.n_per_arm_t(sigma, d, s.alpha, s.power, paired=paired)[0], normal


# --------------------------------------------------------------------------- inputs


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
    from vkit.jsonio import load_json_file

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


# --------------------------------------------------------------------------- analysis


@dataclass
class Context:
    settings: Settings
    bnd: Boundaries
    base: list[Run]
    cand: list[Run]  # the evidence: fresh runs when any are fresh
    pairs: list[tuple[int, int]]
    layout: str
    sigma_pool: dict = field(default_factory=dict)


def _pct(x: float | None, signed: bool = True) -> str:
    if x is None or not math.isfinite(x):
        return "n/a" if x is None or math.isnan(x) else ("+inf" if x > 0 else "-inf")
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def _rel(g: float) -> float:
    return math.expm1(g) if math.isfinite(g) else g


def _change_bounds(direction: int, lo: float, hi: float) -> list[float | None]:
    """Relative change c/b − 1 bounds from bounds on g = direction·log(c/b)."""
    a, b = (lo, hi) if direction > 0 else (-hi, -lo)
    return [_finite(_rel(a)), _finite(_rel(b))]


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _project(bnd: Boundaries, k: int, est: float, sd: float, sigma_d: float | None, target: float, ok_above: bool,
             n_need: int, sequential: bool, alpha: float) -> int | None:
    """Smallest number of pairs k' > k at which, if the current estimate and spread held, the
    sequential rule would decide the component; None beyond MAX_PROJECT."""
    ks = np.arange(max(k + 1, 2), MAX_PROJECT + 1)
    if len(ks) == 0 or not math.isfinite(est):
        return None
    spread = sd if sigma_d is None else sigma_d
    if not (spread > 0):
        return None
    lo, _hi, hf, hc = seq_bounds(bnd, ks, est, spread if sigma_d is None else np.nan, sigma_d)
    if ok_above:  # heading for "improves"/"ok": lower bound above target
        hit = lo > target
    else:  # heading for "not enough"/"worse"
        hit = (hf < target) | ((ks >= n_need) & (hc < target))
    idx = np.flatnonzero(hit)
    return int(ks[idx[0]]) if len(idx) else None


def analyze_metric(ctx: Context, spec: MetricSpec) -> dict:
    s, bnd = ctx.settings, ctx.bnd
    b, c = metric_logs(ctx.base, spec.name), metric_logs(ctx.cand, spec.name)
    nb, nc = len(b), len(c)
    sigma_now = float(np.std(b, ddof=1)) if nb >= 2 else math.nan
    pool = ctx.sigma_pool.get(spec.name)
    known = pool is not None
    sigma_t = pool if known else sigma_now
    res: dict[str, Any] = {
        "metric": spec.name,
        "role": spec.role,
        "direction": spec.sign,
        "baseline_gmean": float(math.exp(b.mean())) if nb else None,
        "candidate_gmean": float(math.exp(c.mean())) if nc else None,
        "sigma": _finite(sigma_t) if sigma_t == sigma_t else None,
        "sigma_source": "pooled (earlier A/A runs)" if known else "baseline runs",
        "sigma_baseline_runs": _finite(sigma_now) if nb >= 2 else None,
        "n_had": {"baseline": nb, "candidate": nc, "pairs": len(ctx.pairs)},
    }
    # Threshold (primary) or tolerance (guards, report): max(2σ, floor) unless given.
    t = spec.tolerance
    if t is None and math.isfinite(sigma_t):
        t = max(2 * sigma_t, s.floor)
    if t is not None and t >= 1:
        t = 0.99
    res["threshold"] = t
    res["threshold_rule"] = "given" if spec.tolerance is not None else ("max(2σ, floor)" if t is not None else None)
    target = None
    if t is not None and t > 0:
        target = threshold_log(t, spec.direction) if spec.role == "primary" else tolerance_log(t, spec.direction)
    sb = b * spec.direction
    sc = c * spec.direction
    paired_fixed = ctx.layout == "interleaved" and nb == nc
    if s.sequential:
        k = len(ctx.pairs)
        g = np.array([sc[j] - sb[i] for i, j in ctx.pairs]) if k else np.array([])
        est = float(g.mean()) if k else math.nan
        sd = float(g.std(ddof=1)) if k >= 2 else math.nan
        sigma_d = None
        if known:
            sigma_d = math.sqrt(2) * max(pool, sigma_now if math.isfinite(sigma_now) else 0.0)
            method = "normal-mixture confidence sequence (σ pooled)"
        else:
            method = "t-mixture confidence sequence"
        if k >= 1 and (known or k >= 2):
            lo, hi, hf, hc = (float(x) for x in seq_bounds(bnd, k, est, sd, sigma_d))
        else:
            lo, hi, hf, hc = -math.inf, math.inf, math.inf, math.inf
        if k >= 1 and known:
            log_e = float(bnd.eff_n.log_e_two_sided(g.sum() * 1.0, k, sigma_d))
        elif k >= 2:
            log_e = float(bnd.eff_t.log_e_two_sided(g.sum(), float((g * g).sum()), k))
        else:
            log_e = 0.0
        e_val = math.exp(min(log_e, 700.0))
        p_val = min(1.0, 1.0 / e_val)
        n_had = k
        res.update({"method": method, "e_value": e_val, "p_value": p_val, "p_value_kind": "anytime-valid (1/e)"})
    else:
        k = min(nb, nc)
        if paired_fixed:
            order_b = [i for i, _ in ctx.pairs]
            order_c = [j for _, j in ctx.pairs]
            ft = st.fixed_test(sc[order_c], sb[order_b], s.alpha, paired=True)
        else:
            ft = st.fixed_test(sc, sb, s.alpha, paired=False)
        if ft is None:
            est, lo, hi, p_val = (float(sc.mean() - sb.mean()) if nb and nc else math.nan), -math.inf, math.inf, math.nan
            method = "paired t" if paired_fixed else "Welch t"
            p_two = math.nan
        else:
            est, lo, hi, p_val, method, p_two = ft.estimate, ft.lower, ft.upper, ft.p_greater, ft.method, ft.p_two_sided
        hf = hc = hi
        sigma_d = None
        if paired_fixed and k >= 2:
            sd = float(np.std(sc[[j for _, j in ctx.pairs]] - sb[[i for i, _ in ctx.pairs]], ddof=1))
        elif nb >= 2 and nc >= 2:
            sd = math.sqrt(float(np.var(sb, ddof=1) + np.var(sc, ddof=1)))
        else:
            sd = math.nan
        n_had = k
        res.update({"method": method, "p_value": p_val, "p_value_two_sided": p_two, "p_value_kind": "one-sided, fixed n"})
    res["estimate_log"] = _finite(est) if est == est else None
    raw = est * spec.direction
    res["change"] = _finite(_rel(raw)) if raw == raw else None
    res["interval"] = _change_bounds(spec.direction, lo, hi)
    res["interval_level"] = f"one-sided {1 - s.alpha:.0%} bounds (jointly {1 - 2 * s.alpha:.0%})"
    res["improvement"] = _finite(_rel(est) if spec.direction > 0 else -math.expm1(-est)) if est == est else None
    if target is None or not math.isfinite(sigma_t):
        res.update({"n_needed": None, "n_needed_normal": None, "decision": UNDECIDED, "more_runs": max(2 - nb, 2 - nc, 1),
                    "why": f"{spec.name}: σ needs at least 2 baseline runs (or a pooled σ)"})
        return res
    paired_analysis = s.sequential or paired_fixed
    if sigma_t > 0:
        need, need_normal = n_needed(sigma_t, abs(target), s, known, paired_analysis)
    else:
        need, need_normal = 2, 2
    res["n_needed"], res["n_needed_normal"] = need, need_normal
    if spec.role == "report":
        res["decision"] = None
        return res
    if not s.sequential:
        # A fixed design decides once, at its planned n (never fewer than MIN_FIXED_RUNS per arm).
        need = max(need, MIN_FIXED_RUNS)
        res["n_needed"] = need
    if spec.role == "primary":
        code = int(call_primary(est, lo, hf, hc, n_had, need, target)) if est == est else 0
    else:
        code = int(call_guard(lo, hf, hc, n_had, need, target)) if est == est else 0
    if not s.sequential:
        code = 0 if n_had < need else (1 if code == 1 else -1)
    res["decision"] = _decision_name(spec.role, code)
    res["why"] = _why(spec, res, code, t, n_had, need, s)
    if code == 0:
        if not s.sequential:  # a fixed design runs to its planned n
            kk = need
        else:
            ok_above = (est >= target) if est == est else True
            kk = _project(bnd, n_had, est, sd, sigma_d, (0.0 if spec.role == "primary" else target) if ok_above else target,
                          ok_above, need, True, s.alpha)
        more = max(1, (kk - n_had) if kk is not None else need - n_had)
        if n_had < 2:
            more = max(more, 2 - n_had)
        res["more_runs"] = more
        res["more_runs_capped"] = kk is None
    else:
        res["more_runs"] = 0
    return res


def _decision_name(role: str, code: int) -> str:
    if role == "primary":
        return {1: "improves", -1: "not_enough", 0: UNDECIDED}[code]
    return {1: "ok", -1: "worse", 0: UNDECIDED}[code]


def _why(spec: MetricSpec, r: dict, code: int, t: float, n_had: int, need: int, s: Settings) -> str:
    lo, hi = r["interval"]
    ch = f"{spec.name} {_pct(r['change'])} [{_pct(lo)}, {_pct(hi)}]"
    kind = "always-valid" if s.sequential else "one-sided"
    if spec.role == "primary":
        need_txt = f"{'+' if spec.direction > 0 else '−'}{t:.1%}"
        bound = lo if spec.direction > 0 else hi
        if code == 1:
            return f"{ch}: at least the {need_txt} threshold, and the {kind} bound {_pct(bound)} clears zero"
        if code == -1:
            if not s.sequential and n_had >= need:
                return f"{ch}: no gain of {need_txt} at the planned {need} runs per arm"
            return f"{ch}: the gain cannot reach the {need_txt} threshold"
        if n_had < need:
            return f"{ch}: {n_had} run(s) per arm, {need} needed to resolve a {need_txt} change at σ = {r['sigma']:.1%}; not yet a verdict"
        if r.get("improvement") is not None and r["improvement"] >= t:
            return f"{ch}: above the {need_txt} threshold but the {kind} bound does not yet clear zero"
        return f"{ch}: neither clear of zero nor ruled out below the {need_txt} threshold"
    worse = f"{'−' if spec.direction > 0 else '+'}{t:.1%}"
    if code == 1:
        return f"{ch}: no worse than the {worse} tolerance"
    if code == -1:
        return f"{ch}: worse than the {worse} tolerance"
    return f"{ch}: cannot yet rule out a worsening beyond {worse}"


# --------------------------------------------------------------------------- the decision


@dataclass
class GateInput:
    baseline: list[str]
    candidate: list[str] = field(default_factory=list)
    fresh: list[str] = field(default_factory=list)
    primary: MetricSpec = field(default_factory=lambda: parse_metric(DEFAULT_PRIMARY, "primary"))
    guards: list[MetricSpec] = field(default_factory=list)
    report: list[str] | None = None
    settings: Settings = field(default_factory=Settings)
    layout: str | None = None  # interleaved | blocked | None (from the dates)
    selected_from: int = 1
    sigma_pool: dict = field(default_factory=dict)
    changed_at: _dt.datetime | None = None
    check_drift: bool = True
    policy: Policy | None = None  # None: the packaged parameter policy (the CLI passes $VKIT_POLICY's)
    ran: list[str] = field(default_factory=list)  # must-run checks the caller ran outside gate (--ran)


def decide(inp: GateInput, checker: Checker | None = None) -> dict:
    """The whole gate: load, validate, compare gauges, check the design, analyse, decide.
    Returns the result document (see module docstring); raises on refusals."""
    s = inp.settings
    if not inp.baseline:
        raise UsageError("no baseline runs; give --baseline B.json ... (the kept configuration's repeats)")
    if not inp.candidate and not inp.fresh:
        raise UsageError("no candidate runs; give --candidate C.json ... and/or --fresh C.json ...")
    if inp.selected_from < 1:
        raise UsageError("--selected-from K needs K >= 1")
    base = [load_summary(p, "baseline") for p in inp.baseline]
    fresh_set = {os.path.abspath(p) for p in inp.fresh}
    cand_paths = list(inp.candidate) + [p for p in inp.fresh if os.path.abspath(p) not in {os.path.abspath(q) for q in inp.candidate}]
    cand = [load_summary(p, "candidate", fresh=os.path.abspath(p) in fresh_set) for p in cand_paths]
    allruns = base + cand
    seen: dict[str, str] = {}
    for r in allruns:
        if r.digest in seen:
            raise InvalidData(f"{r.path} and {seen[r.digest]} are the same run (identical files); every run counts once")
        seen[r.digest] = r.path
    warnings = validate(allruns, s.allow_anomaly, checker)
    gauge, w = check_same_gauge(allruns)
    warnings += w
    # Design: which candidate runs are evidence.
    n_fresh = sum(r.fresh for r in cand)
    screening = [r for r in cand if not r.fresh]
    evidence = [r for r in cand if r.fresh] if n_fresh else cand
    design: dict[str, Any] = {"selected_from": inp.selected_from, "fresh_runs": n_fresh,
                              "screening_runs_ignored": len(screening) if n_fresh else 0}
    if n_fresh and screening:
        warnings.append(f"{len(screening)} screening run(s) of the candidate are not used as evidence; only the {n_fresh} fresh run(s) are")
    layout_auto, layout_why = detect_layout(base, evidence)
    layout = inp.layout or layout_auto
    design["layout"] = layout
    design["layout_source"] = "declared" if inp.layout else layout_why
    if inp.layout and layout_auto != "unknown" and inp.layout != layout_auto:
        warnings.append(f"declared --{inp.layout} but the run dates say {layout_auto}")
    if layout == "blocked":
        warnings.append("blocked runs (all of one arm, then the other): drift between the blocks reads as an effect; interleave baseline and candidate (ABBA)")
    elif layout == "unknown":
        warnings.append("cannot tell whether the runs were interleaved (no dates); declare --interleaved or --blocked")
    # Stale baseline: older than a detected change point.
    stale_refusal(base, inp.primary.name, inp.changed_at, inp.sigma_pool.get(inp.primary.name), inp.check_drift)
    # The policy's must-run rules for a gate (the runbook's table, as data): check_invariants ran on every
    # input (validate); the baseline σ rests on enough repeats — these runs, or a pooled σ given for the primary.
    # Too few repeats is not a refusal but no verdict yet: undecided, with the runs still needed (below).
    policy = inp.policy or Policy.load()
    min_reps = policy.min_repeats()
    few = len(base) < min_reps and inp.primary.name not in inp.sigma_pool
    policy.require({"check_invariants", "repeats", *inp.ran}, before="gate")
    pairs = pair_indices(base, evidence)
    design["pairs"] = len(pairs)
    ctx = Context(s, Boundaries.build(s), base, evidence, pairs, layout, dict(inp.sigma_pool))
    dw = drift_warning(base, evidence, inp.primary.name, layout)
    if dw:
        warnings.append(dw)
    if not s.sequential:
        warnings.append("--fixed: the classical test is valid only at one look at the planned n; looking after every run needs the default --sequential")
    primary = analyze_metric(ctx, inp.primary)
    guards = [analyze_metric(ctx, g) for g in inp.guards]
    names = [inp.primary.name] + [g.name for g in inp.guards]
    report_names = inp.report if inp.report is not None else [m for m in REPORT_METRICS if has_metric(base + evidence, m)]
    reports = []
    for m in report_names:
        if m in names:
            continue
        d = infer_direction(m) or 1
        reports.append(analyze_metric(ctx, MetricSpec(m, d, "report")))
    metrics = [primary] + guards + reports
    changed = _changed(metrics, s)
    # Winner of a search: screening runs are no evidence.
    winner_block = inp.selected_from > 1 and n_fresh == 0
    if inp.selected_from > 1 and n_fresh:
        scr = _screening_effect(base, screening, inp.primary) if screening else None
        if scr is not None:
            design["screening_change"] = scr
    decision, why, more = _combine(primary, guards)
    if few and decision != UNDECIDED:
        need = max(min_reps, primary.get("n_needed") or 0)
        decision = UNDECIDED
        why = (f"{len(base)} baseline run(s) and no pooled σ: the policy asks for at least {min_reps} repeats before a "
               f"gate verdict (rule R3), so σ_baseline is measured, not guessed; run {need - len(base)} more of the baseline")
        more = {"baseline": need - len(base), "candidate": max(0, need - len(evidence))}
    if winner_block:
        need = primary.get("n_needed") or 2
        decision = UNDECIDED
        why = (f"the candidate is the winner of a search over {inp.selected_from} configurations: its screening runs are "
               f"not evidence (winner's curse); run {need} fresh confirmation runs interleaved with the baseline (ABBA) "
               "and pass them with --fresh")
        more = {"baseline": max(0, need - len(base)), "candidate": need}
    result = {
        "tool": "gate",
        "decision": decision,
        "why": why,
        "mode": "sequential" if s.sequential else "fixed",
        "alpha": s.alpha,
        "power": s.power,
        "floor": s.floor,
        "primary": primary,
        "guards": guards,
        "metrics": metrics,
        "changed": changed,
        "design": design,
        "gauge": gauge,
        "runs": {"baseline": [r.path for r in base], "candidate": [r.path for r in evidence],
                 "screening": [r.path for r in screening] if n_fresh else []},
        "validity": [{"path": r.path, "verdict": r.verdict} for r in allruns],
        "more_runs": more,
        "warnings": warnings,
        "must_run": {"ran_in_gate": ["check_invariants"], "declared": list(inp.ran), "repeats": len(base),
                     "min_repeats": min_reps},
    }
    return result


def _combine(primary: dict, guards: list[dict]) -> tuple[str, str, dict | None]:
    bad = [g for g in guards if g["decision"] == "worse"]
    if primary["decision"] == "not_enough":
        return REJECT, primary["why"], None
    if bad:
        return REJECT, bad[0]["why"], None
    open_ = [m for m in [primary] + guards if m["decision"] == UNDECIDED]
    if not open_:
        if guards:
            return ACCEPT, primary["why"] + f"; {len(guards)} guard(s) within tolerance", None
        return ACCEPT, primary["why"], None
    more = max(int(m.get("more_runs") or 1) for m in open_)
    first = open_[0]
    nb, nc = first["n_had"]["baseline"], first["n_had"]["candidate"]
    k = first["n_had"]["pairs"]
    target = k + more
    more_d = {"baseline": max(0, target - nb), "candidate": max(0, target - nc)}
    if more_d["baseline"] == 0 and more_d["candidate"] == 0:
        more_d["candidate"] = more
    capped = any(m.get("more_runs_capped") for m in open_)
    tail = (f"; about {more} more run(s) of each, interleaved" if not capped
            else f"; at least {more} more run(s) of each (the effect sits close to the threshold)")
    return UNDECIDED, first["why"] + tail, more_d


def _changed(metrics: list[dict], s: Settings) -> dict:
    tested = [m for m in metrics if m.get("p_value") is not None and m.get("change") is not None]
    names = [m["metric"] for m in tested]
    if s.sequential:
        es = [m.get("e_value") or 0.0 for m in tested]
        rej = st.e_bh(es, s.alpha) if es else []
        for m, r in zip(tested, rej, strict=True):
            m["changed"] = bool(r)
        return {"method": "e-BH", "level": s.alpha, "metrics": [n for n, r in zip(names, rej, strict=True) if r]}
    ps = [m.get("p_value_two_sided", math.nan) for m in tested]
    signs = {math.copysign(1, m["change"]) for m in tested if m["change"]}
    method = "by" if len(signs) > 1 else "bh"
    adj, rej = st.fdr(ps, s.alpha, method) if ps else ([], [])
    for m, a, r in zip(tested, adj, rej, strict=True):
        m["q_value"] = _finite(a) if a == a else None
        m["changed"] = bool(r)
    return {"method": method.upper(), "level": s.alpha, "metrics": [n for n, r in zip(names, rej, strict=True) if r],
            "why": "BY: the changes have opposite signs" if method == "by" else "BH: the changes share a sign"}


def _screening_effect(base: list[Run], screening: list[Run], spec: MetricSpec) -> float | None:
    try:
        b, c = metric_logs(base, spec.name), metric_logs(screening, spec.name)
    except InvalidData:
        return None
    return float(math.expm1(c.mean() - b.mean()))


def stale_refusal(base: list[Run], metric: str, changed_at: _dt.datetime | None, sigma: float | None, check_drift: bool) -> None:
    """Refuse a baseline older than a detected change point: one given (``changed_at``, e.g.
    from the state file), or one drift.detect finds in the baseline series itself."""
    if not check_drift:
        return
    dates = [r.when for r in base]
    if changed_at is not None:
        stale = _drift.stale_runs(dates, changed_at)
        if stale:
            names = ", ".join(base[i].path for i in stale[:3]) + (" …" if len(stale) > 3 else "")
            raise InvalidData(
                f"{len(stale)} baseline run(s) predate the change point detected at {changed_at.isoformat(sep=' ')} ({names}); "
                "re-measure the baseline (pass --ignore-drift to decide anyway)"
            )
    if len(base) >= _drift.MIN_RUNS and all(d is not None for d in dates):
        order = sorted(range(len(base)), key=lambda i: dates[i])
        series = metric_logs([base[i] for i in order], metric)
        res = _drift.detect(np.exp(series), sigma=sigma)
        if res["changed"]:
            cp = res["change_index"]
            stale_paths = [base[order[i]].path for i in range(cp)]
            raise InvalidData(
                f"the baseline's {metric} changed level at run {cp + 1} of {len(base)} ({_pct(res['shift'])}, {res['detector']}); "
                f"the {len(stale_paths)} earlier run(s) ({', '.join(stale_paths[:3])}{' …' if len(stale_paths) > 3 else ''}) "
                "measure another server state: re-baseline with the later runs only (or pass --ignore-drift)"
            )


# --------------------------------------------------------------------------- state file


def trial_inputs(state: dict, trial_id: str, state_dir: str) -> dict:
    """What gate reads from a trial in the state file (``state["trials"]``):

    ``id``; ``baseline`` and ``candidate`` (lists of summary paths, relative to the state
    file's directory when not absolute); ``fresh`` (list of paths of fresh confirmation
    runs, or entries of ``candidate`` given as ``{"path": ..., "fresh": true}``);
    ``selected_from`` (K, the size of the search the candidate won; default 1); ``design``
    (``interleaved``/``blocked``; default from the run dates); ``valid`` (False refuses).
    From the state: ``sigma_baseline`` (per metric, a relative σ pooled from earlier A/A runs,
    a number or ``{"sigma": x, "n": k}``) and ``drift.change_date`` (ISO time of the last
    detected change point; older baseline runs are refused).
    """
    trials = state.get("trials") or []
    matches = [t for t in trials if isinstance(t, dict) and str(t.get("id")) == str(trial_id)]
    if not matches:
        known = ", ".join(str(t.get("id")) for t in trials[-5:] if isinstance(t, dict)) or "none"
        raise UsageError(f"no trial {trial_id!r} in the state file (last trials: {known})")
    t = matches[-1]
    if t.get("valid") is False:
        raise InvalidData(f"trial {trial_id} is marked invalid in the state file; no verdict on invalid data")

    def resolve(p: Any) -> str:
        p = p.get("path") if isinstance(p, dict) else p
        if not isinstance(p, str):
            raise InvalidData(f"trial {trial_id}: a run entry is not a path: {p!r}")
        return p if os.path.isabs(p) else os.path.join(state_dir, p)

    cand_entries = t.get("candidate") or []
    fresh = [resolve(p) for p in (t.get("fresh") or [])]
    fresh += [resolve(e) for e in cand_entries if isinstance(e, dict) and e.get("fresh")]
    cand = [resolve(e) for e in cand_entries if not (isinstance(e, dict) and e.get("fresh"))]
    out = {
        "baseline": [resolve(p) for p in (t.get("baseline") or [])],
        "candidate": cand,
        "fresh": fresh,
        "selected_from": int(t.get("selected_from") or 1),
        "layout": t.get("design") if t.get("design") in ("interleaved", "blocked") else None,
        "sigma_pool": sigma_from_state(state),
        "changed_at": parse_date(((state.get("drift") or {}).get("change_date"))),
        "config": t.get("config"),
    }
    return out


def sigma_from_state(state: dict) -> dict:
    out = {}
    for k, v in (state.get("sigma_baseline") or {}).items():
        x = v.get("sigma") if isinstance(v, dict) else v
        if isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < 1:
            out[k] = float(x)
    return out


def parse_sigma(values: Iterable[str]) -> dict:
    """``--sigma METRIC=REL`` (REL a fraction or a percentage), repeatable or comma-separated."""
    out = {}
    for v in values:
        for part in v.split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise UsageError(f"--sigma {part!r}: expected METRIC=REL, e.g. output_throughput=2%")
            k, x = part.split("=", 1)
            out[k.strip()] = parse_fraction(x, f"--sigma {part}")
    return out
