"""restart_with_rollback, rollback and post_start_verify against real sim_server processes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, call
from tests.sim_helpers import free_port, make_test_policy, sim_argv
from vkit.apply import launcher
from vkit.state import StateFile

pytestmark = pytest.mark.e2e


@pytest.fixture
def env(tmp_path, monkeypatch):
    """A state file whose launch argv is a fast sim_server on a free port; servers stopped after."""
    port = free_port()
    st = str(tmp_path / "st" / "vkit.json")
    monkeypatch.setenv("VKIT_STATE", st)
    monkeypatch.setenv("VKIT_POLICY", make_test_policy(tmp_path))
    r = call("state", "init", "--url", f"http://127.0.0.1:{port}", "--model", "sim-8b", "--",
             *sim_argv(port, "--max-model-len", "4096"))
    assert r.code == 0, r
    yield {"state": st, "port": port, "url": f"http://127.0.0.1:{port}", "sf": StateFile(st)}
    doc = StateFile(st).read()
    launcher.stop(doc["service"].get("running"), grace_s=3)


def rwr(*args: str):
    return call("restart_with_rollback", "--sandbox", "--ready-timeout", "20", "--grace", "3", *args)


def running_pid(e) -> int | None:
    return (e["sf"].read()["service"].get("running") or {}).get("pid")


def verifies(e) -> bool:
    return call("post_start_verify", "--url", e["url"], "--model", "sim-8b").code == 0


def events(e) -> list[str]:
    return [x["event"] for x in e["sf"].log.read()]


def test_first_restart_with_nothing_running_then_apply_and_keep(env):
    r = rwr("--set", "max_num_seqs=64")
    assert r.code == 0, r
    assert verifies(env)
    doc = env["sf"].read()
    assert doc["candidate"]["status"] == "applied" and doc["kept"]["config"] == {}
    assert doc["service"]["startup"]["kv_cache_tokens"] > 0 and doc["service"]["startup"]["max_concurrency"] > 0
    # the server's own log shows the new flag
    log = open(doc["service"]["running"]["log"]).read()
    assert "'max_num_seqs': 64" in log or "max_num_seqs=64" in log
    r = rwr("--set", "max_num_seqs=32", "--keep")
    assert r.code == 0 and "kept by hand" in r.out
    doc = env["sf"].read()
    assert doc["kept"]["config"] == {"max_num_seqs": 32} and doc["kept"]["decision"] == "manual"
    assert doc["kept"]["decision_id"] in [x["id"] for x in env["sf"].log.read() if x["event"] == "keep"]


def test_start_failure_rolls_back_to_kept_not_to_last_changed(env):
    assert rwr("--set", "max_num_seqs=48", "--keep").code == 0
    assert rwr("--set", "max_num_seqs=96").code == 0  # applied, not kept
    r = rwr("--set", "max_num_batched_tokens=1024", "--set", "enable_chunked_prefill=false")
    assert r.code == 1, r
    assert "max_num_batched_tokens (1024) is smaller than max_model_len (4096)" in r.out
    assert verifies(env)
    doc = env["sf"].read()
    assert doc["service"]["running"]["config"] == {"max_num_seqs": 48}  # the kept one, not 96
    assert doc["start_failures"] == 1 and doc["abnormal"]["flag"] is False
    assert "start_failed" in events(env) and "rolled_back" in events(env)


def test_kv_cache_too_small_quotes_the_estimate(env):
    r = rwr("--set", "max_model_len=3000000", "--allow", "max_model_len")
    assert r.code == 1, r
    assert "max_model_len" in r.out and verifies(env)
    d = env["sf"].read()["candidate"]["diagnosis"]
    assert d["kind"] in ("kv_cache_too_small", "max_model_len_above_model")


def test_health_hang_times_out_and_rolls_back(env):
    r = call("restart_with_rollback", "--sandbox", "--ready-timeout", "3", "--grace", "3", "--set", "sim_hang_health=true")
    assert r.code == 1, r
    assert env["sf"].read()["candidate"]["diagnosis"]["kind"] == "ready_timeout"
    assert verifies(env)


def test_crash_after_start_is_caught_by_verification(env):
    r = rwr("--set", "sim_crash_after=0")
    assert r.code == 1, r
    assert "post_start_verify failed" in r.out
    assert verifies(env)


def test_two_failures_in_a_row_mark_abnormal_and_later_restarts_refuse(env):
    assert rwr("--set", "sim_fail_at_start=true").code == 1
    r = rwr("--set", "sim_fail_at_start=true")
    assert r.code == 4, r
    assert "ABNORMAL" in r.out
    assert verifies(env)  # rollback still attempted and the kept server serves
    doc = env["sf"].read()
    assert doc["abnormal"]["flag"] and "2 candidate start failures" in doc["abnormal"]["reason"]
    r = rwr("--set", "max_num_seqs=64")
    assert r.code == 4 and "ABNORMAL" in r.err and "--clear-abnormal" in r.err
    assert call("state", "--clear-abnormal", "--reason", "checked").code == 0
    assert rwr("--set", "max_num_seqs=64").code == 0


def test_success_between_failures_resets_the_count(env):
    assert rwr("--set", "sim_fail_at_start=true").code == 1
    assert rwr("--set", "max_num_seqs=64").code == 0
    assert rwr("--set", "sim_fail_at_start=true").code == 1
    assert env["sf"].read()["abnormal"]["flag"] is False


def test_forbidden_parameter_refused_without_touching_the_server(env):
    assert rwr("--set", "max_num_seqs=64").code == 0
    pid = running_pid(env)
    r = rwr("--set", "tensor_parallel_size=2")
    assert r.code == 1 and "forbidden" in r.err and "--allow tensor_parallel_size" in r.err
    assert running_pid(env) == pid and launcher.alive(pid)


def test_lease_held_by_another_run_exit_4(env):
    env["sf"].leases.acquire("tune@elsewhere", ttl_s=600)  # this pid is alive, so the lease is live
    r = rwr("--set", "max_num_seqs=64")
    assert r.code == 4 and "tune@elsewhere" in r.err
    assert running_pid(env) is None


def test_production_restart_needs_confirmation(env):
    r = call("restart_with_rollback", "--set", "max_num_seqs=64")
    assert r.code == 2 and "--yes" in r.err


def test_port_in_use_is_diagnosed(env):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", env["port"]))
        s.listen(1)
        r = rwr("--set", "max_num_seqs=64")
    assert r.code == 4, r  # candidate and rollback both fail: ABNORMAL
    d = env["sf"].read()["candidate"]["diagnosis"]
    assert d["kind"] == "port_in_use" and "in use" in d["quote"].lower()


def test_shell_metacharacters_reach_the_server_as_literal_argv(env, tmp_path):
    marker = tmp_path / "pwned"
    r = rwr("--set", f"sim_gpu=H200; touch {marker}")
    assert r.code == 1, r
    d = env["sf"].read()["candidate"]["diagnosis"]
    assert d["kind"] == "bad_argument" and f"'H200; touch {marker}'" in d["quote"]
    assert not marker.exists()
    assert verifies(env)


def test_kill_9_mid_restart_then_next_command_recovers(env):
    assert rwr("--set", "max_num_seqs=48", "--keep").code == 0
    p = subprocess.Popen([sys.executable, "bin/restart_with_rollback", "--sandbox", "--set", "sim_startup_s=30", "--set", "max_num_seqs=64"],
                         cwd=REPO, env=os.environ.copy(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while time.time() < deadline:
        run = env["sf"].read()["service"].get("running") or {}
        if run.get("role") == "candidate":
            break
        time.sleep(0.1)
    orphan = env["sf"].read()["service"]["running"]
    assert orphan["role"] == "candidate"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert launcher.alive(orphan["pid"], orphan["ticks"])  # the half-started candidate is an orphan now
    r = call("rollback", "--ready-timeout", "20", "--grace", "3")
    assert r.code == 0, r
    assert "orphan_detected" in events(env)
    assert not launcher.alive(orphan["pid"], orphan["ticks"])
    assert env["sf"].read()["service"]["running"]["config"] == {"max_num_seqs": 48}
    assert verifies(env)


def test_kill_9_between_start_and_record_stops_the_unrecorded_server(env):
    """vkit killed after it started a candidate but before the state recorded its pid: the server
    holds the port and nothing names it. The next command finds it by its tag and recovers."""
    assert rwr("--set", "max_num_seqs=48", "--keep").code == 0
    st = env["sf"].read()
    launcher.stop(st["service"]["running"], grace_s=3)  # the killed restart had stopped the kept server ...
    env["sf"].service.set_running(None)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    env["sf"].service.begin_candidate({"config": {"max_num_seqs": 64}, "changes": {"max_num_seqs": 64}, "since": "x",
                               "owner": "restart_with_rollback@gone", "owner_pid": dead.pid})
    # ... and started the candidate, then died before set_running
    ghost = launcher.start(st["service"]["launch"], {"max_num_seqs": 64}, str(env["sf"].dir) + "/ghost.log",
                           tag=launcher.tag_for(env["sf"].dir))
    deadline = time.time() + 20
    while time.time() < deadline and not launcher.wait_ready(env["url"], ghost, 0.5).ok:
        time.sleep(0.1)
    assert launcher.tagged_pids(launcher.tag_for(env["sf"].dir)) == [ghost.pid]
    assert launcher.tagged_pids(launcher.tag_for(str(env["sf"].dir) + "-other")) == []
    r = call("rollback", "--ready-timeout", "20", "--grace", "3")
    assert r.code == 0, r
    assert "orphan_detected" in events(env) and "orphan_stopped" in events(env)
    assert not launcher.alive(ghost.pid, ghost.ticks)
    assert env["sf"].read()["service"]["running"]["config"] == {"max_num_seqs": 48}
    assert verifies(env)


def test_sigint_during_restart_restores_kept(env):
    assert rwr("--set", "max_num_seqs=48", "--keep").code == 0
    p = subprocess.Popen([sys.executable, "bin/restart_with_rollback", "--sandbox", "--set", "sim_startup_s=30", "--set", "max_num_seqs=64"],
                         cwd=REPO, env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 20
    while time.time() < deadline and (env["sf"].read()["service"].get("running") or {}).get("role") != "candidate":
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert env["sf"].read()["service"]["running"]["config"] == {"max_num_seqs": 48}
    assert verifies(env)


def test_post_start_verify_checks_and_exit_codes(env):
    assert rwr("--set", "max_num_seqs=64").code == 0
    r = call("post_start_verify", "--url", env["url"], "--model", "sim-8b", "--json", "--expect", "max_model_len=4096",
             "--expect", "block_size=16")
    assert r.code == 0, r
    checks = {c["id"]: c["status"] for c in json.loads(r.out)["checks"]}
    assert checks == {"health": "pass", "model": "pass", "forward": "pass", "metrics": "pass", "accelerator": "not_applicable"}
    r = call("post_start_verify", "--url", env["url"], "--model", "wrong-name")
    assert r.code == 1 and "not 'wrong-name'" in r.out
    r = call("post_start_verify", "--url", env["url"], "--model", "sim-8b", "--expect", "max_model_len=8192")
    assert r.code == 1 and "max_model_len is 4096" in r.out
    r = call("post_start_verify", "--url", "http://127.0.0.1:9", "--model", "sim-8b")
    assert r.code == 4


START_HOOK = r"""
import json, os, subprocess, sys
flags = open(os.environ["VKIT_SERVE_FLAGS_FILE"]).read().split("\n")[:-1]
assert flags == json.loads(os.environ["VKIT_SERVE_FLAGS"])
argv = json.loads(sys.argv[1]) + flags
p = subprocess.Popen(argv, stdout=open(sys.argv[2] + ".log", "ab"), stderr=subprocess.STDOUT, start_new_session=True)
open(sys.argv[2], "w").write(str(p.pid))
"""
STOP_HOOK = r"""
import os, signal, sys, time
try:
    pid = int(open(sys.argv[1]).read())
    os.killpg(pid, signal.SIGTERM)
    for _ in range(50):
        os.kill(pid, 0); time.sleep(0.1)
except (OSError, ValueError):
    pass
"""


def test_hook_mode_like_systemd(tmp_path, monkeypatch):
    """A start hook that launches the server and returns at once (systemctl start), a stop hook,
    the flags passed as $VKIT_SERVE_FLAGS and a file: restart, failure and rollback all work."""
    port = free_port()
    st = str(tmp_path / "st" / "vkit.json")
    monkeypatch.setenv("VKIT_STATE", st)
    monkeypatch.setenv("VKIT_POLICY", make_test_policy(tmp_path))
    pidfile = str(tmp_path / "server.pid")
    start = [sys.executable, "-c", START_HOOK, json.dumps(sim_argv(port, "--max-model-len", "4096")), pidfile]
    stop = [sys.executable, "-c", STOP_HOOK, pidfile]
    r = call("state", "init", "--url", f"http://127.0.0.1:{port}", "--model", "sim-8b", "--stop-hook", json.dumps(stop), "--", *start)
    assert r.code == 0, r
    try:
        assert rwr("--set", "max_num_seqs=64").code == 0
        assert "'max_num_seqs': 64" in open(pidfile + ".log").read()
        r = rwr("--set", "max_num_batched_tokens=1024", "--set", "enable_chunked_prefill=false")
        assert r.code == 1, r
        assert call("post_start_verify", "--url", f"http://127.0.0.1:{port}", "--model", "sim-8b").code == 0
    finally:
        subprocess.run(stop, timeout=30)
    r = call("state", "init", "--url", "http://h:1", "--model", "m", "--force", "--stop-hook", "systemctl stop vllm", "--", "x")
    assert r.code == 2 and "JSON list" in r.err


def test_post_start_verify_reads_accelerator_memory_from_npu_smi(env, tmp_path, monkeypatch):
    from test_accel import NPU_910B, fake_tool
    assert rwr("--set", "max_num_seqs=64").code == 0
    fake_tool(tmp_path, monkeypatch, "npu-smi", NPU_910B)
    r = call("post_start_verify", "--url", env["url"], "--model", "sim-8b", "--json")
    acc = next(c for c in json.loads(r.out)["checks"] if c["id"] == "accelerator")
    assert r.code == 0 and acc["status"] == "pass"
    # idle_w: the two NPUs' Power(W), 96.1 + 91.2, read once at the start (the energy checks judge runs against it)
    assert acc["evidence"] == {"tool": "npu-smi", "devices": 2, "mem_used_mib_max": 58213.0, "idle_w": pytest.approx(187.3)}
    fake_tool(tmp_path, monkeypatch, "npu-smi", "dcmi module initialize failed\n")
    r = call("post_start_verify", "--url", env["url"], "--model", "sim-8b", "--json")
    acc = next(c for c in json.loads(r.out)["checks"] if c["id"] == "accelerator")
    assert r.code == 0 and acc["status"] == "not_applicable" and "did not parse" in acc["why"]


def test_keep_requires_the_policy_post_start_check(env):
    """Rule R1 (post_start_verify after every restart), read from the policy: a candidate whose record
    lacks the passed check cannot become the rollback target."""
    from vkit.apply.lifecycle import Lifecycle
    from vkit.errors import MustRunMissing

    assert rwr("--set", "max_num_seqs=64").code == 0
    assert env["sf"].read()["candidate"]["checks"] == ["post_start_verify"]
    with env["sf"].transaction() as st:
        st["candidate"]["checks"] = []  # e.g. a record written by hand, or by an older vkit
    with pytest.raises(MustRunMissing, match="post_start_verify.*rule R1"):
        Lifecycle(env["sf"], tool="test", owner="test").keep(reason="test", decision="manual")
    assert env["sf"].read()["kept"]["config"] == {}


@pytest.mark.unit
def test_a_keep_logged_before_a_stop_is_applied_on_the_rerun_not_logged_twice(tmp_path):
    """vkit stopped between the keep's log line and the state write: the caller reserved the id and kept it in its
    record, so the rerun's keep with that id only applies it; the log holds the keep once."""
    from vkit.apply.lifecycle import Lifecycle
    from vkit.state import new_state

    sf = StateFile(str(tmp_path / "vkit.json"))
    sf.create(new_state("http://127.0.0.1:9", "m", ["serve", "m"], {"max_num_seqs": 32}))
    sf.service.begin_candidate({"config": {"max_num_seqs": 64}, "changes": {"max_num_seqs": 64}})
    sf.service.candidate_applied({}, ["post_start_verify"])
    did = sf.log.new_id()
    sf.log.append("tune", "keep", decision_id=did, config={"max_num_seqs": 64}, reason="gate accepted t002", decision="gate")
    assert sf.read()["kept"]["config"] == {"max_num_seqs": 32}  # the stop came here
    got = Lifecycle(sf, tool="tune", owner="test").keep(reason="gate accepted t002", decision="gate", decision_id=did)
    st = sf.read()
    assert got == did and st["kept"] == dict(st["kept"], config={"max_num_seqs": 64}, decision_id=did, decision="gate")
    assert [e["id"] for e in sf.log.read() if e["event"] == "keep"] == [did]
    # without a logged keep of that id, the reserved id is the new keep's
    sf.service.begin_candidate({"config": {"max_num_seqs": 128}, "changes": {"max_num_seqs": 128}})
    sf.service.candidate_applied({}, ["post_start_verify"])
    other = sf.log.new_id()
    assert Lifecycle(sf, tool="tune", owner="test").keep(reason="r", decision="gate", decision_id=other) == other
    assert [e["id"] for e in sf.log.read() if e["event"] == "keep"] == [did, other]
