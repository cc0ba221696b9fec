"""post_start_verify's five checks (seed 004 §9): "the process runs" is not "the service works".

1. ``health``: GET /health answers 200.
2. ``model``: /v1/models serves the expected name (and its max_model_len matches the intended one).
3. ``forward``: a real forward pass — a short streamed completion returns >= 1 output token.
4. ``metrics``: /metrics holds the ``vllm:`` families vkit reads (and cache_config_info matches expectations).
5. ``accelerator``: accelerator memory shows the weights loaded (nvidia-smi, npu-smi or rocm-smi when present; otherwise not applicable, said so).

Each check is pass / fail / not_applicable with evidence. Never prints, never exits.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import requests
import sseclient

from vkit.apply.policy import same_value
from vkit.measure import accel
from vkit.measure.prom import PromParseError, parse

# Families every vkit tool relies on (V1 names; an older alias is accepted where vLLM renamed one).
REQUIRED_FAMILIES = [
    ("vllm:num_requests_running",),
    ("vllm:num_requests_waiting",),
    ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ("vllm:prompt_tokens", "vllm:prompt_tokens_total"),
    ("vllm:generation_tokens", "vllm:generation_tokens_total"),
    ("vllm:num_preemptions", "vllm:num_preemptions_total"),
    ("vllm:time_to_first_token_seconds",),
    ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    ("vllm:e2e_request_latency_seconds",),
    ("vllm:request_queue_time_seconds",),
]

# --expect keys that the server exposes, and where.
CACHE_CONFIG_KEYS = ("block_size", "gpu_memory_utilization", "enable_prefix_caching", "num_gpu_blocks", "cache_dtype")


@dataclass
class Check:
    id: str
    status: str  # pass | fail | not_applicable
    evidence: dict = field(default_factory=dict)
    why: str = ""


@dataclass
class Verification:
    url: str
    model: str
    checks: list[Check]
    unreachable: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.unreachable and all(c.status != "fail" for c in self.checks)

    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    def summary_line(self) -> str:
        bad = self.failed()
        if self.unreachable:
            return f"{self.url} is unreachable: {self.checks[0].why}"
        if not bad:
            return "all checks passed"
        return "; ".join(f"{c.id}: {c.why}" for c in bad)

    def as_dict(self) -> dict:
        return {"url": self.url, "model": self.model, "ok": self.ok, "unreachable": self.unreachable,
                "seconds": self.seconds, "checks": [asdict(c) for c in self.checks]}


def verify(url: str, model: str, expect: dict | None = None, timeout_s: float = 30.0, api_key: str | None = None) -> Verification:
    t0 = time.time()
    url = url.rstrip("/")
    expect = dict(expect or {})
    s = requests.Session()
    if api_key:
        s.headers["Authorization"] = f"Bearer {api_key}"
    health, reachable = _check_health(s, url, timeout_s)
    if not reachable:
        return Verification(url, model, [health], unreachable=True, seconds=time.time() - t0)
    checks = [health, _check_model(s, url, model, expect, timeout_s), _check_forward(s, url, model, timeout_s),
              _check_metrics(s, url, expect, timeout_s), _check_accelerator()]
    if expect:
        checks.append(Check("expect", "not_applicable", {"unchecked": expect},
                            "the server does not expose " + ", ".join(sorted(expect)) + "; check the server log"))
    return Verification(url, model, checks, seconds=time.time() - t0)


def _check_health(s: requests.Session, url: str, timeout_s: float) -> tuple[Check, bool]:
    """1. GET /health answers 200; and whether the server answered at all."""
    try:
        r = s.get(url + "/health", timeout=min(10.0, timeout_s))
    except requests.ConnectionError as e:
        reason = "connection refused" if "refused" in str(e) else str(e).splitlines()[0][:160]
        return Check("health", "fail", {}, reason), False
    except requests.Timeout:
        return Check("health", "fail", {}, f"/health did not answer within {min(10.0, timeout_s):g} s"), False
    ok = r.status_code == 200
    return Check("health", "pass" if ok else "fail", {"status": r.status_code},
                 "" if ok else f"/health answered {r.status_code} (503 = engine dead)"), True


def _check_model(s: requests.Session, url: str, model: str, expect: dict, timeout_s: float) -> Check:
    """2. The model name and max_model_len (taken out of ``expect`` when checked)."""
    try:
        r = s.get(url + "/v1/models", timeout=timeout_s)
        data = r.json().get("data") or [] if r.status_code == 200 else []
    except (requests.RequestException, ValueError) as e:
        return Check("model", "fail", {}, f"/v1/models failed: {e}")
    ids = [m.get("id") for m in data]
    served = next((m for m in data if m.get("id") == model), None)
    if served is None:
        return Check("model", "fail", {"served": ids}, f"the server serves {ids}, not {model!r}")
    ev = {"served": ids, "max_model_len": served.get("max_model_len")}
    want = expect.pop("max_model_len", None)
    if want is not None and not same_value(want, served.get("max_model_len")):
        return Check("model", "fail", ev | {"expected_max_model_len": want},
                     f"max_model_len is {served.get('max_model_len')}, the configuration asked for {want}")
    return Check("model", "pass", ev)


def _check_forward(s: requests.Session, url: str, model: str, timeout_s: float) -> Check:
    """3. A real forward pass, streamed (requests + sseclient-py: one request, cost does not matter here)."""
    body = {"model": model, "prompt": "Hello", "max_tokens": 4, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0.0}
    try:
        t1 = time.time()
        r = s.post(url + "/v1/completions", json=body, stream=True, timeout=timeout_s)
        if r.status_code != 200:
            try:
                msg = r.json().get("error", {}).get("message")
            except ValueError:
                msg = r.text[:200]
            return Check("forward", "fail", {"status": r.status_code}, f"completion answered HTTP {r.status_code}: {msg}")
        usage, events, err = None, 0, None
        for ev in sseclient.SSEClient(r).events():
            if ev.data == "[DONE]":
                break
            obj = json.loads(ev.data)
            if "error" in obj:
                err = obj["error"].get("message") if isinstance(obj["error"], dict) else str(obj["error"])
            if obj.get("choices"):
                events += 1
            if obj.get("usage"):
                usage = obj["usage"]
        n = (usage or {}).get("completion_tokens") or 0
        evidence = {"completion_tokens": n, "events": events, "seconds": round(time.time() - t1, 3)}
        if err:
            return Check("forward", "fail", evidence, f"error inside the stream: {err}")
        if n >= 1:
            return Check("forward", "pass", evidence)
        return Check("forward", "fail", evidence, "the completion returned no output token")
    except (requests.RequestException, ValueError) as e:
        return Check("forward", "fail", {}, f"completion failed: {str(e).splitlines()[0][:200]}")


def _check_metrics(s: requests.Session, url: str, expect: dict, timeout_s: float) -> Check:
    """4. /metrics holds the families vkit reads, and cache_config_info the expected values (taken
    out of ``expect``)."""
    try:
        r = s.get(url + "/metrics", timeout=timeout_s)
        m = parse(r.text) if r.status_code == 200 else None
    except (requests.RequestException, PromParseError) as e:
        return Check("metrics", "fail", {}, f"/metrics failed: {e}")
    if m is None:
        return Check("metrics", "fail", {"status": r.status_code}, f"/metrics answered HTTP {r.status_code}")
    present = set(m.families()) | set(m.samples)
    missing = [alts[0] for alts in REQUIRED_FAMILIES if not any(a in present for a in alts)]
    ev = {"vllm_families": len([f for f in m.families() if f.startswith("vllm:")]), "missing": missing}
    cc = m.first_labels("vllm:cache_config_info") or {}
    wrong = {}
    for k in CACHE_CONFIG_KEYS:
        if k in expect:
            want = expect.pop(k)
            if k in cc and not same_value(want, cc[k]):
                wrong[k] = {"expected": want, "server": cc[k]}
    if missing:
        return Check("metrics", "fail", ev, f"/metrics lacks {', '.join(missing)}")
    if wrong:
        return Check("metrics", "fail", ev | {"cache_config": wrong},
                     "cache_config_info differs: " + ", ".join(f"{k}={v['server']} (wanted {v['expected']})" for k, v in wrong.items()))
    return Check("metrics", "pass", ev | {"cache_config": {k: cc.get(k) for k in CACHE_CONFIG_KEYS if k in cc}})


def _check_accelerator() -> Check:
    """5. Accelerator memory shows the weights loaded (not applicable without a known tool); the boards'
    idle power where the tool reports power."""
    tool = accel.detect()
    rows = accel.sample(tool) if tool else None
    if rows:
        used = max(d["mem_used_mib"] for d in rows)
        ev = {"tool": tool, "devices": len(rows), "mem_used_mib_max": used}
        power = accel.device_power(rows)
        if power and all(w is not None for w in power):
            ev["idle_w"] = sum(power)  # the boards' power with the model loaded and nothing running: once per start
        # Weights of even a small model take well over 500 MiB once loaded with a KV cache.
        return Check("accelerator", "pass" if used > 500 else "fail", ev,
                     "" if used > 500 else "no accelerator shows memory in use: are the weights loaded on another machine?")
    if tool:
        why = "failed" if rows is None else "gave output that did not parse"
        return Check("accelerator", "not_applicable", {"tool": tool}, f"{tool} {why}: accelerator memory not checked")
    return Check("accelerator", "not_applicable", {}, "no nvidia-smi, npu-smi or rocm-smi on this machine")
