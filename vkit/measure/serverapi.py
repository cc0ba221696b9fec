"""Plain (non-streaming) calls to a vLLM-compatible server with requests: probe,
/version, /v1/models, /metrics scrapes and what vkit reads from them."""

from __future__ import annotations

from typing import Any

import requests

from vkit.errors import Unavailable
from vkit.measure.prom import Metrics, PromParseError, parse

# Families vkit reads from /metrics (V1 names; older names are tried as fallbacks).
COUNTERS = {
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "preemptions": ("vllm:num_preemptions_total",),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "request_success": ("vllm:request_success_total",),
}
HISTOGRAMS = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds",),
    "tpot": ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds"),
    "e2el": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds",),
    "prefill": ("vllm:request_prefill_time_seconds",),
    "decode": ("vllm:request_decode_time_seconds",),
    "inference": ("vllm:request_inference_time_seconds",),
}
GAUGES = {
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
}


class Server:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 10.0):
        self.url = base_url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def get(self, path: str, timeout: float | None = None) -> requests.Response:
        try:
            return self.session.get(self.url + path, timeout=timeout or self.timeout)
        except requests.ConnectionError as e:
            raise Unavailable(f"cannot reach the server at {self.url}: {_reason(e)}") from None
        except requests.Timeout:
            raise Unavailable(f"the server at {self.url} did not answer {path} within {timeout or self.timeout:g} s") from None

    def models(self) -> list[dict]:
        r = self.get("/v1/models")
        if r.status_code != 200:
            raise Unavailable(f"{self.url}/v1/models answered HTTP {r.status_code}")
        try:
            return list(r.json().get("data") or [])
        except ValueError:
            raise Unavailable(f"{self.url}/v1/models did not return JSON") from None

    def version(self) -> dict | None:
        try:
            r = self.get("/version")
            return r.json() if r.status_code == 200 else None
        except (Unavailable, ValueError):
            return None

    def metrics(self) -> Metrics | None:
        try:
            r = self.get("/metrics")
        except Unavailable:
            return None
        if r.status_code != 200:
            return None
        try:
            return parse(r.text)
        except PromParseError:
            return None


def _reason(e: Exception) -> str:
    s = str(e)
    for key in ("Connection refused", "Name or service not known", "No route to host", "timed out"):
        if key in s:
            return key.lower()
    return s.splitlines()[0][:160] if s else type(e).__name__


def _first(m: Metrics, names: tuple[str, ...], fn: str = "total") -> Any:
    for n in names:
        v = getattr(m, fn)(n)
        if v is not None:
            return v
    return None


def gauges(m: Metrics) -> dict:
    return {k: _first(m, names) for k, names in GAUGES.items()}


def delta(before: Metrics | None, after: Metrics | None) -> dict | None:
    """What the server saw between two scrapes: counter deltas and histogram means/quantiles."""
    if before is None or after is None:
        return None
    out: dict[str, Any] = {}
    for key, names in COUNTERS.items():
        if key == "request_success":
            continue
        a, b = _first(after, names), _first(before, names)
        out[key] = None if a is None else a - (b or 0.0)
    by_reason: dict[str, float] = {}
    for lb, v in after.get("vllm:request_success_total"):
        reason = lb.get("finished_reason", "?")
        prev = sum(pv for plb, pv in before.get("vllm:request_success_total") if plb.get("finished_reason") == reason)
        by_reason[reason] = by_reason.get(reason, 0.0) + v - prev
    out["request_success"] = by_reason
    for key, names in HISTOGRAMS.items():
        ha = _first(after, names, "histogram")
        if ha is None:
            out[key] = None
            continue
        h = ha.minus(_first(before, names, "histogram"))
        mean = h.mean()
        out[key] = {
            "count": h.count,
            "mean_ms": None if mean is None else mean * 1000,
            "p50_ms": _ms(h.quantile(0.5)),
            "p95_ms": _ms(h.quantile(0.95)),
            "p99_ms": _ms(h.quantile(0.99)),
        }
    return out


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000


def cache_config(m: Metrics | None) -> dict | None:
    if m is None:
        return None
    lb = m.first_labels("vllm:cache_config_info")
    if lb is None:
        return None
    return {k: v for k, v in lb.items() if k not in ("model_name", "engine")}


def families(m: Metrics | None) -> list[str]:
    if m is None:
        return []
    return sorted(n for n in m.families() if n.startswith("vllm:"))
