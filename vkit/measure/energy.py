"""A run's energy from the board power sampled beside it: ``summary["vkit"]["energy"]``.

Input: the power block of :class:`vkit.measure.accel.Sampler` (or the simulator's, in the same
shape), the run's duration (first send to last completion), its output tokens and completed
requests, and the boards' idle power where it was measured at the server's start.

The run's mean board power comes from the energy counter where the driver has one (nvidia-smi's
``total_energy_consumption``: the counter's difference over the time between its two reads), else
from the samples' time-weighted mean; energy is that mean times the run's duration. Nothing is
invented: without power readings every figure is None and ``why`` says what was missing.
"""

from __future__ import annotations

KEYS = ("source", "energy_j", "mean_w", "idle_w", "coverage", "covered_s", "duration_s", "samples", "interval_s",
        "counter_j", "sampled_j", "j_per_output_token", "j_per_request", "idle_j", "load_j")


def energy_block(power: dict | None, duration_s: float, output_tokens: int | None, requests: int | None,
                 idle_w: float | None = None) -> dict:
    """The run's energy figures (``KEYS`` plus ``available`` and ``why``)."""
    out: dict = {"available": False, "why": None, **dict.fromkeys(KEYS)}
    out["idle_w"] = idle_w
    out["duration_s"] = duration_s
    if not power or not power.get("available"):
        out["why"] = (power or {}).get("why") or "no board power was sampled during this run"
        return out
    counter, counter_s = power.get("counter_j"), power.get("counter_s")
    if counter is not None and counter >= 0 and counter_s:
        mean_w, source = counter / counter_s, "simulated" if power.get("source") == "simulated" else "counter"
    elif power.get("mean_w") is not None:
        mean_w, source = power["mean_w"], power.get("source") or "sampled"
    else:
        out["why"] = "the power samples gave no mean"
        return out
    energy = mean_w * duration_s if duration_s > 0 else None
    covered = power.get("covered_s")
    out.update(available=energy is not None, source=source, energy_j=energy, mean_w=mean_w, covered_s=covered,
               coverage=min(1.0, covered / duration_s) if covered is not None and duration_s > 0 else None,
               samples=power.get("samples"), interval_s=power.get("interval_s"), counter_j=counter,
               sampled_j=power.get("sampled_j"))
    if energy is None:
        out["why"] = "the run lasted no time"
        return out
    out["j_per_output_token"] = energy / output_tokens if output_tokens else None
    out["j_per_request"] = energy / requests if requests else None
    if idle_w is not None:  # what the boards would have drawn doing nothing, and what the load added
        out["idle_j"] = idle_w * duration_s
        out["load_j"] = energy - out["idle_j"]
    return out


# Sampled power must span this much of the run, in this many samples, for its figures to be used (the same
# limits as check_invariants' power_coverage check, vkit.validate.invariants.energy).
MIN_COVERAGE = 0.8
MIN_SAMPLES = 3

# The run's energy figures the gate can compare, at the summary's top level beside vllm bench serve's keys.
TOP_KEYS = {"j_per_output_token": "j_per_output_token", "j_per_request": "j_per_request", "mean_power_w": "mean_w"}


def add_energy(summary: dict, power: dict | None, idle_w: float | None = None) -> dict:
    """``summary["vkit"]["energy"]`` from ``power`` over the run, and its figures at the top level (only
    where they can be used: a run without power, or whose samples cover too little of it, has no such keys,
    never a zero)."""
    e = energy_block(power, float(summary.get("duration") or 0.0), summary.get("total_output_tokens"),
                     summary.get("completed"), idle_w)
    summary.setdefault("vkit", {})["energy"] = e
    e["usable"] = e["available"]
    if e["available"] and e["source"] == "sampled" and ((e["coverage"] or 0.0) < MIN_COVERAGE or (e["samples"] or 0) < MIN_SAMPLES):
        e["usable"] = False
        e["why"] = (f"the power samples cover {e['coverage'] or 0:.0%} of the run in {e['samples'] or 0} samples (at least "
                    f"{MIN_COVERAGE:.0%} and {MIN_SAMPLES} are needed): a longer run or a shorter sampling interval")
    if e["usable"]:
        for top, k in TOP_KEYS.items():
            if e.get(k) is not None:
                summary[top] = e[k]
    return e


__all__ = ["KEYS", "MIN_COVERAGE", "MIN_SAMPLES", "TOP_KEYS", "add_energy", "energy_block"]
