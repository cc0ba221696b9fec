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
    checks: list[Check] = []

    # 1. health
    try:
        r = s.get(url + "/health", timeout=min(10.0, timeout_s))
        ok = r.status_code == 200
        checks.append(Check("health", "pass" if ok else "fail", {"status": r.status_code},
                            "" if ok else f"/health answered {r.status_code} (503 = engine dead)"))
    except requests.ConnectionError as e:
        reason = "connection refused" if "refused" in str(e) else str(e).splitlines()[0][:160]
        return Verification(url, model, [Check("health", "fail", {}, reason)], unreachable=True, seconds=time.time() - t0)
    except requests.Timeout:
        return Verification(url, model, [Check("health", "fail", {}, f"/health did not answer within {min(10.0, timeout_s):g} s")],
                            unreachable=True, seconds=time.time() - t0)

    # 2. model name and max_model_len
    try:
        r = s.get(url + "/v1/models", timeout=timeout_s)
        data = r.json().get("data") or [] if r.status_code == 200 else []
    except (requests.RequestException, ValueError) as e:
        data, r = [], None
        checks.append(Check("model", "fail", {}, f"/v1/models failed: {e}"))
    if r is not None:
        ids = [m.get("id") for m in data]
        served = next((m for m in data if m.get("id") == model), None)
        if served is None:
            checks.append(Check("model", "fail", {"served": ids}, f"the server serves {ids}, not {model!r}"))
        else:
            ev = {"served": ids, "max_model_len": served.get("max_model_len")}
            want = expect.pop("max_model_len", None)
            if want is not None and not same_value(want, served.get("max_model_len")):
                checks.append(Check("model", "fail", ev | {"expected_max_model_len": want},
                                    f"max_model_len is {served.get('max_model_len')}, the configuration asked for {want}"))
            else:
                checks.append(Check("model", "pass", ev))

    # 3. a real forward pass, streamed (requests + sseclient-py: one request, cost does not matter here)
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
            checks.append(Check("forward", "fail", {"status": r.status_code}, f"completion answered HTTP {r.status_code}: {msg}"))
        else:
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
            ev = {"completion_tokens": n, "events": events, "seconds": round(time.time() - t1, 3)}
            if err:
                checks.append(Check("forward", "fail", ev, f"error inside the stream: {err}"))
            elif n >= 1:
                checks.append(Check("forward", "pass", ev))
            else:
                checks.append(Check("forward", "fail", ev, "the completion returned no output token"))
    except (requests.RequestException, ValueError) as e:
        checks.append(Check("forward", "fail", {}, f"completion failed: {str(e).splitlines()[0][:200]}"))

    # 4. /metrics families (+ cache_config_info expectations)
    try:
        r = s.get(url + "/metrics", timeout=timeout_s)
        m = parse(r.text) if r.status_code == 200 else None
    except (requests.RequestException, PromParseError) as e:
        m = None
        checks.append(Check("metrics", "fail", {}, f"/metrics failed: {e}"))
    if m is not None:
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
            checks.append(Check("metrics", "fail", ev, f"/metrics lacks {', '.join(missing)}"))
        elif wrong:
            checks.append(Check("metrics", "fail", ev | {"cache_config": wrong},
                                "cache_config_info differs: " + ", ".join(f"{k}={v['server']} (wanted {v['expected']})" for k, v in wrong.items())))
        else:
            checks.append(Check("metrics", "pass", ev | {"cache_config": {k: cc.get(k) for k in CACHE_CONFIG_KEYS if k in cc}}))
    elif not any(c.id == "metrics" for c in checks):
        checks.append(Check("metrics", "fail", {"status": r.status_code}, f"/metrics answered HTTP {r.status_code}"))

    # 5. accelerator memory
    tool = accel.detect()
    rows = accel.sample(tool) if tool else None
    if rows:
        used = max(d["mem_used_mib"] for d in rows)
        ev = {"tool": tool, "devices": len(rows), "mem_used_mib_max": used}
        # Weights of even a small model take well over 500 MiB once loaded with a KV cache.
        checks.append(Check("accelerator", "pass" if used > 500 else "fail", ev,
                            "" if used > 500 else "no accelerator shows memory in use: are the weights loaded on another machine?"))
    elif tool:
        why = "failed" if rows is None else "gave output that did not parse"
        checks.append(Check("accelerator", "not_applicable", {"tool": tool}, f"{tool} {why}: accelerator memory not checked"))
    else:
        checks.append(Check("accelerator", "not_applicable", {}, "no nvidia-smi, npu-smi or rocm-smi on this machine"))

    if expect:
        checks.append(Check("expect", "not_applicable", {"unchecked": expect},
                            "the server does not expose " + ", ".join(sorted(expect)) + "; check the server log"))
    return Verification(url, model, checks, seconds=time.time() - t0)
