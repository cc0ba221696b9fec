"""The advisor's pure half: the prompt it is asked, and what its answer is allowed to propose.

An advisor is any OpenAI-compatible model (``sweep --advisor URL``; on an air-gapped box
usually the served model itself) asked for the next configuration to measure, or for an
explanation of a finding. Its answer is only a proposal: it is parsed here against the search
space and the parameter policy's fixed premises, then runs through the same trial, gate and
rollback as every other proposal. The HTTP call and the decision log are the runner's
(``vkit.tune.advisor``); everything here is a function of its inputs, so a logged call can be
replayed without the model: :func:`replay_call` rebuilds the prompt from the logged inputs
(its sha256 must match) and parses the logged answer again (the outcome must match).

Refusal reasons start with their kind: ``unparsable:``, ``forbidden:``, ``not in the search
space:``, ``out of bounds:``, ``invalid value:``, ``already evaluated:``.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from vkit.search.space import Param, _canon, param_from_dict
from vkit.search.types import Objective, Observation, jsonable

PROMPT_VERSION = 1
MAX_HISTORY = 30  # measured configurations shown to the advisor (the latest ones)
# keys of the answer's object that explain rather than set a parameter
RATIONALE_KEYS = ("reason", "rationale", "why", "explanation", "comment")


def rules_from_policy(policy: Any, frozen: dict | None = None) -> dict:
    """The policy's fixed premises as the parser needs them: ``fixed`` {param: "rule F3: why"}
    (never to change) and ``frozen`` {param: [value, "rule F11: why"]} (frozen by an earlier step)."""
    data = policy.data if hasattr(policy, "data") else policy
    frozen = {_canon(k): v for k, v in (frozen or {}).items()}
    fixed, held = {}, {}
    for r in data.get("forbidden", []):
        p = _canon(r["param"])
        if r.get("when") == "frozen":
            if p in frozen:
                held[p] = [frozen[p], f"rule {r['id']}: {r['why']}"]
        else:
            fixed[p] = f"rule {r['id']}: {r['why']}"
    for p, v in frozen.items():
        held.setdefault(p, [v, "frozen by an earlier step"])
    return {"fixed": fixed, "frozen": held}


def proposal_inputs(space: list[Param], history: list[Observation], base_config: dict, kept_metrics: dict | None,
                    objectives: list[Objective], slo: dict | None, rules: dict, max_history: int = MAX_HISTORY) -> dict:
    """The JSON-able inputs of one request for a proposal: what the prompt shows and what the
    answer is checked against. ``history``: the measured configurations (those that differ from
    ``base_config`` outside the space are left out: another max_model_len, other flags)."""
    names = {p.name for p in space}
    same = [h for h in history if all(h.config.get(k) == v for k, v in base_config.items() if k not in names)
            and all(k in names or k in base_config for k in h.config)]
    shown = same[-max_history:] if max_history > 0 else []
    return jsonable({
        "version": PROMPT_VERSION,
        "space": [p.to_dict() for p in space],
        "base_config": base_config,
        "kept_metrics": {o.name: (kept_metrics or {}).get(o.name) for o in objectives if (kept_metrics or {}).get(o.name) is not None},
        "objectives": [o.to_dict() for o in objectives],
        "slo": slo or {},
        "rules": rules,
        "history": [{"config": {k: h.config.get(k) for k in sorted(names)}, "objectives": h.objectives, "feasible": h.feasible,
                     "slo_ok": h.slo_ok, "trial_id": h.trial_id} for h in shown],
        "omitted": len(same) - len(shown),
        "evaluated": sorted({_key_text(h.config, space) for h in same} | {_key_text(base_config, space)}),
    })


def _key_text(config: dict, space: list[Param]) -> str:
    return json.dumps({p.name: (p.coerce(config[p.name]) if config.get(p.name) is not None else None) for p in space},
                      sort_keys=True)


def _num(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _param_line(p: dict) -> str:
    if p["kind"] in ("int", "float"):
        return f"- {p['name']}: {p['kind']}, {_num(p['low'])} to {_num(p['high'])}"
    if p["kind"] == "bool":
        return f"- {p['name']}: true or false"
    return f"- {p['name']}: one of {', '.join(json.dumps(c) for c in p.get('choices') or [])}"


def _result_text(h: dict) -> str:
    if not h["feasible"]:
        return "failed (did not start, or the measurement was invalid)"
    txt = ", ".join(f"{k} {_num(v)}" for k, v in sorted(h["objectives"].items()))
    if h.get("slo_ok") is not None:
        txt += "; meets the SLO" if h["slo_ok"] else "; breaks the SLO"
    return txt


def proposal_messages(inputs: dict) -> list[dict]:
    """The chat messages of a request for a proposal (deterministic: the same inputs, the same prompt)."""
    space = inputs["space"]
    names = [p["name"] for p in space]
    goal = "; ".join(f"{o['name']} ({'higher' if o['direction'] == 'max' else 'lower'} is better)" for o in inputs["objectives"])
    slo = ", ".join(f"{k} <= {_num(v)}" for k, v in sorted(inputs["slo"].items()))
    fixed = sorted(inputs["rules"]["fixed"])
    frozen = [f"{k} (frozen at {v[0]})" for k, v in sorted(inputs["rules"]["frozen"].items())]
    lines = [f"Objectives: {goal}." + (f" Constraint: {slo}." if slo else ""),
             "Parameters you may set:", *(_param_line(p) for p in space),
             "Never set: " + ", ".join(fixed + frozen) + ".",
             f"Kept configuration: {json.dumps({k: inputs['base_config'].get(k) for k in names}, sort_keys=True)}"
             + (f" measured {', '.join(f'{k} {_num(v)}' for k, v in sorted(inputs['kept_metrics'].items()))}." if inputs["kept_metrics"] else "."),
             "Measured so far" + (f" (the latest {len(inputs['history'])}; {inputs['omitted']} earlier not shown)" if inputs["omitted"] else "")
             + (":" if inputs["history"] else ": nothing yet.")]
    lines += [f"{n}. {json.dumps(h['config'], sort_keys=True)} -> {_result_text(h)}" for n, h in enumerate(inputs["history"], 1)]
    form = ", ".join(f'"{p["name"]}": <{p["kind"] if p["kind"] != "choice" else "choice"}>' for p in space)
    lines.append("Propose the one configuration not measured yet that is most likely to improve the objectives within the "
                 "constraint. Answer with one JSON object and nothing else: {" + form + "}")
    return [{"role": "system", "content": "You tune the serving parameters of a vLLM server. You answer with one JSON object."},
            {"role": "user", "content": "\n".join(lines)}]


def explain_messages(finding: dict) -> list[dict]:
    """The chat messages of a request for an explanation of a finding (a step's result, JSON)."""
    return [{"role": "system", "content": "You explain the results of tuning a vLLM server to the engineer who runs it."},
            {"role": "user", "content": "Explain in at most five sentences why this tuning step ended as it did, from the "
                                        "measurements below. Do not propose changes.\n"
                                        + json.dumps(jsonable(finding), sort_keys=True, separators=(",", ":"))}]


def prompt_sha256(messages: list[dict]) -> str:
    """sha256 of the messages' canonical JSON (sorted keys, no spaces, UTF-8)."""
    return hashlib.sha256(json.dumps(messages, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")).hexdigest()


def completion_prompt(messages: list[dict]) -> str:
    """The messages as one plain prompt, for a server that refuses chat completions."""
    return "\n\n".join(m["content"] for m in messages) + "\n\nJSON: "


# -- the answer -------------------------------------------------------------------------------------
def _first_object(text: str) -> tuple[Any, str | None]:
    """The first JSON value that starts at a '{' of ``text`` and parses (a fenced ```json block
    parses the same); (None, why) when none does."""
    dec = json.JSONDecoder()
    first_err = None
    for i, ch in enumerate(text):
        if ch != "{":
            continue
        try:
            return dec.raw_decode(text, i)[0], None
        except ValueError as e:
            first_err = first_err or f"the first '{{' (character {i}) starts no valid JSON: {e.msg} at character {e.pos}"
    return None, first_err or "no JSON object in the answer"


def _value(p: Param, raw: Any) -> tuple[Any, str | None]:
    """The answer's value for ``p`` on its lattice, or the refusal."""
    if p.kind == "bool":
        if isinstance(raw, bool):
            return raw, None
        if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true", None
        return None, f"invalid value: {p.name}={json.dumps(raw)} is not true or false"
    if p.kind == "choice":
        if raw in (p.choices or []):
            return raw, None
        return None, f"invalid value: {p.name}={json.dumps(raw)} is not one of {', '.join(map(str, p.choices or []))}"
    try:
        x = float(raw) if not isinstance(raw, bool) and isinstance(raw, (int, float, str)) else math.nan
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        return None, f"invalid value: {p.name}={json.dumps(raw)} is not a number"
    if x < p.low or x > p.high:
        return None, f"out of bounds: {p.name}={_num(x) if p.kind == 'float' else int(x) if x.is_integer() else x} is outside [{_num(p.low)}, {_num(p.high)}]"
    return p.snap(x), None


def parse_proposal(answer: str, inputs: dict) -> dict:
    """The advisor's answer checked against the inputs it was asked with: ``{"outcome": "accepted",
    "config", "values", "notes", "rationale"}`` or ``{"outcome": "refused", "reason"}``.

    The first JSON object of the answer sets parameters of the search space (an object under
    ``"config"`` is read too); a parameter left out keeps the kept configuration's value; a value
    between lattice points is moved to the nearest one (said in ``notes``). Refused: no object,
    a fixed or frozen parameter, a parameter outside the space, a value out of its bounds or of the
    wrong type, nothing set, or a configuration already measured."""
    obj, why = _first_object(answer or "")
    if obj is None:
        return {"outcome": "refused", "reason": f"unparsable: {why}"}
    if not isinstance(obj, dict):
        return {"outcome": "refused", "reason": f"unparsable: expected an object of parameter values, got {type(obj).__name__}"}
    if isinstance(obj.get("config"), dict):
        obj = dict(obj["config"], **{k: v for k, v in obj.items() if k in RATIONALE_KEYS})
    space = [param_from_dict(p) for p in inputs["space"]]
    by_name = {p.name: p for p in space}
    rules = inputs["rules"]
    rationale = next((str(obj[k]) for k in RATIONALE_KEYS if isinstance(obj.get(k), str)), None)
    values, notes = {}, []
    for raw_name, raw in obj.items():
        if raw_name in RATIONALE_KEYS:
            continue
        name = _canon(str(raw_name))
        if name in rules["fixed"]:
            return {"outcome": "refused", "reason": f"forbidden: parameter {name} is forbidden to change ({rules['fixed'][name]})"}
        if name in rules["frozen"]:
            v, rule = rules["frozen"][name]
            return {"outcome": "refused", "reason": f"forbidden: parameter {name} is frozen at {v} ({rule})"}
        p = by_name.get(name)
        if p is None:
            return {"outcome": "refused", "reason": f"not in the search space: parameter {name} (the space: {', '.join(by_name)})"}
        v, bad = _value(p, raw)
        if bad:
            return {"outcome": "refused", "reason": bad}
        if p.kind in ("int", "float") and not isinstance(raw, bool) and float(raw) != float(v):
            notes.append(f"{name} {raw} moved to the lattice value {v}")
        values[name] = v
    if not values:
        return {"outcome": "refused", "reason": "unparsable: the object sets no parameter of the search space"}
    config = dict(inputs["base_config"], **values)
    key = _key_text(config, space)
    if key in inputs["evaluated"]:
        return {"outcome": "refused", "reason": f"already evaluated: {key} was measured (or is the kept configuration)"}
    return {"outcome": "accepted", "config": jsonable(config), "values": jsonable(values), "notes": notes, "rationale": rationale}


# -- replay -------------------------------------------------------------------------------------------
def replay_call(record: dict) -> dict:
    """One logged ``advisor_call`` re-derived without the model: the prompt rebuilt from the
    logged inputs (``prompt_sha256``) and, for a proposal, the logged answer parsed again."""
    kind = record.get("kind")
    inputs = record.get("inputs") or {}
    messages = proposal_messages(inputs) if kind == "propose" else explain_messages(inputs)
    out: dict = {"prompt_sha256": prompt_sha256(messages)}
    if kind == "propose" and record.get("answer") is not None:
        out.update(parse_proposal(record["answer"], inputs))
    return out


def call_mismatch(record: dict) -> dict | None:
    """What differs between a logged call and its replay (None: it replays exactly)."""
    got = replay_call(record)
    diff = {}
    if got["prompt_sha256"] != record.get("prompt_sha256"):
        diff["prompt_sha256"] = {"logged": record.get("prompt_sha256"), "replayed": got["prompt_sha256"]}
    answer = record.get("answer")
    if answer is not None and hashlib.sha256(answer.encode("utf-8")).hexdigest() != record.get("answer_parsed_sha256"):
        diff["answer"] = "the logged answer does not match its sha256"
    if record.get("kind") == "propose" and answer is not None:
        for k in ("outcome", "config", "reason"):
            if jsonable(got.get(k)) != jsonable(record.get(k)):
                diff[k] = {"logged": record.get(k), "replayed": got.get(k)}
    return diff or None
