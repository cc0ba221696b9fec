"""VALIDATE: no analysis on a broken gauge.

``formats`` (a subpackage) reads and normalises a report (vkit, vllm bench serve, AISBench,
evalscope, GuideLLM, AIPerf) to vLLM's definitions: ``formats.load`` detects the format and
hands it to its reader (``formats.vllm`` for vkit and vllm-bench, ``formats.aisbench``,
``formats.evalscope``, ``formats.guidellm``, ``formats.aiperf``), ``formats.common`` holds the
normalised report and the helpers they share; ``vkit.validate.formats`` exports ``detect``,
``load_report`` and the rest as before. ``invariants`` applies the physical and measurement
invariants and gives the verdict (``check_file``: what check_invariants does for one report).
Imports the shared modules and ``vkit.apply.policy`` (parameter names, config-value equality).
"""
