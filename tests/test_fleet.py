"""Many machines through Ray (vkit.tune.fleet): each slot's server and measurements on a node's
worker, the state and decisions on the driver; a worker killed mid-trial loses nothing."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from tests.conftest import REPO
from tests.sim_helpers import free_port
from vkit.errors import Unavailable
from vkit.state import StateFile
from vkit.tune import fleet

PY = sys.executable
NODES = [
    {"NodeID": "aaa111", "NodeManagerAddress": "10.0.0.1", "Alive": True, "Resources": {"CPU": 64.0, "GPU": 8.0}},
    {"NodeID": "bbb222", "NodeManagerAddress": "10.0.0.2", "Alive": True, "Resources": {"CPU": 64.0, "GPU": 2.0}},
    {"NodeID": "ccc333", "NodeManagerAddress": "10.0.0.3", "Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}},
]


class FakeRay:
    @staticmethod
    def nodes():
        return NODES


@pytest.mark.unit
def test_slots_are_pinned_to_nodes_with_room_for_their_devices():
    taken: dict = {}
    four = [{"name": f"s{i}", "devices": [2 * i, 2 * i + 1]} for i in range(5)]
    # 8 GPUs on the first node hold four 2-GPU slots; the fifth goes to the second node; the dead node gets none
    assert [fleet._node_for(FakeRay, s, taken) for s in four] == ["aaa111"] * 4 + ["bbb222"]
    with pytest.raises(Unavailable, match="no alive Ray node has 2 free GPU"):
        fleet._node_for(FakeRay, {"name": "s5", "devices": [0, 1]}, taken)
    # a slot naming its node (IP or id) goes there, and only there
    assert fleet._node_for(FakeRay, {"name": "x", "devices": [0], "node": "10.0.0.2"}, {}) == "bbb222"
    with pytest.raises(Unavailable, match="no alive Ray node is 10.0.0.3"):
        fleet._node_for(FakeRay, {"name": "x", "devices": [0], "node": "10.0.0.3"}, {})
    # a worker's name is one per state file and slot
    assert fleet.worker_name("/a/vkit.json", "s0") == fleet.worker_name("/a/../a/vkit.json", "s0") != fleet.worker_name("/b/vkit.json", "s0")


@pytest.mark.e2e
def test_the_default_path_never_imports_ray():
    code = ("import sys; import vkit.cli.tune, vkit.cli.sweep, vkit.tune.driver, vkit.tune.fleet; "
            "assert 'ray' not in sys.modules, 'ray imported'")
    r = subprocess.run([PY, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr


# -- end to end: a local Ray cluster, two simulator slots ------------------------------------------
FAST = ["--sandbox", "--objective", "throughput", "--concurrency", "16", "--input-len", "256", "--output-len", "64",
        "--num-prompts", "100", "--baseline-repeats", "3", "--screen-repeats", "1", "--ready-timeout", "30",
        "--slo", "p95_ttft_ms=5000", "--guard", "p95_ttft_ms:-:50%", "--confirm-front", "0"]


def _sim(port: int) -> list[str]:
    return [PY, os.path.join(REPO, "bin", "sim_server"), "sim-8b", "--port", str(port), "--sim-speed", "8",
            "--sim-startup-s", "0.2", "--sim-seed", "5", "--max-model-len", "4096"]


@pytest.fixture
def cluster(tmp_path):
    pytest.importorskip("ray", reason="the Ray extra is not installed: make fleet (make test installs it)")
    port = free_port()
    short = tempfile.mkdtemp(prefix="vr", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=short, VKIT_FLEET_DIR=str(tmp_path / "node"))
    os.makedirs(env["VKIT_FLEET_DIR"], exist_ok=True)
    ray_bin = os.path.join(os.path.dirname(PY), "ray")
    start = [ray_bin, "start", "--head", "--port", str(port), "--num-cpus", "4", "--num-gpus", "0", "--include-dashboard", "false",
             "--disable-usage-stats", "--temp-dir", env["RAY_TMPDIR"]]
    r = subprocess.run(start, capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    try:
        yield {"address": f"127.0.0.1:{port}", "env": env}
    finally:
        subprocess.run([ray_bin, "stop", "--force"], capture_output=True, env=env, timeout=120)
        shutil.rmtree(short, ignore_errors=True)


def _state(tmp_path, cluster_env) -> tuple[str, StateFile, dict]:
    p0, p1 = free_port(), free_port()
    st = str(tmp_path / "st" / "vkit.json")
    env = dict(cluster_env, VKIT_STATE=st)
    spec = tmp_path / "slots.json"
    # no GPUs on this cluster: the slots ask for none ("gpus": false), and go to the one node
    spec.write_text(json.dumps([{"name": "s0", "devices": [0], "port": p0, "gpus": False},
                                {"name": "s1", "devices": [1], "port": p1, "gpus": False}]))
    r = subprocess.run([PY, os.path.join(REPO, "bin", "state"), "init", "--slots-file", str(spec), "--url", f"http://127.0.0.1:{p0}",
                        "--model", "sim-8b", "--set", "max_num_seqs=4", "--set", "max_num_batched_tokens=2048", "--", *_sim(p0)],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    return st, StateFile(st), env


def _stop_servers(sf: StateFile) -> None:
    from vkit.apply import launcher

    for x in sf.read().get("slots") or []:
        sub = StateFile(os.path.join(sf.dir, x["state"]))
        run = sub.read()["service"].get("running") or {}
        if run.get("pid"):
            launcher.stop(run, grace_s=3)


@pytest.mark.e2e
@pytest.mark.fleet
def test_a_tune_through_ray_keeps_the_state_here_and_a_worker_killed_mid_trial_loses_nothing(tmp_path, cluster):
    st, sf, env = _state(tmp_path, cluster["env"])
    tune = [PY, os.path.join(REPO, "bin", "tune"), *FAST, "--steps", "2", "--budget", "4", "--json", "--ray", cluster["address"]]
    p = subprocess.Popen(tune, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(tmp_path))
    err: list[str] = []
    killed: list[int] = []

    def read_err():
        for line in p.stderr:
            err.append(line)
            if re.search(r"t\d+ on slot s1", line) and not killed:
                time.sleep(1.0)  # mid-trial: both slots' workers are restarting or measuring
                pids = [int(open(f).read()) for f in glob.glob(os.path.join(env["VKIT_FLEET_DIR"], "vkit-fleet-s1-*", "worker.pid"))]
                for pid in pids[:1]:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)

    t = threading.Thread(target=read_err, daemon=True)
    t.start()
    try:
        out = p.stdout.read()
        p.wait(timeout=900)
        t.join(timeout=10)
        assert p.returncode == 0, "".join(err)[-4000:]
        assert killed, "no worker of slot s1 was found to kill: " + "".join(err)[-2000:]
        s = sf.read()
        # the state and the decisions are here, the node's runs came back beside them
        assert s["trials"] and all(t["status"] in ("done", "eliminated", "skipped") for t in s["trials"]), \
            [(t["id"], t["status"], t.get("why")) for t in s["trials"]]
        assert all(os.path.exists(os.path.join(sf.dir, q)) for t in s["trials"] for q in t.get("runs") or [])
        assert all(os.path.exists(os.path.join(sf.dir, q)) for q in s["baseline"]["runs"])
        s1 = next(x for x in s["slots"] if x["name"] == "s1")
        assert s1["out"] and "Ray worker was lost" in s1["out"]["reason"]
        # the trial it was running is not lost: measured again on s0, its first attempt kept
        moved = [t for t in s["trials"] if t.get("failed_on")]
        assert moved and all(m["failed_on"][0]["slot"] == "s1" and m["slot"] == "s0" for m in moved)
        # the slot's own log (restarts on the node) came back to the driver's copy
        s0 = StateFile(os.path.join(sf.dir, s["slots"][0]["state"]))
        applied = [e for e in s0.log.read() if e["event"] == "applied"]
        assert applied and all(e.get("node_ts") for e in applied)
        assert s0.read()["kept"]["config"] == s["kept"]["config"]  # the node's copy of the slot, mirrored here
        # and its server's log came back, where the mirrored state says it is
        log = s0.read()["service"]["running"]["log"]
        assert log.startswith(sf.dir) and os.path.getsize(log) > 0
        res = json.loads(out)
        assert res["recommendation"]["config"] == s["kept"]["config"]
    finally:
        if p.poll() is None:
            p.kill()
        _stop_servers(sf)
