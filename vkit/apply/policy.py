"""The parameter policy: the runbook's traffic-light table as data.

Four classes (seed 004 §9): **forbidden** to change (fixed premises, and
max-model-len once step 1 froze it), **must change** (what the field setup sets
before any measurement), **must run** (checks that precede every analysis) and
**situational** (the tunables, with types and ranges). The table lives in
``vkit/data/params.json`` (``runbook/params.json`` links to it); a site may point
``$VKIT_POLICY`` at its own copy. ``runbook/README.md`` shows the same table,
rendered by :func:`render_table`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable

from vkit.errors import MustRunMissing, PolicyRefusal, UsageError
from vkit.jsonio import read_json

DEFAULT_POLICY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "params.json")

TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off"}


def config_value(v: Any) -> Any:
    """A configuration value as compared: None for none/null/empty, booleans for the words in
    TRUE and FALSE, numbers as floats, other text stripped and lower-cased."""
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, (int, float)):
        return float(v)
    s = str(v).strip()
    low = s.lower()
    if low in ("none", "null", ""):
        return None
    if low in TRUE:
        return True
    if low in FALSE:
        return False
    try:
        return float(s)
    except ValueError:
        return low


def same_value(a: Any, b: Any) -> bool:
    """Whether two spellings of a configuration value mean the same: 0.9 == '0.9', True == 'true'
    == '1', 16 == '16.0' (the one comparison of configured, expected and reported values)."""
    a, b = config_value(a), config_value(b)
    if isinstance(a, bool) or isinstance(b, bool):
        a = float(a) if isinstance(a, bool) else a
        b = float(b) if isinstance(b, bool) else b
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
    return a == b


def canonical(name: str) -> str:
    """vLLM spelling in JSON: ``--max-num-seqs`` / ``max-num-seqs`` → ``max_num_seqs``."""
    return name.strip().lstrip("-").replace("-", "_")


@dataclass
class Policy:
    data: dict
    source: str = DEFAULT_POLICY
    _forbidden: dict = field(init=False)
    _situational: dict = field(init=False)

    def __post_init__(self) -> None:
        self._forbidden = {canonical(r["param"]): r for r in self.data.get("forbidden", [])}
        self._situational = {canonical(r["param"]): r for r in self.data.get("situational", [])}

    @classmethod
    def load(cls, path: str | None = None) -> "Policy":
        path = path or DEFAULT_POLICY
        try:
            data = read_json(path, "parameter policy")
        except FileNotFoundError:
            raise UsageError(f"no parameter policy at {path}") from None
        for key in ("forbidden", "must_change", "must_run", "situational"):
            if not isinstance(data.get(key), list):
                raise UsageError(f"parameter policy {path} lacks the list {key!r}")
        return cls(data=data, source=path)

    # -- classification -------------------------------------------------
    def rule(self, param: str) -> dict | None:
        return self._situational.get(canonical(param))

    def tunables(self) -> list[dict]:
        return list(self.data["situational"])

    def must_run(self) -> list[dict]:
        return list(self.data["must_run"])

    def coerce(self, param: str, raw: Any) -> Any:
        """Turn a ``--set k=v`` string (or a JSON value) into the parameter's type, range-checked."""
        p = canonical(param)
        r = self._situational.get(p)
        kind = r.get("type") if r else None
        try:
            if kind == "int":
                v: Any = int(raw) if not isinstance(raw, bool) else None
                if v is None:
                    raise ValueError
            elif kind == "float":
                v = float(raw)
            elif kind == "bool":
                if isinstance(raw, bool):
                    v = raw
                elif str(raw).lower() in TRUE:
                    v = True
                elif str(raw).lower() in FALSE:
                    v = False
                else:
                    raise ValueError
            elif kind == "choice":
                v = str(raw)
                if v not in r["choices"]:
                    raise UsageError(f"{p}={raw!r} is not one of {', '.join(r['choices'])}")
            else:
                v = _guess(raw)
        except (TypeError, ValueError):
            raise UsageError(f"{p}={raw!r} is not a valid {kind} value") from None
        return v

    def check_change(
        self, changes: dict, frozen: dict | None = None, allow: Iterable[str] = ()
    ) -> list[str]:
        """Refuse what the table forbids. Returns the overrides that were used (to log them).

        ``frozen`` maps parameter → the value it was frozen at (e.g. max_model_len after step 1);
        ``allow`` is the set of parameters the user explicitly overrode with ``--allow``.
        """
        frozen = {canonical(k): v for k, v in (frozen or {}).items()}
        allowed = {canonical(a) for a in allow}
        used: list[str] = []
        for raw_name, value in changes.items():
            p = canonical(raw_name)
            f = self._forbidden.get(p)
            why = None
            if f is not None and f.get("when") != "frozen":
                why = f"{p} is forbidden to change (rule {f['id']}: {f['why']})"
            elif p in frozen and frozen[p] != value:
                rid = f["id"] if f else "frozen"
                reason = f["why"] if f else "frozen by an earlier step"
                why = f"{p} is frozen at {frozen[p]} (rule {rid}: {reason})"
            elif f is None and p not in self._situational:
                why = f"{p} is not in the parameter table {self.source}; add it under 'situational' to tune it"
            elif p in self._situational and not self._in_range(p, value):
                r = self._situational[p]
                why = f"{p}={value} is outside the policy range [{r.get('min')}, {r.get('max')}] (rule {r['id']})"
            if why is None:
                continue
            if p in allowed:
                used.append(f"{p}: {why}")
                continue
            raise PolicyRefusal(f"refused: {why}; override with --allow {p} if you mean it")
        return used

    def _in_range(self, p: str, value: Any) -> bool:
        r = self._situational[p]
        if r.get("type") not in ("int", "float") or isinstance(value, bool) or not isinstance(value, (int, float)):
            return True
        lo, hi = r.get("min"), r.get("max")
        return not ((lo is not None and value < lo) or (hi is not None and value > hi))

    def min_repeats(self) -> int:
        """The must-run rule "repeats" (runs of one configuration before a gate): its minimum."""
        r = next((r for r in self.data["must_run"] if r["check"] == "repeats"), None)
        return int(r.get("min", 1)) if r else 1

    def require(self, done: Iterable[str], before: str) -> None:
        """Refuse to analyse when a must-run check for ``before`` has not been run."""
        done_set = set(done)
        missing = [r for r in self.data["must_run"] if r["check"] not in done_set and _applies(r, before)]
        if missing:
            r = missing[0]
            raise MustRunMissing(
                f"refused to {before}: must-run check {r['check']} ({r['when']}, rule {r['id']}) has not been run; {r['why']}"
            )


def _applies(rule: dict, before: str) -> bool:
    """Which must-run rules bind before ``before``: "analysis" (any verdict drawn from measurements),
    "gate" (analysis rules plus those "before every gate"), "keep" (rules "after every restart": the
    configuration kept must have passed them since it started)."""
    when = rule.get("when", "")
    return {"analysis": "analysis" in when, "gate": "analysis" in when or "gate" in when,
            "keep": "restart" in when}.get(before, False)


def _guess(raw: Any) -> Any:
    if not isinstance(raw, str):
        return raw
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(raw)
        except ValueError:
            pass
    return raw


def parse_assignments(items: Iterable[str], policy: Policy) -> dict:
    """``["max-num-seqs=64", "enable_prefix_caching=false"]`` → typed dict."""
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"expected key=value, got {item!r}")
        k, v = item.split("=", 1)
        k = canonical(k)
        if not k:
            raise UsageError(f"empty parameter name in {item!r}")
        out[k] = policy.coerce(k, v)
    return out


def to_serve_flags(config: dict) -> list[str]:
    """A config dict as ``vllm serve`` argv items: ``max_num_seqs=64`` → ``--max-num-seqs 64``,
    booleans → ``--enable-x`` / ``--no-enable-x``. Values stay separate argv items, never
    joined into a shell string."""
    argv: list[str] = []
    for k in sorted(config):
        v = config[k]
        flag = "--" + canonical(k).replace("_", "-")
        if isinstance(v, bool):
            argv.append(flag if v else "--no-" + flag[2:])
        elif v is None:
            continue
        else:
            argv += [flag, str(v)]
    return argv


def render_table(policy: Policy) -> str:
    """The traffic-light table in Markdown, as it opens runbook/README.md."""
    d = policy.data
    rows = ["| class | rule | what | when / range | why |", "| --- | --- | --- | --- | --- |"]
    for r in d["forbidden"]:
        when = "once step 1 froze it" if r.get("when") == "frozen" else "never"
        rows.append(f"| 🔴 forbidden to change | {r['id']} | `{r['param']}` | {when} | {r['why']} |")
    for r in d["must_change"]:
        rows.append(f"| 🟠 must change | {r['id']} | {r['item']} | before any measurement | {r['why']} |")
    for r in d["must_run"]:
        rows.append(f"| 🟢 must run | {r['id']} | `{r['check']}` | {r['when']} | {r['why']} |")
    for r in d["situational"]:
        if r["type"] in ("int", "float"):
            rng = f"{r['min']} … {r['max']}; try {', '.join(str(c) for c in r['candidates'])}"
        elif r["type"] == "choice":
            rng = " / ".join(r["choices"])
        else:
            rng = "on / off"
        rows.append(f"| 🟡 situational (step {r['step']}) | {r['id']} | `{r['param']}` | {rng} | {r['why']} |")
    return "\n".join(rows) + "\n"


TABLE_BEGIN = "<!-- params:begin (generated from vkit/data/params.json by `make runbook-table`; do not edit by hand) -->"
TABLE_END = "<!-- params:end -->"


def splice_table(text: str, table: str) -> str:
    """Replace the generated table between the markers in ``text``."""
    try:
        head, rest = text.split(TABLE_BEGIN, 1)
        _, tail = rest.split(TABLE_END, 1)
    except ValueError:
        raise UsageError("the runbook page has no params:begin/params:end markers") from None
    return f"{head}{TABLE_BEGIN}\n{table}{TABLE_END}{tail}"
