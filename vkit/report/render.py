"""Report: a tune run's result as Markdown, one self-contained HTML page and a terminal plot.

The last step of ``make tune`` / ``make demo``: the tune driver builds a result document
(schema ``vkit.tune/1``) and ``write_report(result, out_dir)`` writes ``report.md``,
``report.html`` and ``result.json`` beside each other; ``render_terminal`` gives the key
facts and a text plot for stderr.

This module is the package's front door and holds no logic of its own: each function builds
the section model (``vkit.report.model.build``) and hands it to one renderer. What lives
where is in the package docstring (``vkit/report/__init__.py``).

Nothing here prints or exits; ``write_report`` raises ``ReportWriteError`` with a sentence.
"""

from __future__ import annotations

from vkit.report import html, markdown, terminal
from vkit.report.charts import svg_lines, svg_scatter
from vkit.report.files import ReportWriteError, write_report
from vkit.report.model import build
from vkit.report.text import (
    BANNER,
    CONFIRMATION_NOTE,
    METRIC_INFO,
    SCHEMA,
    X_KEY,
    Y_DEFAULT,
    axis_label,
    config_text,
    confirmation_text,
    fmt_metric,
    fmt_num,
    fmt_pct,
    metric_label,
    metric_unit,
)
from vkit.tune.result import TuneResult

__all__ = [
    "BANNER", "CONFIRMATION_NOTE", "METRIC_INFO", "SCHEMA", "X_KEY", "Y_DEFAULT", "ReportWriteError", "axis_label",
    "config_text", "confirmation_text", "fmt_metric", "fmt_num", "fmt_pct", "metric_label", "metric_unit",
    "render_html", "render_markdown", "render_terminal", "svg_lines", "svg_scatter", "write_report",
]


def render_markdown(result: TuneResult | dict) -> str:
    """The whole report as GitHub-flavoured Markdown (the plots are in report.html)."""
    return markdown.render(build(result))


def render_html(result: TuneResult | dict) -> str:
    """One self-contained, XHTML-compatible page: inline CSS and SVG, no script, no link."""
    return html.render(build(result))


def render_terminal(result: TuneResult | dict, width: int = 78, color: bool = False) -> str:
    """The key facts and a text scatter plot (P95 TTFT across, throughput up) for stderr.

    Marks: a digit per step (the step's number, or a letter), B baseline, * a Pareto
    configuration joined by dots, K the knee, R the recommendation, : the SLO. Where marks
    fall in one cell the later in that list wins. ``color`` adds ANSI colours.
    """
    return terminal.render(build(result), width=width, color=color)
