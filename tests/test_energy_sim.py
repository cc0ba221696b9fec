"""Energy end to end on a live sim_server: its nvidia-smi on PATH, read by bench_stream's sampler, the
fingerprint and post_start_verify as a real board's would be."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, call
from tests.sim_fixtures import SimProcess
from vkit.measure import accel

pytestmark = pytest.mark.e2e

SMI_DIR = os.path.join(REPO, "vkit", "data", "smi")


@pytest.fixture
def sim_smi(monkeypatch):
    """A simulated H200 (TP 1) whose boards nvidia-smi on PATH reads."""
    with SimProcess("--sim-gpu", "H200", "--sim-model", "llama-3.1-8b", "--sim-speed", "2") as sim:
        monkeypatch.setenv("PATH", SMI_DIR + os.pathsep + os.environ["PATH"])
        monkeypatch.setenv("VKIT_SIM_SMI_URL", sim.url)
        yield sim


def test_without_a_server_to_ask_the_shim_fails_as_nvidia_smi_without_a_driver():
    env = {k: v for k, v in os.environ.items() if k != "VKIT_SIM_SMI_URL"}
    r = subprocess.run([os.path.join(SMI_DIR, "nvidia-smi"), "--query-gpu=index", "--format=csv"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 9 and r.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate")


def test_a_run_on_the_simulator_carries_its_energy_from_the_counter(sim_smi, tmp_path):
    out = tmp_path / "run.json"
    r = call("bench_stream", "--url", sim_smi.url, "--random-input-len", "256", "--random-output-len", "128",
             "--num-prompts", "240", "--max-concurrency", "32", "--idle-power-w", "77.7", "-q", "-o", str(out))
    assert r.code == 0, r.err
    s = json.loads(out.read_text())
    e = s["vkit"]["energy"]
    assert (e["source"], e["usable"], e["idle_w"]) == ("counter", True, 77.7)
    # at --sim-speed 2 the boards do two seconds of work per wall second: watts read twice a board's, and
    # the joules per token are the simulated board's (the energy counter counts simulated joules)
    assert 2 * 77.7 < e["mean_w"] <= 2 * 700.0
    assert s["j_per_output_token"] == pytest.approx(e["energy_j"] / s["total_output_tokens"])
    assert s["vkit"]["fingerprint"]["accelerator"]["model"] == "NVIDIA H200"
    c = call("check_invariants", str(out), "--json")
    checks = {x["id"]: x["status"] for x in json.loads(c.out)["checks"]}
    assert (checks["energy_counter_monotone"], checks["power_above_idle"], checks["power_coverage"]) == ("pass",) * 3


def test_post_start_verify_measures_the_boards_idle_power(sim_smi):
    r = subprocess.run([sys.executable, os.path.join(REPO, "bin", "post_start_verify"), "--url", sim_smi.url,
                        "--model", "sim-model", "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    acc = next(c for c in json.loads(r.stdout)["checks"] if c["id"] == "accelerator")
    assert acc["status"] == "pass" and acc["evidence"]["idle_w"] == pytest.approx(77.7)


ASCEND_DIR = os.path.join(REPO, "vkit", "data", "smi-ascend")


def test_ascend_boards_are_read_through_npu_smi_sampled_without_an_energy_counter(monkeypatch, tmp_path):
    """A simulated Atlas 800T A2 (910B, TP 2): its npu-smi table, in the vendor's format, is what bench_stream's sampler
    reads (no nvidia-smi on such a machine); npu-smi has no energy counter, so the energy is the samples' integral."""
    with SimProcess("--sim-gpu", "Ascend-910B", "--sim-model", "llama-3.1-8b", "-tp", "2", "--sim-speed", "1") as sim:
        monkeypatch.setenv("PATH", ASCEND_DIR + os.pathsep + os.environ["PATH"])
        monkeypatch.setenv("VKIT_SIM_SMI_URL", sim.url)
        info = subprocess.run(["npu-smi", "info"], capture_output=True, text=True, timeout=30)
        assert info.returncode == 0 and "| NPU   Name                | Health        | Power(W)" in info.stdout
        # nvidia-smi is not installed on such a machine: the simulator says so as a shell would (127)
        nv = subprocess.run([os.path.join(SMI_DIR, "nvidia-smi"), "--query-gpu=index", "--format=csv"],
                            capture_output=True, text=True, timeout=30)
        assert (nv.returncode, nv.stdout) == (127, "")
        rows = accel.parse_npu(info.stdout)
        assert [(r["npu"], r["name"]) for r in rows] == [(0, "910B3"), (1, "910B3")]
        assert accel.device_power(rows) == [pytest.approx(90.0, abs=0.05)] * 2  # idle: nothing has run yet
        out = tmp_path / "run.json"
        r = call("bench_stream", "--url", sim.url, "--random-input-len", "512", "--random-output-len", "256",
                 "--num-prompts", "96", "--max-concurrency", "16", "--idle-power-w", "180", "-q", "-o", str(out))
        assert r.code == 0, r.err
    s = json.loads(out.read_text())
    e = s["vkit"]["energy"]
    assert (e["source"], e["usable"], e["idle_w"]) == ("sampled", True, 180.0), e
    assert 180.0 < e["mean_w"] <= 800.0, e  # two boards: between their idle (2 x 90 W) and their limit (2 x 400 W)
