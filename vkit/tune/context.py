"""The tune's parameter object: what every step and narrow object of sweep and tune is handed.

APPLY (restart_with_rollback) → VERIFY (post_start_verify inside it, then the repeats)
→ VALIDATE (check_invariants on every run) → GATE (gate against the kept baseline)
→ KEEP or REVERT. Each phase calls the library function its tool calls (``lifecycle.run_held``,
``gauge.measure``, ``invariants.check_file``, ``gate.decide``), with the same outcomes and
exit codes as ``bin/``, never re-implemented here.

:class:`Tune` has no methods. It holds what every phase shares: the state file and its typed reads
(``ledger``, ``served``: vkit.tune.ledger), the decision log (``log``), the server it restarts
(``seat``: vkit.tune.seat, the service's or a slot's, on its backend or a Ray worker's node), the lease,
and one narrow object per phase: ``measurer`` (vkit.tune.measurement: one run or capacity search,
vkit.tune.onerun, validated, measured again when the client was busy or the server died), ``trials``
(vkit.tune.trial: screening), ``baselines`` (vkit.tune.baseline), ``compare`` (vkit.tune.compare: gate
at the measured σ), ``budget`` (vkit.tune.budget: runs, blocks and seconds), ``confirmer``
(vkit.tune.confirm), ``promise`` (vkit.tune.promise) and ``sentinel`` (vkit.tune.sentinel).
:func:`new_tune` builds one; :func:`for_slot` the same tune on a slot's server.

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
  winner at its screened effect less the winner's curse, ``vkit.decide.power``), capped by
  ``confirm_blocks``; a confirmation that cannot reach a verdict within that budget says so
  before any run, and spends nothing (``--yes`` grants the larger budget instead).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from typing import Any, Callable

from vkit.apply.backend import PROCESS, Backend
from vkit.apply.policy import Policy
from vkit.interrupts import Interrupts
from vkit.state import StateFile, default_owner
from vkit.tune.config import Settings
from vkit.tune.ledger import Ledger


@dataclasses.dataclass(eq=False, slots=True)
class Tune:
    """One tuning run's shared parts (no methods: each phase is its own object over these; slots: a part
    that is not one of these fields cannot be set by mistake)."""

    sf: StateFile  # the tune's state: trials, baselines and decisions always go here
    s: Settings
    progress: Callable[[str], None]
    warn: Callable[[str], None]  # what must be seen even when progress is quiet
    tool_name: str
    owner: str  # holds the lease the run's restarts work under
    policy: Policy
    interrupts: Interrupts
    backend: Backend  # where servers run and are measured: processes, or the simulator in virtual time
    runs_dir: str
    svc: StateFile  # the state of the server this tune restarts: ``sf``, or a slot's (``for_slot``)
    slot: str | None = None
    fleet: Any = None  # vkit.tune.fleet.Fleet under --ray
    ledger: Ledger = dataclasses.field(init=False)  # typed reads of ``sf``
    served: Ledger = dataclasses.field(init=False)  # typed reads of ``svc``
    log: Callable[..., str] = dataclasses.field(init=False)  # log(event, **fields): the decision log, as this tool
    # the server it restarts and the narrow objects (``wire``); their modules import this one
    seat: Any = dataclasses.field(init=False)  # vkit.tune.seat.Seat
    measurer: Any = dataclasses.field(init=False)
    compare: Any = dataclasses.field(init=False)
    budget: Any = dataclasses.field(init=False)
    baselines: Any = dataclasses.field(init=False)
    promise: Any = dataclasses.field(init=False)
    trials: Any = dataclasses.field(init=False)
    confirmer: Any = dataclasses.field(init=False)
    sentinel: Any = dataclasses.field(init=False)


def new_tune(sf: StateFile, settings: Settings, progress: Callable[[str], None], tool_name: str = "sweep",
             owner: str | None = None, policy: Policy | None = None, interrupts: Interrupts | None = None,
             warn: Callable[[str], None] | None = None, backend: Backend | None = None) -> Tune:
    """A tune over ``sf`` on the service's server; its measurements in runs/ beside the state. ``owner``
    defaults to this tool's, ``policy`` to the packaged one, ``interrupts`` come from the tool's signal
    handler, ``warn`` defaults to ``progress``, ``backend`` to processes."""
    runs_dir = os.path.join(sf.dir, "runs")
    os.makedirs(runs_dir, exist_ok=True)
    t = Tune(sf=sf, s=settings, progress=progress, warn=warn or progress, tool_name=tool_name,
             owner=owner or default_owner(tool_name), policy=policy or Policy.load(), interrupts=interrupts or Interrupts(),
             backend=backend or PROCESS, runs_dir=runs_dir, svc=sf)
    return wire(t)


def wire(t: Tune) -> Tune:
    """The reads, the seat and the narrow objects over ``t``'s server and state (again on a copy: ``for_slot``)."""
    from vkit.tune.baseline import Baselines
    from vkit.tune.budget import Budget
    from vkit.tune.compare import Compare
    from vkit.tune.confirm import Confirmer
    from vkit.tune.measurement import Measurer
    from vkit.tune.promise import Promise
    from vkit.tune.seat import Seat
    from vkit.tune.sentinel import Sentinel
    from vkit.tune.trial import Trials

    t.ledger, t.served, t.seat = Ledger(t.sf), Ledger(t.svc), Seat(t)
    t.log = functools.partial(_log, t)
    t.measurer, t.compare, t.budget = Measurer(t), Compare(t), Budget(t)
    t.baselines, t.promise, t.trials = Baselines(t), Promise(t), Trials(t)
    t.confirmer, t.sentinel = Confirmer(t), Sentinel(t)
    return t


def _log(t: Tune, event: str, **fields: Any) -> str:
    return t.sf.log.append(t.tool_name, event, **fields)


def for_slot(t: Tune, slot: dict) -> Tune:
    """The same tune with its restarts and measurements on ``slot``'s server (its own state file:
    lifecycle, rollback, ABNORMAL and lease per slot)."""
    r = copy.copy(t)
    r.svc = StateFile(os.path.join(t.sf.dir, slot["state"]))
    r.slot = slot["name"]
    base = os.path.dirname(t.runs_dir) if t.slot else t.runs_dir
    r.runs_dir = os.path.join(base, slot["name"])  # each slot's runs apart: a trial retried elsewhere keeps its evidence
    os.makedirs(r.runs_dir, exist_ok=True)
    return wire(r)


def use_first_slot(t: Tune) -> bool:
    """Bind ``t`` (the serial phases': baseline, confirmations, steps 1, 4m, 5, delivery) to the first
    slot in service; False when the state has slots and every one was taken out."""
    live = t.ledger.slots()
    if not t.ledger.slots(live=False) or (live and live[0]["name"] == t.slot):
        return True
    if not live:
        return False
    r = for_slot(t, live[0])
    t.svc, t.slot, t.runs_dir, t.served = r.svc, r.slot, r.runs_dir, r.served
    return True


def service_logs(t: Tune) -> list:
    """The decision logs that hold restarts: the service's, and each slot's."""
    return [t.sf.log] + [StateFile(os.path.join(t.sf.dir, s["state"])).log for s in t.ledger.slots(live=False)]
