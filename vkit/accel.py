"""Accelerator utilisation and memory sampled during a run (nvidia-smi when present).

npu-smi and rocm-smi are detected and reported as present, but their text output is
not parsed yet: the sample says so instead of inventing numbers.
"""

from __future__ import annotations

import shutil
import subprocess
import threading


def detect() -> str | None:
    for tool in ("nvidia-smi", "npu-smi", "rocm-smi"):
        if shutil.which(tool):
            return tool
    return None


def nvidia_sample(timeout: float = 5.0) -> list[dict] | None:
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=timeout, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    rows = []
    for line in r.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            try:
                rows.append({"index": int(parts[0]), "util_pct": float(parts[1]), "mem_used_mib": float(parts[2]), "mem_total_mib": float(parts[3])})
            except ValueError:
                continue
    return rows


class Sampler:
    """Samples every ``interval`` seconds in a daemon thread until ``stop()``."""

    def __init__(self, interval: float = 1.0):
        self.tool = detect()
        self.interval = interval
        self.samples: list[list[dict]] = []
        self._stop = threading.Event()
        self._t: threading.Thread | None = None

    def start(self) -> None:
        if self.tool == "nvidia-smi":
            self._t = threading.Thread(target=self._loop, name="accel-sampler", daemon=True)
            self._t.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            s = nvidia_sample()
            if s:
                self.samples.append(s)
            self._stop.wait(self.interval)

    def stop(self) -> dict:
        self._stop.set()
        if self._t:
            self._t.join(timeout=10)
        if self.tool is None:
            return {"available": False, "why": "no nvidia-smi, npu-smi or rocm-smi on this machine"}
        if self.tool != "nvidia-smi":
            return {"available": False, "tool": self.tool, "why": f"{self.tool} found; its output is not parsed yet"}
        if not self.samples:
            return {"available": False, "tool": self.tool, "why": "nvidia-smi gave no samples"}
        util = [d["util_pct"] for s in self.samples for d in s]
        mem = [d["mem_used_mib"] for s in self.samples for d in s]
        return {
            "available": True,
            "tool": self.tool,
            "samples": len(self.samples),
            "devices": len(self.samples[-1]),
            "util_pct_mean": sum(util) / len(util),
            "util_pct_max": max(util),
            "mem_used_mib_max": max(mem),
            "mem_total_mib": self.samples[-1][0]["mem_total_mib"],
        }
