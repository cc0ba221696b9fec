"""MEASURE: how vkit measures a server, first stage of the state machine.

``client`` (one streaming request on its own connection) and ``loopclient`` (every stream on
one thread), ``loadgen`` (bench_stream's closed and open loops, warm-ups, drain),
``runsummary`` (a run's summary document and per-request records, ``summarize``),
``gauge`` (bench_stream's options as data, and one measurement written to files), ``datasets``
(request sets and arrival times), ``summary`` (summary statistics of a run), ``prom`` (the one
Prometheus text parser), ``serverapi`` (plain calls to the server: /version, /v1/models,
/metrics), ``accel`` (accelerator sampling), ``fingerprint`` (the environment a measurement was
made in), ``loadorder`` (across runs of one configuration: a heavier load never makes the decode steps
faster; a lighter, slower run measured a disturbed machine). Imports only the shared modules (``vkit.errors``, ``vkit.state``, ``vkit.interrupts``,
``vkit.jsonio``), never a later stage.
"""
