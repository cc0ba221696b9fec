"""bench_stream: the summary contract, error accounting, interrupts, arrivals.

Fault cases the simulator cannot produce (malformed SSE, a stream cut before [DONE])
use the scripted server in tests/fake_server.py; the measurement itself is checked
against a live sim_server in tests/test_bench_stream_sim.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import REPO, call
from tests.fake_server import FakeServer
from vkit.errors import UsageError
from vkit.measure.datasets import arrival_times, jsonl_requests, mixed_requests, random_requests
from vkit.measure.summary import vllm_keys

SMALL = ["--random-input-len", "8", "--random-output-len", "5", "-q"]


def test_summary_keys_are_exactly_vllm_bench_serve_plus_vkit():
    with FakeServer() as s:
        r = call("bench_stream", "--url", s.url, "--num-prompts", "4", "--max-concurrency", "2", *SMALL)
    assert r.code == 0, r
    d = json.loads(r.out)
    assert set(d) - {"vkit"} == set(vllm_keys())
    for k in ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
              "request_goodput", "output_throughput", "total_token_throughput", "max_concurrency", "num_prompts"):
        assert k in d
    assert d["completed"] == 4 and d["failed"] == 0
    assert d["total_output_tokens"] == 20 and d["total_input_tokens"] == 32  # from usage
    assert d["vkit"]["stream"] is True and d["vkit"]["partial"] is False


@pytest.mark.parametrize("transport", ["loop", "threads"])
def test_faults_are_counted_and_kept_out_of_latency_stats(tmp_path, transport):
    rec = tmp_path / "r.jsonl"
    # request 1 is the preflight; 3 malformed SSE, 4 cut before [DONE], 5 HTTP 500
    with FakeServer(modes={3: "malformed", 4: "cut", 5: "500"}) as s:
        r = call("bench_stream", "--url", s.url, "--num-prompts", "8", "--max-concurrency", "1", "--records", str(rec),
                 "--transport", transport, *SMALL[:-1])
    assert r.code == 0, r
    d = json.loads(r.out)
    assert d["completed"] == 5 and d["failed"] == 3
    errs = " ".join(d["vkit"]["errors"])
    assert "malformed SSE" in errs and "before [DONE]" in errs and "HTTP 500" in errs
    rows = [json.loads(line) for line in rec.read_text().splitlines()]
    assert len(rows) == 8
    ok_ttft = [x["ttft_ms"] for x in rows if x["ok"]]
    assert d["mean_ttft_ms"] == pytest.approx(float(np.mean(ok_ttft)))
    assert d["total_output_tokens"] == 25  # failed requests' tokens are not counted
    assert "failed requests" in r.err
    assert d["vkit"]["client"]["transport"] == transport
    assert all(x["id"] == "cmpl-1" for x in rows if x["ok"])  # the response id, for joining with server logs


def test_first_request_rejected_is_usage_error_with_server_message():
    with FakeServer(modes={1: "reject"}) as s:
        r = call("bench_stream", "--url", s.url, "--num-prompts", "3", *SMALL)
    assert r.code == 2
    assert "maximum context length is 4096 tokens" in r.err and len(r.err.strip().splitlines()) == 1


def test_unreachable_server_exit_4_naming_url():
    r = call("bench_stream", "--url", "http://127.0.0.1:9", "--num-prompts", "3", *SMALL)
    assert r.code == 4 and "http://127.0.0.1:9" in r.err


def test_goodput_counts_requests_meeting_every_slo():
    with FakeServer() as s:
        loose = json.loads(call("bench_stream", "--url", s.url, "--num-prompts", "6", "--max-concurrency", "2",
                                "--goodput", "ttft:10000", "e2el:10000", *SMALL).out)
        tight = json.loads(call("bench_stream", "--url", s.url, "--num-prompts", "6", "--max-concurrency", "2",
                                "--goodput", "ttft:0.0001", *SMALL).out)
        none = json.loads(call("bench_stream", "--url", s.url, "--num-prompts", "2", *SMALL).out)
    assert loose["request_goodput"] == pytest.approx(loose["request_throughput"])
    assert tight["request_goodput"] == 0
    assert none["request_goodput"] is None
    r = call("bench_stream", "--url", "http://127.0.0.1:9", "--goodput", "latency:5")
    assert r.code == 2 and "--goodput" in r.err


def test_no_stream_is_recorded_loudly_and_ttft_equals_e2el():
    with FakeServer() as s:
        r = call("bench_stream", "--url", s.url, "--num-prompts", "3", "--no-stream", *SMALL)
    assert r.code == 0
    assert "streaming is OFF" in r.err
    d = json.loads(r.out)
    assert d["vkit"]["stream"] is False
    assert d["mean_ttft_ms"] == pytest.approx(d["mean_e2el_ms"])


@pytest.mark.parametrize("transport", ["loop", "threads"])
@pytest.mark.e2e
def test_sigint_writes_partial_summary_and_records(tmp_path, transport):
    rec = tmp_path / "r.jsonl"
    with FakeServer(token_delay=0.05) as s:
        p = subprocess.Popen(
            [sys.executable, "bin/bench_stream", "--url", s.url, "--num-prompts", "200", "--max-concurrency", "2",
             "--random-input-len", "8", "--random-output-len", "20", "--records", str(rec), "--transport", transport],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        time.sleep(2.5)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    d = json.loads(out)
    assert d["vkit"]["partial"] is True
    assert 0 < d["completed"] < 200
    rows = [json.loads(x) for x in rec.read_text().splitlines()]
    assert len([x for x in rows if x["ok"]]) == d["completed"]
    assert "PARTIAL" in err


def test_arrivals_are_poisson_at_the_asked_rate():
    t = arrival_times(20000, rate=5.0, burstiness=1.0, seed=3)
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(0.2, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential: CV 1
    bursty = np.diff(arrival_times(20000, rate=5.0, burstiness=0.25, seed=3))
    assert bursty.mean() == pytest.approx(0.2, rel=0.05)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.08)  # gamma shape k: CV 1/sqrt(k)
    assert np.all(arrival_times(5, float("inf")) == 0)


def test_exact_rate_arrivals_offer_the_asked_rate_and_keep_the_order_of_the_gaps():
    free, exact = arrival_times(200, rate=40.0, seed=9), arrival_times(200, rate=40.0, seed=9, exact=True)
    assert exact[0] == 0.0 and exact[-1] == pytest.approx(199 / 40.0)
    assert free[-1] != pytest.approx(199 / 40.0, rel=1e-3)  # a free run's own rate is off by chance
    assert np.allclose(np.diff(exact), np.diff(free) * (199 / 40.0) / free[-1])  # the same gaps, scaled


def test_open_loop_send_times_follow_the_schedule(tmp_path):
    rec = tmp_path / "r.jsonl"
    with FakeServer() as s:
        r = call("bench_stream", "--url", s.url, "--num-prompts", "40", "--request-rate", "40", "--seed", "7",
                 "--records", str(rec), *SMALL)
    assert r.code == 0, r
    starts = sorted(json.loads(x)["start_s"] for x in rec.read_text().splitlines())
    planned = arrival_times(40, 40.0, 1.0, seed=7)
    assert np.max(np.abs(np.asarray(starts) - planned)) < 0.05


def test_random_dataset_is_seeded_exact_and_shares_prefix():
    a = random_requests(5, 100, 20, seed=1, shared_prefix_len=32)
    b = random_requests(5, 100, 20, seed=1, shared_prefix_len=32)
    assert [x.prompt for x in a] == [x.prompt for x in b]
    assert all(len(x.prompt) == 132 and x.input_len == 132 and x.ignore_eos for x in a)
    assert all(x.prompt[:32] == a[0].prompt[:32] for x in a) and a[0].prompt[32:] != a[1].prompt[32:]
    v = random_requests(200, 100, 20, range_ratio=0.5, seed=2)
    lens = [x.input_len for x in v]
    assert min(lens) >= 50 and max(lens) <= 150 and len(set(lens)) > 20
    with pytest.raises(UsageError):
        random_requests(1, 10, 10, range_ratio=1.5)


def test_mixed_and_jsonl_datasets(tmp_path):
    m = mixed_requests(500, 64, 1024, 0.2, 32, seed=4)
    longs = sum(1 for x in m if x.extra["class"] == "long")
    assert 70 < longs < 130 and all(x.input_len in (64, 1024) for x in m)
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "what is 2+2?", "output_len": 7}\n\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    rows = jsonl_requests(str(f), 5, 16, chat=True)
    assert len(rows) == 5 and rows[0].messages[0]["content"] == "what is 2+2?" and rows[0].output_len == 7
    assert rows[1].output_len == 16
    with pytest.raises(UsageError, match="--endpoint chat"):
        jsonl_requests(str(f), 2, 16, chat=False)
    f.write_text("{bad\n")
    with pytest.raises(UsageError, match=":1: not valid JSON"):
        jsonl_requests(str(f), 2, 16, chat=True)
    r = call("bench_stream", "--url", "http://127.0.0.1:9", "--dataset-name", "jsonl")
    assert r.code == 2 and "--dataset-path" in r.err


def test_api_key_from_env_is_never_written(monkeypatch):
    monkeypatch.setenv("VKIT_TEST_KEY", "sk-secret-123")
    with FakeServer() as s:
        r = call("bench_stream", "--url", s.url, "--num-prompts", "2", "--api-key-env", "VKIT_TEST_KEY", *SMALL)
    assert r.code == 0, r
    assert "sk-secret-123" not in r.out and "sk-secret-123" not in r.err
    r = call("bench_stream", "--url", "http://127.0.0.1:9", "--api-key-env", "VKIT_NOPE_UNSET", *SMALL)
    assert r.code == 2 and "VKIT_NOPE_UNSET" in r.err


@pytest.mark.e2e
def test_real_script_pipes_json(tmp_path):
    with FakeServer() as s:
        p = subprocess.run(
            f"'{sys.executable}' bin/bench_stream --url {s.url} --num-prompts 3 -q --random-input-len 8 --random-output-len 4"
            f" | '{sys.executable}' -c 'import json,sys; print(json.load(sys.stdin)[\"completed\"])'",
            shell=True, cwd=REPO, capture_output=True, text=True, timeout=60,
        )
    assert p.returncode == 0 and p.stdout.strip() == "3", p.stderr
    assert os.path.exists(os.path.join(REPO, "runbook", "bench_stream.md"))


def test_loop_transport_on_https_is_a_usage_error_before_any_connection():
    r = call("bench_stream", "--url", "https://127.0.0.1:9", "--transport", "loop", "--num-prompts", "3", *SMALL)
    assert r.code == 2 and "--transport threads" in r.err and len(r.err.strip().splitlines()) == 1


def test_summary_of_a_run_interrupted_before_anything_ended():
    """A stop signal can land before the first request is sent (seen in a soak interrupted at a
    window's start): the summary says nothing completed, with zero throughput, and is partial."""
    from vkit.measure import loadgen as bench
    from vkit.measure.datasets import Request

    reqs = [Request(i, prompt=[1] * 8, input_len=8, output_len=4, ignore_eos=True) for i in range(4)]
    cfg = bench.BenchConfig(url="http://x", requests=reqs, max_concurrency=2)
    s, recs = bench.summarize(cfg, "m", [], [], 5.0, 5.0, True, None, extra={})
    assert (s["completed"], s["failed"], s["request_throughput"], s["output_throughput"]) == (0, 0, 0.0, 0.0)
    assert s["vkit"]["partial"] is True and recs == []


def test_a_sharegpt_file_is_read_and_the_dataset_content_is_part_of_the_gauge(tmp_path):
    import json as _json

    from vkit.decide.runs import gauge_of
    from vkit.measure.datasets import jsonl_requests
    from vkit.measure.gauge import BenchOptions, build_config

    share = tmp_path / "share.json"
    share.write_text(_json.dumps([
        {"id": "a", "conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "hi there"},
                                      {"from": "gpt", "value": "hello"}]},
        {"id": "b", "conversations": [{"from": "human", "value": "two"}], "output_len": 7}]))
    chat = jsonl_requests(str(share), None, 16, chat=True)
    assert [r.messages for r in chat] == [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}],
                                          [{"role": "user", "content": "two"}]]
    assert [r.output_len for r in chat] == [16, 7]
    assert [r.prompt for r in jsonl_requests(str(share), None, 16, chat=False)] == ["hi there", "two"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(_json.dumps({"conversations": [{"from": "gpt", "value": "no question"}]}) + "\n")
    with pytest.raises(UsageError, match="no human turn"):
        jsonl_requests(str(bad), None, 16, chat=True)
    # Same name, other content: another gauge.
    one, two = tmp_path / "one" / "p.jsonl", tmp_path / "two" / "p.jsonl"
    for f, text in ((one, "hello"), (two, "goodbye")):
        f.parent.mkdir()
        f.write_text(_json.dumps({"prompt": text}) + "\n")

    def gauge(path):
        cfg = build_config(BenchOptions(dataset_name="jsonl", dataset_path=str(path), num_prompts=2), "http://x", [])
        return gauge_of({"vkit": {**cfg.meta, "stream": True}})[1]

    g1, g2 = gauge(one), gauge(two)
    assert g1["vkit.dataset.sha256"] != g2["vkit.dataset.sha256"]
    assert {k for k in g1 if g1[k] != g2.get(k)} == {"vkit.dataset.sha256", "vkit.dataset.path"}
