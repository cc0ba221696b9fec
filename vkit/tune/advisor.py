"""The advisor's calls: an OpenAI-compatible model asked for a next proposal or an explanation,
every call logged, and the replay of a decision log without the model.

``sweep --advisor URL`` wraps the Bayesian search's proposer (:func:`advised_proposer`): every
``every``-th proposal is asked of the advisor first. The prompt and the parse of the answer are
``vkit.search.advisor``'s; an accepted answer is a proposal like any other (new trial, apply,
verify, gate, keep or revert, the policy checked again at the restart); a refused or failed call
falls back to the search's own proposal. Each call is one ``advisor_call`` event in the decision
log: the prompt, its sha256 and the inputs it was built from, the model id and the server's
version, temperature 0 and the seed, the latency, the raw answer (cut at ``max_answer_chars``,
with the sha256 of the whole answer) and the outcome (the parsed proposal, or the refusal or
failure and why). The API key, when one is given, is read from the environment and never logged.

:func:`replay` re-derives a decision log's proposals — the Bayesian ones from their logged
inputs, the advisor's from the logged prompt inputs and answers — and calls no model.
"""

from __future__ import annotations

import hashlib
import os
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable

import requests

from vkit import search
from vkit.errors import Unavailable, UsageError, VkitError
from vkit.measure.client import error_message
from vkit.measure.serverapi import Server
from vkit.search import advisor as advice
from vkit.state import StateFile
from vkit.tune import steps as tuning
from vkit.tune.context import Tune
from vkit.tune.ledger import Ledger

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def _quiet(msg: str) -> None:
    pass


@dataclass
class AdvisorSettings:
    """Where the advisor is and how it is asked (sweep's --advisor flags)."""

    url: str
    model: str | None = None  # None: the first model of GET /v1/models
    key_env: str | None = None  # the environment variable holding the API key (the key itself is never kept)
    seed: int = 1
    every: int = 2  # every N-th proposal is asked of the advisor; 0: explanations only
    timeout_s: float = 60.0
    max_tokens: int = 256
    max_answer_chars: int = 4000

    def describe(self) -> dict:
        return {"url": public_url(self.url), "model": self.model, "key_env": self.key_env, "seed": self.seed,
                "every": self.every, "timeout_s": self.timeout_s, "max_tokens": self.max_tokens,
                "max_answer_chars": self.max_answer_chars}


def public_url(url: str) -> str:
    """``url`` without any user or password in it."""
    u = urllib.parse.urlsplit(url)
    host = u.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{u.port}" if u.port else "")
    return urllib.parse.urlunsplit((u.scheme, netloc, u.path, u.query, ""))


class Advisor:
    """One advisor endpoint. ``log(event, **fields)`` appends to the decision log and returns the
    event's id; ``warn`` says what went wrong with a call (the search goes on without it)."""

    def __init__(self, settings: AdvisorSettings, log: Callable[..., str], warn: Callable[[str], None] = _quiet):
        if not settings.url.startswith(("http://", "https://")):
            raise UsageError(f"--advisor {public_url(settings.url)}: give the endpoint's base URL, e.g. http://127.0.0.1:8000")
        key = None
        if settings.key_env:
            key = os.environ.get(settings.key_env)
            if not key:
                raise UsageError(f"--advisor-key-env {settings.key_env}: the variable is not set or empty")
        self.s = settings
        self.log = log
        self.warn = warn
        self.server = Server(settings.url, api_key=key, timeout=settings.timeout_s)
        self.ident: dict | None = None
        self.calls: list[dict] = []  # this advisor's calls so far: id, kind, outcome, and the proposal or the reason

    # -- the endpoint ------------------------------------------------------------------------------
    def identify(self) -> dict:
        """The model asked (--advisor-model, else the first of /v1/models) and the server's version."""
        if self.ident is None:
            model = self.s.model
            if model is None:
                ms = self.server.models()
                if not ms or not ms[0].get("id"):
                    raise Unavailable(f"{public_url(self.s.url)}/v1/models lists no model; name one with --advisor-model")
                model = str(ms[0]["id"])
            v = self.server.version() or {}
            self.ident = {"model": model, "model_version": v.get("version") if isinstance(v, dict) else None}
        return self.ident

    def _post(self, path: str, body: dict) -> requests.Response:
        try:
            return self.server.session.post(self.server.url + path, json=body, timeout=self.s.timeout_s)
        except requests.Timeout:
            raise Unavailable(f"the advisor did not answer {path} within {self.s.timeout_s:g} s") from None
        except requests.RequestException as e:
            raise Unavailable(f"cannot reach the advisor at {public_url(self.s.url)}: {' '.join(str(e).split())[:200]}") from None

    def complete(self, messages: list[dict]) -> dict:
        """One answer at temperature 0 with the seed: chat completions, or plain completions when the
        server refuses chat (4xx: no chat template, no such route). Raises ``Unavailable``."""
        model = self.identify()["model"]
        params = {"model": model, "temperature": 0, "seed": self.s.seed, "max_tokens": self.s.max_tokens}
        attempts = []
        for path, body in ((CHAT, dict(params, messages=messages)),
                           (COMPLETIONS, dict(params, prompt=advice.completion_prompt(messages)))):
            t0 = time.monotonic()
            r = self._post(path, body)
            ms = (time.monotonic() - t0) * 1000.0
            if r.status_code == 200:
                try:
                    doc = r.json()
                    ch = doc["choices"][0]
                    text = (ch.get("message") or {}).get("content") if path == CHAT else ch.get("text")
                except (ValueError, KeyError, IndexError, TypeError, AttributeError):
                    raise Unavailable(f"the advisor's {path} answer has no choices[0] text") from None
                return {"endpoint": path, "text": text or "", "latency_ms": round(ms, 1), "attempts": attempts,
                        "finish_reason": ch.get("finish_reason"), "response_model": doc.get("model"),
                        "system_fingerprint": doc.get("system_fingerprint"), "usage": doc.get("usage")}
            attempts.append({"endpoint": path, "status": r.status_code, "error": error_message(r.content)[:300],
                             "latency_ms": round(ms, 1)})
            if path == COMPLETIONS or not 400 <= r.status_code < 500:
                break
        last = attempts[-1]
        raise Unavailable(f"the advisor answered {last['endpoint']} with HTTP {last['status']}: {last['error']}")

    # -- a logged call -----------------------------------------------------------------------------
    def ask(self, kind: str, messages: list[dict], inputs: dict, parse: Callable[[str, dict], dict] | None = None,
            **context: Any) -> dict:
        """One call, logged as an ``advisor_call`` event whatever happens; returns the event (with its
        ``id``). ``parse(answer, inputs)`` gives the outcome of a proposal; an explanation is ``answered``."""
        rec: dict = {"kind": kind, **context, "advisor": self.s.describe(), "temperature": 0, "seed": self.s.seed,
                     "max_tokens": self.s.max_tokens, "prompt_version": advice.PROMPT_VERSION,
                     "prompt_sha256": advice.prompt_sha256(messages), "prompt": messages, "inputs": inputs}
        t0 = time.monotonic()
        try:
            rec.update(self.identify())
            got = self.complete(messages)
        except VkitError as e:
            rec.update(outcome="failed", reason=f"failed: {e}", total_ms=round((time.monotonic() - t0) * 1000.0, 1))
            self.warn(f"advisor: {kind} call failed, going on without it: {e}")
            return self._logged(rec)
        full = got.pop("text")
        answer = full[: self.s.max_answer_chars]  # what is kept is what is parsed: the replay parses the same text
        rec.update(got, total_ms=round((time.monotonic() - t0) * 1000.0, 1), answer=answer,
                   answer_sha256=hashlib.sha256(full.encode("utf-8")).hexdigest(), answer_chars=len(full),
                   answer_truncated=len(full) > len(answer),
                   answer_parsed_sha256=hashlib.sha256(answer.encode("utf-8")).hexdigest())
        rec.update(parse(answer, inputs) if parse is not None else {"outcome": "answered"})
        return self._logged(rec)

    def _logged(self, rec: dict) -> dict:
        rec["id"] = self.log("advisor_call", **rec)
        self.calls.append({k: rec[k] for k in ("id", "kind", "outcome", "config", "reason", "latency_ms") if k in rec})
        return rec


# -- the search's proposals -------------------------------------------------------------------------
def proposal_inputs(runner: Tune, hist: list[search.Observation]) -> dict:
    """What the advisor is shown: the Bayesian search's space with the policy's bounds, the kept
    configuration and its baseline, every measured trial, the objectives, the SLO, the fixed premises."""
    st = runner.ledger.tune()
    frozen = st.frozen
    space = tuning.bo_space(runner, runner.policy)
    base = dict(st.kept_config)
    kept_metrics = st.record("baseline").get("metrics") or {}
    return advice.proposal_inputs(space, hist, base, kept_metrics, tuning.objectives(runner), tuning.search_slo(runner),
                                  advice.rules_from_policy(runner.policy, frozen))


def ask_proposal(runner: Tune, advisor: Advisor, hist: list[search.Observation], step: str) -> search.Proposal | None:
    """The advisor's proposal for ``step``, or None (refused or failed: both logged with the reason)."""
    inputs = proposal_inputs(runner, hist)
    rec = advisor.ask("propose", advice.proposal_messages(inputs), inputs, advice.parse_proposal, step=step,
                      proposal_index=len([h for h in hist if h.step == step]) + 1)
    if rec["outcome"] != "accepted":
        if rec["outcome"] == "refused":
            runner.progress(f"advisor ({rec.get('model')}): answer refused, the search proposes instead: {rec['reason']}")
        return None
    why = rec.get("rationale") or "proposed by the advisor"
    runner.progress(f"advisor ({rec['model']}) proposes {rec['values']}" + (f" ({'; '.join(rec['notes'])})" if rec["notes"] else ""))
    return search.Proposal(config=dict(rec["config"]), step=step, reason=f"advisor {rec['model']}: {why}"[:300],
                           audit={"source": "advisor", "advisor_call": rec["id"], "prompt_sha256": rec["prompt_sha256"],
                                  "model": rec["model"], "model_version": rec.get("model_version"), "seed": rec["seed"],
                                  "temperature": 0, "notes": rec["notes"]})


def advised_proposer(advisor: Advisor, step: str = "bo") -> Callable[[Tune, Callable], Callable]:
    """A wrapper for a step's proposer: every ``every``-th proposal of ``step`` is asked of the
    advisor first; when it is refused or fails, the wrapped proposer proposes."""
    every = advisor.s.every

    def wrap(runner: Tune, nxt: Callable[[list], Any]) -> Callable[[list], Any]:
        def propose(hist: list[search.Observation]) -> Any:
            n = len([h for h in hist if h.step == step]) + 1  # the proposal about to be made
            if every > 0 and n % every == 0:
                prop = ask_proposal(runner, advisor, hist, step)
                if prop is not None:
                    return prop
            return nxt(hist)
        return propose

    return wrap


def explain_step(sf: StateFile, slo: dict, advisor: Advisor, rec: dict) -> dict:
    """Ask the advisor to explain a finished step (its record and trials); logged. The text is
    advice for the engineer: no decision depends on it."""
    st = Ledger(sf).tune()
    shown = set(slo) | {o.name for o in tuning.OBJECTIVES + tuning.CAPACITY_OBJECTIVES}  # a small model's context is short

    def metrics(m: dict | None) -> dict:
        return {k: v for k, v in (m or {}).items() if k in shown}

    trials = [{"id": t["id"], "config": t["config"], "status": t["status"], "metrics": metrics(t.get("metrics")),
               "verdict": t.get("verdict"), "why": t.get("why")} for t in st.trials() if t["step"] == rec.get("step")]
    finding = {"step": {k: rec.get(k) for k in ("step", "name", "stop_rule", "result", "confirmed")},
               "kept": st.kept_config, "baseline": metrics(st.record("baseline").get("metrics")), "trials": trials,
               "slo": slo}
    out = advisor.ask("explain", advice.explain_messages(finding), search.jsonable(finding), step=rec.get("step"))
    return {"call": out["id"], "outcome": out["outcome"], "text": out.get("answer"), "reason": out.get("reason"),
            "model": out.get("model"), "note": "advice only: no decision depends on it"}


def advise_once(runner: Tune, advisor: Advisor) -> dict:
    """``sweep --advise``: the advisor's next proposal from the trials so far, logged; nothing is run."""
    prop = ask_proposal(runner, advisor, tuning.observations(runner), "bo")
    return {"proposal": prop.to_dict() if prop is not None else None, "call": advisor.calls[-1],
            "note": "nothing was run: a proposal is measured only by a sweep, through the gate"}


def summary(sf: StateFile, advisor: Advisor, rec: dict, slo: dict) -> dict:
    """What the advisor did in a sweep: its calls (each in the decision log) and its explanation of the result."""
    calls = list(advisor.calls)
    return {"calls": calls, "accepted": sum(1 for c in calls if c["outcome"] == "accepted"),
            "refused": sum(1 for c in calls if c["outcome"] == "refused"),
            "failed": sum(1 for c in calls if c["outcome"] == "failed"),
            "explanation": explain_step(sf, slo, advisor, rec)}


# -- replay -----------------------------------------------------------------------------------------
def holds_advice(records: list[dict]) -> bool:
    return any(r.get("event") == "advisor_call" for r in records)


def replay(records: list[dict]) -> dict:
    """A decision log's proposals re-derived without calling any model: the Bayesian ones from their
    logged inputs (``search.replay_mismatches``), the advisor's calls from their logged inputs and
    answers (``search.advisor.call_mismatch``), and the sequence of proposals the run made, in order."""
    bo = [r["audit"]["replay"] for r in records if r.get("event") == "propose" and (r.get("audit") or {}).get("replay")]
    bo_bad = search.replay_mismatches(bo) if bo else []
    calls = [r for r in records if r.get("event") == "advisor_call"]
    if not bo and not calls:
        raise UsageError("the log holds no replayable proposals (Bayesian-search proposals and advisor calls carry their inputs)")
    replayed = {r["id"]: advice.replay_call(r) for r in calls}
    call_bad = []
    for n, r in enumerate(calls):
        diff = advice.call_mismatch(r)
        if diff:
            call_bad.append({"call": r["id"], "record": n, **diff})
    bo_by_record = {d["record"]: d for d in bo_bad}
    seq, k, seq_bad = [], 0, 0
    for r in records:
        audit = r.get("audit") or {}
        if r.get("event") != "propose" or not (audit.get("replay") or audit.get("source") == "advisor"):
            continue
        if audit.get("source") == "advisor":
            got = replayed.get(audit.get("advisor_call")) or {}
            again = got.get("config") if got.get("outcome") == "accepted" else None
            src = "advisor"
        else:
            d = bo_by_record.get(k)
            again = ((d.get("replayed") or {}).get("config") if d else r["config"])
            k += 1
            src = "bo"
        same = again is not None and search.jsonable(again) == search.jsonable(r.get("config"))
        seq_bad += not same
        seq.append({"trial": r.get("trial"), "source": src, "config": r.get("config"), "replayed": again, "identical": same})
    outcomes = [{"call": r["id"], "kind": r.get("kind"), "outcome": replayed[r["id"]].get("outcome", r.get("outcome")),
                 "config": replayed[r["id"]].get("config"), "reason": replayed[r["id"]].get("reason", r.get("reason"))}
                for r in calls]
    return {"proposals": len(bo), "identical": len(bo) - len(bo_bad), "differences": bo_bad,
            "advisor": {"calls": len(calls), "identical": len(calls) - len(call_bad), "differences": call_bad,
                        "outcomes": outcomes, "model_called": False,
                        "note": "re-derived from the logged prompt inputs and answers; no model was called"},
            "sequence": seq, "sequence_identical": len(seq) - seq_bad}


def replay_ok(rep: dict) -> bool:
    return not rep["differences"] and not rep["advisor"]["differences"] and rep["sequence_identical"] == len(rep["sequence"])
