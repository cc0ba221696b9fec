"""SVG charts: inline scatter and line plots for the HTML page, and the axis maths they share.

A library of its own: it knows nothing of tuning. ``svg_scatter`` and ``svg_lines`` draw
series of points (dicts) into one ``<svg>`` element; ``draw`` does the same for a ``Chart``,
the form in which ``vkit.report.model`` hands over what a figure shows. Every marker has
class ``pt`` and ``data-series``/``data-config``/``data-x``/``data-y``; every series group
``data-count``; the root ``data-points``, so a test can count what a plot claims to hold.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from vkit.report.text import as_text, num

SLO_COLOR = "#B22222"
LEFT, RIGHT, TOP, BOTTOM = 72, 24, 34, 46  # the plot area's margins


@dataclass(frozen=True)
class Chart:
    """What one figure draws: ``kind`` "scatter" (``svg_scatter``) or "lines" (``svg_lines``)."""

    kind: str
    series: list[dict]
    title: str
    x_label: str
    y_label: str
    empty_text: str
    vlines: list[dict] = field(default_factory=list)
    hbands: list[dict] = field(default_factory=list)
    x_tick_labels: dict | None = None


def esc(s: Any) -> str:
    """Text for XML (SVG and the XHTML page): markup characters and quotes escaped."""
    return html.escape(as_text(s), quote=True)


def _f(x: float) -> str:
    """Coordinates with one decimal: small files, no visible error."""
    out = f"{x:.1f}"
    return out[:-2] if out.endswith(".0") else out


def _nice_step(span: float, n: int) -> float:
    raw = span / max(n, 1)
    if not (raw > 0 and math.isfinite(raw)):
        return 1.0
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw * (1 - 1e-9):
            return m * mag
    return 10 * mag


def nice_domain(values: Iterable[float], n: int = 5, pad: float = 0.05) -> tuple[float, float, list[float], float]:
    """A padded range snapped to 'nice' ticks (1, 2, 2.5, 5 × 10^k): (lo, hi, ticks, step)."""
    vals = [float(v) for v in values if num(v) is not None]
    if not vals:
        return 0.0, 1.0, [0.0, 0.5, 1.0], 0.5
    lo, hi = min(vals), max(vals)
    if hi == lo:
        d = abs(lo) * 0.1 or 1.0
        lo, hi = lo - d, hi + d
    else:
        p = (hi - lo) * pad
        lo, hi = lo - p, hi + p
    if min(vals) >= 0 > lo:
        lo = 0.0
    step = _nice_step(hi - lo, n)
    lo2 = math.floor(lo / step + 1e-9) * step
    hi2 = math.ceil(hi / step - 1e-9) * step
    count = int(round((hi2 - lo2) / step))
    ticks = [lo2 + i * step for i in range(count + 1)]
    return lo2, hi2, ticks, step


def tick_text(v: float, step: float) -> str:
    """A tick's label with as many decimals as its step needs."""
    d = 0
    while d < 6 and abs(step * 10**d - round(step * 10**d)) > 1e-6:
        d += 1
    out = f"{v:.{d}f}"
    return "0" if out.strip("-0.") == "" else out


def _marker(shape: str, x: float, y: float, r: float, color: str, filled: bool, attrs: str, tip: str) -> str:
    """One marker of ``shape`` centred on (x, y), with a tooltip when ``tip`` is given."""
    fill = color if filled else "none"
    style = f'fill="{fill}" stroke="{color}" stroke-width="{1.2 if filled else 1.8}"'
    t = f"<title>{esc(tip)}</title>" if tip else ""
    if shape == "circle" or shape == "ring":
        return f'<circle cx="{_f(x)}" cy="{_f(y)}" r="{_f(r)}" {style} {attrs}>{t}</circle>'
    if shape == "square":
        a = r * 0.9
        return f'<rect x="{_f(x - a)}" y="{_f(y - a)}" width="{_f(2 * a)}" height="{_f(2 * a)}" {style} {attrs}>{t}</rect>'
    if shape == "cross":
        d = (f"M{_f(x - r)} {_f(y)}H{_f(x + r)}M{_f(x)} {_f(y - r)}V{_f(y + r)}"
             f"M{_f(x - r * .7)} {_f(y - r * .7)}L{_f(x + r * .7)} {_f(y + r * .7)}"
             f"M{_f(x - r * .7)} {_f(y + r * .7)}L{_f(x + r * .7)} {_f(y - r * .7)}")
        return f'<path d="{d}" fill="none" stroke="{color}" stroke-width="2" {attrs}>{t}</path>'
    if shape == "star":
        pts = []
        for i in range(10):
            a = math.pi / 2 + i * math.pi / 5
            rr = r * 1.35 if i % 2 == 0 else r * 0.6
            pts.append(f"{_f(x + rr * math.cos(a))} {_f(y - rr * math.sin(a))}")
        return f'<path d="M{"L".join(pts)}Z" {style} {attrs}>{t}</path>'
    if shape == "diamond":
        a = r * 1.3
        d = f"M{_f(x)} {_f(y - a)}L{_f(x + a)} {_f(y)}L{_f(x)} {_f(y + a)}L{_f(x - a)} {_f(y)}Z"
    elif shape == "triangle_down":
        d = f"M{_f(x)} {_f(y + r * 1.25)}L{_f(x + r * 1.15)} {_f(y - r * .75)}L{_f(x - r * 1.15)} {_f(y - r * .75)}Z"
    else:  # triangle
        d = f"M{_f(x)} {_f(y - r * 1.25)}L{_f(x + r * 1.15)} {_f(y + r * .75)}L{_f(x - r * 1.15)} {_f(y + r * .75)}Z"
    return f'<path d="{d}" {style} {attrs}>{t}</path>'


def _legend_rows(items: list[tuple[str, Any]], avail: float) -> list[list[tuple[str, Any, float]]]:
    """Legend entries as rows that fit ``avail`` pixels: (text, spec, x offset)."""
    rows: list[list[tuple[str, Any, float]]] = [[]]
    used = 0.0
    for text, spec in items:
        w = 26 + 6.2 * len(text) + 14
        if rows[-1] and used + w > avail:
            rows.append([])
            used = 0.0
        rows[-1].append((text, spec, used))
        used += w
    return rows if rows[0] else []


@dataclass(frozen=True)
class _Frame:
    """The plot area in pixels and the data range it shows."""

    pw: int
    ph: int
    x0: float
    x1: float
    y0: float
    y1: float

    def sx(self, x: float) -> float:
        return LEFT + (x - self.x0) / (self.x1 - self.x0) * self.pw

    def sy(self, y: float) -> float:
        return TOP + self.ph - (y - self.y0) / (self.y1 - self.y0) * self.ph


def _svg_plot(series: Sequence[dict], *, kind: str, title: str, x_label: str, y_label: str, width: int,
              height: int, vlines: Sequence[dict], hbands: Sequence[dict], x_tick_labels: dict | None,
              empty_text: str) -> str:
    pw = width - LEFT - RIGHT
    legend_items = [(as_text(s.get("label") or s.get("name")), s) for s in series if s.get("legend", True)]
    legend_items += [(as_text(v.get("label")), {"_vline": v}) for v in vlines if v.get("label")]
    legend_items += [(as_text(b.get("label")), {"_band": b}) for b in hbands if b.get("label")]
    rows = _legend_rows(legend_items, pw)
    ph = height - TOP - BOTTOM
    total_h = height + 18 * len(rows) + (6 if rows else 0)
    xs = [p["x"] for s in series for p in s.get("points", []) if num(p.get("x")) is not None]
    ys = [p["y"] for s in series for p in s.get("points", []) if num(p.get("y")) is not None]
    n_markers = sum(1 for s in series if s.get("markers", True) for p in s.get("points", [])
                    if num(p.get("x")) is not None and num(p.get("y")) is not None)
    if not xs:  # nothing to draw: a small box that says so, not an empty frame
        ph, total_h = 56, TOP + 56 + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" viewBox="0 0 {width} {total_h}" '
           f'width="{width}" height="{total_h}" font-family="sans-serif" font-size="12" role="img" '
           f'aria-label="{esc(title)}" data-kind="{kind}" data-points="{n_markers}">', f"<title>{esc(title)}</title>"]
    out.append(f'<text x="{LEFT}" y="20" font-size="14" font-weight="bold">{esc(title)}</text>')
    if not xs:
        out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#ccc"/>')
        out.append(f'<text x="{_f(LEFT + pw / 2)}" y="{_f(TOP + ph / 2)}" text-anchor="middle" fill="#666">'
                   f"{esc(empty_text)}</text>")
        out.append("</svg>")
        return "\n".join(out)
    xs_all = xs + [v["x"] for v in vlines if num(v.get("x")) is not None]
    ys_all = ys + [b[k] for b in hbands for k in ("lo", "hi") if num(b.get(k)) is not None]
    if x_tick_labels:
        x0, x1 = min(xs_all) - 0.5, max(xs_all) + 0.5
        every = max(1, math.ceil(len(x_tick_labels) * 44 / pw))
        xt = [k for i, k in enumerate(sorted(x_tick_labels)) if i % every == 0]
        xstep = 1.0
    else:
        x0, x1, xt, xstep = nice_domain(xs_all)
    y0, y1, yt, ystep = nice_domain(ys_all)
    fr = _Frame(pw, ph, x0, x1, y0, y1)
    out += _axes_svg(fr, (xt, xstep), (yt, ystep), x_tick_labels, x_label, y_label)
    out += _bands_svg(fr, hbands)
    out += _vlines_svg(fr, vlines)
    for s in series:
        out += _series_svg(fr, s)
    out += _legend_svg(rows, TOP + ph + 58)
    out.append("</svg>")
    return "\n".join(out)


def _axes_svg(fr: _Frame, xticks: tuple[list, float], yticks: tuple[list, float], x_tick_labels: dict | None,
              x_label: str, y_label: str) -> list[str]:
    """The frame, the grid, the tick labels and the two axis labels."""
    (xt, xstep), (yt, ystep) = xticks, yticks
    pw, ph = fr.pw, fr.ph
    out = [f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fff" stroke="#999"/>']
    grid, labels = [], []
    for t in yt:
        y = fr.sy(t)
        grid.append(f"M{LEFT} {_f(y)}H{LEFT + pw}")
        labels.append(f'<text x="{LEFT - 6}" y="{_f(y + 4)}" text-anchor="end">{tick_text(t, ystep)}</text>')
    for t in xt:
        x = fr.sx(t)
        grid.append(f"M{_f(x)} {TOP}V{TOP + ph}")
        text = as_text(x_tick_labels[t]) if x_tick_labels else tick_text(t, xstep)
        labels.append(f'<text x="{_f(x)}" y="{TOP + ph + 16}" text-anchor="middle">{esc(text)}</text>')
    out.append(f'<path d="{"".join(grid)}" stroke="#e6e6e6" fill="none"/>')
    out += labels
    out.append(f'<text x="{_f(LEFT + pw / 2)}" y="{TOP + ph + 36}" text-anchor="middle">{esc(x_label)}</text>')
    out.append(f'<text transform="translate(16 {_f(TOP + ph / 2)}) rotate(-90)" text-anchor="middle">'
               f"{esc(y_label)}</text>")
    return out


def _bands_svg(fr: _Frame, hbands: Sequence[dict]) -> list[str]:
    """Shaded horizontal bands (``lo`` to ``hi``)."""
    out = []
    for b in hbands:
        lo, hi = num(b.get("lo")), num(b.get("hi"))
        if lo is None or hi is None:
            continue
        c = b.get("color", "#888")
        out.append(f'<rect x="{LEFT}" y="{_f(fr.sy(hi))}" width="{fr.pw}" height="{_f(max(fr.sy(lo) - fr.sy(hi), 0.5))}" '
                   f'fill="{c}" fill-opacity="0.15" stroke="none"/>')
    return out


def _vlines_svg(fr: _Frame, vlines: Sequence[dict]) -> list[str]:
    """Dashed vertical lines, each with its optional tag and the tinted region right of it."""
    out = []
    for v in vlines:
        x = num(v.get("x"))
        if x is None:
            continue
        c = v.get("color", SLO_COLOR)
        if v.get("shade") == "right" and fr.sx(x) < LEFT + fr.pw:
            out.append(f'<rect x="{_f(fr.sx(x))}" y="{TOP}" width="{_f(LEFT + fr.pw - fr.sx(x))}" height="{fr.ph}" '
                       f'fill="{c}" fill-opacity="0.06" stroke="none"/>')
        out.append(f'<path d="M{_f(fr.sx(x))} {TOP}V{TOP + fr.ph}" stroke="{c}" stroke-width="1.5" '
                   f'stroke-dasharray="6 4" fill="none"/>')
        if v.get("tag"):
            out.append(f'<text x="{_f(fr.sx(x) - 4)}" y="{TOP + 14}" text-anchor="end" fill="{c}">{esc(v["tag"])}</text>')
    return out


def _series_svg(fr: _Frame, s: dict) -> list[str]:
    """One series as a ``<g>``: its joining line, then its markers with their notes."""
    pts = [p for p in s.get("points", []) if num(p.get("x")) is not None and num(p.get("y")) is not None]
    color = s.get("color", "#333")
    name = as_text(s.get("name"))
    mk = s.get("markers", True)
    out = [f'<g data-series="{esc(name)}" data-count="{len(pts) if mk else 0}">']
    line = s.get("line")
    if line and len(pts) >= 2:
        seq = sorted(pts, key=lambda p: p["x"]) if s.get("sort", True) else pts
        d = f"M{_f(fr.sx(seq[0]['x']))} {_f(fr.sy(seq[0]['y']))}"
        for b in seq[1:]:
            if line == "step":
                d += f"H{_f(fr.sx(b['x']))}V{_f(fr.sy(b['y']))}"
            else:
                d += f"L{_f(fr.sx(b['x']))} {_f(fr.sy(b['y']))}"
        dash = ' stroke-dasharray="4 3"' if s.get("dash") else ""
        out.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="{s.get("line_width", 1.5)}"{dash}/>')
    if mk:
        for p in pts:
            attrs = (f'class="pt" data-series="{esc(name)}" data-config="{esc(p.get("id", ""))}" '
                     f'data-x="{esc(repr(float(p["x"])))}" data-y="{esc(repr(float(p["y"])))}"')
            out.append(_marker(s.get("shape", "circle"), fr.sx(p["x"]), fr.sy(p["y"]), s.get("size", 4.5), color,
                               s.get("filled", True), attrs, as_text(p.get("tip"))))
            if p.get("note"):
                # Above-left of the marker, or below when the point is near the top edge.
                ny = fr.sy(p["y"]) - s.get("size", 4.5) - 5
                if ny < TOP + 12:
                    ny = fr.sy(p["y"]) + s.get("size", 4.5) + 14
                out.append(f'<text x="{_f(fr.sx(p["x"]))}" y="{_f(ny)}" text-anchor="middle" fill="{color}" '
                           f'font-weight="bold">{esc(p["note"])}</text>')
    out.append("</g>")
    return out


def _legend_svg(rows: list[list[tuple[str, Any, float]]], ly: float) -> list[str]:
    """The legend under the plot: a swatch (line, band or marker) and the text, row by row."""
    out = []
    for r_i, row in enumerate(rows):
        y = ly + 18 * r_i
        for text, spec, off in row:
            x = LEFT + off
            if "_vline" in spec:
                c = spec["_vline"].get("color", SLO_COLOR)
                out.append(f'<path d="M{_f(x)} {_f(y - 4)}H{_f(x + 18)}" stroke="{c}" stroke-width="1.5" '
                           f'stroke-dasharray="6 4"/>')
            elif "_band" in spec:
                c = spec["_band"].get("color", "#888")
                out.append(f'<rect x="{_f(x)}" y="{_f(y - 9)}" width="18" height="10" fill="{c}" fill-opacity="0.25"/>')
            else:
                c = spec.get("color", "#333")
                if spec.get("line"):
                    out.append(f'<path d="M{_f(x)} {_f(y - 4)}H{_f(x + 18)}" stroke="{c}" stroke-width="1.5"'
                               + (' stroke-dasharray="4 3"' if spec.get("dash") else "") + "/>")
                if spec.get("markers", True):
                    out.append(_marker(spec.get("shape", "circle"), x + 9, y - 4, min(spec.get("size", 4.5), 7), c,
                                       spec.get("filled", True), 'class="lg"', ""))
            out.append(f'<text x="{_f(x + 24)}" y="{_f(y)}">{esc(text)}</text>')
    return out


def svg_scatter(series: Sequence[dict], *, title: str = "", x_label: str = "", y_label: str = "",
                width: int = 720, height: int = 380, vlines: Sequence[dict] = (),
                empty_text: str = "no points to plot") -> str:
    """An inline SVG scatter plot.

    ``series``: dicts with ``name``, ``points`` (dicts with ``x``, ``y``, ``id``, ``tip``), and
    optional ``label`` (legend text), ``color``, ``shape`` (circle, square, triangle, diamond,
    triangle_down, cross, star, ring), ``size``, ``filled``, ``line`` ("straight" or "step" to
    join the points by x), ``dash``, ``legend`` (False to leave out of the legend).
    ``vlines``: dicts with ``x``, ``label`` (legend), ``tag`` (text by the line), ``color``,
    ``shade`` ("right" tints the region right of the line, e.g. beyond an SLO).
    Every marker has class ``pt`` and ``data-series``/``data-config``/``data-x``/``data-y``.
    """
    return _svg_plot(series, kind="scatter", title=title, x_label=x_label, y_label=y_label, width=width,
                     height=height, vlines=vlines, hbands=(), x_tick_labels=None, empty_text=empty_text)


def svg_lines(series: Sequence[dict], *, title: str = "", x_label: str = "", y_label: str = "",
              width: int = 720, height: int = 300, hbands: Sequence[dict] = (),
              x_tick_labels: dict | None = None, empty_text: str = "no points to plot") -> str:
    """An inline SVG line chart: series as in ``svg_scatter`` but joined by default
    (``line`` "straight" or "step"; ``markers`` False for a bare line, ``sort`` False to keep
    the given order). ``hbands``: dicts with ``lo``, ``hi``, ``label``, ``color`` (a shaded
    horizontal band, e.g. the baseline ± 2σ). ``x_tick_labels``: {x: text} for categorical
    ticks (trial ids), thinned to fit."""
    joined = [dict({"line": "straight"}, **s) for s in series]
    return _svg_plot(joined, kind="lines", title=title, x_label=x_label, y_label=y_label, width=width,
                     height=height, vlines=(), hbands=hbands, x_tick_labels=x_tick_labels, empty_text=empty_text)


def draw(chart: Chart) -> str:
    """A ``Chart`` as inline SVG."""
    if chart.kind == "lines":
        return svg_lines(chart.series, title=chart.title, x_label=chart.x_label, y_label=chart.y_label,
                         hbands=chart.hbands, x_tick_labels=chart.x_tick_labels, empty_text=chart.empty_text)
    return svg_scatter(chart.series, title=chart.title, x_label=chart.x_label, y_label=chart.y_label,
                       vlines=chart.vlines, empty_text=chart.empty_text)
