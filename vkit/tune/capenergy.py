"""Energy and cost at the SLO capacity: the capacity document's ``energy`` block.

A capacity's figures come from the runs at the highest load that held (``Capacity.measured_at``);
their board power is each run's ``summary["vkit"]["energy"]`` (``vkit.measure.energy``), carried
into the run's metrics by :func:`run_metrics`. At the capacity:

- energy per output token and per request (J), mean board power (W, all boards of the server);
- capacity per kilowatt (output tokens/s and requests/s per kW of board power);
- with prices: cost per million output tokens at the capacity, accelerator-hours
  (``--price-per-accelerator-hour`` x accelerators) plus energy (``--price-per-kwh`` x kW), each shown.

Board power only: the host, the network and cooling are not in it (say so where it is shown).
Nothing is invented: without power readings at that load the block says why and gives no figure.
"""

from __future__ import annotations

from dataclasses import dataclass

ENERGY_METRICS = ("j_per_output_token", "j_per_request", "mean_w")


@dataclass(frozen=True)
class Prices:
    per_accelerator_hour: float | None = None
    per_kwh: float | None = None

    def __bool__(self) -> bool:
        return self.per_accelerator_hour is not None or self.per_kwh is not None


def run_metrics(summary: dict) -> dict:
    """A run's energy figures for its capacity record (none when its power was not read)."""
    e = (summary.get("vkit") or {}).get("energy") or {}
    if not e.get("usable"):
        return {}
    return {k: float(e[k]) for k in ENERGY_METRICS if isinstance(e.get(k), (int, float))}


def at_capacity(metrics: dict, accelerators: int | None, prices: Prices | None = None) -> dict:
    """The ``energy`` block of a capacity document from the metrics at its capacity's load."""
    w, jpt = metrics.get("mean_w"), metrics.get("j_per_output_token")
    if w is None or jpt is None or w <= 0:
        return {"available": False, "why": "no board power was read at the capacity's load (no nvidia-smi, npu-smi "
                                           "or rocm-smi power there, or too few samples)"}
    kw = w / 1000.0
    tok, req = metrics.get("output_throughput"), metrics.get("request_throughput")
    out = {"available": True, "scope": "accelerator boards only (no host, network or cooling)",
           "mean_w": w, "j_per_output_token": jpt, "j_per_request": metrics.get("j_per_request"),
           "output_tok_s_per_kw": tok / kw if tok else None, "req_s_per_kw": req / kw if req else None,
           "w_per_accelerator": w / accelerators if accelerators else None}
    if prices and tok:
        hours = 1e6 / tok / 3600.0  # hours to serve a million output tokens at the capacity
        acc = prices.per_accelerator_hour * accelerators * hours if prices.per_accelerator_hour is not None and accelerators else None
        energy = prices.per_kwh * kw * hours if prices.per_kwh is not None else None
        parts = [c for c in (acc, energy) if c is not None]
        out["cost_per_m_output_tokens"] = {"accelerators": acc, "energy": energy, "total": sum(parts) if parts else None,
                                           "price_per_accelerator_hour": prices.per_accelerator_hour,
                                           "price_per_kwh": prices.per_kwh,
                                           "why": None if acc is not None or prices.per_accelerator_hour is None
                                           else "accelerator-hours need --accelerators"}
    return out


def document_metrics(energy: dict, slo_capacity: float | None) -> dict:
    """The capacity document's energy figures the gate can compare (top level): J per output token and board
    power at the capacity, and ``slo_capacity_per_kw`` (the SLO capacity per kW of board power there)."""
    if not energy.get("available"):
        return {}
    out = {"j_per_output_token": energy["j_per_output_token"], "mean_power_w": energy["mean_w"]}
    if slo_capacity:
        out["slo_capacity_per_kw"] = slo_capacity / (energy["mean_w"] / 1000.0)
    return out


__all__ = ["document_metrics", "ENERGY_METRICS", "Prices", "at_capacity", "run_metrics"]
