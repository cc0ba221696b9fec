"""Designed calibration runs: closed-loop runs of the configuration already running, fitted with the load points.

A capacity search's open-loop points are taken near the SLO's boundary, where every step mixes prefills
and decodes of a queue of varying depth. On one configuration they leave the engine's fixed costs loose:
on real vLLM (bench/results/twin_vllm.json) they pinned the mixed step's CPU time but not the decode
step's, the per-request time or the compute fraction. Closed-loop runs with fixed lengths, on the
server as it runs (no restart), separate them:

- **concurrency 1**: every step serves one request, so its TTFT is one prefill with the step's and the
  request's CPU time, and its TPOT one decode step of a batch of one;
- **the KV-bound concurrency** (:func:`concurrencies`: max_num_seqs, or fewer where the KV cache holds
  fewer whole requests): decode steps carry the full batch, so the per-request time is read beside
  the per-step one;
- **a long prompt, one at a time** (:func:`long_prompt`): a prefill :data:`LONG_FACTOR` times the
  workload's, so the compute rate is read apart from the step's fixed time.

Each run is replayed as it ran by :class:`vkit.sim.calibrate.Problem` (closed loop with fixed lengths: its
schedule does not depend on the step costs), beside the load points' own replays
(:class:`vkit.sim.loadfit.PointProblem`), in one least-squares problem (:class:`JointProblem`).
The tune records the runs under the state's ``tune.twin_design`` (:func:`design_runs` reads them back).
"""

from __future__ import annotations

import math
import os
from dataclasses import replace

import numpy as np

from vkit.errors import UsageError
from vkit.jsonio import read_json
from vkit.sim.calibrate import Problem, Run, Target, summary_run
from vkit.sim.calibrated import CostParams
from vkit.sim.loadfit import PointProblem, argv_serve, launch_argv, sim_speed, state_target

MIN_REQUESTS = 8  # requests of a designed run at least
WAVES = 3  # a designed run at concurrency C sends this many x C requests (at least MIN_REQUESTS)
LONG_FACTOR = 8  # the long-prompt run's prompts are this many times the workload's (within the model length)


def concurrencies(config: dict, startup: dict, isl: int, osl: int) -> list[int]:
    """The designed runs' concurrencies: 1 and the KV-bound one, ``config``'s max_num_seqs capped by the whole
    requests of ``isl`` + ``osl`` tokens the KV cache holds (vLLM's startup line "Maximum concurrency for N tokens
    per request: X", ``startup``'s ``max_concurrency`` and ``max_concurrency_tokens_per_request``)."""
    top = int(config.get("max_num_seqs") or 256)  # vLLM's default max_num_seqs
    x, per = startup.get("max_concurrency"), startup.get("max_concurrency_tokens_per_request")
    if isinstance(x, (int, float)) and isinstance(per, (int, float)) and x > 0 and per > 0:
        top = min(top, max(1, math.floor(x * per / max(isl + osl, 1))))
    return sorted({1, top})


def long_prompt(config: dict, startup: dict, isl: int, osl: int) -> int | None:
    """The long-prompt run's prompt length (one request at a time): LONG_FACTOR x ``isl``, within the model length
    (``config``'s or the startup's max_model_len) less ``osl``; None when that leaves less than twice ``isl``
    (the workload's own prompts already are the long ones)."""
    mml = config.get("max_model_len") or startup.get("max_model_len")
    n = LONG_FACTOR * isl if not isinstance(mml, int) else min(LONG_FACTOR * isl, mml - osl - 1)
    return n if n >= 2 * isl else None


def design(config: dict, startup: dict, isl: int, osl: int) -> list[tuple[int, int]]:
    """The designed runs, as (concurrency, prompt length): :func:`concurrencies` at the workload's prompts, and one
    request at a time at the :func:`long_prompt` (the prefill's compute rate, apart from the steps' fixed time)."""
    out = [(c, isl) for c in concurrencies(config, startup, isl, osl)]
    n = long_prompt(config, startup, isl, osl)
    return out + ([(1, n)] if n else [])


def serving(state: dict, config: dict) -> dict:
    """The engine flags a configuration of ``state``'s server runs with: the launch's (``--max-model-len`` ...) under
    ``config`` (the tuned values)."""
    return {**argv_serve(launch_argv(state)), **config}


def requests_for(concurrency: int) -> int:
    return max(MIN_REQUESTS, WAVES * concurrency)


def design_runs(state_path: str, target: Target | None = None) -> tuple[list[Run], list[str]]:
    """The designed runs a state recorded (``tune.twin_design``: the configuration and the summaries' paths,
    relative to the state's folder), each as a calibration run at that configuration with the launch's engine
    flags under it, its times in the server's seconds (a live simulator's ``--sim-speed``); (runs, the one-line
    reasons of those refused)."""
    try:
        st = read_json(state_path, "state file")
    except OSError as e:
        raise UsageError(f"cannot read {state_path}: {e.strerror}") from None
    rec = (st.get("tune") or {}).get("twin_design") or {}
    target = state_target(st, target or Target())
    cfg = serving(st, rec.get("config") or {})
    runs, refused = [], []
    for rel in rec.get("runs") or []:
        path = os.path.join(os.path.dirname(os.path.abspath(state_path)), rel)
        try:
            doc = read_json(path, "bench_stream summary")
            run = summary_run(path, doc, target, cfg)
        except (OSError, UsageError, KeyError, TypeError, ValueError) as e:
            refused.append(f"{rel}: {e}")
            continue
        k = sim_speed((((doc.get("vkit") or {}).get("server")) or {}).get("version_info") or {})
        runs.append(replace(run, ttft_s=run.ttft_s * k, tpot_s=run.tpot_s * k))
    return runs, refused


class JointProblem:
    """Open-loop load points and closed-loop designed runs as one problem for :func:`vkit.sim.loadfit.fit_points`:
    their predicted and measured (mean TTFT, mean TPOT) rows, the points' first."""

    def __init__(self, points: PointProblem, runs: list[Run]):
        self.open = points
        self.closed = Problem(runs, serve={}) if runs else None
        self.points = list(points.points) + list(runs)

    def predict(self, params: CostParams) -> np.ndarray:
        rows = [self.open.predict(params)]
        if self.closed is not None:
            rows.append(self.closed.predict(params))
        return np.vstack(rows)

    def measured(self) -> np.ndarray:
        rows = [self.open.measured()]
        if self.closed is not None:
            rows.append(self.closed.measured())
        return np.vstack(rows)
