"""The simulator in virtual time behind one object: no sockets, no threads, no wall clock.

:class:`VirtualServer` is a deployment of the simulated vLLM: ``start(config)`` builds a new engine
as ``sim_server`` would for those flags (the same start-up checks and refusals in vLLM's words, a
fresh between-restart noise draw, OOM under load), ``measure(cfg)`` runs one bench_stream workload
(:class:`~vkit.measure.benchconfig.BenchConfig`: closed loop, Poisson or trace arrivals, datasets,
warm-ups, a duration) through it and returns the summary and records bench_stream writes, built by
bench_stream's own :func:`~vkit.measure.runsummary.summarize` from the requests' virtual timings, with
the server's /metrics before and after the run (rendered and parsed as a scrape would). Every
request is validated by the simulator's API (:meth:`~vkit.sim.api.SimApi.parse`), so a request a
live server would refuse fails here with the same words.

Time is the simulated accelerator's: a start costs ``SimSettings.startup_s`` seconds, a pause of
``run_gap_s`` separates two runs, and :class:`Tally` counts starts, runs, requests and simulated
seconds as a live tune would pay them. Figures are simulated, never measured: each summary says so
(``vkit.virtual``).
"""

from __future__ import annotations

import io
import json
from collections import deque
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from vkit.errors import Unavailable, UsageError
from vkit.measure.benchconfig import BenchConfig
from vkit.measure.client import Result, request_body
from vkit.measure.datasets import Request as BenchRequest
from vkit.measure.energy import add_energy
from vkit.measure.fingerprint import fingerprint
from vkit.measure.gauge import save
from vkit.measure.loadgen import preflight_request
from vkit.measure.prom import parse
from vkit.measure.runsummary import summarize
from vkit.measure.serverapi import cache_config, delta, families
from vkit.sim.api import ENGINE_DEAD_MSG, SIM_VERSION, Live, SimApi
from vkit.sim.config import Resolved, ServeOptions, SimStartupError, resolve
from vkit.sim.engine import FINISHED
from vkit.sim.http import BadRequest
from vkit.sim.metrics import Metrics
from vkit.sim.serve import build_engine, fail_at_start, oom_under_load
from vkit.sim.settings import SimSettings
from vkit.sim.vlog import VllmLog

# vllm serve flags a configuration may set: ServeOptions' own fields, minus what names the deployment
CONFIG_KEYS = frozenset(f.name for f in fields(ServeOptions)) - {"model", "gpu", "model_profile", "memory_in_use_bytes"}
PHASE_GAP_S = 0.05  # between the preflight, the warm-ups and the measured requests: the client's scrapes
STALL_S = 60.0  # a request the engine cannot schedule fails after this long, as the client's stall timeout
REFUSED_S = 0.001  # a request the server refuses at once: the client's round trip


@dataclass
class Tally:
    """What a deployment cost so far, in the simulated accelerator's time."""

    starts: int = 0
    failed_starts: int = 0
    runs: int = 0
    requests: int = 0
    simulated_s: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Start:
    """One start: ``ok``, else vLLM's last words (``message``)."""

    ok: bool
    config: dict
    message: str | None = None
    start_index: int = 0


class _Sent:
    """One request in flight: the client's result and the server's bookkeeping."""

    __slots__ = ("result", "live", "tokens")

    def __init__(self, result: Result, live: Live):
        self.result = result
        self.live = live
        self.tokens: list[float] = []


class VirtualApp(SimApi):
    """One start of the simulated server: the API's validation over an engine stepped in virtual
    time (``self.t``, seconds). No connection ever exists: requests come as bench_stream's."""

    def __init__(self, opts: ServeOptions, resolved: Resolved, settings: SimSettings, clock_s: float,
                 drift_offset_s: float):
        super().__init__(opts, resolved, settings, VllmLog(io.StringIO(), io.StringIO()))
        self.engine = build_engine(opts, resolved, settings, self.tok, drift_offset_s)
        self.metrics = Metrics(resolved.max_model_len, created=clock_s)
        self.t = clock_s
        self.dead = False
        self.death: str | None = None
        self.oom = oom_under_load(opts, settings)
        self.peaks: dict[str, float] = {}
        self.above_idle_before = 0.0  # the power meter's energy above idle when the measured requests began

    def vnow(self, w: float | None = None) -> float:
        return self.t

    def power(self, duration_s: float) -> dict:
        """The simulated boards' power block over the last run (the shape of ``accel.Sampler``'s): an exact
        energy counter, no sampling (``build_engine`` attaches a meter to every engine it builds)."""
        m = self.engine.meter
        e = m.idle_w * duration_s + (m.above_idle_j - self.above_idle_before)
        return {"available": True, "source": "simulated", "devices": m.tp, "samples": None, "interval_s": None,
                "covered_s": duration_s, "mean_w": e / duration_s if duration_s > 0 else None, "counter_j": e,
                "counter_s": duration_s, "sampled_j": None}

    def crash(self, cause: str, exc: str = "RuntimeError") -> None:
        if not self.dead:
            self.dead, self.death = True, f"{exc}: {cause}"

    # -- one run ---------------------------------------------------------------------------------
    def run(self, cfg: BenchConfig, model: str, workers: int) -> tuple[list[Result], list[Result], float, float, Result, Any]:
        """The preflight, the warm-ups and the measured requests of one bench_stream run: (measured
        results, warm-up results, t0, t_end, preflight, /metrics scraped before the measured requests)."""
        chat = cfg.endpoint == "chat"
        pre = self._phase([_one_token(cfg.requests[0])], None, 1, None, chat, model, cfg.stream)[0][0]
        self.t += PHASE_GAP_S
        warm: list[Result] = []
        if cfg.warmups:
            warm = self._phase(cfg.warmups, None, min(workers, len(cfg.warmups)), None, chat, model, cfg.stream)[0]
            self.t += PHASE_GAP_S
        self.peaks = {}
        before = self.scrape()
        self.above_idle_before = self.engine.meter.above_idle_j
        results, t0 = self._phase(cfg.requests, cfg.arrivals, workers, cfg.duration_s, chat, model, cfg.stream)
        return results, warm, t0, self.t, pre, before

    def _phase(self, reqs: list[BenchRequest], offsets: Any, workers: int, duration_s: float | None, chat: bool,
               model: str, stream: bool) -> tuple[list[Result], float]:
        """Send ``reqs`` (each at ``t0 + offsets[i]``, or all at once, at most ``workers`` in
        flight: a request waits for a free slot, as bench_stream's) and step the engine until every
        one has ended."""
        t0 = self.t
        eng = self.engine
        done: list[Result] = []
        flight: dict[str, _Sent] = {}
        free = deque([t0] * min(workers, len(reqs) if duration_s is None else workers))  # when each free slot freed
        i = 0

        def due(k: int) -> float:
            return t0 + (float(offsets[k]) if offsets is not None and k < len(offsets) else 0.0)

        def more() -> bool:
            return (i < len(reqs)) if duration_s is None else (self.t - t0 < duration_s)

        while True:
            while more() and free and due(i) <= self.t:
                # sent when it was due, or when a slot freed (a step's end) if none was free then; it reaches
                # the engine while a step runs and waits for the next, as in vLLM's engine core
                at = max(due(i), free.popleft())
                sent = self._send(reqs[i % len(reqs)], i, at, at - due(i), chat, model, stream)
                if isinstance(sent, Result):  # refused at once: the answer takes the client a round trip
                    done.append(sent)
                    self.t = max(self.t, at + REFUSED_S)
                    free.append(self.t)
                else:
                    flight[sent.live.req.req_id] = sent
                i += 1
            if self.dead and flight:
                done += self._fail_all(flight)
                free.extend([self.t] * len(flight))
                flight = {}
            if not flight:
                if not more():
                    break
                self.t = max(self.t, due(i))
                continue
            res = eng.step(self.t)
            if self.oom is not None and len(res.scheduled) > 1:
                self.crash(self.oom, exc="torch.OutOfMemoryError")
                continue
            if not res.scheduled:  # what waits can never be scheduled (a prompt larger than the KV cache)
                done += self._stalled(flight)
                free.extend([self.t] * len(flight))
                flight = {}
                continue
            for r in res.new_scheduled:
                r.user.live.t_sched = self.t
            self.t += res.duration
            self._bookkeep(res)
            for r in res.token_reqs:
                s = r.user
                s.tokens.append(self.t)
                if r.status == FINISHED:
                    done.append(self._finish(s, r.finish_reason, r.num_output))
                    flight.pop(r.req_id, None)
                    free.append(self.t)
        return done, t0

    def _send(self, req: BenchRequest, idx: int, at: float, lag: float, chat: bool, model: str,
              stream: bool) -> _Sent | Result:
        r = Result(index=idx, start=at)
        r.dispatch_lag = lag  # type: ignore[attr-defined]
        r.request = req  # type: ignore[attr-defined]
        try:
            p = self.parse(json.dumps(request_body(req, model, chat, stream)).encode(), chat)
            self._admit(p.stream)
        except BadRequest as e:
            r.status = e.code
            r.error = f"HTTP {e.code}: {e.body['error']['message']}" if isinstance(e.body, dict) else str(e)
            return r
        live = Live(None, at, p.max_tokens_param)  # type: ignore[arg-type]
        sent = _Sent(r, live)
        rid = self.next_rid(chat)
        r.rid, r.status = rid, 200
        live.req = self.engine_request(p, rid, at, sent)
        self.engine.add_request(live.req)
        return sent

    def _bookkeep(self, res: Any) -> None:
        """/metrics as the live server keeps it: step counters, TTFT and ITL histograms, peaks."""
        m = self.metrics
        m.on_step(res.prompt_tokens, res.generation_tokens, res.num_preempted,
                  len(res.new_scheduled) if res.prefix_queries else 0, res.prefix_queries, res.prefix_hits)
        for r in res.token_reqs:
            live = r.user.live
            if live.t_first is None:
                live.t_first = self.t
                m.h_ttft.observe(self.t - live.t_arrival)
            else:
                m.h_itl.observe(self.t - live.t_last)
            live.t_last = self.t
        e = self.engine
        for k, v in (("running", e.num_running()), ("waiting", e.num_waiting()), ("kv_cache_usage", e.kv_usage())):
            self.peaks[k] = max(self.peaks.get(k, v), v)

    def _finish(self, s: _Sent, reason: str, n_out: int) -> Result:
        r, live = s.result, s.live
        live.done = True
        self._record_finish(live, reason, self.t)
        tok = s.tokens
        r.ttft = tok[0] - r.start
        r.latency = r.done = tok[-1] - r.start
        r.itl = [b - a for a, b in zip(tok, tok[1:], strict=False)]
        r.event_times = [x - r.start for x in tok]
        r.events = len(tok)
        r.prompt_tokens, r.completion_tokens = live.req.prompt_len, n_out
        r.finish_reason, r.ok = reason, True
        return r

    def _fail_all(self, flight: dict[str, _Sent]) -> list[Result]:
        """The engine died: what was in flight gets vLLM's engine-dead error."""
        return self._end(flight, f"error event: {ENGINE_DEAD_MSG}")

    def _stalled(self, flight: dict[str, _Sent]) -> list[Result]:
        """Requests the engine cannot schedule (a prompt larger than the KV cache): the client's
        stall timeout ends them."""
        self.t += STALL_S
        return self._end(flight, f"no event for {STALL_S:g} s (stalled stream)")

    def _end(self, flight: dict[str, _Sent], error: str) -> list[Result]:
        for s in flight.values():
            self.engine.abort(s.live.req)
            s.result.error = error
        return [s.result for s in flight.values()]

    def scrape(self):
        return parse(self.render_metrics())


def _one_token(req: BenchRequest) -> BenchRequest:
    """bench_stream's preflight: the first request's shape, other token ids, one token."""
    return replace(preflight_request(req), output_len=1)


class VirtualServer:
    """A simulated deployment in virtual time: start a configuration, measure workloads on it, stop.

    ``opts`` and ``settings`` are the deployment's (model, accelerator, the simulator's noise and
    faults: what ``sim_server``'s flags make of them); ``start(config)`` overrides vllm serve's
    flags (``ServeOptions`` field names: ``max_num_seqs``, ``max_num_batched_tokens`` ...)."""

    def __init__(self, opts: ServeOptions, settings: SimSettings, run_gap_s: float = 1.0):
        self.opts, self.settings = opts, settings
        self.run_gap_s = run_gap_s
        self.tally = Tally()
        self.app: VirtualApp | None = None
        self.config: dict | None = None
        self.clock = 0.0

    def start(self, config: dict) -> Start:
        """Stop what runs and start ``config`` (vllm serve flags over the deployment's own): a new
        engine, or vLLM's refusal (``ok`` False)."""
        unknown = sorted(set(config) - CONFIG_KEYS)
        if unknown:
            raise UsageError(f"not a vllm serve option the simulator knows: {', '.join(unknown)}")
        return self.start_options(replace(self.opts, **config), self.settings, config)

    def start_options(self, opts: ServeOptions, settings: SimSettings, config: dict) -> Start:
        """Stop what runs and start an engine for ``opts`` and ``settings`` as given (what a whole
        sim_server command line says), recorded as ``config``; its start number is this server's next."""
        self.stop()
        index = self.next_start
        s = replace(settings, start_index=index)
        try:
            resolved = resolve(opts)
            if s.fail_at_start:
                raise fail_at_start(opts)
        except SimStartupError as e:
            self._spend(0.7 * s.startup_s)
            self.tally.failed_starts += 1
            return Start(False, dict(config), f"{e.exc_type}: {e.message}", index)
        self._spend(s.startup_s)
        self.tally.starts += 1
        self.app = VirtualApp(opts, resolved, s, self.clock, self.clock)
        self.config = dict(config)
        return Start(True, dict(config), None, index)

    @property
    def next_start(self) -> int:
        """The start number the next start gets (the between-restart draw is keyed on it)."""
        return self.settings.start_index + self.tally.starts + self.tally.failed_starts

    def healthy(self) -> bool:
        return self.app is not None and not self.app.dead

    def running(self) -> dict | None:
        """The configuration that runs now (None: none, or its engine died)."""
        return dict(self.config) if self.healthy() and self.config is not None else None

    def stop(self) -> None:
        self.app, self.config = None, None

    def _spend(self, seconds: float) -> None:
        self.clock += seconds
        self.tally.simulated_s += seconds

    def bench(self, cfg: BenchConfig, records: str | None, output: str | None) -> dict:
        """One run as bench_stream makes it: its records and summary written to their files, the summary
        returned (``vkit.tune.capacity.live_measure``'s ``bench``)."""
        summary, recs = self.measure(cfg)
        save(summary, recs, records, output, cfg.meta.get("label"))
        return summary

    def measure(self, cfg: BenchConfig) -> tuple[dict, list[dict]]:
        """One bench_stream run on the running engine: its summary and records, in virtual time."""
        app = self.app
        if app is None or app.dead:
            raise Unavailable("the virtual server is not running" + (f" (its engine died: {app.death})" if app else ""))
        if not cfg.requests:
            raise UsageError("no requests to send (--num-prompts 0?)")
        if cfg.duration_s is not None and cfg.max_concurrency is None and cfg.arrivals is None:
            raise UsageError("--duration with --request-rate inf needs --max-concurrency")
        self._spend(self.run_gap_s)
        app.t = self.clock
        model = cfg.model or app.model_name
        workers = cfg.max_concurrency or len(cfg.requests)
        results, warm, t0, t_end, pre, before = app.run(cfg, model, workers)
        after = app.scrape()
        server_delta = delta(before, after)
        self._spend(app.t - self.clock)
        self.tally.runs += 1
        self.tally.requests += len(results)
        summary, records = summarize(cfg, model, results, warm, t0, t_end, False, server_delta, extra={
            "server": {"url": cfg.url, "version": SIM_VERSION,
                       "version_info": {**app.version_info(), "virtual": True,
                                        "time": "simulated seconds of the simulated accelerator"},
                       "model": model, "max_model_len": app.cfg.max_model_len, "cache_config": cache_config(after),
                       "metrics_available": True, "families": families(after),
                       "peaks": {"scrapes": 0, **{f"{k}_max": v for k, v in app.peaks.items()}},
                       "delta": server_delta},
            "client": {"name": "vkit virtual", "transport": "virtual", "threads": 1, "max_streams": workers,
                       "cpu_s": 0.0, "wall_s": t_end - t0, "cpu_frac_of_one_core": 0.0, "sched_lag": None,
                       "t0_monotonic_s": t0, "cpu_s_per_1k_output_tokens": 0.0},
            "preflight": {"ok": pre.ok, "ttft_ms": None if pre.ttft is None else pre.ttft * 1000},
            "fingerprint": fingerprint(model, cfg.launch_argv, server_version=SIM_VERSION),
            "virtual": {"start_index": app.s.start_index, "clock_s": app.t, "engine_died": app.death,
                        "time": "simulated seconds of the simulated accelerator, not measured"},
        })
        summary["vkit"]["accelerator"] = {"available": False, "why": "a simulated accelerator",
                                          "power": app.power(summary["duration"])}
        add_energy(summary, summary["vkit"]["accelerator"]["power"], app.engine.meter.idle_w)
        return summary, records


__all__ = ["CONFIG_KEYS", "Start", "Tally", "VirtualApp", "VirtualServer"]
