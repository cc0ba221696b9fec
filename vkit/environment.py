"""Two environment fingerprints compared (:mod:`vkit.measure.fingerprint` takes them): which of the
fields that make measurements incomparable changed, and the state's last-seen fingerprint after
one more run. Shared: the state file notes every run's fingerprint, gate refuses runs of different
environments, the knowledge base keys its entries on the same fields.

A field one side does not know (null: a vendor tool missing or timed out, the server's version not
read yet) is not a change. The dtype and quantisation are known only where the launch argv was
(``launch_hash``): there a null is vLLM's default (the flag absent), a value like any other. The
model hash is compared only between hashes of the same thing (two config.json files, two ids).
"""

from __future__ import annotations

import json
from typing import Any

# The fields that matter, as dotted paths into a fingerprint.
COMPARED = ("accelerator.kind", "accelerator.model", "accelerator.count", "accelerator.driver", "server_version",
            "model_hash", "dtype", "quantization")
_FROM_ARGV = ("dtype", "quantization")


def get(fp: Any, field: str) -> Any:
    cur = fp
    for part in field.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return cur


def known(fp: Any, field: str) -> bool:
    if not isinstance(fp, dict):
        return False
    if field in _FROM_ARGV:
        return field in fp and fp.get("launch_hash") is not None
    return get(fp, field) is not None


def changes(old: Any, new: Any) -> list[dict]:
    """``[{"field", "old", "new"}]`` for each compared field both fingerprints know and that differs."""
    out = []
    for f in COMPARED:
        if not (known(old, f) and known(new, f)):
            continue
        if f == "model_hash" and old.get("model_hash_of") != new.get("model_hash_of"):
            continue
        a, b = get(old, f), get(new, f)
        if a != b:
            out.append({"field": f, "old": a, "new": b})
    return out


def merged(old: Any, new: dict) -> dict:
    """The last-seen fingerprint after a run measured in ``new``: ``new``, with what it does not
    know kept from ``old`` (a tool that did not answer this time is no evidence of a change)."""
    out = dict(old) if isinstance(old, dict) else {}
    for k, v in new.items():
        if v is not None and k != "accelerator":
            out[k] = v
    if (new.get("accelerator") or {}).get("kind") is not None or not isinstance(out.get("accelerator"), dict):
        out["accelerator"] = new.get("accelerator")
    if new.get("launch_hash") is not None:
        out.update({f: new.get(f) for f in _FROM_ARGV})
    if new.get("model_hash") is not None:
        out["model_hash_of"] = new.get("model_hash_of")
    return out


def _text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def describe(found: list[dict]) -> str:
    """One line: ``accelerator.driver 550.54.15 → 560.35.03; server_version ...``."""
    return "; ".join(f"{c['field']} {_text(c['old'])} → {_text(c['new'])}" for c in found)


def warning(found: list[dict], run: str | None = None) -> str:
    """The one line a tool says when a run's environment changed."""
    return (f"environment changed since the last run{f', seen by {run}' if run else ''}: {describe(found)}; "
            "gate does not compare runs from before the change with runs after it")
