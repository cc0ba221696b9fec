"""The advisor: an OpenAI-compatible model asked for proposals and explanations. Its answers are
parsed against the search space and the policy (accepted, or refused with the reason), every
call is in the decision log, and `sweep --replay` re-derives the proposals without the model.
Against a scripted endpoint on a thread, the simulator and (tests/test_vllm_real.py) real vLLM."""

from __future__ import annotations

import hashlib
import json
import os
from http.server import BaseHTTPRequestHandler

import pytest
import requests

from tests import test_tune
from tests.conftest import call
from tests.fake_server import LoopbackServer
from tests.sim_helpers import free_port
from tests.test_tune import FAST, init
from vkit import search
from vkit.apply.policy import Policy
from vkit.search import advisor as advice
from vkit.state import DecisionLog
from vkit.tune import advisor

svc = test_tune.svc  # the simulated service fixture, shared with tune's own tests

OBJ = [search.Objective("output_throughput", "max"), search.Objective("p95_ttft_ms", "min")]
BASE = {"max_num_batched_tokens": 2048, "max_num_seqs": 4, "max_model_len": 4096}
VALID = 'Here it is:\n```json\n{"max_num_batched_tokens": 8192, "max_num_seqs": 100}\n```'
NONSENSE = "the the of cache cache prefill tokens"
FORBIDDEN = '{"quantization": "fp8", "max_num_seqs": 64}'


def inputs(history=()):
    policy = Policy.load()
    space = search.space_from_policy(policy, ["max_num_batched_tokens", "max_num_seqs"], frozen={"max_model_len": 4096})
    return advice.proposal_inputs(space, list(history), BASE, {"output_throughput": 900.0, "p95_ttft_ms": 210.0}, OBJ,
                                  {"p95_ttft_ms": 5000}, advice.rules_from_policy(policy, {"max_model_len": 4096}))


MEASURED = search.Observation(config={"max_num_batched_tokens": 4096, "max_num_seqs": 8, "max_model_len": 4096},
                              objectives={"output_throughput": 1500.0, "p95_ttft_ms": 300.0}, slo_ok=True, step="bo",
                              trial_id="t-001")


# -- the parse: one outcome per answer ----------------------------------------------------------------
@pytest.mark.unit
@pytest.mark.parametrize("answer, outcome", [
    (VALID, {"max_num_batched_tokens": 8192, "max_num_seqs": 96}),  # 100 moves to the lattice value 96
    ('{"config": {"max_num_seqs": 32}, "reason": "more batching"}', {"max_num_batched_tokens": 2048, "max_num_seqs": 32}),
    (NONSENSE, "unparsable: no JSON object in the answer"),
    ("{max_num_seqs: 8}", "unparsable: the first '{' (character 0) starts no valid JSON: Expecting property name enclosed "
                          "in double quotes at character 1"),
    ("{}", "unparsable: the object sets no parameter of the search space"),
    (FORBIDDEN, "forbidden: parameter quantization is forbidden to change (rule F3: fixed premise: changes accuracy, not only speed)"),
    ('{"max_model_len": 8192}', "forbidden: parameter max_model_len is frozen at 4096 (rule F11: a business decision; frozen "
                                "once step 1 picked it, every later result depends on it)"),
    ('{"max_num_seqs": 100000}', "out of bounds: max_num_seqs=100000 is outside [1, 4096]"),
    ('{"max_num_seqs": "lots"}', 'invalid value: max_num_seqs="lots" is not a number'),
    ('{"block_size": 32}', "not in the search space: parameter block_size (the space: max_num_batched_tokens, max_num_seqs)"),
    ('{"max_num_seqs": 8, "max_num_batched_tokens": 4096}',
     'already evaluated: {"max_num_batched_tokens": 4096, "max_num_seqs": 8} was measured (or is the kept configuration)'),
    ('{"max_num_seqs": 4}', 'already evaluated: {"max_num_batched_tokens": 2048, "max_num_seqs": 4} was measured (or is the '
                            'kept configuration)'),
])
def test_an_answer_is_a_proposal_or_a_refusal_with_its_reason(answer, outcome):
    got = advice.parse_proposal(answer, inputs([MEASURED]))
    if isinstance(outcome, dict):
        assert got["outcome"] == "accepted" and got["config"] == dict(BASE, **outcome), got
    else:
        assert got == {"outcome": "refused", "reason": outcome}


@pytest.mark.unit
def test_the_prompt_shows_the_policy_and_the_measurements_and_is_deterministic():
    inp = inputs([MEASURED])
    msgs = advice.proposal_messages(inp)
    text = msgs[1]["content"]
    assert "- max_num_seqs: int, 1 to 4096" in text and "- max_num_batched_tokens: int, 256 to 131072" in text
    assert "quantization" in text and "max_model_len (frozen at 4096)" in text
    assert '1. {"max_num_batched_tokens": 4096, "max_num_seqs": 8} -> output_throughput 1500, p95_ttft_ms 300; meets the SLO' in text
    again = advice.proposal_messages(json.loads(json.dumps(inp)))  # as read back from the log
    assert advice.prompt_sha256(again) == advice.prompt_sha256(msgs)
    assert advice.prompt_sha256(advice.proposal_messages(inputs())) != advice.prompt_sha256(msgs)


# -- a scripted OpenAI-compatible endpoint ----------------------------------------------------------
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _send(self, code: int, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "fake-advisor", "object": "model"}]})
        elif self.path == "/version":
            self._send(200, {"version": "9.9.9"})
        else:
            self._send(404, {"detail": "Not Found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        srv = self.server
        srv.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
        if self.path == "/v1/chat/completions" and srv.no_chat:
            self._send(400, {"error": {"message": "this model has no chat template", "type": "BadRequestError", "code": 400}})
            return
        text = srv.answers.pop(0) if srv.answers else "no more answers"
        if self.path == "/v1/chat/completions":
            self._send(200, {"id": "c1", "object": "chat.completion", "model": "fake-advisor", "system_fingerprint": "fp-1",
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})
        else:
            self._send(200, {"id": "c1", "object": "text_completion", "model": "fake-advisor",
                             "choices": [{"index": 0, "text": text, "finish_reason": "stop"}]})


class FakeAdvisor(LoopbackServer):
    def __init__(self, answers: list[str], no_chat: bool = False):
        super().__init__(("127.0.0.1", 0), Handler)
        self.answers, self.no_chat, self.requests = list(answers), no_chat, []


def _ask(adv: advisor.Advisor, inp: dict) -> dict:
    return adv.ask("propose", advice.proposal_messages(inp), inp, advice.parse_proposal, step="bo")


def _no_http(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("an HTTP request was made")
    monkeypatch.setattr(requests.Session, "request", refuse)


def test_three_answers_accepted_unparsable_forbidden_each_logged(tmp_path, monkeypatch):
    monkeypatch.setenv("ADVISOR_KEY", "s3cret-key-value")
    log = DecisionLog(str(tmp_path / "decisions.jsonl"))
    inp = inputs([MEASURED])
    with FakeAdvisor([VALID, NONSENSE, FORBIDDEN]) as srv:
        adv = advisor.Advisor(advisor.AdvisorSettings(url=srv.url, key_env="ADVISOR_KEY", seed=7, max_tokens=64),
                              log=lambda event, **kw: log.append("sweep", event, **kw))
        got = [_ask(adv, inp) for _ in range(3)]
    assert [g["outcome"] for g in got] == ["accepted", "refused", "refused"]
    assert got[0]["config"] == dict(BASE, max_num_batched_tokens=8192, max_num_seqs=96)
    assert got[0]["notes"] == ["max_num_seqs 100 moved to the lattice value 96"]
    assert got[1]["reason"] == "unparsable: no JSON object in the answer"
    assert got[2]["reason"].startswith("forbidden: parameter quantization is forbidden to change (rule F3")
    # what the endpoint was asked: temperature 0, the seed, bounded tokens, the key as a bearer token
    assert [r["path"] for r in srv.requests] == ["/v1/chat/completions"] * 3
    assert all(r["body"]["temperature"] == 0 and r["body"]["seed"] == 7 and r["body"]["max_tokens"] == 64
               and r["body"]["model"] == "fake-advisor" and r["auth"] == "Bearer s3cret-key-value" for r in srv.requests)
    text = open(log.path).read()
    assert "s3cret-key-value" not in text  # the key is never logged
    recs = [r for r in log.read() if r["event"] == "advisor_call"]
    assert [r["id"] for r in recs] == [g["id"] for g in got]
    for r, answer in zip(recs, [VALID, NONSENSE, FORBIDDEN], strict=True):
        assert r["prompt_sha256"] == advice.prompt_sha256(r["prompt"]) == advice.prompt_sha256(advice.proposal_messages(inp))
        assert r["model"] == "fake-advisor" and r["model_version"] == "9.9.9" and r["system_fingerprint"] == "fp-1"
        assert r["temperature"] == 0 and r["seed"] == 7 and r["endpoint"] == "/v1/chat/completions"
        assert r["latency_ms"] > 0 and r["answer"] == answer
        assert r["answer_sha256"] == hashlib.sha256(answer.encode()).hexdigest() and not r["answer_truncated"]
        assert r["advisor"]["key_env"] == "ADVISOR_KEY"
    assert recs[1]["reason"] == "unparsable: no JSON object in the answer"
    # replayed from the log alone: the same outcomes, no request made
    _no_http(monkeypatch)
    rep = advisor.replay(log.read())
    assert advisor.replay_ok(rep) and rep["advisor"]["calls"] == 3 and rep["advisor"]["model_called"] is False
    assert [o["outcome"] for o in rep["advisor"]["outcomes"]] == ["accepted", "refused", "refused"]


def test_a_refused_chat_falls_back_to_completions_and_a_long_answer_is_cut(tmp_path):
    log = DecisionLog(str(tmp_path / "decisions.jsonl"))
    long = '{"max_num_seqs": 32}' + " and so on" * 100
    with FakeAdvisor([long], no_chat=True) as srv:
        adv = advisor.Advisor(advisor.AdvisorSettings(url=srv.url, max_answer_chars=50),
                              log=lambda event, **kw: log.append("sweep", event, **kw))
        r = _ask(adv, inputs())
    assert [q["path"] for q in srv.requests] == ["/v1/chat/completions", "/v1/completions"]
    assert srv.requests[1]["body"]["prompt"].endswith("JSON: ") and srv.requests[1]["body"]["temperature"] == 0
    assert r["endpoint"] == "/v1/completions" and r["attempts"][0]["status"] == 400
    assert r["attempts"][0]["error"] == "this model has no chat template"
    assert r["answer"] == long[:50] and r["answer_truncated"] and r["answer_chars"] == len(long)
    assert r["answer_sha256"] == hashlib.sha256(long.encode()).hexdigest()
    assert r["outcome"] == "accepted" and r["config"]["max_num_seqs"] == 32


def test_an_unreachable_advisor_is_logged_and_the_search_goes_on(tmp_path):
    log = DecisionLog(str(tmp_path / "decisions.jsonl"))
    warned = []
    adv = advisor.Advisor(advisor.AdvisorSettings(url=f"http://127.0.0.1:{free_port()}", timeout_s=2),
                          log=lambda event, **kw: log.append("sweep", event, **kw), warn=warned.append)
    r = _ask(adv, inputs())
    assert r["outcome"] == "failed" and r["reason"].startswith("failed: cannot reach the server at http://127.0.0.1:")
    assert warned and "going on without it" in warned[0]
    assert log.read()[0]["outcome"] == "failed" and "answer" not in log.read()[0]


def test_a_tampered_log_does_not_replay(tmp_path, monkeypatch):
    log = DecisionLog(str(tmp_path / "decisions.jsonl"))
    with FakeAdvisor([VALID]) as srv:
        adv = advisor.Advisor(advisor.AdvisorSettings(url=srv.url), log=lambda event, **kw: log.append("sweep", event, **kw))
        _ask(adv, inputs())
    _no_http(monkeypatch)
    rec = log.read()[0]
    assert advisor.replay_ok(advisor.replay([rec]))
    other = dict(rec, answer='{"max_num_seqs": 16}', answer_parsed_sha256=hashlib.sha256(b'{"max_num_seqs": 16}').hexdigest())
    rep = advisor.replay([other])
    assert not advisor.replay_ok(rep) and set(rep["advisor"]["differences"][0]) >= {"config"}
    moved = dict(rec, inputs=dict(rec["inputs"], slo={"p95_ttft_ms": 1}))  # not the prompt that was sent
    assert "prompt_sha256" in advisor.replay([moved])["advisor"]["differences"][0]


@pytest.mark.unit
def test_sweep_flags_are_checked():
    r = call("sweep", "--step", "2", "--sandbox", "--advisor", "http://127.0.0.1:1")
    assert r.code == 2 and "--advisor joins the Bayesian search" in r.err
    r = call("sweep", "--replay", "x.jsonl", "--advisor", "http://127.0.0.1:1")
    assert r.code == 2 and "--replay never calls the advisor" in r.err
    r = call("sweep", "--advise")
    assert r.code == 2 and "give --advisor URL" in r.err


# -- end to end: a sweep on the simulator -------------------------------------------------------------
@pytest.mark.e2e
def test_sweep_with_an_advisor_on_the_simulator_and_its_replay(svc, monkeypatch):
    """Three proposals asked of the advisor: a valid one (measured, gated like any other), an unparsable
    and a forbidden one (refused with the reason; the Bayesian search proposes instead). Then the
    served simulator itself as the advisor, and the replay of the log with no model reachable."""
    init(svc, "max_num_seqs=4", "max_num_batched_tokens=2048")
    explanation = "max_num_seqs 4 queued 16 streams; 16 running sequences removed the queue."
    with FakeAdvisor([VALID, NONSENSE, FORBIDDEN, explanation]) as srv:
        r = call("sweep", "--mode", "bo", "--budget", "3", *FAST, "--advisor", srv.url, "--advisor-every", "1")
    assert r.code == 0, r.err[-3000:]
    out = json.loads(r.out)
    st = svc["sf"].read()
    bo = [t for t in st["trials"] if t["step"] == "bo"]
    assert len(bo) == 3
    first = bo[0]
    assert first["config"] == {"max_num_batched_tokens": 8192, "max_num_seqs": 96}
    assert first["proposal"]["source"] == "advisor" and first["proposal"]["model"] == "fake-advisor"
    assert first["status"] in ("done", "eliminated") and first.get("verdict")  # measured and screened like any trial
    assert all(t["proposal"].get("replay") for t in bo[1:])  # the refused answers: the search's own proposals
    adv = out["advisor"]
    assert [c["outcome"] for c in adv["calls"]] == ["accepted", "refused", "refused"]
    assert adv["calls"][1]["reason"] == "unparsable: no JSON object in the answer"
    assert adv["calls"][2]["reason"].startswith("forbidden: parameter quantization")
    assert adv["explanation"]["text"] == explanation and adv["explanation"]["outcome"] == "answered"
    log = os.path.join(os.path.dirname(svc["state"]), "decisions.jsonl")
    calls = [x for x in DecisionLog(log).read() if x["event"] == "advisor_call"]
    assert [c["kind"] for c in calls] == ["propose"] * 3 + ["explain"]
    assert first["proposal"]["advisor_call"] == calls[0]["id"]
    proposed = [x for x in DecisionLog(log).read() if x["event"] == "propose"]
    assert proposed[0]["trial"] == first["id"] and proposed[0]["reason"].startswith("advisor fake-advisor: ")

    # the served model itself as the advisor (the air-gapped case): the simulator's text is no proposal
    url = st["service"]["url"]
    r = call("sweep", "--advise", *FAST, "--advisor", url)
    assert r.code == 0, r.err[-2000:]
    once = json.loads(r.out)
    assert once["proposal"] is None and once["call"]["outcome"] == "refused"
    assert once["call"]["reason"].startswith("unparsable: "), once
    sim = [x for x in DecisionLog(log).read() if x["event"] == "advisor_call"][-1]
    assert sim["model"] == "sim-8b" and sim["model_version"] == "0.32.0+sim" and sim["answer"]

    # replay: no model is called (the fake endpoint is gone, and any request fails the test)
    _no_http(monkeypatch)
    r = call("sweep", "--replay", os.path.dirname(svc["state"]))
    assert r.code == 0, r
    rep = json.loads(r.out)
    assert rep["advisor"]["calls"] == 5 and rep["advisor"]["identical"] == 5 and rep["advisor"]["model_called"] is False
    assert [(s["trial"], s["source"], s["config"]) for s in rep["sequence"]] == [(t["id"], "advisor" if t is first else "bo", t["config"])
                                                                                 for t in bo]
    assert all(s["identical"] for s in rep["sequence"]) and rep["proposals"] == 2 and rep["identical"] == 2
    # a log whose answer was edited no longer replays
    lines = open(log).read().splitlines()
    edited = []
    for ln in lines:
        d = json.loads(ln)
        if d.get("id") == calls[0]["id"]:
            d["answer"] = '{"max_num_batched_tokens": 4096, "max_num_seqs": 32}'
            d["answer_parsed_sha256"] = hashlib.sha256(d["answer"].encode()).hexdigest()
        edited.append(json.dumps(d))
    bad = svc["dir"] / "edited.jsonl"
    bad.write_text("\n".join(edited) + "\n")
    r = call("sweep", "--replay", str(bad))
    assert r.code == 1, r
    rep = json.loads(r.out)
    assert [s["identical"] for s in rep["sequence"]] == [False, True, True]




@pytest.mark.e2e
def test_tune_takes_the_advisor_in_its_bayesian_search(svc):
    """tune --mode bo --advisor: the advisor's valid answer is the search's first trial, measured and
    gated like any other; the staged steps refuse the flag. On the virtual backend (the advisor is a
    live HTTP endpoint still): what the search makes of an answer needs no server process; the sweep
    above asks the live simulator itself."""
    init(svc, "max_num_seqs=4", "max_num_batched_tokens=2048")
    r = call("tune", *FAST, "--steps", "2", "--advisor", "http://127.0.0.1:9")
    assert r.code == 2 and "--mode bo" in r.err
    with FakeAdvisor([VALID, NONSENSE]) as srv:
        r = call("tune", *FAST, "--virtual", "--steps", "2", "--mode", "bo", "--budget", "2", "--json", "--advisor", srv.url,
                 "--advisor-every", "1", "--report-dir", str(svc["dir"] / "rep"))
    assert r.code == 0, r.err[-3000:]
    bo = [t for t in svc["sf"].read()["trials"] if t["step"] == "bo"]
    assert len(bo) == 2 and bo[0]["config"]["max_num_batched_tokens"] == 8192 and bo[0]["config"]["max_num_seqs"] == 96
    assert bo[0]["proposal"]["source"] == "advisor" and bo[0].get("verdict")
    assert bo[1]["proposal"].get("replay")  # the unparsable answer: the search's own proposal took its place
    log = os.path.join(os.path.dirname(svc["state"]), "decisions.jsonl")
    calls = [x for x in DecisionLog(log).read() if x["event"] == "advisor_call"]
    assert [c["outcome"] for c in calls] == ["accepted", "refused"] and calls[0]["tool"] == "tune"
