"""Accelerator utilisation and memory, sampled from the vendor's tool when one is present.

One row per device: ``{"index", "util_pct", "mem_used_mib", "mem_total_mib"}``, from

- ``nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total --format=csv,noheader,nounits``
- ``npu-smi info`` (Ascend): the table's second row per chip, ``AICore(%)`` and ``HBM-Usage(MB)``
  (``Memory-Usage(MB)`` on cards without HBM, e.g. the 310P);
- ``rocm-smi --showuse --showmeminfo vram --json``: ``GPU use (%)``, ``VRAM Total Used Memory (B)``
  and ``VRAM Total Memory (B)`` per card.

Output that does not parse gives no rows, never invented numbers; callers say "not parsed".
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from collections.abc import Callable

TOOLS = ("nvidia-smi", "npu-smi", "rocm-smi")

NVIDIA_ARGV = ["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used,memory.total", "--format=csv,noheader,nounits"]
NPU_ARGV = ["npu-smi", "info"]
ROCM_ARGV = ["rocm-smi", "--showuse", "--showmeminfo", "vram", "--json"]


def detect() -> str | None:
    for tool in TOOLS:
        if shutil.which(tool):
            return tool
    return None


def run_tool(argv: list[str], timeout: float = 5.0) -> str | None:
    """A vendor tool's stdout; None when it is missing, fails or times out."""
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 else None


def parse_nvidia(text: str) -> list[dict]:
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            try:
                rows.append({"index": int(parts[0]), "util_pct": float(parts[1]), "mem_used_mib": float(parts[2]),
                             "mem_total_mib": float(parts[3])})
            except ValueError:
                continue
    return rows


# Second row of a chip in `npu-smi info`:
# | 0                         | 0000:C1:00.0  | 0           0    / 0          3393 / 65536         |
_NPU_CHIP = re.compile(
    r"^\|\s*(\d+)\s*\|\s*[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]\s*\|"
    r"\s*([\d.]+|-)\s+(\d+)\s*/\s*(\d+)(?:\s+(\d+)\s*/\s*(\d+))?\s*\|")
# First row of a device: | 0     910B3               | OK            | 93.6        40   ...
_NPU_DEV = re.compile(r"^\|\s*(\d+)\s+(\S+)[^|]*\|\s*\S+\s*\|")


def parse_npu(text: str) -> list[dict]:
    """Devices from ``npu-smi info``: AICore utilisation and HBM use (on-card memory where no HBM)."""
    rows = []
    npu = name = None
    in_procs = False
    for line in text.splitlines():
        if "Process id" in line or "Process name" in line:
            in_procs = True  # the process table below the device table repeats ids; stop there
        if in_procs:
            continue
        m = _NPU_CHIP.match(line)
        if m:
            util = float(m.group(2)) if m.group(2) != "-" else 0.0
            used, total = float(m.group(3)), float(m.group(4))
            if m.group(5) is not None and float(m.group(6)) > 0:
                used, total = float(m.group(5)), float(m.group(6))  # HBM, where the weights live
            rows.append({"index": len(rows), "npu": npu, "name": name, "chip": int(m.group(1)), "util_pct": util,
                         "mem_used_mib": used, "mem_total_mib": total})
            continue
        d = _NPU_DEV.match(line)
        if d and "NPU" not in line and "Chip" not in line:
            npu, name = int(d.group(1)), d.group(2)
    return rows


def _num(v) -> float | None:
    try:
        return float(str(v).strip().rstrip("%"))
    except ValueError:
        return None


def parse_rocm(text: str) -> list[dict]:
    """Cards from ``rocm-smi --showuse --showmeminfo vram --json``."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    rows = []
    if not isinstance(data, dict):
        return rows
    for card, fields in data.items():
        m = re.fullmatch(r"card(\d+)", str(card))
        if not m or not isinstance(fields, dict):
            continue
        util = used = total = None
        for k, v in fields.items():
            kl = k.lower()
            if kl.startswith("gpu use") or kl.startswith("gpu utilization"):
                util = _num(v)
            elif "vram total used memory" in kl:
                used = _num(v)
            elif "vram total memory" in kl:
                total = _num(v)
        if used is None or total is None:
            continue
        rows.append({"index": int(m.group(1)), "util_pct": util if util is not None else 0.0,
                     "mem_used_mib": used / 2**20, "mem_total_mib": total / 2**20})
    return rows


_SOURCES: dict[str, tuple[list[str], Callable[[str], list[dict]]]] = {
    "nvidia-smi": (NVIDIA_ARGV, parse_nvidia),
    "npu-smi": (NPU_ARGV, parse_npu),
    "rocm-smi": (ROCM_ARGV, parse_rocm),
}


def sample(tool: str, timeout: float = 5.0) -> list[dict] | None:
    """One sample from ``tool``: a row per device, [] when its output did not parse, None when it failed."""
    argv, parse = _SOURCES[tool]
    out = run_tool(argv, timeout)
    return None if out is None else parse(out)


class Sampler:
    """Samples every ``interval`` seconds in a daemon thread until ``stop()``."""

    def __init__(self, interval: float = 1.0):
        self.tool = detect()
        self.interval = interval
        self.samples: list[list[dict]] = []
        self.failed = 0
        self._stop = threading.Event()
        self._t: threading.Thread | None = None

    def start(self) -> None:
        if self.tool is not None:
            self._t = threading.Thread(target=self._loop, name="accel-sampler", daemon=True)
            self._t.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            s = sample(self.tool)
            if s:
                self.samples.append(s)
            else:
                self.failed += 1
            self._stop.wait(self.interval)

    def stop(self) -> dict:
        self._stop.set()
        if self._t:
            self._t.join(timeout=10)
        if self.tool is None:
            return {"available": False, "why": "no nvidia-smi, npu-smi or rocm-smi on this machine"}
        if not self.samples:
            return {"available": False, "tool": self.tool,
                    "why": f"{self.tool} gave no sample that parsed ({self.failed} tries)"}
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
