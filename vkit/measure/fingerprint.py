"""The environment fingerprint: what must match for two measurements, or a stored
run and a new one, to be comparable (accelerator, driver, server version, model)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket

from vkit import __version__
from vkit.measure import accel


def _run(argv: list[str]) -> str:
    return (accel.run_tool(argv) or "").strip()


def accelerators() -> dict:
    """Accelerator model, count and driver from nvidia-smi / npu-smi / rocm-smi, when present."""
    out = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader,nounits"])
    if out:
        rows = [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]
        return {
            "kind": "nvidia",
            "model": rows[0][0],
            "count": len(rows),
            "driver": rows[0][1] if len(rows[0]) > 1 else None,
            "memory_mib": int(float(rows[0][2])) if len(rows[0]) > 2 else None,
        }
    out = _run(["npu-smi", "info"])
    if out:
        chips = accel.parse_npu(out)
        return {"kind": "ascend", "model": chips[0]["name"] if chips else None, "count": len(chips) or None,
                "driver": None, "memory_mib": int(chips[0]["mem_total_mib"]) if chips else None,
                "raw_head": out.splitlines()[:3]}
    out = _run(["rocm-smi", "--showproductname"])
    if out:
        return {"kind": "rocm", "model": None, "count": None, "driver": None, "raw_head": out.splitlines()[:3]}
    return {"kind": "none", "model": None, "count": 0, "driver": None}


def fingerprint(model: str | None = None, launch_argv: list[str] | None = None, server_version: str | None = None) -> dict:
    argv = list(launch_argv or [])
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "vkit_version": __version__,
        "accelerator": accelerators(),
        "model": model,
        "server_version": server_version,
        "launch_hash": hashlib.sha256(json.dumps(argv).encode()).hexdigest()[:16] if argv else None,
    }


def comparable_keys() -> tuple[str, ...]:
    """The fields that must be equal for a stored run to be reused."""
    return ("accelerator", "model", "server_version", "launch_hash")
