"""The knowledge base: finished tuning runs stored with the environment fingerprint they were
measured in, so a later run can warm-start from them — only from matching entries.

One JSON Lines file (tune takes ``$VKIT_KB``, else ``knowledge.jsonl`` beside the state file), appended
atomically line by line. An entry matches when its fingerprint key (accelerator model, count
and driver, server version, model, launch argv hash, simulator profile) and its workload are
equal to the new run's; every other entry is reported as invalidated, with the first field
that differs.
"""

from __future__ import annotations

import json
import os

from vkit.state import DecisionLog, now_iso

KEY_FIELDS = ("accelerator", "server_version", "model", "launch_hash", "simulator")


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
        "launch_hash": fp.get("launch_hash"),
        "simulator": {k: info.get(k) for k in ("sim_gpu", "sim_model", "sim_tensor_parallel_size")} if info.get("sim") else None,
    }


def record(path: str, key: dict, workload: dict, observations: list[dict], recommendation: dict | None, run_id: str) -> None:
    DecisionLog(path).append("tune", "kb_entry", key=key, workload=workload, observations=observations,
                             recommendation=recommendation, run_id=run_id, stored=now_iso())


def match(path: str, key: dict, workload: dict) -> tuple[list[dict], list[str]]:
    """(matching entries, one line per invalidated entry saying which field changed)."""
    good, bad = [], []
    for e in DecisionLog(path).read():
        if e.get("event") != "kb_entry":
            continue
        diff = next((f for f in KEY_FIELDS if (e.get("key") or {}).get(f) != key.get(f)), None)
        if diff is None and e.get("workload") != workload:
            diff = "workload"
        if diff is None:
            good.append(e)
        else:
            bad.append(f"{e.get('run_id')}: {diff} changed ({json.dumps((e.get('key') or {}).get(diff)) if diff != 'workload' else 'other workload'}"
                       f" → {json.dumps(key.get(diff)) if diff != 'workload' else 'this one'})")
    return good, bad
