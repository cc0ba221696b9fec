"""make soak (runbook/soak.sh): K duration-bound bench_stream windows against a simulator, each
validated by check_invariants and appended to soak.jsonl as one line, then drift over the windows.
Tiny windows (1.5 s at --sim-speed 4); --sim-noise 0 and SIGMA=2% keep the stable case from a false
alarm on a busy 2-core box, and --sim-drift 30 makes the drifting one unmistakable."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import requests

from tests.conftest import REPO
from tests.sim_helpers import free_port

pytestmark = pytest.mark.e2e

K = 12
WORKLOAD = ["--random-input-len", "256", "--random-output-len", "64", "--max-concurrency", "16", "--num-prompts", "400"]
SUMMARY_KEYS = {"duration", "completed", "failed", "num_prompts", "output_throughput", "request_throughput",
                "mean_ttft_ms", "p95_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "vkit"}


@contextlib.contextmanager
def sim(*extra: str):
    port = free_port()
    p = subprocess.Popen([sys.executable, "bin/sim_server", "sim-8b", "--port", str(port), "--sim-speed", "4",
                          "--sim-startup-s", "0", "--sim-seed", "5", *extra],
                         cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.time() + 15
        while True:
            with contextlib.suppress(requests.RequestException):
                if requests.get(url + "/health", timeout=1).status_code == 200:
                    break
            assert p.poll() is None and time.time() < end, "the simulator did not start"
            time.sleep(0.1)
        yield url
    finally:
        p.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(10)
        if p.poll() is None:
            p.kill()
            p.wait()


def soak_env(tmp_path, url: str, windows: int = K, window_s: float = 1.5, **extra: str) -> dict:
    env = dict(os.environ, PY=sys.executable, URL=url, WINDOWS=str(windows), WINDOW_S=str(window_s),
               SOAK_DIR=str(tmp_path / "soak"), VKIT_STATE=str(tmp_path / "nostate" / "vkit.json"), SIGMA="2%")
    env.update(extra)
    for k in ("VKIT_LEASE_OWNER", "VKIT_POLICY"):
        env.pop(k, None)
    return env


def run_soak(env: dict, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "runbook/soak.sh", *WORKLOAD, *flags], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=150)


def windows(d) -> tuple[list[dict], list[dict]]:
    """soak.jsonl's summaries and checks.jsonl's verdicts, every line checked."""
    docs = [json.loads(x) for x in (d / "soak.jsonl").read_text().splitlines()]
    checks = [json.loads(x) for x in (d / "checks.jsonl").read_text().splitlines()]
    assert [c["window"] for c in checks] == list(range(1, len(docs) + 1))
    for doc, c in zip(docs, checks, strict=True):
        assert SUMMARY_KEYS <= set(doc), sorted(SUMMARY_KEYS - set(doc))
        assert doc["vkit"]["stream"] is True and not doc["vkit"].get("partial")
        assert doc["completed"] > 0 and doc["failed"] == 0 and doc["output_throughput"] > 0
        assert c["verdict"] in ("valid", "anomaly"), c  # check_invariants did not call it invalid
    return docs, checks


@pytest.mark.slow
def test_soak_stable_server(tmp_path):
    with sim("--sim-noise", "0") as url:
        p = run_soak(soak_env(tmp_path, url))
    d = tmp_path / "soak"
    report = p.stderr[-4000:]
    docs, _ = windows(d)
    assert len(docs) == K, report
    assert {x["vkit"]["seed"] for x in docs} == set(range(2, K + 2))  # window k: seed 1 + k
    drift = json.loads((d / "drift.json").read_text())
    assert p.returncode == 0, report
    assert drift["verdict"] == "stable" and drift["n"] == K and drift["changed"] is False
    assert json.loads(p.stdout) == drift
    assert "soak: STABLE over 12 windows" in p.stderr


@pytest.mark.slow
def test_soak_drifting_server(tmp_path):
    # step time grows 30% per simulated hour: ~ -40% throughput over the soak's ~100 simulated seconds
    with sim("--sim-noise", "0", "--sim-drift", "30") as url:
        p = run_soak(soak_env(tmp_path, url))
    d = tmp_path / "soak"
    report = p.stderr[-4000:]
    docs, _ = windows(d)
    assert len(docs) == K, report
    drift = json.loads((d / "drift.json").read_text())
    assert p.returncode == 1, report
    assert drift["changed"] is True and drift["shift"] < -0.05, drift
    assert docs[-1]["output_throughput"] < docs[0]["output_throughput"]
    assert "soak: DRIFTED" in p.stderr and "level changed at window" in p.stderr


@pytest.mark.slow
def test_soak_interrupted_keeps_measured_windows(tmp_path):
    d = tmp_path / "soak"
    with sim() as url:
        proc = subprocess.Popen(["bash", "runbook/soak.sh", *WORKLOAD], cwd=REPO, env=soak_env(tmp_path, url, window_s=1),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        end = time.time() + 60
        while time.time() < end and not ((d / "soak.jsonl").exists() and len((d / "soak.jsonl").read_text().splitlines()) >= 2):
            time.sleep(0.05)
        time.sleep(0.4)  # into the next window
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C at a terminal: the script and its bench_stream
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    docs, checks = windows(d)
    assert 2 <= len(docs) < K, err[-3000:]
    assert f"interrupted: {len(docs)} windows kept in {d / 'soak.jsonl'}" in err
    # the interrupted window, if bench_stream was in the middle of one, is kept aside, never in the JSONL
    for f in d.glob("windows/*.partial.json"):
        assert json.loads(f.read_text())["vkit"]["partial"] is True


def test_soak_refuses_a_server_not_on_its_kept_configuration(tmp_path):
    from tests.conftest import call

    st = str(tmp_path / "st" / "vkit.json")
    port = free_port()
    r = call("state", "--state", st, "init", "--url", f"http://127.0.0.1:{port}", "--model", "sim-8b", "--set",
             "max_num_seqs=32", "--", sys.executable, "bin/sim_server", "sim-8b", "--port", str(port))
    assert r.code == 0, r
    env = soak_env(tmp_path, "", VKIT_STATE=st)  # not started: nothing is recorded as running
    p = run_soak(env)
    assert p.returncode == 4, p.stderr
    assert "not recorded as running the kept configuration (--max-num-seqs 32)" in p.stderr
    assert "bin/rollback" in p.stderr and not (tmp_path / "soak" / "soak.jsonl").exists()
    p = run_soak(dict(env, WINDOWS="6"))
    assert p.returncode == 2 and "at least 12 windows" in p.stderr
