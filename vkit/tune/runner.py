"""The per-trial state machine of sweep and tune, composed from the functions vkit's tools call.

APPLY (restart_with_rollback) → VERIFY (post_start_verify inside it, then the repeats)
→ VALIDATE (check_invariants on every run) → GATE (gate against the kept baseline)
→ KEEP or REVERT. Each phase calls the library function its tool calls (``lifecycle.run_held``,
``gauge.measure``, ``invariants.check_file``, ``gate.decide``), with the same outcomes and
exit codes as ``bin/``, never re-implemented here.

Everything is recorded in the state file as it happens (``baseline``, ``trials``,
``confirmations``), so a run killed at any point continues where it stopped: a finished
trial is never repeated or lost, an unfinished one resumes from its last recorded phase.

Measurement design:
- BASELINE: the kept configuration measured N times over S server starts (``start_sizes``:
  σ_baseline within a process and between restarts, this machine, now).
- Screening: each candidate gets the runs the σ components pay for (``screen_size``: on one
  process, more runs shrink only the within part, so no more than within²/between², at most
  ``screen_repeats``); one clearly worse after its first run is eliminated early (a
  Hyperband-like budget: no full repeats for hopeless ones).
- Repeat k of every configuration uses dataset seed ``seed + k``: the same request sets on
  both sides, and no repeat finds its prompts in the prefix cache from the repeat before.
- Confirmation: the winner of a step is re-measured on *fresh, interleaved* runs (B A A B
  blocks: it cancels linear drift) and gated with ``--fresh --selected-from K`` (the winner's
  curse), with σ pooled from the baseline; only an accept is kept. Its blocks come from the
  sequential rule's own power analysis at the measured σ components (``confirm_plan``: a step's
  winner at its screened effect less the winner's curse, ``vkit.tune.power``), capped by
  ``confirm_blocks``; a confirmation that cannot reach a verdict within that budget says so
  before any run, and spends nothing (``--yes`` grants the larger budget instead).
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

from vkit import environment
from vkit.apply.backend import PROCESS, Backend
from vkit.apply.lifecycle import Held, Lifecycle, Outcome, run_held
from vkit.apply.policy import Policy, to_serve_flags
from vkit.decide import gate as _gate
from vkit.errors import Abnormal, ExitCode, Rejected, VkitError
from vkit.interrupts import Interrupts
from vkit.jsonio import read_json_file
from vkit.measure.gauge import BenchOptions, build_config
from vkit.state import StateFile, atomic_write_text, default_owner, launch_argv, now_iso
from vkit.tune import capacity as _cap
from vkit.tune.power import Effect, budget_plan
from vkit.validate import invariants

SENTINEL_CHECKS = 4  # sentinel checks a tune makes (after steps 2, 3, 4 and 5): the level check's Bonferroni count
KEY_METRICS = ("output_throughput", "request_throughput", "request_goodput", "p95_ttft_ms", "p99_ttft_ms", "mean_ttft_ms",
               "mean_tpot_ms", "p95_tpot_ms", "mean_e2el_ms", "p95_e2el_ms",
               # the capacity objective's measurement (vkit.tune.capacity.capacity_document)
               "slo_capacity", "capacity_output_tok_s", "ref_mean_tpot_ms", "ref_per_user_output_tok_s")


SIGMA_RESOLUTION = 1e-5  # the confirmation plan's rows carry σ to 5 decimals: the least σ it plans with


def plain(obj: Any) -> Any:
    """``obj`` as the JSON a tool writes and a state file holds (tuples as lists, numbers as
    JSON numbers, anything else as its string)."""
    return json.loads(json.dumps(obj, default=str))


@dataclass
class Workload:
    """How every configuration is measured (the gauge: identical for all trials)."""

    options: BenchOptions  # bench_stream's options; repeat k of a configuration uses seed + k
    seed: int = 1
    name: str = "main"

    def describe(self) -> dict:
        """The workload as the state file records it (bench_stream's flags, the seed apart)."""
        return {"name": self.name, "bench_args": self.options.flags(), "seed": self.seed}


@dataclass
class CapacityObjective:
    """Tune's capacity objective: every measurement of the main workload is one SLO-capacity search
    (``vkit.tune.capacity``), bracketed from the reference load (the first baseline search's
    capacity); the gate compares ``slo_capacity``."""

    slo: _cap.Slo
    plan: _cap.Plan
    accelerators: int | None = None
    verify_seconds: float = 60.0  # the promise verified by one run this long at the promised load (0: not verified)

    def describe(self) -> dict:
        p = self.plan
        return {"slo": dict(self.slo.limits), "goodput_fraction": self.slo.goodput, "mode": p.mode, "start": p.start,
                "verify_seconds": self.verify_seconds,
                "tolerance": p.tolerance, "max_points": p.max_points, "repeats": p.repeats, "noise": p.noise,
                "point_seconds": p.point_seconds, "max_send_lag_ms": p.max_send_lag_ms, "keep_up": p.keep_up}


@dataclass
class Settings:
    workload: Workload
    baseline_repeats: int = 4
    screen_repeats: int = 2
    confirm_blocks: int = 6  # B A A B blocks at most (the budget; the power analysis plans fewer when σ allows)
    primary: str = "output_throughput:+"
    guards: list[str] = field(default_factory=lambda: ["p95_ttft_ms:-:15%"])
    slo: dict = field(default_factory=dict)  # e.g. {"p95_ttft_ms": 2000}
    eliminate_below: float = 0.10  # first screening run more than this (or 4σ) below the baseline: eliminated
    ready_timeout_s: float = 600.0
    sandbox: bool = True
    capacity: CapacityObjective | None = None  # None: the throughput objective (one load, the primary metric)
    time_budget_s: float | None = None  # --time-budget: no trial is started that cannot finish (with its confirmation) within it
    grant_budget: bool = False  # --yes: a confirmation whose power analysis needs more blocks than confirm_blocks gets them
    baseline_starts: int | None = None  # server starts the baseline's repeats are spread over (None: default_starts)

    @property
    def objective(self) -> str:
        return "throughput" if self.capacity is None else "capacity"

    def starts(self) -> int:
        return self.baseline_starts if self.baseline_starts is not None else default_starts(self.baseline_repeats)


def default_starts(repeats: int) -> int:
    """Server starts for ``repeats`` baseline runs by default: three when one of them can still
    measure two runs (σ within a process needs a start with two), else as many as allow that.
    Two starts give the between-restart part one degree of freedom, three give two: its 90 %
    interval's upper end falls from 16x to 4.4x the estimate."""
    return max(1, min(3, repeats - 1))


def start_sizes(repeats: int, starts: int) -> list[int]:
    """Runs per server start, as even as possible, the larger first: 4 over 3 is [2, 1, 1]."""
    s = max(1, min(starts, repeats))
    q, r = divmod(repeats, s)
    return [q + 1] * r + [q] * (s - r)


def _rel(p: str, base: str) -> str:
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
    """A measurement's error as the runner reports it: bench_stream's exit code, unreachable as 4."""
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


class Runner:
    fleet = None  # vkit.tune.fleet.Fleet under --ray; set per instance
    backend: Backend = PROCESS  # where servers run and are measured; set per instance (--virtual: the simulator)

    def __init__(self, sf: StateFile, settings: Settings, progress: Callable[[str], None], tool_name: str = "sweep",
                 owner: str | None = None, policy: Policy | None = None, interrupts: Interrupts | None = None,
                 warn: Callable[[str], None] | None = None, backend: Backend | None = None):
        """``owner`` holds the lease the run's restarts work under; ``policy`` the parameter policy
        (default the packaged one); ``interrupts`` come from the tool's signal handler; ``warn``
        says what must be seen even when progress is quiet (default: progress)."""
        self.sf = sf
        self.s = settings
        self.progress = progress
        self.warn = warn or progress
        self.tool_name = tool_name
        self.runs_dir = os.path.join(sf.dir, "runs")
        os.makedirs(self.runs_dir, exist_ok=True)
        self.owner = owner or default_owner(tool_name)
        self.policy = policy or Policy.load()
        self.interrupts = interrupts or Interrupts()
        # where the servers run and are measured: processes (the default), or the simulator in virtual time
        self.backend = backend or PROCESS
        # the server this runner restarts and measures: the service's own state file, or a slot's
        # (``for_slot``); trials, baselines and decisions always go to ``sf``
        self.svc = sf
        self.slot: str | None = None

    # -- slots (vkit.apply.slots) ---------------------------------------------
    def slots(self, live: bool = True) -> list[dict]:
        """The state's slots in order (``live``: those not taken out); [] for a state without slots."""
        return [s for s in self.sf.read().get("slots") or [] if not (live and s.get("out"))]

    def for_slot(self, slot: dict) -> Runner:
        """A runner of the same run whose restarts and measurements go to ``slot``'s server (its own
        state file: lifecycle, rollback, ABNORMAL and lease per slot)."""
        r = copy.copy(self)
        r.svc = StateFile(os.path.join(self.sf.dir, slot["state"]))
        r.slot = slot["name"]
        base = os.path.dirname(self.runs_dir) if self.slot else self.runs_dir
        r.runs_dir = os.path.join(base, slot["name"])  # each slot's runs apart: a trial retried elsewhere keeps its evidence
        os.makedirs(r.runs_dir, exist_ok=True)
        return r

    def slots_of(self, runs: list[str]) -> set[str]:
        """The slots whose servers measured ``runs`` (their folder under runs/), empty without slots."""
        names = {s["name"] for s in self.slots(live=False)}
        return {part for p in runs for part in p.replace(os.sep, "/").split("/") if part in names}

    def slot_sigma(self, baseline: list[str], candidate: list[str]) -> dict:
        """σ_device per metric from the slots' A/A pass when the two sides were not measured on the same
        slot(s), else {}: a comparison across devices carries their spread, one within a slot does not."""
        a, b = self.slots_of(baseline), self.slots_of(candidate)
        if not a or not b or a == b:
            return {}
        eff = (self.sf.read().get("slot_effects") or {}).get("metrics") or {}
        return {m: e["sigma_device"] for m, e in eff.items() if e.get("sigma_device")}

    def use_first_slot(self) -> bool:
        """Bind this runner (the serial phases': baseline, confirmations, steps 1, 4m, 5, delivery) to the
        first slot in service; False when the state has slots and every one was taken out."""
        live = self.slots()
        if not self.slots(live=False) or (live and live[0]["name"] == self.slot):
            return True
        if not live:
            return False
        r = self.for_slot(live[0])
        self.svc, self.slot, self.runs_dir = r.svc, r.slot, r.runs_dir
        return True

    def service_logs(self) -> list:
        """The decision logs that hold restarts: the service's, and each slot's."""
        return [self.sf.log] + [StateFile(os.path.join(self.sf.dir, s["state"])).log for s in self.slots(live=False)]

    def _mirror_kept(self) -> None:
        """A slot's rollback target and frozen parameters are the tune's: copied before each restart."""
        if self.svc is not self.sf:
            st = self.sf.read()
            k = st["kept"]
            self.svc.mirror_kept(k["config"], k.get("decision_id"), k.get("decision"), frozen=st.get("frozen") or {})

    # -- state helpers ----------------------------------------------------
    def _abs(self, rel: str) -> str:
        return rel if os.path.isabs(rel) else os.path.join(self.sf.dir, rel)

    def load(self, rel: str) -> dict:
        """A run's summary (``OSError``, ``ValueError`` propagate: a caller may skip a damaged run)."""
        return read_json_file(self._abs(rel))[0]

    def trial(self, tid: str) -> dict:
        for t in self.sf.read()["trials"]:
            if t["id"] == tid:
                return t
        raise KeyError(tid)

    def update_trial(self, tid: str, **fields: Any) -> dict:
        return self.sf.update_trial(tid, **fields)

    def log(self, event: str, **kw: Any) -> str:
        return self.sf.log.append(self.tool_name, event, **kw)

    # -- the tools ----------------------------------------------------------
    def running_config(self) -> dict | None:
        run = self.svc.read()["service"].get("running") or {}
        return run.get("config") if run.get("pid") else None

    def remote(self) -> bool:
        """This runner's slot is served on a Ray node (``vkit.tune.fleet``)."""
        return self.fleet is not None and self.slot is not None

    def apply(self, config: dict, fresh: bool = False) -> tuple[bool, dict]:
        """restart_with_rollback to ``config`` (a full configuration); no-op if it already runs,
        unless ``fresh``: a new measurement series starts on a freshly started server, so that no
        request set finds its prompts in the prefix cache from an earlier series on the same process."""
        self._mirror_kept()
        if self.remote():
            ok, res = self.fleet.call(self, "apply", dict(config), fresh)
            return bool(ok), res
        st = self.svc.read()
        run = st["service"].get("running") or {}
        cand = st.get("candidate") or {}
        if (not fresh and run.get("config") == config and self.backend.alive(run.get("pid"), run.get("ticks"))
                and cand.get("status") != "applying" and self._healthy(st["service"]["url"])):
            return True, {"action": "already running"}
        kept = st["kept"]["config"]
        changes = {k: v for k, v in config.items() if kept.get(k) != v}
        removed = [k for k in kept if k not in config]
        if removed:
            raise VkitError(f"a candidate cannot drop kept parameters ({', '.join(removed)})", ExitCode.INTERNAL)
        if not changes:
            code, res, err = self._held("rollback", lambda lc: lc.rollback(reason="measure the kept configuration"))
        else:
            typed = {k: self.policy.coerce(k, v) for k, v in sorted(changes.items())}
            code, res, err = self._held("restart_with_rollback", lambda lc: lc.restart(typed))
        if code == ExitCode.UNAVAILABLE:
            raise VkitError(f"the environment is unavailable or ABNORMAL: {(res.get('message') or err.strip())}", ExitCode.UNAVAILABLE)
        if code == ExitCode.INTERRUPTED:
            raise KeyboardInterrupt
        if code not in (0, 1):
            raise VkitError(f"restart_with_rollback failed (exit {code}): {err.strip()[-300:]}", code)
        return code == 0, res

    def _held(self, tool: str, body: Callable[[Lifecycle], Outcome]) -> tuple[int, dict, str]:
        """A restart or rollback as ``tool`` makes it: (exit code, outcome, error message)."""
        how = Held(owner=self.owner, ready_timeout_s=self.s.ready_timeout_s, interrupts=self.interrupts, policy=self.policy,
                   backend=self.backend)
        t0 = self.backend.now()
        try:
            code, out = run_held(self.svc, tool, how, body)
        except VkitError as e:
            return int(e.code), {}, f"{tool}: error: {' '.join(str(e).split())}"
        finally:
            self.sf.add_time("restart", self.backend.now() - t0)
        return int(code), plain(out.as_dict()) if out is not None else {}, ""

    def _healthy(self, url: str) -> bool:
        if self.remote():
            return bool(self.fleet.call(self, "healthy", url))
        return self.backend.healthy(url)

    def costs(self) -> tuple[float, float] | None:
        """Mean seconds of one restart and of one measurement so far (None before both were timed)."""
        t = self.sf.read().get("timing") or {}
        r, m = t.get("restart") or {}, t.get("run") or {}
        if not r.get("n") or not m.get("n"):
            return None
        return r["s"] / r["n"], m["s"] / m["n"]

    def trial_cost(self) -> float | None:
        """Seconds one screened candidate takes: a restart and its screening runs."""
        c = self.costs()
        return None if c is None else c[0] + self.screen_size()[0] * c[1]

    def confirm_cost(self) -> float | None:
        """Seconds the step's confirmation takes: its planned B A A B blocks (at the threshold; the whole
        budget where that plan does not fit: a winner far above the threshold is still confirmed), each two
        restarts and four runs, and one restart into the first."""
        c = self.costs()
        if c is None:
            return None
        plan = self.confirm_plan()
        blocks = plan["blocks"] if plan["fits"] else plan["cap"]
        return (c[0] + blocks * (2 * c[0] + 4 * c[1])) if blocks else 0.0

    # -- how many runs: the power analysis at the measured σ components ---------------
    def components(self, key: str = "baseline") -> dict:
        """σ components per metric of baseline ``key`` (the main one's are also the run's)."""
        st = self.sf.read()
        comps = (st.get(key) or {}).get("components")
        if comps is None and key == "baseline":
            comps = st.get("sigma_components")
        return comps or {}

    def screen_size(self, key: str = "baseline") -> tuple[int, str]:
        """Screening runs per candidate, and why. They share one server process, so a mean over n of
        them has variance within²/n + between²: past n = within²/between² another run buys less than
        the restart-to-restart part it cannot touch. At most ``screen_repeats`` (the budget), at least 1."""
        cap = max(1, self.s.screen_repeats)
        comp = self.components(key).get(self.s.primary.split(":")[0]) or {}
        w, b = comp.get("within"), comp.get("between")
        if not isinstance(w, (int, float)) or not isinstance(b, (int, float)):
            return cap, f"σ not split into within and between restarts: {cap} (the budget)"
        if b <= 0:
            return cap, f"no between-restart part measured: {cap} (the budget)"
        n = max(1, min(cap, math.ceil((w / b) ** 2 - 1e-9)))
        return n, (f"σ within {w:.1%}, between restarts {b:.1%}: {n} run(s) on one process "
                   f"(within²/between² = {(w / b) ** 2:.2f}; budget {cap})")

    def confirm_plan(self, primary: str | None = None, guards: list[str] | None = None, key: str = "baseline",
                     effect: Effect | None = None) -> dict:
        """B A A B blocks for a confirmation, from the gate's own sequential power analysis
        (``rule.pairs_to_decide``) at the σ a confirmation's runs carry (two runs to a process:
        ``comparison_sigma(…, 2)``), for the primary at its threshold max(2σ, floor) (σ of one run on a
        fresh start, ``comparison_sigma(…, 1)``), or at ``effect`` (a step's winner: its screened effect
        corrected for the winner's curse), and each guard at its tolerance; blocks against the budget by
        ``power.budget_plan``. ``fits``: within ``confirm_blocks``, or granted (``--yes``); otherwise
        ``why`` says what it would take, and nothing is measured."""
        from vkit.decide.analysis import threshold_of
        from vkit.decide.rule import Boundaries, pairs_to_decide
        from vkit.decide.specs import Settings as GateSettings

        gs = GateSettings()
        bnd = Boundaries.build(gs)
        comps = self.components(key)
        sig0 = ((self.sf.read().get(key) or {}).get("sigma") or {})
        rows = []
        specs = [_gate.parse_metric(primary or self.s.primary, "primary"),
                 *_gate.parse_guards(self.s.guards if guards is None else guards)]
        for sp in specs:
            comp = comps.get(sp.name)
            sigma = comparison_sigma(comp, 2) if comp else sig0.get(sp.name)
            if not isinstance(sigma, (int, float)) or not sigma >= 0:
                continue
            # a server that measures the same every time (the simulator with its noise off) has σ 0: planned at
            # the rows' resolution, never at 0 (no power analysis divides by it, nor reads a row rounded to it)
            sigma = min(max(float(sigma), SIGMA_RESOLUTION), 0.99)
            low = max(min(sigma, comparison_sigma_low(comp, 2) or sigma), SIGMA_RESOLUTION) if comp else sigma
            # the gate's own threshold (or tolerance) from the σ of one run on a fresh start, as the
            # log-scale gap the pairs (at the clustered σ) must resolve
            one = max(min(sigma, comparison_sigma(comp, 1) or sigma), SIGMA_RESOLUTION) if comp else sigma
            one_low = max(min(low, comparison_sigma_low(comp, 1) or low), SIGMA_RESOLUTION) if comp else low
            t, gap = threshold_of(sp, one, gs)
            n = pairs_to_decide(sigma, abs(gap), gs, futility=sp.role == "primary", bnd=bnd)
            # the σ of a few runs is itself uncertain: at its favourable end, with the threshold it would then have
            t_low, gap_low = threshold_of(sp, one_low, gs)
            n_low = pairs_to_decide(low, abs(gap_low), gs, futility=sp.role == "primary", bnd=bnd)
            rows.append({"metric": sp.name, "role": sp.role, "sigma": round(sigma, 5), "sigma_low": round(low, 5),
                         "threshold": round(t, 4), "threshold_low": round(t_low, 4), "gap": round(abs(gap), 5),
                         "gap_low": round(abs(gap_low), 5), "pairs": n, "pairs_low": n_low})
        return budget_plan(rows, self.s.confirm_blocks, self.s.grant_budget, effect, gs, bnd)

    def elapsed_s(self) -> float | None:
        """Seconds since the tuning run under way started (None outside a tune)."""
        import datetime as _dt

        started = _gate.parse_date((self.sf.read().get("tune") or {}).get("started"))  # naive UTC
        if started is None:
            return None
        return max(0.0, time.time() - started.replace(tzinfo=_dt.timezone.utc).timestamp())

    def settle(self) -> None:
        """Between two trials or steps. In production (``--yes``) the service goes back to the kept
        configuration at once, so that it serves traffic on it between trials. In a sandbox it stays
        on whatever runs: the next trial restarts the server anyway, and the kept configuration is
        started when it must be measured or the tune ends (each rollback skipped is a restart saved)."""
        if not self.s.sandbox:
            self.restore_kept()

    def restore_kept(self, fresh: bool = False) -> None:
        kept = self.sf.read()["kept"]["config"]
        ok, res = self.apply(dict(kept), fresh=fresh)
        if not ok:
            raise VkitError(f"the kept configuration does not start: {res.get('message')}", ExitCode.UNAVAILABLE)

    # Anomalies that say the *client or machine* was busy, not that the server misbehaved: worth one re-measure.
    TRANSIENT = {"client_saturation", "warmup_outliers", "client_server_ttft_gap"}
    # With a saturated client these follow from it (latencies inflated, the loop not kept full), so
    # they do not stop the re-measure either; without client_saturation they are the server's.
    SATURATION_EFFECTS = {"littles_law", "phase_order"}

    @classmethod
    def transient(cls, findings: set) -> bool:
        """True when a run's findings are all explained by a busy client or machine."""
        if not findings:
            return False
        allowed = cls.TRANSIENT | (cls.SATURATION_EFFECTS if "client_saturation" in findings else set())
        return findings <= allowed

    def start_key(self) -> str | None:
        """The server process running now, as ``pid:ticks`` (None when none is recorded)."""
        run = self.svc.read()["service"].get("running") or {}
        return f"{run['pid']}:{run.get('ticks')}" if run.get("pid") else None

    def measure(self, label: str, k: int, workload: Workload | None = None) -> tuple[str, dict, dict]:
        """One bench_stream run (seed + k), validated, its server process recorded (``run_starts``).
        A run whose only findings say the load generator was saturated is measured once more
        (logged). Returns (relative path, summary, check)."""
        t0 = self.backend.now()
        path, doc, check = self._measure_checked(label, k, workload)
        self.sf.record_run_start(path, self.start_key(), seconds=self.backend.now() - t0)
        self.note_environment(path, doc)
        return path, doc, check

    def note_environment(self, path: str, doc: dict) -> None:
        """The run's environment fingerprint becomes the state's last seen one; a change is said
        (and logged by the state): gate refuses to compare runs across it."""
        fp = (doc.get("vkit") or {}).get("fingerprint")
        if isinstance(fp, dict):
            found = self.sf.note_fingerprint(self.tool_name, fp, run=path)
            if found:
                self.warn(environment.warning(found, path))

    # Pauses before measuring again a run the client fell behind on: a machine busy for a moment
    # (another process, a burst of I/O) is usually quiet again a few seconds later.
    BUSY_WAITS_S = (2.0, 6.0)

    def _measure_checked(self, label: str, k: int, workload: Workload | None = None) -> tuple[str, dict, dict]:
        last = 1 + len(self.BUSY_WAITS_S)
        for attempt in range(1, last + 1):
            try:
                path, doc, check = self._measure_once(label, k, workload)
                died = bool(doc.get("failed")) and not self._healthy(self.svc.read()["service"]["url"])
            except VkitError as e:
                if e.code != ExitCode.UNAVAILABLE or self._healthy(self.svc.read()["service"]["url"]):
                    raise
                # the server was gone before the run began (killed between two runs): the same path as a death mid-run
                doc, died = {"failed": 1, "vkit": {"errors": {" ".join(str(e).split())[:200]: 1}}}, True
            if died:
                path, doc, check = self._server_died(label, k, workload, doc)
            if doc.get("failed") and check["code"] != ExitCode.INVALID:
                # requests failed on a server that stayed up (a burst of 5xx, a malformed event): the run is not a
                # measurement of the configuration, and no verdict may rest on it; measured once more, else invalid
                check = dict(check, code=int(ExitCode.INVALID), verdict="invalid",
                             findings=sorted({*(check.get("findings") or []), "failed_requests"}))
                if attempt == 1:
                    self.progress(f"{label} run {k}: {doc['failed']} request(s) failed on a healthy server; measuring again")
                    self.log("remeasure", run=path, findings=check["findings"], failed=doc["failed"])
                    continue
            findings = set(check.get("findings") or [])
            if check["code"] != ExitCode.REJECTED or not self.transient(findings) or attempt == last:
                return path, doc, check
            wait = self.BUSY_WAITS_S[attempt - 1]
            self.progress(f"{label} run {k}: {', '.join(sorted(findings))} (the client or the machine was busy); "
                          f"measuring again in {wait:g} s")
            self.log("remeasure", run=path, findings=sorted(findings), wait_s=wait)
            time.sleep(wait)
        return path, doc, check

    def _server_died(self, label: str, k: int, workload: Workload | None, doc: dict) -> tuple[str, dict, dict]:
        """The server died during a measurement: that run is not a measurement of the configuration.
        Restart the same configuration and measure again; if it dies again, a candidate's trial is
        invalid, and the kept configuration's death marks the environment ABNORMAL."""
        st = self.svc.read()
        cfg = dict((st["service"].get("running") or {}).get("config") or st["kept"]["config"])
        errs = "; ".join(f"{n}x {m}" for m, n in sorted((doc.get("vkit") or {}).get("errors", {}).items(), key=lambda kv: -kv[1])[:2])
        self.progress(f"{label} run {k}: the server died during the measurement ({errs}); restarting it and measuring again")
        self.log("server_died", label=label, run=k, config=cfg, errors=(doc.get("vkit") or {}).get("errors"))
        ok, res = self.apply(cfg, fresh=True)
        if ok:
            path, doc2, check = self._measure_once(label, k, workload)
            if not (doc2.get("failed") and not self._healthy(st["service"]["url"])):
                return path, doc2, check
        if cfg == st["kept"]["config"]:
            reason = (f"the server of the kept configuration died during measurements twice ({errs}); "
                      "read the server log in the logs/ folder beside the state file")
            Lifecycle(self.svc, self.tool_name, self.owner, progress=self.progress, policy=self.policy,
                      backend=self.backend).mark_abnormal(reason)
            raise Abnormal(reason)
        path = _rel(os.path.join(self.runs_dir, label, f"rep{k}.json"), self.sf.dir)
        return path, doc, {"code": ExitCode.INVALID, "verdict": "invalid", "findings": ["server_died"]}

    def _measure_once(self, label: str, k: int, workload: Workload | None = None) -> tuple[str, dict, dict]:
        if self.remote():
            path, doc, check = self.fleet.call(self, "measure", label, k, workload)
            return path, doc, check
        w = workload or self.s.workload
        if self.s.capacity is not None and w.name == self.s.workload.name:
            return self._measure_capacity(label, k, w)
        d = os.path.join(self.runs_dir, label)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"rep{k}.json")
        rec = os.path.join(d, f"rep{k}.jsonl")
        seed = w.seed + k
        # the command that makes the same measurement by hand, recorded in the summary
        command = ["--state", self.sf.path, *w.options.flags(), "--seed", str(seed), "-q", "--records", rec, "-o", path]
        try:
            st = self.sf.read()
            cfg = build_config(replace(w.options, seed=seed), self.svc.read()["service"]["url"], command)
            cfg.launch_argv = launch_argv(st)
            summary = self.bench(cfg, rec, path)
        except VkitError as e:
            raise bench_failed(e) from None
        if summary["vkit"].get("partial"):
            raise KeyboardInterrupt
        doc = plain(summary)
        try:
            c = invariants.check_file(path, records=rec)
            check_brief = {"code": int(c.code), "verdict": c.verdict, "findings": c.findings}
        except VkitError as e:
            check_brief = {"code": int(e.code), "verdict": None, "findings": None}
        return _rel(path, self.sf.dir), doc, check_brief

    def bench(self, cfg, records: str, output: str) -> dict:
        """One bench_stream run on this runner's backend (its files written, its summary returned)."""
        return self.backend.bench(cfg, records, output, self.interrupts)

    def _measure_capacity(self, label: str, k: int, w: Workload) -> tuple[str, dict, dict]:
        """One capacity search of the running configuration (measurement ``k``): its load points
        under runs/<label>/rep<k>-points/, the capacity document at runs/<label>/rep<k>.json."""
        c = self.s.capacity
        assert c is not None
        d = os.path.join(self.runs_dir, label)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"rep{k}.json")
        st = self.sf.read()
        reference = (st.get("capacity_reference") or {}).get("load")
        # where the answer probably is: the kept configuration's capacity, once its baseline is final
        b = st.get("baseline") or {}
        hint = (b.get("metrics") or {}).get("slo_capacity") if b.get("config") == st["kept"]["config"] else None
        # every point's run its own prompts: measurement k starts 1000 seeds above measurement k - 1
        opts = replace(w.options, seed=w.seed + 1000 * k)
        command = ["--state", self.sf.path]
        try:
            doc = _cap.measure_configuration(opts, self.svc.read()["service"]["url"], os.path.join(d, f"rep{k}-points"), c.slo, c.plan,
                                             reference, command=command, interrupts=self.interrupts,
                                             progress=lambda m: self.progress(f"{label} capacity {k}: {m}"),
                                             accelerators=c.accelerators, seed=w.seed + k, hint=hint,
                                             launch_argv=launch_argv(st), bench=self.bench)
        except VkitError as e:
            raise bench_failed(e) from None
        atomic_write_text(path, json.dumps(plain(doc), indent=2) + "\n")
        code, _, _ = capacity_checker(path)
        findings = [] if code == 0 else ["no_clear_load_point"]
        verdict = "valid" if code == 0 else "invalid"
        if code == 0 and cut_by_the_client(doc):
            # the capacity is only a lower bound: the machine, not the server, ended the search (measured once more)
            code, verdict, findings = int(ExitCode.REJECTED), "rejected", ["client_saturation"]
        return _rel(path, self.sf.dir), plain(doc), {"code": code, "verdict": verdict, "findings": findings}

    def gate(self, baseline: list[str], candidate: list[str], fresh: bool = False, selected_from: int = 1,
             primary: str | None = None, guards: list[str] | None = None, key: str = "baseline") -> dict:
        primary = primary or self.s.primary
        guards = guards if guards is not None else self.s.guards
        # σ pooled from the repeats of baseline ``key`` (the same workload as the evidence), for the
        # primary and every guard (normal-mixture sequences)
        st = self.sf.read()
        sig = (st.get(key) or {}).get("sigma") or (st.get("sigma_baseline") if key == "baseline" else None) or {}
        comps = self.components(key)
        # runs per server start on the evidence side: screening runs share one process (its level
        # does not average out over them); a confirmation's arms change process every one or two runs
        per_start = 2 if fresh else max(1, len(candidate))
        device = self.slot_sigma(baseline, candidate)
        pool, thr = {}, {}
        for spec in [primary, *guards]:
            m = spec.split(":")[0]
            v = comparison_sigma(comps.get(m), per_start) if comps.get(m) else sig.get(m)
            if isinstance(v, (int, float)) and device.get(m):
                v = math.sqrt(v * v + device[m] ** 2)  # the two sides ran on different devices: their A/A spread
            if isinstance(v, (int, float)) and 0 < v < 1:
                pool[m] = float(v)
                # the practical bar max(2σ, floor) is twice the noise of one run on a fresh start
                # (σ_baseline as the seeds define it), not the clustered σ the test must use
                one = comparison_sigma(comps[m], 1) if comps.get(m) else v
                thr[m] = float(min(one, v)) if isinstance(one, (int, float)) and one > 0 else float(v)
        runs = {"fresh" if fresh else "candidate": [self._abs(p) for p in candidate]}
        try:
            inp = _gate.GateInput(baseline=[self._abs(p) for p in baseline], primary=_gate.parse_metric(primary, "primary"),
                                  guards=_gate.parse_guards(guards), selected_from=selected_from, sigma_pool=pool, sigma_threshold=thr,
                                  policy=self.policy, **runs)
            res = plain(_gate.decide(inp, checker=capacity_checker if self.s.capacity is not None else None))
        except VkitError as e:
            return {"decision": "invalid", "why": f"gate: error: {' '.join(str(e).split())}", "exit_code": int(e.code)}
        res["exit_code"] = int(_gate.EXIT_CODE.get(res["decision"], ExitCode.UNDECIDED))
        return res

    # -- BASELINE -------------------------------------------------------------
    def baseline(self, force: bool = False, workload: Workload | None = None, key: str = "baseline",
                 config: dict | None = None) -> dict:
        """Measure the kept configuration (or ``config``) N times (resumable); σ_baseline into the state."""
        w = workload or self.s.workload
        st = self.sf.read()
        b = st.get(key)
        kept = dict(config) if config is not None else st["kept"]["config"]
        if b and not force and b.get("config") == kept and b.get("workload") == w.describe() and len(b.get("runs", [])) >= self.s.baseline_repeats:
            return b
        if force or not b or b.get("config") != kept or b.get("workload") != w.describe():
            gen = (b or {}).get("generation", 0) + 1
            b = {"config": kept, "workload": w.describe(), "runs": [], "checks": [], "generation": gen, "started": now_iso()}
            self.sf.set_baseline(key, b)
        if config is None:
            self.restore_kept(fresh=not b["runs"] and not self._only_step1_on_it())
        else:
            ok, res = self.apply(kept, fresh=not b["runs"])
            if not ok:
                raise VkitError(f"the configuration to measure as {key} does not start: {res.get('message')}", ExitCode.UNAVAILABLE)
        label = f"{key}-g{b['generation']}"
        sizes = start_sizes(self.s.baseline_repeats, self.s.starts())
        ends = list(itertools.accumulate(sizes))
        while len(b["runs"]) < self.s.baseline_repeats:
            k = len(b["runs"]) + 1
            j = next(i for i, e in enumerate(ends) if len(b["runs"]) < e)  # the start this run belongs to
            if j > 0 and len(self.starts_of(b["runs"])) < j + 1:
                # on a new server start: σ's between-restart part is measured, not assumed zero
                span = f"runs {k}-{ends[j]}" if sizes[j] > 1 else f"run {k}"
                self.progress(f"{key}: {span} on server start {j + 1} of {len(sizes)} "
                              "(σ within one process and between restarts)")
                ok, res = self.apply(kept, fresh=True)
                if not ok:
                    raise VkitError(f"the configuration to measure as {key} does not start again: {res.get('message')}",
                                    ExitCode.UNAVAILABLE)
            path, doc, check = self.measure(label, k, w)
            if check["code"] == ExitCode.INVALID:
                raise Rejected(f"the baseline measurement {path} is invalid ({', '.join(check.get('findings') or [])}): fix the gauge first")
            b["runs"].append(path)
            b["checks"].append(check)
            self.progress(f"{key} {k}/{self.s.baseline_repeats}: {brief(doc)}"
                          + ("" if check["code"] == 0 else f"  [{check['verdict']}: {', '.join(check.get('findings') or [])}]"))
            self.sf.set_baseline(key, b)
            if "slo_capacity" in doc and not self.sf.read().get("capacity_reference"):
                self._set_reference(doc, path)
        return self._finish_baseline(key, b)

    def starts_of(self, runs: list[str]) -> list[str]:
        """The distinct server processes that measured ``runs`` (as recorded), in order."""
        known = self.sf.read().get("run_starts") or {}
        return list(dict.fromkeys(known[p] for p in runs if known.get(p)))

    def _only_step1_on_it(self) -> bool:
        """The process running now is the kept configuration's and measured nothing but step 1's
        closed-loop runs (dataset seeds seed + 1, seed + 2), whose prompts no capacity search sends
        (seeds from seed + 1000 up): a capacity baseline can start on it without a restart. Step 1's
        choice is a business rule, not a selection on performance, so no winner's curse rides on its
        process either."""
        st = self.sf.read()
        key, run = self.start_key(), self.svc.read()["service"].get("running") or {}
        if self.s.capacity is None or key is None or run.get("config") != st["kept"]["config"]:
            return False
        step1 = {p for t in st["trials"] if t["step"] == "1" for p in t.get("runs") or []}
        on_it = [p for p, s in (st.get("run_starts") or {}).items() if s == key]
        return bool(on_it) and set(on_it) <= step1

    def _finish_baseline(self, key: str, b: dict) -> dict:
        """The baseline's means and σ (per metric, relative) from its runs, recorded as final. With
        runs on two or more server starts, σ has two parts (``components``): within one process
        and between restarts; ``sigma`` is then the sd of one run on a new process (both parts)."""
        docs = [self.load(p) for p in b["runs"]]
        known = self.sf.read().get("run_starts") or {}
        starts = [known.get(p) for p in b["runs"]]
        sig, comps = {}, {}
        for m in KEY_METRICS:
            rows = [(s, math.log(d[m])) for s, d in zip(starts, docs, strict=True) if isinstance(d.get(m), (int, float)) and d.get(m) > 0]
            if len(rows) < 2:
                continue
            comp = sigma_parts([v for _, v in rows], [s for s, _ in rows])
            comps[m] = comp
            sig[m] = comp["total"]
        if "slo_capacity" in sig or any("slo_capacity_sd" in d for d in docs):
            sig["slo_capacity"] = capacity_sigma(sig.get("slo_capacity"), docs)
            if "slo_capacity" in comps:
                comps["slo_capacity"]["resolution"] = capacity_sigma(None, docs)
        b["metrics"] = aggregate(docs)
        b["sigma"] = sig
        b["components"] = comps
        self.sf.set_baseline(key, b, final=True)
        self.log("baseline", key=key, config=b["config"], runs=b["runs"], sigma=sig, metrics=b["metrics"],
                 **({"rebased_from": b["rebased_from"]} if b.get("rebased_from") else {}))
        return b

    def rebase_baseline(self, tid: str, conf: dict) -> dict | None:
        """After a keep: the newly kept configuration's own measurements
        (its screening runs and the confirmation's B runs, each on a fresh server start) become the
        baseline the next candidates are screened against, with no extra run; None when they are
        fewer than the baseline repeats (the next ``baseline()`` then measures it)."""
        t = self.trial(tid)
        st = self.sf.read()
        runs = list(dict.fromkeys([*(t.get("runs") or []), *(conf.get("b_runs") or [])]))
        if len(runs) < self.s.baseline_repeats or t["config"] != st["kept"]["config"]:
            return None
        old = st.get("baseline") or {}
        b = {"config": dict(t["config"]), "workload": self.s.workload.describe(), "runs": runs,
             "checks": [{"code": 0, "verdict": "valid", "findings": []} for _ in runs],
             "generation": old.get("generation", 0) + 1, "started": now_iso(), "rebased_from": tid}
        self.sf.set_baseline("baseline", b)
        b = self._finish_baseline("baseline", b)
        pm = self.s.primary.split(":")[0]
        self.progress(f"baseline rebased on the kept {tid}: {len(runs)} measurements of it (screening and confirmation) "
                      f"on {len(self.starts_of(runs))} server starts, {pm} {b['metrics'].get(pm, 0):.4g} "
                      f"(σ {b['sigma'].get(pm, 0):.1%})")
        return b

    def _set_reference(self, doc: dict, path: str) -> None:
        """The load every later capacity search starts from and measures interactivity at: the first
        baseline search's capacity (its highest clear hold; the estimate when nothing clearly held)."""
        load = doc.get("capacity_holds") or doc.get("slo_capacity")
        self.sf.set_capacity_reference({"load": load, "from": path, "set": now_iso()})
        unit = capacity_unit(doc)
        self.progress(f"capacity reference load: {load:g} {unit} (every later search starts there and measures "
                      "per-user tok/s there)")

    # -- the promise, verified --------------------------------------------------------
    def verify_promise(self, config: dict, rate: float) -> dict:
        """The capacity promised for ``config`` (the highest clear hold of its short searches) run
        for ``verify_seconds`` on a fresh start of it: a short point cannot show a queue that grows
        slowly, a long run can. Each load gets the three-way verdict of any load point
        (``capacity.verdict_of``, at least 2 repeats): it holds only on two valid runs whose mean
        margin clears twice its standard error (their own spread, at least the margins' prior noise),
        and is run again while neither holds nor fails is clear (a margin inside the noise, or a run
        that could not measure the server: the client behind its schedule). A load that fails, or
        stays unclear after the repeats, steps down by the tolerance, then by twice and four times it
        (8 runs at most). The verified load is the one that clearly held: a promise at the boundary
        itself fails every other fresh run. The server is left on the kept configuration."""
        c = self.s.capacity
        assert c is not None
        plan = replace(c.plan, point_seconds=c.verify_seconds, repeats=max(2, c.plan.repeats))
        w = self.s.workload
        opts = replace(w.options, seed=w.seed + 50_000)
        out_dir = os.path.join(self.runs_dir, "promise")
        st = self.sf.read()
        run = _cap.live_measure(opts, self.svc.read()["service"]["url"], out_dir, plan, command=["--state", self.sf.path],
                                interrupts=self.interrupts, launch_argv=launch_argv(st), bench=self.bench)
        ok, res = self.apply(dict(config), fresh=True)
        if not ok:
            raise VkitError(f"the recommended configuration does not start: {res.get('message')}", ExitCode.UNAVAILABLE)
        runs, verified, load, down = [], None, plan.snap(rate), 0
        point = _cap.Point(load)
        for k in range(8):
            s = run(load, k)
            where = _rel((s.get("vkit") or {}).get("capacity_check", {}).get("path") or out_dir, self.sf.dir)
            self.note_environment(where, s)
            j = _cap.judge_run(s, c.slo, plan, load)
            point.runs.append(j)
            # the same three-way verdict as any load point: holds only when the margin clears the
            # margins' noise (2 se), measured again while unclear; and a hold takes two valid runs,
            # whose own spread enters se: one run's margin says nothing of how far the next one falls
            verdict = _cap.verdict_of(point, plan)
            if verdict == _cap.HOLDS and point.margins().size < 2:
                verdict = None
            held = verdict == _cap.HOLDS
            runs.append({"load": load, "holds": held, "verdict": verdict, "margin": j["margin"],
                         "binding": min(j["margins"], key=j["margins"].get) if j["margins"] else None, "why": j["why"],
                         "metrics": j["metrics"],
                         "path": where})
            self.progress(f"promise {load:g}: {verdict or 'not yet clear'} over {c.verify_seconds:g} s"
                          + (f" (margin {j['margin']:+.3f}, {runs[-1]['binding']})" if j["margin"] is not None else f" ({j['why']})"))
            if held:
                verified = load
                break
            if verdict is None:
                # not yet a verdict (a margin inside the noise, or a run that could not measure the
                # server: the client behind its schedule, a failed request): the same load again
                continue
            # stepping down accelerates (the tolerance, then twice it, ...): a promise far above what
            # a long run holds is found in a few runs, one just above it loses one tolerance only
            load = plan.snap(load / (1 + plan.tolerance) ** (2 ** down))
            point = _cap.Point(load)
            down += 1
        if config != self.sf.read()["kept"]["config"]:
            self.restore_kept()
        out = {"config": dict(config), "searched": rate, "verified": verified, "seconds": c.verify_seconds, "runs": runs,
               "finished": now_iso()}
        self.log("promise", **out)
        return out

    # -- no restart for a candidate that cannot differ ------------------------------
    def cannot_differ(self, config: dict) -> tuple[str, str | None] | None:
        """(why, the trial it is the same as) when measuring ``config`` cannot tell anything new, so it
        is not worth a restart: it was measured in this run already (a trial, or the baseline when it
        is the kept configuration); it differs from a measured configuration only in ``max_num_seqs``
        with both values at or above the most requests the server ever held in that configuration's
        measurements (the peak in flight of its capacity searches, or the client's concurrency: the
        limit never bound, so it cannot bind at the other value either); or vLLM refuses to start
        it (``max_num_batched_tokens`` below ``max_model_len`` with chunked prefill off). None: measure it."""
        st = self.sf.read()
        tokens, mml = config.get("max_num_batched_tokens"), config.get("max_model_len")
        if (config.get("enable_chunked_prefill") is False and isinstance(tokens, int) and isinstance(mml, int)
                and tokens < mml):
            return (f"vLLM refuses to start it: max_num_batched_tokens {tokens} < max_model_len {mml} with chunked "
                    "prefill off", None)
        measured = [(t["id"], t["config"], t.get("runs") or []) for t in st["trials"]
                    if t["status"] in ("done", "eliminated") and t.get("valid") is not False and t["step"] not in ("1", "5")]
        b = st.get("baseline") or {}
        if b.get("config") and b.get("metrics") and b.get("workload") == self.s.workload.describe():
            measured.insert(0, ("baseline", b["config"], b.get("runs") or []))
        for tid, cfg, _ in measured:
            if cfg == config:
                return f"the same configuration as {tid}, measured in this run", tid
        for tid, cfg, runs in measured:
            if {k for k in set(cfg) | set(config) if cfg.get(k) != config.get(k)} != {"max_num_seqs"}:
                continue
            peak = self._peak_in_flight(runs)
            a, c = cfg.get("max_num_seqs"), config.get("max_num_seqs")
            if peak and isinstance(a, int) and isinstance(c, int) and min(a, c) >= peak:
                return (f"max_num_seqs {c} cannot differ from {a} ({tid}): the server never held more than {peak} "
                        f"requests at any load measured, so neither limit binds", tid)
        return None

    def _peak_in_flight(self, runs: list[str]) -> int | None:
        """The most requests in flight in these runs: a capacity search's peak over its points, or a
        closed-loop run's concurrency (the client never sends more)."""
        peak = 0
        for p in runs:
            try:
                d = self.load(p)
            except (OSError, ValueError):
                return None
            if "slo_capacity" in d:
                peak = max(peak, int(d.get("peak_in_flight") or 0))
            elif isinstance(d.get("max_concurrency"), int):
                peak = max(peak, d["max_concurrency"])
            else:
                return None  # open loop without a recorded peak: the limit may have bound
        return peak or None

    def skip_trial(self, step: str, config: dict, reason: str, why: str, same_as: str | None, audit: dict | None = None) -> dict:
        """A proposed configuration recorded without a restart: it carries the measurement of the trial it
        is the same as (so the search sees it as measured), status ``skipped`` and the reason."""
        t = self.new_trial(step, config, reason, audit)
        st = self.sf.read()
        src = next((x for x in st["trials"] if x["id"] == same_as), None)
        if same_as == "baseline":
            metrics, valid = dict((st.get("baseline") or {}).get("metrics") or {}), True
        elif src is not None:
            metrics, valid = dict(src.get("metrics") or {}), src.get("valid")
        else:
            metrics, valid = {}, False  # refused by vLLM: infeasible, as a start failure would be
        self.log("skip", trial=t["id"], config=config, why=why, same_as=same_as)
        self.progress(f"{t['id']} step {step}: skipped, no restart: {why}")
        return self.update_trial(t["id"], status="skipped", valid=valid, metrics=metrics, verdict=None, why=why,
                                 same_as=same_as, finished=now_iso())

    # -- a trial ----------------------------------------------------------------
    def new_trial(self, step: str, config: dict, reason: str, audit: dict | None = None) -> dict:
        t = self.sf.add_trial(step, config, reason, audit or {})
        self.log("propose", trial=t["id"], step=step, config=config, reason=reason, audit=audit or {})
        return t

    def run_trial(self, tid: str, baseline_key: str = "baseline", workload: Workload | None = None,
                  primary: str | None = None, guards: list[str] | None = None, repeats: int | None = None) -> dict:
        """APPLY → VERIFY → VALIDATE → GATE (screening), resuming from the recorded phase. ``repeats``:
        the runs the caller needs (step 1's stability, an ablation's verdict); else ``screen_size``."""
        t = self.trial(tid)
        if t["status"] in ("done", "start_failed", "eliminated", "invalid", "skipped"):
            return t
        b = self.sf.read().get(baseline_key)  # None before BASELINE (step 1): measured, not gated
        if t["status"] == "proposed":
            self.progress(f"{tid} step {t['step']}: apply {' '.join(to_serve_flags(t['changes'])) or '(kept)'}")
            ok, res = self.apply(t["config"], fresh=True)
            if not ok:
                diag = res.get("diagnosis") or {}
                return self.update_trial(tid, status="start_failed", valid=False, verdict="reject", finished=now_iso(),
                                         why=f"start failed: {diag.get('quote') or res.get('message')}", diagnosis=diag)
            t = self.update_trial(tid, status="applied", startup=res.get("startup") or {})
        else:
            ok, res = self.apply(t["config"])  # resumed: make sure it is what runs
            if not ok:
                diag = res.get("diagnosis") or {}
                return self.update_trial(tid, status="start_failed", valid=False, verdict="reject", finished=now_iso(),
                                         why=f"start failed: {diag.get('quote') or res.get('message')}", diagnosis=diag)
        base_docs = [self.load(p) for p in b["runs"]] if b else []
        pm = (primary or self.s.primary).split(":")[0]
        pm = pm if pm in ("output_throughput", "slo_capacity") else "output_throughput"  # elimination: higher is better
        base_tp = gmean([d.get(pm) for d in base_docs]) or 0.0
        sig_tp = ((b or {}).get("sigma") or {}).get(pm, 0.02)
        if repeats is None:
            repeats = t.get("repeats_planned")
            if repeats is None:
                repeats, why_n = self.screen_size(baseline_key) if b else (self.s.screen_repeats, "no baseline yet")
                t = self.update_trial(tid, repeats_planned=repeats, repeats_why=why_n)
        while len(t["runs"]) < repeats:
            k = len(t["runs"]) + 1
            path, doc, check = self.measure(tid, k, workload)
            t["runs"].append(path)
            t["checks"].append(check)
            t = self.update_trial(tid, runs=t["runs"], checks=t["checks"])
            self.progress(f"{tid} run {k}: {brief(doc)}"
                          + ("" if check["code"] == 0 else f"  [{check['verdict']}: {', '.join(check.get('findings') or [])}]"))
            if check["code"] == ExitCode.INVALID:
                return self.update_trial(tid, status="invalid", valid=False, verdict=None, finished=now_iso(),
                                         metrics=summary_metrics(doc),
                                         why=f"invalid measurement ({', '.join(check.get('findings') or [])}): no verdict")
            cut = max(4 * sig_tp, self.s.eliminate_below)
            what = "capacity" if pm == "slo_capacity" else "throughput"
            # only a run check_invariants passed shows a clearly worse candidate (a busy client's run does not)
            if k == 1 and check["code"] == 0 and base_tp and (doc.get(pm) or 0.0) < base_tp * (1 - cut):
                self.progress(f"{tid} eliminated: {doc[pm] / base_tp - 1:+.1%} {what} vs the baseline")
                return self.update_trial(tid, status="eliminated", valid=True, verdict="reject", finished=now_iso(),
                                         metrics=summary_metrics(doc),
                                         why=f"eliminated after 1 run: {(doc.get(pm) or 0.0) / base_tp - 1:+.1%} {what} vs the "
                                             f"baseline, beyond -{cut:.0%}; no full repeats for a clearly worse candidate")
        docs = [self.load(p) for p in t["runs"]]
        valid = all(c["code"] == 0 for c in t["checks"])
        if not b:
            return self.update_trial(tid, status="done", valid=valid, metrics=aggregate(docs), verdict=None,
                                     why=t.get("why") or "measured; no baseline yet to gate against", finished=now_iso())
        g = self.gate(b["runs"], t["runs"], primary=primary, guards=guards, key=baseline_key)
        verdict = g.get("decision")
        why = g.get("why") or ""
        self.progress(f"{tid} screened: {verdict} — {why}")
        return self.update_trial(tid, status="done", valid=valid, metrics=aggregate(docs), verdict=verdict, why=why,
                                 gate={k: g.get(k) for k in ("decision", "why", "primary", "more_runs", "warnings", "exit_code")},
                                 finished=now_iso())

    # -- CONFIRM + KEEP ---------------------------------------------------------
    def confirm_and_keep(self, tid: str, selected_from: int, workload: Workload | None = None,
                         primary: str | None = None, guards: list[str] | None = None, key: str = "baseline",
                         effect: Effect | None = None) -> dict:
        """Fresh interleaved runs of trial ``tid``'s configuration against the kept one (B A A B blocks),
        gated with --fresh --selected-from K; an accept is kept (a gate decision, logged). ``effect``: the
        winner's screened effect, corrected for the winner's curse, that the blocks are planned for."""
        t = self.trial(tid)
        conf = self._confirm(tid, "confirmations", selected_from, workload, primary, guards, key, effect)
        if conf.get("decision") == "kept":
            return conf
        if conf.get("decision") != "accept":
            self.progress(f"REVERT: {tid} not kept ({conf.get('decision')}): {conf.get('why')}")
            return conf
        if self._kept_before_saved(conf, t, "confirmations"):
            did = self.sf.read()["kept"]["decision_id"]  # the keep was made before an interruption: not made twice
        else:
            if not conf.get("keep_id"):
                # the keep's id first: a stop between its log line and the state finds it again on the rerun
                conf["keep_id"] = self.sf.log.new_id()
                self.save_conf(conf)
            ok, _ = self.apply(t["config"])
            if not ok:
                conf["decision"] = "start_failed"
                self.save_conf(conf)
                return conf
            did = self.keep(reason=f"gate accepted {tid} on fresh interleaved runs: {conf.get('why')}", decision="gate",
                            decision_id=conf["keep_id"])
        conf["decision"] = "kept"
        conf["decision_id"] = did
        self.save_conf(conf)
        self.update_trial(tid, kept=True, decision_id=did)
        self.progress(f"KEEP {tid}: {' '.join(to_serve_flags(t['changes']))} ({did})")
        if workload is None or workload.name == self.s.workload.name:
            self.rebase_baseline(tid, conf)
        return conf

    def _kept_before_saved(self, conf: dict, trial: dict, list_key: str) -> bool:
        """A confirmation whose keep was made (the kept configuration is the trial's, by a gate decision): not yet
        recorded on it ("accept": vkit was stopped between the two writes), or recorded ("kept": stopped before
        what follows a keep). Its ``against`` is the configuration kept before, so it is not confirmed again."""
        k = self.sf.read()["kept"]
        return (list_key == "confirmations" and conf.get("decision") in ("accept", "kept") and k.get("decision") == "gate"
                and k["config"] == trial["config"] and conf.get("against") != trial["config"])

    def keep(self, reason: str, decision: str, decision_id: str | None = None) -> str:
        """The applied candidate on this runner's server becomes the kept configuration (the lifecycle's
        keep, logged); on a slot, the tune's state records it too (the other slots copy it at their next restart)."""
        previous = self.sf.read()["kept"]
        lc = Lifecycle(self.svc, self.tool_name, self.owner, progress=self.progress, policy=self.policy, backend=self.backend)
        did = lc.keep(reason=reason, decision=decision, decision_id=decision_id)
        if self.svc is not self.sf:
            k = self.svc.read()["kept"]
            self.sf.mirror_kept(k["config"], did, decision)
            if not self.sf.log.holds("keep", did):
                self.sf.log.append(self.tool_name, "keep", decision_id=did, config=k["config"], previous=previous, reason=reason,
                                   decision=decision, slot=self.slot)
        return did

    def confirm_point(self, tid: str, selected_from: int, primary: str, guards: list[str] | None = None) -> dict:
        """A delivered (Pareto) configuration re-confirmed on its own claim — ``primary``, the objective
        it screened better on — against the kept one, on fresh interleaved runs; nothing is kept.
        Decision: accept (confirmed), reject (the claim was noise) or undecided. The server is left
        on the candidate (the last arm of B A A B): the caller restores the kept configuration once,
        after its last confirmation, rather than restarting it between two candidates."""
        return self._confirm(tid, "delivery_confirmations", selected_from, None, primary, guards or [])

    def _confirm(self, tid: str, list_key: str, selected_from: int, workload: Workload | None,
                 primary: str | None, guards: list[str] | None, key: str = "baseline", effect: Effect | None = None) -> dict:
        """B A A B blocks of trial ``tid`` (B) against the kept configuration (A), gated after each
        block until a decision or the planned blocks (``confirm_plan``, at most ``confirm_blocks``
        unless granted); one the budget cannot decide is refused before any run (``underpowered``).
        Resumable from the record in ``list_key``."""
        t = self.trial(tid)
        st = self.sf.read()
        kept_cfg = dict(st["kept"]["config"])
        conf = next((c for c in st.get(list_key, []) if c["trial_id"] == tid), None)
        if conf is not None and conf.get("against", kept_cfg) != kept_cfg:
            if self._kept_before_saved(conf, t, list_key):
                return conf  # accepted and kept, interrupted before the record said so: confirm_and_keep finishes it
            conf = None  # confirmed against an earlier kept configuration: that verdict no longer applies
        if conf is None:
            conf = self._new_conf(tid, selected_from, primary, kept_cfg)
            conf["plan"] = self.confirm_plan(primary, guards, key, effect)
            if not conf["plan"]["fits"]:
                conf.update(decision="underpowered", why=conf["plan"]["why"], finished=now_iso())
                self.progress(f"confirm {tid}: not measured: {conf['why']}")
                self.log("underpowered", trial_id=tid, plan=conf["plan"])
            else:
                self.progress(f"confirm {tid}: {conf['plan']['why']}")
            self.save_conf(conf, list_key)
        if conf.get("decision") in ("accept", "reject", "kept", "start_failed", "invalid", "underpowered") or \
                (conf.get("decision") == "undecided" and conf.get("finished")):
            return conf
        blocks = (conf.get("plan") or {}).get("blocks") or self.s.confirm_blocks
        label = f"confirm-{tid}" if list_key == "confirmations" else f"deliver-{tid}"
        decision = None
        g: dict = {}
        block = len(conf["sequence"]) // 4
        while block < blocks:
            live = self.slots()
            if len(live) > 1 and len(conf["sequence"]) % 4 == 0:
                # q blocks at once, block k on slot k mod q: each block's pairs within one device, the verdict over all
                group = list(range(block, min(blocks, block + len(live))))
                bad = self._blocks_on_slots(conf, group, live, (t["config"], kept_cfg), label, workload, list_key)
            else:
                group = [block]
                bad = self._block_here(conf, block, (t["config"], kept_cfg), label, workload, list_key)
            if bad:
                conf["decision"], conf["why"] = bad
                self.save_conf(conf, list_key)
                return conf
            block += len(group)
            g = self.gate(conf["a_runs"], conf["b_runs"], fresh=True, selected_from=selected_from, primary=primary, guards=guards,
                          key=key)
            decision = g.get("decision")
            self.progress(f"confirm {tid} after {len(conf['b_runs'])} pairs: {decision} — {g.get('why')}")
            if decision in ("accept", "reject", "invalid"):
                break
        conf["decision"] = decision
        conf["gate"] = {k: g.get(k) for k in ("decision", "why", "primary", "guards", "more_runs", "warnings", "design", "exit_code")}
        conf["why"] = g.get("why")
        conf["finished"] = now_iso()
        self.save_conf(conf, list_key)
        return conf

    BLOCK = ("B", "A", "A", "B")

    def _block_here(self, conf: dict, block: int, cfgs: tuple[dict, dict], label: str, workload: Workload | None,
                    list_key: str) -> tuple[str, str] | None:
        """One B A A B block on this runner's server, each run recorded as it ends (resumable mid-block);
        (decision, why) when a start failed or a run was invalid."""
        for j, arm in enumerate(self.BLOCK):
            if block * 4 + j < len(conf["sequence"]):
                continue  # measured before an interruption
            prev = conf["sequence"][-1] if conf["sequence"] else None
            ok, res = self.apply(cfgs[0] if arm == "B" else cfgs[1], fresh=prev != arm)
            if not ok:
                return "start_failed", f"the {'candidate' if arm == 'B' else 'kept configuration'} did not start: {res.get('message')}"
            k = len(conf["b_runs" if arm == "B" else "a_runs"]) + 1
            path, doc, check = self.measure(f"{label}-{arm}", k, workload)
            if check["code"] == ExitCode.INVALID:
                return "invalid", f"invalid confirmation run {path}"
            conf["b_runs" if arm == "B" else "a_runs"].append(path)
            conf["sequence"].append(arm)
            self.save_conf(conf, list_key)
            self.progress(f"{label} {arm}{k}: {brief(doc)}")
        return None

    def _run_block(self, block: int, cfgs: tuple[dict, dict], label: str, workload: Workload | None, fresh: bool) -> dict:
        """Block ``block`` of B A A B on this runner's slot (a thread's body): its runs, or what stopped it."""
        runs, prev = [], (None if fresh else "B")  # the slot's last block ended on B: it goes on from that server
        for j, arm in enumerate(self.BLOCK):
            ok, res = self.apply(cfgs[0] if arm == "B" else cfgs[1], fresh=prev != arm)
            if not ok:
                return {"bad": ("start_failed", f"the {'candidate' if arm == 'B' else 'kept configuration'} did not start on "
                                                f"slot {self.slot}: {res.get('message')}")}
            k = 2 * block + (1 if j < 2 else 2)
            path, doc, check = self.measure(f"{label}-{arm}", k, workload)
            if check["code"] == ExitCode.INVALID:
                return {"bad": ("invalid", f"invalid confirmation run {path}")}
            runs.append((arm, path, doc))
            prev = arm
        return {"runs": runs}

    def _blocks_on_slots(self, conf: dict, group: list[int], live: list[dict], cfgs: tuple[dict, dict], label: str,
                         workload: Workload | None, list_key: str) -> tuple[str, str] | None:
        """Blocks ``group`` side by side, block k on slot k mod q; recorded in block order once all ended, so the
        record (and the gate after it) never depends on which slot finished first."""
        from concurrent.futures import ThreadPoolExecutor

        q = len(live)
        with self.interrupts.every_section(), ThreadPoolExecutor(max_workers=len(group)) as ex:
            futs = [ex.submit(self.for_slot(live[b % q])._run_block, b, cfgs, label, workload, b < q) for b in group]
            outs = [f.result() for f in futs]
        for b, out in zip(group, outs, strict=True):
            if out.get("bad"):
                return out["bad"]
            for arm, path, doc in out["runs"]:
                conf["b_runs" if arm == "B" else "a_runs"].append(path)
                conf["sequence"].append(arm)
                self.progress(f"{label} {arm} block {b + 1} on slot {live[b % q]['name']}: {brief(doc)}")
            self.save_conf(conf, list_key)
        return None

    def save_conf(self, conf: dict, list_key: str = "confirmations") -> None:
        self.sf.save_confirmation(conf, list_key)

    def _new_conf(self, tid: str, selected_from: int, primary: str | None, against: dict) -> dict:
        t = self.trial(tid)
        return {"trial_id": tid, "step": t["step"], "config": t["config"], "selected_from": selected_from,
                "primary": primary, "against": dict(against), "a_runs": [], "b_runs": [], "decision": None,
                "started": now_iso(), "sequence": []}

    def drop_point(self, tid: str, selected_from: int, primary: str, why: str) -> dict:
        """A delivered configuration dropped without measuring (it claims nothing over the kept one),
        recorded as a rejected delivery confirmation."""
        conf = self._new_conf(tid, selected_from, primary, self.sf.read()["kept"]["config"])
        conf.update(decision="reject", why=why, finished=now_iso())
        self.save_conf(conf, "delivery_confirmations")
        return conf

    # -- drift sentinel -----------------------------------------------------------
    def kept_series(self) -> list[tuple[str, dict]]:
        return kept_series(self.sf.read(), self.load)

    def sentinel(self) -> dict:
        """Re-measure the kept configuration once and look for a level change in everything measured
        of it since the last alarm (``kept_series``); on a change, the alarm time resets the series."""
        from vkit.decide.drift import MIN_RUNS, detect, level_check

        self.restore_kept(fresh=True)
        st = self.sf.read()
        d = os.path.join(self.runs_dir, "sentinel")
        k = 1 + (sum(1 for f in os.listdir(d) if f.endswith(".json")) if os.path.isdir(d) else 0)  # never overwrite
        path, doc, check = self.measure("sentinel", k)
        if check["code"] == ExitCode.INVALID:
            # an invalid run (failed requests, a broken gauge) says nothing of the level: kept out of the series
            trials = st.get("trials") or []
            out = {"after_trial": trials[-1]["id"] if trials else None, "runs": None, "min_runs": MIN_RUNS, "detector": None,
                   "changed": False, "shift": None, "last": None,
                   "why": f"invalid sentinel run {path} ({', '.join(check.get('findings') or [])}): no drift verdict"}
            self.sf.record_drift_check(dict(out, ts=now_iso()))
            self.log("drift_check", **out)
            return out
        self.sf.add_kept_repeat(path)
        series = self.kept_series()
        vals = [d["output_throughput"] for _, d in series]
        # σ from the series' own reference window: the baseline's σ comes from a handful of runs, and the
        # detectors' thresholds for a given σ assume it exact (drift.py: "estimated" calibration).
        if len(vals) >= MIN_RUNS:
            res = detect(vals)
        else:
            # too short for the detectors: the sentinel's start against the earlier starts' level, calibrated
            # for the tune's few starts (drift.level_check; false alarms and delay in bench/bench_drift_tune.py)
            known = self.sf.read().get("run_starts") or {}
            groups: dict = {}
            for i, (p, d) in enumerate(series):
                groups.setdefault(known.get(p) or f"unknown-{i}", []).append(d["output_throughput"])
            mine = known.get(path) or next(iter(reversed(groups)))
            latest = groups.pop(mine, [doc["output_throughput"]])
            res = level_check(list(groups.values()), latest, checks=SENTINEL_CHECKS)
            res.setdefault("detector", "level_check")
            if res.get("changed"):
                res["change_index"] = next(i for i, (p, _) in enumerate(series) if (known.get(p) or "") == mine)
        trials = st.get("trials") or []
        out = {"after_trial": trials[-1]["id"] if trials else None, "runs": len(vals), "min_runs": MIN_RUNS,
               "detector": res.get("detector"), "changed": bool(res.get("changed")), "shift": res.get("shift"),
               "why": res.get("why") or res.get("verdict"), "last": doc["output_throughput"]}
        change = None
        if out["changed"]:
            # Runs before now no longer describe the server: the series restarts, the baseline is re-measured.
            ci = res.get("change_index")
            cp, cdoc = series[ci] if ci is not None else (None, {})
            change = {"reset": now_iso(), "changed": True, "change_date": cdoc.get("date") or now_iso(),
                      "change_run": cp, "shift": out["shift"], "detector": res.get("detector"), "source": "tune sentinel"}
        self.sf.record_drift_check(dict(out, ts=now_iso()), change)
        self.log("drift_check", **out)
        return out


def sigma_parts(logs: list[float], starts: list[str | None]) -> dict:
    """σ of log values from runs grouped by server start: ``within`` one process, ``between``
    restarts, ``total`` (one run on a new process), with 90 % intervals, from the one-way
    random-effects estimate; with runs from one start only, ``between`` is None (not measured)
    and ``total`` is the plain sd."""
    from vkit.decide.stats import variance_components

    groups: dict = {}
    for i, (v, s) in enumerate(zip(logs, starts, strict=True)):
        groups.setdefault(s if s is not None else f"unknown-{i}", []).append(v)
    sd = float(np.std(logs, ddof=1))
    if len(groups) >= 2 and any(len(g) >= 2 for g in groups.values()):
        vc = variance_components(list(groups.values()))
        out = vc.as_dict()
        for k in ("within_ci", "between_ci"):  # JSON has no infinity: an unbounded end is None
            out[k] = [x if math.isfinite(x) else None for x in out[k]]
        return dict(out, measured="within and between restarts")
    if len(groups) >= 2:  # one run per start: the sd of runs on new processes, not split
        return {"within": None, "between": None, "total": sd, "groups": len(groups), "runs": len(logs),
                "measured": "one run per start: within and between not separated"}
    return {"within": sd, "between": None, "total": sd, "groups": 1, "runs": len(logs),
            "measured": "one server start: the between-restart part is not measured"}


def comparison_sigma(comp: dict, per_start: int) -> float | None:
    """The per-run σ the gate uses for evidence measured ``per_start`` runs to a server process:
    sqrt(within² + per_start · between²), so that a mean over those runs carries the whole
    process-level variance (within²/n + between²). Without a split, the total. A capacity's
    search resolution adds in quadrature."""
    w, b = comp.get("within"), comp.get("between")
    if w is None or b is None:
        base = comp.get("total")
    else:
        base = math.sqrt(w * w + per_start * b * b)
    if base is None:
        return None
    return float(math.sqrt(base * base + (comp.get("resolution") or 0.0) ** 2))


def comparison_sigma_low(comp: dict, per_start: int) -> float | None:
    """``comparison_sigma`` at the low ends of the components' 90 % intervals: the most favourable σ
    the baseline's few runs allow. A budget is refused only when even this one cannot decide."""
    from scipy import stats as _sps

    w, b = comp.get("within_ci"), comp.get("between_ci")
    if isinstance(w, list) and isinstance(b, list) and w and b and w[0] is not None:
        base = math.sqrt(w[0] ** 2 + per_start * (b[0] or 0.0) ** 2)
    elif isinstance(comp.get("total"), (int, float)) and (comp.get("runs") or 0) >= 2:
        df = comp["runs"] - 1
        base = comp["total"] * math.sqrt(df / _sps.chi2.ppf(0.95, df))
    else:
        return comparison_sigma(comp, per_start)
    return float(math.sqrt(base * base + (comp.get("resolution") or 0.0) ** 2))


def capacity_sigma(sample: float | None, docs: list[dict]) -> float:
    """σ of ``slo_capacity`` between two searches: the repeats' own spread combined in quadrature
    with the searches' mean resolution (``slo_capacity_sd``, the position of the boundary inside
    each search's last bracket), so that two searches that happen to land on the same grid point
    never claim σ = 0."""
    res = [d["slo_capacity_sd"] for d in docs if isinstance(d.get("slo_capacity_sd"), (int, float))]
    q2 = float(np.mean(np.square(res))) if res else 0.0
    return float(math.sqrt((sample or 0.0) ** 2 + q2))


def kept_series(st: dict, load: Callable[[str], dict]) -> list[tuple[str, dict]]:
    """Every run of the kept configuration since the last drift alarm, as (path, summary), oldest
    first: its repeats (the baseline's, then each sentinel's), the A runs of confirmations against
    it and the B runs of the confirmation that kept it. Only runs measured the same way as the
    newest one count (step 5's mixed workload is another gauge). tune's sentinel and
    ``drift --kept`` judge this one series."""
    kept = st["kept"]["config"]
    paths = [r.get("path") if isinstance(r, dict) else r for r in (st.get("kept") or {}).get("repeats") or []]
    trials = {t["id"]: t for t in st.get("trials", [])}
    for c in st.get("confirmations", []) + st.get("delivery_confirmations", []):
        if c.get("against") == kept:
            paths += c.get("a_runs") or []
        t = trials.get(c.get("trial_id"))
        if t is not None and t.get("config") == kept:
            paths += c.get("b_runs") or []
    since = _gate.parse_date((st.get("drift") or {}).get("reset"))
    rows = []
    for p in dict.fromkeys(x for x in paths if isinstance(x, str)):
        try:
            doc = load(p)
        except (OSError, ValueError):
            continue
        when = _gate.parse_date(doc.get("date"))
        if since is not None and (when is None or when <= since):
            continue
        rows.append((when, p, doc))
    if all(w is not None for w, _, _ in rows):
        rows.sort(key=lambda r: r[0])
    if not rows:
        return []
    last = _gate.gauge_of(rows[-1][2])
    return [(p, doc) for _, p, doc in rows if _gate.gauge_of(doc) == last]


def elapsed(t0: float) -> str:
    return f"{time.time() - t0:.0f} s"
