"""The knowledge base: finished tuning runs stored with the environment fingerprint they were
measured in, so a later run can warm-start from them — only from matching entries.

One JSON Lines file (tune takes ``$VKIT_KB``, else ``knowledge.jsonl`` beside the state file), appended
atomically line by line. An entry matches when its fingerprint key (accelerator model, count
and driver, server version, model, model config hash, dtype, quantisation, launch argv hash,
simulator profile) and its workload are equal to the new run's; every other entry is ignored
and reported with each field that differs, old → new. The key is taken from the state's last
seen fingerprint, which every run updates, so a driver changed since ``state init`` shows. A key
field an entry does not carry (stored by an older vkit) is not compared.
"""

from __future__ import annotations

import json
import os

from vkit.state import DecisionLog, now_iso

USES = {"bo": " (used to warm-start the Bayesian search)", "twin": " (the twin's fit starts from the latest one's)",
        "staged": " (shown; staged mode does not warm-start)"}  # what a tune of each search mode makes of matching entries
KEY_FIELDS = ("accelerator", "server_version", "model", "model_hash", "dtype", "quantization", "launch_hash", "simulator")


def default_path(state_dir: str) -> str:
    return os.path.join(state_dir, "knowledge.jsonl")


def fingerprint_key(state: dict, server_info: dict | None) -> dict:
    fp = state.get("fingerprint") or {}
    acc = fp.get("accelerator") or {}
    info = server_info or {}
    return {
        "accelerator": {k: acc.get(k) for k in ("kind", "model", "count", "driver")},
        "server_version": info.get("version"),
        "model": state["service"]["model"],
        "model_hash": fp.get("model_hash"),
        "dtype": fp.get("dtype"),
        "quantization": fp.get("quantization"),
        "launch_hash": fp.get("launch_hash"),
        "simulator": {k: info.get(k) for k in ("sim_gpu", "sim_model", "sim_tensor_parallel_size")} if info.get("sim") else None,
    }


def record(path: str, key: dict, workload: dict, observations: list[dict], recommendation: dict | None, run_id: str,
           twin: dict | None = None) -> None:
    """One finished run; ``twin``: the twin's last fit (its parameters), where ``tune --search twin`` made one: a
    later twin-guided run of the same environment and workload starts its fit from them."""
    DecisionLog(path).append("tune", "kb_entry", key=key, workload=workload, observations=observations,
                             recommendation=recommendation, run_id=run_id, stored=now_iso(),
                             **({"twin": twin} if twin else {}))


def differences(stored: dict, key: dict) -> list[str]:
    """``field changed (old → new)`` for each key field that differs (the accelerator's by its own fields)."""
    out = []
    for f in KEY_FIELDS:
        if f not in stored or stored.get(f) == key.get(f):
            continue
        a, b = stored.get(f), key.get(f)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{f}.{k} changed ({json.dumps(a.get(k))} → {json.dumps(b.get(k))})" for k in sorted(set(a) | set(b))
                    if a.get(k) != b.get(k)]
        else:
            out.append(f"{f} changed ({json.dumps(a)} → {json.dumps(b)})")
    return out


def match(path: str, key: dict, workload: dict) -> tuple[list[dict], list[str]]:
    """(matching entries, one line per ignored entry saying which fields changed)."""
    good, bad = [], []
    for e in DecisionLog(path).read():
        if e.get("event") != "kb_entry":
            continue
        diff = differences(e.get("key") or {}, key)
        if not diff and e.get("workload") != workload:
            bad.append(f"{e.get('run_id')}: workload changed (another workload → this one)")
        elif diff:
            bad.append(f"{e.get('run_id')}: {', '.join(diff)}")
        else:
            good.append(e)
    return good, bad
