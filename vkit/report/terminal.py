"""The report's key facts and a text scatter plot for the terminal, drawn from the section model.

Plain text wrapped to a width, ANSI colours only when asked for. Marks in the plot: a digit
per step (the step's number, or a letter), B baseline, * a Pareto configuration joined by
dots, K the knee, R the recommendation, : the SLO. Where marks fall in one cell the later in
that list wins.
"""

from __future__ import annotations

import shlex
import textwrap
from typing import Callable

from vkit.report import model as m
from vkit.report.achievedsection import AchievedSection
from vkit.report.charts import nice_domain, tick_text
from vkit.report.energysection import EnergySection
from vkit.report.plots import TextPlot
from vkit.report.text import BANNER, fmt_metric, fmt_num, metric_label, metric_unit
from vkit.report.twinsection import TwinSection

_ANSI = {"K": "1;35", "R": "1;32", "*": "32", "B": "1;36", ":": "31", ".": "2;32"}
PLOT_HEIGHT = 15


# ----------------------------------------------------------------------------- text helpers


def _wrap(text: str, width: int, indent: str = "", first: str = "") -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent=first, subsequent_indent=indent,
                         break_long_words=True, break_on_hyphens=False) or [first.rstrip()]


def _pack(items: list[str], width: int, indent: str) -> list[str]:
    """Items on as few lines as fit, never split inside an item (unless it is too wide alone)."""
    lines: list[str] = []
    cur = ""
    for it in items:
        cand = f"{cur}   {it}" if cur else indent + it
        if cur and len(cand) > width:
            lines.append(cur)
            cand = indent + it
        cur = cand
    if cur:
        lines.append(cur)
    return [ln for line in lines for ln in (_wrap(line.strip(), width, indent, indent) if len(line) > width else [line])]


def _command_lines(cmd: str, width: int) -> list[str]:
    """The serve command, broken before each flag with shell continuations when too wide."""
    if len(cmd) + 2 <= width:
        return ["  " + cmd]
    try:
        toks = shlex.split(cmd)
    except ValueError:
        return ["  " + cmd]
    groups: list[list[str]] = [[]]
    for tok in toks:
        if tok.startswith("-") and groups[-1]:
            groups.append([])
        groups[-1].append(tok)
    parts = [shlex.join(g) for g in groups if g]
    return ["  " + p + (" \\" if i < len(parts) - 1 else "") if i == 0 else "      " + p + (" \\" if i < len(parts) - 1 else "")
            for i, p in enumerate(parts)]


# ----------------------------------------------------------------------------- the plot


class _Grid:
    """Character cells over the data range; a mark replaces another only when it ranks higher."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float, cols: int, height: int):
        self.x0, self.x1, self.y0, self.y1, self.cols, self.height = x0, x1, y0, y1, cols, height
        self.chars = [[" "] * cols for _ in range(height)]
        self.prio = [[0] * cols for _ in range(height)]

    def cell(self, x: float, y: float) -> tuple[int, int]:
        c = int(round((x - self.x0) / (self.x1 - self.x0) * (self.cols - 1)))
        r = int(round((self.y1 - y) / (self.y1 - self.y0) * (self.height - 1)))
        return min(max(r, 0), self.height - 1), min(max(c, 0), self.cols - 1)

    def put(self, r: int, c: int, ch: str, p: int) -> None:
        if p > self.prio[r][c]:
            self.chars[r][c], self.prio[r][c] = ch, p


def _draw_marks(g: _Grid, p: TextPlot) -> None:
    if p.slo is not None:
        _, c = g.cell(p.slo, g.y0)
        for r in range(g.height):
            g.put(r, c, ":", 1)
    fcells = [g.cell(x, y) for x, y in p.front]
    for (r0, c0), (r1, c1) in zip(fcells, fcells[1:], strict=False):
        n = max(abs(r1 - r0), abs(c1 - c0))
        for i in range(1, n):
            g.put(int(round(r0 + (r1 - r0) * i / n)), int(round(c0 + (c1 - c0) * i / n)), ".", 2)
    for mark, x, y in p.points:
        g.put(*g.cell(x, y), mark, 3)
    if p.baseline:
        g.put(*g.cell(*p.baseline), "B", 4)
    for r, c in fcells:
        g.put(r, c, "*", 5)
    if p.rec:
        g.put(*g.cell(*p.rec), "R", 6)
    if p.knee:
        g.put(*g.cell(*p.knee), "K", 7)


def _x_axis(g: _Grid, xt: list[float], xstep: float, lw: int, xl: str) -> list[str]:
    """The axis line with its ticks, the tick labels that fit without overlapping, the label."""
    axis = ["-"] * g.cols
    under = [" "] * g.cols
    last_end = -2
    for t in xt:
        _, c = g.cell(t, g.y0)
        axis[c] = "+"
        s = tick_text(t, xstep)
        start = min(max(0, c - len(s) // 2), g.cols - len(s))
        if start > last_end + 1 and start >= 0:
            under[start:start + len(s)] = list(s)
            last_end = start + len(s)
    return [" " * lw + " +" + "".join(axis), " " * (lw + 2) + "".join(under).rstrip(),
            " " * (lw + 2 + max(0, (g.cols - len(xl)) // 2)) + xl]


def _plot(p: TextPlot, width: int, height: int, color: bool) -> list[str]:
    xs = [x for _, x, _ in p.points] + [x for x, _ in p.front] + ([p.baseline[0]] if p.baseline else [])
    ys = [y for _, _, y in p.points] + [y for _, y in p.front] + ([p.baseline[1]] if p.baseline else [])
    for extra in (p.knee, p.rec):
        if extra:
            xs.append(extra[0])
            ys.append(extra[1])
    if not xs:
        return ["(no measured trial to plot)"]
    x0, x1, xt, xstep = nice_domain(xs + ([p.slo] if p.slo is not None else []), n=5)
    y0, y1, yt, ystep = nice_domain(ys, n=4)
    ylabels = {t: tick_text(t, ystep) for t in yt}
    lw = max(len(s) for s in ylabels.values())
    g = _Grid(x0, x1, y0, y1, max(20, width - lw - 2), height)
    _draw_marks(g, p)
    tick_rows = {g.cell(x0, t)[0]: ylabels[t] for t in yt}
    lines = []
    for r in range(height):
        lab = tick_rows.get(r, "")
        row = "".join(f"\x1b[{_ANSI[ch]}m{ch}\x1b[0m" if color and ch in _ANSI else ch for ch in g.chars[r])
        lines.append(f"{lab:>{lw}} {'+' if lab else '|'}{row.rstrip() if not color else row}".rstrip())
    return lines + _x_axis(g, xt, xstep, lw, p.x_label)


# ----------------------------------------------------------------------------- sections


class _Page:
    """The width, the colour switch and the lines written so far."""

    def __init__(self, width: int, color: bool):
        self.width, self.color = width, color
        self.lines: list[str] = []

    def bold(self, s: str) -> str:
        return f"\x1b[1m{s}\x1b[0m" if self.color else s

    def wrap(self, text: str, indent: str = "", first: str = "") -> None:
        self.lines += _wrap(text, self.width, indent, first)


def _intro(pg: _Page, s: m.Intro, title: str, simulated: bool) -> None:
    pg.wrap(title + (f" — {s.generated}" if s.generated else ""))
    if simulated:
        ban = f"!! {BANNER} !!"
        pg.lines.append(f"\x1b[1;33m{ban}\x1b[0m" if pg.color else ban)
    if s.server:
        pg.wrap(f"Server: {s.server}", "  ")


def _goal(pg: _Page, s: m.Goal) -> None:
    pg.wrap(f"Goal: {s.goal or 'none in the result'}", "  ")
    if s.workload:
        pg.wrap(f"Workload: {s.workload}", "  ")


def _baseline(pg: _Page, s: m.Baseline) -> None:
    if s.metrics:
        parts = [f"{label} {mean} σ {sigma}" for label, mean, sigma in s.metrics]
        rep = f", {s.repeats} repeats" if s.repeats is not None else ""
        pg.wrap(f"Baseline ({s.config.strip('()')}{rep}): " + "; ".join(parts), "  ")
        if s.parts:
            pg.wrap(s.parts, "  ")
    else:
        pg.lines.append("Baseline: none in the result")
    pg.lines.append("")


def _trials(pg: _Page, s: m.Trials) -> None:
    if s.rows:
        pg.lines.append(pg.bold(f"Trials ({len(s.rows)}):"))
        yh = metric_unit(s.y_key) or metric_label(s.y_key)[:7]
        xh = metric_unit(s.x_key) or metric_label(s.x_key)[:7]
        pg.lines.append(f"  {'trial':<5} {'step':>4} {'outcome':<12} {yh:>7} {xh:>7}  changes")
        for t in s.rows:
            status = t.status or "-"
            outcome = (t.verdict if status == "measured" else status) + (", kept" if t.kept else "")
            y, x = fmt_num(t.metrics.get(s.y_key)), fmt_num(t.metrics.get(s.x_key))
            pg.wrap(f"{t.id:<5} {t.step or '-':>4} {outcome:<12} {y:>7} {x:>7}  {t.changes}",
                    " " * (45 if pg.width - 45 >= 32 else 8), "  ")
            if t.why:
                pg.wrap(f"why: {t.why}", "          ", "        ")
    else:
        pg.lines.append("No trials were run.")
    pg.lines.append("")


def _plots(pg: _Page, s: m.Plots) -> None:
    pg.lines.append(pg.bold(f"{s.plot.title}:"))
    plot = _plot(s.plot, pg.width, PLOT_HEIGHT, pg.color)
    pg.lines += plot
    if len(plot) > 1:
        pg.lines += _pack(s.plot.legend, pg.width, "  ")
    pg.lines.append("")


def _knee(pg: _Page, s: m.Knee) -> None:
    if s.trial_id:
        pg.wrap(f"Knee: {s.line}" + (f" ({s.method})" if s.method else ""), "  ")
    else:
        pg.lines.append("Knee: none" + (" (no Pareto front)" if not s.has_front else ""))


def _pareto(pg: _Page, s: m.Pareto) -> None:
    if s.rows:
        pg.lines.append(pg.bold("Pareto configurations:"))
        for r in s.rows:
            tag = "".join(f" [{n}]" for n in r.roles)
            pg.wrap(f"{r.trial_id}{tag}: {fmt_metric(r.y, s.y_key)}, {metric_label(s.x_key)} {fmt_metric(r.x, s.x_key)}, "
                    f"dominance rate {r.dominance}" + (f", {r.confirmation}" if r.confirmation != "–" else "")
                    + f"; {r.config}", "      ", "  ")
        for d in s.dropped:
            pg.wrap(f"dropped from the front: {d.trial_id} ({d.config}), claim {d.claim}: {d.decision} — {d.why}",
                    "      ", "  ")
    else:
        pg.lines.append(s.empty)
    pg.lines.append("")


def _recommendation(pg: _Page, s: m.Recommendation) -> None:
    if s.present:
        pg.lines.append(pg.bold(f"Recommendation: {s.trial_id or 'configuration'}"))
        pg.wrap(s.config, "  ", "  ")
        if s.why:
            pg.wrap(s.why, "  ", "  ")
        if s.command:
            pg.lines.append("Deploy with:")
            pg.lines += _command_lines(s.command, pg.width)
    else:
        pg.lines.append("Recommendation: none" + (" (no configuration meets the goal)" if s.has_front else " (nothing measured)"))
    pg.lines.append("")


def _stop_rule(pg: _Page, s: m.StopRule) -> None:
    pg.wrap(f"Stop rule: {s.rule or 'none recorded'}" + (f" ({s.timings})" if s.timings else ""), "  ")


def _drift(pg: _Page, s: m.Drift) -> None:
    if not s.count:
        pg.lines.append("Drift checks: none")
        return
    series = (f" (series of {', '.join(map(str, s.runs))} runs of the kept configuration"
              + (f"; the detectors need {s.need}, below that the sentinel's start is judged against the earlier "
                 "starts' level" if s.need else "") + ")") if s.runs else ""
    pg.wrap(f"Drift checks: {s.count}{series}, {len(s.changed)} with a change", "  ")
    for after, detail in s.changed:
        pg.wrap(f"after {after}: {detail}", "      ", "  ")


def _warnings(pg: _Page, s: m.Warnings) -> None:
    if s.items:
        pg.lines.append(f"Warnings ({len(s.items)}):")
        for w in s.items:
            pg.wrap(w, "    ", "  - ")


def _soak(pg: _Page, s: m.Soak) -> None:
    if s.text:
        pg.wrap(f"Soak: {s.text}", "  ")


def _capacity(pg: _Page, s: m.CapacitySection) -> None:
    if not s.rows:
        return
    for b in s.blocks:
        if isinstance(b, m.Para) and b.spans and b.spans[0].text == "Promise: ":
            pg.wrap("".join(x.text for x in b.spans), "  ")
    pg.lines.append(pg.bold(f"SLO capacity (req/s; per-user tok/s at {s.reference} req/s):"))
    for r in s.rows:
        pg.wrap(f"{r.trial_id}: {r.capacity} [{r.interval}], {r.tok_s} tok/s, {r.per_user} tok/s per user, "
                f"binding {r.binding} {r.spark}; {r.config}", "      ", "  ")
    pg.lines.append("")


def _twin(pg: _Page, s: TwinSection) -> None:
    if not s.lines:
        return
    pg.lines.append(pg.bold(f"Twin vs measured (req/s, 90 % interval; {s.summary}):"))
    for line in s.lines:
        pg.wrap(line, "      ", "  ")
    pg.lines.append("")


def _energy(pg: _Page, s: EnergySection) -> None:
    if not s.lines:
        return
    pg.lines.append(pg.bold("Energy (board power only):"))
    for line in s.lines:
        pg.wrap(line, "      ", "  ")
    pg.lines.append("")


def _achieved(pg: _Page, s: AchievedSection) -> None:
    if s.line:
        pg.wrap(s.line, "  ")
        pg.lines.append("")


_SECTIONS: dict[type, Callable] = {
    TwinSection: _twin, EnergySection: _energy, AchievedSection: _achieved,
    m.Goal: _goal, m.Baseline: _baseline, m.Trials: _trials, m.Plots: _plots, m.CapacitySection: _capacity, m.Knee: _knee,
    m.Pareto: _pareto,
    m.Recommendation: _recommendation, m.StopRule: _stop_rule, m.Drift: _drift, m.Warnings: _warnings, m.Soak: _soak,
}


def render(report: m.Report, width: int = 78, color: bool = False) -> str:
    """The key facts and the plot, ``width`` columns wide (at least 40)."""
    pg = _Page(max(40, int(width)), color)
    for sec in report.sections:
        if isinstance(sec, m.Intro):
            _intro(pg, sec, report.title, report.simulated)
        elif type(sec) in _SECTIONS:
            _SECTIONS[type(sec)](pg, sec)
    return "\n".join(pg.lines) + "\n"
