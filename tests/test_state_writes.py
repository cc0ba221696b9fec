"""The state document is written by vkit.state and its parts' typed writers (vkit.stateparts) alone: every
other module calls those writers (``sf.tune.add_trial``-like methods), never ``transaction()`` with raw keys; and those accessors write
what the tune runner and the lifecycle wrote before."""

from __future__ import annotations

import ast
import os

import pytest

from vkit.state import StateFile, new_state

pytestmark = pytest.mark.unit

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "vkit")


def test_only_the_state_module_opens_a_transaction():
    found = []
    for d, _, files in os.walk(ROOT):
        for f in sorted(files):
            path = os.path.join(d, f)
            if not f.endswith(".py") or path in (os.path.join(ROOT, "state.py"), os.path.join(ROOT, "stateparts.py")):
                continue
            tree = ast.parse(open(path, encoding="utf-8").read())
            found += [f"{os.path.relpath(path, ROOT)}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Call)
                      and isinstance(n.func, ast.Attribute) and n.func.attr in ("transaction", "_write_unlocked")]
    assert found == []


@pytest.fixture
def sf(state_path):
    s = StateFile(state_path)
    s.create(new_state("http://127.0.0.1:9", "m", ["serve", "m"], {"max_num_seqs": 8}))
    return s


def test_trials_are_numbered_and_updated(sf):
    a = sf.tune.add_trial("2", {"max_num_seqs": 16}, "why", {})
    b = sf.tune.add_trial("2", {"max_num_seqs": 8}, "again", {"k": 1})
    assert (a["id"], b["id"]) == ("t001", "t002")
    assert a["changes"] == {"max_num_seqs": 16} and b["changes"] == {} and a["status"] == "proposed"
    assert sf.tune.update_trial("t001", status="done", verdict="accept")["verdict"] == "accept"
    assert sf.read()["trials"][0]["status"] == "done"
    with pytest.raises(KeyError):
        sf.tune.update_trial("t009", status="done")


def test_the_final_baseline_sets_sigma_and_the_kept_repeats(sf):
    rec = {"config": {}, "runs": ["r1", "r2"], "checks": [], "sigma": {"output_throughput": 0.02}}
    sf.tune.set_baseline("baseline", rec)
    assert sf.read()["baseline"] == rec and sf.read()["sigma_baseline"] == {}
    sf.tune.set_baseline("baseline_mixed", rec, final=True)  # only the main baseline is the kept series
    assert sf.read()["sigma_baseline"] == {}
    sf.tune.set_baseline("baseline", rec, final=True)
    st = sf.read()
    assert st["sigma_baseline"] == {"output_throughput": 0.02} and st["kept"]["repeats"] == ["r1", "r2"]
    sf.tune.add_kept_repeat("s1")
    assert sf.read()["kept"]["repeats"] == ["r1", "r2", "s1"]


def test_a_candidate_through_apply_fail_rollback_and_keep(sf):
    sf.service.begin_candidate({"config": {"max_num_seqs": 16}, "changes": {"max_num_seqs": 16}})
    st = sf.read()
    assert st["candidate"]["status"] == "applying" and st["machine_state"] == "APPLY"
    assert sf.service.candidate_failed({"kind": "oom"}) == 1 and sf.service.candidate_failed({"kind": "oom"}) == 2
    sf.service.rolled_back({"ready_s": 1.0})
    st = sf.read()
    assert st["candidate"]["status"] == "rolled_back" and st["machine_state"] == "REVERT" and st["service"]["startup"] == {"ready_s": 1.0}
    sf.service.begin_candidate({"config": {"max_num_seqs": 16}, "changes": {"max_num_seqs": 16}})
    sf.service.set_running({"pid": 1, "config": {"max_num_seqs": 16}, "role": "candidate"})
    sf.service.candidate_applied({"ready_s": 2.0}, ["post_start_verify"])
    st = sf.read()
    assert st["start_failures"] == 0 and st["candidate"]["checks"] == ["post_start_verify"] and st["machine_state"] == "VERIFY"
    sf.service.set_kept({"max_num_seqs": 16}, "d-1", "gate")
    st = sf.read()
    assert st["kept"]["config"] == {"max_num_seqs": 16} and st["kept"]["decision_id"] == "d-1" and st["kept"]["since"]
    assert st["candidate"]["status"] == "kept" and st["service"]["running"]["role"] == "kept" and st["machine_state"] == "KEEP"
    sf.service.set_running(None)
    assert sf.read()["service"]["running"] is None


def test_records_of_a_run(sf):
    sf.tune.record_step({"step": "2", "result": "a"})
    sf.tune.record_step({"step": "2", "result": "b"})
    sf.tune.save_confirmation({"trial_id": "t001", "decision": None})
    sf.tune.save_confirmation({"trial_id": "t001", "decision": "accept"})
    sf.tune.save_confirmation({"trial_id": "t002", "decision": "reject"}, "delivery_confirmations")
    sf.tune.freeze("max_model_len", 4096)
    sf.tune.record_drift_check({"changed": False})
    sf.tune.record_drift_check({"changed": True}, {"reset": "now", "changed": True})
    sf.tune.record_ablation({"decision_id": "d-1"})
    sf.service.set_abnormal("two start failures", "d-2")
    st = sf.read()
    assert st["steps"] == [{"step": "2", "result": "b"}]
    assert st["confirmations"] == [{"trial_id": "t001", "decision": "accept"}]
    assert st["delivery_confirmations"] == [{"trial_id": "t002", "decision": "reject"}]
    assert st["frozen"] == {"max_model_len": 4096} and len(st["drift_checks"]) == 2 and st["drift"]["changed"] is True
    assert st["ablations"] == [{"decision_id": "d-1"}]
    assert st["abnormal"]["flag"] is True and st["abnormal"]["decision_id"] == "d-2"


def test_init_fields_go_through_new_state():
    doc = new_state("u", "m", ["a"], launch={"mode": "hooks", "start_hook": ["a"], "stop_hook": ["b"], "argv": []},
                    fingerprint={"launch_hash": "x"}, decision_id="d-0")
    assert doc["service"]["launch"]["mode"] == "hooks" and doc["fingerprint"] == {"launch_hash": "x"}
    assert doc["kept"]["decision_id"] == "d-0" and doc["kept"]["since"]
    plain = new_state("u", "m", ["a"])
    assert plain["service"]["launch"] == {"mode": "argv", "argv": ["a"]} and plain["kept"]["since"] is None
