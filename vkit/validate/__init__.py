"""VALIDATE: no analysis on a broken gauge.

``formats`` (a subpackage) reads and normalises a report (vkit, vllm bench serve, AISBench,
evalscope, GuideLLM, AIPerf) to vLLM's definitions: ``formats.load`` detects the format and
hands it to its reader (``formats.vllm`` for vkit and vllm-bench, ``formats.aisbench``,
``formats.evalscope``, ``formats.guidellm``, ``formats.aiperf``), ``formats.common`` holds the
normalised report and the helpers they share; ``vkit.validate.formats`` exports ``detect``,
``load_report`` and the rest as before. ``invariants`` (a subpackage too) applies the physical
and measurement invariants and gives the verdict: ``invariants.common`` holds the result types,
``Thresholds`` and the helpers the checks share; the checks live by family in
``invariants.streaming`` (streaming, TTFT ≡ E2EL, decode timed), ``invariants.timing`` (phase
order, percentile samples, warm-up outliers), ``invariants.counts`` (errors, failed requests in
the statistics, tokens vs requested, complete run), ``invariants.throughput`` (Little's law,
throughput vs latency against --compare) and ``invariants.gauge`` (client vs server: token
counters, client saturation, TTFT gap, server configuration); ``invariants.verdict`` runs them
(``evaluate``; ``check_file``: what check_invariants does for one report) and
``invariants.render`` draws the table for people. ``vkit.validate.invariants`` exports
``Thresholds``, ``evaluate``, ``check_file`` and the rest as before.
Imports the shared modules and ``vkit.apply.policy`` (parameter names, config-value equality).
"""
