"""The invariants check_invariants applies to a normalised report (``vkit.validate.formats``):
VALIDATE in the tuning state machine — no analysis on a broken gauge.

Each check is a small pure function ``check(rep, th, ctx) -> dict`` returning::

    {"id", "title", "status": "pass" | "fail" | "not_applicable",
     "severity": "invalid" | "anomaly" | "info", "evidence": {numbers}, "explanation": str}

``severity`` is what this result means for the verdict: a failed check carries ``invalid``
(the numbers cannot support any verdict: streaming off, TTFT ≡ E2EL, …) or ``anomaly``
(a measurement or physics violation to explain before trusting the run); passes and
not-applicable results carry ``info``. ``evaluate`` runs them all and gives the verdict:
``invalid`` if any failure is invalid, else ``anomaly`` if any is an anomaly, else ``valid``.

Modules: ``common`` (the result vocabulary, ``Thresholds``, the result builder and number
helpers, the TTFT ≡ E2EL ``identity`` finding), one module per family of checks —
``streaming`` (streaming, ttft_e2el_identity, decode_timing), ``timing`` (phase_order,
percentile_samples, warmup_outliers), ``counts`` (error_rate, failed_in_latency_stats,
tokens_vs_requested, complete_run), ``throughput`` (littles_law,
throughput_latency_consistency), ``gauge`` (client vs server: tokens_client_vs_server,
client_saturation, client_server_ttft_gap, server_config, with ``reported_config`` and
``parse_expected_config``), ``energy`` (energy_counter_monotone, power_above_idle, power_coverage:
the energy block's own soundness, failing with severity info) — ``verdict`` (``CHECKS``,
``ENERGY_CHECKS``, ``evaluate``, ``worst``, ``VERDICT_CODE``, ``Check``, ``check_file``) and ``render`` (``render_table``). The names
below are what the rest of vkit imports from ``vkit.validate.invariants``.

Nothing here prints or exits.
"""

from vkit.validate.invariants.common import ANOMALY, FAIL, INFO, INVALID, NA, PASS, Thresholds, identity
from vkit.validate.invariants.counts import (
    check_complete_run,
    check_error_rate,
    check_failed_in_latency_stats,
    check_tokens_vs_requested,
)
from vkit.validate.invariants.energy import check_energy_counter_monotone, check_power_above_idle, check_power_coverage
from vkit.validate.invariants.gauge import (
    check_client_saturation,
    check_client_server_ttft_gap,
    check_server_config,
    check_tokens_client_vs_server,
    parse_expected_config,
    reported_config,
    same_value,
)
from vkit.validate.invariants.render import render_table
from vkit.validate.invariants.streaming import check_decode_timing, check_streaming, check_ttft_e2el_identity
from vkit.validate.invariants.throughput import check_littles_law, check_throughput_latency_consistency
from vkit.validate.invariants.timing import check_percentile_samples, check_phase_order, check_warmup_outliers
from vkit.validate.invariants.verdict import (
    CHECKS,
    ENERGY_CHECKS,
    VERDICT_CODE,
    Check,
    check_file,
    evaluate,
    summary_of,
    worst,
)

__all__ = [
    "ANOMALY", "CHECKS", "ENERGY_CHECKS", "FAIL", "INFO", "INVALID", "NA", "PASS", "VERDICT_CODE", "Check", "Thresholds",
    "check_client_saturation", "check_client_server_ttft_gap", "check_complete_run", "check_decode_timing",
    "check_energy_counter_monotone", "check_error_rate", "check_failed_in_latency_stats", "check_file",
    "check_littles_law", "check_percentile_samples", "check_phase_order", "check_power_above_idle",
    "check_power_coverage", "check_server_config", "check_streaming", "check_throughput_latency_consistency",
    "check_tokens_client_vs_server", "check_tokens_vs_requested", "check_ttft_e2el_identity", "check_warmup_outliers",
    "evaluate", "identity", "parse_expected_config", "render_table", "reported_config", "same_value", "summary_of", "worst",
]
