"""The tune on the virtual backend (vkit.tune.virtual): the lifecycle, the state and every decision
as on a process, the simulator's engine in virtual time underneath, no process started."""

from __future__ import annotations

import glob
import json
import os
import sys

import pytest

from tests.conftest import REPO, call
from vkit.apply.lifecycle import Lifecycle
from vkit.cli.sim_server import parse_virtual
from vkit.state import StateFile
from vkit.tune.virtual import VIRTUAL_PID_BASE, VirtualBackend

pytestmark = pytest.mark.slow

SIM = [sys.executable, os.path.join(REPO, "bin", "sim_server"), "sim-8b", "--port", "1", "--max-model-len", "8192",
       "--sim-gpu", "H200", "--sim-model", "llama-3.1-8b", "--sim-seed", "11", "--sim-startup-s", "60"]
TUNE = ["--virtual", "--sandbox", "--objective", "throughput", "--concurrency", "32", "--input-len", "512",
        "--output-len", "128", "--num-prompts", "200", "--slo", "p95_ttft_ms=1000", "--steps", "1,2", "--budget", "2",
        "--json"]


def init(tmp_path, monkeypatch) -> str:
    path = str(tmp_path / "state.json")
    monkeypatch.setenv("VKIT_STATE", path)
    r = call("state", "init", "--url", "http://127.0.0.1:1", "--model", "sim-8b", "--set", "max_num_batched_tokens=2048",
             "--set", "max_num_seqs=16", "--", *SIM)
    assert r.code == 0, r.err
    return path


def test_a_whole_tune_runs_in_virtual_time_and_no_process_is_started(tmp_path, monkeypatch):
    path = init(tmp_path, monkeypatch)
    r = call("tune", *TUNE)
    assert r.code == 0, r.err[-2000:]
    res = json.loads(r.out)
    st = json.loads(open(path).read())
    # every restart a virtual start, timed on the simulated clock: --sim-startup-s 60 each
    restarts = st["timing"]["restart"]
    assert restarts["n"] >= 5 and restarts["s"] == pytest.approx(60.0 * restarts["n"])
    assert st["service"]["running"]["pid"] >= VIRTUAL_PID_BASE
    logs = sorted(glob.glob(str(tmp_path / "logs" / "server-*")))
    assert logs and all(open(f).read().startswith("(virtual start") for f in logs)
    # the start (16 sequences, a 2048-token budget) carries less than the simulated H200 can: the tune keeps more
    assert res["recommendation"]["config"]["max_num_seqs"] > 16
    runs = glob.glob(str(tmp_path / "runs" / "**" / "rep*.json"), recursive=True)
    assert runs and json.loads(open(runs[0]).read())["vkit"]["client"]["transport"] == "virtual"


def test_the_same_seeded_virtual_tune_decides_the_same_way_twice(tmp_path, monkeypatch):
    outcomes = []
    for i in range(2):
        d = tmp_path / str(i)
        d.mkdir()
        init(d, monkeypatch)
        r = call("tune", *TUNE)
        assert r.code == 0, r.err[-2000:]
        res = json.loads(r.out)
        outcomes.append(([(t["id"], t["config"], t["status"]) for t in res["trials"]], res["recommendation"]["config"]))
    assert outcomes[0] == outcomes[1]


def test_a_start_vllm_refuses_is_rolled_back_in_vllms_words(tmp_path, monkeypatch):
    path = init(tmp_path, monkeypatch)
    sf = StateFile(path)
    lc = Lifecycle(sf, "test", "tester", backend=VirtualBackend(parse_virtual))
    assert lc.rollback(reason="start the kept configuration").ok
    out = lc.restart({"max_model_len": 1_000_000})  # within the policy, above the model: vLLM refuses
    assert (out.ok, out.action) == (False, "rolled_back")
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in out.message
    st = sf.read()
    assert st["service"]["running"]["config"] == st["kept"]["config"]
    assert st["service"]["running"]["pid"] >= VIRTUAL_PID_BASE


def test_a_time_budget_on_the_virtual_backend_is_simulated_time(tmp_path, monkeypatch):
    """--time-budget with --virtual counts what the restarts and runs took on the simulated accelerator:
    a tune of seconds of wall time stops where a real one would, at the budget in simulated time."""
    path = init(tmp_path, monkeypatch)
    steps = [a if a != "1,2" else "1,2,3" for a in TUNE]
    full = call("tune", *steps)
    assert full.code == 0, full.err[-2000:]
    st = json.loads(open(path).read())
    spent = sum(st["timing"][k]["s"] for k in ("restart", "run"))
    budget = spent / 2  # half of what the whole run took: it must give candidates up
    d = tmp_path / "budget"
    d.mkdir()
    path = init(d, monkeypatch)
    r = call("tune", *steps, "--time-budget", f"{budget:.0f}s")
    assert r.code == 0, r.err[-2000:]
    st = json.loads(open(path).read())
    rules = " ".join(s.get("stop_rule") or "" for s in st["steps"])
    assert "time budget" in rules and "given up" in rules
    assert sum(st["timing"][k]["s"] for k in ("restart", "run")) < spent


def test_a_clear_gain_is_kept_when_identical_runs_measure_a_guards_sigma_as_zero(tmp_path, monkeypatch):
    """The simulator with its noise off (every run of a configuration the same): 2,048-token prompts at 32 streams,
    where a 4,096-token budget and 64 sequences carry +11.8 % output tokens/s with P95 TTFT 15 % lower. The
    baseline's P95 TTFT σ is exactly 0; it was once left out of the pooled σ as if unknown, so the guard fell to
    the t-mixture, which has no bound before a third pair, and a confirmation of one block (two pairs) ended
    "undecided" on a gain of four times the threshold: the start was delivered."""
    path = str(tmp_path / "state.json")
    monkeypatch.setenv("VKIT_STATE", path)
    # bench/bench_virtual_fidelity.py's server (a start of 0.5 s): its P95 TTFTs come out bit-identical (with other
    # start times the floating-point sums leave a σ of 1e-14, which the pooling took)
    sim = [*SIM[:SIM.index("--sim-startup-s")], "--sim-startup-s", "0.5", "--sim-speed", "1", "--sim-noise", "0",
           "--sim-restart-noise", "0"]
    r = call("state", "init", "--url", "http://127.0.0.1:1", "--model", "sim-8b", "--set", "max_num_batched_tokens=2048",
             "--set", "max_num_seqs=16", "--", *sim)
    assert r.code == 0, r.err
    tune = [*TUNE, "--ablation", "off", "--ready-timeout", "60"]
    tune[tune.index("--input-len") + 1], tune[tune.index("--output-len") + 1] = "2048", "64"
    tune[tune.index("--slo") + 1] = "p95_ttft_ms=3000"
    r = call("tune", *tune)
    assert r.code == 0, r.err[-2000:]
    res = json.loads(r.out)
    t002 = next(t for t in res["trials"] if t["id"] == "t002")
    assert t002["config"]["max_num_batched_tokens"] == 4096 and t002["verdict"] == "accept"
    assert res["recommendation"]["config"]["max_num_seqs"] == 64, res["recommendation"]
    conf = json.loads(open(path).read())["confirmations"][0]
    # the case: the baseline runs' σ exactly 0, pooled (at its floor) and judged by the normal mixture
    assert [(g["metric"], g["sigma_baseline_runs"], g["method"]) for g in conf["gate"]["guards"]] == [
        ("p95_ttft_ms", 0.0, "normal-mixture confidence sequence (σ pooled)")]


def test_the_fewest_joules_at_a_required_load_are_measured_at_that_load_in_every_search(tmp_path, monkeypatch):
    """--objective j-per-token --required-capacity 12 on the simulator's boards: every capacity search starts at
    12 req/s and gives its J per output token there, and the recommendation says whether it carries 12."""
    path = init(tmp_path, monkeypatch)
    r = call("tune", "--virtual", "--sandbox", "--objective", "j-per-token", "--required-capacity", "12",
             "--input-len", "512", "--output-len", "128", "--num-prompts", "100", "--slo", "p95_ttft_ms=1000",
             "--slo", "mean_tpot_ms=50", "--steps", "3", "--budget", "2", "--baseline-repeats", "3",
             "--confirm-front", "2", "--verify-seconds", "0", "--ablation", "off", "--json")
    assert r.code == 0, r.err[-2000:]
    res = json.loads(r.out)
    st = json.loads(open(path).read())
    assert (res["goal"]["minimize"], res["goal"]["required_capacity"]) == ("ref_j_per_output_token", 12.0)
    assert (st["capacity_reference"]["load"], st["capacity_reference"]["from"]) == (12.0, "--required-capacity")
    docs = [json.loads(open(p).read()) for p in glob.glob(str(tmp_path / "runs" / "**" / "rep*.json"), recursive=True)]
    docs = [d for d in docs if "slo_capacity" in d]
    assert docs and all(d["reference_load"] == 12.0 and d["ref_j_per_output_token"] > 0 for d in docs)
    # the simulated H200 at 12 req/s: more than idle (77.7 W), less than the power limit (700 W), per output token
    toks_s = 12.0 * 128
    assert all(77.7 / toks_s < d["ref_j_per_output_token"] < 700.0 / toks_s for d in docs)
    rec = res["recommendation"]
    assert rec["required_capacity"] == 12.0 and rec["carries_required"] is True
    assert rec["why"].startswith(("the goal is the fewest J per output token while carrying 12", "the kept configuration: it carries 12"))
