"""Which format a report is (``detect``, from its content alone) and reading one (``load_report``:
read, detect, hand to the format's reader)."""

from __future__ import annotations

import io
import json
import os
from typing import Any

from vkit.errors import UsageError
from vkit.validate.formats.aiperf import _aiperf
from vkit.validate.formats.aisbench import _aisbench, _looks_like_ais_csv
from vkit.validate.formats.common import FORMATS, _norm_record, read_records
from vkit.validate.formats.evalscope import _evalscope
from vkit.validate.formats.guidellm import _guidellm
from vkit.validate.formats.vllm import _vkit, _vllm_bench

_EVALSCOPE_KEYS = {
    "Time taken for tests (s)", "Test Duration (s)", "Succeed requests", "Success Requests",
    "Number of concurrency", "Average latency (s)", "Avg Latency (s)", "Request throughput (req/s)",
    "Req Throughput (req/s)", "Average time to first token (s)", "Expected number of requests",
}
_AIS_COMMON = {"Benchmark Duration", "Total Requests", "Success Requests", "Failed Requests", "Request Throughput",
               "Total Generated Tokens", "Total generated tokens", "Prefill Token Throughput", "Concurrency"}
_AIS_PER_REQ = {"E2EL", "TTFT", "TPOT", "ITL", "InputTokens", "OutputTokens", "OutputTokenThroughput",
                "PrefillTokenThroughput"}


def _is_stage_dict(v: Any) -> bool:
    return isinstance(v, dict) and bool(v) and all(isinstance(k, str) for k in v)


def detect(doc: Any) -> str | None:
    """The format of a parsed report, from its content alone; None when unknown."""
    if isinstance(doc, list):
        if doc and all(isinstance(r, dict) and "Percentiles" in r for r in doc):
            return "evalscope"
        return None
    if not isinstance(doc, dict):
        return None
    if isinstance(doc.get("vkit"), dict) and "completed" in doc:
        return "vkit"
    if "aiperf_version" in doc or (isinstance(doc.get("input_config"), dict) and isinstance(doc.get("request_latency"), dict)):
        return "aiperf"
    if isinstance(doc.get("benchmarks"), list) and any(
        isinstance(b, dict) and isinstance(b.get("metrics"), dict) for b in doc["benchmarks"]
    ):
        return "guidellm"
    if "completed" in doc and "request_throughput" in doc and any(k.startswith("mean_") and k.endswith("_ms") for k in doc):
        return "vllm-bench"
    ais = [k for k in doc if k in _AIS_COMMON or k in _AIS_PER_REQ]
    if ais and all(_is_stage_dict(doc[k]) for k in ais):
        return "aisbench"
    if any(k in doc for k in _EVALSCOPE_KEYS) or ("Percentiles" in doc and isinstance(doc["Percentiles"], list)):
        return "evalscope"
    return None


def load_report(path: str, fmt: str = "auto", stdin: io.TextIOBase | None = None, records: str | None = None) -> dict:
    """Read, detect and normalise one report. ``path`` ``-`` reads ``stdin``.

    ``records`` (a JSON Lines path) overrides the records file a vkit summary names."""
    if fmt != "auto" and fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}; one of auto, {', '.join(FORMATS)}")
    name = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            import sys

            text = (stdin or sys.stdin).read()
        else:
            with open(path, encoding="utf-8-sig") as f:
                text = f.read()
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory; give the report file (e.g. benchmark_summary.json)") from None
    except OSError as e:
        raise UsageError(f"cannot read {name}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{name} is not a text file; expected a JSON report (or an AISBench CSV)") from None
    if not text.strip():
        raise UsageError(f"{name} is empty; expected a JSON report (did the benchmark before the pipe fail?)")
    base_dir = os.path.dirname(os.path.abspath(path)) if path != "-" else os.getcwd()
    stem_path = None if path == "-" else path
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        if _looks_like_ais_csv(text):
            doc = {"__ais_csv__": text}
            if fmt not in ("auto", "aisbench"):
                raise UsageError(f"{name} is an AISBench CSV, not a {fmt} report") from None
            return _aisbench(doc, name, stem_path)
        raise UsageError(f"{name} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    got = detect(doc)
    if fmt == "auto":
        if got is None:
            raise UsageError(
                f"cannot tell the format of {name}: not a vkit summary, vllm bench serve --save-result JSON, AISBench perf "
                f"result, evalscope perf summary, GuideLLM JSON or AIPerf profile_export_aiperf.json; name it with --format"
            )
        fmt = got
    if fmt == "vkit":
        if not isinstance(doc, dict) or not isinstance(doc.get("vkit"), dict):
            raise UsageError(f"{name} is not a vkit summary (no \"vkit\" object); try --format auto")
        rep = _vkit(doc, name, base_dir, records)
    elif fmt == "vllm-bench":
        if not isinstance(doc, dict) or "completed" not in doc:
            raise UsageError(f"{name} is not a vllm bench serve result (no \"completed\"); try --format auto")
        rep = _vllm_bench(doc, name)
    elif fmt == "aisbench":
        if not isinstance(doc, dict):
            raise UsageError(f"{name} is not an AISBench perf result (expected a JSON object)")
        rep = _aisbench(doc, name, stem_path)
    elif fmt == "evalscope":
        rep = _evalscope(doc, name, stem_path)
    elif fmt == "aiperf":
        if not isinstance(doc, dict) or not isinstance(doc.get("request_latency", doc.get("request_count")), dict):
            raise UsageError(f"{name} is not an AIPerf profile_export_aiperf.json (no \"request_latency\"); try --format auto")
        rep = _aiperf(doc, name)
    else:
        if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
            raise UsageError(f"{name} is not a GuideLLM report (no \"benchmarks\" list); try --format auto")
        rep = _guidellm(doc, name)
    if records is not None and fmt != "vkit":
        rep["records"] = [_norm_record(r) for r in read_records(records)]
        rep["records_source"] = records
    return rep
