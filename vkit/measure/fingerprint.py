"""The environment fingerprint: what must match for two measurements, or a stored run and a new
one, to be comparable: the accelerator (model, count, driver), the server's version, the model
(a hash of its config.json, else of its id), and the dtype and quantisation it was launched with.

Taken at every run (bench_stream's summary carries it), not once: a driver reloaded during a
long tune must show in the run after it, so nothing is cached between calls. Each probe is one
vendor tool with a timeout; a tool that fails or times out gives nulls, never a failed run
(no tool at all: kind ``none``). The comparison of two fingerprints lives in :mod:`vkit.environment`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import socket

from vkit import __version__
from vkit.measure import accel

PROBE_TIMEOUT_S = 5.0
NVIDIA_ARGV = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"]


def _run(argv: list[str]) -> str:
    return (accel.run_tool(argv, timeout=PROBE_TIMEOUT_S) or "").strip()


def _nvidia(out: str) -> dict:
    rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
    names = list(dict.fromkeys(r[0] for r in rows))
    drivers = list(dict.fromkeys(r[1] for r in rows if len(r) > 1))
    try:
        mem = int(float(rows[0][2])) if len(rows[0]) > 2 else None
    except ValueError:
        mem = None
    return {"kind": "nvidia", "model": ", ".join(names), "count": len(rows),
            "driver": ", ".join(drivers) or None, "memory_mib": mem}


def _ascend(out: str) -> dict:
    chips = accel.parse_npu(out)
    # the banner: | npu-smi 23.0.rc3                 Version: 23.0.rc3     | (the driver's version)
    m = re.search(r"\bVersion:\s*(\S+)", out)
    return {"kind": "ascend", "model": chips[0]["name"] if chips else None, "count": len(chips) or None,
            "driver": m.group(1) if m else None, "memory_mib": int(chips[0]["mem_total_mib"]) if chips else None}


def accelerators() -> dict:
    """Accelerator model, count and driver from nvidia-smi / npu-smi / rocm-smi. Kind ``none`` (count 0)
    when none of them is installed; nulls when one is but did not answer (failed, timed out)."""
    out = _run(NVIDIA_ARGV)
    if out:
        return _nvidia(out)
    out = _run(["npu-smi", "info"])
    if out:
        return _ascend(out)
    out = _run(["rocm-smi", "--showproductname"])
    if out:
        return {"kind": "rocm", "model": None, "count": None, "driver": None, "raw_head": out.splitlines()[:3]}
    if accel.detect() is None:
        return {"kind": "none", "model": None, "count": 0, "driver": None}
    return {"kind": None, "model": None, "count": None, "driver": None}


def flag_value(argv: list[str], *names: str) -> str | None:
    """The value of the last ``--name V`` / ``--name=V`` of ``argv`` (vLLM's last one wins), None when absent."""
    value = None
    for i, a in enumerate(argv):
        key, eq, v = a.partition("=")
        if key in names:
            if eq and key.startswith("--"):
                value = v
            elif not eq and i + 1 < len(argv):
                value = argv[i + 1]
    return value


def model_paths(model: str | None, argv: list[str]) -> list[str]:
    """Where the model's files may be: ``vllm serve PATH``, ``--model PATH``, the served name."""
    out = []
    if "serve" in argv and argv.index("serve") + 1 < len(argv):
        out.append(argv[argv.index("serve") + 1])
    out += [p for p in (flag_value(argv, "--model"), model) if p]
    return out


def model_hash(model: str | None, argv: list[str]) -> tuple[str | None, str | None]:
    """(hash, what was hashed): the model's config.json when it is a local directory, else its id."""
    for p in model_paths(model, argv):
        cfg = os.path.join(p, "config.json")
        try:
            with open(cfg, "rb") as f:
                return hashlib.sha256(f.read()).hexdigest()[:16], "config.json"
        except OSError:
            continue
    if model:
        return hashlib.sha256(model.encode()).hexdigest()[:16], "model id"
    return None, None


def fingerprint(model: str | None = None, launch_argv: list[str] | None = None, server_version: str | None = None) -> dict:
    """The fingerprint of the environment now. ``launch_argv`` is the service's launch argv as
    ``state init`` recorded it (None when unknown: then dtype, quantisation and launch_hash are null);
    ``--dtype`` and ``--quantization``/``-q`` are read from it as vLLM spells them (null: the flag
    is absent, vLLM's default)."""
    argv = list(launch_argv or [])
    mhash, mof = model_hash(model, argv)
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "vkit_version": __version__,
        "accelerator": accelerators(),
        "model": model,
        "model_hash": mhash,
        "model_hash_of": mof,
        "server_version": server_version,
        "dtype": flag_value(argv, "--dtype") if argv else None,
        "quantization": flag_value(argv, "--quantization", "-q") if argv else None,
        "launch_hash": hashlib.sha256(json.dumps(argv).encode()).hexdigest()[:16] if argv else None,
    }
