"""The tune's server and state: the per-trial state machine of sweep and tune, composed from the
functions vkit's tools call, and the narrow objects the steps call.

APPLY (restart_with_rollback) → VERIFY (post_start_verify inside it, then the repeats)
→ VALIDATE (check_invariants on every run) → GATE (gate against the kept baseline)
→ KEEP or REVERT. Each phase calls the library function its tool calls (``lifecycle.run_held``,
``gauge.measure``, ``invariants.check_file``, ``gate.decide``), with the same outcomes and
exit codes as ``bin/``, never re-implemented here.

``Runner`` holds what every phase shares: the state file and its typed reads (``ledger``, ``served``:
vkit.tune.ledger), the server it restarts (the service's, or a slot's: ``for_slot``) on its backend
(``server``: vkit.tune.server.ProcessServer, restart with rollback; on a Ray worker's node when the slot
is served there), the lease, and keep. Each phase is one object over it: ``measurer``
(vkit.tune.measurement: one run or capacity search, vkit.tune.onerun, validated, measured again
when the client was busy or the server died), ``trials`` (vkit.tune.trial: screening), ``baselines``
(vkit.tune.baseline), ``compare`` (vkit.tune.compare: gate at the measured σ), ``budget``
(vkit.tune.budget: runs, blocks and seconds), ``confirmer`` (vkit.tune.confirm), ``promise``
(vkit.tune.promise) and ``sentinel`` (vkit.tune.sentinel).

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
import os
from typing import Any, Callable

from vkit.apply.backend import PROCESS, Backend
from vkit.apply.lifecycle import Lifecycle
from vkit.apply.policy import Policy
from vkit.errors import ExitCode, VkitError
from vkit.interrupts import Interrupts
from vkit.jsonio import read_json_file
from vkit.state import StateFile, default_owner
from vkit.tune.config import Settings
from vkit.tune.ledger import Ledger
from vkit.tune.server import ProcessServer


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
        self.wire()

    def wire(self) -> None:
        """The narrow objects the steps call, each over this runner's server and state (again on a copy: ``for_slot``)."""
        from vkit.tune.baseline import Baselines
        from vkit.tune.budget import Budget
        from vkit.tune.compare import Compare
        from vkit.tune.confirm import Confirmer
        from vkit.tune.measurement import Measurer
        from vkit.tune.promise import Promise
        from vkit.tune.sentinel import Sentinel
        from vkit.tune.trial import Trials

        self.measurer, self.compare, self.budget = Measurer(self), Compare(self), Budget(self)
        self.baselines, self.promise, self.trials = Baselines(self), Promise(self), Trials(self)
        self.confirmer, self.sentinel = Confirmer(self), Sentinel(self)

    # -- slots (vkit.apply.slots) ---------------------------------------------
    @property
    def ledger(self) -> Ledger:
        """Typed reads of the tune's state file (trials, baselines, the kept configuration)."""
        return Ledger(self.sf)

    @property
    def served(self) -> Ledger:
        """Typed reads of the state file of the server this runner restarts (the service's, or its slot's)."""
        return Ledger(self.svc)

    def slots(self, live: bool = True) -> list[dict]:
        """The state's slots in order (``live``: those not taken out); [] for a state without slots."""
        return self.ledger.tune().slots(live)

    def for_slot(self, slot: dict) -> Runner:
        """A runner of the same run whose restarts and measurements go to ``slot``'s server (its own
        state file: lifecycle, rollback, ABNORMAL and lease per slot)."""
        r = copy.copy(self)
        r.svc = StateFile(os.path.join(self.sf.dir, slot["state"]))
        r.slot = slot["name"]
        r.wire()
        base = os.path.dirname(self.runs_dir) if self.slot else self.runs_dir
        r.runs_dir = os.path.join(base, slot["name"])  # each slot's runs apart: a trial retried elsewhere keeps its evidence
        os.makedirs(r.runs_dir, exist_ok=True)
        return r

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

    # -- state helpers ----------------------------------------------------
    def abs_path(self, rel: str) -> str:
        return rel if os.path.isabs(rel) else os.path.join(self.sf.dir, rel)

    def load(self, rel: str) -> dict:
        """A run's summary (``OSError``, ``ValueError`` propagate: a caller may skip a damaged run)."""
        return read_json_file(self.abs_path(rel))[0]

    def update_trial(self, tid: str, **fields: Any) -> dict:
        return self.sf.tune.update_trial(tid, **fields)

    def log(self, event: str, **kw: Any) -> str:
        return self.sf.log.append(self.tool_name, event, **kw)

    # -- the tools ----------------------------------------------------------
    @property
    def server(self) -> ProcessServer:
        """The server this runner restarts (the service's, or its slot's), on its backend."""
        return ProcessServer(self.svc, self.sf, self.owner, self.policy, self.interrupts, self.backend, self.s.ready_timeout_s)

    def running_config(self) -> dict | None:
        return self.server.running_config()

    def remote(self) -> bool:
        """This runner's slot is served on a Ray node (``vkit.tune.fleet``)."""
        return self.fleet is not None and self.slot is not None

    def apply(self, config: dict, fresh: bool = False) -> tuple[bool, dict]:
        """restart_with_rollback to ``config`` (``ProcessServer.apply``), on the slot's Ray worker when it is served there."""
        if self.remote():
            self.server.mirror_kept()
            ok, res = self.fleet.call(self, "apply", dict(config), fresh)
            return bool(ok), res
        return self.server.apply(config, fresh)

    def healthy(self, url: str) -> bool:
        if self.remote():
            return bool(self.fleet.call(self, "healthy", url))
        return self.server.healthy(url)

    def settle(self) -> None:
        """Between two trials or steps. In production (``--yes``) the service goes back to the kept
        configuration at once, so that it serves traffic on it between trials. In a sandbox it stays
        on whatever runs: the next trial restarts the server anyway, and the kept configuration is
        started when it must be measured or the tune ends (each rollback skipped is a restart saved)."""
        if not self.s.sandbox:
            self.restore_kept()

    def restore_kept(self, fresh: bool = False) -> None:
        kept = self.ledger.kept_config()
        ok, res = self.apply(dict(kept), fresh=fresh)
        if not ok:
            raise VkitError(f"the kept configuration does not start: {res.get('message')}", ExitCode.UNAVAILABLE)

    def keep(self, reason: str, decision: str, decision_id: str | None = None) -> str:
        """The applied candidate on this runner's server becomes the kept configuration (the lifecycle's
        keep, logged); on a slot, the tune's state records it too (the other slots copy it at their next restart)."""
        previous = self.ledger.tune().kept
        lc = Lifecycle(self.svc, self.tool_name, self.owner, progress=self.progress, policy=self.policy, backend=self.backend)
        did = lc.keep(reason=reason, decision=decision, decision_id=decision_id)
        if self.svc is not self.sf:
            k = self.served.server().kept
            self.sf.service.mirror_kept(k["config"], did, decision)
            if not self.sf.log.holds("keep", did):
                self.sf.log.append(self.tool_name, "keep", decision_id=did, config=k["config"], previous=previous, reason=reason,
                                   decision=decision, slot=self.slot)
        return did
