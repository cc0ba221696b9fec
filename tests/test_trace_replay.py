"""The business's workload reaches the server as recorded: a JSONL prompt file with its lengths, a
traffic trace replayed open loop at its own arrival offsets (sped up), each row's priority sent
with it; the capacity of a trace is searched over its speed-up."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from tests.conftest import call
from tests.sim_fixtures import SimProcess
from vkit.errors import UsageError
from vkit.measure.datasets import trace_requests


def _trace(path, n: int, rate: float, seed: int = 3, priorities: bool = False) -> list[dict]:
    rng = random.Random(seed)
    t, rows = 1_700_000_000.0, []  # epoch seconds, as a production log has them
    for i in range(n):
        t += rng.expovariate(rate)
        row = {"timestamp": t, "prompt": [10 + (j % 50) for j in range(rng.randint(8, 64))], "output_len": rng.randint(2, 12)}
        if priorities:
            row["priority"] = i % 3
        rows.append(row)
    rng.shuffle(rows)  # a log need not be in time order
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return sorted(rows, key=lambda r: r["timestamp"])


@pytest.mark.unit
def test_a_trace_is_replayed_in_time_order_at_its_offsets_over_the_speedup(tmp_path):
    rows = _trace(tmp_path / "t.jsonl", 20, rate=5.0, priorities=True)
    reqs, offsets = trace_requests(str(tmp_path / "t.jsonl"), None, 128, chat=False, speedup=4.0)
    t0 = rows[0]["timestamp"]
    assert offsets == pytest.approx([(r["timestamp"] - t0) / 4.0 for r in rows])
    assert [r.input_len for r in reqs] == [len(r["prompt"]) for r in rows]
    assert [r.output_len for r in reqs] == [r["output_len"] for r in rows]
    assert [r.extra["priority"] for r in reqs] == [r["priority"] for r in rows]
    (tmp_path / "bad.jsonl").write_text('{"timestamp": 1, "prompt": "a"}\n{"prompt": "b"}\n')
    with pytest.raises(UsageError, match="'timestamp' on every row"):
        trace_requests(str(tmp_path / "bad.jsonl"), None, 8, chat=False)


@pytest.fixture(scope="module")
def sim():
    p = SimProcess("--sim-speed", "10", "--max-model-len", "4096", "--scheduling-policy", "priority")
    yield p
    p.stop()


@pytest.mark.e2e
def test_a_trace_and_a_prompt_file_reach_the_server_with_their_lengths_arrivals_and_priorities(sim, tmp_path):
    rows = _trace(tmp_path / "t.jsonl", 40, rate=20.0, priorities=True)
    rec = tmp_path / "r.jsonl"
    r = call("bench_stream", "--url", sim.url, "--dataset-name", "trace", "--dataset-path", str(tmp_path / "t.jsonl"),
             "--trace-speedup", "2", "--records", str(rec), "-q")
    assert r.code == 0, r.err[-2000:]
    s = json.loads(r.out)
    assert s["completed"] == 40 and s["failed"] == 0
    span = rows[-1]["timestamp"] - rows[0]["timestamp"]
    assert s["request_rate"] == pytest.approx(39 / (span / 2))  # the trace's own mean rate, sped up
    assert s["vkit"]["dataset"]["trace_speedup"] == 2.0 and s["vkit"]["dataset"]["priorities"] == [0, 1, 2]
    lengths = s["vkit"]["lengths"]
    assert lengths["input_tokens"]["count"] == 40 and lengths["input_tokens"]["max"] == max(len(x["prompt"]) for x in rows)
    got = sorted((json.loads(x) for x in rec.read_text().splitlines()), key=lambda x: x["i"])
    t0 = rows[0]["timestamp"]
    want = np.array([(x["timestamp"] - t0) / 2 for x in rows])
    sent = np.array([g["start_s"] for g in got])
    assert np.abs((sent - sent[0]) - want).max() < 0.05  # each request sent at its recorded offset / 2
    assert [g["prompt_tokens"] for g in got] == [len(x["prompt"]) for x in rows]
    # each asked for its recorded output length (a prompt file's request may end at EOS before it)
    assert [g["output_len"] for g in got] == [x["output_len"] for x in rows]
    assert all(1 <= g["completion_tokens"] <= x["output_len"] for g, x in zip(got, rows, strict=True))
    assert [g["priority"] for g in got] == [x["priority"] for x in rows]
    # the same file as a plain prompt file: its lengths, no arrivals of its own
    r = call("bench_stream", "--url", sim.url, "--dataset-name", "jsonl", "--dataset-path", str(tmp_path / "t.jsonl"),
             "--num-prompts", "12", "--max-concurrency", "4", "--records", str(rec), "-q")
    assert r.code == 0, r.err[-2000:]
    got = [json.loads(x) for x in rec.read_text().splitlines()]
    assert sorted(g["prompt_tokens"] for g in got) == sorted(g["input_len"] for g in got) and len(got) == 12


@pytest.mark.e2e
def test_the_capacity_of_a_trace_is_searched_over_its_speedup(sim, tmp_path):
    _trace(tmp_path / "t.jsonl", 120, rate=10.0)
    r = call("capacity", "--url", sim.url, "--mode", "trace", "--dataset-name", "trace", "--dataset-path",
             str(tmp_path / "t.jsonl"), "--slo", "p95_ttft_ms=200", "--start", "4", "--max-points", "8",
             "--run-dir", str(tmp_path / "runs"))
    assert r.code in (0, 1), r.err[-2000:]
    d = json.loads(r.out)
    assert d["mode"] == "trace" and d["unit"] == "x trace speed-up"
    loads = [p["load"] for p in d["curve"]]
    assert 4.0 in loads and len(loads) >= 2
    # each point offered the trace's own rate times its speed-up
    one = next(p for p in d["curve"] if p["valid_runs"])
    assert one["metrics"]["request_throughput"] > 0
    r = call("capacity", "--url", sim.url, "--mode", "trace", "--slo", "p95_ttft_ms=200")
    assert r.code == 2 and "go together" in r.err
