"""One JSON Lines rule for every reader: a torn last line is left out, any other bad line is an error."""

from __future__ import annotations

import pytest

from tests.conftest import call
from vkit.jsonio import BadLine, json_lines
from vkit.state import DecisionLog

pytestmark = pytest.mark.unit


def test_blank_lines_skipped_and_a_torn_last_line_left_out():
    assert list(json_lines('{"a": 1}\n\n[2]\n{"ts": "2026-')) == [(1, {"a": 1}), (3, [2])]
    assert list(json_lines('{"a": 1}\n3')) == [(1, {"a": 1}), (2, 3)]  # complete, just no newline: kept


def test_a_bad_line_that_is_not_the_torn_tail_is_an_error():
    with pytest.raises(BadLine) as e:
        list(json_lines('{"a": 1}\n{bad\n{"b": 2}\n'))
    assert e.value.line == 2
    assert list(json_lines('{"a": 1}\n{bad\n{"b": 2}\n', skip_bad=True)) == [(1, {"a": 1}), (3, {"b": 2})]


def test_the_decision_log_and_sweep_replay_read_a_torn_log_alike(tmp_path):
    log = DecisionLog(str(tmp_path / "decisions.jsonl"))
    log.append("t", "one")
    with open(log.path, "a") as f:
        f.write('{"ts": "2026-')
    assert [e["event"] for e in log.read()] == ["one"]
    r = call("sweep", "--replay", log.path)
    assert r.code == 2 and "holds no replayable proposals" in r.err, r


def test_records_and_datasets_follow_the_rule(tmp_path):
    from vkit.measure.datasets import jsonl_requests
    from vkit.validate.formats import read_records

    p = tmp_path / "r.jsonl"
    p.write_text('{"i": 0, "ok": true}\n{"i": 1, "o')
    assert read_records(str(p)) == [{"i": 0, "ok": True}]
    p.write_text('{"prompt": "hi"}\n{"prom')
    assert len(jsonl_requests(str(p), 2, 8, chat=True)) == 2


def test_one_json_file_reader_words_every_refusal_alike(tmp_path, monkeypatch):
    bad = tmp_path / "bad.json"
    bad.write_text('{"max_num_seqs": 64,,}')
    r = call("restart_with_rollback", "--sandbox", "--config", str(bad))
    assert r.code == 2 and f"--config file {bad} is not valid JSON (" in r.err and "at line 1" in r.err, r
    r = call("restart_with_rollback", "--sandbox", "--config", str(tmp_path / "missing.json"))
    assert r.code == 2 and "no such file" in r.err
    monkeypatch.setenv("VKIT_POLICY", str(bad))
    r = call("state", "policy")
    assert r.code == 2 and f"parameter policy {bad} is not valid JSON (" in r.err, r
