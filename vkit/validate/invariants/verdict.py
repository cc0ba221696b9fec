"""The entry: ``CHECKS`` in the order they run (then ``ENERGY_CHECKS`` on a report with an energy block),
``evaluate`` (every check on a normalised report and the verdict), ``worst`` of several verdicts,
``VERDICT_CODE`` and ``check_file`` (read, normalise and check one report: what check_invariants does for
each REPORT, as a ``Check``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

from vkit.errors import ExitCode
from vkit.validate.formats import load_report
from vkit.validate.invariants import counts, energy, gauge, streaming, throughput, timing
from vkit.validate.invariants.common import ANOMALY, FAIL, INVALID, Thresholds, _r, _stat, identity

CHECKS: tuple[tuple[str, Callable[[dict, Thresholds, dict], dict]], ...] = (
    ("streaming", streaming.check_streaming),
    ("ttft_e2el_identity", streaming.check_ttft_e2el_identity),
    ("decode_timing", streaming.check_decode_timing),
    ("phase_order", timing.check_phase_order),
    ("error_rate", counts.check_error_rate),
    ("failed_in_latency_stats", counts.check_failed_in_latency_stats),
    ("percentile_samples", timing.check_percentile_samples),
    ("warmup_outliers", timing.check_warmup_outliers),
    ("littles_law", throughput.check_littles_law),
    ("throughput_latency_consistency", throughput.check_throughput_latency_consistency),
    ("tokens_vs_requested", counts.check_tokens_vs_requested),
    ("tokens_client_vs_server", gauge.check_tokens_client_vs_server),
    ("client_saturation", gauge.check_client_saturation),
    ("client_server_ttft_gap", gauge.check_client_server_ttft_gap),
    ("server_config", gauge.check_server_config),
    ("complete_run", counts.check_complete_run),
)

# Run after ``CHECKS`` on a report that carries an energy block (a vkit summary that sampled board power);
# their failures carry severity info and are listed under ``energy_findings``: they void the energy
# figures, not the run.
ENERGY_CHECKS: tuple[tuple[str, Callable[[dict, Thresholds, dict], dict]], ...] = (
    ("energy_counter_monotone", energy.check_energy_counter_monotone),
    ("power_above_idle", energy.check_power_above_idle),
    ("power_coverage", energy.check_power_coverage),
)


def summary_of(rep: dict) -> dict:
    m = rep["metrics"]
    return _r({
        "completed": rep.get("completed"), "failed": rep.get("failed"), "duration_s": rep.get("duration_s"),
        "request_throughput": rep.get("request_throughput"), "output_throughput": rep.get("output_throughput"),
        "mean_input_tokens": rep.get("mean_input_tokens"), "mean_output_tokens": rep.get("mean_output_tokens"),
        "max_concurrency": rep.get("max_concurrency"), "load": rep.get("load"),
        "ttft_mean_ms": _stat(m.get("ttft"), "mean"), "ttft_p99_ms": _stat(m.get("ttft"), "p99"),
        "tpot_mean_ms": _stat(m.get("tpot"), "mean"), "itl_mean_ms": _stat(m.get("itl"), "mean"),
        "e2el_mean_ms": _stat(m.get("e2el"), "mean"), "e2el_p99_ms": _stat(m.get("e2el"), "p99"),
    })


def evaluate(rep: dict, th: Thresholds | None = None, other: dict | None = None, expect: dict | None = None) -> dict:
    """Run every check on a normalised report; the verdict and the per-check results."""
    th = th or Thresholds()
    ctx = {"identity": identity(rep, th), "other": other, "expect": expect or {}}
    checks = [fn(rep, th, ctx) for _, fn in CHECKS]
    has_energy = rep.get("energy") is not None
    energy_checks = [fn(rep, th, ctx) for _, fn in ENERGY_CHECKS] if has_energy else []
    checks += energy_checks
    sev = {c["severity"] for c in checks if c["status"] == FAIL}
    verdict = "invalid" if INVALID in sev else ("anomaly" if ANOMALY in sev else "valid")
    out = {
        "tool": "check_invariants",
        "source": rep.get("source"),
        "format": rep.get("format"),
        "valid": verdict == "valid",
        "verdict": verdict,
        "findings": [c["id"] for c in checks if c["status"] == FAIL and c["severity"] in (INVALID, ANOMALY)],
        "notes": list(rep.get("notes") or []),
        "summary": summary_of(rep),
        "thresholds": _r(asdict(th)),
        "checks": checks,
    }
    if has_energy:
        out["energy_findings"] = [c["id"] for c in energy_checks if c["status"] == FAIL]
    if other is not None:
        out["compare"] = other.get("source")
    if rep.get("records_source"):
        out["records"] = rep["records_source"]
    return out


def worst(verdicts: list[str]) -> str:
    order = {"valid": 0, "anomaly": 1, "invalid": 2}
    return max(verdicts, key=lambda v: order[v]) if verdicts else "valid"


VERDICT_CODE = {"valid": ExitCode.OK, "anomaly": ExitCode.REJECTED, "invalid": ExitCode.INVALID}


@dataclass
class Check:
    """check_invariants' verdict on one report: ``code`` is the exit code the tool gives it."""

    verdict: str
    result: dict

    @property
    def code(self) -> ExitCode:
        return VERDICT_CODE[self.verdict]

    @property
    def findings(self) -> list[str]:
        return list(self.result.get("findings") or [])

    @property
    def failed(self) -> list[str]:
        return [c.get("id") for c in self.result.get("checks", []) if c.get("status") == FAIL]


def check_file(path: str, th: Thresholds | None = None, fmt: str = "auto", records: str | None = None,
               stdin: Any = None, other: dict | None = None, expect: dict | None = None) -> Check:
    """Read, normalise and check one report (``-`` reads ``stdin``): what check_invariants does
    for each REPORT. Unreadable input raises ``UsageError``."""
    res = evaluate(load_report(path, fmt, stdin=stdin, records=records), th, other=other, expect=expect)
    return Check(res["verdict"], res)
