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
