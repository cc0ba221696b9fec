"""vkit.tune.ledger: the tune's typed reads of the state file, and a trial's status as an enum that stores as
the plain string."""

from __future__ import annotations

import json

import pytest

from vkit.state import StateFile, new_state
from vkit.tune.ledger import FINISHED, PENDING, RANKED, Ledger, Status

pytestmark = pytest.mark.unit


def _state(tmp_path) -> StateFile:
    sf = StateFile(str(tmp_path / "vkit.json"))
    sf.create(new_state("http://127.0.0.1:8000", "m", ["vllm", "serve", "m"], {"max_num_seqs": 16}))
    for step, cfg in (("2", {"max_num_seqs": 16, "max_num_batched_tokens": 4096}), ("3", {"max_num_seqs": 32}),
                      ("3", {"max_num_seqs": 64})):
        sf.tune.add_trial(step, cfg, "why", {})
    return sf


def test_a_status_is_written_and_read_as_its_plain_string(tmp_path):
    sf = _state(tmp_path)
    sf.tune.update_trial("t002", status=Status.ELIMINATED)
    sf.tune.update_trial("t003", status=Status.DONE)
    raw = json.loads(open(sf.path).read())
    assert [t["status"] for t in raw["trials"]] == ["proposed", "eliminated", "done"]
    assert f"{Status.START_FAILED}" == str(Status.START_FAILED) == "start_failed"
    assert Status.DONE in RANKED and "done" in RANKED and "proposed" in PENDING and "applied" not in FINISHED


def test_trials_are_filtered_by_step_and_status_from_one_read(tmp_path):
    sf = _state(tmp_path)
    sf.tune.update_trial("t003", status=Status.DONE)
    led = Ledger(sf)
    assert [t["id"] for t in led.trials(step="3")] == ["t002", "t003"]
    assert [t["id"] for t in led.trials(status=PENDING)] == ["t001", "t002"]
    assert [t["id"] for t in led.trials(step="3", status=(Status.DONE,))] == ["t003"]
    assert led.trial("t002")["config"] == {"max_num_seqs": 32}
    with pytest.raises(KeyError):
        led.trial("t009")


def test_views_give_the_kept_configuration_records_and_the_server(tmp_path):
    sf = _state(tmp_path)
    sf.tune.set_capacity_reference({"load": 4.0})
    st = Ledger(sf).tune()
    assert st.kept_config == {"max_num_seqs": 16} and st.record("baseline") == {} and st.record("capacity_reference") == {"load": 4.0}
    assert st.run_starts == {} and st.slots() == [] and st.confirmations() == []
    srv = st.server
    assert srv.url == "http://127.0.0.1:8000" and srv.running == {} and srv.abnormal["flag"] is False
    assert srv.launch_argv == ["vllm", "serve", "m"] and srv.argv == ["vllm", "serve", "m"]
