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

from vkit import __version__
from vkit.errors import StateCorrupt, StateMissing, StateWriteError, UsageError
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
    ``$VKIT_TEST_ENOSPC_FILE`` exists, every atomic write fails as on a full disk (ENOSPC), and a line
    goes to that name + ``.hit`` so the benchmark can tell a refused write from a flag no write met."""
    flag = os.environ.get(ENOSPC_HOOK)
    if flag and os.path.exists(flag):
        with contextlib.suppress(OSError), open(flag + ".hit", "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _mkstemp(d: str, base: str) -> tuple[int, str]:
    import tempfile

    return tempfile.mkstemp(dir=d, prefix=f".{base}.", suffix=".tmp")


class StateFile:
    """One state file: ``path``, its lock ``path.lock``, backup ``path.bak`` and
    decision log ``decisions.jsonl`` in the same directory. What the tools record is written by its
    parts' typed writers (``vkit.stateparts``): ``leases``, ``service``, ``slots`` and ``tune``."""

    def __init__(self, path: str):
        from vkit.stateparts import Leases, Service, Slots, TuneRecords

        self.path = os.path.abspath(path)
        self.dir = os.path.dirname(self.path)
        self.lock_path = self.path + ".lock"
        self.backup_path = self.path + ".bak"
        self.log = DecisionLog(os.path.join(self.dir, "decisions.jsonl"))
        self.leases, self.service, self.slots, self.tune = Leases(self), Service(self), Slots(self), TuneRecords(self)

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


    def mirror_remote(self, doc: dict) -> None:
        """A copy of a state held elsewhere (``vkit.tune.fleet``): a slot's state as its node holds it, on the
        driver; the tune's state as the driver holds it, on the node. Copied whole."""
        with self.transaction() as st:
            st.clear()
            st.update(doc)


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
