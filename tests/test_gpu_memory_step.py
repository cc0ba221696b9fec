"""Step 4m: the highest gpu_memory_utilization that starts, by bisection on the start-up outcome
(fewer starts than auto_tune.sh's step-down from 0.98), its KV size as the simulator's memory model
predicts it, and a value that starts but dies under the load rejected with its evidence."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.conftest import REPO, call
from tests.sim_helpers import free_port
from vkit.apply import launcher
from vkit.apply.policy import Policy
from vkit.measure.gauge import BenchOptions
from vkit.search import gpumem
from vkit.search.gpumem import Probe
from vkit.sim.config import ServeOptions, resolve
from vkit.sim.profiles import get_gpu, get_model
from vkit.state import StateFile, new_state
from vkit.tune import steps
from vkit.tune.config import Settings, Workload
from vkit.tune.context import Tune, new_tune

GiB_T = 79.19  # an 80 GB device as vLLM prints its total


def stub_start(answer: float, free_line: bool = False):
    """Starts as a device whose free memory allows ``answer`` and not ``answer + 0.01``: above it, vLLM's
    memory refusal (its free-memory line, or a CUDA OOM without figures)."""
    def start(v: float) -> Probe:
        if v <= answer + 1e-9:
            return Probe(v, True, kv_cache_tokens=int(v * 1_000_000))
        free = (answer + 0.004) * GiB_T
        if free_line:
            quote = (f"ValueError: Free memory on device ({free:.2f}/{GiB_T} GiB) on startup is less than desired GPU memory "
                     f"utilization ({v}, {v * GiB_T:.2f} GiB). Decrease GPU memory utilization or reduce GPU memory used by "
                     "other processes.")
            return Probe(v, False, kind="gpu_memory_taken", quote=quote)
        return Probe(v, False, kind="oom", quote="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB.")
    return start


@pytest.mark.unit
def test_bisection_finds_the_answer_in_fewer_starts_than_the_step_down():
    # kept 0.90; the device starts up to 0.93: auto_tune.sh tries 0.98, 0.97, ..., 0.93 (6 starts)
    r = gpumem.bisect(0.90, 0.98, stub_start(0.93))
    assert r["value"] == 0.93 and r["kv_cache_tokens"] == 930_000
    assert [(p["value"], p["started"]) for p in r["probes"]] == [(0.98, False), (0.94, False), (0.92, True), (0.93, True)]
    assert (r["starts"], r["step_down_starts"]) == (4, 6)
    # vLLM's free-memory line bounds the answer: the top, then F/T floored: 2 starts
    r = gpumem.bisect(0.90, 0.98, stub_start(0.93, free_line=True))
    assert r["value"] == 0.93 and [p["value"] for p in r["probes"]] == [0.98, 0.93] and r["starts"] == 2


@pytest.mark.unit
@pytest.mark.parametrize("free_line", [False, True])
def test_bisection_is_right_for_every_answer_and_never_worse_than_log2(free_line):
    tot = down = 0
    for h in range(90, 99):
        r = gpumem.bisect(0.90, 0.98, stub_start(h / 100, free_line))
        assert r["value"] == h / 100 and r["monotone"]
        assert r["starts"] <= (2 if free_line else 4)  # 1 + ceil(log2(8))
        assert r["step_down_starts"] == 98 - h + 1
        tot, down = tot + r["starts"], down + r["step_down_starts"]
    assert (tot, down) == ((16, 45) if free_line else (33, 45))


@pytest.mark.unit
def test_the_top_starting_costs_one_start_and_a_kept_value_at_the_top_none():
    assert gpumem.bisect(0.92, 0.98, stub_start(0.98))["starts"] == 1
    assert gpumem.next_value(0.98, 0.98, []) is None
    assert gpumem.free_ratio("no such line") is None


# -- the step on a stubbed runner: a value that starts but dies under the load --------------------------
def kv(v: float) -> int:
    return int(round(v * 1_000_000))


class StubServer:
    """No server: a value starts when <= ``start_max`` (CUDA OOM above), and a started value's engine dies
    under the load when > ``load_max`` (check_invariants' server_died); the gate accepts the rest."""

    def __init__(self, t, start_max: float, load_max: float):
        self.t, self.start_max, self.load_max, self.starts = t, start_max, load_max, []

    def apply(self, config, fresh=False):
        v = config["gpu_memory_utilization"]
        self.starts.append(v)
        if v > self.start_max + 1e-9:
            return False, {"diagnosis": {"kind": "oom", "quote": "torch.OutOfMemoryError: CUDA out of memory."}}
        with self.t.sf.transaction() as st:
            st["service"]["running"] = {"pid": 1, "config": dict(config)}
            st["service"]["startup"] = {"kv_cache_tokens": kv(v)}
        return True, {"startup": {"kv_cache_tokens": kv(v)}}

    def run_trial(self, tid, **kw):
        t = self.t.ledger.trial(tid)
        v = t["config"]["gpu_memory_utilization"]
        ok, res = self.apply(t["config"], fresh=True)
        su = res.get("startup") or {}
        if v > self.load_max + 1e-9:
            return self.t.sf.tune.update_trial(tid, status="invalid", valid=False, verdict=None, startup=su,
                                               checks=[{"code": 3, "verdict": "invalid", "findings": ["server_died"]}],
                                               why="invalid measurement (server_died): no verdict")
        return self.t.sf.tune.update_trial(tid, status="done", valid=True, verdict="accept", startup=su, checks=[{"code": 0}],
                                           metrics={"output_throughput": 110.0}, why="stub gate: accept")

    def confirm_and_keep(self, tid, selected_from, **kw):
        t = self.t.ledger.trial(tid)
        with self.t.sf.transaction() as st:
            st["kept"]["config"] = dict(t["config"])
        self.t.sf.tune.update_trial(tid, kept=True)
        return {"decision": "kept", "why": "stub gate: accept", "a_runs": [], "b_runs": []}

    def confirm_plan(self, *a, **kw):
        return {"fits": True, "why": "stub"}


def stub_tune(sf: StateFile, start_max: float, load_max: float) -> tuple[Tune, StubServer]:
    """A tune whose seat, trials and confirmations are the stub's (the step's calls go to the narrow objects)."""
    t = new_tune(sf, Settings(workload=Workload(BenchOptions(num_prompts=50))), lambda m: None, tool_name="tune")
    stub = StubServer(t, start_max, load_max)
    t.seat.apply, t.seat.settle = stub.apply, lambda: None
    t.trials.run, t.confirmer.confirm_and_keep, t.budget.confirm_plan = stub.run_trial, stub.confirm_and_keep, stub.confirm_plan
    return t, stub


@pytest.mark.unit
def test_a_value_that_starts_but_dies_under_the_load_is_rejected_with_its_evidence(tmp_path):
    sf = StateFile(str(tmp_path / "st" / "vkit.json"))
    kept = {"max_num_seqs": 16, "gpu_memory_utilization": 0.90}
    sf.create(new_state("http://127.0.0.1:9", "m", ["serve", "m"], kept))
    with sf.transaction() as st:
        st["service"]["running"] = {"pid": 1, "config": dict(kept)}
        st["service"]["startup"] = {"kv_cache_tokens": kv(0.90)}
        st["baseline"] = {"config": dict(kept), "runs": [], "metrics": {"output_throughput": 100.0}}
    r, stub = stub_tune(sf, start_max=0.96, load_max=0.93)
    rec = steps.run_gpu_memory_step(r, Policy.load(), lambda m: None, budget=4)
    b = rec["bisection"]
    assert (b["value"], b["starts"], b["step_down_starts"], b["rollbacks"]) == (0.96, 4, 3, 2)
    assert [p["value"] for p in b["probes"]] == [0.98, 0.94, 0.96, 0.97]
    # 0.96 starts, its engine dies under the load: rejected with the evidence; the bisection steps down to 0.93
    v = rec["validations"]
    assert [(x["value"], bool(x.get("rejected"))) for x in v] == [(0.96, True), (0.93, False)]
    assert "server_died" in v[0]["evidence"][0]
    t96 = next(t for t in sf.read()["trials"] if t["id"] == v[0]["trial_id"])
    assert t96["verdict"] == "reject" and "fails under the load" in t96["why"] and t96["load_failure"]
    assert sf.read()["kept"]["config"]["gpu_memory_utilization"] == 0.93
    k = rec["kv_cache"]
    assert (k["kept_tokens"], k["tokens"], k["gained_tokens"]) == (kv(0.90), kv(0.93), kv(0.93) - kv(0.90))
    assert k["metric_gain_screening"] == pytest.approx(0.10) and k["decision"] == "kept"
    assert "KV cache 900,000 -> 930,000 tokens (+30,000, +3.3%)" in rec["result"]
    # resumed: the finished step is not run again, and no probe is repeated
    n = len(stub.starts)
    assert steps.run_gpu_memory_step(r, Policy.load(), lambda m: None, budget=4)["finished"] == rec["finished"]
    assert len(stub.starts) == n


@pytest.mark.unit
def test_a_probe_refused_for_memory_does_not_count_toward_abnormal(tmp_path):
    sf = StateFile(str(tmp_path / "st" / "vkit.json"))
    sf.create(new_state("http://127.0.0.1:9", "m", ["serve", "m"], {"gpu_memory_utilization": 0.90}))
    r, _ = stub_tune(sf, start_max=0.90, load_max=0.90)
    with sf.transaction() as st:
        st["start_failures"] = 1
    found = steps.find_highest_start(r, 0.90, 0.98, lambda m: None)
    assert found["value"] == 0.90 and sf.read()["start_failures"] == 0
    assert [e["kind"] for e in sf.log.read() if e.get("event") == "probe_failure"] == ["oom"] * found["starts"]


# -- on the simulator: the found value and its KV size are what vkit/sim/config.py predicts --------------
def predicted_kv(v: float) -> int:
    o = ServeOptions(model="sim-8b", gpu=get_gpu("H200"), model_profile=get_model("llama-3.1-8b"), max_model_len=4096,
                     max_num_seqs=16, max_num_batched_tokens=2048, gpu_memory_utilization=v)
    return resolve(o).kv_cache_tokens


def sim(port: int, *extra: str) -> list[str]:
    return [sys.executable, os.path.join(REPO, "bin", "sim_server"), "sim-8b", "--port", str(port), "--sim-speed", "4",
            "--sim-startup-s", "0.2", "--sim-seed", "5", "--max-model-len", "4096", *extra]


def _svc(tmp_path, monkeypatch, *extra: str):
    port = free_port()
    st = str(tmp_path / "st" / "vkit.json")
    monkeypatch.setenv("VKIT_STATE", st)
    r = call("state", "init", "--url", f"http://127.0.0.1:{port}", "--model", "sim-8b", "--set", "max_num_seqs=16",
             "--set", "max_num_batched_tokens=2048", "--", *sim(port, *extra))
    assert r.code == 0, r
    yield {"state": st, "sf": StateFile(st), "dir": tmp_path}
    launcher.stop(StateFile(st).read()["service"].get("running"), grace_s=3)


@pytest.fixture
def svc(tmp_path, monkeypatch):
    yield from _svc(tmp_path, monkeypatch)


# another process holds 4 GiB of the H200's 140.4: 0.97 is the highest value that starts (136.4 / 140.4 free); the
# engine needs 5 GiB outside its budget under load: 0.93 leaves 140.4 x 0.07 - 4 = 5.8 GiB, 0.94 only 4.4
CROWDED = ("--sim-memory-in-use-gib", "4", "--sim-oom-under-load-gib", "5")


@pytest.fixture
def crowded(tmp_path, monkeypatch):
    yield from _svc(tmp_path, monkeypatch, *CROWDED)


@pytest.mark.e2e
def test_on_the_simulator_every_value_starts_and_the_kv_size_is_the_memory_model(svc):
    r = new_tune(svc["sf"], Settings(workload=Workload(BenchOptions(num_prompts=50)), ready_timeout_s=30), lambda m: None,
               tool_name="tune")
    # the simulator has no memory held by other processes: 0.98 starts, one start answers
    found = steps.find_highest_start(r, 0.92, 0.98, lambda m: None)
    assert (found["value"], found["starts"], found["step_down_starts"]) == (0.98, 1, 1)
    assert found["kv_cache_tokens"] == predicted_kv(0.98)
    # and the KV capacity grows with the value: the default's (0.92), probed the same way
    low = steps.find_highest_start(r, 0.90, 0.92, lambda m: None)
    assert low["kv_cache_tokens"] == predicted_kv(0.92) < found["kv_cache_tokens"]


@pytest.mark.e2e
def test_tune_step_4m_reports_the_kv_gained_next_to_the_throughput_gained(svc):
    fast = ["--sandbox", "--objective", "throughput", "--concurrency", "16", "--input-len", "256", "--output-len", "64",
            "--num-prompts", "100", "--baseline-repeats", "3", "--screen-repeats", "1", "--ready-timeout", "30",
            "--slo", "p95_ttft_ms=5000", "--guard", "p95_ttft_ms:-:50%", "--confirm-front", "0"]
    r = call("tune", *fast, "--steps", "4m", "--budget", "2", "--json", "--report-dir", str(svc["dir"] / "rep"))
    assert r.code == 0, r.err[-3000:]
    res = json.loads(r.out)
    step = next(s for s in res["steps"] if s["step"] == "4m")
    kvd = step["kv_cache"]
    # the kept configuration left the value at the default, 0.92, as the server reported it
    assert (kvd["kept_value"], kvd["value"]) == (0.92, 0.98)
    assert (kvd["kept_tokens"], kvd["tokens"]) == (predicted_kv(0.92), predicted_kv(0.98))
    assert kvd["gained_tokens"] == predicted_kv(0.98) - predicted_kv(0.92) > 0
    assert kvd["metric"] == "output_throughput" and kvd["metric_gain_screening"] is not None
    assert "1 start(s)" in step["stop_rule"] and "would take 1" in step["stop_rule"]
    rec = next(s for s in svc["sf"].read()["steps"] if s["step"] == "4m")
    assert rec["bisection"]["probes"][0]["value"] == 0.98 and rec["bisection"]["probes"][0]["started"]


@pytest.mark.unit
def test_one_engine_death_in_a_run_measured_again_is_evidence(tmp_path):
    sf = StateFile(str(tmp_path / "st" / "vkit.json"))
    sf.create(new_state("http://127.0.0.1:9", "m", ["serve", "m"], {"gpu_memory_utilization": 0.90}))
    r, _ = stub_tune(sf, start_max=0.98, load_max=0.98)
    t = r.trials.new("4m", {"gpu_memory_utilization": 0.95}, "validate")
    t = r.trials.run(t["id"])
    assert steps.load_failure(r, t) == []
    r.log("server_died", label=t["id"], run=1, config=t["config"], errors={"HTTP 500": 12})
    assert steps.load_failure(r, t) == ["the engine died during run 1 (12x HTTP 500): restarted and measured again"]


@pytest.mark.e2e
def test_a_value_that_starts_but_dies_under_load_is_rejected_and_the_search_steps_down(crowded):
    """On the simulator, with memory held by another process and an engine that needs room outside its budget under
    load: the bisection reads vLLM's free-memory line (0.98 refused, 0.97 starts: two starts), 0.97 dies of CUDA out
    of memory under the load (twice: restarted once) and is rejected with that evidence; the next candidate is the
    midpoint 0.94, which dies too; the budget of 2 validations is then spent. The service ends on the kept 0.92."""
    fast = ["--sandbox", "--objective", "throughput", "--concurrency", "16", "--input-len", "256", "--output-len", "64",
            "--num-prompts", "100", "--baseline-repeats", "3", "--screen-repeats", "1", "--ready-timeout", "30",
            "--slo", "p95_ttft_ms=5000", "--guard", "p95_ttft_ms:-:50%", "--confirm-front", "0"]
    r = call("tune", *fast, "--steps", "4m", "--budget", "2", "--json")
    assert r.code == 0, r.err[-3000:]
    step = next(s for s in StateFile(os.environ["VKIT_STATE"]).read()["steps"] if s["step"] == "4m")
    probes = step["bisection"]["probes"]
    assert [(p["value"], p["started"]) for p in probes] == [(0.98, False), (0.97, True)]
    assert probes[0]["kind"] == "gpu_memory_taken" and "136.4/140.4 GiB" in probes[0]["quote"]
    vals = step["validations"]
    assert [(v["value"], v.get("rejected")) for v in vals] == [(0.97, True), (0.94, True)]
    assert all("OutOfMemoryError" in " ".join(v["evidence"]) or "server_died" in " ".join(v["evidence"]) for v in vals)
    assert step["result"].startswith("budget of 2 validation(s) spent")
    st = StateFile(os.environ["VKIT_STATE"]).read()
    assert "gpu_memory_utilization" not in st["kept"]["config"] or st["kept"]["config"]["gpu_memory_utilization"] == 0.92
    run = st["service"]["running"]
    assert launcher.alive(run["pid"], run.get("ticks")) and st["service"]["running"]["config"] == st["kept"]["config"]
