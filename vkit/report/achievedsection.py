"""The report's lead under the capacity objective: what the tune achieved. The starting configuration's
SLO capacity and the recommendation's, each with its 95 % interval (the searches' estimates), the gain
with its interval, and the promise the recommendation held on fresh-start runs."""

from __future__ import annotations

from dataclasses import dataclass

from vkit.report.model import CODE, STRONG, VALUE, WORDS, Para, Section, Span
from vkit.report.text import as_dict, config_text, fmt_num, num
from vkit.report.view import View


@dataclass(kw_only=True)
class AchievedSection(Section):
    line: str = ""  # the whole lead in one line, for the terminal


def _ci(c: dict) -> str:
    ci = c.get("interval")
    if isinstance(ci, list) and len(ci) == 2 and num(ci[0]) is not None and num(ci[1]) is not None:
        return f" [{fmt_num(ci[0])}, {fmt_num(ci[1])}]"
    return ""


def _pct(x) -> str:
    return f"{100 * x:+.0f} %" if num(x) is not None else "–"


def achieved_section(v: View) -> AchievedSection:
    """Empty (no heading) without a capacity objective or a starting capacity."""
    a = as_dict(v.capacity.get("achieved"))
    start, rec = as_dict(a.get("start")), as_dict(a.get("recommendation"))
    if num(start.get("req_s")) is None or num(rec.get("req_s")) is None:
        return AchievedSection(id="achieved")
    same = start.get("config") == rec.get("config")
    gi = a.get("gain_interval") if isinstance(a.get("gain_interval"), list) else [None, None]
    verified = num(rec.get("verified_req_s"))
    spans = [Span(STRONG, "Started at"), Span(WORDS, " "), Span(VALUE, f"{fmt_num(start['req_s'])} req/s{_ci(start)}"),
             Span(WORDS, " ("), Span(CODE, config_text(start.get("config"))), Span(WORDS, "); ")]
    if same:
        spans += [Span(WORDS, "no change beat it: the recommendation is the starting configuration")]
    else:
        spans += [Span(STRONG, "recommended"), Span(WORDS, " "), Span(VALUE, f"{fmt_num(rec['req_s'])} req/s{_ci(rec)}"),
                  Span(WORDS, " ("), Span(CODE, config_text(rec.get("config"))), Span(WORDS, "), a gain of "),
                  Span(VALUE, f"{_pct(a.get('gain'))} [{_pct(gi[0])}, {_pct(gi[1])}]")]
    spans += [Span(WORDS, "; held on fresh-start runs at "), Span(VALUE, f"{fmt_num(verified)} req/s")] if verified is not None \
        else [Span(WORDS, "; the promise was not verified on fresh-start runs")]
    spans.append(Span(WORDS, ". Capacities are the searches' estimates with their 95 % intervals."))
    line = "".join(s.text for s in spans)
    return AchievedSection(id="achieved", title="What the tune achieved", blocks=[Para(spans, "lead")], line=line)
