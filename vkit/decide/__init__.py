"""DECIDE: statistics on validated runs.

``gate`` (the decision: ``gate.decide``, and the state-file glue; it re-exports the names of the
modules below, as before they were split out of it), ``specs`` (metric specs, settings,
``--sigma``), ``rule`` (the vectorised max(2σ, floor) sequential rule, shared with
bench/bench_gate.py), ``runs`` (run loading, check_invariants on each, gauge comparison,
pairing and layout; used by the tune runner and ``drift`` too), ``analysis`` (one metric's
effect, interval, threshold, runs needed and decision), ``stats`` (confidence sequences,
power, FDR), ``drift`` (change-point detectors), ``percent`` (the one number-or-percentage
parser). Imports ``vkit.validate`` (every run is checked first), ``vkit.apply.policy`` (the
must-run rules) and the shared modules; never ``vkit.tune``.
"""
