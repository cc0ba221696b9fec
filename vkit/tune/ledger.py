"""The tune's typed reads of the state file: the only place in vkit.tune that reads a ``StateFile``.

Writes go through the state file's part objects (``sf.tune``, ``sf.service``, ``sf.slots``: vkit.stateparts),
each one locked, atomic transaction. Reads come from here: a :class:`Ledger` over a state file gives
:class:`TuneView` (the tuning run's records: kept configuration, trials, baselines, confirmations, steps,
time) and :class:`ServerView` (the server the file describes: its URL, the process running, the candidate,
ABNORMAL), each from one consistent read. A trial's status is a :class:`Status`; the groups a step asks
about (pending, ranked, finished, probing) are named once, here.
"""

from __future__ import annotations

import os
from enum import Enum
from typing import TYPE_CHECKING, Any, Iterable, TypedDict

from vkit.jsonio import read_json_file
from vkit.state import launch_argv

if TYPE_CHECKING:
    from vkit.state import StateFile


class Status(str, Enum):
    """A trial's status as the state file records it (the member is its string: it compares, hashes and
    serialises as the plain value)."""

    PROPOSED = "proposed"  # recorded, not started
    APPLIED = "applied"  # its server started, runs under way
    DONE = "done"  # measured and judged
    ELIMINATED = "eliminated"  # screened out after its first run(s)
    START_FAILED = "start_failed"  # its server did not start (rolled back)
    INVALID = "invalid"  # a run broke an invariant the repeats could not cure
    SKIPPED = "skipped"  # not run (the budget, or nothing to differ)
    PROBE_STARTED = "probe_started"  # step 4m: a memory probe's server started
    PROBE_FAILED = "probe_failed"  # step 4m: a memory probe's server did not start (the answer sought)

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


PENDING = frozenset({Status.PROPOSED, Status.APPLIED})  # no verdict yet: resumed after an interruption
RANKED = frozenset({Status.DONE, Status.ELIMINATED})  # measured: comparable with the step's other trials
FINISHED = frozenset({Status.DONE, Status.ELIMINATED, Status.START_FAILED, Status.INVALID, Status.SKIPPED})
PROBING = frozenset({Status.PROBE_STARTED, Status.PROBE_FAILED})


class Trial(TypedDict, total=False):
    """One trial as ``sf.tune.add_trial`` records it."""

    id: str
    step: str
    config: dict
    changes: dict
    status: str  # a Status value
    runs: list
    checks: list
    valid: bool | None
    metrics: dict
    verdict: str | None
    why: str
    kept: bool
    decision_id: str | None
    proposal: dict
    started: str
    finished: str


class TuneView:
    """The tuning run's records, from one read of the state file."""

    def __init__(self, doc: dict):
        self.doc = doc  # the whole document, for library functions outside vkit.tune that read one (kept_series, fingerprint_key)

    @property
    def kept(self) -> dict:
        """The kept configuration's record: config, decision_id, decision, repeats."""
        return self.doc["kept"]

    @property
    def kept_config(self) -> dict:
        return self.doc["kept"]["config"]

    def trials(self, step: str | None = None, status: Iterable[str] | None = None) -> list[Trial]:
        """The trials in order; of ``step`` only, in one of the statuses ``status`` only, when given."""
        want = None if status is None else {str(s) for s in status}
        return [t for t in self.doc.get("trials") or []
                if (step is None or t["step"] == step) and (want is None or t["status"] in want)]

    def trial(self, tid: str) -> Trial:
        for t in self.doc.get("trials") or []:
            if t["id"] == tid:
                return t
        raise KeyError(tid)

    def record(self, key: str) -> dict:
        """A record of the run: a baseline's (``baseline``, ``baseline_mixed``, ``ablate-...``), ``capacity_reference``,
        ``slot_effects``; {} before it is made."""
        return self.doc.get(key) or {}

    def confirmations(self, list_key: str = "confirmations") -> list[dict]:
        """The confirmations (``confirmations``) or delivery confirmations (``delivery_confirmations``) made."""
        return list(self.doc.get(list_key) or [])

    @property
    def tune(self) -> dict:
        """The tuning run under way (its id, options, knowledge base, promise, report), {} before one starts."""
        return self.doc.get("tune") or {}

    @property
    def run_starts(self) -> dict:
        """Which server start (``pid:ticks``) measured each run."""
        return self.doc.get("run_starts") or {}

    @property
    def timing(self) -> dict:
        return self.doc.get("timing") or {}

    @property
    def steps(self) -> list[dict]:
        return list(self.doc.get("steps") or [])

    @property
    def frozen(self) -> dict:
        return self.doc.get("frozen") or {}

    @property
    def drift_checks(self) -> list[dict]:
        return list(self.doc.get("drift_checks") or [])

    @property
    def ablations(self) -> list[dict]:
        return list(self.doc.get("ablations") or [])

    @property
    def slot_effects(self) -> dict:
        """The slots' A/A pass: per metric, σ_device."""
        return (self.doc.get("slot_effects") or {}).get("metrics") or {}

    def slots(self, live: bool = True) -> list[dict]:
        """The state's slots in order (``live``: those not taken out); [] for a state without slots."""
        return [s for s in self.doc.get("slots") or [] if not (live and s.get("out"))]

    @property
    def server(self) -> ServerView:
        """The service as the same read describes it (the tune's state file is the service's)."""
        return ServerView(self.doc)

    @property
    def sigma(self) -> dict:
        """σ of the kept configuration's baseline (``sigma_baseline``) and its components (``sigma_components``)."""
        return {"baseline": self.doc.get("sigma_baseline") or {}, "components": self.doc.get("sigma_components") or {}}


class ServerView:
    """The server a state file describes (the service's, or a slot's), from one read."""

    def __init__(self, doc: dict):
        self.doc = doc

    @property
    def url(self) -> str:
        return self.doc["service"]["url"]

    @property
    def model(self) -> str:
        return self.doc["service"]["model"]

    @property
    def launch(self) -> dict:
        """How the server is started, as ``state init`` recorded it (argv, or the hooks)."""
        return self.doc["service"]["launch"]

    @property
    def argv(self) -> list[str] | None:
        """The server's argv as ``state init`` recorded it (None in hook mode)."""
        return (self.doc["service"].get("launch") or {}).get("argv")

    @property
    def launch_argv(self) -> list[str]:
        """What starts the server (the argv, or the start hook), as the environment fingerprint reads it."""
        return launch_argv(self.doc)

    @property
    def running(self) -> dict:
        """The process vkit started last (pid, ticks, config, role), {} when none runs."""
        return self.doc["service"].get("running") or {}

    @property
    def startup(self) -> dict:
        return self.doc["service"].get("startup") or {}

    @property
    def candidate(self) -> dict:
        return self.doc.get("candidate") or {}

    @property
    def abnormal(self) -> dict:
        return self.doc.get("abnormal") or {}

    @property
    def kept(self) -> dict:
        return self.doc["kept"]


class Ledger:
    """Reads of one state file, each a fresh view (``tune()``, ``server()``) or one fact of one."""

    def __init__(self, f: StateFile):
        self.f = f

    def tune(self) -> TuneView:
        return TuneView(self.f.read())

    def server(self) -> ServerView:
        return ServerView(self.f.read())

    # the facts read most often, each from its own read
    def kept_config(self) -> dict:
        return self.tune().kept_config

    def trials(self, step: str | None = None, status: Iterable[str] | None = None) -> list[Trial]:
        return self.tune().trials(step, status)

    def trial(self, tid: str) -> Trial:
        return self.tune().trial(tid)

    def record(self, key: str) -> dict:
        return self.tune().record(key)

    def url(self) -> str:
        return self.server().url

    def running(self) -> dict:
        return self.server().running

    def raw(self) -> dict:
        """The whole document, for a library function outside vkit.tune that reads one."""
        return self.f.read()

    def slots(self, live: bool = True) -> list[dict]:
        """The state's slots in order (``live``: those not taken out); [] for a state without slots."""
        return self.tune().slots(live)

    def abs_path(self, rel: str) -> str:
        """A run's path recorded relative to the state's folder, made absolute."""
        return rel if os.path.isabs(rel) else os.path.join(self.f.dir, rel)

    def load(self, rel: str) -> dict:
        """A run's summary (``OSError``, ``ValueError`` propagate: a caller may skip a damaged run)."""
        return read_json_file(self.abs_path(rel))[0]


def first(items: Iterable[Any], **match: Any) -> Any:
    """The first item whose fields equal ``match``, None if none does."""
    return next((x for x in items if all(x.get(k) == v for k, v in match.items())), None)
