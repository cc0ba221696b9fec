"""VALIDATE: no analysis on a broken gauge.

``formats`` reads and normalises a report (vkit, vllm bench serve, AISBench, evalscope,
GuideLLM) to vLLM's definitions; ``invariants`` applies the physical and measurement
invariants and gives the verdict (``check_file``: what check_invariants does for one report).
Imports the shared modules and ``vkit.apply.policy`` (parameter names, config-value equality).
"""
