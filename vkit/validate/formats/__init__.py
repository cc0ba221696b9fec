"""Read a benchmark report in any of the formats vkit meets and normalise it to one set of
definitions: vLLM's (``vllm bench serve``), so that check_invariants judges every source
with the same invariants.

Formats (``detect`` tells them apart from the content alone):

- ``vkit``: a bench_stream summary (vLLM's ``--save-result`` keys plus ``"vkit"``), with its
  per-request records (JSON Lines) when given or named in ``vkit.records``.
- ``vllm-bench``: ``vllm bench serve --save-result`` JSON, with or without the
  ``--save-detailed`` per-request arrays.
- ``aisbench``: AISBench's perf result ``performances/<model>/<dataset>.json`` (the common
  metrics, values such as ``{"total": "788100.0 ms"}``) with the per-request statistics of
  ``<dataset>.csv`` beside it; the CSV alone, or one JSON holding both tables, also works.
- ``evalscope``: ``evalscope perf``'s ``benchmark_summary.json`` (old and new key names), with
  ``benchmark_percentile.json`` and ``benchmark_args.json`` read from the same directory.
- ``guidellm``: GuideLLM's benchmarks JSON (``benchmarks[].metrics.*`` distributions split into
  successful / incomplete / errored / total).
- ``aiperf``: AIPerf's (NVIDIA, successor of genai-perf) ``profile_export_aiperf.json``: one object per
  metric tag (``{"unit", "avg", "p50", ..., "count"}``) plus ``input_config``, ``was_cancelled``,
  ``is_complete`` and ``error_summary``.

Where a source defines a figure differently from vLLM the normaliser converts it when the
source carries enough to do so, and always says so in ``notes``. Nothing here prints; an
unreadable or unknown input raises ``UsageError`` with a sentence saying what and why.

The normalised report is a plain dict (see ``empty_report``): times in ms unless the key says
``_s``; ``metrics`` holds TTFT, TPOT, ITL and E2EL statistics (``mean``, ``median``, ``std``,
``min``, ``max``, ``pNN``, ``count``) with vLLM's definitions; ``phase`` holds per-request
prefill and decode speeds (tok/s) as distributions.

Modules: ``common`` (the normalised report, number and statistics helpers, per-request
records), ``load`` (``detect`` and ``load_report``), and one reader per format family:
``vllm`` (vkit and vllm-bench), ``aisbench``, ``evalscope``, ``guidellm``, ``aiperf``. The
names below are what the rest of vkit imports from ``vkit.validate.formats``.
"""

from vkit.validate.formats.aiperf import NOTE_AIPERF
from vkit.validate.formats.aisbench import NOTE_AIS
from vkit.validate.formats.common import FORMATS, METRICS, dist_of, empty_report, read_records
from vkit.validate.formats.evalscope import NOTE_EVALSCOPE
from vkit.validate.formats.guidellm import NOTE_GUIDELLM, NOTE_GUIDELLM_TOKEN_WEIGHTED
from vkit.validate.formats.load import detect, load_report
from vkit.validate.formats.vllm import NOTE_VLLM

__all__ = [
    "FORMATS", "METRICS", "NOTE_AIPERF", "NOTE_AIS", "NOTE_EVALSCOPE", "NOTE_GUIDELLM", "NOTE_GUIDELLM_TOKEN_WEIGHTED",
    "NOTE_VLLM", "detect", "dist_of", "empty_report", "load_report", "read_records",
]
