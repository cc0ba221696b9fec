"""The tune result: what a tuning run returns, ``tune --json`` prints, ``result.json`` holds and
the report renders. Its schema is defined here, once.

The version travels in the document's ``schema`` key (``vkit.tune/1``), as it always has: a
reader checks it with :meth:`TuneResult.from_dict`, which refuses another version or a missing
key with a sentence saying which. Keys a version-1 reader does not know are kept as they are
(``extra``), so a document goes through ``from_dict`` and ``to_dict`` unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from vkit.errors import UsageError

SCHEMA_VERSION = 1
SCHEMA = f"vkit.tune/{SCHEMA_VERSION}"

# Keys a result may lack: results written before delivery confirmations and the knowledge base.
OPTIONAL = ("not_confirmed", "knowledge", "capacity")


class ResultSchemaError(UsageError):
    """A document that is not a tune result this vkit reads (another version, a key missing)."""


@dataclass(kw_only=True)
class TuneResult:
    """One tuning run: the service, the workload and goal, the baseline, every trial, the steps'
    stop rules, the Pareto front and knee, the recommendation, drift checks and warnings."""

    title: str
    generated: str  # ISO time
    simulated: bool
    server: dict  # url, model, version, sim (the simulator's profile or None), launch_argv
    workload: dict  # dataset, input_len, output_len, max_concurrency, num_prompts, slo
    goal: dict  # maximize, subject_to, text
    baseline: dict  # config, repeats, metrics {name: {mean, sigma_rel}}
    trials: list[dict]
    steps: list[dict]  # step, name, stop_rule, result
    knee: dict | None
    pareto: list[dict] | None
    not_confirmed: list[dict] | None = None  # front members whose claim the gate rejected on fresh runs
    recommendation: dict | None
    stop_rule: str
    drift: list[dict]
    warnings: list[str]
    knowledge: dict | None = None  # the knowledge base: path, matched run ids, ignored entries
    capacity: dict | None = None  # the capacity objective: reference load, search settings, the kept one's capacity
    soak: str
    timings: dict  # total_s, restarts
    absent: tuple[str, ...] = field(default=(), repr=False)  # OPTIONAL keys the document did not hold
    extra: dict = field(default_factory=dict, repr=False)  # keys of a later minor revision, kept as they are

    def to_dict(self) -> dict:
        """The document, ``schema`` first, in the order tune has always written it."""
        out: dict[str, Any] = {"schema": SCHEMA}
        for name in KEYS:
            if name not in self.absent:
                out[name] = getattr(self, name)
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, doc: Any) -> "TuneResult":
        """A result document (``to_dict``'s, ``result.json``'s) as a record; ``ResultSchemaError``
        when it is not one of this version or lacks a required key."""
        if not isinstance(doc, dict):
            raise ResultSchemaError(f"a tune result is a JSON object, not {type(doc).__name__}")
        if "schema" not in doc:
            raise ResultSchemaError(f"not a tune result: it has no 'schema' key (this vkit reads {SCHEMA})")
        if doc["schema"] != SCHEMA:
            raise ResultSchemaError(f"tune result schema {doc['schema']!r} is not {SCHEMA}, the version this vkit reads")
        missing = [k for k in KEYS if k not in doc and k not in OPTIONAL]
        if missing:
            raise ResultSchemaError(f"tune result ({SCHEMA}) lacks the key(s) {', '.join(missing)}")
        known = {k: doc[k] for k in KEYS if k in doc}
        extra = {k: v for k, v in doc.items() if k not in known and k != "schema"}
        return cls(**known, absent=tuple(k for k in OPTIONAL if k not in doc), extra=extra)


KEYS = tuple(f.name for f in fields(TuneResult) if f.name not in ("absent", "extra"))
REQUIRED = tuple(k for k in KEYS if k not in OPTIONAL)
