"""The result as a table for people (``render_table``: check_invariants --human)."""

from __future__ import annotations

import textwrap

from vkit.validate.invariants.common import FAIL, NA, PASS

_MARK = {PASS: "pass", FAIL: "FAIL", NA: "n/a"}


def render_table(result: dict, width: int = 118) -> str:
    """The result as a table for people: one row per check, failures with their explanation."""
    lines = [f"{result.get('source')} ({result.get('format')}): {result['verdict'].upper()}"
             + (f" — {', '.join(result['findings'])}" if result["findings"] else "")]
    lines.append(f"  {'status':<6} {'severity':<8} {'check':<31} finding")
    for c in result["checks"]:
        sev = c["severity"] if c["status"] == FAIL else "-"
        head = f"  {_MARK[c['status']]:<6} {sev:<8} {c['id']:<31} "
        text = c["explanation"]
        if c["status"] == FAIL or text.startswith("not applicable —"):
            wrapped = textwrap.wrap(text, width=max(40, width - len(head))) or [""]
            lines.append(head + wrapped[0])
            lines += [" " * len(head) + w for w in wrapped[1:]]
        else:
            room = max(20, width - len(head))
            lines.append(head + (text if len(text) <= room else text[: room - 1] + "…"))
    for n in result.get("notes") or []:
        lines += textwrap.wrap(n, width=width, initial_indent="  note: ", subsequent_indent="        ")
    return "\n".join(lines) + "\n"
