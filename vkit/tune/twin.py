"""The tune's twin (``tune --search twin``): the simulator, calibrated to the load points the tune has
measured on its own server, predicts the SLO capacity of every candidate configuration, each with an
interval; the server is restarted only for candidates whose interval reaches past the best capacity
measured so far.

- **Calibration** (:meth:`Twin.calibrate`): the baseline's open-loop load points
  (:func:`vkit.sim.loadfit.points_from_state`) fitted by :func:`vkit.sim.loadfit.fit_points` (decode
  bandwidth, prefill rate, decode-step overhead), at most :data:`FIT_POINTS` of them (spread over the
  loads measured: the fit replays each point per evaluation) and :data:`FIT_EVALS` evaluations a start.
- **A prediction** (:meth:`Twin.capacity`): the highest exact-rate Poisson load whose predicted run
  (``vkit.sim.predict.bench_summary``, the workload's lengths, the server's options with the
  candidate's) meets the SLO as a capacity search judges a run (``vkit.tune.capacity.judge_run``),
  bisected in log rate to :data:`TOLERANCE`. The run is the one the tune's search makes near a
  crossing: from an empty server, ``load x crossing_factor x point_seconds`` requests (at least
  :data:`MIN_REQUESTS`), so the twin predicts what the gate will be shown. On 8b-h200-chat (seed 11)
  steady-state runs of 400 requests tied every max_num_seqs from 128 up (43 req/s) where the search
  measured 54, 66 and 81-86 at 128, 256 and 512; runs shaped as the search's ranked them as measured.
- **Its interval** (:meth:`Twin.rank`), in log capacity: the spread of the capacity over
  :data:`DRAWS` parameter sets drawn from the fit's standard errors (independent, log-normal) and the
  twin's own miss on the configurations already measured (:meth:`Twin.miss`: each one's log(measured /
  twin) predicted from its nearest other, pooled with the fit's rms log error on its load points).
  Each prediction is corrected by the log ratio of the measured configuration nearest it
  (:func:`nearest_ratio`): every real measurement moves the ranking around it. ``lo``/``hi`` are the
  90 % interval (``Z``).

The twin proposes; every keep still goes through the gate on real runs (vkit.tune.steps.twinsearch).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable

import numpy as np

from vkit.errors import UsageError
from vkit.sim import loadfit
from vkit.sim.calibrated import CostParams, write_profile
from vkit.sim.fanout import fan_out
from vkit.sim.predict import Scenario, bench_summary
from vkit.tune import capacity as cap

MIN_REQUESTS = 100  # requests of a predicted run at least
TOLERANCE = 0.03  # bisection in log rate to this
DRAWS = 4  # parameter sets drawn from the fit's standard errors per ranked candidate
DRAWN = 6  # the candidates (best first) whose interval is drawn; the others take the widest drawn spread
CONSTANTS = {"min_requests": MIN_REQUESTS, "tolerance": TOLERANCE, "draws": DRAWS, "drawn": DRAWN}  # logged with each proposal
FIT_POINTS = 10  # load points the calibration replays at most
FIT_EVALS = 12  # least-squares evaluations per start
PER_CONFIG = 3  # a refit's load points of each measured trial (beside the baseline's FIT_POINTS)
Z = 1.645  # the interval's half-width in sd: 90 % two-sided
RSE_CAP = 0.5  # a parameter the points do not identify is drawn with at most this log sd
SERVE_KEYS = ("max_num_batched_tokens", "max_num_seqs", "max_model_len", "gpu_memory_utilization",
              "enable_chunked_prefill", "enable_prefix_caching", "block_size", "kv_cache_dtype")


class Uncalibrated(UsageError):
    """The twin has no load point to calibrate on (``str()``: the one-line reason, the first refusal's)."""


@dataclass
class Prediction:
    """The twin's capacity of one configuration (req/s), corrected by the measured configurations, with its interval."""

    config: dict
    raw: float  # the twin's capacity at the fitted parameters
    capacity: float  # raw x exp(correction)
    lo: float
    hi: float
    sd_log: float
    draws: list[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"config": dict(self.config), "raw": round(self.raw, 4), "capacity": round(self.capacity, 4),
                "lo": round(self.lo, 4), "hi": round(self.hi, 4), "sd_log": round(self.sd_log, 4),
                "draws": [round(x, 4) for x in self.draws]}


@dataclass
class Twin:
    """The calibrated simulator of one server and workload."""

    point: loadfit.LoadPoint  # model, GPU, TP, quantization and the server's options, from a measured load point
    isl: int
    osl: int
    slo: cap.Slo
    seconds: float  # a predicted run sends load x this many requests (the search's run near a crossing)
    params: CostParams
    stderr_log: dict  # parameter -> its log sd (the fit's relative standard error, capped)
    fit_error: float  # the fit's rms log error on its load points
    hint: float | None = None  # where every bisection starts (the baseline's capacity: the same start on replay)
    speed: float = 1.0  # the server's seconds per wall second (loadfit.LoadPoint.speed): capacities are wall req/s
    keep_up: float = cap.Plan.keep_up  # a predicted run keeps up when it completes this share of the offered rate
    profile_sha256: str = ""
    fit: dict = field(default_factory=dict)  # the calibration's report (points, parameter table, errors)
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def calibrate(cls, state_path: str, isl: int, osl: int, slo: cap.Slo, seconds: float, profile_path: str | None = None,
                  progress: Callable[[str], None] | None = None, trials: bool = False, base: CostParams | None = None,
                  keep_up: float = cap.Plan.keep_up, read: tuple[list, list] | None = None,
                  designed: list | None = None) -> Twin:
        """Fitted to the baseline's load points of the state at ``state_path`` (``trials``: every measured
        trial's too, each at its own configuration), starting from ``base`` when given; the profile written to
        ``profile_path`` (sim_predict / sim_server --sim-profile). ``loadfit.Refused``-free: a usage error
        when no point can calibrate. ``read``: (points, refused) of ``loadfit.points_from_state`` already read for it.
        ``designed``: closed-loop designed runs (``vkit.sim.designfit.design_runs``) fitted with the points."""
        points, refused = read if read is not None else loadfit.points_from_state(
            state_path, keys=("baseline", "trials") if trials else ("baseline",))
        if not points:
            raise Uncalibrated("the twin has no load point to calibrate on" + (f" ({refused[0]})" if refused else ""))
        chosen = spread_by_config(points, FIT_POINTS)
        problem = loadfit.PointProblem(chosen)
        if designed:
            from vkit.sim.designfit import JointProblem

            problem = JointProblem(problem, designed)
        res = loadfit.fit_points(problem, loadfit.free_for(chosen[0].gpu), base=base, max_nfev=FIT_EVALS, progress=progress)
        stderr = {n: min(row["rse"], RSE_CAP) if row.get("rse") is not None else RSE_CAP for n, row in res["table"].items()}
        twin = cls(point=chosen[0], isl=isl, osl=osl, slo=slo, seconds=seconds, params=res["params"], stderr_log=stderr,
                   fit_error=float(res["rms_log_error"]), speed=chosen[0].speed, keep_up=keep_up)
        doc = {"load_points": len(chosen), "of": len(points), "refused": len(refused), "designed_runs": len(designed or []),
               "disturbed": loadfit.disturbed_reasons(refused),
               "table": res["table"],
               "rms_log_error": res["rms_log_error"], "errors": res["errors"]}
        if profile_path:
            write_profile(profile_path, res["params"], {n: res["table"][n]["stderr"] for n in res["table"]},
                          {"load_points": state_path, "free": list(res["table"]), "report": doc})
            with open(profile_path, "rb") as f:
                twin.profile_sha256 = hashlib.sha256(f.read()).hexdigest()
        else:
            twin.profile_sha256 = hashlib.sha256(json.dumps(res["params"].to_dict(), sort_keys=True).encode()).hexdigest()
        twin.fit = doc
        return twin

    # -- one configuration -------------------------------------------------------------------
    def inputs(self) -> dict:
        """What a prediction depends on beside the profile's parameters (:meth:`from_inputs` rebuilds the twin)."""
        p = self.point
        return {"model": p.model, "gpu": p.gpu, "tp": p.tp, "quantization": p.quantization, "isl": self.isl, "osl": self.osl,
                "serve": self.serve_of({}), "slo": dict(self.slo.limits), "goodput": self.slo.goodput, "seconds": self.seconds,
                "hint": self.hint, "speed": self.speed, "keep_up": self.keep_up, "stderr_log": dict(self.stderr_log),
                "fit_error": self.fit_error, **CONSTANTS}

    @classmethod
    def from_inputs(cls, inputs: dict, params: CostParams, profile_sha256: str = "") -> Twin:
        """The twin a proposal was made with, from its logged inputs and the profile's parameters (``sweep --replay``).
        A usage error when the log was written with other constants than this version's (its proposals would differ)."""
        other = {k: (inputs[k], v) for k, v in CONSTANTS.items() if k in inputs and inputs[k] != v}
        if other:
            raise UsageError("the twin's proposals were made with other constants than this version's ("
                             + ", ".join(f"{k} {a} here {b}" for k, (a, b) in sorted(other.items())) + "): they cannot be replayed")
        point = loadfit.LoadPoint(source="replay", model=inputs["model"], gpu=inputs["gpu"], tp=int(inputs["tp"]),
                                  quantization=inputs.get("quantization"), serve=dict(inputs.get("serve") or {}), rate=0.0,
                                  arrivals=[], prompt_lens=[], output_lens=[], measured=[], ttft_s=0.0, tpot_s=0.0)
        return cls(point=point, isl=int(inputs["isl"]), osl=int(inputs["osl"]),
                   slo=cap.Slo(dict(inputs["slo"]), inputs.get("goodput")), seconds=float(inputs["seconds"]), params=params,
                   stderr_log=dict(inputs["stderr_log"]), fit_error=float(inputs["fit_error"]), hint=inputs.get("hint"),
                   speed=float(inputs.get("speed") or 1.0), keep_up=float(inputs.get("keep_up") or cap.Plan.keep_up),
                   profile_sha256=profile_sha256)

    def serve_of(self, config: dict) -> dict:
        base = {k: v for k, v in self.point.serve.items() if k in SERVE_KEYS}
        return {**base, **{k: v for k, v in config.items() if k in SERVE_KEYS}}

    @cached_property
    def server_slo(self) -> cap.Slo:
        """The SLO in the server's own ms, where the twin's latencies are: the client gives it in wall ms,
        ``speed`` server seconds to each."""
        return cap.Slo({k: v * self.speed for k, v in self.slo.limits.items()}, self.slo.goodput)

    def holds(self, config: dict, rate: float, params: CostParams) -> bool:
        """Whether the twin holds the SLO at ``rate`` (req/s in the server's own time, see ``speed``)."""
        p = self.point
        sc = Scenario(model=p.model, gpu=p.gpu, tp=p.tp, quantization=p.quantization, isl=self.isl, osl=self.osl, rate=rate,
                      num_prompts=max(MIN_REQUESTS, math.ceil(rate * self.seconds * self.speed)), seed=0, exact_rate=True,
                      serve=self.serve_of(config))
        j = cap.judge_run(bench_summary(sc, params), self.server_slo, cap.Plan(keep_up=self.keep_up), rate)
        return bool(j["valid"] and j["margin"] is not None and j["margin"] >= 0)

    def capacity(self, config: dict, params: CostParams | None = None, hint: float | None = None) -> float:
        """The highest rate (wall req/s, as the client offers it) the twin holds the SLO at, bisected in log rate
        to TOLERANCE (cached); ``hint`` in wall req/s too."""
        params = params or self.params
        key = self._key(config, params)
        if key not in self._cache:
            self._cache[key] = self.speed * bisect(lambda r: self.holds(config, r, params), hint / self.speed if hint else 4.0)
        return self._cache[key]

    def capacities(self, asks: list[tuple[dict, CostParams | None, float | None]]) -> list[float]:
        """:meth:`capacity` of each (config, params, hint), those not cached computed over the machine's
        cores (``vkit.sim.fanout``: each is deterministic, so the same figures either way)."""
        todo = [a for a in asks if self._key(a[0], a[1] or self.params) not in self._cache]
        got = fan_out(lambda a: self.capacity(*a), todo)
        for (c, ps, _), v in zip(todo, got, strict=True):
            self._cache[self._key(c, ps or self.params)] = v
        return [self.capacity(*a) for a in asks]

    @staticmethod
    def _key(config: dict, params: CostParams) -> tuple[str, str]:
        return json.dumps(config, sort_keys=True), json.dumps(params.to_dict(), sort_keys=True)

    def draws(self, seed: int = 0) -> list[CostParams]:
        """DRAWS parameter sets around the fit, each parameter log-normal with its log sd (the same sets for every config)."""
        rng = random.Random(seed)
        out = []
        for _ in range(DRAWS):
            out.append(replace(self.params, **{n: getattr(self.params, n) * math.exp(rng.gauss(0.0, s))
                                               for n, s in self.stderr_log.items() if getattr(self.params, n)}))
        return out

    # -- the ranking ---------------------------------------------------------------------------
    def rank(self, configs: list[dict], measured: list[tuple[dict, float]],
             progress: Callable[[str], None] | None = None) -> list[Prediction]:
        """Every configuration predicted, best first, corrected by the ``measured`` (config, capacity) pairs."""
        hint = self.hint
        ratios = [(c, math.log(m / got)) for c, m in measured if m and m > 0 and (got := self.capacity(c, hint=hint)) > 0]
        miss = self.miss(ratios)
        raw: list[float] = []
        for k in range(0, len(configs), 10):
            raw += self.capacities([(c, None, hint) for c in configs[k:k + 10]])
            if progress:
                progress(f"twin: {len(raw)}/{len(configs)} configurations predicted")
        order = sorted(range(len(configs)), key=lambda i: -raw[i])
        sets, spread, drawn = self.draws(), {}, {}
        top = [i for i in order[:DRAWN] if raw[i] > 0]
        flat = self.capacities([(configs[i], ps, raw[i]) for i in top for ps in sets])
        for n, i in enumerate(top):
            d = flat[n * len(sets):(n + 1) * len(sets)]
            drawn[i] = d
            logs = [math.log(x) for x in d if x > 0]
            spread[i] = float(np.std(logs + [math.log(raw[i])])) if logs else 0.0
        widest = max(spread.values(), default=0.0)
        out = []
        for i, c in enumerate(configs):
            sd = math.sqrt(spread.get(i, widest) ** 2 + miss ** 2)
            centre = raw[i] * math.exp(nearest_ratio(c, ratios))
            out.append(Prediction(config=dict(c), raw=raw[i], capacity=centre, lo=centre * math.exp(-Z * sd),
                                  hi=centre * math.exp(Z * sd), sd_log=sd, draws=drawn.get(i, [])))
        return sorted(out, key=lambda p: -p.capacity)

    def miss(self, ratios: list[tuple[dict, float]]) -> float:
        """The twin's miss sd in log: each measured configuration's log(measured / twin) predicted from its
        nearest other measured one (as a candidate is corrected), the root mean square of those errors,
        pooled with the fit's rms log error on its load points as one more observation."""
        errs = [r - nearest_ratio(c, ratios[:k] + ratios[k + 1:]) for k, (c, r) in enumerate(ratios) if len(ratios) > 1]
        return math.sqrt((sum(e * e for e in errs) + self.fit_error ** 2) / (len(errs) + 1))


def distance(a: dict, b: dict) -> float:
    """How far apart two configurations are: the sum of |log2| ratios of their numeric parameters."""
    return sum(abs(math.log2(a[k] / b[k])) for k in a if isinstance(a.get(k), (int, float)) and isinstance(b.get(k), (int, float))
               and a[k] > 0 and b[k] > 0)


def nearest_ratio(config: dict, ratios: list[tuple[dict, float]]) -> float:
    """The correction of ``config``: the mean log(measured / twin) of the measured configurations nearest it (0: none)."""
    if not ratios:
        return 0.0
    d = [distance(config, c) for c, _ in ratios]
    near = min(d)
    return float(np.mean([r for (_, r), x in zip(ratios, d, strict=True) if x <= near + 1e-9]))


def spread_points(points: list, n: int) -> list:
    """At most ``n`` of ``points``, spread over their loads (sorted by rate, evenly spaced), the highest kept."""
    if len(points) <= n:
        return list(points)
    pts = sorted(points, key=lambda p: p.rate)
    idx = sorted({round(k * (len(pts) - 1) / (n - 1)) for k in range(n)})
    return [pts[i] for i in idx]


def spread_by_config(points: list, n: int) -> list:
    """``n`` points spread over the loads of the first configuration (the baseline's), and at least
    PER_CONFIG of every other configuration's, spread the same way."""
    groups: dict[str, list] = {}
    for p in points:
        groups.setdefault(json.dumps(p.serve, sort_keys=True, default=str), []).append(p)
    first, *rest = groups.values()
    return spread_points(first, n) + [q for g in rest for q in spread_points(g, PER_CONFIG)]


def bisect(holds: Callable[[float], bool], hint: float, step: float = 2.0, lo_limit: float = 1e-3,
           hi_limit: float = 1e5) -> float:
    """The highest rate at which ``holds``: bracketed from ``hint`` by factors of ``step``, then
    bisected in log rate to TOLERANCE; 0 when nothing above ``lo_limit`` holds."""
    lo = hi = max(hint, lo_limit)
    if holds(lo):
        hi = lo * step
        while holds(hi):
            lo, hi = hi, hi * step
            if hi > hi_limit:
                return lo
    else:
        lo = hi / step
        while not holds(lo):
            lo, hi = lo / step, lo
            if lo < lo_limit:
                return 0.0
    while hi / lo > 1 + TOLERANCE:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return lo


def profile_path(runs_dir: str, trials: int = 0) -> str:
    """The twin's profile: the baseline's fit, or a refit once ``trials`` trials were measured."""
    return os.path.join(runs_dir, "twin-profile.json" if not trials else f"twin-profile-{trials}.json")


def design_profile_path(runs_dir: str) -> str:
    """The twin's profile refitted with the designed calibration runs (``--twin-design``)."""
    return os.path.join(runs_dir, "twin-profile-designed.json")
