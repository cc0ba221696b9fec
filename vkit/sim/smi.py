"""What ``nvidia-smi --query-gpu=... --format=csv`` (``npu-smi info`` for Ascend boards) would print for the
simulated boards.

sim_server answers ``GET /sim/nvidia-smi?args=<JSON list>`` (``/sim/npu-smi`` for Ascend boards) with
``{"stdout", "rc"}``: the text the real tool prints for those arguments, from the engine's power meter
(:mod:`vkit.sim.power`). The shim ``vkit/data/smi/nvidia-smi`` (``vkit/data/smi-ascend/npu-smi``) forwards
its arguments there, so with its folder first on ``PATH`` (and
``VKIT_SIM_SMI_URL`` naming the server) bench_stream's sampler, the fingerprint and the start-up check
read the simulated boards through the parser they use on real ones.

Formats follow the real tool (tests/fixtures/accel/nvidia-h200 was saved on an H200, driver 580):
``--format=csv`` prints a header (``index, power.draw [W], ...``) and values with units (``452.40 W``,
``143771 MiB``, ``87 %``); ``noheader`` drops the header, ``nounits`` the units and the header's
brackets. An unknown field prints ``Field "x" is not a valid field to query.`` with exit code 2.

At ``--sim-speed K`` the simulator does K seconds of work per wall second: its energy counter counts
the simulated joules, and ``power.draw`` is their rate per *wall* second (K times the simulated board's
watts), so energy per token and per request come out as the simulated hardware's, as throughput
comes out K times its own.
"""

from __future__ import annotations

from vkit.sim.power import PowerMeter

DRIVER = "580.159.04 (vkit sim)"

# field: (header unit, value formatter)
_FIELDS = {
    "index": ("", lambda d: str(d["index"])),
    "name": ("", lambda d: d["name"]),
    "driver_version": ("", lambda d: DRIVER),
    "memory.total": ("MiB", lambda d: f"{d['memory_total_mib']:.0f}"),
    "memory.used": ("MiB", lambda d: f"{d['memory_used_mib']:.0f}"),
    "utilization.gpu": ("%", lambda d: f"{d['util_pct']:.0f}"),
    "power.draw": ("W", lambda d: f"{d['power_w']:.2f}"),
    "power.limit": ("W", lambda d: f"{d['limit_w']:.2f}"),
    "enforced.power.limit": ("W", lambda d: f"{d['limit_w']:.2f}"),
    "total_energy_consumption": ("mJ", lambda d: f"{d['energy_mj']:.0f}"),
}


def answer(args: list[str], devices: list[dict]) -> tuple[str, int]:
    """(stdout, exit code) of ``nvidia-smi ARGS`` on ``devices``; only the ``--query-gpu`` form is served."""
    query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
    fmt = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), None)
    if query is None or fmt is None or not fmt.split(",")[0] == "csv":
        return ("vkit sim nvidia-smi serves only --query-gpu=FIELDS --format=csv[,noheader][,nounits]\n", 2)
    fields = [f.strip() for f in query.split(",") if f.strip()]
    for f in fields:
        if f not in _FIELDS:
            return (f'Field "{f}" is not a valid field to query.\n\n', 2)
    opts = set(fmt.split(",")[1:])
    units = "nounits" not in opts
    lines = []
    if "noheader" not in opts:
        lines.append(", ".join(f + (f" [{_FIELDS[f][0]}]" if _FIELDS[f][0] and units else "") for f in fields))
    for d in devices:
        vals = []
        for f in fields:
            unit, fmt_v = _FIELDS[f]
            vals.append(fmt_v(d) + (f" {unit}" if units and unit else ""))
        lines.append(", ".join(vals))
    return ("\n".join(lines) + "\n", 0)


# ``npu-smi info`` on an Atlas 800T A2 (910B3), as tests/test_accel.py's NPU_910B: two rows per NPU (the NPU's
# Power(W), then its chip's AICore(%) and HBM-Usage(MB)). Temperature is not modelled: NA, as the tool prints
# for a field a board does not report. One chip per NPU; no energy counter (npu-smi has none).
_NPU_HEAD = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 23.0.rc3 (vkit sim)      Version: 23.0.rc3                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
"""
_NPU_SEP = "+===========================+===============+====================================================+\n"


def answer_npu(args: list[str], devices: list[dict]) -> tuple[str, int]:
    """(stdout, exit code) of ``npu-smi ARGS`` on ``devices``; only ``npu-smi info`` is served."""
    if args != ["info"]:
        return ("vkit sim npu-smi serves only `npu-smi info`\n", 2)
    out = [_NPU_HEAD]
    for d in devices:
        name = d["name"].removeprefix("Ascend")
        hbm = f"{d['memory_used_mib']:.0f}/ {d['memory_total_mib']:.0f}"
        out.append(f"| {d['index']:<5} {name:<19} | OK            | {d['power_w']:<11.1f} {'NA':<17} {'0    / 0':<21}|\n")
        out.append(f"| 0                         | 0000:{0xC1 + d['index']:02X}:00.0  | {d['util_pct']:<11.0f} {'0    / 0':<17} "
                   f"{hbm:<21}|\n")
        out.append(_NPU_SEP)
    return ("".join(out), 0)


def tool_of(gpu_name: str) -> str:
    """The vendor tool a machine with these simulated boards has: npu-smi for Ascend boards, else nvidia-smi."""
    return "npu-smi" if gpu_name.startswith("Ascend") else "nvidia-smi"


# each tool's answer to its arguments, on the boards
ANSWERS = {"nvidia-smi": answer, "npu-smi": answer_npu}


class SmiBoards:
    """The simulated boards as nvidia-smi reports them, read at wall times ``w`` (seconds) and the
    matching virtual times ``v``: power and utilisation averaged since the previous read."""

    def __init__(self, meter: PowerMeter, name: str, memory_total_mib: float, memory_used_mib: float, v0: float, w0: float):
        self.meter = meter
        self.name = name
        self.memory_total_mib = memory_total_mib
        self.memory_used_mib = memory_used_mib
        self.v0 = v0
        self.prev = (w0, v0, meter.energy_j(0.0), meter.busy_s)
        self.last = (meter.idle_w, 0.0)  # (power of all boards, utilisation) at the previous read

    def devices(self, w: float, v: float) -> list[dict]:
        m = self.meter
        e = m.energy_j(max(0.0, v - self.v0), v)
        pw, pv, pe, pbusy = self.prev
        if w - pw >= 0.05 and v > pv:  # a read within 50 ms of the last repeats it
            self.last = ((e - pe) / (w - pw), min(1.0, (m.busy_s - pbusy) / (v - pv)))
            self.prev = (w, v, e, m.busy_s)
        power, util = self.last
        n = m.tp
        return [{"index": i, "name": self.name, "memory_total_mib": self.memory_total_mib,
                 "memory_used_mib": self.memory_used_mib, "util_pct": 100.0 * util, "power_w": power / n,
                 "limit_w": m.board.limit_w, "energy_mj": 1000.0 * e / n} for i in range(n)]


__all__ = ["ANSWERS", "DRIVER", "SmiBoards", "answer", "answer_npu", "tool_of"]
