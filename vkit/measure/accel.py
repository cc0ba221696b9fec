"""Accelerator utilisation, memory and board power, sampled from the vendor's tool when one is present.

One row per device: ``{"index", "util_pct", "mem_used_mib", "mem_total_mib", "power_w"}``, from

- ``nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total,power.draw --format=csv,noheader,nounits``
  (rows of four columns, without ``power.draw``, still parse and carry no ``power_w``);
- ``npu-smi info`` (Ascend): the table's second row per chip, ``AICore(%)`` and ``HBM-Usage(MB)``
  (``Memory-Usage(MB)`` on cards without HBM, e.g. the 310P); ``Power(W)`` from the NPU's first row,
  the same figure on every chip row of that NPU (it is the NPU's, not the chip's);
- ``rocm-smi --showuse --showmeminfo vram --showpower --json``: ``GPU use (%)``, ``VRAM Total Used Memory (B)``,
  ``VRAM Total Memory (B)`` and the ``... Package Power (W)`` field per card.

``power_w`` is None where the tool prints no number (``[N/A]``, ``NA``, ``[Not Supported]``).
The NVIDIA energy counter (``total_energy_consumption``, millijoules since the driver loaded) is read
by ``read_energy_counter``; drivers that lack the field say so in a sentence, which gives no counter.

Output that does not parse gives no rows, never invented numbers; callers say "not parsed".
``power_block`` turns timed power samples into the energy figures ``Sampler.stop`` reports under ``"power"``.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable

TOOLS = ("nvidia-smi", "npu-smi", "rocm-smi")

NVIDIA_ARGV = ["nvidia-smi", "--query-gpu=index,utilization.gpu,memory.used,memory.total,power.draw",
               "--format=csv,noheader,nounits"]
NPU_ARGV = ["npu-smi", "info"]
ROCM_ARGV = ["rocm-smi", "--showuse", "--showmeminfo", "vram", "--showpower", "--json"]
ENERGY_ARGV = ["nvidia-smi", "--query-gpu=index,total_energy_consumption", "--format=csv,noheader,nounits"]


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


def _watts(v: str) -> float | None:
    """A power (or energy) figure; None for ``[N/A]``, ``NA``, ``[Not Supported]`` or anything not a finite number."""
    x = _num(v)
    return x if x is not None and math.isfinite(x) else None


def parse_nvidia(text: str) -> list[dict]:
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) in (4, 5):
            try:
                row = {"index": int(parts[0]), "util_pct": float(parts[1]), "mem_used_mib": float(parts[2]),
                       "mem_total_mib": float(parts[3])}
            except ValueError:
                continue
            if len(parts) == 5:
                row["power_w"] = _watts(parts[4])
            rows.append(row)
    return rows


# Second row of a chip in `npu-smi info`:
# | 0                         | 0000:C1:00.0  | 0           0    / 0          3393 / 65536         |
_NPU_CHIP = re.compile(
    r"^\|\s*(\d+)\s*\|\s*[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]\s*\|"
    r"\s*([\d.]+|-)\s+(\d+)\s*/\s*(\d+)(?:\s+(\d+)\s*/\s*(\d+))?\s*\|")
# First row of a device: | 0     910B3               | OK            | 93.6        40   ...
_NPU_DEV = re.compile(r"^\|\s*(\d+)\s+(\S+)[^|]*\|\s*\S+\s*\|\s*(\S+)")


def parse_npu(text: str) -> list[dict]:
    """Devices from ``npu-smi info``: AICore utilisation and HBM use (on-card memory where no HBM), and the
    NPU's ``Power(W)`` on each of its chip rows."""
    rows = []
    npu = name = power = None
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
                         "mem_used_mib": used, "mem_total_mib": total, "power_w": power})
            continue
        d = _NPU_DEV.match(line)
        if d and "NPU" not in line and "Chip" not in line:
            npu, name, power = int(d.group(1)), d.group(2), _watts(d.group(3))
    return rows


def _num(v) -> float | None:
    try:
        return float(str(v).strip().rstrip("%"))
    except ValueError:
        return None


def parse_rocm(text: str) -> list[dict]:
    """Cards from ``rocm-smi --showuse --showmeminfo vram --showpower --json``."""
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
        util = used = total = power = None
        for k, v in fields.items():
            kl = k.lower()
            if kl.startswith("gpu use") or kl.startswith("gpu utilization"):
                util = _num(v)
            elif "vram total used memory" in kl:
                used = _num(v)
            elif "vram total memory" in kl:
                total = _num(v)
            elif "package power" in kl:
                power = _watts(v)
        if used is None or total is None:
            continue
        rows.append({"index": int(m.group(1)), "util_pct": util if util is not None else 0.0,
                     "mem_used_mib": used / 2**20, "mem_total_mib": total / 2**20, "power_w": power})
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


def device_power(rows: list[dict]) -> list[float | None]:
    """Board power per power source in one sample: one figure per row, except that the chip rows of
    one NPU (``npu``) share their NPU's figure and count once."""
    out: dict = {}
    for r in rows:
        key = ("npu", r["npu"]) if r.get("npu") is not None else ("row", r["index"])
        if key not in out:
            out[key] = r.get("power_w")
    return list(out.values())


def parse_energy(text: str) -> tuple[dict[int, float] | None, str | None]:
    """``index, total_energy_consumption`` rows (mJ) → joules per device; or None and why."""
    if "is not a valid field" in text:
        return None, "this driver has no total_energy_consumption field"
    out: dict[int, float] = {}
    na = False
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if not line.strip():
            continue
        idx = int(parts[0]) if len(parts) == 2 and parts[0].isdigit() else None
        if idx is None:
            return None, f"nvidia-smi's total_energy_consumption did not parse: {line.strip()[:80]!r}"
        mj = _watts(parts[1])
        if mj is None:
            na = True
            continue
        out[idx] = mj / 1000.0
    if na:
        return None, "nvidia-smi gave no total_energy_consumption ([N/A] or not supported) for some device"
    if not out:
        return None, "nvidia-smi gave no total_energy_consumption rows"
    return out, None


def read_energy_counter(tool: str | None, timeout: float = 5.0) -> tuple[dict[int, float] | None, str | None]:
    """The NVIDIA energy counter now, in joules per device index; or None and a one-line reason."""
    if tool is None:
        return None, "no vendor tool on this machine: no energy counter"
    if tool != "nvidia-smi":
        return None, f"{tool} is not an nvidia-smi: no energy counter"
    try:
        r = subprocess.run(ENERGY_ARGV, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"nvidia-smi did not answer the energy query ({type(e).__name__})"
    text = (r.stdout or "") + "\n" + (r.stderr or "")
    if "is not a valid field" in text:
        return parse_energy(text)
    if r.returncode != 0:
        return None, f"nvidia-smi's energy query exited {r.returncode}"
    return parse_energy(r.stdout)


def _timed(read: Callable[[], object]) -> tuple[object, float]:
    """``read()`` and the monotonic time it stands for: the middle of the tool's run (its read falls somewhere in it)."""
    t0 = time.monotonic()
    out = read()
    return out, (t0 + time.monotonic()) / 2


def power_block(samples: list[tuple[float, list[float | None]]], interval: float,
                counter_start: dict[int, float] | None, counter_stop: dict[int, float] | None,
                counter_why: str | None, tool: str = "the vendor tool", counter_s: float | None = None) -> dict:
    """Energy figures from timed power samples ``(monotonic s, [W per device])``: the time-weighted mean,
    min and max of the total over devices and its trapezoid integral (J), beside the energy counter's
    delta (J, negative as read: a counter that went backwards is reported, never clamped) and the
    seconds between its two reads (``counter_s``, as given).

    Only samples with a figure for every device count; fewer than two give ``{"available": False, "why"}``."""
    if not samples:
        return {"available": False, "why": f"{tool} gave no power sample"}
    d = max(len(p) for _, p in samples)
    powered = sorted((t, sum(x for x in p if x is not None)) for t, p in samples
                     if d and len(p) == d and all(x is not None for x in p))
    if len(powered) < 2:
        which = "none" if not powered else "only 1"
        return {"available": False,
                "why": f"{tool} gave a power figure for every device in {which} of {len(samples)} samples "
                       "([N/A] or not supported); energy needs at least 2"}
    covered = powered[-1][0] - powered[0][0]
    if covered <= 0:
        return {"available": False, "why": f"the {len(powered)} power samples span no time"}
    joules = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(powered, powered[1:], strict=False))
    totals = [p for _, p in powered]
    counter_j = None
    if counter_start is not None and counter_stop is not None:
        if set(counter_start) == set(counter_stop):
            counter_j = sum(counter_stop[k] - counter_start[k] for k in counter_start)
            counter_why = None
        else:
            counter_why = "the energy counter named other devices at the end than at the start"
    elif counter_why is None:
        counter_why = "the energy counter was not read at both ends"
    return {"available": True, "interval_s": interval, "samples": len(powered), "devices": d, "covered_s": covered,
            "mean_w": joules / covered, "min_w": min(totals), "max_w": max(totals), "sampled_j": joules,
            "counter_j": counter_j, "counter_why": counter_why, "counter_s": counter_s if counter_j is not None else None}


class Sampler:
    """Samples every ``interval`` seconds in a daemon thread until ``stop()``; reads the energy counter
    (where the tool has one) at ``start()`` and at ``stop()``."""

    def __init__(self, interval: float = 1.0):
        self.tool = detect()
        self.interval = interval
        self.samples: list[list[dict]] = []
        self.power: list[tuple[float, list[float | None]]] = []
        self.failed = 0
        self.counter_start: dict[int, float] | None = None
        self.counter_why: str | None = None
        self._counter_t: float | None = None
        self._stop = threading.Event()
        self._t: threading.Thread | None = None

    def start(self) -> None:
        if self.tool is not None:
            (self.counter_start, self.counter_why), self._counter_t = _timed(lambda: read_energy_counter(self.tool))
            self._t = threading.Thread(target=self._loop, name="accel-sampler", daemon=True)
            self._t.start()

    def _take(self) -> None:
        s, t = _timed(lambda: sample(self.tool))
        if s:
            self.samples.append(s)
            self.power.append((t, device_power(s)))
        else:
            self.failed += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._take()
            self._stop.wait(self.interval)

    def _power(self) -> dict:
        tool = self.tool or "the vendor tool"
        if self.counter_start is None:
            return power_block(self.power, self.interval, None, None, self.counter_why, tool=tool)
        (stop, why), t = _timed(lambda: read_energy_counter(self.tool))
        span = t - self._counter_t if self._counter_t is not None else None
        return power_block(self.power, self.interval, self.counter_start, stop, why, tool=tool, counter_s=span)

    def stop(self) -> dict:
        self._stop.set()
        if self._t:
            self._t.join(timeout=10)
            if not self._t.is_alive():
                self._take()  # the run's end, so the power samples cover all of it
        if self.tool is None:
            why = "no nvidia-smi, npu-smi or rocm-smi on this machine"
            return {"available": False, "why": why, "power": {"available": False, "why": why}}
        if not self.samples:
            why = f"{self.tool} gave no sample that parsed ({self.failed} tries)"
            return {"available": False, "tool": self.tool, "why": why, "power": {"available": False, "why": why}}
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
            "power": self._power(),
        }
