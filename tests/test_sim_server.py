"""sim_server's HTTP contract, /metrics, logs, start-up failures and faults, against the real process."""

from __future__ import annotations

import json
import math
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests

from tests.conftest import call
from tests.sim_fixtures import SIM_BIN, SimProcess, free_port, sse_events, sse_json
from vkit.measure import prom
from vkit.sim.metrics import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS

FAST = ("--sim-speed", "20", "--max-model-len", "4096", "--sim-output-len-mean", "4")


@pytest.fixture(scope="module")
def sim():
    p = SimProcess(*FAST)
    yield p
    p.stop()


def post(sim, path, body, **kw):
    return requests.post(sim.url + path, json=body, timeout=kw.pop("timeout", 30), **kw)


# -- plain endpoints ----------------------------------------------------------------------------

@pytest.mark.e2e
def test_health_ping_version_models(sim):
    r = requests.get(sim.url + "/health", timeout=5)
    assert r.status_code == 200 and r.content == b""
    assert requests.get(sim.url + "/ping", timeout=5).status_code == 200
    v = requests.get(sim.url + "/version", timeout=5).json()
    assert v["version"].endswith("+sim") and v["sim"] is True and v["sim_speed"] == 20.0
    assert v["sim_gpu"] == "H200" and v["sim_model"] == "llama-3.1-8b"
    m = requests.get(sim.url + "/v1/models", timeout=5).json()
    card = m["data"][0]
    assert m["object"] == "list" and card["id"] == "sim-model" and card["object"] == "model"
    assert card["owned_by"] == "vllm" and card["root"] == "sim-model" and card["parent"] is None
    assert card["max_model_len"] == 4096
    assert requests.get(sim.url + "/nope", timeout=5).status_code == 404
    assert requests.get(sim.url + "/v1/completions", timeout=5).status_code == 405


# -- completions ----------------------------------------------------------------------------------

@pytest.mark.e2e
def test_completion_defaults_to_16_tokens_and_token_id_prompts_are_exact(sim):
    r = post(sim, "/v1/completions", {"model": "sim-model", "prompt": "Hello world", "ignore_eos": True})
    assert r.status_code == 200
    d = r.json()
    assert d["object"] == "text_completion" and d["id"].startswith("cmpl-") and d["model"] == "sim-model"
    assert d["usage"]["completion_tokens"] == 16 and d["usage"]["prompt_tokens"] == 4
    assert d["choices"][0]["finish_reason"] == "length" and d["choices"][0]["text"]
    ids = list(range(300, 377))
    d = post(sim, "/v1/completions", {"prompt": ids, "max_tokens": 3, "ignore_eos": True}).json()
    assert d["usage"] == {"prompt_tokens": 77, "total_tokens": 80, "completion_tokens": 3, "prompt_tokens_details": None}


@pytest.mark.e2e
def test_streaming_completion_sse_framing_and_usage_chunk(sim):
    r = post(sim, "/v1/completions", {"prompt": "a b c", "max_tokens": 7, "ignore_eos": True, "stream": True,
                                      "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks, done = sse_json(r)
    assert done
    tokens, usage = chunks[:-1], chunks[-1]
    assert len(tokens) == 7
    assert all(c["object"] == "text_completion" and c["id"] == tokens[0]["id"] for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 6 + ["length"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 7
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 7
    # The text of the events re-tokenises to exactly the completion tokens.
    from vkit.sim.tokenizer import Tokenizer

    text = "".join(c["choices"][0]["text"] for c in tokens)
    assert len(Tokenizer(128256).encode(text)) == 7


@pytest.mark.e2e
def test_streaming_chat_role_first_then_content_then_done(sim):
    r = post(sim, "/v1/chat/completions", {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}],
                                           "max_tokens": 4, "ignore_eos": True, "stream": True})
    chunks, done = sse_json(r)
    assert done and len(chunks) == 5  # role + 4 tokens, no usage chunk unless asked
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" and c["id"].startswith("chatcmpl-") for c in chunks)
    assert all("content" in c["choices"][0]["delta"] for c in chunks[1:])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


@pytest.mark.e2e
def test_continuous_usage_stats_on_every_chunk(sim):
    r = post(sim, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                           "ignore_eos": True, "stream": True,
                                           "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    chunks, done = sse_json(r)
    assert done and all("usage" in c for c in chunks)
    assert [c["usage"]["completion_tokens"] for c in chunks] == [0, 1, 2, 3, 3]


@pytest.mark.e2e
def test_non_streaming_chat(sim):
    d = post(sim, "/v1/chat/completions", {"messages": [{"role": "system", "content": "be brief"},
                                                        {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                                           "max_completion_tokens": 5, "ignore_eos": True}).json()
    assert d["object"] == "chat.completion" and d["choices"][0]["message"]["role"] == "assistant"
    assert d["usage"]["completion_tokens"] == 5 and d["choices"][0]["finish_reason"] == "length"


@pytest.mark.e2e
def test_without_ignore_eos_the_model_stops_and_min_tokens_holds(sim):
    d = post(sim, "/v1/completions", {"prompt": "tell me", "max_tokens": 500}).json()
    assert d["choices"][0]["finish_reason"] == "stop" and 1 <= d["usage"]["completion_tokens"] <= 8
    d = post(sim, "/v1/completions", {"prompt": "tell me", "max_tokens": 500, "min_tokens": 20}).json()
    assert d["choices"][0]["finish_reason"] == "stop" and d["usage"]["completion_tokens"] == 20


@pytest.mark.e2e
def test_keep_alive_serves_many_requests_on_one_connection(sim):
    with requests.Session() as s:
        for _ in range(5):
            r = s.post(sim.url + "/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 2, "stream": True}, timeout=10)
            assert sse_events(r)[-1] == "[DONE]"
            assert s.get(sim.url + "/health", timeout=5).status_code == 200


# -- error bodies -----------------------------------------------------------------------------------

@pytest.mark.e2e
def test_error_bodies_match_vllm(sim):
    r = post(sim, "/v1/completions", {"model": "nope", "prompt": "x"})
    assert r.status_code == 404
    assert r.json() == {"error": {"message": "The model `nope` does not exist.", "type": "NotFoundError",
                                  "param": "model", "code": 404}}
    r = post(sim, "/v1/completions", {"prompt": list(range(300, 4400)), "max_tokens": 16})
    assert r.status_code == 400
    e = r.json()["error"]
    assert e["message"].startswith("This model's maximum context length is 4096 tokens. ")
    assert e["type"] == "BadRequestError" and e["code"] == 400
    r = post(sim, "/v1/completions", {"prompt": "x", "max_tokens": 5000})
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("max_tokens=5000 cannot be greater than max_model_len=4096")
    r = post(sim, "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "priority": 3})
    assert r.status_code == 400 and "Priority scheduling is not enabled" in r.json()["error"]["message"]
    r = requests.post(sim.url + "/v1/completions", data=b"{not json", timeout=5)
    assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"
    r = post(sim, "/v1/chat/completions", {"model": "sim-model"})
    assert r.status_code == 400


# -- /metrics -----------------------------------------------------------------------------------------

def _value(m, family, sample, **labels):
    for _lab, v in m.get(sample, **labels):
        return v
    raise KeyError((family, sample, labels))


# The Prometheus text exposition format (0.0.4), written out independently of both the simulator's
# writer (vkit/sim/metrics.py) and vkit's client-side parser (vkit/measure/prom.py), so a format error in
# either cannot hide behind the other.
_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_LABEL_VALUE = r'"(?:[^"\\\n]|\\[\\"n])*"'
_PAIR = rf"{_LABEL_NAME}={_LABEL_VALUE}"
_FLOAT = r"[+-]?(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|Inf)|NaN"
_SAMPLE_LINE = re.compile(rf"^({_NAME})(\{{(?:{_PAIR}(?:,{_PAIR})*,?)?\}})?[ \t]+({_FLOAT})(?:[ \t]+-?\d+)?$")
_PAIR_RE = re.compile(rf"({_LABEL_NAME})=({_LABEL_VALUE})")
_HELP_LINE = re.compile(rf"^# HELP ({_NAME}) (?:[^\\\n]|\\[\\n])*$")
_TYPE_LINE = re.compile(rf"^# TYPE ({_NAME}) (counter|gauge|histogram|summary|untyped)$")
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("", "_sum", "_count")}


def check_exposition(text: str) -> None:
    """Assert that ``text`` is valid Prometheus text format: every sample line is ``name{labels} value``,
    every family has ``# HELP`` and ``# TYPE`` before its samples and its samples are grouped under
    them, no sample repeats, and every histogram series has ``le``-ascending cumulative buckets ending
    in ``le="+Inf"`` equal to its ``_count``, plus a ``_sum``."""
    assert text.endswith("\n"), "the exposition must end with a newline"
    helps: set[str] = set()
    types: dict[str, str] = {}
    current = None  # the family whose samples may follow
    seen: set[tuple] = set()
    hists: dict[tuple[str, tuple], dict] = {}
    for n, line in enumerate(text.split("\n")[:-1], 1):
        if not line:
            continue
        if line.startswith("# HELP "):
            mo = _HELP_LINE.match(line)
            assert mo, f"line {n}: bad HELP line {line!r}"
            assert mo.group(1) not in helps, f"line {n}: second HELP for {mo.group(1)}"
            helps.add(mo.group(1))
            continue
        if line.startswith("# TYPE "):
            mo = _TYPE_LINE.match(line)
            assert mo, f"line {n}: bad TYPE line {line!r}"
            fam = mo.group(1)
            assert fam not in types, f"line {n}: second TYPE for {fam} (a family's lines must be one group)"
            types[fam] = mo.group(2)
            current = fam
            continue
        if line.startswith("#"):
            continue
        mo = _SAMPLE_LINE.match(line)
        assert mo, f"line {n}: not a Prometheus sample line: {line!r}"
        name, lab_s = mo.group(1), mo.group(2) or "{}"
        pairs = _PAIR_RE.findall(lab_s)
        labels = {k: v[1:-1] for k, v in pairs}
        assert len(labels) == len(pairs), f"line {n}: a label repeats: {line!r}"
        assert current is not None and name in {current + s for s in _SUFFIXES.get(types[current], ("",))}, \
            f"line {n}: sample {name} is not in the family declared above it ({current})"
        assert current in helps, f"line {n}: family {current} has no # HELP before its samples"
        key = (name, tuple(sorted(labels.items())))
        assert key not in seen, f"line {n}: duplicate sample {line!r}"
        seen.add(key)
        if types[current] == "histogram":
            le = labels.pop("le", None)
            h = hists.setdefault((current, tuple(sorted(labels.items()))), {"buckets": [], "sum": None, "count": None})
            value = float(mo.group(3))
            if name.endswith("_bucket"):
                assert le is not None, f"line {n}: bucket without le: {line!r}"
                h["buckets"].append((le, value))
            else:
                assert le is None, f"line {n}: le on a non-bucket sample: {line!r}"
                h[name[len(current) + 1:]] = value
    for (fam, labels), h in hists.items():
        where = f"{fam}{dict(labels)}"
        b = h["buckets"]
        assert b, f"{where}: histogram without buckets"
        bounds = [float(le) for le, _ in b]
        assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds), f"{where}: le not ascending: {bounds}"
        counts = [c for _, c in b]
        assert counts == sorted(counts), f"{where}: buckets not cumulative: {counts}"
        assert b[-1][0] == "+Inf", f"{where}: last bucket is le={b[-1][0]!r}, not le=\"+Inf\""
        assert h["count"] is not None and h["sum"] is not None, f"{where}: no _count or _sum"
        assert b[-1][1] == h["count"], f"{where}: +Inf bucket {b[-1][1]} != _count {h['count']}"


_GOOD = """# HELP a_total A counter.
# TYPE a_total counter
a_total{x="1",y="q\\"\\\\"} 3.0
# HELP h A histogram.
# TYPE h histogram
h_bucket{le="1.0"} 1.0
h_bucket{le="+Inf"} 2.0
h_count 2.0
h_sum 4.5
"""


@pytest.mark.parametrize("bad, why", [
    (_GOOD.replace("# HELP a_total A counter.\n", ""), "no # HELP"),
    (_GOOD.replace("# TYPE a_total counter\n", ""), "not in the family"),
    (_GOOD.replace('a_total{x="1",', "a_total{x=1,"), "not a Prometheus sample line"),
    (_GOOD.replace("} 3.0", "}3.0"), "not a Prometheus sample line"),
    (_GOOD.replace("} 3.0", "} three"), "not a Prometheus sample line"),
    (_GOOD.replace('le="1.0"} 1.0', 'le="1.0"} 3.0'), "not cumulative"),
    (_GOOD.replace('h_bucket{le="+Inf"} 2.0\n', ""), 'not le="+Inf"'),
    (_GOOD.replace('le="+Inf"} 2.0', 'le="+Inf"} 5.0'), "!= _count"),
    (_GOOD.replace("h_sum 4.5\n", ""), "no _count or _sum"),
    (_GOOD + "a_total{x=\"2\"} 1.0\n", "not in the family"),
    (_GOOD.replace("h_count 2.0\n", "h_count 2.0\nh_count 2.0\n"), "duplicate sample"),
    (_GOOD.rstrip("\n"), "end with a newline"),
])
def test_exposition_checker_catches_format_errors(bad, why):
    check_exposition(_GOOD)
    with pytest.raises(AssertionError, match=re.escape(why)):
        check_exposition(bad)


@pytest.mark.e2e
def test_metrics_are_consistent_with_the_requests_served():
    with SimProcess(*FAST) as sim:
        prompts = [list(range(300, 310)), list(range(400, 420)), list(range(500, 530))]
        usage = []
        for i, p in enumerate(prompts):
            usage.append(post(sim, "/v1/completions", {"prompt": p, "max_tokens": 5 + i, "ignore_eos": True}).json()["usage"])
        for n in (3, 4):
            r = post(sim, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": n,
                                                   "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
            usage.append(sse_json(r)[0][-1]["usage"])
        text = requests.get(sim.url + "/metrics", timeout=5)
        assert text.headers["content-type"].startswith("text/plain")
    check_exposition(text.text)
    m = prom.parse(text.text)  # the client-side parser bench_stream uses against real vLLM
    n = len(usage)
    p_tok = sum(u["prompt_tokens"] for u in usage)
    g_tok = sum(u["completion_tokens"] for u in usage)
    lab = {"model_name": "sim-model", "engine": "0"}

    def one(name, **labels):
        rows = m.get(name, **lab, **labels)
        assert len(rows) == 1, (name, labels, rows)
        return rows[0][1]

    assert m.types["vllm:prompt_tokens_total"] == "counter"
    assert one("vllm:prompt_tokens_total") == p_tok
    assert one("vllm:generation_tokens_total") == g_tok
    assert one("vllm:request_success_total", finished_reason="length") == n
    assert one("vllm:request_success_total", finished_reason="stop") == 0
    assert m.types["vllm:prompt_tokens_created"] == "gauge"
    assert one("vllm:num_preemptions_total") == 0
    assert one("vllm:prefix_cache_queries_total") == p_tok
    assert one("vllm:num_requests_running") == 0
    assert one("vllm:num_requests_waiting") == 0
    assert 0 <= one("vllm:kv_cache_usage_perc") <= 1
    info = m.first_labels("vllm:cache_config_info")
    assert info["block_size"] == "16" and int(info["num_gpu_blocks"]) > 0 and info["engine"] == "0"

    def hist(name):
        assert m.types[name] == "histogram"
        h = m.histogram(name, **lab)
        assert h is not None and h.buckets[-1][0] == math.inf and h.buckets[-1][1] == h.count
        counts = [c for _, c in h.buckets]
        assert counts == sorted(counts)
        return [b for b, _ in h.buckets[:-1]], h.count, h.sum

    assert hist("vllm:time_to_first_token_seconds")[0] == TTFT_BUCKETS
    assert hist("vllm:time_to_first_token_seconds")[1] == n
    assert hist("vllm:inter_token_latency_seconds")[0] == ITL_BUCKETS
    assert hist("vllm:inter_token_latency_seconds")[1] == g_tok - n
    assert hist("vllm:request_time_per_output_token_seconds")[:2] == (ITL_BUCKETS, n)
    for name in ("vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                 "vllm:request_inference_time_seconds", "vllm:request_prefill_time_seconds",
                 "vllm:request_decode_time_seconds"):
        b, c, _ = hist(name)
        assert b == REQUEST_LATENCY_BUCKETS and c == n
    assert hist("vllm:request_prompt_tokens")[1:] == (n, p_tok)
    assert hist("vllm:request_generation_tokens")[1:] == (n, g_tok)
    assert hist("vllm:request_prompt_tokens")[0][:4] == [1, 2, 5, 10]
    it = hist("vllm:iteration_tokens_total")
    assert it[0][:3] == [1, 8, 16] and it[2] == p_tok + g_tok
    e2e_sum = hist("vllm:e2e_request_latency_seconds")[2]
    assert e2e_sum > hist("vllm:time_to_first_token_seconds")[2] > 0


@pytest.mark.e2e
def test_client_disconnect_aborts_the_request():
    with SimProcess("--sim-speed", "1", "--max-model-len", "4096") as sim:
        r = requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3000, "ignore_eos": True,
                                                             "stream": True}, stream=True, timeout=10)
        it = r.iter_lines()
        next(it)
        r.close()
        deadline = time.time() + 5
        while time.time() < deadline:
            fams = prom.parse(requests.get(sim.url + "/metrics", timeout=5).text)
            if _value(fams, "vllm:request_success_total", "vllm:request_success_total", finished_reason="abort") == 1:
                break
            time.sleep(0.05)
        assert _value(fams, "vllm:request_success_total", "vllm:request_success_total", finished_reason="abort") == 1
        assert _value(fams, "vllm:num_requests_running", "vllm:num_requests_running") == 0


# -- lifecycle and logs ---------------------------------------------------------------------------------

@pytest.mark.e2e
def test_connection_refused_while_loading_then_ready_and_sigterm_exits_0():
    sim = SimProcess("--sim-startup-s", "1.5", "--max-model-len", "2k", wait=False)
    try:
        time.sleep(0.6)  # the socket is bound by now, but not listening
        with pytest.raises(requests.ConnectionError):
            requests.get(sim.url + "/health", timeout=2)
        sim.wait_ready()
        assert requests.get(sim.url + "/v1/models", timeout=5).json()["data"][0]["max_model_len"] == 2000
    finally:
        code, out, err = sim.stop()
    assert code == 0, err
    assert "Using max model len 2000" in out
    assert "SIMULATED vLLM" in out and "--sim-speed 1" in out
    assert "GPU KV cache size: " in out and " tokens" in out
    kv_line = next(ln for ln in out.splitlines() if "GPU KV cache size:" in ln)
    assert "," in kv_line.split("GPU KV cache size: ")[1]  # thousands separators
    assert "Maximum concurrency for 2,000 tokens per request: " in out
    assert "INFO:     Application startup complete." in out
    assert "Chunked prefill is enabled with max_num_batched_tokens=8192." in out


@pytest.mark.e2e
def test_periodic_stats_line_reports_wall_clock_throughput():
    with SimProcess("--sim-speed", "2", "--sim-stats-interval-s", "0.5", "--max-model-len", "4096") as sim:
        post(sim, "/v1/completions", {"prompt": list(range(300, 400)), "max_tokens": 50, "ignore_eos": True})
        time.sleep(1.2)
        _, out, _ = sim.stop()
    lines = [ln for ln in out.splitlines() if "Engine 000: Avg prompt throughput:" in ln]
    assert lines
    pat = (r"Engine 000: Avg prompt throughput: [\d.]+ tokens/s, Avg generation throughput: [\d.]+ tokens/s, "
           r"Running: \d+ reqs, Waiting: \d+ reqs, GPU KV cache usage: [\d.]+%, Prefix cache hit rate: [\d.]+%$")

    assert all(re.search(pat, ln) for ln in lines)
    gen = sum(float(re.search(r"generation throughput: ([\d.]+)", ln).group(1)) for ln in lines)
    assert 50 / 0.5 * 0.8 < gen < 50 / 0.5 * 1.2  # 50 tokens in one 0.5 s interval: wall-clock rates


# -- start-up failures (in-process: they fail before listening) ---------------------------------------

def test_max_model_len_too_large_exit_1():
    r = call("sim_server", "m", "--port", str(free_port()), "--sim-startup-s", "0", "--max-model-len", "256k")
    assert r.code == 1
    assert "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig" in r.err
    assert "User-specified max_model_len (256000) is greater than the derived max_model_len" in r.err


def test_kv_cache_too_small_exit_1_like_vllm():
    r = call("sim_server", "m", "--port", str(free_port()), "--sim-startup-s", "0", "--sim-model", "llama-3.1-70b",
             "--sim-gpu", "H100-80G", "-tp", "2")
    assert r.code == 1
    assert "EngineCore failed to start." in r.out
    assert "ValueError: To serve at least one request with the model's max seq len (131072)" in r.out
    assert "the estimated maximum model length is " in r.out
    assert "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}" in r.err


def test_scheduler_validation_and_underscore_flags():
    r = call("sim_server", "m", "--port", str(free_port()), "--sim_startup_s", "0", "--max_model_len", "2048",
             "--max_num_batched_tokens=1024", "--no-enable-chunked-prefill")
    assert r.code == 1
    assert "1 validation error for SchedulerConfig" in r.err
    assert "max_num_batched_tokens (1024) is smaller than max_model_len (2048)." in r.err
    r = call("sim_server", "m", "--port", str(free_port()), "--sim-startup-s", "0", "--max-num-batched-tokens", "100")
    assert r.code == 1 and "must be greater than or equal to max_num_seqs (1024)" in r.err


def test_bad_values_are_usage_errors():
    r = call("sim_server", "m", "--max-num-seqs", "abc")
    assert r.code == 2 and "sim_server: error: argument --max-num-seqs: invalid int value: 'abc'" in r.err
    r = call("sim_server", "m", "--max_num_seqs", "abc")
    assert r.code == 2 and "argument --max-num-seqs: invalid int value: 'abc'" in r.err
    r = call("sim_server", "m", "--max-model-len", "1.5K")
    assert r.code == 2 and "Decimals are not allowed with binary suffixes like K" in r.err
    r = call("sim_server", "m", "--sim-gpu", "TPU")
    assert r.code == 2 and "invalid choice" in r.err
    r = call("sim_server", "m", "--sim-gpu", "CPU")  # the twin's host device: no board to draw power on a live start
    assert r.code == 2 and "invalid choice: 'CPU'" in r.err
    assert call("sim_server").code == 2



@pytest.mark.e2e
def test_data_parallel_size_1_is_accepted_and_more_is_refused():
    from vkit.cli.sim_server import build_parser, normalize_argv
    assert build_parser().parse_args(["m"]).data_parallel_size == 1  # vLLM's default
    for flags in (["-dp", "1"], ["--data-parallel-size", "1"], ["--data-parallel-size=1"], ["--data_parallel_size", "1"]):
        assert build_parser().parse_args(normalize_argv(["m", *flags])).data_parallel_size == 1, flags
    with SimProcess(*FAST, "-dp", "1") as sim:  # serves as one engine, like the default
        r = post(sim, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        engines = {lb["engine"] for lb, _ in prom.parse(requests.get(sim.url + "/metrics", timeout=5).text)
                   .get("vllm:num_requests_running")}
        _, out, err = sim.stop()
    assert engines == {"0"}
    assert "data_parallel_size" not in out + err  # the default is not a non-default arg
    for flag, value in (("-dp", "2"), ("--data-parallel-size", "8"), ("--data_parallel_size", "0")):
        r = call("sim_server", "m", flag, value)
        errors = [ln for ln in r.err.splitlines() if "error:" in ln]
        assert r.code == 2 and errors == [
            f"sim_server: error: argument -dp/--data-parallel-size: the simulator runs one engine; only 1 is "
            f"supported (got {int(value)}): start one sim_server per data-parallel rank instead"], r.err
    r = call("sim_server", "m", "-dp", "two")
    assert r.code == 2 and "sim_server: error: argument -dp/--data-parallel-size: invalid int value: 'two'" in r.err

def test_port_in_use_exit_1():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = call("sim_server", "m", "--port", str(port), "--sim-startup-s", "0")
    assert r.code == 1 and "OSError: [Errno 98] Address already in use" in r.err


@pytest.mark.e2e
def test_bin_smoke_startup_failure_as_a_real_process():
    p = subprocess.run([sys.executable, SIM_BIN, "m", "--port", str(free_port()), "--sim-startup-s", "0",
                        "--sim-model", "qwen2.5-0.5b", "--max-model-len", "64k"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    assert "max_position_embeddings=32768.0" in p.stderr and "Traceback (most recent call last):" in p.stderr


# -- faults ------------------------------------------------------------------------------------------

@pytest.mark.e2e
def test_fail_at_start():
    sim = SimProcess("--sim-fail-at-start", "--sim-startup-s", "0.2", wait=False)
    code = sim.proc.wait(timeout=20)
    _, out, err = sim.stop()
    assert code == 1
    assert "EngineCore failed to start." in out and "torch.OutOfMemoryError: CUDA out of memory." in out
    assert "RuntimeError: Engine core initialization failed." in err


@pytest.mark.e2e
def test_crash_after_n_requests():
    with SimProcess("--sim-speed", "1", "--sim-crash-after", "1", "--max-model-len", "4096") as sim:
        first = {}

        def stream():
            r = requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3000, "ignore_eos": True,
                                                                 "stream": True}, timeout=30)
            first["events"] = sse_events(r)

        t = threading.Thread(target=stream)
        t.start()
        time.sleep(0.3)
        r = post(sim, "/v1/completions", {"prompt": "y", "max_tokens": 3})
        assert r.status_code == 500
        assert r.json()["error"]["message"].startswith("EngineCore encountered an issue.")
        assert requests.get(sim.url + "/health", timeout=5).status_code == 503
        t.join(10)
        evs = first["events"]
        assert evs[-1] == "[DONE]" and json.loads(evs[-2])["error"]["code"] == 500
        code = sim.proc.wait(timeout=10)
        _, out, _ = sim.stop()
    assert code == 1 and "EngineDeadError" in out


@pytest.mark.e2e
def test_hang_health_and_error_rate():
    with SimProcess("--sim-hang-health", "--sim-error-rate", "1", "--sim-startup-s", "0", wait=False) as sim:
        deadline = time.time() + 15
        while time.time() < deadline:  # ready = /v1/models answers (health never does)
            try:
                requests.get(sim.url + "/v1/models", timeout=1)
                break
            except requests.RequestException:
                time.sleep(0.05)
        with pytest.raises(requests.ReadTimeout):
            requests.get(sim.url + "/health", timeout=(2, 0.5))
        r = post(sim, "/v1/completions", {"prompt": "x"})
        assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"


@pytest.mark.e2e
def test_stalled_stream_goes_silent():
    with SimProcess(*FAST, "--sim-stall-stream-after", "3") as sim:
        r = requests.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 10, "ignore_eos": True,
                                                             "stream": True}, stream=True, timeout=(5, 1.0))
        got = []
        with pytest.raises(requests.ConnectionError):
            for line in r.iter_lines():
                if line:
                    got.append(line)
        assert len(got) == 3 and b"[DONE]" not in b"".join(got)


def test_prom_parser_label_escapes_in_one_pass():
    from vkit.measure import prom

    m = prom.parse('x{a="p\\\\nq",b="say \\"hi\\"",c="l1\\nl2"} 1\n')
    (labels, v), = m.samples["x"]
    assert labels == {"a": "p\\nq", "b": 'say "hi"', "c": "l1\nl2"} and v == 1.0


def test_a_pathology_slowdown_below_one_is_refused_with_exit_2():
    from tests.conftest import call

    r = call("sim_server", "m", "--sim-pathology", "short-prefill", "--sim-pathology-slowdown", "0.5")
    assert r.code == 2 and "a slowdown is a factor >= 1" in r.err
