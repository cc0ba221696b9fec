"""check_invariants: golden reports in every supported format, healthy and broken per check,
the seed's report rebuilt from its numbers, exit codes per severity, stdin and a real pipe.

Golden inputs live in tests/golden/invariants/ (built by its _make.py, on purpose only);
the expected JSON outputs in tests/golden/invariants/expected/ are compared exactly.
The test never writes them: regenerate on purpose with `make golden` (tests/golden/invariants/regen_expected.py).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, call
from vkit.errors import ExitCode
from vkit.validate.formats import detect, load_report
from vkit.validate.invariants import CHECKS, Thresholds, evaluate

GOLDEN = os.path.join(REPO, "tests", "golden", "invariants")
EXPECTED = os.path.join(GOLDEN, "expected")

V, A, I = ExitCode.OK, ExitCode.REJECTED, ExitCode.INVALID  # noqa: E741 - valid / anomaly / invalid
IDENTITY = ["ttft_e2el_identity", "decode_timing"]
STREAM_OFF = ["streaming"] + IDENTITY

# name, argv (paths relative to the golden directory), exit code, findings (failed invalid/anomaly checks)
CASES = [
    # the seed (seeds/004), rebuilt as AISBench: streaming off, TTFT ≡ E2EL = 9557.6 ms
    ("aisbench_seed", ["aisbench_seed.json"], I, IDENTITY),
    ("aisbench_seed_csv", ["aisbench_seed.csv"], I, IDENTITY),
    ("aisbench_seed_after", ["aisbench_seed_after.json", "--compare", "aisbench_seed.json", "--closed-loop", "16"], V, []),
    ("aisbench_healthy", ["aisbench_healthy.json", "--closed-loop", "16"], V, []),
    ("aisbench_prefill_slow", ["aisbench_prefill_slow.json"], A, ["phase_order"]),
    ("aisbench_errors", ["aisbench_errors.json"], A, ["error_rate"]),
    ("aisbench_few_samples", ["aisbench_few_samples.json"], A, ["percentile_samples"]),
    ("aisbench_failed_in_stats", ["aisbench_failed_in_stats.json"], A, ["failed_in_latency_stats"]),
    ("aisbench_little", ["aisbench_little.json", "--closed-loop", "16"], A, ["littles_law"]),
    ("aisbench_partial", ["aisbench_partial.json", "--closed-loop", "16"], A, ["complete_run"]),
    # duration includes 8% idle time: E2EL -7% but throughput flat; Little's law alone stays inside its 10%
    ("aisbench_compare_inconsistent", ["aisbench_after_inconsistent.json", "--compare", "aisbench_healthy.json",
                                       "--closed-loop", "16"], A, ["throughput_latency_consistency"]),
    # vkit bench_stream
    ("vkit_healthy", ["vkit_healthy.json"], V, []),
    ("vkit_stream_off", ["vkit_stream_off.json"], I, STREAM_OFF),
    ("vkit_seed", ["vkit_seed.json"], I, STREAM_OFF),
    ("vkit_prefill_slow", ["vkit_prefill_slow.json"], A, ["phase_order"]),
    ("vkit_little", ["vkit_little.json"], A, ["littles_law"]),
    ("vkit_compare_consistent", ["vkit_after_consistent.json", "--compare", "vkit_healthy.json"], V, []),
    ("vkit_compare_inconsistent", ["vkit_after_inconsistent.json", "--compare", "vkit_healthy.json"], A,
     ["littles_law", "throughput_latency_consistency"]),
    ("vkit_tokens_short", ["vkit_tokens_short.json"], A, ["tokens_vs_requested"]),
    ("vkit_tokens_server", ["vkit_tokens_server.json"], A, ["tokens_client_vs_server"]),
    ("vkit_few_samples", ["vkit_few_samples.json"], A, ["percentile_samples"]),
    ("vkit_warmup", ["vkit_warmup.json"], A, ["warmup_outliers"]),
    ("vkit_errors", ["vkit_errors.json"], A, ["error_rate"]),
    ("vkit_failed_in_stats", ["vkit_failed_in_stats.json"], A, ["failed_in_latency_stats", "littles_law", "client_server_ttft_gap"]),
    ("vkit_client_saturated", ["vkit_client_saturated.json"], A, ["client_saturation"]),
    ("vkit_ttft_gap", ["vkit_ttft_gap.json"], A, ["client_server_ttft_gap"]),
    ("vkit_partial", ["vkit_partial.json"], A, ["complete_run"]),
    ("vkit_config_differs", ["vkit_healthy.json", "--expect-config", "max_model_len=4096", "block_size=32",
                             "enable-prefix-caching=true"], I, ["server_config"]),
    ("vkit_config_file", ["vkit_healthy.json", "--expect-config", "expect_config.json"], V, []),
    # vllm bench serve --save-result
    ("vllm_bench_healthy", ["vllm_bench_healthy.json"], V, []),
    ("vllm_bench_detailed", ["vllm_bench_detailed.json"], V, []),
    ("vllm_bench_nonstream", ["vllm_bench_nonstream.json"], I, IDENTITY),
    ("vllm_bench_tpot_zero", ["vllm_bench_tpot_zero.json"], I, ["decode_timing"]),
    ("vllm_bench_prefill_slow", ["vllm_bench_prefill_slow.json"], A, ["phase_order"]),
    ("vllm_bench_little", ["vllm_bench_little.json"], A, ["littles_law"]),
    ("vllm_bench_errors", ["vllm_bench_errors.json"], A, ["error_rate"]),
    ("vllm_bench_few_samples", ["vllm_bench_few_samples.json"], A, ["percentile_samples"]),
    ("vllm_bench_failed_in_stats", ["vllm_bench_failed_in_stats.json"], A, ["failed_in_latency_stats", "littles_law"]),
    ("vllm_bench_compare_inconsistent", ["vllm_bench_after_inconsistent.json", "--compare", "vllm_bench_healthy.json"], A,
     ["littles_law", "throughput_latency_consistency"]),
    ("vllm_bench_compare_consistent", ["vllm_bench_after_consistent.json", "--compare", "vllm_bench_healthy.json"], V, []),
    ("vllm_bench_warmup", ["vllm_bench_warmup.json"], A, ["warmup_outliers"]),  # --save-detailed start_times
    ("vllm_bench_partial", ["vllm_bench_partial.json"], A, ["complete_run"]),
    # the same report without its "failed" key: 80 requests unaccounted for are still flagged
    ("vllm_bench_no_failed_count", ["vllm_bench_no_failed_count.json"], A, ["complete_run"]),
    # evalscope perf (directories with benchmark_summary/percentile/args.json)
    ("evalscope_healthy", ["evalscope_healthy/benchmark_summary.json"], V, []),
    ("evalscope_percentile_file", ["evalscope_healthy/benchmark_percentile.json"], V, []),
    ("evalscope_nonstream", ["evalscope_nonstream/benchmark_summary.json"], I, STREAM_OFF),
    ("evalscope_errors", ["evalscope_errors/benchmark_summary.json"], A, ["error_rate"]),
    ("evalscope_few_samples", ["evalscope_few_samples/benchmark_summary.json"], A, ["percentile_samples"]),
    ("evalscope_tokens_short", ["evalscope_tokens_short/benchmark_summary.json"], A, ["tokens_vs_requested"]),
    ("evalscope_little", ["evalscope_little/benchmark_summary.json"], A, ["littles_law"]),
    ("evalscope_prefill_slow", ["evalscope_prefill_slow/benchmark_summary.json"], A, ["phase_order"]),
    ("evalscope_partial", ["evalscope_partial/benchmark_summary.json"], A, ["complete_run"]),
    ("evalscope_compare_consistent", ["evalscope_after_consistent/benchmark_summary.json", "--compare",
                                      "evalscope_healthy/benchmark_summary.json"], V, []),
    ("evalscope_compare_inconsistent", ["evalscope_after_inconsistent/benchmark_summary.json", "--compare",
                                        "evalscope_healthy/benchmark_summary.json"], A, ["throughput_latency_consistency"]),
    # GuideLLM
    ("guidellm_healthy", ["guidellm_healthy.json"], V, []),
    ("guidellm_nonstream", ["guidellm_nonstream.json"], I, IDENTITY),
    ("guidellm_errors", ["guidellm_errors.json"], A, ["error_rate"]),
    ("guidellm_few_samples", ["guidellm_few_samples.json"], A, ["percentile_samples"]),
    ("guidellm_little", ["guidellm_little.json"], A, ["littles_law"]),
    ("guidellm_failed_in_stats", ["guidellm_failed_in_stats.json"], A, ["error_rate", "failed_in_latency_stats"]),
    ("guidellm_prefill_slow", ["guidellm_prefill_slow.json"], A, ["phase_order"]),
    ("guidellm_compare_consistent", ["guidellm_after_consistent.json", "--compare", "guidellm_healthy.json"], V, []),
    ("guidellm_compare_inconsistent", ["guidellm_after_inconsistent.json", "--compare", "guidellm_healthy.json"], A,
     ["throughput_latency_consistency"]),
]

# (format, check): evaluated by a healthy golden of that format, yet no report in that format can fail it.
# test_every_applicable_check_fails_in_its_own_format requires exactly these to stay uncovered.
CANNOT_FAIL = {
    ("evalscope", "failed_in_latency_stats"):
        "evalscope gives no per-statistic sample counts (the normaliser sets every count to the succeeded requests) and "
        "no per-request records; it computes latency over successful requests only, so the check passes by definition",
    ("guidellm", "complete_run"):
        "the goldens carry no max_requests constraint, and without one GuideLLM's request_totals.total = successful + "
        "incomplete + errored with incomplete counted as failed, so completed + failed = total always; real GuideLLM "
        "0.8.1 files name the constraint, and tests/test_peers.py fails a truncated real one on complete_run",
}


@pytest.fixture
def golden_dir(monkeypatch):
    monkeypatch.chdir(GOLDEN)
    return GOLDEN


def run_json(*argv):
    r = call("check_invariants", "-q", *argv)
    assert r.err == "", r
    return r, json.loads(r.out)


@pytest.mark.parametrize("name,argv,code,findings", CASES, ids=[c[0] for c in CASES])
def test_golden(golden_dir, name, argv, code, findings):
    r, out = run_json(*argv)
    assert r.code == code, r
    assert out["findings"] == findings
    by_id = {c["id"]: c for c in out["checks"]}
    for f in findings:  # each finding is a failed check; an anomaly exit carries anomalies only
        assert by_id[f]["status"] == "fail" and by_id[f]["severity"] == ("anomaly" if code == A else by_id[f]["severity"])
    if code == I:
        assert any(by_id[f]["severity"] == "invalid" for f in findings)
    assert out["verdict"] == {V: "valid", A: "anomaly", I: "invalid"}[code]
    assert out["valid"] is (code == V)
    assert [c["id"] for c in out["checks"]] == [cid for cid, _ in CHECKS]
    for c in out["checks"]:
        assert c["status"] in ("pass", "fail", "not_applicable")
        assert c["severity"] in (("invalid", "anomaly", "info") if c["status"] == "fail" else ("info",))
        assert c["explanation"] and isinstance(c["evidence"], dict)
    path = os.path.join(EXPECTED, f"{name}.json")
    with open(path, encoding="utf-8") as f:
        assert r.out == f.read(), f"{name}: output differs from {path} (regenerate on purpose with `make golden`)"


def test_every_check_fails_somewhere_in_the_golden_set():
    failed = {f for _, _, _, findings in CASES for f in findings}
    assert failed == {cid for cid, _ in CHECKS}


def test_every_applicable_check_fails_in_its_own_format(golden_dir):
    """Per format: every check that a healthy golden (exit 0, no finding) evaluates fails in some golden of the
    same format, apart from the CANNOT_FAIL pairs, each of which must really stay uncovered."""
    applicable: dict[str, set] = {}
    failed: dict[str, set] = {}
    for _name, argv, code, findings in CASES:
        _, out = run_json(*argv)
        fmt = out["format"]
        failed.setdefault(fmt, set()).update(c["id"] for c in out["checks"]
                                             if c["status"] == "fail" and c["severity"] in ("invalid", "anomaly"))
        if code == V and not findings:
            applicable.setdefault(fmt, set()).update(c["id"] for c in out["checks"] if c["status"] != "not_applicable")
    assert set(applicable) == {"vkit", "vllm-bench", "aisbench", "evalscope", "guidellm"}
    for fmt, checks in sorted(applicable.items()):
        uncovered = checks - failed[fmt]
        assert uncovered == {cid for f, cid in CANNOT_FAIL if f == fmt}, (fmt, sorted(uncovered))


def test_evalscope_stopped_run_is_incomplete(golden_dir):
    # 240 of the 400 planned requests (benchmark_args.json "number") ended; "Total Requests" counts the 240
    r, out = run_json("evalscope_partial/benchmark_summary.json")
    cr = {c["id"]: c for c in out["checks"]}["complete_run"]
    assert cr["status"] == "fail" and cr["severity"] == "anomaly" and cr["evidence"]["num_prompts"] == 400
    assert out["findings"] == ["complete_run"] and r.code == A


def test_healthy_report_in_every_format_has_no_finding(golden_dir):
    formats = set()
    for name, argv, _code, _findings in CASES:
        if "healthy" in name:
            _, out = run_json(*argv)
            formats.add(out["format"])
            assert all(c["severity"] == "info" for c in out["checks"]), name
    assert formats == {"vkit", "vllm-bench", "aisbench", "evalscope", "guidellm"}


# --------------------------------------------------------------------------- the seed


def test_seed_is_invalid_naming_the_identity_and_phase_is_not_meaningful(golden_dir):
    r, out = run_json("aisbench_seed.json")
    assert r.code == ExitCode.INVALID and out["verdict"] == "invalid"
    checks = {c["id"]: c for c in out["checks"]}
    idn = checks["ttft_e2el_identity"]
    assert idn["status"] == "fail" and idn["severity"] == "invalid"
    assert "TTFT ≡ E2EL" in idn["explanation"] and "9557.6 ms" in idn["explanation"] and "158.54" in idn["explanation"]
    assert idn["evidence"]["ttft_mean_ms"] == idn["evidence"]["e2el_mean_ms"] == 9557.6
    assert idn["evidence"]["statistics_equal"] == idn["evidence"]["statistics_compared"] == 7  # mean, min, max, median, p75, p90, p99
    ph = checks["phase_order"]
    assert ph["status"] == "not_applicable" and ph["severity"] == "info"
    assert ph["explanation"].startswith("not applicable — the source's definitions make it meaningless")
    assert "slow" not in ph["explanation"] and "below decode" not in ph["explanation"]
    assert ph["evidence"]["source_prefill_tok_s"] == 7.07 and ph["evidence"]["source_decode_tok_s"] == 16.78
    assert out["summary"]["completed"] == 1319 and out["summary"]["mean_input_tokens"] == 62.95


def test_seed_after_fix_is_valid_and_consistent_with_the_seed(golden_dir):
    r, out = run_json("aisbench_seed_after.json", "--compare", "aisbench_seed.json", "--closed-loop", "16")
    assert r.code == ExitCode.OK
    checks = {c["id"]: c for c in out["checks"]}
    assert checks["phase_order"]["status"] == "pass" and checks["phase_order"]["evidence"]["ratio"] > 2
    ev = checks["throughput_latency_consistency"]["evidence"]
    assert checks["throughput_latency_consistency"]["status"] == "pass"
    assert 0.05 < ev["throughput_gain"] < 0.08 and 0.05 < ev["e2el_drop"] < 0.08  # the seed's "both about 6%"


def test_seed_table_golden(golden_dir):
    r = call("check_invariants", "aisbench_seed.json", "--human")
    assert r.code == ExitCode.INVALID and r.err == ""
    assert not r.out.lstrip().startswith("{")
    path = os.path.join(EXPECTED, "aisbench_seed.table.txt")
    with open(path, encoding="utf-8") as f:
        assert r.out == f.read(), f"{path} differs (regenerate on purpose with `make golden`)"


def test_prefill_slow_with_streaming_on_is_an_anomaly_not_na(golden_dir):
    _, out = run_json("vkit_prefill_slow.json")
    ph = {c["id"]: c for c in out["checks"]}["phase_order"]
    assert ph["status"] == "fail" and ph["severity"] == "anomaly"
    assert ph["evidence"]["isolated"] is True and ph["evidence"]["ratio"] < 1
    assert "wrong, not slow" in ph["explanation"]


# --------------------------------------------------------------------------- behaviour


def test_table_on_stderr_by_default_json_on_stdout(golden_dir):
    r = call("check_invariants", "vkit_healthy.json")
    assert r.code == 0
    assert json.loads(r.out)["verdict"] == "valid"
    assert "VALID" in r.err and "littles_law" in r.err


def test_stdin_and_dash(golden_dir, monkeypatch):
    with open("aisbench_seed_after.json", encoding="utf-8") as f:
        text = f.read()
    for argv in ([], ["-"]):
        monkeypatch.setattr(sys, "stdin", io.StringIO(open("vkit_stream_off.json", encoding="utf-8").read()))
        r = call("check_invariants", "-q", *argv)
        assert r.code == ExitCode.INVALID and json.loads(r.out)["source"] == "<stdin>"
    # AISBench JSON alone on stdin: no CSV beside it, so the latency checks say so instead of guessing
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    r = call("check_invariants", "-q", "-")
    out = json.loads(r.out)
    assert r.code == 0 and any("no AISBench per-request statistics" in n for n in out["notes"])


def test_thresholds_change_the_outcome(golden_dir):
    assert call("check_invariants", "-q", "vkit_few_samples.json").code == A
    assert call("check_invariants", "-q", "vkit_few_samples.json", "--min-samples-p99", "0").code == V
    assert call("check_invariants", "-q", "vkit_few_samples.json", "--min-samples-p99", "40").code == V
    assert call("check_invariants", "-q", "vkit_errors.json", "--max-error-rate", "0.2").code == V
    assert call("check_invariants", "-q", "vkit_ttft_gap.json", "--client-server-ttft-tol-ms", "250").code == V
    assert call("check_invariants", "-q", "vkit_client_saturated.json", "--client-cpu-max", "1", "--sched-lag-max-ms", "30").code == V
    assert call("check_invariants", "-q", "vkit_healthy.json", "--min-prefill-decode-ratio", "100").code == A
    _, out = run_json("vkit_healthy.json", "--little-tol", "0.2")
    assert out["thresholds"]["little_tol"] == 0.2


def test_several_reports_give_the_worst_verdict(golden_dir):
    r, out = run_json("vkit_healthy.json", "vkit_errors.json", "vkit_stream_off.json")
    assert r.code == ExitCode.INVALID
    assert out["verdict"] == "invalid" and [x["verdict"] for x in out["reports"]] == ["valid", "anomaly", "invalid"]


def test_records_flag_and_missing_records_file(golden_dir, tmp_path):
    # --records overrides the file the summary names: healthy records show no warm-up outliers
    _, out = run_json("vkit_warmup.json", "--records", "vkit_healthy.records.jsonl")
    assert out["records"] == "vkit_healthy.records.jsonl"
    assert {c["id"]: c["status"] for c in out["checks"]}["warmup_outliers"] == "pass"
    # the summary moved away from its records: per-request checks say n/a, a note says why
    shutil.copy("vkit_warmup.json", tmp_path / "w.json")
    _, out = run_json(str(tmp_path / "w.json"))
    assert {c["id"]: c["status"] for c in out["checks"]}["warmup_outliers"] == "not_applicable"
    assert any("records file the summary names" in n for n in out["notes"])


def test_aisbench_csv_and_json_agree(golden_dir):
    a = evaluate(load_report("aisbench_seed.json"))
    b = evaluate(load_report("aisbench_seed.csv"))
    assert a["summary"] == b["summary"] and a["findings"] == b["findings"]


def test_notes_name_definition_differences(golden_dir):
    _, g = run_json("guidellm_healthy.json")
    assert any("includes the first token" in n and "vLLM's TPOT" in n for n in g["notes"])
    _, a = run_json("aisbench_healthy.json")
    assert any("output tokens / E2EL" in n for n in a["notes"])


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["no_such_file.json"], "no such file"),
        (["_make.py"], "not valid JSON"),
        (["expect_config.json"], "cannot tell the format"),
        (["--format", "guidellm", "vkit_healthy.json"], "not a GuideLLM report"),
        (["vkit_healthy.json", "vkit_errors.json", "--records", "vkit_healthy.records.jsonl"], "--records belongs to one REPORT"),
        (["--expect-config", "max_num_seqs=64", "vkit_healthy.json"], "put REPORT before --expect-config"),
        (["vkit_healthy.json", "--expect-config", "nope"], "neither"),
        (["vkit_healthy.json", "--little-tol", "-1"], "must not be negative"),
        (["vkit_healthy.json", "--closed-loop", "0"], "--closed-loop"),
        (["-", "-"], "only once"),
    ],
)
def test_usage_errors_are_one_line_exit_2(golden_dir, argv, needle):
    r = call("check_invariants", *argv)
    assert r.code == ExitCode.USAGE, r
    assert needle in r.err and r.out == ""
    assert r.err.count("\n") == 1 and r.err.startswith("check_invariants: error: ")


def test_bad_flag_value_is_usage_error(golden_dir):
    r = call("check_invariants", "--format", "csv", "vkit_healthy.json")
    assert r.code == ExitCode.USAGE and "invalid choice" in r.err and "Traceback" not in r.err


def test_empty_stdin_is_usage_error(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    r = call("check_invariants")
    assert r.code == ExitCode.USAGE and "empty" in r.err


# --------------------------------------------------------------------------- library level


def test_detect_each_format(golden_dir):
    def j(p):
        with open(p, encoding="utf-8") as f:
            return json.load(f)

    assert detect(j("vkit_healthy.json")) == "vkit"
    assert detect(j("vllm_bench_healthy.json")) == "vllm-bench"
    assert detect(j("aisbench_seed.json")) == "aisbench"
    assert detect(j("evalscope_healthy/benchmark_summary.json")) == "evalscope"
    assert detect(j("evalscope_nonstream/benchmark_summary.json")) == "evalscope"  # old key names
    assert detect(j("evalscope_healthy/benchmark_percentile.json")) == "evalscope"
    assert detect(j("guidellm_healthy.json")) == "guidellm"
    assert detect({"x": 1}) is None and detect([1, 2]) is None and detect("s") is None


def test_guidellm_tpot_is_its_itl(golden_dir):
    rep = load_report("guidellm_healthy.json")
    with open("guidellm_healthy.json", encoding="utf-8") as f:
        m = json.load(f)["benchmarks"][0]["metrics"]
    assert rep["metrics"]["tpot"]["mean"] == m["inter_token_latency_ms"]["successful"]["mean"]
    assert rep["metrics"]["itl"] is None
    assert rep["metrics"]["e2el"]["mean"] == pytest.approx(m["request_latency"]["successful"]["mean"] * 1000)


def test_identity_needs_more_than_one_output_token():
    rep = load_report(os.path.join(GOLDEN, "vllm_bench_nonstream.json"))
    rep["mean_output_tokens"] = 1.0
    out = evaluate(rep)
    c = {c["id"]: c for c in out["checks"]}
    assert c["ttft_e2el_identity"]["status"] == "not_applicable"
    assert c["decode_timing"]["status"] == "not_applicable"


def test_identity_from_records_alone():
    rep = load_report(os.path.join(GOLDEN, "vkit_healthy.json"))
    rep["metrics"]["ttft"] = None
    for r in rep["records"]:
        r["ttft_ms"] = r["e2el_ms"]
    c = {c["id"]: c for c in evaluate(rep)["checks"]}["ttft_e2el_identity"]
    assert c["status"] == "fail" and c["evidence"]["records_equal"] == c["evidence"]["records_compared"] == 200


def test_thresholds_defaults_documented_in_help():
    r = call("check_invariants", "--help")
    d = Thresholds()
    for flag, val in (("--ttft-e2el-tol", d.ttft_e2el_tol), ("--little-tol", d.little_tol), ("--max-error-rate", d.max_error_rate),
                      ("--min-samples-p99", d.min_samples_p99), ("--client-cpu-max", d.client_cpu_max)):
        assert flag in r.out and f"default {val:g}" in " ".join(r.out.split())


def test_a_real_bench_stream_summary_is_read(tmp_path):
    """Contract with vkit.measure.loadgen.summarize: its summary goes through unchanged."""
    bench = pytest.importorskip("vkit.measure.loadgen")
    from vkit.measure.client import Result
    from vkit.measure.datasets import Request

    reqs = [Request(i, prompt=[1] * 32, input_len=32, output_len=16, ignore_eos=True) for i in range(120)]
    cfg = bench.BenchConfig(url="http://x", requests=reqs, max_concurrency=4)
    results = []
    for i, q in enumerate(reqs):
        t0 = (i // 4) * 0.2
        r = Result(index=i, ok=True, status=200, start=t0, ttft=0.02, latency=0.19, done=0.1905,
                   itl=[0.0113] * 15, events=16, prompt_tokens=32, completion_tokens=16, finish_reason="length",
                   event_times=[0.02 + 0.0113 * k for k in range(16)])
        r.request = q
        results.append(r)
    s, recs = bench.summarize(cfg, "m", results, [], 0.0, 6.0, False, None, extra={})
    path = str(tmp_path / "summary.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(s, f)
    rep = load_report(path)
    out = evaluate(rep)
    assert rep["format"] == "vkit" and rep["load"] == "closed"
    assert out["verdict"] == "valid", [c for c in out["checks"] if c["status"] == "fail"]


# --------------------------------------------------------------------------- the real script in a pipe


@pytest.mark.e2e
def test_smoke_real_script_in_a_pipe():
    seed = os.path.join(GOLDEN, "aisbench_seed.json")
    healthy = os.path.join(GOLDEN, "vkit_healthy.json")
    p = subprocess.run(f"cat '{healthy}' | '{sys.executable}' bin/check_invariants", shell=True, cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["verdict"] == "valid" and "VALID" in p.stderr
    # the AISBench JSON alone through a pipe has no CSV beside it; given as a file it is read with its CSV
    p = subprocess.run(f"'{sys.executable}' bin/check_invariants -q '{seed}' | '{sys.executable}' -c "
                       "'import json,sys; d=json.load(sys.stdin); print(d[\"verdict\"], *d[\"findings\"])'",
                       shell=True, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.split() == ["invalid", "ttft_e2el_identity", "decode_timing"], p.stderr
    p = subprocess.run([sys.executable, "bin/check_invariants", "-q", seed], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == ExitCode.INVALID


def _wave_records(first_starts: list[float], first_ttft_ms: float, rest_ttft_ms: float, n_rest: int = 60) -> dict:
    recs = [{"ok": True, "warmup": False, "start_s": s, "ttft_ms": first_ttft_ms} for s in first_starts]
    t = 1.0
    for _ in range(n_rest):
        recs.append({"ok": True, "warmup": False, "start_s": t, "ttft_ms": rest_ttft_ms})
        t += 0.05
    return {"records": recs, "max_concurrency": len(first_starts), "warmups": 0}


def test_warmup_outliers_allow_a_start_burst_up_to_its_size():
    """Real vLLM, 8 streams: the 8 requests that start together are prefilled together (first wave
    80 ms vs 24 ms for the rest, 3.3x); that is the closed loop's own start, not warm-up. The same
    ratio for requests that arrived one after another (each after the previous first token) is."""
    from vkit.validate.invariants import Thresholds, check_warmup_outliers

    th = Thresholds()
    burst = check_warmup_outliers(_wave_records([0.001 * k for k in range(8)], 80.0, 24.0), th, {})
    assert burst["status"] == "pass" and burst["evidence"]["start_burst"] == 8 and burst["evidence"]["max_ratio"] == 8
    assert "start burst" in burst["explanation"]
    staggered = check_warmup_outliers(_wave_records([0.1 * k for k in range(8)], 80.0, 24.0), th, {})
    assert staggered["status"] == "fail" and staggered["evidence"]["start_burst"] == 1
    assert staggered["evidence"]["max_ratio"] == th.warmup_outlier_ratio
    cold = check_warmup_outliers(_wave_records([0.001 * k for k in range(8)], 24.0 * 9, 24.0), th, {})
    assert cold["status"] == "fail"  # 9x: more than 8 prompts prefilled together can explain
