"""The environment fingerprint: its fields read from fake vendor tools and the launch argv, the
comparison of two fingerprints, and a real change (a fake nvidia-smi whose driver changes between
two bench_stream runs against sim_server) said on stderr, logged, refused by gate and ignored by
the knowledge base."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest

from tests.conftest import call
from tests.test_accel import NPU_910B, fake_tool
from vkit import environment
from vkit.measure import fingerprint
from vkit.state import StateFile, new_state

H200 = "NVIDIA H200, {driver}, 143771\nNVIDIA H200, {driver}, 143771\n"


def fake_nvidia_smi(tmp_path, monkeypatch, driver: str) -> None:
    """nvidia-smi answering the fingerprint's query with two H200s on ``driver`` (and the
    sampler's utilisation query with its own rows); the only vendor tool on PATH."""
    d = tmp_path / "fakebin"
    d.mkdir(exist_ok=True)
    (d / "query.out").write_text(H200.format(driver=driver))
    (d / "util.out").write_text("0, 3, 1024, 143771\n1, 0, 1024, 143771\n")
    p = d / "nvidia-smi"
    p.write_text("#!/bin/sh\ncase \"$*\" in\n"
                 f"  *driver_version*) cat '{d / 'query.out'}' ;;\n"
                 f"  *) cat '{d / 'util.out'}' ;;\nesac\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{d}{os.pathsep}/usr/bin{os.pathsep}/bin")


def model_dir(tmp_path, config: dict) -> str:
    d = tmp_path / "models" / "m"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    return str(d)


# -- the fields -------------------------------------------------------------------------------

@pytest.mark.e2e
def test_fields_from_a_fake_nvidia_smi_and_the_launch_argv(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, "550.54.15")
    m = model_dir(tmp_path, {"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"})
    argv = ["vllm", "serve", m, "--served-model-name", "llama", "--dtype", "bfloat16", "-q", "fp8", "--port", "8000"]
    fp = fingerprint.fingerprint("llama", argv, server_version="0.11.0")
    assert {k: fp["accelerator"][k] for k in ("kind", "model", "count", "driver")} == {
        "kind": "nvidia", "model": "NVIDIA H200", "count": 2, "driver": "550.54.15"}
    assert fp["accelerator"]["memory_mib"] == 143771
    assert (fp["server_version"], fp["dtype"], fp["quantization"]) == ("0.11.0", "bfloat16", "fp8")
    cfg = open(os.path.join(m, "config.json"), "rb").read()
    assert fp["model_hash"] == hashlib.sha256(cfg).hexdigest()[:16] and fp["model_hash_of"] == "config.json"
    # another config.json (a re-converted checkpoint under the same path) is another model
    model_dir(tmp_path, {"architectures": ["LlamaForCausalLM"], "torch_dtype": "float16"})
    again = fingerprint.fingerprint("llama", argv)
    assert again["model_hash"] != fp["model_hash"]
    # the --x=V spelling, --quantization in full, the last flag winning; no local config: the id is hashed
    fp2 = fingerprint.fingerprint("org/remote", ["vllm", "serve", "org/remote", "--dtype=float16", "--dtype", "half",
                                                 "--quantization=awq"])
    assert (fp2["dtype"], fp2["quantization"], fp2["model_hash_of"]) == ("half", "awq", "model id")
    assert fp2["model_hash"] == hashlib.sha256(b"org/remote").hexdigest()[:16]
    # no launch argv known (bench_stream with --url only): dtype and quantisation unknown, not "absent"
    fp3 = fingerprint.fingerprint("llama")
    assert fp3["launch_hash"] is None and fp3["dtype"] is None and fp3["quantization"] is None


@pytest.mark.e2e
def test_npu_smi_banner_gives_the_driver(tmp_path, monkeypatch):
    fake_tool(tmp_path, monkeypatch, "npu-smi", NPU_910B)
    a = fingerprint.accelerators()
    assert (a["kind"], a["model"], a["count"], a["driver"]) == ("ascend", "910B3", 2, "23.0.rc3")


@pytest.mark.e2e
def test_a_missing_or_failing_tool_gives_nulls_not_a_failure(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert fingerprint.accelerators() == {"kind": "none", "model": None, "count": 0, "driver": None}
    fake_tool(tmp_path, monkeypatch, "nvidia-smi", "NVIDIA-SMI has failed because it couldn't communicate with the driver\n",
              code=9)
    assert fingerprint.fingerprint("m", ["serve", "m"])["accelerator"] == {"kind": None, "model": None, "count": None,
                                                                           "driver": None}


# -- the comparison ---------------------------------------------------------------------------

def fp_of(driver="550.54.15", version="0.11.0", dtype=None, quant=None, launch="ab", mhash="h1", mof="config.json"):
    return {"accelerator": {"kind": "nvidia", "model": "NVIDIA H200", "count": 2, "driver": driver},
            "server_version": version, "dtype": dtype, "quantization": quant, "launch_hash": launch,
            "model_hash": mhash, "model_hash_of": mof, "host": "a"}


@pytest.mark.unit
def test_changes_name_each_field_that_matters_and_only_those():
    assert environment.changes(fp_of(), dict(fp_of(), host="b")) == []  # another host name alone is not a change
    found = environment.changes(fp_of(), fp_of(driver="560.35.03", version="0.12.0", dtype="bfloat16"))
    assert found == [{"field": "accelerator.driver", "old": "550.54.15", "new": "560.35.03"},
                     {"field": "server_version", "old": "0.11.0", "new": "0.12.0"},
                     {"field": "dtype", "old": None, "new": "bfloat16"}]  # the flag added: vLLM's default → bfloat16
    assert environment.describe(found[:1]) == "accelerator.driver 550.54.15 → 560.35.03"


@pytest.mark.unit
def test_what_one_side_does_not_know_is_not_a_change():
    unknown_acc = dict(fp_of(), accelerator={"kind": None, "model": None, "count": None, "driver": None})
    assert environment.changes(fp_of(), unknown_acc) == []  # nvidia-smi timed out once
    assert environment.changes(fp_of(dtype="bfloat16"), fp_of(launch=None)) == []  # no launch argv on one side
    assert environment.changes(fp_of(), fp_of(mhash="h2", mof="model id")) == []  # a config hash vs an id hash
    assert environment.changes(fp_of(), fp_of(version=None)) == []
    # the last-seen fingerprint keeps what a run did not know
    seen = environment.merged(fp_of(), dict(unknown_acc, server_version=None))
    assert seen["accelerator"]["driver"] == "550.54.15" and seen["server_version"] == "0.11.0"
    assert environment.merged(fp_of(), fp_of(driver="560.35.03"))["accelerator"]["driver"] == "560.35.03"


@pytest.mark.unit
def test_gate_compares_every_pair_of_runs_that_know_a_field():
    from vkit.decide.runs import Run, check_same_environment
    from vkit.errors import InvalidData

    unknown = dict(fp_of(), accelerator={"kind": None, "model": None, "count": None, "driver": None})
    runs = [Run("B1.json", {"vkit": {"fingerprint": unknown}}, "baseline"),
            Run("B2.json", {"vkit": {"fingerprint": fp_of()}}, "baseline"),
            Run("P.json", {"completed": 10}, "candidate"),  # a plain vLLM file: nothing to compare
            Run("C1.json", {"vkit": {"fingerprint": fp_of()}}, "candidate")]
    check_same_environment(runs)
    runs.append(Run("C2.json", {"vkit": {"fingerprint": fp_of(driver="560.35.03")}}, "candidate"))
    with pytest.raises(InvalidData, match=r"accelerator.driver 550.54.15 → 560.35.03 from B2.json \(baseline\) to C2.json"):
        check_same_environment(runs)


@pytest.mark.unit
def test_the_tune_runner_notes_each_run_and_warns_once_on_a_change(state_path):
    from vkit.measure.gauge import BenchOptions
    from vkit.tune.config import Settings, Workload
    from vkit.tune.context import new_tune

    sf = StateFile(state_path)
    sf.create(new_state("http://127.0.0.1:9", "m", ["serve", "m"], fingerprint=fp_of()))
    warned: list[str] = []
    r = new_tune(sf, Settings(workload=Workload(BenchOptions(num_prompts=5))), lambda m: None, tool_name="tune",
               warn=warned.append)
    r.measurer.note_environment("runs/b/rep0.json", {"vkit": {"fingerprint": fp_of()}})
    assert warned == []
    r.measurer.note_environment("runs/b/rep1.json", {"vkit": {"fingerprint": fp_of(driver="560.35.03")}})
    r.measurer.note_environment("runs/b/rep2.json", {"vkit": {"fingerprint": fp_of(driver="560.35.03")}})
    assert len(warned) == 1 and "runs/b/rep1.json" in warned[0] and "accelerator.driver 550.54.15 → 560.35.03" in warned[0]
    ev = [e for e in sf.log.read() if e["event"] == "environment_changed"]
    assert len(ev) == 1 and ev[0]["tool"] == "tune" and ev[0]["run"] == "runs/b/rep1.json"
    assert sf.read()["fingerprint"]["accelerator"]["driver"] == "560.35.03"


@pytest.mark.unit
def test_a_capacity_document_carries_its_first_runs_fingerprint():
    from vkit.measure.gauge import BenchOptions
    from vkit.tune import capacity as cap
    from vkit.tune import capmeasure, capsearch

    first = []

    def measure(load: float, k: int) -> dict:
        s = {"endpoint_type": "vkit", "backend": "openai", "model_id": "m", "completed": 30, "duration": 3.0,
             "request_throughput": load, "output_throughput": 128 * load, "p95_ttft_ms": 100.0 if load < 50 else 1e5,
             "mean_tpot_ms": 10.0, "max_concurrent_requests": 4,
             "vkit": {"stream": True, "completion_rate": load, "dataset": {"name": "random"}, "dispatch_lag_ms": {"p99": 0.2},
                      "fingerprint": fp_of()}}
        first.append(s)
        return s

    res = capsearch.search(measure, cap.Slo({"p95_ttft_ms": 400.0}), cap.Plan(start=10.0, tolerance=0.1))
    doc = capmeasure.capacity_document(res, first[0], BenchOptions(num_prompts=50), seed=1, reference=None)
    assert doc["vkit"]["fingerprint"] == fp_of()


# -- a real change ----------------------------------------------------------------------------

@pytest.fixture
def sim(tmp_path, monkeypatch):
    from tests.sim_fixtures import SimProcess

    fake_nvidia_smi(tmp_path, monkeypatch, "550.54.15")
    s = SimProcess("--sim-speed", "20")
    yield s
    s.stop()


def bench(st: str, url: str, out: str, seed: int):
    return call("bench_stream", "--state", st, "--url", url, "--num-prompts", "12", "--max-concurrency", "4",
                "--random-input-len", "64", "--random-output-len", "16", "--seed", str(seed), "-o", out)


@pytest.mark.e2e
def test_a_driver_change_between_two_runs_is_said_logged_refused_by_gate_and_ignored_by_the_knowledge_base(
        sim, tmp_path, monkeypatch):
    from vkit.tune import knowledge

    st = str(tmp_path / "st" / "vkit.json")
    monkeypatch.setenv("VKIT_STATE", st)
    m = model_dir(tmp_path, {"architectures": ["LlamaForCausalLM"]})
    # the launch argv as state init records it (the server itself is the simulator, started by the fixture)
    r = call("state", "init", "--url", sim.url, "--model", "sim-model", "--", "vllm", "serve", m,
             "--served-model-name", "sim-model", "--dtype", "bfloat16")
    assert r.code == 0, r
    sf = StateFile(st)
    assert sf.read()["fingerprint"]["accelerator"]["driver"] == "550.54.15"

    b1 = str(tmp_path / "b1.json")
    r = bench(st, sim.url, b1, 1)
    assert r.code == 0, r
    assert "environment changed" not in r.err
    doc1 = json.load(open(b1))
    fp1 = doc1["vkit"]["fingerprint"]
    assert (fp1["accelerator"]["driver"], fp1["dtype"], fp1["model_hash_of"]) == ("550.54.15", "bfloat16", "config.json")
    info = doc1["vkit"]["server"]["version_info"]
    kb, work = str(tmp_path / "kb.jsonl"), {"bench_args": ["--max-concurrency", "4"], "slo": {}}
    knowledge.record(kb, knowledge.fingerprint_key(sf.read(), info), work, [], None, "run-before")
    assert [e["run_id"] for e in knowledge.match(kb, knowledge.fingerprint_key(sf.read(), info), work)[0]] == ["run-before"]

    fake_nvidia_smi(tmp_path, monkeypatch, "560.35.03")  # the driver is upgraded between two runs
    b2 = str(tmp_path / "b2.json")
    r = bench(st, sim.url, b2, 1)
    assert r.code == 0, r
    said = [line for line in r.err.splitlines() if "environment changed" in line]
    assert said == [f"bench_stream: warning: environment changed since the last run, seen by {b2}: "
                    "accelerator.driver 550.54.15 → 560.35.03; gate does not compare runs from before the change with "
                    "runs after it"]
    ev = [e for e in sf.log.read() if e["event"] == "environment_changed"]
    assert len(ev) == 1 and ev[0]["tool"] == "bench_stream" and ev[0]["run"] == b2
    assert ev[0]["changes"] == [{"field": "accelerator.driver", "old": "550.54.15", "new": "560.35.03"}]
    assert sf.read()["fingerprint"]["accelerator"]["driver"] == "560.35.03"

    # the knowledge entry from before no longer matches, and says why
    good, bad = knowledge.match(kb, knowledge.fingerprint_key(sf.read(), info), work)
    assert good == [] and bad == ['run-before: accelerator.driver changed ("550.54.15" → "560.35.03")']

    # gate refuses to compare the runs across the change (exit 3, as a gauge change), not those after it
    r = call("gate", "--baseline", b1, "--candidate", b2, "--allow-anomaly", "-q")
    assert r.code == 3 and "different environment: accelerator.driver 550.54.15 → 560.35.03" in r.err, r
    b3 = str(tmp_path / "b3.json")
    assert bench(st, sim.url, b3, 1).code == 0
    r = call("gate", "--baseline", b2, "--candidate", b3, "--allow-anomaly", "-q")
    assert "different environment" not in r.err and r.code != 3, r
    assert len([e for e in sf.log.read() if e["event"] == "environment_changed"]) == 1
