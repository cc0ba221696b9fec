"""Fit the step-cost model's free parameters to measured vLLM runs.

Input rows (``read_runs``): the CSV format of NVIDIA's AIConfigurator silicon data (columns
``backend_version, model_path, system, precision, gemm_quant_mode, isl, osl, batch_size, tp_size,
pp_size, silicon_ttft_ms, silicon_tpot_ms``): closed loop at ``batch_size``, fixed input/output
lengths, mean TTFT and TPOT in steady state; and vkit's own bench_stream summaries of a real
server (``read_summaries``): closed loop, fixed lengths, the server's flags from the tune state
that recorded the run (its baseline or trial configuration) and from the server's own
``cache_config_info``, the model and GPU given by the caller (or the simulator's own report).

Each row is simulated once by the predictor (:mod:`vkit.sim.predict`) at its batch size with the
version's defaults; closed loop with fixed lengths schedules the same steps whatever the step
durations, so the fit replays every row's recorded schedule under each candidate parameter set
(numpy, microseconds per step) instead of re-running the engine. The fit minimises the squared
log errors of mean TTFT and mean TPOT (``scipy.optimize.least_squares``, bounded, in the log of
each parameter), and reports per-metric MAPE and signed bias on the fitted rows, on k-fold and
on leave-one-group-out held-out rows, and each parameter's standard error from the Jacobian
(``cov = s² (JᵀJ)⁻¹`` in log-parameter space, ``s²`` the residual variance).
"""

from __future__ import annotations

import csv
import math
import os
import random
import time
from dataclasses import dataclass, replace

import numpy as np

from vkit.errors import InvalidData, UsageError
from vkit.jsonio import read_json
from vkit.sim.calibrated import CostParams, PhysCost
from vkit.sim.predict import SERVE_FIELDS, Scenario, Trace, run_trace
from vkit.sim.profiles import get_gpu, get_model

# The free parameters and their bounds (physical ranges, not targets).
FREE: dict[str, tuple[float, float]] = {
    "mfu": (0.05, 1.0),
    "mbu": (0.2, 1.0),
    "gemm_m_half": (1.0, 2048.0),
    "attn_scale": (0.2, 20.0),
    "decode_step_overhead_s": (1e-5, 0.05),
    "mixed_step_overhead_s": (1e-5, 0.2),
    "per_req_overhead_s": (1e-8, 1e-3),
    "allreduce_latency_s": (1e-7, 2e-4),
    "link_eff": (0.02, 1.0),
    "frontend_latency_s": (1e-5, 1.0),
    "frontend_per_token_s": (1e-9, 1e-4),
}
METRICS = ("ttft", "tpot")

# vLLM's defaults the calibration protocol ran with (../shared/calibration/README.md):
# gpu-memory-utilization 0.9 (vLLM's default before April 2026), V1 defaults otherwise.
PROTOCOL_SERVE = {"gpu_memory_utilization": 0.90}


@dataclass
class Run:
    """One measured run."""

    model: str  # the simulator's model profile name
    gpu: str
    tp: int
    quantization: str | None
    isl: int
    osl: int
    concurrency: int
    ttft_s: float
    tpot_s: float
    version: str = ""
    source: str = ""
    serve: dict | None = None  # vllm serve options of this run beyond the protocol's defaults
    # A whole recorded run (a bench_stream summary): simulate exactly its requests, none left out,
    # started as the client started them (burst); None: a steady-state row (waves, warm-up, ramp).
    num_prompts: int | None = None

    @property
    def group(self) -> str:
        return f"{self.model}/{self.gpu}/{self.quantization or 'bf16'}/tp{self.tp}"

    @property
    def model_group(self) -> str:
        return f"{self.model}/{self.gpu}/{self.quantization or 'bf16'}"

    def label(self) -> str:
        return f"{self.group} isl={self.isl} osl={self.osl} C={self.concurrency}"


def read_runs(paths: list[str]) -> list[Run]:
    """Measured runs from the calibration CSV files; a usage error naming the file and line otherwise."""
    runs: list[Run] = []
    need = ("model_path", "system", "isl", "osl", "batch_size", "tp_size", "silicon_ttft_ms", "silicon_tpot_ms")
    for path in paths:
        try:
            f = open(path, encoding="utf-8", newline="")
        except OSError as e:
            raise UsageError(f"cannot read {path}: {e.strerror}") from None
        with f:
            rd = csv.DictReader(f)
            missing = [c for c in need if c not in (rd.fieldnames or [])]
            if missing:
                raise UsageError(f"{path}: not a calibration CSV (missing column(s) {', '.join(missing)})")
            for lineno, row in enumerate(rd, start=2):
                if row.get("backend") not in (None, "", "vllm"):
                    continue
                try:
                    pp = int(row.get("pp_size") or 1)
                    if pp != 1:
                        continue  # pipeline parallel is not simulated
                    prec = (row.get("precision") or "").strip().lower()
                    gq = (row.get("gemm_quant_mode") or "").strip().lower()
                    quant = "fp8" if "fp8" in (prec, gq) else None
                    if prec not in ("", "bf16", "bfloat16", "fp16", "fp8"):
                        raise ValueError(f"precision {prec!r} is not simulated")
                    runs.append(Run(
                        model=get_model(row["model_path"].strip()).name,
                        gpu=get_gpu(row["system"].strip()).name,
                        tp=int(row["tp_size"]), quantization=quant,
                        isl=int(row["isl"]), osl=int(row["osl"]), concurrency=int(row["batch_size"]),
                        ttft_s=float(row["silicon_ttft_ms"]) / 1e3, tpot_s=float(row["silicon_tpot_ms"]) / 1e3,
                        version=(row.get("backend_version") or "").strip(), source=f"{path}:{lineno}",
                    ))
                except (ValueError, KeyError, UsageError) as e:
                    raise UsageError(f"{path}:{lineno}: {e}") from None
    if not runs:
        raise UsageError("no measured vLLM runs in the input")
    return runs


SUMMARY_SCHEMA = "vkit.bench_stream/1"


@dataclass
class Target:
    """What a bench_stream summary does not say about the server it measured."""

    model: str | None = None  # the simulator's model profile (e.g. llama-3.1-8b)
    gpu: str | None = None
    tp: int | None = None
    quantization: str | None = None
    # what a real (not simulated) server's summaries are read as when model / gpu are not given: the served
    # model's local directory (its config.json) and the device the state's fingerprint found (loadfit.state_target)
    local_model: str | None = None
    local_device: str | None = None


def _configs_by_run(state_path: str | None) -> dict[str, dict]:
    """realpath of each run file -> the configuration (vllm serve options) it was measured at."""
    if not state_path:
        return {}
    try:
        st = read_json(state_path, "state file")
    except OSError as e:
        raise UsageError(f"--state: cannot read {state_path}: {e.strerror}") from None
    base = os.path.dirname(os.path.abspath(state_path))
    out: dict[str, dict] = {}
    entries = [st.get("baseline") or {}] + list(st.get("trials") or [])
    for e in entries:
        for rp in e.get("runs") or []:
            out[os.path.realpath(os.path.join(base, rp))] = dict(e.get("config") or {})
    return out


def _summary_serve(doc: dict, config: dict) -> dict:
    srv = (doc.get("vkit") or {}).get("server") or {}
    cache = srv.get("cache_config") or {}
    serve = {k: v for k, v in config.items() if k in SERVE_FIELDS}
    if "gpu_memory_utilization" not in serve and cache.get("gpu_memory_utilization") not in (None, "None"):
        serve["gpu_memory_utilization"] = float(cache["gpu_memory_utilization"])
    if "block_size" not in serve and cache.get("block_size") not in (None, "None"):
        serve["block_size"] = int(cache["block_size"])
    if "max_model_len" not in serve and isinstance(srv.get("max_model_len"), int):
        serve["max_model_len"] = srv["max_model_len"]
    return serve


def served_by(vk: dict, target: Target, config: dict) -> tuple[str | None, str | None, int]:
    """(model, GPU, TP) of the server a bench_stream summary measured: the caller's ``target`` first, then
    the simulator's own report (``version_info``), or for a real server the target's local model directory and
    device, then the recorded configuration; None where unknown."""
    info = ((vk.get("server") or {}).get("version_info")) or {}
    sim = bool(info.get("sim"))
    model = target.model or (info.get("sim_model") if sim else target.local_model)
    gpu = target.gpu or (info.get("sim_gpu") if sim else target.local_device)
    tp = target.tp or (info.get("sim_tensor_parallel_size") if sim else None) or config.get("tensor_parallel_size") or 1
    return model, gpu, int(tp)


def summary_run(path: str, doc: dict, target: Target, config: dict) -> Run:
    """One bench_stream summary as a measured run; a usage error saying what it lacks otherwise."""
    vk = doc.get("vkit") if isinstance(doc, dict) else None
    if not isinstance(vk, dict) or vk.get("schema") != SUMMARY_SCHEMA:
        raise UsageError(f"{path}: not a bench_stream summary (no vkit.schema {SUMMARY_SCHEMA})")
    ds = vk.get("dataset") or {}
    if ds.get("name") != "random" or float(ds.get("random_range_ratio") or 0) != 0:
        raise UsageError(f"{path}: calibration needs fixed lengths (--dataset-name random, range ratio 0)")
    rate = doc.get("request_rate")
    if not doc.get("max_concurrency") or rate not in ("inf", None, float("inf")):
        raise UsageError(f"{path}: calibration needs a closed-loop run (--max-concurrency C, no --request-rate)")
    if doc.get("failed") or not doc.get("completed") or vk.get("partial"):
        raise UsageError(f"{path}: the run has failed requests or was cut short; it cannot calibrate")
    model, gpu, tp = served_by(vk, target, config)
    if not model or not gpu:
        raise UsageError(f"{path}: say which model and GPU served it (--sim-model M --sim-gpu G)")
    isl = int(ds.get("random_input_len") or round(doc["total_input_tokens"] / doc["completed"]))
    osl = int(ds.get("random_output_len") or round(doc["total_output_tokens"] / doc["completed"]))
    return Run(model=get_model(model).name, gpu=get_gpu(gpu).name, tp=int(tp),
               quantization=target.quantization or config.get("quantization"), isl=isl, osl=osl,
               concurrency=int(doc["max_concurrency"]), ttft_s=float(doc["mean_ttft_ms"]) / 1e3,
               tpot_s=float(doc["mean_tpot_ms"]) / 1e3, version=str((vk.get("server") or {}).get("version") or ""),
               source=path, serve=_summary_serve(doc, config) or None, num_prompts=int(doc["completed"]))


def read_summaries(paths: list[str], target: Target | None = None, state_path: str | None = None) -> list[Run]:
    """bench_stream summaries as measured runs, each at the configuration the state recorded for it."""
    configs = _configs_by_run(state_path)
    runs = []
    for path in paths:
        try:
            doc = read_json(path, "bench_stream summary")
        except FileNotFoundError:
            raise UsageError(f"no such bench_stream summary: {path}") from None
        except OSError as e:
            raise UsageError(f"cannot read {path}: {e.strerror}") from None
        try:
            runs.append(summary_run(path, doc, target or Target(), configs.get(os.path.realpath(path), {})))
        except (KeyError, TypeError, ValueError) as e:
            raise UsageError(f"{path}: not a usable bench_stream summary ({e})") from None
    return runs


def read_any(paths: list[str], target: Target | None = None, state_path: str | None = None) -> list[Run]:
    """Calibration CSV files and bench_stream summaries (``.json``), in the order given."""
    csvs = [p for p in paths if not p.lower().endswith(".json")]
    jsons = [p for p in paths if p.lower().endswith(".json")]
    runs = read_runs(csvs) if csvs else []
    return runs + (read_summaries(jsons, target, state_path) if jsons else [])


def scenario_for(run: Run, waves: int = 6, warmup_waves: int = 2, ramp_steps: int | None = None,
                 serve: dict | None = None) -> Scenario:
    whole = run.num_prompts is not None
    return Scenario(ramp_steps=None if whole else ramp_steps, burst_start=whole, model=run.model, gpu=run.gpu, isl=run.isl, osl=run.osl,
                    tp=run.tp, quantization=run.quantization, concurrency=run.concurrency,
                    num_prompts=run.num_prompts if whole else waves * run.concurrency,
                    warmup=0 if whole else warmup_waves * run.concurrency,
                    serve={**(PROTOCOL_SERVE if serve is None else serve), **(run.serve or {})})


class Problem:
    """The measured runs with their recorded schedules, ready to be evaluated under any parameters."""

    def __init__(self, runs: list[Run], waves: int = 6, progress=None, ramp_steps: int | None = None,
                 serve: dict | None = None):
        self.runs = runs
        self.ramp_steps = ramp_steps
        self.traces: list[Trace] = []
        for i, r in enumerate(runs):
            self.traces.append(run_trace(scenario_for(r, waves, ramp_steps=ramp_steps, serve=serve)))
            if progress:
                progress(i + 1, len(runs))
        self._phys = [(get_model(r.model), get_gpu(r.gpu), r.tp, tr.resolved.kv_dtype_bytes, r.quantization)
                      for r, tr in zip(self.runs, self.traces, strict=True)]

    def predict(self, params: CostParams, idx=None) -> np.ndarray:
        """(rows, 2): predicted mean TTFT and TPOT (seconds)."""
        idx = range(len(self.runs)) if idx is None else idx
        out = np.empty((len(idx), 2))
        for k, i in enumerate(idx):
            m, g, tp, kvb, q = self._phys[i]
            cost = PhysCost(m, g, tp, kvb, params, q)
            tr = self.traces[i]
            out[k] = tr.means(tr.step_times(cost), params.frontend_s(self.runs[i].isl))
        return out

    def measured(self, idx=None) -> np.ndarray:
        idx = range(len(self.runs)) if idx is None else idx
        return np.array([[self.runs[i].ttft_s, self.runs[i].tpot_s] for i in idx])

    def regimes(self, params: CostParams | None) -> list[str]:
        out = []
        for i, tr in enumerate(self.traces):
            if params is None:
                out.append(tr.summary()["regime"])
            else:
                m, g, tp, kvb, q = self._phys[i]
                out.append(tr.summary(tr.step_times(PhysCost(m, g, tp, kvb, params, q)),
                                      params.frontend_s(self.runs[i].isl))["regime"])
        return out

    def default_predict(self) -> np.ndarray:
        """Today's uncalibrated simulator on every row (the built-in roofline, no frontend)."""
        return np.array([tr.means(tr.durations) for tr in self.traces])


def _vec_to_params(x: np.ndarray, names: list[str], base: CostParams) -> CostParams:
    return replace(base, **{n: float(math.exp(v)) for n, v in zip(names, x, strict=True)})


def fit(problem: Problem, idx=None, names: list[str] | None = None, base: CostParams | None = None,
        max_nfev: int = 200) -> dict:
    """Bounded least squares on log errors. Returns params, standard errors, residual stats."""
    names = list(names or FREE)
    base = base or CostParams()
    idx = list(range(len(problem.runs))) if idx is None else list(idx)
    meas = np.log(problem.measured(idx))
    lo = np.log([FREE[n][0] for n in names])
    hi = np.log([FREE[n][1] for n in names])
    start = []
    for n in names:
        v = getattr(base, n)
        if v is None:
            v = 8e-6
        v = min(max(v, FREE[n][0] * 1.0001), FREE[n][1] * 0.9999)
        start.append(math.log(v))
    x0 = np.clip(np.array(start), lo + 1e-9, hi - 1e-9)

    def resid(x):
        pred = problem.predict(_vec_to_params(x, names, base), idx)
        return (np.log(np.maximum(pred, 1e-9)) - meas).ravel()

    from scipy.optimize import least_squares

    sol = least_squares(resid, x0, bounds=(lo, hi), method="trf", x_scale=1.0, max_nfev=max_nfev, diff_step=1e-3)
    params = _vec_to_params(sol.x, names, base)
    m, n = len(sol.fun), len(names)
    s2 = float(sol.fun @ sol.fun) / max(m - n, 1)
    J = sol.jac
    stderr: dict[str, float | None] = {}
    try:
        cov = np.linalg.pinv(J.T @ J) * s2
        for k, nm in enumerate(names):
            sd_log = math.sqrt(max(cov[k, k], 0.0))
            stderr[nm] = getattr(params, nm) * sd_log  # delta method: sd(exp(u)) ~ exp(u) sd(u)
    except np.linalg.LinAlgError:
        stderr = {nm: None for nm in names}
    at_bound = [nm for k, nm in enumerate(names) if sol.x[k] <= lo[k] + 1e-6 or sol.x[k] >= hi[k] - 1e-6]
    return {"params": params, "stderr": stderr, "at_bound": at_bound, "cost": float(sol.cost),
            "nfev": int(sol.nfev), "status": int(sol.status), "rows": idx}


def error_stats(pred: np.ndarray, meas: np.ndarray) -> dict:
    """Per metric: MAPE and signed mean percentage error (bias), in percent."""
    out = {}
    for k, name in enumerate(METRICS):
        rel = (pred[:, k] - meas[:, k]) / meas[:, k]
        out[name] = {"mape_pct": float(np.mean(np.abs(rel)) * 100), "bias_pct": float(np.mean(rel) * 100),
                     "n": int(len(rel))}
    return out


def kfold(problem: Problem, k: int = 5, seed: int = 0, **kw) -> np.ndarray:
    """Held-out predictions: each row predicted by the fit on the other folds."""
    n = len(problem.runs)
    order = list(range(n))
    random.Random(seed).shuffle(order)
    pred = np.empty((n, 2))
    for f in range(k):
        test = order[f::k]
        train = [i for i in order if i not in set(test)]
        res = fit(problem, train, **kw)
        pred[test] = problem.predict(res["params"], test)
    return pred


def leave_group_out(problem: Problem, key: str = "group", **kw) -> tuple[np.ndarray, list[str]]:
    """Held-out predictions with each group (model/GPU/precision/TP, or model/GPU/precision with
    ``key="model_group"``) predicted by the fit on all other groups. Groups that are alone in
    their model group under ``group`` are still predicted from the other TPs."""
    groups = sorted({getattr(r, key) for r in problem.runs})
    pred = np.full((len(problem.runs), 2), np.nan)
    for g in groups:
        test = [i for i, r in enumerate(problem.runs) if getattr(r, key) == g]
        train = [i for i, r in enumerate(problem.runs) if getattr(r, key) != g]
        if not train:
            continue
        res = fit(problem, train, **kw)
        pred[test] = problem.predict(res["params"], test)
    return pred, groups


def tpot_memory_floor_s(run: Run, kv_cache_dtype: str = "auto") -> float:
    """The least TPOT the hardware allows in a decode step at the run's concurrency: every GPU reads
    its share of the weights and the batch's KV cache (mean context isl + osl/2) at 100 % of peak
    HBM bandwidth. A measured TPOT below it means the run's configuration differs from the one
    simulated (e.g. an FP8 KV cache the row does not record)."""
    from vkit.sim.profiles import KV_DTYPE_BYTES

    m, g = get_model(run.model), get_gpu(run.gpu)
    kvb = KV_DTYPE_BYTES.get(kv_cache_dtype) or m.dtype_bytes
    weights = (m.weight_bytes_for(run.quantization) - (0 if m.tie_word_embeddings else m.embedding_params * m.dtype_bytes))
    kv_per_token = 2 * m.layers * max(1, m.kv_heads // run.tp) * run.tp * m.head_dim * kvb
    return (weights + run.concurrency * (run.isl + run.osl / 2) * kv_per_token) / (g.hbm_bytes_per_s * run.tp)


def measured_regime(run: Run) -> str | None:
    """What the measurement itself says: queue-bound when the mean TTFT is at least half of a
    request's decode time (requests wait a large part of another's lifetime for admission);
    otherwise the data alone cannot tell prefill-bound from decode-bound (None)."""
    return "queue-bound" if run.ttft_s >= 0.5 * run.tpot_s * (run.osl - 1) else None


def calibrate(run_paths: list[str], free: list[str], folds: int, group_by: str, waves: int, seed: int,
              progress=lambda msg: None, ramps: tuple[int, ...] = (0,),
              select: tuple[str, ...] = (), target: Target | None = None,
              state_path: str | None = None) -> tuple[dict, CostParams, dict]:
    """The whole calibration: (report, fitted params, stderr). Behind sim_calibrate and bench/bench_fidelity.py.

    ``ramps``: closed-loop ramp lengths in steps to try (0 = one request's lifetime); each needs its
    own recorded schedules, the one with the smallest residual cost is kept."""
    runs = read_any(run_paths, target, state_path)
    if select:
        runs = [r for r in runs if any(r.group.lower().startswith(p.lower()) for p in select)]
        if not runs:
            raise UsageError(f"--select {','.join(select)}: no run belongs to such a group")
    best = None
    ramp_costs = {}
    for ramp in ramps:
        t0 = time.time()
        label = "one lifetime" if not ramp else f"{ramp} steps"
        problem = Problem(runs, waves=waves, ramp_steps=ramp or None,
                          progress=lambda i, n, lb=label: progress(f"ramp {lb}: simulated {i}/{n} runs")
                          if i % 40 == 0 or i == n else None)
        res = fit(problem, names=free)
        ramp_costs[str(ramp)] = res["cost"]
        progress(f"ramp {label}: schedules and fit in {time.time() - t0:.0f} s, residual cost {res['cost']:.3f}")
        if best is None or res["cost"] < best[1]["cost"]:
            best = (problem, res, ramp)
    problem, res, ramp = best
    if res["status"] <= 0:
        raise InvalidData(f"the fit did not converge (least_squares status {res['status']})")
    params = res["params"]
    meas = problem.measured()
    fitted = problem.predict(params)
    default = problem.default_predict()
    report: dict = {
        "rows": len(runs),
        "free": free,
        "closed_loop_ramp_steps": ramp,
        "ramp_costs": ramp_costs,
        "params": {n: getattr(params, n) for n in free},
        "stderr": res["stderr"],
        "at_bound": res["at_bound"],
        "fitted": error_stats(fitted, meas),
        "default": error_stats(default, meas),
        "groups": {},
    }
    held: dict[str, np.ndarray] = {}
    if folds and folds > 1 and len(runs) >= folds:
        progress(f"{folds}-fold held-out refits")
        held["kfold"] = kfold(problem, folds, seed=seed, names=free)
        report["kfold"] = error_stats(held["kfold"], meas)
    if group_by != "none":
        progress(f"leave-one-{group_by}-out refits")
        pred, groups = leave_group_out(problem, key=group_by, names=free)
        ok = ~np.isnan(pred[:, 0])
        if ok.any():
            held["logo"] = pred
            report["leave_group_out"] = error_stats(pred[ok], meas[ok])
            report["leave_group_out"]["by"] = group_by
    regimes = problem.regimes(params)
    for g in sorted({r.group for r in runs}):
        ii = [i for i, r in enumerate(runs) if r.group == g]
        entry = {"rows": len(ii), "fitted": error_stats(fitted[ii], meas[ii]),
                 "default": error_stats(default[ii], meas[ii])}
        for name, pred in held.items():
            jj = [i for i in ii if not np.isnan(pred[i, 0])]
            if jj:
                entry[name] = error_stats(pred[jj], meas[jj])
        report["groups"][g] = entry
    rows = []
    for i, r in enumerate(runs):
        row = {"run": r.label(), "source": r.source, "measured": {"ttft_s": r.ttft_s, "tpot_s": r.tpot_s},
               "fitted": {"ttft_s": float(fitted[i, 0]), "tpot_s": float(fitted[i, 1])},
               "default": {"ttft_s": float(default[i, 0]), "tpot_s": float(default[i, 1])},
               "regime": regimes[i], "measured_regime": measured_regime(r)}
        for name, pred in held.items():
            if not np.isnan(pred[i, 0]):
                row[name] = {"ttft_s": float(pred[i, 0]), "tpot_s": float(pred[i, 1])}
        rows.append(row)
    report["per_row"] = rows
    report["below_memory_floor"] = [
        {"run": r.label(), "measured_tpot_s": r.tpot_s, "floor_s": tpot_memory_floor_s(r),
         "floor_fp8_kv_s": tpot_memory_floor_s(r, "fp8")}
        for r in runs if r.tpot_s < tpot_memory_floor_s(r)]
    known = [(row["measured_regime"], row["regime"]) for row in rows if row["measured_regime"]]
    report["queue_bound_rows"] = {"measured": len(known), "reproduced": sum(a == b for a, b in known)}
    return report, params, res["stderr"]
