"""The state file: round trip, locking under contention, crash safety, corruption,
failed writes, the lease and the decision log."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, call
from vkit.errors import LeaseHeld, StateCorrupt, StateMissing, StateWriteError
from vkit.state import StateFile, new_state


def _init(path, **kw):
    sf = StateFile(path)
    sf.create(new_state("http://127.0.0.1:9", "m", ["serve", "m"], kw.get("kept")))
    return sf


def test_round_trip_keeps_every_field(state_path):
    sf = _init(state_path, kept={"max_num_seqs": 64})
    with sf.transaction() as st:
        st["trials"].append({"id": "t1", "config": {"max_num_seqs": 128}, "valid": True, "verdict": "reject"})
        st["sigma_baseline"]["output_throughput"] = 0.021
    doc = sf.read()
    assert doc["kept"]["config"] == {"max_num_seqs": 64}
    assert doc["trials"][0]["verdict"] == "reject"
    assert doc["sigma_baseline"] == {"output_throughput": 0.021}
    for key in ("service", "fingerprint", "candidate", "machine_state", "start_failures", "abnormal", "lease"):
        assert key in doc
    text = open(state_path).read()
    assert text.endswith("\n") and json.loads(text) == doc
    assert list(json.loads(text)) == sorted(json.loads(text))  # sorted keys


def test_missing_file_is_unavailable_with_hint(state_path):
    with pytest.raises(StateMissing, match="state init"):
        StateFile(state_path).read()
    r = call("state", "--state", state_path, "show")
    assert r.code == 4 and "run `state init" in r.err


def _rmw_worker(path, n, q):
    sf = StateFile(path)
    for _ in range(n):
        with sf.transaction() as st:
            st["sigma_baseline"]["counter"] = st["sigma_baseline"].get("counter", 0) + 1
            st["trials"].append({"id": f"{os.getpid()}-{len(st['trials'])}"})
    q.put(os.getpid())


def _reader_worker(path, stop, q):
    torn = 0
    reads = 0
    while not stop.is_set():
        try:
            with open(path) as f:
                json.loads(f.read())
            reads += 1
        except json.JSONDecodeError:
            torn += 1
    q.put((reads, torn))


def test_two_writers_lose_no_update_and_never_tear(state_path):
    _init(state_path)
    ctx = mp.get_context("fork")
    q, rq, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
    reader = ctx.Process(target=_reader_worker, args=(state_path, stop, rq))
    reader.start()
    ws = [ctx.Process(target=_rmw_worker, args=(state_path, 200, q)) for _ in range(2)]
    for w in ws:
        w.start()
    for w in ws:
        w.join(120)
        assert w.exitcode == 0
    stop.set()
    reads, torn = rq.get(timeout=30)
    reader.join(10)
    doc = StateFile(state_path).read()
    assert doc["sigma_baseline"]["counter"] == 400
    assert len(doc["trials"]) == 400 and len({t["id"] for t in doc["trials"]}) == 400
    assert reads > 0 and torn == 0


WRITER = r"""
import sys
sys.path.insert(0, sys.argv[2])
from vkit.state import StateFile
sf = StateFile(sys.argv[1])
i = 0
while True:
    with sf.transaction() as st:
        i += 1
        st["sigma_baseline"]["i"] = i
        st["trials"] = [{"id": "x" * 200, "n": i}] * 3000   # ~700 kB per write
"""


@pytest.mark.e2e
def test_writer_killed_mid_write_leaves_a_readable_state(state_path):
    _init(state_path)
    for delay in (0.15, 0.3, 0.45, 0.6):
        p = subprocess.Popen([sys.executable, "-c", WRITER, state_path, REPO])
        time.sleep(delay)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        doc = StateFile(state_path).read()  # never torn
        assert doc["schema_version"] == 1
    # the next writer sweeps the temp files the killed writers left
    with StateFile(state_path).transaction() as st:
        st["machine_state"] = "BASELINE"
    leftovers = [f for f in os.listdir(os.path.dirname(state_path)) if f.endswith(".tmp")]
    assert leftovers == []


@pytest.mark.parametrize("damage", ["truncate", "garbage", "not-object", "schema"])
def test_corrupted_file_exit_3_names_file_and_backup(state_path, damage):
    sf = _init(state_path)
    with sf.transaction() as st:  # creates the .bak
        st["machine_state"] = "BASELINE"
    good = open(state_path).read()
    bad = {
        "truncate": good[: len(good) // 2],
        "garbage": "\x00\x01not json",
        "not-object": "[1, 2]",
        "schema": json.dumps({"schema_version": 99, "service": {}, "kept": {}, "trials": []}),
    }[damage]
    with open(state_path, "w") as f:
        f.write(bad)
    with pytest.raises(StateCorrupt):
        sf.read()
    r = call("state", "--state", state_path, "show")
    assert r.code == 3, r
    assert state_path in r.err and state_path + ".bak" in r.err and "Traceback" not in r.err
    assert len(r.err.strip().splitlines()) == 1
    # every tool that reads the service from the state says the same, never "no service"
    for tool in ("bench_stream", "post_start_verify", "restart_with_rollback", "rollback", "tune", "gate"):
        args = {"restart_with_rollback": ["--set", "max_num_seqs=8", "--sandbox"], "gate": ["--trial", "t001"],
                "tune": ["--sandbox"]}.get(tool, [])
        r = call(tool, "--state", state_path, *args)
        assert r.code == 3 and state_path + ".bak" in r.err, (tool, r)
    assert open(state_path).read() == bad  # never silently reset
    # the backup really is the last good state
    assert json.load(open(state_path + ".bak"))["schema_version"] == 1


@pytest.mark.parametrize("errno_, text", [(28, "No space left on device"), (30, "Read-only file system")])
def test_failed_write_keeps_previous_state_and_says_why(state_path, monkeypatch, errno_, text):
    sf = _init(state_path)
    before = open(state_path).read()

    def boom(d, base):
        raise OSError(errno_, os.strerror(errno_))

    monkeypatch.setattr("vkit.state._mkstemp", boom)
    with pytest.raises(StateWriteError, match=text):
        with sf.transaction() as st:
            st["machine_state"] = "GATE"
    assert open(state_path).read() == before
    r = call("state", "--state", state_path, "show")  # reading still works
    assert r.code == 0 and "INIT" in r.out


def test_failed_replace_removes_temp_and_keeps_state(state_path, monkeypatch):
    sf = _init(state_path)
    before = open(state_path).read()

    def no_replace(a, b):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr("vkit.state.os.replace", no_replace)
    with pytest.raises(StateWriteError, match="previous state is intact"):
        with sf.transaction() as st:
            st["machine_state"] = "GATE"
    monkeypatch.undo()
    assert open(state_path).read() == before
    assert not [f for f in os.listdir(os.path.dirname(state_path)) if f.endswith(".tmp")]


def test_cli_write_failure_exit_4(state_path, monkeypatch):
    sf = _init(state_path)
    with sf.transaction() as st:
        st["abnormal"] = {"flag": True, "reason": "two start failures", "since": "x"}
    before = open(state_path).read()
    monkeypatch.setattr("vkit.state._mkstemp", lambda d, b: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    r = call("state", "--state", state_path, "--clear-abnormal", "--reason", "fixed")
    assert r.code == 4 and "No space left on device" in r.err and "intact" in r.err
    assert open(state_path).read() == before


@pytest.mark.e2e
def test_lease_contention_expiry_and_stale_pid(state_path):
    sf = _init(state_path)
    sf.leases.acquire("run-A", ttl_s=60)
    with pytest.raises(LeaseHeld) as e:
        sf.leases.acquire("run-B", ttl_s=60)
    assert "run-A" in str(e.value) and "until" in str(e.value) and "--break-lease" in str(e.value)
    sf.leases.renew("run-A", ttl_s=120)
    with pytest.raises(LeaseHeld):
        sf.leases.renew("run-B", ttl_s=10)
    # expiry passed → B may break it, and the break is logged
    with sf.transaction() as st:
        st["lease"]["expires"] = time.time() - 1
    sf.leases.acquire("run-B", ttl_s=60)
    assert sf.read()["lease"]["owner"] == "run-B"
    ev = [e for e in sf.log.read() if e["event"] == "lease_broken"]
    assert ev and ev[-1]["previous"]["owner"] == "run-A" and "expired" in ev[-1]["reason"]
    # holder pid gone → broken
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with sf.transaction() as st:
        st["lease"]["pid"] = dead.pid
    sf.leases.acquire("run-C", ttl_s=60)
    ev = [e for e in sf.log.read() if e["event"] == "lease_broken"]
    assert f"pid {dead.pid} is gone" in ev[-1]["reason"]
    assert sf.leases.release("run-C") is True and sf.read()["lease"] is None


def _hold_lease(path, q, hold_s):
    sf = StateFile(path)
    with sf.leases.hold("holder", ttl_s=60):
        q.put("held")
        time.sleep(hold_s)


def test_second_run_gets_exit_4_naming_the_holder(state_path):
    _init(state_path)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_hold_lease, args=(state_path, q, 3))
    p.start()
    assert q.get(timeout=10) == "held"
    with pytest.raises(LeaseHeld, match="holder"):
        StateFile(state_path).leases.acquire("second", 60)
    r = call("state", "--state", state_path, "show")
    assert "held by holder" in r.out
    p.join(10)
    assert StateFile(state_path).read()["lease"] is None  # released on exit


def test_break_lease_and_clear_abnormal_are_logged(state_path):
    sf = _init(state_path)
    sf.leases.acquire("someone", ttl_s=600)
    with sf.transaction() as st:
        st["abnormal"] = {"flag": True, "reason": "rollback failed", "since": "t"}
        st["start_failures"] = 2
    r = call("state", "--state", state_path, "--break-lease", "--clear-abnormal", "--reason", "human checked")
    assert r.code == 0, r
    doc = sf.read()
    assert doc["lease"] is None and doc["abnormal"]["flag"] is False and doc["start_failures"] == 0
    events = {e["event"]: e for e in sf.log.read()}
    assert events["abnormal_cleared"]["previous"]["reason"] == "rollback failed"
    assert events["lease_broken"]["by"] == "human"


def test_decision_log_skips_torn_last_line(tmp_path):
    from vkit.state import DecisionLog

    log = DecisionLog(str(tmp_path / "d.jsonl"))
    a = log.append("t", "one", x=1)
    log.append("t", "two")
    with open(log.path, "a") as f:
        f.write('{"ts": "2026-')
    events = log.read()
    assert [e["event"] for e in events] == ["one", "two"] and events[0]["id"] == a
    assert all("vkit_version" in e and "ts" in e and "tool" in e for e in events)


def test_init_refuses_to_overwrite_and_force_keeps_backup(state_path):
    r = call("state", "--state", state_path, "init", "--url", "http://h:1", "--model", "m", "--", "serve", "x")
    assert r.code == 0, r
    r = call("state", "--state", state_path, "init", "--url", "http://h:2", "--model", "m", "--", "serve", "y")
    assert r.code == 2 and "--force" in r.err
    r = call("state", "--state", state_path, "init", "--force", "--url", "http://h:2", "--model", "m", "--", "serve", "y")
    assert r.code == 0
    assert json.load(open(state_path + ".bak"))["service"]["launch"]["argv"] == ["serve", "x"]
    assert StateFile(state_path).read()["service"]["url"] == "http://h:2"
