"""DECIDE: statistics on validated runs.

``gate`` (runs and gauges, the sequential rule, the decision: ``gate.decide``), ``stats``
(confidence sequences, power, FDR), ``drift`` (change-point detectors), ``percent`` (the one
number-or-percentage parser). Imports ``vkit.validate`` (every run is checked first),
``vkit.apply.policy`` (the must-run rules) and the shared modules; never ``vkit.tune``.
"""
