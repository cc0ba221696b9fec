"""The state file's typed writers, one small object per part of the document: ``leases``, ``service``,
``slots`` and ``tune`` on every :class:`vkit.state.StateFile`. Each writes its keys in one locked,
atomic transaction of the file (``StateFile.transaction``), and nothing else writes them."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Iterator

from vkit import environment
from vkit.errors import LeaseHeld, UsageError
from vkit.state import lease_staleness, make_lease, now_iso, upsert

if TYPE_CHECKING:
    from vkit.state import StateFile


class Leases:
    """The service's lease: who may restart it now (taken, renewed, released, broken by a human)."""

    def __init__(self, f: StateFile):
        self.f = f

    def acquire(self, owner: str, ttl_s: float, tool: str = "vkit") -> dict:
        """Take the service's lease for ``owner`` (renews it if ``owner`` holds it).

        A lease whose expiry passed, or whose holder process is gone (same host), is
        broken and the break is logged. A live lease held by someone else raises
        :class:`LeaseHeld` naming the holder and the expiry.
        """
        with self.f.transaction() as st:
            cur = st.get("lease")
            if cur and cur.get("owner") == owner and lease_staleness(cur) is None:
                # The same run (e.g. a tool the tune driver started with $VKIT_LEASE_OWNER): extend, keep the holder pid.
                cur["expires"] = max(cur.get("expires", 0), time.time() + ttl_s)
                return dict(cur, renewed=True)
            if cur and cur.get("owner") != owner:
                stale = lease_staleness(cur)
                if stale is None:
                    raise LeaseHeld(
                        f"the lease on this service is held by {cur.get('owner')} (pid {cur.get('pid')} on "
                        f"{cur.get('host')}) until {now_iso(cur.get('expires'))}; wait for it, or run "
                        f"`state --break-lease` if that run is dead"
                    )
                self.f.log.append(tool, "lease_broken", previous=cur, reason=stale, by=owner)
            lease = make_lease(owner, ttl_s)
            st["lease"] = lease
            return dict(lease)

    def renew(self, owner: str, ttl_s: float) -> dict:
        with self.f.transaction() as st:
            cur = st.get("lease")
            if not cur or cur.get("owner") != owner:
                holder = cur.get("owner") if cur else "nobody"
                raise LeaseHeld(f"cannot renew: the lease is held by {holder}, not {owner}")
            cur["expires"] = time.time() + ttl_s
            return dict(cur)

    def release(self, owner: str) -> bool:
        with self.f.transaction() as st:
            cur = st.get("lease")
            if cur and cur.get("owner") == owner:
                st["lease"] = None
                return True
            return False

    @contextlib.contextmanager
    def hold(self, owner: str, ttl_s: float = 3600.0, tool: str = "vkit") -> Iterator[dict]:
        """Hold the lease for the block; released at the end only if this call took it
        (a lease inherited from a parent run stays with the parent)."""
        lease = self.acquire(owner, ttl_s, tool=tool)
        try:
            yield lease
        finally:
            if not lease.get("renewed"):
                with contextlib.suppress(Exception):
                    self.release(owner)

    def force_break(self, tool: str, reason: str | None) -> tuple[dict | None, str | None, str | None]:
        """A human breaks the lease (logged): (the lease, why it looked stale or None if live, the decision id)."""
        with self.f.transaction() as st:
            lease = st.get("lease")
            if not lease:
                return None, None, None
            stale = lease_staleness(lease)
            did = self.f.log.append(tool, "lease_broken", previous=lease, reason=reason or stale or "broken by a human", by="human")
            st["lease"] = None
            return lease, stale, did


class Service:
    """The service, its candidate and the kept configuration (vkit.apply.lifecycle), ABNORMAL, the environment
    and the drift gate reads."""

    def __init__(self, f: StateFile):
        self.f = f

    def clear_abnormal(self, tool: str, reason: str) -> tuple[dict | None, str | None]:
        """A human clears ABNORMAL (logged): (the flag it held, the decision id), (None, None) when it was not set."""
        with self.f.transaction() as st:
            ab = st.get("abnormal") or {}
            if not ab.get("flag"):
                return None, None
            did = self.f.log.append(tool, "abnormal_cleared", previous=ab, reason=reason, by="human")
            st["abnormal"] = {"flag": False, "reason": None, "since": None, "cleared_by": did}
            st["start_failures"] = 0
            return ab, did

    def set_machine_state(self, state: str) -> None:
        with self.f.transaction() as st:
            st["machine_state"] = state

    def set_running(self, running: dict | None) -> None:
        """``service.running``: the process vkit started last (its pid, pgid, log, config, role), None once stopped."""
        with self.f.transaction() as st:
            st["service"]["running"] = running

    def begin_candidate(self, candidate: dict) -> None:
        """A restart begins: ``candidate`` (its config, changes, owner) is applying (machine state APPLY)."""
        with self.f.transaction() as st:
            st["candidate"] = dict(candidate, status="applying")
            st["machine_state"] = "APPLY"

    def candidate_applied(self, startup: dict, checks: list[str]) -> None:
        """The candidate started and passed ``checks``: the failure count resets (machine state VERIFY)."""
        with self.f.transaction() as st:
            st["start_failures"] = 0
            st["candidate"].update(status="applied", checks=list(checks), startup=startup)
            st["service"]["startup"] = startup
            st["machine_state"] = "VERIFY"

    def candidate_failed(self, diagnosis: dict) -> int:
        """The candidate did not start: recorded with ``diagnosis``; returns the consecutive failures."""
        with self.f.transaction() as st:
            st["start_failures"] = int(st.get("start_failures", 0)) + 1
            st["candidate"].update(status="failed", diagnosis=diagnosis)
            return st["start_failures"]

    def forgive_start_failure(self) -> None:
        """The last start failure was the answer sought (a memory probe of step 4m), not a fault:
        it does not count toward the two-failures-in-a-row rule."""
        with self.f.transaction() as st:
            st["start_failures"] = 0

    def rolled_back(self, startup: dict) -> None:
        """The kept configuration runs again (machine state REVERT); an unfinished candidate is rolled back."""
        with self.f.transaction() as st:
            if st.get("candidate") and st["candidate"].get("status") in ("applying", "failed", "applied"):
                st["candidate"]["status"] = "rolled_back"
            st["service"]["startup"] = startup
            st["machine_state"] = "REVERT"

    def set_kept(self, config: dict, decision_id: str, decision: str) -> None:
        """The applied candidate becomes the kept configuration, the rollback target (machine state KEEP)."""
        with self.f.transaction() as st:
            st["kept"] = {"config": dict(config), "decision_id": decision_id, "since": now_iso(), "decision": decision}
            st["candidate"]["status"] = "kept"
            if st["service"].get("running"):
                st["service"]["running"]["role"] = "kept"
            st["machine_state"] = "KEEP"

    def set_abnormal(self, reason: str, decision_id: str) -> None:
        """Mark the environment ABNORMAL: every later restart refuses until ``clear_abnormal``."""
        with self.f.transaction() as st:
            st["abnormal"] = {"flag": True, "reason": reason, "since": now_iso(), "decision_id": decision_id}

    def mirror_kept(self, config: dict, decision_id: str | None, decision: str | None, frozen: dict | None = None) -> bool:
        """The kept configuration decided elsewhere (on a slot, or by the tune for its slots) recorded
        here without a candidate of this file's own; ``frozen`` replaces the frozen parameters. True when
        something changed."""
        with self.f.transaction() as st:
            before = (st["kept"].get("config"), st["kept"].get("decision_id"), st.get("frozen"))
            if st["kept"].get("config") != config or st["kept"].get("decision_id") != decision_id:
                st["kept"] = {"config": dict(config), "decision_id": decision_id, "since": now_iso(), "decision": decision}
            if frozen is not None:
                st["frozen"] = dict(frozen)
            return before != (st["kept"].get("config"), st["kept"].get("decision_id"), st.get("frozen"))

    def note_fingerprint(self, tool: str, fp: dict, run: str | None = None) -> list[dict]:
        """A run measured in environment ``fp``: the state's ``fingerprint`` becomes the last seen one;
        a change in a field that matters (:data:`vkit.environment.COMPARED`) against the one before
        is logged as ``environment_changed`` and returned (``[{"field", "old", "new"}]``)."""
        with self.f.transaction() as st:
            prev = st.get("fingerprint") or {}
            found = environment.changes(prev, fp)
            if found:
                self.f.log.append(tool, "environment_changed", run=run, changes=found, fingerprint=fp)
            st["fingerprint"] = environment.merged(prev, fp)
            return found

    def record_drift(self, result: dict) -> None:
        """drift --record: the result gate reads (``drift.change_date``)."""
        with self.f.transaction() as st:
            # A change restarts the kept configuration's series (as tune's sentinel does); otherwise its start stays.
            reset = now_iso() if result.get("changed") else (st.get("drift") or {}).get("reset")
            st["drift"] = dict(result, reset=reset)


class Slots:
    """The slots (vkit.apply.slots): their A/A effects, their failures and their removal."""

    def __init__(self, f: StateFile):
        self.f = f

    def set_effects(self, rec: dict) -> None:
        """The slots' A/A pass (``vkit.tune.steps.baseline_beside_aa``): per metric, each slot's level and the spreads."""
        with self.f.transaction() as st:
            st["slot_effects"] = rec

    def failed(self, name: str, reason: str) -> int:
        """A trial on slot ``name`` failed for the slot's sake (its server died, it went ABNORMAL):
        returns the slot's consecutive failures."""
        with self.f.transaction() as st:
            s = _slot(st, name)
            s["failures"] = int(s.get("failures") or 0) + 1
            s["last_failure"] = {"reason": reason, "at": now_iso()}
            return s["failures"]

    def ok(self, name: str) -> None:
        """A trial finished on slot ``name``: its consecutive failures reset."""
        with self.f.transaction() as st:
            _slot(st, name)["failures"] = 0

    def take_out(self, name: str, reason: str, decision_id: str) -> None:
        """Slot ``name`` serves no more trials of this state (a human puts it back with ``state --slot-in``)."""
        with self.f.transaction() as st:
            _slot(st, name)["out"] = {"reason": reason, "since": now_iso(), "decision_id": decision_id}

    def put_in(self, name: str) -> dict | None:
        """Slot ``name`` serves trials again (its failures reset); returns why it was out (None: it was in)."""
        with self.f.transaction() as st:
            s = _slot(st, name)
            was, s["out"], s["failures"] = s.get("out"), None, 0
            return was


class TuneRecords:
    """A tuning run's records (vkit.tune): the run, its trials, baselines, confirmations, steps and time."""

    def __init__(self, f: StateFile):
        self.f = f

    TUNE_RUN_KEYS = ("tune", "steps", "baseline", "baseline_mixed", "confirmations", "trials", "drift_checks",
                     "capacity_reference", "run_starts", "timing", "start_baseline")

    # archived, then cleared for the next run (``tune`` is replaced, ``trials`` emptied)
    _CLEARED = tuple(k for k in TUNE_RUN_KEYS if k not in ("tune", "trials"))

    def start(self, cfg: dict, archive: bool) -> None:
        """A new tuning run: with ``archive``, the previous run's records move to ``archive`` first."""
        if archive:
            with self.f.transaction() as st:
                st.setdefault("archive", []).append({k: st.get(k) for k in self.TUNE_RUN_KEYS})
                for k in self._CLEARED:
                    st.pop(k, None)
                st["trials"] = []
        with self.f.transaction() as st:
            st["tune"] = cfg

    def update(self, **fields: Any) -> None:
        """Facts of the tuning run under way (``tune``): knowledge base, report, finished."""
        with self.f.transaction() as st:
            st["tune"].update(fields)

    def add_trial(self, step: str, config: dict, reason: str, proposal: dict) -> dict:
        """A proposed trial, numbered after the trials recorded (``t001``, ...); returns it."""
        with self.f.transaction() as st:
            kept = st["kept"]["config"]
            t = {"id": f"t{len(st['trials']) + 1:03d}", "step": step, "config": dict(config),
                 "changes": {k: v for k, v in config.items() if kept.get(k) != v},
                 "status": "proposed", "runs": [], "checks": [], "valid": None, "metrics": {}, "verdict": None,
                 "why": reason, "kept": False, "decision_id": None, "proposal": proposal, "started": now_iso()}
            st["trials"].append(t)
            return t

    def update_trial(self, trial_id: str, **fields: Any) -> dict:
        """Facts of trial ``trial_id`` as it goes (status, runs, verdict, ...); returns a copy. KeyError if none."""
        with self.f.transaction() as st:
            for t in st["trials"]:
                if t["id"] == trial_id:
                    t.update(fields)
                    return dict(t)
        raise KeyError(trial_id)

    def record_trial_verdict(self, trial_id: str, verdict: str, gate: dict) -> None:
        """gate --record: the verdict and its summary into trial ``trial_id``."""
        with self.f.transaction() as st:
            for t in st.get("trials") or []:
                if isinstance(t, dict) and str(t.get("id")) == str(trial_id):
                    t["verdict"] = verdict
                    t["gate"] = gate

    def set_baseline(self, key: str, record: dict, final: bool = False) -> None:
        """A baseline record (``baseline``, ``baseline_mixed``, ``ablate-...``); ``final`` for the main one
        also makes its σ the run's ``sigma_baseline`` and its runs the kept configuration's repeats."""
        with self.f.transaction() as st:
            st[key] = record
            if final and key == "baseline":
                if not record.get("rebased_from") and ("start_baseline" not in st or record.get("remeasure_of")):
                    # where the tune started: the first final baseline (or its re-measure), before any keep rebased it
                    st["start_baseline"] = {k: record.get(k) for k in ("config", "runs", "metrics", "sigma")}
                st["sigma_baseline"] = record["sigma"]
                st["sigma_components"] = record.get("components") or {}
                st["kept"]["repeats"] = list(record["runs"])

    def save_confirmation(self, conf: dict, list_key: str = "confirmations") -> None:
        """A confirmation (``confirmations``) or delivery confirmation, replacing the trial's earlier one."""
        with self.f.transaction() as st:
            upsert(st.setdefault(list_key, []), conf, "trial_id")

    def record_run_start(self, path: str, start: str | None, seconds: float | None = None) -> None:
        """Which server process (``pid:ticks``) measured run ``path``: runs grouped by start give the
        within-process and between-restart parts of σ. With ``seconds``, the run's duration is added
        to the time accounting in the same write (``add_time("run", ...)``)."""
        with self.f.transaction() as st:
            st.setdefault("run_starts", {})[path] = start
            if seconds is not None:
                _add_time(st, "run", seconds)

    def add_time(self, kind: str, seconds: float) -> dict:
        """One more ``kind`` (``restart`` or ``run``) that took ``seconds``: the tuning run's time
        accounting and the source of its ETA. Returns the new totals of that kind."""
        with self.f.transaction() as st:
            return _add_time(st, kind, seconds)

    def add_kept_repeat(self, path: str) -> None:
        """One more run of the kept configuration (a drift sentinel)."""
        with self.f.transaction() as st:
            st["kept"]["repeats"] = list(st["kept"].get("repeats") or []) + [path]

    def record_drift_check(self, check: dict, drift: dict | None = None) -> None:
        """A sentinel's drift check; with ``drift``, the change it found (``drift``: what gate reads)."""
        with self.f.transaction() as st:
            st.setdefault("drift_checks", []).append(check)
            if drift is not None:
                st["drift"] = drift

    def record_step(self, rec: dict) -> None:
        """A step's record (its trials, stop rule, result), replacing the step's earlier one."""
        with self.f.transaction() as st:
            upsert(st.setdefault("steps", []), rec, "step")

    def freeze(self, param: str, value: Any) -> None:
        """``param`` is frozen at ``value``: no later step may change it."""
        with self.f.transaction() as st:
            st.setdefault("frozen", {})[param] = value

    def set_capacity_reference(self, ref: dict) -> None:
        """The capacity objective's reference load (tune: set once, from the first baseline search)."""
        with self.f.transaction() as st:
            st["capacity_reference"] = ref

    def record_ablation(self, rec: dict) -> None:
        """An ablation's result (which switch of a multi-parameter change paid)."""
        with self.f.transaction() as st:
            st.setdefault("ablations", []).append(rec)


def _slot(st: dict, name: str) -> dict:
    for s in st.get("slots") or []:
        if s["name"] == name:
            return s
    raise UsageError(f"this state has no slot {name!r}; its slots: {', '.join(x['name'] for x in st.get('slots') or []) or 'none'}")


def _add_time(st: dict, kind: str, seconds: float) -> dict:
    t = st.setdefault("timing", {}).setdefault(kind, {"n": 0, "s": 0.0})
    t["n"] += 1
    t["s"] = round(t["s"] + float(seconds), 3)
    return dict(t)
