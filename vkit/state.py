"""The JSON state file every vkit tool shares, its lease, and the decision log.

Only this module reads or writes the state file, and only its accessors (``set_kept``,
``add_trial``, ``record_step``, ...) write the document's keys: every other module calls them.
Every read-modify-write holds an ``flock`` on a sibling lock file; every write goes to a temp
file in the same directory, is fsynced and then ``os.replace``d over the old one, so a reader
sees either the old state or the new one, never a torn file. Before each write the
previous good state is copied to ``<file>.bak`` so a damaged file can be restored.

A corrupted or truncated file is never reset silently: loading it raises
:class:`StateCorrupt` naming the file and the last good backup.
"""

from __future__ import annotations

import contextlib
import copy
import datetime as _dt
import errno
import fcntl
import glob
import json
import os
import socket
import time
import uuid
from typing import Any, Iterator

from vkit import __version__, environment
from vkit.errors import LeaseHeld, StateCorrupt, StateMissing, StateWriteError, UsageError
from vkit.jsonio import read_json_lines

SCHEMA_VERSION = 1
ENOSPC_HOOK = "VKIT_TEST_ENOSPC_FILE"  # test hook: see _test_hook_enospc

# Run-level states (seed 004 §6); ABNORMAL is a flag on top of them.
MACHINE_STATES = ("INIT", "LEASE", "BASELINE", "PROPOSE", "APPLY", "VERIFY", "VALIDATE", "GATE", "KEEP", "REVERT", "CONVERGE")


def now_iso(t: float | None = None) -> str:
    return _dt.datetime.fromtimestamp(time.time() if t is None else t, _dt.timezone.utc).isoformat(timespec="seconds")


def upsert(items: list, item: dict, key: str) -> None:
    """Replace the entry of ``items`` whose ``key`` equals ``item``'s, else append ``item``."""
    for i, x in enumerate(items):
        if x[key] == item[key]:
            items[i] = item
            return
    items.append(item)


def new_state(url: str, model: str, launch_argv: list[str], kept_config: dict | None = None, *,
              launch: dict | None = None, fingerprint: dict | None = None, decision_id: str | None = None,
              slots: list[dict] | None = None) -> dict:
    """A fresh state document for one service; ``launch`` replaces the argv launch (hook mode),
    ``decision_id`` is the decision that set the kept configuration (its ``since`` is now);
    ``slots`` the accelerator groups that serve copies of it (``vkit.apply.slots``; none: one slot,
    the service itself)."""
    doc = {
        "schema_version": SCHEMA_VERSION,
        "created": now_iso(),
        "service": {
            "url": url,
            "model": model,
            "launch": dict(launch) if launch is not None else {"mode": "argv", "argv": list(launch_argv)},
            "running": None,  # the process vkit started last: pid, pgid, ticks, log, argv, config, role
            "startup": {},  # facts from the last successful start: ready_s, kv_cache_tokens, max_concurrency
        },
        "fingerprint": dict(fingerprint or {}),
        "kept": {"config": dict(kept_config or {}), "decision_id": decision_id, "since": now_iso() if decision_id else None},
        "candidate": None,
        "frozen": {},
        "trials": [],
        "sigma_baseline": {},
        "machine_state": "INIT",
        "start_failures": 0,
        "abnormal": {"flag": False, "reason": None, "since": None},
        "lease": None,
    }
    if slots:
        doc["slots"] = [dict(x, failures=0, out=None) for x in slots]
    return doc


def launch_argv(st: dict) -> list[str]:
    """The argv ``state init`` recorded for the service (hook mode: the start hook), as the
    environment fingerprint reads it."""
    launch = st["service"]["launch"]
    return list(launch.get("start_hook") or launch.get("argv") or [])


def _add_time(st: dict, kind: str, seconds: float) -> dict:
    t = st.setdefault("timing", {}).setdefault(kind, {"n": 0, "s": 0.0})
    t["n"] += 1
    t["s"] = round(t["s"] + float(seconds), 3)
    return dict(t)


def _check_schema(doc: Any, path: str) -> dict:
    if not isinstance(doc, dict):
        raise ValueError("top level is not a JSON object")
    v = doc.get("schema_version")
    if v != SCHEMA_VERSION:
        raise ValueError(f"schema_version is {v!r}, this vkit reads {SCHEMA_VERSION}")
    for key in ("service", "kept", "trials"):
        if key not in doc:
            raise ValueError(f"missing key {key!r}")
    return doc


def _dumps(doc: dict) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def _fsync_dir(d: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically: temp file beside it, fsync, replace.

    On any failure the temp file is removed, the old file is untouched, and
    :class:`StateWriteError` says why.
    """
    d = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    tmp = None
    try:
        _test_hook_enospc()
        fd, tmp = _mkstemp(d, base)
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        _fsync_dir(d)
    except OSError as e:
        reason = os.strerror(e.errno) if e.errno else str(e)
        raise StateWriteError(f"could not write {path}: {reason}; the previous state is intact") from e
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _test_hook_enospc() -> None:
    """A test hook for the chaos benchmark (bench/bench_chaos.py): while the file named by
    ``$VKIT_TEST_ENOSPC_FILE`` exists, every atomic write fails as on a full disk (ENOSPC)."""
    flag = os.environ.get(ENOSPC_HOOK)
    if flag and os.path.exists(flag):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _mkstemp(d: str, base: str) -> tuple[int, str]:
    import tempfile

    return tempfile.mkstemp(dir=d, prefix=f".{base}.", suffix=".tmp")


class StateFile:
    """One state file: ``path``, its lock ``path.lock``, backup ``path.bak`` and
    decision log ``decisions.jsonl`` in the same directory."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)
        self.dir = os.path.dirname(self.path)
        self.lock_path = self.path + ".lock"
        self.backup_path = self.path + ".bak"
        self.log = DecisionLog(os.path.join(self.dir, "decisions.jsonl"))

    # -- locking -------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self, exclusive: bool = True) -> Iterator[None]:
        try:
            os.makedirs(self.dir, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            if exclusive:
                raise StateWriteError(f"cannot open lock file {self.lock_path}: {os.strerror(e.errno or 0)}") from e
            # A read-only place: readers may proceed without the lock; writes are atomic anyway.
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing drops the flock

    # -- reading -------------------------------------------------------
    def exists(self) -> bool:
        return os.path.exists(self.path)

    def _load_unlocked(self) -> dict:
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            raise StateMissing(
                f"no state file at {self.path}; run `state init --url URL --model NAME -- SERVE ARGV...` first"
            ) from None
        except OSError as e:
            raise StateCorrupt(f"cannot read state file {self.path}: {os.strerror(e.errno or 0)}") from e
        try:
            return _check_schema(json.loads(text), self.path)
        except (ValueError, UnicodeDecodeError) as e:
            msg = str(e)
            raise StateCorrupt(
                f"state file {self.path} is corrupted or truncated ({msg}); {self._backup_hint()}"
            ) from None

    def _backup_hint(self) -> str:
        if os.path.exists(self.backup_path):
            try:
                with open(self.backup_path, encoding="utf-8") as f:
                    _check_schema(json.load(f), self.backup_path)
                return f"last good backup: {self.backup_path} (inspect it, then `cp {self.backup_path} {self.path}`)"
            except (OSError, ValueError):
                return f"the backup {self.backup_path} is damaged too; re-create the state with `state init --force`"
        return "there is no backup; re-create the state with `state init --force`"

    def read(self) -> dict:
        """A consistent snapshot of the state (shared lock)."""
        with self._locked(exclusive=False):
            return self._load_unlocked()

    # -- writing -------------------------------------------------------
    def _write_unlocked(self, doc: dict, previous_text: str | None) -> None:
        _check_schema(doc, self.path)
        doc["updated"] = now_iso()
        if previous_text is not None:
            atomic_write_text(self.backup_path, previous_text)
        atomic_write_text(self.path, _dumps(doc))

    def _sweep_temps(self) -> None:
        # Called with the exclusive lock held: no writer is active, so any temp file is debris
        # from a writer that was killed mid-write.
        for p in glob.glob(os.path.join(self.dir, f".{os.path.basename(self.path)}.*.tmp")) + glob.glob(
            os.path.join(self.dir, f".{os.path.basename(self.backup_path)}.*.tmp")
        ):
            with contextlib.suppress(OSError):
                os.unlink(p)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[dict]:
        """Read-modify-write under the exclusive lock; written only if the block succeeds
        and changed something."""
        with self._locked(exclusive=True):
            self._sweep_temps()
            doc = self._load_unlocked()
            before = _dumps(doc)
            yield doc
            if _dumps(doc) != before:
                self._write_unlocked(doc, before)

    def create(self, doc: dict, force: bool = False) -> None:
        """Write a new state file; refuses to replace an existing one unless ``force``."""
        with self._locked(exclusive=True):
            self._sweep_temps()
            previous = None
            if os.path.exists(self.path):
                if not force:
                    raise UsageError(f"state file {self.path} already exists; pass --force to replace it (a backup is kept)")
                with contextlib.suppress(OSError):
                    with open(self.path, encoding="utf-8") as f:
                        previous = f.read()
            self._write_unlocked(doc, previous)

    # -- lease ---------------------------------------------------------
    def acquire_lease(self, owner: str, ttl_s: float, tool: str = "vkit") -> dict:
        """Take the service's lease for ``owner`` (renews it if ``owner`` holds it).

        A lease whose expiry passed, or whose holder process is gone (same host), is
        broken and the break is logged. A live lease held by someone else raises
        :class:`LeaseHeld` naming the holder and the expiry.
        """
        with self.transaction() as st:
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
                self.log.append(tool, "lease_broken", previous=cur, reason=stale, by=owner)
            lease = make_lease(owner, ttl_s)
            st["lease"] = lease
            return dict(lease)

    def renew_lease(self, owner: str, ttl_s: float) -> dict:
        with self.transaction() as st:
            cur = st.get("lease")
            if not cur or cur.get("owner") != owner:
                holder = cur.get("owner") if cur else "nobody"
                raise LeaseHeld(f"cannot renew: the lease is held by {holder}, not {owner}")
            cur["expires"] = time.time() + ttl_s
            return dict(cur)

    def release_lease(self, owner: str) -> bool:
        with self.transaction() as st:
            cur = st.get("lease")
            if cur and cur.get("owner") == owner:
                st["lease"] = None
                return True
            return False

    @contextlib.contextmanager
    def lease(self, owner: str, ttl_s: float = 3600.0, tool: str = "vkit") -> Iterator[dict]:
        """Hold the lease for the block; released at the end only if this call took it
        (a lease inherited from a parent run stays with the parent)."""
        lease = self.acquire_lease(owner, ttl_s, tool=tool)
        try:
            yield lease
        finally:
            if not lease.get("renewed"):
                with contextlib.suppress(Exception):
                    self.release_lease(owner)


    # -- what the tools record: the document's keys are written by these accessors, nowhere else --
    def clear_abnormal(self, tool: str, reason: str) -> tuple[dict | None, str | None]:
        """A human clears ABNORMAL (logged): (the flag it held, the decision id), (None, None) when it was not set."""
        with self.transaction() as st:
            ab = st.get("abnormal") or {}
            if not ab.get("flag"):
                return None, None
            did = self.log.append(tool, "abnormal_cleared", previous=ab, reason=reason, by="human")
            st["abnormal"] = {"flag": False, "reason": None, "since": None, "cleared_by": did}
            st["start_failures"] = 0
            return ab, did

    def break_lease(self, tool: str, reason: str | None) -> tuple[dict | None, str | None, str | None]:
        """A human breaks the lease (logged): (the lease, why it looked stale or None if live, the decision id)."""
        with self.transaction() as st:
            lease = st.get("lease")
            if not lease:
                return None, None, None
            stale = lease_staleness(lease)
            did = self.log.append(tool, "lease_broken", previous=lease, reason=reason or stale or "broken by a human", by="human")
            st["lease"] = None
            return lease, stale, did

    def record_trial_verdict(self, trial_id: str, verdict: str, gate: dict) -> None:
        """gate --record: the verdict and its summary into trial ``trial_id``."""
        with self.transaction() as st:
            for t in st.get("trials") or []:
                if isinstance(t, dict) and str(t.get("id")) == str(trial_id):
                    t["verdict"] = verdict
                    t["gate"] = gate

    def note_fingerprint(self, tool: str, fp: dict, run: str | None = None) -> list[dict]:
        """A run measured in environment ``fp``: the state's ``fingerprint`` becomes the last seen one;
        a change in a field that matters (:data:`vkit.environment.COMPARED`) against the one before
        is logged as ``environment_changed`` and returned (``[{"field", "old", "new"}]``)."""
        with self.transaction() as st:
            prev = st.get("fingerprint") or {}
            found = environment.changes(prev, fp)
            if found:
                self.log.append(tool, "environment_changed", run=run, changes=found, fingerprint=fp)
            st["fingerprint"] = environment.merged(prev, fp)
            return found

    def record_drift(self, result: dict) -> None:
        """drift --record: the result gate reads (``drift.change_date``)."""
        with self.transaction() as st:
            # A change restarts the kept configuration's series (as tune's sentinel does); otherwise its start stays.
            reset = now_iso() if result.get("changed") else (st.get("drift") or {}).get("reset")
            st["drift"] = dict(result, reset=reset)

    TUNE_RUN_KEYS = ("tune", "steps", "baseline", "baseline_mixed", "confirmations", "trials", "drift_checks",
                     "capacity_reference", "run_starts", "timing")
    # archived, then cleared for the next run (``tune`` is replaced, ``trials`` emptied)
    _CLEARED = tuple(k for k in TUNE_RUN_KEYS if k not in ("tune", "trials"))

    def start_tune_run(self, cfg: dict, archive: bool) -> None:
        """A new tuning run: with ``archive``, the previous run's records move to ``archive`` first."""
        if archive:
            with self.transaction() as st:
                st.setdefault("archive", []).append({k: st.get(k) for k in self.TUNE_RUN_KEYS})
                for k in self._CLEARED:
                    st.pop(k, None)
                st["trials"] = []
        with self.transaction() as st:
            st["tune"] = cfg

    def update_tune_run(self, **fields: Any) -> None:
        """Facts of the tuning run under way (``tune``): knowledge base, report, finished."""
        with self.transaction() as st:
            st["tune"].update(fields)

    def set_machine_state(self, state: str) -> None:
        with self.transaction() as st:
            st["machine_state"] = state

    # -- the service, its candidate and the kept configuration (vkit.apply.lifecycle) ----------
    def set_running(self, running: dict | None) -> None:
        """``service.running``: the process vkit started last (its pid, pgid, log, config, role), None once stopped."""
        with self.transaction() as st:
            st["service"]["running"] = running

    def begin_candidate(self, candidate: dict) -> None:
        """A restart begins: ``candidate`` (its config, changes, owner) is applying (machine state APPLY)."""
        with self.transaction() as st:
            st["candidate"] = dict(candidate, status="applying")
            st["machine_state"] = "APPLY"

    def candidate_applied(self, startup: dict, checks: list[str]) -> None:
        """The candidate started and passed ``checks``: the failure count resets (machine state VERIFY)."""
        with self.transaction() as st:
            st["start_failures"] = 0
            st["candidate"].update(status="applied", checks=list(checks), startup=startup)
            st["service"]["startup"] = startup
            st["machine_state"] = "VERIFY"

    def candidate_failed(self, diagnosis: dict) -> int:
        """The candidate did not start: recorded with ``diagnosis``; returns the consecutive failures."""
        with self.transaction() as st:
            st["start_failures"] = int(st.get("start_failures", 0)) + 1
            st["candidate"].update(status="failed", diagnosis=diagnosis)
            return st["start_failures"]

    def forgive_start_failure(self) -> None:
        """The last start failure was the answer sought (a memory probe of step 4m), not a fault:
        it does not count toward the two-failures-in-a-row rule."""
        with self.transaction() as st:
            st["start_failures"] = 0

    def rolled_back(self, startup: dict) -> None:
        """The kept configuration runs again (machine state REVERT); an unfinished candidate is rolled back."""
        with self.transaction() as st:
            if st.get("candidate") and st["candidate"].get("status") in ("applying", "failed", "applied"):
                st["candidate"]["status"] = "rolled_back"
            st["service"]["startup"] = startup
            st["machine_state"] = "REVERT"

    def mirror_remote(self, doc: dict) -> None:
        """A copy of a state held elsewhere (``vkit.tune.fleet``): a slot's state as its node holds it, on the
        driver; the tune's state as the driver holds it, on the node. Copied whole."""
        with self.transaction() as st:
            st.clear()
            st.update(doc)

    def set_slot_effects(self, rec: dict) -> None:
        """The slots' A/A pass (``vkit.tune.steps.baseline_beside_aa``): per metric, each slot's level and the spreads."""
        with self.transaction() as st:
            st["slot_effects"] = rec

    def set_kept(self, config: dict, decision_id: str, decision: str) -> None:
        """The applied candidate becomes the kept configuration, the rollback target (machine state KEEP)."""
        with self.transaction() as st:
            st["kept"] = {"config": dict(config), "decision_id": decision_id, "since": now_iso(), "decision": decision}
            st["candidate"]["status"] = "kept"
            if st["service"].get("running"):
                st["service"]["running"]["role"] = "kept"
            st["machine_state"] = "KEEP"

    def set_abnormal(self, reason: str, decision_id: str) -> None:
        """Mark the environment ABNORMAL: every later restart refuses until ``clear_abnormal``."""
        with self.transaction() as st:
            st["abnormal"] = {"flag": True, "reason": reason, "since": now_iso(), "decision_id": decision_id}

    def mirror_kept(self, config: dict, decision_id: str | None, decision: str | None, frozen: dict | None = None) -> bool:
        """The kept configuration decided elsewhere (on a slot, or by the tune for its slots) recorded
        here without a candidate of this file's own; ``frozen`` replaces the frozen parameters. True when
        something changed."""
        with self.transaction() as st:
            before = (st["kept"].get("config"), st["kept"].get("decision_id"), st.get("frozen"))
            if st["kept"].get("config") != config or st["kept"].get("decision_id") != decision_id:
                st["kept"] = {"config": dict(config), "decision_id": decision_id, "since": now_iso(), "decision": decision}
            if frozen is not None:
                st["frozen"] = dict(frozen)
            return before != (st["kept"].get("config"), st["kept"].get("decision_id"), st.get("frozen"))

    # -- slots (vkit.apply.slots): their failures and their removal -------------------------------
    def slot_failed(self, name: str, reason: str) -> int:
        """A trial on slot ``name`` failed for the slot's sake (its server died, it went ABNORMAL):
        returns the slot's consecutive failures."""
        with self.transaction() as st:
            s = _slot(st, name)
            s["failures"] = int(s.get("failures") or 0) + 1
            s["last_failure"] = {"reason": reason, "at": now_iso()}
            return s["failures"]

    def slot_ok(self, name: str) -> None:
        """A trial finished on slot ``name``: its consecutive failures reset."""
        with self.transaction() as st:
            _slot(st, name)["failures"] = 0

    def take_slot_out(self, name: str, reason: str, decision_id: str) -> None:
        """Slot ``name`` serves no more trials of this state (a human puts it back with ``state --slot-in``)."""
        with self.transaction() as st:
            _slot(st, name)["out"] = {"reason": reason, "since": now_iso(), "decision_id": decision_id}

    def put_slot_in(self, name: str) -> dict | None:
        """Slot ``name`` serves trials again (its failures reset); returns why it was out (None: it was in)."""
        with self.transaction() as st:
            s = _slot(st, name)
            was, s["out"], s["failures"] = s.get("out"), None, 0
            return was

    # -- a tuning run's records (vkit.tune) ------------------------------------------------------
    def add_trial(self, step: str, config: dict, reason: str, proposal: dict) -> dict:
        """A proposed trial, numbered after the trials recorded (``t001``, ...); returns it."""
        with self.transaction() as st:
            kept = st["kept"]["config"]
            t = {"id": f"t{len(st['trials']) + 1:03d}", "step": step, "config": dict(config),
                 "changes": {k: v for k, v in config.items() if kept.get(k) != v},
                 "status": "proposed", "runs": [], "checks": [], "valid": None, "metrics": {}, "verdict": None,
                 "why": reason, "kept": False, "decision_id": None, "proposal": proposal, "started": now_iso()}
            st["trials"].append(t)
            return t

    def update_trial(self, trial_id: str, **fields: Any) -> dict:
        """Facts of trial ``trial_id`` as it goes (status, runs, verdict, ...); returns a copy. KeyError if none."""
        with self.transaction() as st:
            for t in st["trials"]:
                if t["id"] == trial_id:
                    t.update(fields)
                    return dict(t)
        raise KeyError(trial_id)

    def set_baseline(self, key: str, record: dict, final: bool = False) -> None:
        """A baseline record (``baseline``, ``baseline_mixed``, ``ablate-...``); ``final`` for the main one
        also makes its σ the run's ``sigma_baseline`` and its runs the kept configuration's repeats."""
        with self.transaction() as st:
            st[key] = record
            if final and key == "baseline":
                st["sigma_baseline"] = record["sigma"]
                st["sigma_components"] = record.get("components") or {}
                st["kept"]["repeats"] = list(record["runs"])

    def save_confirmation(self, conf: dict, list_key: str = "confirmations") -> None:
        """A confirmation (``confirmations``) or delivery confirmation, replacing the trial's earlier one."""
        with self.transaction() as st:
            upsert(st.setdefault(list_key, []), conf, "trial_id")

    def record_run_start(self, path: str, start: str | None, seconds: float | None = None) -> None:
        """Which server process (``pid:ticks``) measured run ``path``: runs grouped by start give the
        within-process and between-restart parts of σ. With ``seconds``, the run's duration is added
        to the time accounting in the same write (``add_time("run", ...)``)."""
        with self.transaction() as st:
            st.setdefault("run_starts", {})[path] = start
            if seconds is not None:
                _add_time(st, "run", seconds)

    def add_time(self, kind: str, seconds: float) -> dict:
        """One more ``kind`` (``restart`` or ``run``) that took ``seconds``: the tuning run's time
        accounting and the source of its ETA. Returns the new totals of that kind."""
        with self.transaction() as st:
            return _add_time(st, kind, seconds)

    def add_kept_repeat(self, path: str) -> None:
        """One more run of the kept configuration (a drift sentinel)."""
        with self.transaction() as st:
            st["kept"]["repeats"] = list(st["kept"].get("repeats") or []) + [path]

    def record_drift_check(self, check: dict, drift: dict | None = None) -> None:
        """A sentinel's drift check; with ``drift``, the change it found (``drift``: what gate reads)."""
        with self.transaction() as st:
            st.setdefault("drift_checks", []).append(check)
            if drift is not None:
                st["drift"] = drift

    def record_step(self, rec: dict) -> None:
        """A step's record (its trials, stop rule, result), replacing the step's earlier one."""
        with self.transaction() as st:
            upsert(st.setdefault("steps", []), rec, "step")

    def freeze(self, param: str, value: Any) -> None:
        """``param`` is frozen at ``value``: no later step may change it."""
        with self.transaction() as st:
            st.setdefault("frozen", {})[param] = value

    def set_capacity_reference(self, ref: dict) -> None:
        """The capacity objective's reference load (tune: set once, from the first baseline search)."""
        with self.transaction() as st:
            st["capacity_reference"] = ref

    def record_ablation(self, rec: dict) -> None:
        """An ablation's result (which switch of a multi-parameter change paid)."""
        with self.transaction() as st:
            st.setdefault("ablations", []).append(rec)


def _slot(st: dict, name: str) -> dict:
    for s in st.get("slots") or []:
        if s["name"] == name:
            return s
    raise UsageError(f"this state has no slot {name!r}; its slots: {', '.join(x['name'] for x in st.get('slots') or []) or 'none'}")


def make_lease(owner: str, ttl_s: float) -> dict:
    t = time.time()
    return {"owner": owner, "pid": os.getpid(), "host": socket.gethostname(), "acquired": t, "expires": t + ttl_s}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lease_staleness(lease: dict, now: float | None = None) -> str | None:
    """Why ``lease`` may be broken, or None if it is live."""
    now = time.time() if now is None else now
    if lease.get("expires", 0) < now:
        return f"expired at {now_iso(lease.get('expires', 0))}"
    pid = lease.get("pid")
    if lease.get("host") == socket.gethostname() and isinstance(pid, int) and not pid_alive(pid):
        return f"holder pid {pid} is gone"
    return None


def default_owner(tool: str) -> str:
    """The lease owner of this process running ``tool``."""
    return f"{tool}@{socket.gethostname()}:{os.getpid()}"


class DecisionLog:
    """Append-only JSON Lines: one event a line with ``ts``, ``id``, ``tool``, ``event``.

    Lines are written with a single ``write`` on an ``O_APPEND`` descriptor under an
    flock, so concurrent tools never interleave. A truncated last line (a writer
    killed mid-line) is skipped when reading, as by every JSON Lines reader (``vkit.jsonio``).
    """

    def __init__(self, path: str):
        self.path = path

    @staticmethod
    def new_id() -> str:
        return f"d-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"

    def append(self, tool: str, event: str, *, decision_id: str | None = None, **fields: Any) -> str:
        """Append one event; returns its id (``decision_id`` if the caller reserved one)."""
        did = decision_id or self.new_id()
        rec = {"ts": now_iso(), "id": did, "tool": tool, "event": event, "vkit_version": __version__}
        rec.update(copy.deepcopy(fields))
        line = (json.dumps(rec, sort_keys=True, default=str) + "\n").encode("utf-8")
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise StateWriteError(f"cannot open decision log {self.path}: {os.strerror(e.errno or 0)}") from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            n = os.write(fd, line)
            if n != len(line):
                raise StateWriteError(f"short write to decision log {self.path}")
            os.fsync(fd)
        except OSError as e:
            raise StateWriteError(f"cannot append to decision log {self.path}: {os.strerror(e.errno or errno.EIO)}") from e
        finally:
            os.close(fd)
        return did

    def read(self) -> list[dict]:
        """Every event, oldest first (``vkit.jsonio``'s rule for a torn last line; a damaged line is skipped)."""
        try:
            return [v for _, v in read_json_lines(self.path, skip_bad=True)]
        except FileNotFoundError:
            return []

    def holds(self, event: str, decision_id: str) -> bool:
        """An ``event`` with this id is in the log (a write a stopped run made before its state caught up)."""
        return any(e.get("id") == decision_id and e.get("event") == event for e in self.read())
