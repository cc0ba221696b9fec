"""The virtual server (vkit.sim.virtual): the simulator's engine in virtual time behind start /
measure / stop, writing the summary and records bench_stream writes."""

from __future__ import annotations

import json

import pytest

from vkit.errors import Unavailable, UsageError
from vkit.measure.gauge import BenchOptions, build_config
from vkit.sim.config import ServeOptions
from vkit.sim.profiles import get_gpu, get_model
from vkit.sim.settings import SimSettings
from vkit.sim.virtual import VirtualServer
from vkit.validate import invariants


def server(**settings) -> VirtualServer:
    opts = ServeOptions(model="llama-8b", gpu=get_gpu("H200"), model_profile=get_model("llama-3.1-8b"))
    return VirtualServer(opts, SimSettings(**{"seed": 1, "noise": 0.0, "restart_noise": 0.0, "startup_s": 60.0,
                                              **settings}))


def workload(**kw):
    o = BenchOptions(**{"random_input_len": 512, "random_output_len": 64, "num_prompts": 120, "seed": 3, **kw})
    return build_config(o, "virtual://llama-8b", ["--seed", str(o.seed)])


def write(tmp_path, summary: dict, records: list[dict]) -> tuple[str, str]:
    path, rec = str(tmp_path / "run.json"), str(tmp_path / "run.jsonl")
    with open(path, "w") as f:
        json.dump(summary, f)
    with open(rec, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return path, rec


def test_a_closed_loop_run_is_what_bench_stream_writes_and_check_invariants_passes_it(tmp_path):
    vs = server()
    assert vs.start({"max_num_seqs": 64}).ok
    s, records = vs.measure(workload(max_concurrency=16, num_warmups=4))
    assert (s["completed"], s["failed"], s["max_concurrency"]) == (120, 0, 16)
    assert s["total_output_tokens"] == 120 * 64 and s["max_concurrent_requests"] == 16
    assert len(records) == 124 and sum(r["warmup"] for r in records) == 4
    assert all(len(r["itl_ms"]) == 63 for r in records if not r["warmup"])
    # the server's /metrics over the measured requests only: the preflight and the warm-ups before it
    d = s["vkit"]["server"]["delta"]
    assert d["generation_tokens"] == 120 * 64 and d["request_success"]["length"] == 120
    assert d["ttft"]["mean_ms"] == pytest.approx(s["mean_ttft_ms"], rel=1e-6)
    path, rec = write(tmp_path, s, records)
    c = invariants.check_file(path, records=rec)
    assert (int(c.code), c.verdict, c.findings) == (0, "valid", [])


def test_a_run_costs_its_simulated_time_and_a_start_its_startup():
    vs = server()
    vs.start({})
    s, _ = vs.measure(workload(max_concurrency=8))
    t = vs.tally
    assert (t.starts, t.runs, t.requests) == (1, 1, 120)
    # 60 s of start-up, a 1-s pause, the preflight, and the run itself
    assert 61.0 + s["duration"] < t.simulated_s < 61.0 + s["duration"] + 1.0
    before = t.simulated_s
    vs.start({"max_num_seqs": 8})
    assert (vs.tally.starts, vs.tally.simulated_s) == (2, pytest.approx(before + 60.0))
    assert vs.running() == {"max_num_seqs": 8}


def test_poisson_at_an_exact_rate_offers_that_rate():
    vs = server()
    vs.start({})
    s, _ = vs.measure(workload(request_rate=12.0, exact_rate=True, num_prompts=240))
    assert s["vkit"]["send_rate"] == pytest.approx(12.0, rel=1e-6)
    assert s["vkit"]["completion_rate"] == pytest.approx(12.0, rel=0.1)


def test_the_same_seed_and_start_give_the_same_run_and_another_start_another_level():
    def tpot(start_index: int) -> float:
        vs = server(restart_noise=0.05, start_index=start_index)
        vs.start({})
        return vs.measure(workload(max_concurrency=16))[0]["mean_tpot_ms"]

    assert tpot(0) == tpot(0)
    assert abs(tpot(1) / tpot(0) - 1) > 0.001  # a new start draws a new level


def test_a_start_vllm_refuses_says_why_in_vllms_words_and_nothing_runs():
    vs = server()
    st = vs.start({"max_model_len": 10_000_000})
    assert not st.ok and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in st.message
    assert vs.running() is None and not vs.healthy()
    assert (vs.tally.starts, vs.tally.failed_starts) == (0, 1)
    with pytest.raises(Unavailable):
        vs.measure(workload(max_concurrency=4))
    with pytest.raises(UsageError, match="max_num_sequences"):
        vs.start({"max_num_sequences": 4})


def test_a_request_over_the_context_is_refused_with_vllms_words(tmp_path):
    vs = server()
    vs.start({"max_model_len": 512})
    s, records = vs.measure(workload(max_concurrency=4, num_prompts=8))
    assert (s["completed"], s["failed"]) == (0, 8)
    assert "maximum context length is 512 tokens" in next(iter(s["vkit"]["errors"]))
    assert {r["status"] for r in records if not r["warmup"]} == {400}


def test_oom_under_load_kills_the_engine_at_its_first_batch():
    vs = server(oom_under_load_bytes=40 << 30)
    assert vs.start({}).ok
    s, _ = vs.measure(workload(max_concurrency=8, num_prompts=16))
    assert s["completed"] == 0 and s["failed"] == 16
    assert any("EngineCore encountered an issue" in e for e in s["vkit"]["errors"])
    assert not vs.healthy() and vs.running() is None
    assert "OutOfMemoryError" in s["vkit"]["virtual"]["engine_died"]
    with pytest.raises(Unavailable, match="engine died"):
        vs.measure(workload(max_concurrency=8))


def test_more_sequences_carry_more_when_the_batch_was_the_limit():
    vs = server()
    vs.start({"max_num_seqs": 4})
    few = vs.measure(workload(max_concurrency=32))[0]["request_throughput"]
    vs.start({"max_num_seqs": 32})
    many = vs.measure(workload(max_concurrency=32))[0]["request_throughput"]
    assert many > 2 * few


@pytest.mark.e2e
def test_virtual_agrees_with_a_live_sim_server_on_the_same_flags():
    """The same workload on a live sim_server (no noise) and on the virtual server: the engine is one.
    What the two may differ in is time, and only one way: a live server can fall behind its schedule (a
    busy machine wakes it late, the HTTP path adds its costs), never run ahead of it. So the counts agree
    exactly, and the live server's step times, scaled back from its speed, are at least the virtual
    ones and within a factor of two of them (a wrong unit or a dropped speed factor is 4x or more). How closely
    they agree on a quiet machine is a benchmark's figure: bench/bench_virtual_fidelity.py."""
    from tests.sim_fixtures import SimProcess
    from vkit.measure.gauge import measure

    speed = 0.25
    o = BenchOptions(random_input_len=512, random_output_len=64, num_prompts=96, seed=5, max_concurrency=16)
    with SimProcess("--max-num-seqs", "32", "--sim-noise", "0", "--sim-restart-noise", "0", "--sim-speed", str(speed),
                    "--sim-model", "llama-3.1-8b", "--sim-gpu", "H200") as sim:
        live = measure(build_config(o, sim.url, ["x"])).summary
    vs = server()
    vs.start({"max_num_seqs": 32})
    virt = vs.measure(build_config(o, "virtual://", ["x"]))[0]
    assert virt["completed"] == live["completed"] == 96
    for key in ("total_input_tokens", "total_output_tokens"):
        assert virt[key] == live[key]
    for key in ("median_tpot_ms", "median_itl_ms", "duration"):
        late = live[key] * speed / virt[key]
        assert 0.97 <= late <= 2.0, (key, live[key], virt[key])
    # a first token is not one-sided: a slow client sends the first wave staggered, into smaller prefills
    assert 0.5 <= live["median_ttft_ms"] * speed / virt["median_ttft_ms"] <= 2.0


@pytest.mark.slow
def test_capacity_searches_a_simulated_deployment_in_virtual_time(tmp_path):
    """bin/capacity --virtual: the shipped search on a simulated deployment, no socket: its runs are
    bench_stream's files, checked by check_invariants; the document says what it cost in simulated time."""
    from tests.conftest import call

    out = tmp_path / "cap.json"
    r = call("capacity", "--virtual", "m --sim-model llama-3.1-8b --sim-gpu H200 --max-model-len 4096 --sim-seed 3",
             "--random-input-len", "2048", "--random-output-len", "64", "--num-prompts", "100",
             "--slo", "p95_ttft_ms=500", "--slo", "mean_tpot_ms=100", "--run-dir", str(tmp_path / "runs"), "-o", str(out))
    assert r.code == 0, r.err
    doc = json.loads(out.read_text())
    lo, hi = doc["interval"]
    # the same deployment's capacity in bench_capacity_interval (ttft-smooth): 11.7 req/s
    assert lo < 11.7 * 1.1 and hi > 11.7 / 1.1 and doc["binding_slo"] == "p95_ttft_ms"
    v = doc["virtual"]
    assert v["starts"] == 1 and v["runs"] == doc["runs"] and v["simulated_s"] > doc["request_seconds"]
    runs = sorted((tmp_path / "runs").glob("rate-*/rep*.json"))
    assert len(runs) == doc["runs"]
    assert json.loads(runs[0].read_text())["vkit"]["client"]["transport"] == "virtual"


def test_capacity_of_a_deployment_vllm_would_not_start_is_exit_4_with_vllms_words(tmp_path):
    from tests.conftest import call

    r = call("capacity", "--virtual", "m --max-model-len 10000000", "--slo", "p95_ttft_ms=500",
             "--run-dir", str(tmp_path / "runs"))
    assert r.code == 4 and "does not start" in r.err and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in r.err
    r = call("capacity", "--virtual", "m --no-such-flag", "--slo", "p95_ttft_ms=500")
    assert r.code == 2 and "not a sim_server command line" in r.err


@pytest.mark.e2e
def test_capacity_virtual_with_unbalanced_quotes_is_a_usage_error_from_the_bin_script(tmp_path):
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    r = subprocess.run([sys.executable, os.path.join(REPO, "bin", "capacity"), "--virtual", "m --served-model-name 'x",
                        "--slo", "p95_ttft_ms=500", "--run-dir", str(tmp_path / "runs")], capture_output=True, text=True)
    assert r.returncode == 2 and "not a sim_server command line" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_start_that_fails_as_sim_server_would_says_what_the_live_one_says():
    st = server(fail_at_start=True).start({})
    assert not st.ok and st.message.startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert "GPU 0 has a total capacity of" in st.message and "--sim-fail-at-start" in st.message
