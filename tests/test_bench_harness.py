"""bench/harness.py: what every benchmark shares (a free port, the revision, the machine, one result header,
atomic writes), and no benchmark keeping its own copy."""

from __future__ import annotations

import glob
import json
import os
import socket

import pytest

from tests.conftest import REPO, load_script

pytestmark = pytest.mark.unit


@pytest.fixture
def harness(monkeypatch):
    h = load_script(os.path.join(REPO, "bench", "harness.py"), "bench_harness")
    monkeypatch.setattr(h, "revision", lambda: "abc1234+changes")  # git is a process: the header's use of it is what is tested
    return h


def test_a_result_carries_the_header_and_keeps_its_own_fields(harness, tmp_path):
    path = tmp_path / "results" / "x.json"
    harness.write_result(str(path), {"date": "the script's own", "rows": [1, 2]}, "x")
    doc = json.loads(path.read_text())
    assert doc["benchmark"] == "x" and doc["date"] == "the script's own" and doc["rows"] == [1, 2]
    assert doc["machine"]["cpus"] == os.cpu_count() and doc["command"].startswith("python3 ")
    assert doc["revision"] == "abc1234+changes"


def test_a_write_that_fails_leaves_the_previous_results_whole(harness, tmp_path):
    path = tmp_path / "x.json"
    harness.write_result(str(path), {"n": 1}, "x")
    before = path.read_text()
    with pytest.raises(TypeError):
        harness.write_result(str(path), {"n": object()}, "x")  # not JSON: nothing replaces the file
    assert path.read_text() == before and os.listdir(tmp_path) == ["x.json"]


def test_the_free_port_is_free(harness):
    port = harness.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # raises if it were taken


def test_no_benchmark_or_test_helper_keeps_its_own_copy_of_the_harness():
    own = []
    helpers = [os.path.join(REPO, "tests", f) for f in ("sim_helpers.py", "sim_fixtures.py")]
    for p in sorted(glob.glob(os.path.join(REPO, "bench", "*.py"))) + helpers:
        if os.path.basename(p) == "harness.py":
            continue
        text = open(p, encoding="utf-8").read()
        own += [f"{os.path.basename(p)}: {name}" for name in ("def free_port(", "def _free_port(") if name in text]
    assert own == []
