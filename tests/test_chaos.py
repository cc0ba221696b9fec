"""make chaos: faults at random moments inside whole tunes (bench/bench_chaos.py), the simulator's
new faults (a 5xx burst, a malformed SSE event, the fault plan), the ENOSPC test hook of the state
writes, and tune's --api-key-env."""

from __future__ import annotations

import copy
import json
import os

import pytest

from bench import bench_chaos as chaos
from tests.conftest import call
from tests.sim_fixtures import SimProcess
from vkit.errors import ExitCode, StateWriteError, UsageError, VkitError
from vkit.state import ENOSPC_HOOK, StateFile, new_state
from vkit.tune.ledger import Ledger


# -- the invariant checkers catch what they are for (no process) ------------------------------------
def _state(tmp_path) -> tuple[dict, list[dict]]:
    """A small consistent state and decision log: t001 done (two valid runs), t002 in flight, kept by the gate."""
    for name, failed in (("t001/rep1", 0), ("t001/rep2", 0), ("c/a1", 0), ("c/b1", 0), ("bad/rep1", 3)):
        p = tmp_path / "runs" / f"{name}.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"failed": failed}))
    kept = {"max_num_seqs": 16, "max_num_batched_tokens": 2048}
    st = new_state("http://127.0.0.1:1", "m", ["serve"], chaos.KEPT0)
    st["trials"] = [
        {"id": "t001", "status": "done", "config": kept, "runs": ["runs/t001/rep1.json", "runs/t001/rep2.json"],
         "verdict": "accept", "kept": True, "decision_id": "d-keep"},
        {"id": "t002", "status": "applied", "config": {"max_num_seqs": 32}, "runs": [], "verdict": None},
    ]
    st["kept"] = {"config": kept, "decision_id": "d-keep"}
    st["confirmations"] = [{"trial_id": "t001", "decision": "kept", "decision_id": "d-keep",
                            "a_runs": ["runs/c/a1.json"], "b_runs": ["runs/c/b1.json"]}]
    ev = [{"id": "d-1", "event": "propose", "trial": "t001"}, {"id": "d-2", "event": "propose", "trial": "t002"},
          {"id": "d-keep", "event": "keep", "config": kept}]
    return st, ev


@pytest.fixture
def no_check_file(monkeypatch):
    """The runs here are stubs: check_invariants' verdict on them is 'valid' (the failed count is what is tested)."""
    class Ok:
        verdict, findings = "valid", []

    monkeypatch.setattr(chaos, "check_file", lambda *a, **k: Ok())


def test_a_consistent_state_passes_every_checker(tmp_path, no_check_file):
    st, ev = _state(tmp_path)
    runs = chaos.RunCheck(str(tmp_path))
    assert chaos.check_state_and_log(st, ev) == []
    assert chaos.check_records(copy.deepcopy(st), st) == []
    assert chaos.check_kept_traces(st, ev, runs) == []
    assert chaos.check_verdict_runs(st, runs) == []


def test_a_duplicated_trial_record_is_caught(tmp_path):
    st, _ = _state(tmp_path)
    after = copy.deepcopy(st)
    after["trials"].append(copy.deepcopy(st["trials"][0]))
    bad = chaos.check_records(st, after)
    assert any("trial id t001 twice" in b for b in bad), bad
    assert any("measured by two finished trials" in b for b in bad), bad


def test_a_lost_or_rewritten_finished_trial_is_caught(tmp_path):
    st, _ = _state(tmp_path)
    lost = copy.deepcopy(st)
    lost["trials"] = lost["trials"][1:]
    assert chaos.check_records(st, lost) == ["finished trial t001 lost"]
    changed = copy.deepcopy(st)
    changed["trials"][0]["runs"] = ["runs/t001/rep1.json"]
    assert chaos.check_records(st, changed) == ["finished trial t001 changed (done -> done)"]


def test_state_and_log_disagreeing_is_caught(tmp_path):
    st, ev = _state(tmp_path)
    assert chaos.check_state_and_log(st, ev[1:]) == ["trial t001 has no propose/skip event"]
    other = [dict(e, config={"max_num_seqs": 8}) if e["event"] == "keep" else e for e in ev]
    assert any("not the init or keep event of the kept configuration" in b for b in chaos.check_state_and_log(st, other))
    st["abnormal"] = {"flag": True, "reason": "two start failures", "decision_id": "d-none"}
    assert "ABNORMAL in the state has no matching abnormal event" in chaos.check_state_and_log(st, ev)


def test_a_verdict_on_a_run_with_failed_requests_is_caught(tmp_path, no_check_file):
    st, ev = _state(tmp_path)
    st["trials"][0]["runs"].append("runs/bad/rep1.json")
    assert chaos.check_verdict_runs(st, chaos.RunCheck(str(tmp_path))) == ["runs/bad/rep1.json: 3 failed request(s)"]
    st, ev = _state(tmp_path)
    st["confirmations"][0]["b_runs"] = ["runs/bad/rep1.json"]
    assert chaos.check_kept_traces(st, ev, chaos.RunCheck(str(tmp_path))) == ["keep d-keep: runs/bad/rep1.json: 3 failed request(s)"]
    st["confirmations"][0]["decision"] = "reject"
    assert "keep d-keep traces to no confirmation the gate accepted" in chaos.check_kept_traces(st, ev, chaos.RunCheck(str(tmp_path)))


def test_a_recommendation_that_differs_needs_an_invalid_trial(tmp_path):
    st, _ = _state(tmp_path)
    ref_st = copy.deepcopy(st)
    ref_st["trials"][1].update(status="done")
    a, b = {"max_num_seqs": 16}, {"max_num_seqs": 32}
    assert chaos.check_recommendation(a, a, st, ref_st) == []
    assert chaos.check_recommendation(b, a, st, ref_st)  # unexplained
    st["trials"][1]["status"] = "invalid"  # the faults made the reference's other trial invalid
    assert chaos.check_recommendation(b, a, st, ref_st) == []
    st["trials"][1].update(status="done", verdict="invalid")  # measured, but the gate refused its runs
    assert chaos.check_recommendation(b, a, st, ref_st) == []
    # the reference lost a trial of its own (a timeout on a loaded machine, no fault) that the faulted tune finished
    st["trials"][1].update(status="done", verdict="accept")
    assert chaos.check_recommendation(b, a, st, ref_st)
    ref_st["trials"][1]["status"] = "start_failed"
    assert chaos.check_recommendation(b, a, st, ref_st) == []
    assert "the reference's trials: " in chaos.check_recommendation(b, a, st, copy.deepcopy(st))[0]


# -- the ENOSPC test hook ---------------------------------------------------------------------------------
def test_a_full_disk_fails_the_write_clearly_and_loses_nothing(tmp_path, monkeypatch):
    sf = StateFile(str(tmp_path / "vkit.json"))
    sf.create(new_state("http://127.0.0.1:1", "m", ["serve"], {"max_num_seqs": 4}))
    before = (tmp_path / "vkit.json").read_text()
    full = tmp_path / "disk-full"
    monkeypatch.setenv(ENOSPC_HOOK, str(full))
    full.touch()
    with pytest.raises(StateWriteError, match="No space left on device; the previous state is intact"):
        sf.service.set_machine_state("BASELINE")
    assert (tmp_path / "vkit.json").read_text() == before
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    assert (tmp_path / "disk-full.hit").read_text() == f"{os.getpid()}\n"  # the benchmark sees a write met it
    full.unlink()  # the space is back
    sf.service.set_machine_state("BASELINE")
    assert sf.read()["machine_state"] == "BASELINE"


# -- tune --api-key-env ------------------------------------------------------------------------------
def test_tune_refuses_an_api_key_variable_that_is_not_set(state_path, monkeypatch):
    monkeypatch.delenv("VKIT_TEST_NO_SUCH_KEY", raising=False)
    call("state", "--state", state_path, "init", "--url", "http://127.0.0.1:9", "--model", "m", "--", "serve")
    r = call("tune", "--state", state_path, "--sandbox", "--api-key-env", "VKIT_TEST_NO_SUCH_KEY")
    assert r.code == UsageError.code, r
    assert "--api-key-env VKIT_TEST_NO_SUCH_KEY: that environment variable is not set" in r.err


def test_the_key_is_read_where_the_request_set_is_built_and_never_recorded(monkeypatch):
    from vkit.measure.gauge import BenchOptions, build_config

    monkeypatch.setenv("VKIT_TEST_KEY", "sk-secret-123")
    o = BenchOptions(num_prompts=2, random_input_len=4, random_output_len=2, api_key_env="VKIT_TEST_KEY")
    cfg = build_config(o, "http://127.0.0.1:1", ["--api-key-env", "VKIT_TEST_KEY"])
    assert cfg.api_key == "sk-secret-123"
    assert "sk-secret-123" not in json.dumps(cfg.meta) and "sk-secret-123" not in " ".join(o.flags())


# -- the simulator's new faults --------------------------------------------------------------------------
def _bench(url: str, n: int, tmp_path) -> dict:
    out = tmp_path / "b.json"
    r = call("bench_stream", "--url", url, "--model", "sim-model", "--dataset-name", "random", "--random-input-len", "16",
             "--random-output-len", "4", "--num-prompts", str(n), "--max-concurrency", "1", "--seed", "1", "-q", "-o", str(out))
    assert r.code == 0, r
    return json.loads(out.read_text())


@pytest.mark.e2e
def test_sim_error_burst_and_malformed_sse(tmp_path):
    with SimProcess("--sim-speed", "50", "--sim-error-burst", "2:3", "--sim-malformed-sse-after", "6") as sim:
        d = _bench(sim.url, 10, tmp_path)
        _, out, err = sim.stop()
    errors = d["vkit"]["errors"]
    assert d["failed"] == 4, errors  # requests 3-5 answered 500, request 7's stream opens with an event that is not JSON
    assert sum(n for m, n in errors.items() if "sim-error-burst" in m) == 3, errors
    assert sum(n for m, n in errors.items() if "malformed SSE event" in m) == 1, errors
    assert "simulated 5xx burst: requests 3 to 5" in out + err and "simulated malformed SSE event: request 7" in out + err


@pytest.mark.e2e
def test_the_fault_plan_gives_its_flags_to_the_planned_start_only(tmp_path):
    plan, starts = tmp_path / "plan.json", tmp_path / "starts"
    plan.write_text(json.dumps({"2": ["--sim-error-burst", "1:2"]}))
    flags = ("--sim-speed", "50", "--sim-start-file", str(starts), "--sim-fault-plan", str(plan))
    with SimProcess(*flags) as sim:
        assert _bench(sim.url, 4, tmp_path)["failed"] == 0  # start 1: no fault
    with SimProcess(*flags) as sim:
        assert _bench(sim.url, 4, tmp_path)["failed"] == 2  # start 2: the burst
        _, out, err = sim.stop()
    assert "fault plan: start 2 gets --sim-error-burst 1:2" in out + err


# -- the benchmark itself, small -----------------------------------------------------------------------
@pytest.mark.e2e
@pytest.mark.slow
def test_chaos_two_tunes_every_invariant_holds(tmp_path):
    out = tmp_path / "chaos.json"
    kinds = "crash_mid_benchmark,http_5xx_burst,malformed_sse,vkit_sigkill,lease_race,enospc"
    code = chaos.main(["--tunes", "2", "--seed", "3", "--faults", kinds, "--work", str(tmp_path / "w"), "-o", str(out)])
    doc = json.loads(out.read_text())
    s = doc["summary"]
    assert s["faults"] >= 4 and set(k for k, n in s["faults_by_kind"].items() if n) <= set(kinds.split(",")), s
    assert s["invariant_checks"]["total"] >= 10, s
    assert s["finished"] + s["abnormal"] + s["refused"] == 2 and s["stopped"] == 0, doc["failures"]
    assert all(v["passed"] == v["total"] for v in s["security"].values()), s["security"]
    assert s["security"]["api_key_absent"]["total"] == 2 and s["security"]["prompt_literal"]["total"] == 2
    assert code == 0 and doc["passed"], "\n".join(doc["failures"])


# -- what the chaos runs found: no run with a failed request enters a verdict or the kept series ------------
def _stub_runner(tmp_path, runs):
    """A Tune with its measurement and state stubbed: ``runs`` are the (summary, check) pairs measured in turn."""
    from types import SimpleNamespace

    from vkit.measure.gauge import BenchOptions
    from vkit.state import StateFile, new_state
    from vkit.tune.config import Settings, Workload
    from vkit.tune.context import new_tune

    sf = StateFile(str(tmp_path / "vkit.json"))
    sf.create(new_state("http://127.0.0.1:1", "m", ["serve", "m"], {}), force=True)
    r = new_tune(sf, Settings(workload=Workload(BenchOptions(num_prompts=5))), lambda m: None, tool_name="tune")
    it = iter(runs)

    def once(label, k, workload=None):
        doc, check = next(it)
        return f"runs/{label}/rep{k}.json", doc, check

    calls = {"log": [], "repeats": [], "drift": []}
    r.measurer.once, r.seat.healthy, r.progress = once, lambda url: True, lambda m: None
    r.log = lambda event, **kw: calls["log"].append(event)
    st = {"service": {"url": "http://127.0.0.1:1"}, "trials": [], "kept": {"config": {}, "repeats": []}, "run_starts": {}}
    tune = SimpleNamespace(add_kept_repeat=calls["repeats"].append, record_run_start=lambda *a, **k: None,
                           record_drift_check=lambda out, change=None: calls["drift"].append(out))
    r.sf = r.svc = SimpleNamespace(read=lambda: st, tune=tune, service=SimpleNamespace(note_fingerprint=lambda *a, **k: None))
    r.ledger = r.served = Ledger(r.sf)
    r.seat.restore_kept, r.ledger.load = lambda fresh=False: None, lambda p: {}
    return r, calls


BURST = ({"failed": 1, "output_throughput": 6000.0}, {"code": 1, "verdict": "anomaly", "findings": ["percentile_samples"]})
CLEAN = ({"failed": 0, "output_throughput": 6500.0}, {"code": 0, "verdict": "valid", "findings": []})


def test_a_run_with_failed_requests_on_a_healthy_server_is_measured_again(tmp_path):
    r, calls = _stub_runner(tmp_path, [BURST, CLEAN])
    path, doc, check = r.measurer.checked("baseline-g1", 1)
    assert check["code"] == 0 and doc["failed"] == 0 and calls["log"] == ["remeasure"]


def test_failed_requests_twice_make_the_run_invalid_not_an_anomaly(tmp_path):
    r, calls = _stub_runner(tmp_path, [BURST, BURST])
    _, _, check = r.measurer.checked("t001", 1)
    assert check["code"] == 3 and check["verdict"] == "invalid" and "failed_requests" in check["findings"]


BUSY = ({"failed": 0, "output_throughput": 6400.0}, {"code": 1, "verdict": "anomaly", "findings": ["client_saturation"]})


def test_a_busy_client_is_measured_again_after_a_pause_twice_then_the_run_stands(tmp_path, monkeypatch):
    """A machine busy for a moment: the run the client fell behind on is measured again after a pause, at most
    twice; the third saturated run is returned as it is (the tune then says the machine is busy)."""
    from vkit.tune import measurement
    from vkit.tune.measurement import Measurer

    slept = []
    monkeypatch.setattr(measurement.time, "sleep", slept.append)
    r, calls = _stub_runner(tmp_path, [BUSY, BUSY, CLEAN])
    _, doc, check = r.measurer.checked("baseline-g1", 1)
    assert check["code"] == 0 and doc["output_throughput"] == 6500.0
    assert calls["log"] == ["remeasure", "remeasure"] and slept == list(Measurer.BUSY_WAITS_S)
    r, calls = _stub_runner(tmp_path, [BUSY, BUSY, BUSY, CLEAN])
    _, _, check = r.measurer.checked("baseline-g1", 1)
    assert check["code"] == 1 and check["findings"] == ["client_saturation"] and len(calls["log"]) == 2


def test_a_server_gone_before_the_run_began_is_restarted_like_one_that_died_mid_run(tmp_path):
    """Killed between two runs: bench_stream cannot connect (exit 4). Not a tune's failure: the same
    configuration is restarted and the run measured again, as for a death mid-run."""
    r, calls = _stub_runner(tmp_path, [CLEAN])
    measured = r.measurer.once
    state = {"first": True}

    def once(label, k, workload=None):
        if state.pop("first", False):
            raise VkitError("bench_stream failed (exit 4): connection refused", ExitCode.UNAVAILABLE)
        return measured(label, k, workload)

    applied = []
    r.measurer.once, r.seat.healthy = once, lambda url: False
    r.seat.apply = lambda cfg, fresh=False: (applied.append((cfg, fresh)) or True, {})
    _, doc, check = r.measurer.checked("t003", 2)
    assert check["code"] == 0 and doc["output_throughput"] == 6500.0
    assert applied == [({}, True)] and calls["log"] == ["server_died"]
    # a healthy server that refused the run is not a death: the error stands
    r, _ = _stub_runner(tmp_path, [])
    r.measurer.once = lambda *a, **k: (_ for _ in ()).throw(VkitError("refused", ExitCode.UNAVAILABLE))
    with pytest.raises(VkitError):
        r.measurer.checked("t003", 2)


def test_a_keep_interrupted_before_its_record_is_finished_not_confirmed_against_itself(tmp_path):
    """vkit killed between the lifecycle's keep and the confirmation's record: the rerun finds the candidate
    kept by the gate and its confirmation still "accept" against the previous kept configuration. It
    finishes the bookkeeping with the keep's own decision id: no new runs, no second keep, no restart."""
    from types import SimpleNamespace

    r, calls = _stub_runner(tmp_path, [])
    cand, old = {"max_num_seqs": 64}, {"max_num_seqs": 32}
    trial = {"id": "t004", "step": "2", "config": cand, "changes": cand}
    conf = {"trial_id": "t004", "config": cand, "against": old, "decision": "accept", "why": "+7%", "sequence": ["B", "A", "A", "B"]}
    st = {"kept": {"config": cand, "decision": "gate", "decision_id": "d0042"}, "confirmations": [conf], "trials": [trial]}
    saved, updated, rebased = [], [], []
    r.sf = SimpleNamespace(read=lambda: st, tune=SimpleNamespace(update_trial=lambda tid, **kw: updated.append(kw)))
    r.ledger = Ledger(r.sf)
    r.confirmer.save = lambda c, list_key="confirmations": saved.append(dict(c))
    r.baselines.rebase = lambda tid, c: rebased.append(tid)
    r.seat.apply = r.seat.keep = lambda *a, **k: pytest.fail("kept twice or restarted")
    r.s = SimpleNamespace(workload=SimpleNamespace(name="main"))
    out = r.confirmer.confirm_and_keep("t004", selected_from=3)
    assert out["decision"] == "kept" and out["decision_id"] == "d0042" and out["sequence"] == ["B", "A", "A", "B"]
    assert saved[-1]["decision"] == "kept" and updated == [{"kept": True, "decision_id": "d0042"}] and rebased == ["t004"]
    # stopped after the record said "kept" (before the baseline was rebased): the rerun returns it as it is,
    # and never confirms the kept candidate against itself (seen in CI: it was then refused "underpowered")
    saved.clear()
    again = r.confirmer.confirm_and_keep("t004", selected_from=3)
    assert again["decision"] == "kept" and again["decision_id"] == "d0042" and saved == []
    # the same record with a kept configuration made by hand (not a gate decision) is not this case
    st["kept"]["decision"] = "manual"
    assert not r.confirmer.kept_before_saved(conf, trial, "confirmations")


def test_an_invalid_sentinel_run_stays_out_of_the_kept_series(tmp_path):
    stalled = ({"failed": 100, "output_throughput": 0.0}, {"code": 3, "verdict": "invalid", "findings": ["error_rate"]})
    r, calls = _stub_runner(tmp_path, [stalled, stalled])
    out = r.sentinel.check()
    assert out["changed"] is False and "no drift verdict" in out["why"]
    assert calls["repeats"] == [] and calls["drift"] and calls["log"][-1] == "drift_check"


def test_a_run_check_invariants_did_not_pass_eliminates_nothing(tmp_path):
    """A first screening run far below the baseline but flagged (client_saturation: the machine was busy) is no
    evidence that the candidate is worse: no "eliminated" verdict rests on it; the gate sees the run instead."""
    from types import SimpleNamespace

    r, calls = _stub_runner(tmp_path, [])
    trial = {"id": "t002", "step": "3", "status": "applied", "config": {"max_num_seqs": 16}, "changes": {"max_num_seqs": 16},
             "runs": [], "checks": [], "repeats_planned": 1}
    base = {"runs": ["runs/b/rep1.json"], "sigma": {"output_throughput": 0.02}}
    updates = []
    r.sf = SimpleNamespace(read=lambda: {"baseline": base, "trials": [trial]},
                           tune=SimpleNamespace(update_trial=lambda tid, **f: (updates.append(f), dict(trial, **f))[1]))
    r.ledger = Ledger(r.sf)
    r.seat.apply = lambda cfg, fresh=False: (True, {})
    r.ledger.load = lambda p: {"output_throughput": 12000.0}
    saturated = {"code": 1, "verdict": "anomaly", "findings": ["client_saturation"]}
    r.measurer.measure = lambda tid, k, w=None: ("runs/t002/rep1.json", {"output_throughput": 4000.0, "p95_ttft_ms": 44.0, "failed": 0},
                                        dict(saturated))
    r.s = SimpleNamespace(primary="output_throughput:+", eliminate_below=0.10, screen_repeats=1)
    r.compare.gate = lambda *a, **k: {"decision": "invalid", "why": "gate: the candidate run has an anomaly"}
    out = r.trials.run("t002")
    assert out["status"] != "eliminated" and out["verdict"] == "invalid", updates
