"""The report as one self-contained, XHTML-compatible page, drawn from the section model.

Inline CSS and SVG (``charts.draw``), no script, no font, no link to anything outside the
file; every element closed and only XML's own entities, so ``xml.etree`` parses it whole.
"""

from __future__ import annotations

import shlex

from vkit.report import model as m
from vkit.report.charts import draw, esc
from vkit.report.text import BANNER

_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1200px;padding:0 18px 40px;color:#1d1d1d}
h1{margin:18px 0 4px}h2{border-bottom:1px solid #ddd;padding-bottom:3px;margin-top:30px}
.meta{color:#555;margin:0 0 10px}
.banner{background:#fff3cd;border:2px solid #d39e00;color:#5c4400;font-weight:bold;padding:8px 12px;margin:14px 0;border-radius:4px}
.note{background:#f3f3f3;padding:6px 10px;border-left:4px solid #999}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{border:1px solid #d4d4d4;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f2f2f2}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.kept td:first-child{border-left:4px solid #2E7D32}
tr.hl{background:#fbf4f8}
code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13px}
pre{background:#f6f8fa;border:1px solid #ddd;padding:10px;white-space:pre-wrap;word-break:break-all}
.v{font-weight:bold;padding:0 4px;border-radius:3px}
.v-accept{color:#1b5e20;background:#e6f4e7}.v-reject{color:#8e1b1b;background:#fbe9e9}.v-undecided{color:#6d4c00;background:#fff3d6}
.s-start_failed,.s-invalid{color:#8e1b1b}.s-eliminated,.s-skipped{color:#666}
figure{margin:14px 0}figcaption{color:#555;font-size:13px;max-width:720px}
svg.plot{max-width:100%;height:auto;display:block}
.nw{white-space:nowrap}td.why{min-width:18em}
"""


def _code(s: str) -> str:
    return f"<code>{esc(s)}</code>" if s else "–"


def _flags(flags: tuple[str, ...]) -> str:
    """Flags as code, each flag with its value kept on one line."""
    if not flags:
        return "–"
    groups: list[list[str]] = [[]]
    for f in flags:
        if f.startswith("-") and groups[-1]:
            groups.append([])
        groups[-1].append(f)
    return "<code>" + " ".join(f'<span class="nw">{esc(shlex.join(g))}</span>' for g in groups) + "</code>"


def _span(sp: m.Span) -> str:
    if sp.kind == m.WORDS:
        return sp.text
    if sp.kind == m.CODE:
        return _code(sp.text)
    if sp.kind == m.FLAGS:
        return _flags(sp.flags)
    if sp.kind == m.STRONG:
        return f"<strong>{esc(sp.text)}</strong>"
    if sp.kind == m.TRIAL:
        title = f' title="{esc(sp.attr)}"' if sp.attr else ""
        return f"<code{title}>{esc(sp.text) or '–'}</code>"
    if sp.kind == m.VERDICT:
        return f'<span class="v v-{esc(sp.text)}">{esc(sp.text)}</span>'
    if sp.kind == m.STATUS:
        return f'<span class="s-{esc(sp.attr)}">{esc(sp.text)}</span>'
    return esc(sp.text)  # VALUE, TEXT


def _spans(spans: list[m.Span]) -> str:
    return "".join(_span(sp) for sp in spans)


def _table(t: m.Table) -> str:
    out = [f'<table id="{t.id}">' if t.id else "<table>",
           "<thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in t.head) + "</tr></thead>", "<tbody>"]
    for r in t.rows:
        c = f' class="{r.cls}"' if r.cls else ""
        out.append(f"<tr{c}>" + "".join(f'<td class="{t.classes[i]}">{_span(x)}</td>' if i in t.classes
                                        else f"<td>{_span(x)}</td>" for i, x in enumerate(r.cells)) + "</tr>")
    out += ["</tbody>", "</table>"]
    return "\n".join(out)


def _para(p: m.Para) -> str:
    if p.style == "lead":
        return f"<p><strong>{_spans(p.spans)}</strong></p>"
    cls = f' class="{p.style}"' if p.style else ""
    return f"<p{cls}>{_spans(p.spans)}</p>"


def _block(b: m.Block) -> list[str]:
    """A block as page lines; what only the Markdown shows is left out."""
    if isinstance(b, m.Para):
        return [] if b.only == "markdown" else [_para(b)]
    if isinstance(b, m.Table):
        return [_table(b)]
    if isinstance(b, m.Bullets):
        ul = f'<ul id="{b.id}">' if b.id else "<ul>"
        return [ul + "".join(f"<li>{_spans(item)}</li>" for item in b.items) + "</ul>"]
    if isinstance(b, m.Command):
        return [f'<p>Deploy with:</p><pre id="{b.id}"><code>{esc(b.text)}</code></pre>']
    return [f'<figure id="{b.id}">{draw(b.chart)}<figcaption>{_spans(b.caption)}</figcaption></figure>']


def render(report: m.Report) -> str:
    """The whole report as one page."""
    out: list[str] = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8"/>',
                      '<meta name="viewport" content="width=device-width, initial-scale=1"/>',
                      f"<title>{esc(report.title)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>"]
    if report.simulated:
        out.append(f'<div class="banner" id="simulated">{esc(BANNER)}</div>')
    out.append(f"<h1>{esc(report.title)}</h1>")
    for sec in report.sections:
        if sec.title:
            out.append(f'<h2 id="{sec.id}">{esc(sec.title)}</h2>')
        for b in sec.blocks:
            out += _block(b)
    out += ["</body>", "</html>", ""]
    return "\n".join(out)
