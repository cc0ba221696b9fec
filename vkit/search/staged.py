"""Seed 000's tuning order as a proposer: coarse one-factor sweeps, then a small local grid.

- step 2: ``max_num_batched_tokens`` over its candidates with ``max_num_seqs`` at a safe value
  (64 as in the seed, or, given the benchmark's streams in flight, the first lattice value at
  or above it: below the load the server queues and step 2 would measure the queue);
  the best budget is the highest throughput among the candidates that meet the SLO, or the
  lowest P95 when none does (the SLO is a hard requirement, throughput is not);
- step 3: ``max_num_seqs`` over its candidates, ascending, at that budget, stopping at the knee
  (:func:`knee_of_sweep`); a start failure or the first candidate that breaks the SLO ends
  the sweep too. A sweep still gaining at its last candidate goes on by doubling, up to
  ``EXTEND_OCTAVES`` more values inside the parameter's range (the policy's list stops at 128,
  where a large GPU's SLO capacity is still climbing: bench/results/tuner_capacity.json);
- step 4: a 2 × 2 grid around the knee: for each of the two parameters, the geometric
  midpoints between the knee's value and its neighbouring candidates (e.g. seqs 64 between 32
  and 128 → 48 and 96; tokens 8192 between 4096 and 16384 → 6144 and 12288), snapped to the
  lattice; points already measured are not run again.

The plan keeps no state of its own: every call re-derives where it stands from the history
(matching configurations by value), so a killed run resumes without repeating a trial.
Steps 1 (max_model_len) and 5 (behaviour flags) are driven by the runner; :func:`flag_variants`
and :func:`ablation_configs` give their one-switch configurations.
"""

from __future__ import annotations

import math

from vkit.errors import UsageError
from vkit.search.space import Param, key_of
from vkit.search.types import Objective, Observation, Proposal

TOKENS = "max_num_batched_tokens"
SEQS = "max_num_seqs"
DEFAULT_SAFE_SEQS = 64  # seed 000: "a safe value (32 or 64)"
EXTEND_OCTAVES = 3  # step 3 past its last candidate while the sweep still gains: x2, x4, x8 at most


def knee_of_sweep(xs, throughput, p95, gain_threshold: float = 0.03, slo: float | None = None,
                  name: str | None = None) -> dict:
    """The knee of a one-parameter sweep in ascending ``xs`` (step 3).

    Walking up the sweep, the knee is the last value worth its cost: at the first i where
    going from x[i−1] to x[i] gains less than ``gain_threshold`` throughput while P95 does
    not improve by more than ``gain_threshold`` (it worsens, or stays flat within the
    threshold), the knee is x[i−1]. If ``slo`` is given and x[i] is the first value to break
    it after x[i−1] met it, the knee is x[i−1] too ("SLO-bound"). Without a knee the best
    throughput (among values meeting the SLO, when any does) is returned with ``found`` false.

    Returns ``{"index", "x", "found", "kind", "gain", "p95_change", "why"}``; ``name`` (e.g.
    ``"max_num_seqs"``) labels the values in ``why``.
    """
    xs, thr, lat = list(xs), [float(v) for v in throughput], [float(v) for v in p95]
    if not xs:
        raise ValueError("empty sweep")
    lab = (lambda x: f"{name}={x}") if name else str
    for i in range(1, len(xs)):
        gain = thr[i] / thr[i - 1] - 1.0 if thr[i - 1] > 0 else math.inf
        dp = lat[i] / lat[i - 1] - 1.0 if lat[i - 1] > 0 else 0.0
        if slo is not None and lat[i - 1] <= slo < lat[i]:
            return {"index": i - 1, "x": xs[i - 1], "found": True, "kind": "slo", "gain": gain, "p95_change": dp,
                    "why": f"SLO-bound at {lab(xs[i - 1])}: {xs[i]} breaks P95 <= {slo:g} ({lat[i]:.4g}), "
                           f"for {gain:+.1%} throughput"}
        if gain < gain_threshold and dp > -gain_threshold:
            return {"index": i - 1, "x": xs[i - 1], "found": True, "kind": "knee", "gain": gain, "p95_change": dp,
                    "why": f"knee at {lab(xs[i - 1])}: {xs[i]} adds {gain:+.1%} throughput (< {gain_threshold:.0%}) "
                           f"for {dp:+.1%} P95"}
    ok = [i for i in range(len(xs)) if slo is None or lat[i] <= slo] or list(range(len(xs)))
    best = max(ok, key=lambda i: (thr[i], -i))
    last_gain = thr[-1] / thr[-2] - 1.0 if len(xs) > 1 and thr[-2] > 0 else math.nan
    why = (f"no knee up to {lab(xs[-1])}: throughput still {last_gain:+.1%} at the last step; best {lab(xs[best])}"
           if len(xs) > 1 else f"single point {lab(xs[0])}")
    return {"index": best, "x": xs[best], "found": False, "kind": "none", "gain": last_gain, "p95_change": math.nan,
            "why": why}


def _geo_mid(a: float, b: float) -> float:
    return math.sqrt(a * b)


def flag_variants(base_config: dict, space: list[Param]) -> list[tuple[str, dict]]:
    """Step 5: for every bool/choice parameter of ``space``, the base config with that one
    parameter changed (each other value of it), as (label, config) one-switch controls."""
    out = []
    for p in space:
        if p.kind not in ("bool", "choice"):
            continue
        for v in p.levels():
            if v != base_config.get(p.name):
                cfg = dict(base_config)
                cfg[p.name] = v
                out.append((f"{p.name}={v}", cfg))
    return out


def ablation_configs(baseline: dict, candidate: dict) -> list[tuple[str, dict]]:
    """``--ablate``: when a kept change moved several parameters, the baseline with each one
    of them alone set to the candidate's value, so a report can name the switch that paid."""
    changed = sorted(k for k in set(baseline) | set(candidate) if baseline.get(k) != candidate.get(k))
    out = []
    for k in changed:
        cfg = dict(baseline)
        if k in candidate:
            cfg[k] = candidate[k]
        else:
            cfg.pop(k, None)
        out.append((k, cfg))
    return out if len(changed) > 1 else []


class StagedPlan:
    """Seed 000's steps 2–4 as a proposer (module docstring). ``next(history)`` returns the
    next :class:`Proposal` or None when the plan is done; ``stop_reason`` says why it stopped."""

    def __init__(self, space: list[Param], base_config: dict, objectives: list[Objective], slo: dict | None = None,
                 gain_threshold: float = 0.03, steps=("2", "3", "4"), safe_seqs: int | None = None,
                 tokens: str = TOKENS, seqs: str = SEQS, tokens_candidates: list | str | None = None,
                 seqs_candidates: list | str | None = None, load_concurrency: int | None = None):
        self.space = list(space)
        self.base = dict(base_config)
        self.objectives = list(objectives)
        self.gain_threshold = float(gain_threshold)
        self.steps = tuple(str(s) for s in steps)
        by = {p.name: p for p in self.space}
        if tokens not in by or seqs not in by:
            raise UsageError(f"staged mode needs {tokens} and {seqs} in the search space")
        self.pt, self.ps = by[tokens], by[seqs]
        self.thr = next((o.name for o in self.objectives if o.direction == "max"), None)
        if self.thr is None:
            raise UsageError("staged mode needs a maximised objective (throughput or goodput)")
        slo = dict(slo or {})
        self.lat = next((o.name for o in self.objectives if o.name in slo), None) \
            or next((o.name for o in self.objectives if o.direction == "min"), None) or next(iter(slo), None)
        if self.lat is None:
            raise UsageError("staged mode needs a latency objective (e.g. p95_ttft_ms) for the knee")
        self.slo = float(slo[self.lat]) if self.lat in slo else None
        self.tok_c = self._candidates(self.pt, 4, tokens_candidates)
        self.seq_c = self._candidates(self.ps, 5, seqs_candidates)
        # the doublings are visited only while the sweep finds no knee: step 3 stops at the first one
        self.seq_ext = sorted({self.ps.snap(self.seq_c[-1] * 2 ** k) for k in range(1, EXTEND_OCTAVES + 1)
                               if self.seq_c[-1] * 2 ** k <= self.ps.high} - set(self.seq_c))
        self.seq_sweep = self.seq_c + self.seq_ext
        if safe_seqs is None:
            safe_seqs = DEFAULT_SAFE_SEQS
            if load_concurrency:
                # max_num_seqs below the benchmark's streams in flight queues requests at the server, and
                # step 2 would measure that queue instead of the token budget
                above = [v for v in self.ps.levels() if v >= load_concurrency]
                safe_seqs = max(DEFAULT_SAFE_SEQS, above[0] if above else self.ps.high)
        self.load_concurrency = load_concurrency
        self.safe = self.ps.snap(min(max(safe_seqs, self.ps.low), self.ps.high))

    @staticmethod
    def _candidates(p: Param, n: int, given: list | str | None = None) -> list:
        """The sweep values: ``given`` (a list, or ``"octaves"``: the powers of two inside the
        bounds), else the parameter's (policy's) candidates inside its bounds, else ``n``
        lattice values spread over the range."""
        if given == "octaves":
            given = [1 << k for k in range(0, 40) if p.low <= (1 << k) <= p.high]
        src = given if given else (p.candidates or [])
        c = sorted({p.snap(p.coerce(v)) for v in src if p.low <= p.coerce(v) <= p.high})
        if len(c) >= 2:
            return c
        lv = p.levels()
        return sorted({lv[round(j * (len(lv) - 1) / (n - 1))] for j in range(n)})

    def options(self) -> dict:
        return {"gain_threshold": self.gain_threshold, "steps": list(self.steps), "safe_seqs": self.safe,
                "load_concurrency": self.load_concurrency,
                "tokens": self.pt.name, "seqs": self.ps.name, "tokens_candidates": self.tok_c, "seqs_candidates": self.seq_c}

    # -- reading the history ---------------------------------------------
    def _cfg(self, tokens, seqs) -> dict:
        c = dict(self.base)
        c[self.pt.name], c[self.ps.name] = tokens, seqs
        return c

    def _lookup(self, history: list[Observation], cfg: dict) -> Observation | None:
        k = key_of(cfg, self.space)
        found = None
        for o in history:
            if key_of(o.config, self.space) == k and _same_rest(o.config, self.base, self.space):
                found = o
        return found

    def _ok(self, o: Observation) -> bool:
        return o.feasible and isinstance(o.objectives.get(self.thr), (int, float)) \
            and isinstance(o.objectives.get(self.lat), (int, float))

    def _meets(self, o: Observation) -> bool:
        if o.slo_ok is False:
            return False
        return self.slo is None or o.objectives[self.lat] <= self.slo

    def state(self, history: list[Observation]) -> dict:
        """Where the plan stands: the best budget, the step-3 sweep and knee, the step-4 grid,
        and the next configuration to run (``next``: (step, config, reason) or None)."""
        st: dict = {"tokens_candidates": self.tok_c, "seqs_candidates": self.seq_c, "safe_seqs": self.safe,
                    "step2": [], "best_tokens": None, "step3": [], "knee": None, "step4": [], "next": None}
        # step 2
        best_tokens = self.base.get(self.pt.name)
        if "2" in self.steps:
            rows = []
            for b in self.tok_c:
                o = self._lookup(history, self._cfg(b, self.safe))
                if o is None:
                    st["next"] = ("2", self._cfg(b, self.safe),
                                  f"step 2: {self.pt.name}={b} at {self.ps.name}={self.safe} "
                                  f"({len(rows) + 1} of {len(self.tok_c)})")
                    return st
                rows.append((b, o))
                st["step2"].append({"x": b, **_brief(o, self.thr, self.lat)})
            ok = [(b, o) for b, o in rows if self._ok(o)]
            if ok:
                meet = [(b, o) for b, o in ok if self._meets(o)]
                if meet:
                    best_tokens = max(meet, key=lambda r: r[1].objectives[self.thr])[0]
                    st["best_tokens_why"] = f"highest {self.thr} meeting the SLO at {self.ps.name}={self.safe}"
                else:
                    best_tokens = min(ok, key=lambda r: r[1].objectives[self.lat])[0]
                    st["best_tokens_why"] = f"none meets the SLO at {self.ps.name}={self.safe}: lowest {self.lat}"
        if best_tokens is None:
            best_tokens = self.tok_c[len(self.tok_c) // 2]
        best_tokens = self.pt.snap(best_tokens)
        st["best_tokens"] = best_tokens
        # step 3
        knee_seqs = self.ps.snap(self.base.get(self.ps.name, self.safe))
        if "3" in self.steps:
            xs, thr, lat = [], [], []
            knee = None
            for s in self.seq_sweep:
                o = self._lookup(history, self._cfg(best_tokens, s))
                if o is None:
                    past = (f" (past the candidates: {xs[-1]} still gained {thr[-1] / thr[-2] - 1:+.1%})"
                            if s in self.seq_ext and len(thr) > 1 and thr[-2] > 0 else "")
                    st["next"] = ("3", self._cfg(best_tokens, s),
                                  f"step 3: {self.ps.name}={s} at {self.pt.name}={best_tokens}{past}")
                    return st
                st["step3"].append({"x": s, **_brief(o, self.thr, self.lat)})
                if not self._ok(o):
                    knee = (knee_of_sweep(xs, thr, lat, self.gain_threshold, self.slo, self.ps.name) if xs else None)
                    if knee is not None:
                        knee = dict(knee, found=True, kind="failure",
                                    why=f"{self.ps.name}={s} failed to start or measure: stop at {self.ps.name}={knee['x']}")
                    break
                xs.append(s)
                thr.append(o.objectives[self.thr])
                lat.append(o.objectives[self.lat])
                k = knee_of_sweep(xs, thr, lat, self.gain_threshold, self.slo, self.ps.name)
                if k["found"]:
                    knee = k
                    break
            if knee is None and xs:
                knee = knee_of_sweep(xs, thr, lat, self.gain_threshold, self.slo, self.ps.name)
            if knee is not None:
                knee_seqs = knee["x"]
                st["knee"] = knee
        st["knee_seqs"] = knee_seqs
        # step 4
        if "4" in self.steps:
            grid = []
            for s in self._around(self.ps, self.seq_sweep, knee_seqs):
                for b in self._around(self.pt, self.tok_c, best_tokens):
                    cfg = self._cfg(b, s)
                    if cfg not in grid:
                        grid.append(cfg)
            for cfg in grid:
                o = self._lookup(history, cfg)
                if o is None:
                    st["next"] = ("4", cfg, f"step 4: 2x2 grid around the knee ({self.ps.name}={knee_seqs}, "
                                            f"{self.pt.name}={best_tokens}): {self.ps.name}={cfg[self.ps.name]}, "
                                            f"{self.pt.name}={cfg[self.pt.name]}")
                    return st
                st["step4"].append({"x": [cfg[self.ps.name], cfg[self.pt.name]], **_brief(o, self.thr, self.lat)})
        return st

    def _around(self, p: Param, cands: list, x) -> list:
        lower = [c for c in cands if c < x]
        upper = [c for c in cands if c > x]
        lo = p.snap(_geo_mid(lower[-1], x)) if lower else x
        hi = p.snap(_geo_mid(x, upper[0])) if upper else x
        return [lo] if lo == hi else [lo, hi]

    def next(self, history: list[Observation]) -> Proposal | None:
        st = self.state(history)
        if st["next"] is None:
            return None
        step, cfg, reason = st["next"]
        return Proposal(config=cfg, step=step, reason=reason,
                        audit={"mode": "staged", "random": False, "plan": _plan_summary(st), "options": self.options()})

    def stop_reason(self, history: list[Observation]) -> str:
        """Why the plan stopped (or what it waits for), with its numbers."""
        st = self.state(history)
        if st["next"] is not None:
            return f"not done: next is step {st['next'][0]} ({st['next'][2]})"
        parts = []
        if "2" in self.steps:
            parts.append(f"step 2 chose {self.pt.name}={st['best_tokens']} ({st.get('best_tokens_why', 'base value')})")
        if "3" in self.steps and st["knee"] is not None:
            parts.append(f"step 3 stopped: {st['knee']['why']}")
        if "4" in self.steps:
            parts.append(f"step 4 ran the {len(st['step4'])}-point grid around {self.ps.name}={st['knee_seqs']}, "
                         f"{self.pt.name}={st['best_tokens']}")
        return "plan done: " + "; ".join(parts)


def _same_rest(config: dict, base: dict, space: list[Param]) -> bool:
    names = {p.name for p in space}
    return all(config.get(k, v) == v for k, v in base.items() if k not in names)


def _brief(o: Observation, thr: str, lat: str) -> dict:
    return {"feasible": o.feasible, thr: o.objectives.get(thr), lat: o.objectives.get(lat), "trial_id": o.trial_id}


def _plan_summary(st: dict) -> dict:
    return {k: st.get(k) for k in ("best_tokens", "knee_seqs", "step2", "step3", "knee", "step4")}
