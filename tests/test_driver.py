"""vkit.tune.driver's wiring, in-process (the trials themselves are the e2e tests' in test_tune.py):
tune's printed JSON is the result's to_dict, the run is recorded as finished with its report, and
an environment that turns ABNORMAL mid-run is reported with what to do."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import call
from tests.test_result_schema import sample
from vkit.errors import Abnormal
from vkit.state import StateFile, new_state
from vkit.tune import driver
from vkit.tune.result import TuneResult

pytestmark = pytest.mark.unit

FLAGS = ["--sandbox", "--objective", "throughput", "--steps", "2", "--baseline-repeats", "3", "--slo", "p95_ttft_ms=5000"]


@pytest.fixture
def sf(state_path):
    s = StateFile(state_path)
    s.create(new_state("http://127.0.0.1:9", "m", ["serve", "m"]))
    return s


def test_tune_prints_the_result_and_records_the_finished_run(sf, tmp_path, monkeypatch):
    monkeypatch.setattr(driver, "_drive", lambda *a: TuneResult.from_dict(sample()))
    rep = str(tmp_path / "rep")
    r = call("tune", "--state", sf.path, *FLAGS, "--json", "--report-dir", rep)
    assert r.code == 0, r
    assert json.loads(r.out) == sample()
    with open(os.path.join(rep, "result.json"), encoding="utf-8") as f:
        assert json.load(f) == sample()
    st = sf.read()
    assert st["tune"]["finished"] and st["tune"]["report"]["json"] == os.path.join(rep, "result.json")
    assert st["tune"]["steps"] == ["2"] and st["tune"]["mode"] == "staged" and st["lease"] is None
    assert [e["event"] for e in sf.log.read()][-1] == "converge"


def test_a_run_stopped_by_abnormal_says_what_to_do(sf, monkeypatch):
    def drive(runner, *a):
        runner.sf.service.set_abnormal("two start failures in a row", "d-1")
        raise Abnormal("the environment is unavailable or ABNORMAL")

    monkeypatch.setattr(driver, "_drive", drive)
    r = call("tune", "--state", sf.path, *FLAGS)
    assert r.code == 4
    logs = os.path.join(os.path.dirname(sf.path), "logs")
    assert f"tune: ABNORMAL: two start failures in a row\ntune: what to do: read the server log in {logs}" in r.err
    assert sf.read()["lease"] is None and not sf.read()["tune"].get("finished")


def test_an_unfinished_run_with_other_settings_is_not_resumed(sf, monkeypatch):
    monkeypatch.setattr(driver, "_drive", lambda *a: (_ for _ in ()).throw(Abnormal("stop")))
    assert call("tune", "--state", sf.path, *FLAGS).code == 4
    r = call("tune", "--state", sf.path, *FLAGS, "--budget", "3")
    assert r.code == 2 and "other settings (budget)" in r.err and "--restart" in r.err
