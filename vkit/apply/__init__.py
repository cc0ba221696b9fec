"""APPLY: change the server, with rollback as the default branch.

``policy`` (the parameter table: forbidden, must change, must run, situational; parameter
names and the one config-value comparison, which validate and decide read too), ``launcher``
(start, stop, wait for health, read the server log), ``lifecycle`` (restart with rollback,
rollback, recovery after a kill: ``lifecycle.run_held``), ``verify`` (post_start_verify).
Imports ``vkit.measure`` (verify's probes) and the shared modules; never ``vkit.decide`` or
``vkit.tune``.
"""
