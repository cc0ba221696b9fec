"""The report as GitHub-flavoured Markdown, drawn from the section model (the plots are in report.html)."""

from __future__ import annotations

import re
import shlex
from typing import Any

from vkit.report import model as m
from vkit.report.text import BANNER, as_text

# Only a '<' that could open a tag, comment or declaration is raw HTML in Markdown; '<= 2000' stays legible.
_TAG_START = re.compile(r"<(?=[A-Za-z/!?])")


def md_text(s: Any) -> str:
    """Free text in a Markdown table cell or paragraph: no raw HTML, no broken table."""
    text = as_text(s).replace("\r", " ").replace("\n", " ").replace("|", "\\|")
    return _TAG_START.sub("&lt;", text)


def md_code(s: Any) -> str:
    """Inline code, fenced so that a backtick inside survives; "–" when empty."""
    s = as_text(s).replace("\r", " ").replace("\n", " ")
    if not s:
        return "–"
    fence = "``" if "`" in s else "`"
    pad = " " if "`" in s else ""
    return f"{fence}{pad}{s}{pad}{fence}".replace("|", "\\|")


def _span(sp: m.Span) -> str:
    if sp.kind in (m.WORDS, m.VALUE):
        return sp.text
    if sp.kind in (m.CODE, m.TRIAL):
        return md_code(sp.text)
    if sp.kind == m.FLAGS:
        return md_code(shlex.join(sp.flags))
    if sp.kind == m.STRONG:
        return f"**{md_text(sp.text)}**"
    return md_text(sp.text)  # TEXT, VERDICT, STATUS


def _spans(spans: list[m.Span]) -> str:
    return "".join(_span(sp) for sp in spans)


def _table(t: m.Table) -> list[str]:
    out = ["| " + " | ".join(t.head) + " |", "|" + "|".join("---" for _ in t.head) + "|"]
    out += ["| " + " | ".join(_span(c) for c in r.cells) + " |" for r in t.rows]
    return out


def _block(b: m.Block) -> list[str]:
    """A block's lines, each block closed by a blank line; figures are the page's alone."""
    if isinstance(b, m.Para):
        if b.only == "html":
            return []
        return [("> " if b.style == "note" else "") + _spans(b.spans), ""]
    if isinstance(b, m.Table):
        return _table(b) + [""]
    if isinstance(b, m.Bullets):
        return [f"- {_spans(item)}" for item in b.items] + [""]
    if isinstance(b, m.Command):
        return ["Deploy with:", "", "```sh", b.text.replace("```", "` ` `"), "```", ""]
    return []


def render(report: m.Report) -> str:
    """The whole report as Markdown."""
    lines: list[str] = [f"# {md_text(report.title)}", ""]
    if report.simulated:
        lines += [f"> **{BANNER}**", ""]
    for sec in report.sections:
        if sec.title:
            lines += [f"## {sec.title}", ""]
        for b in sec.blocks:
            lines += _block(b)
    return "\n".join(lines)
