"""Slots: the accelerator groups of one machine as parallel servers (vkit.apply.slots), their state
files, the launcher's visible-devices variable, and a tune screening on several slots, one of whose
servers dies mid-trial."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

import pytest

from tests.conftest import REPO, call
from tests.sim_helpers import free_port
from vkit.apply import launcher, slots
from vkit.errors import UsageError
from vkit.interrupts import Interrupts
from vkit.state import StateFile
from vkit.tune import confirm
from vkit.tune.compare import Versus
from vkit.tune.context import new_tune, wire
from vkit.tune.ledger import Ledger


@pytest.mark.unit
def test_plan_groups_devices_by_the_launch_parallel_size_and_counts_ports_up():
    argv = ["vllm", "serve", "m", "--port", "8000", "-tp", "2"]
    got = slots.plan(4, argv, "http://127.0.0.1:8000")
    assert [s["devices"] for s in got] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [s["port"] for s in got] == [8000, 8001, 8002, 8003] and got[3]["name"] == "s3"
    assert [s["devices"] for s in slots.plan(2, ["serve"], "http://h:9000", per_slot=3)] == [[0, 1, 2], [3, 4, 5]]
    assert slots.with_port(argv, 8003)[:5] == ["vllm", "serve", "m", "--port", "8003"]
    assert slots.with_port(["serve", "--port=1"], 2) == ["serve", "--port=2"]
    assert slots.with_port(["serve"], 2) == ["serve", "--port", "2"]
    assert slots.url_with_port("http://127.0.0.1:8000/", 8002) == "http://127.0.0.1:8002"
    with pytest.raises(UsageError):
        slots.check([{"name": "a", "devices": ["0"], "port": 1}, {"name": "b", "devices": ["0"], "port": 2}])
    with pytest.raises(UsageError):
        slots.check([{"name": "a", "devices": ["0"], "port": 1}, {"name": "b", "devices": ["1"], "port": 1}])


@pytest.mark.unit
@pytest.mark.parametrize("kind,var", [("nvidia", "CUDA_VISIBLE_DEVICES"), ("ascend", "ASCEND_RT_VISIBLE_DEVICES"),
                                      ("rocm", "HIP_VISIBLE_DEVICES"), ("none", "CUDA_VISIBLE_DEVICES"), (None, "CUDA_VISIBLE_DEVICES")])
def test_the_visible_devices_variable_follows_the_accelerator_kind(kind, var):
    assert slots.visible_var(kind) == var
    launch = slots.launch_for({"mode": "argv", "argv": ["serve", "--port", "1"]}, {"name": "s1", "devices": [2, 3], "port": 7}, var)
    assert launch["env"][var] == "2,3" and launch["argv"] == ["serve", "--port", "7"]


@pytest.mark.e2e
def test_the_launcher_gives_each_slot_its_devices(tmp_path):
    code = "import os; print('VIS=' + os.environ.get('ASCEND_RT_VISIBLE_DEVICES', '-'), flush=True)"
    launch = slots.launch_for({"mode": "argv", "argv": [sys.executable, "-c", code]}, {"name": "s1", "devices": [4, 5], "port": 1},
                              "ASCEND_RT_VISIBLE_DEVICES")
    launch["argv"] = [sys.executable, "-c", code]  # no --port for python itself
    log = str(tmp_path / "server.log")
    run = launcher.start(launch, {}, log)
    run.proc.wait(timeout=30)
    assert "VIS=4,5" in open(log, encoding="utf-8").read()


def test_state_init_with_slots_writes_one_state_file_per_slot(tmp_path):
    st = str(tmp_path / "st" / "vkit.json")
    r = call("state", "--state", st, "init", "--slots", "2", "--url", "http://127.0.0.1:8000", "--model", "m",
             "--set", "max_num_seqs=8", "--", "vllm", "serve", "m", "--port", "8000")
    assert r.code == 0, r
    main = StateFile(st).read()
    assert [s["name"] for s in main["slots"]] == ["s0", "s1"] and main["slots"][1]["url"] == "http://127.0.0.1:8001"
    sub = StateFile(os.path.join(os.path.dirname(st), main["slots"][1]["state"])).read()
    assert sub["service"]["url"] == "http://127.0.0.1:8001" and sub["kept"]["config"] == {"max_num_seqs": 8}
    assert sub["service"]["launch"]["argv"][-2:] == ["--port", "8001"]
    assert sub["service"]["launch"]["env"][main["slots"][1]["visible_devices_var"]] == "1"
    r = call("state", "--state", st, "show")
    assert "slot s1" in r.out and "port 8001: in service" in r.out
    sf = StateFile(st)
    sf.slots.take_out("s1", "test", "d-x")
    assert "OUT since" in call("state", "--state", st, "show").out
    r = call("state", "--state", st, "--slot-in", "s1", "--reason", "fixed")
    assert r.code == 0 and sf.read()["slots"][1]["out"] is None
    assert call("state", "--state", st, "--slot-in", "s9").code == 2


@pytest.mark.unit
def test_a_state_without_slots_is_one_slot(tmp_path):
    from vkit.measure.gauge import BenchOptions
    from vkit.state import new_state
    from vkit.tune.config import Settings, Workload
    from vkit.tune.context import new_tune, use_first_slot

    sf = StateFile(str(tmp_path / "vkit.json"))
    sf.create(new_state("http://127.0.0.1:9", "m", ["serve"], {}))
    r = new_tune(sf, Settings(workload=Workload(BenchOptions())), lambda m: None)
    assert r.ledger.slots() == [] and use_first_slot(r) and r.svc is sf and r.slot is None


def _bare_runner(tmp_path, slot_names, effects=None):
    """A Tune whose state reads come from an in-memory state with slots ``slot_names`` (its measurements
    stubbed by the caller); built as tune builds one, on a scratch state file."""
    from types import SimpleNamespace

    from vkit.measure.gauge import BenchOptions
    from vkit.state import new_state
    from vkit.tune.config import Settings, Workload

    sf = StateFile(str(tmp_path / "vkit.json"))
    sf.create(new_state("http://127.0.0.1:9", "m", ["serve", "m"], {"max_num_seqs": 4}), force=True)
    r = new_tune(sf, Settings(workload=Workload(BenchOptions())), lambda m: None)
    st = {"slots": [{"name": n, "state": f"slots/{n}.json"} for n in slot_names], "kept": {"config": {"max_num_seqs": 4}},
          "confirmations": [], "trials": [{"id": "t002", "step": "2", "config": {"max_num_seqs": 8}}]}
    if effects is not None:
        st["slot_effects"] = {"metrics": effects}
    r.sf = SimpleNamespace(read=lambda: st, tune=SimpleNamespace(save_confirmation=lambda c, k: None))
    r.slot, r.svc, r.runs_dir = None, r.sf, "runs/run-1"
    r.ledger = r.served = Ledger(r.sf)
    r.interrupts = Interrupts()
    return r, st


@pytest.mark.unit
def test_a_comparison_across_slots_carries_the_device_spread_and_one_within_a_slot_does_not(tmp_path):
    r, _ = _bare_runner(tmp_path, ["s0", "s1"], effects={"output_throughput": {"sigma_device": 0.03}, "p95_ttft_ms": {"sigma_device": 0.0}})
    same = r.compare.slot_sigma(["runs/run-1/s0/baseline-g1/rep1.json"], ["runs/run-1/s0/t002/rep1.json"])
    across = r.compare.slot_sigma(["runs/run-1/s0/baseline-g1/rep1.json"], ["runs/run-1/s1/t002/rep1.json"])
    assert same == {} and across == {"output_throughput": 0.03}
    assert r.compare.slots_of(["runs/run-1/s1/t002/rep1.json", "runs/run-1/s0/aa/rep1.json"]) == {"s0", "s1"}
    r, _ = _bare_runner(tmp_path, [], effects={"output_throughput": {"sigma_device": 0.03}})
    assert r.compare.slot_sigma(["runs/run-1/baseline-g1/rep1.json"], ["runs/run-1/t002/rep1.json"]) == {}


DOC = {"output_throughput": 6000.0, "p95_ttft_ms": 120.0}


@pytest.mark.unit
def test_the_aa_pass_splits_the_spread_into_within_a_slot_between_slots_and_devices(monkeypatch, tmp_path):
    """One-way random effects on logs, by hand: s0 runs e^0 and e^0.02, s1 e^0.10 and e^0.12 (x 6000): within a slot
    MS_w = (4 x 0.01^2) / (2 x 1) = 2e-4; between MS_b = 2 x (2 x 0.05^2) / 1 = 0.01; σ²_slots = (0.01 - 2e-4) / 2 = 0.0049;
    less the baseline's between-restart 0.03^2 = 0.0009: σ²_device = 0.004."""
    import math

    from vkit.tune import steps
    from vkit.tune.steps import aa

    r, _ = _bare_runner(tmp_path, ["s0", "s1"])
    docs = {f"{n}/{k}": {"output_throughput": 6000.0 * math.exp(x)} for n, xs in (("s0", (0.0, 0.02)), ("s1", (0.10, 0.12)))
            for k, x in enumerate(xs)}
    r.ledger.load = docs.__getitem__
    r.budget.components = lambda key="baseline": {"output_throughput": {"within": 0.01, "between": 0.03}}
    monkeypatch.setattr(aa, "primary_metric", lambda runner: "output_throughput")  # slot_effects reads it in its module
    e = steps.slot_effects(r, {"s0": ["s0/0", "s0/1"], "s1": ["s1/0", "s1/1"]})["metrics"]["output_throughput"]
    assert e["sigma_within"] == pytest.approx(math.sqrt(2e-4))
    assert e["sigma_slots"] == pytest.approx(math.sqrt(0.0049))
    assert e["sigma_device"] == pytest.approx(math.sqrt(0.004))
    assert e["offsets"]["s1"] == pytest.approx(math.exp(0.05) - 1) and e["offsets"]["s0"] == pytest.approx(math.exp(-0.05) - 1)


@pytest.mark.unit
def test_confirmation_blocks_run_side_by_side_on_the_slots(monkeypatch, tmp_path):
    """B A A B blocks of a confirmation on three slots: blocks 1-3 at once, block k on slot k mod 3, each
    block's four runs on one device (its pairs within a slot); the gate after each group, the record in
    block order; block 4 on s0 again, where the gate decides."""
    import copy

    r, _ = _bare_runner(tmp_path, ["s0", "s1", "s2"])
    where = []

    def for_slot(t, slot):
        c = copy.copy(t)
        c.slot, c.runs_dir = slot["name"], f"runs/run-1/{slot['name']}"
        wire(c)
        c.seat.apply, c.log = t.seat.apply, t.log
        c.measurer.measure = lambda label, k, w=None: (where.append((slot["name"], label, k))
                                                       or (f"{c.runs_dir}/{label}/rep{k}.json", DOC, {"code": 0}))
        return c

    monkeypatch.setattr(confirm, "for_slot", for_slot)
    r.budget.confirm_plan = lambda *a, **k: {"fits": True, "blocks": 4, "why": "4 blocks"}
    r.seat.apply = lambda cfg, fresh=False: (True, {})
    r.progress = r.log = lambda *a, **k: None
    gates = []
    verdicts = iter(["undecided", "accept"])
    r.compare.gate = lambda a_runs, b_runs, **k: (gates.append(len(b_runs)) or {"decision": next(verdicts), "why": "x"})
    conf = r.confirmer.confirm("t002", "confirmations", 2, Versus(primary="output_throughput", guards=()))
    assert conf["decision"] == "accept" and gates == [6, 8]
    assert conf["sequence"] == ["B", "A", "A", "B"] * 4
    for b in range(4):
        slot = f"s{b % 3}"
        assert all(f"/{slot}/" in p for p in conf["b_runs"][2 * b:2 * b + 2] + conf["a_runs"][2 * b:2 * b + 2])
        assert conf["b_runs"][2 * b].endswith(f"rep{2 * b + 1}.json") and conf["a_runs"][2 * b + 1].endswith(f"rep{2 * b + 2}.json")
    assert sorted(where) == sorted((f"s{b % 3}", f"confirm-t002-{arm}", 2 * b + (1 if j < 2 else 2))
                                   for b in range(4) for j, arm in enumerate("BAAB"))


# -- end to end: a tune on two simulator slots, one of whose servers dies mid-trial ---------------------
FAST = ["--sandbox", "--objective", "throughput", "--concurrency", "16", "--input-len", "256", "--output-len", "64",
        "--num-prompts", "100", "--baseline-repeats", "3", "--screen-repeats", "1", "--ready-timeout", "30",
        "--slo", "p95_ttft_ms=5000", "--guard", "p95_ttft_ms:-:50%", "--confirm-front", "0"]


def _sim(port: int) -> list[str]:
    return [sys.executable, os.path.join(REPO, "bin", "sim_server"), "sim-8b", "--port", str(port), "--sim-speed", "4",
            "--sim-startup-s", "0.2", "--sim-seed", "5", "--max-model-len", "4096"]


@contextlib.contextmanager
def two_slots(tmp_path, monkeypatch, s1_extra: list[str] | None = None):
    """A state with slots s0 and s1 (each its own simulator; ``s1_extra``: s1's own launch arguments), every
    slot's server stopped at the end."""
    p0, p1 = free_port(), free_port()
    st = str(tmp_path / "st" / "vkit.json")
    monkeypatch.setenv("VKIT_STATE", st)
    spec = tmp_path / "slots.json"
    spec.write_text(json.dumps([{"name": "s0", "devices": [0], "port": p0},
                                {"name": "s1", "devices": [1], "port": p1, **({"argv_extra": s1_extra} if s1_extra else {})}]))
    r = call("state", "init", "--slots-file", str(spec), "--url", f"http://127.0.0.1:{p0}", "--model", "sim-8b",
             "--set", "max_num_seqs=4", "--set", "max_num_batched_tokens=2048", "--", *_sim(p0))
    assert r.code == 0, r
    sf = StateFile(st)
    try:
        yield sf
    finally:
        for x in sf.read().get("slots") or []:
            sub = StateFile(os.path.join(sf.dir, x["state"]))
            launcher.stop(sub.read()["service"].get("running"), grace_s=3)


@pytest.mark.e2e
def test_a_slot_whose_server_dies_mid_trial_is_taken_out_and_the_tune_finishes(tmp_path, monkeypatch):
    # slot s1's first start (the A/A pass) is sound; from its second on, its engine dies at its 31st request: mid-run
    plan = tmp_path / "s1-faults.json"
    plan.write_text(json.dumps({str(n): ["--sim-crash-after", "30"] for n in range(2, 40)}))
    extra = ["--sim-start-file", str(tmp_path / "s1-starts"), "--sim-fault-plan", str(plan)]
    with two_slots(tmp_path, monkeypatch, extra) as sf:
        t0 = time.time()
        r = call("tune", *FAST, "--steps", "2", "--budget", "4", "--json")
        assert r.code == 0, r.err[-3000:]
        assert time.time() - t0 < 600
        s = sf.read()
        s1 = next(x for x in s["slots"] if x["name"] == "s1")
        assert s1["out"] and "server died" in s1["out"]["reason"]
        assert "slot s1 taken out" in r.err
        # nothing lost: every trial finished with a verdict or a reason, and those that failed on s1 were measured on s0
        assert s["trials"] and all(t["status"] in ("done", "eliminated", "skipped") for t in s["trials"]), \
            [(t["id"], t["status"], t.get("why")) for t in s["trials"]]
        moved = [t for t in s["trials"] if t.get("failed_on")]
        assert moved and all(t["failed_on"][0]["slot"] == "s1" and t["slot"] == "s0" for t in moved)
        assert all(os.path.exists(os.path.join(sf.dir, p)) for t in moved for p in t["failed_on"][0]["runs"])
        ev = [e["event"] for e in sf.log.read()]
        assert "slot_out" in ev and "converge" in ev
        res = json.loads(r.out)
        assert res["recommendation"]["config"] == s["kept"]["config"]
        # the A/A pass measured both slots before any trial: their spread is recorded
        aa = s["slot_effects"]["metrics"]["output_throughput"]
        assert set(aa["offsets"]) == {"s0", "s1"} and aa["runs_per_slot"] == 2 and aa["sigma_within"] > 0
        # ... beside the baseline: s0's A/A runs are the baseline's first start, and s1's ended before the baseline did
        first_b = next(e for e in sf.log.read() if e["event"] == "baseline")
        assert set(s["slot_effects"]["runs"]["s0"]) <= set(first_b["runs"])
        ended = [os.path.getmtime(os.path.join(sf.dir, p)) for p in first_b["runs"]]
        assert max(os.path.getmtime(os.path.join(sf.dir, p)) for p in s["slot_effects"]["runs"]["s1"]) < max(ended)


@pytest.mark.e2e
def test_bayesian_search_on_two_slots_proposes_batches_that_replay(tmp_path, monkeypatch):
    """--mode bo on two slots: proposals come two at a time, the second of a batch made with the first one
    believed (Kriging believer) or lied about, never the same configuration; the decision log replays them."""
    with two_slots(tmp_path, monkeypatch) as sf:
        r = call("tune", *FAST, "--steps", "2", "--mode", "bo", "--budget", "4", "--bo-patience", "0", "--batch-lie", "cl-worst")
        assert r.code == 0, r.err[-3000:]
        bo = [t for t in sf.read()["trials"] if t["step"] == "bo"]
        assert len(bo) == 4 and len({json.dumps(t["config"], sort_keys=True) for t in bo}) == 4
        props = [e for e in sf.log.read() if e["event"] == "propose" and e.get("step") == "bo"]
        batches = [(e.get("audit") or {}).get("batch") or {} for e in props]
        pos = [b.get("position") for b in batches]
        # asynchronous: each proposal made with the trials then in flight as lies (two slots: at most one)
        assert pos[:2] == [0, 1] and all(p == len(b["in_flight"]) == len(b["pending"]) for p, b in zip(pos, batches, strict=True)), batches
        assert all((e.get("audit") or {}).get("batch_lie") == ("cl-worst" if p else None) for e, p in zip(props, pos, strict=True))
        assert {t.get("slot") for t in bo} == {"s0", "s1"}
        r = call("sweep", "--replay", os.path.join(sf.dir, "decisions.jsonl"))
        assert r.code == 0, r
        out = json.loads(r.out)
        assert out["proposals"] == 4 and out["identical"] == 4


@pytest.mark.e2e
def test_a_slot_that_fails_the_aa_pass_is_taken_out_before_any_trial(tmp_path, monkeypatch):
    with two_slots(tmp_path, monkeypatch, ["--sim-crash-after", "30"]) as sf:
        r = call("tune", *FAST, "--steps", "2", "--budget", "2", "--json")
        assert r.code == 0, r.err[-3000:]
        s = sf.read()
        s1 = next(x for x in s["slots"] if x["name"] == "s1")
        assert s1["out"] and s1["out"]["reason"].startswith("A/A pass: the server of the kept configuration died")
        # one slot left: the trials ran one at a time on s0's server, none on s1
        assert s["trials"] and not any("s1" in (t.get("slots_tried") or []) or t.get("slot") == "s1" for t in s["trials"])
        assert all(t["status"] in ("done", "eliminated", "skipped") for t in s["trials"]) and "slot_effects" in s
