"""Slots: the accelerator groups of one machine, each serving its own copy of the model.

A model served at TP=1 or TP=2 on an 8-accelerator machine leaves most of it idle while a tune
tries one configuration at a time. A slot is one group of accelerators (their device ids), the
port its server listens on, and its own state file under ``slots/<name>/`` beside the service's:
its running server, its candidate, its consecutive start failures, its ABNORMAL flag and its
lease, its server logs in ``slots/<name>/logs/``. The lifecycle (restart with rollback) runs on a
slot's state file exactly as on the service's, so rollback and ABNORMAL are per slot.

The launch argv of a slot is the service's with ``--port`` set to the slot's port; its server
sees only its accelerators through the variable the accelerator kind reads
(:data:`VISIBLE_VARS`: ``CUDA_VISIBLE_DEVICES``, ``ASCEND_RT_VISIBLE_DEVICES``,
``HIP_VISIBLE_DEVICES``). A state without slots is one slot: the service itself.

vkit schedules nothing else: the slots are processes it launches, one per group.
"""

from __future__ import annotations

import json
import os
import re
from urllib.parse import urlsplit, urlunsplit

from vkit.errors import UsageError

# The variable that restricts a server to its accelerators, by the fingerprint's accelerator kind.
VISIBLE_VARS = {"nvidia": "CUDA_VISIBLE_DEVICES", "ascend": "ASCEND_RT_VISIBLE_DEVICES", "rocm": "HIP_VISIBLE_DEVICES"}
DEFAULT_VAR = "CUDA_VISIBLE_DEVICES"  # no vendor tool answered (a CPU box, the simulator): vLLM's default backend
SLOTS_DIR = "slots"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")


def visible_var(kind: str | None) -> str:
    """The environment variable that makes a server of accelerator ``kind`` see only its devices."""
    return VISIBLE_VARS.get(kind or "", DEFAULT_VAR)


def flag_int(argv: list[str], *names: str) -> int | None:
    """The integer value of the last ``--name V`` / ``--name=V`` in ``argv`` (None when absent)."""
    out = None
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                out = argv[i + 1]
            elif a.startswith(n + "="):
                out = a.split("=", 1)[1]
    try:
        return int(out) if out is not None else None
    except ValueError:
        return None


def group_size(argv: list[str]) -> int:
    """Accelerators one server needs: tensor x pipeline parallel size, as the launch argv spells them."""
    tp = flag_int(argv, "--tensor-parallel-size", "-tp") or 1
    pp = flag_int(argv, "--pipeline-parallel-size", "-pp") or 1
    return max(1, tp * pp)


def with_port(argv: list[str], port: int) -> list[str]:
    """``argv`` with its ``--port`` set to ``port`` (appended when it has none)."""
    out, i, found = [], 0, False
    while i < len(argv):
        a = argv[i]
        if a == "--port" and i + 1 < len(argv):
            out += ["--port", str(port)]
            i += 2
            found = True
            continue
        if a.startswith("--port="):
            out.append(f"--port={port}")
            found = True
        else:
            out.append(a)
        i += 1
    return out if found else out + ["--port", str(port)]


def url_with_port(url: str, port: int) -> str:
    u = urlsplit(url)
    host = u.hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return urlunsplit((u.scheme or "http", f"{host}:{port}", u.path, u.query, u.fragment)).rstrip("/")


def plan(n: int, argv: list[str], url: str, per_slot: int | None = None, first_device: int = 0) -> list[dict]:
    """``state init --slots N``: N slots of ``per_slot`` accelerators (default: the launch argv's
    tensor x pipeline parallel size), consecutive device ids, ports from the URL's port up."""
    if n < 1:
        raise UsageError(f"--slots takes a positive count, not {n}")
    g = per_slot or group_size(argv)
    base = urlsplit(url).port or flag_int(argv, "--port") or 8000
    return [{"name": f"s{i}", "devices": list(range(first_device + i * g, first_device + (i + 1) * g)), "port": base + i}
            for i in range(n)]


def load_file(path: str) -> list[dict]:
    """A slots file: a JSON list of ``{"name"?, "devices": [ids], "port": P, "argv_extra"?: [...], "node"?: IP or id,
    "gpus"?: false}`` (``argv_extra``: launch arguments for that slot only; ``node``: under ``tune --ray``, the Ray
    node that serves it; ``gpus`` false: its worker asks Ray for no GPU, e.g. on a cluster of CPU nodes)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise UsageError(f"cannot read the slots file {path}: {os.strerror(e.errno or 0)}") from None
    except ValueError as e:
        raise UsageError(f"the slots file {path} is not JSON ({e})") from None
    if not isinstance(data, list) or not data:
        raise UsageError(f"the slots file {path} must hold a non-empty JSON list of slots")
    out = []
    for i, s in enumerate(data):
        if not isinstance(s, dict) or not isinstance(s.get("port"), int) or not isinstance(s.get("devices"), list):
            raise UsageError(f"slot {i} of {path} needs \"devices\" (a list of ids) and \"port\" (an integer)")
        extra = s.get("argv_extra") or []
        if not (isinstance(extra, list) and all(isinstance(x, str) for x in extra)):
            raise UsageError(f"slot {i} of {path}: \"argv_extra\" is a list of strings (argv items, never a shell string)")
        if s.get("node") is not None and not isinstance(s["node"], str) or not isinstance(s.get("gpus", True), bool):
            raise UsageError(f"slot {i} of {path}: \"node\" is a Ray node's IP or id (a string), \"gpus\" true or false")
        out.append({"name": str(s.get("name") or f"s{i}"), "devices": [str(d) for d in s["devices"]], "port": s["port"],
                    **({"argv_extra": list(extra)} if extra else {}), **({"node": s["node"]} if s.get("node") else {}),
                    **({"gpus": False} if s.get("gpus") is False else {})})
    return out


def check(slots: list[dict]) -> list[dict]:
    """Names unique and safe as folder names; on one machine (a slot's ``node``, else this one) ports unique and
    no device in two slots."""
    names, ports, seen = set(), set(), {}
    for s in slots:
        if not _NAME.match(s["name"]) or s["name"] in names:
            raise UsageError(f"slot name {s['name']!r} is not unique or not a plain name (letters, digits, . _ -)")
        node = s.get("node") or ""
        if (node, s["port"]) in ports:
            raise UsageError(f"two slots listen on port {s['port']}" + (f" on node {node}" if node else "") + ": give each its own port")
        for d in s["devices"]:
            if (node, str(d)) in seen:
                raise UsageError(f"device {d} is in slots {seen[(node, str(d))]} and {s['name']}: a device belongs to one slot")
            seen[(node, str(d))] = s["name"]
        names.add(s["name"])
        ports.add((node, s["port"]))
    return slots


def launch_for(launch: dict, slot: dict, var: str) -> dict:
    """The service's launch (argv or hooks) for ``slot``: its port, its devices in ``var``."""
    out = dict(launch)
    if out.get("argv"):
        out["argv"] = with_port(list(out["argv"]), slot["port"]) + list(slot.get("argv_extra") or [])
    if out.get("start_hook"):
        out["start_hook"] = list(out["start_hook"]) + list(slot.get("argv_extra") or [])
    out["env"] = dict(out.get("env") or {}, **{var: ",".join(str(d) for d in slot["devices"]), "VKIT_SLOT": slot["name"]})
    return out


def state_path(state_dir: str, name: str) -> str:
    """Where slot ``name``'s own state file lives."""
    return os.path.join(state_dir, SLOTS_DIR, name, "vkit.json")
