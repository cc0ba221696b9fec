"""What the figures show: the three SVG charts' series and the terminal plot's marks, from a ``View``.

Pure data (``charts.Chart`` and ``TextPlot``); drawing is ``charts.draw`` (SVG) and
``vkit.report.terminal`` (text).
"""

from __future__ import annotations

from dataclasses import dataclass

from vkit.report.charts import SLO_COLOR, Chart
from vkit.report.text import as_dict, as_text, axis_label, config_text, fmt_metric, fmt_pct, metric_label, num, upper_first
from vkit.report.view import View

# Okabe–Ito: distinguishable with the common colour-vision deficiencies; shapes repeat the cue.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#8C6D1F", "#444444")
SHAPES = ("circle", "square", "triangle", "diamond", "triangle_down", "cross")
KNEE_COLOR = "#C2185B"
REC_COLOR = "#2E7D32"
FRONT_COLOR = "#222222"
MUTED = "#A0A0A0"


def _tip(v: View, t: dict, x: float, y: float) -> str:
    """A trial marker's tooltip."""
    tid = as_text(t.get("id"))
    return (f"{tid} · {v.step_label(as_text(t.get('step')))} · {config_text(t.get('config'))} · "
            f"{fmt_metric(y, v.y_key)} · {metric_label(v.x_key)} {fmt_metric(x, v.x_key)}"
            + (f" · {as_text(t.get('verdict'))}" if t.get("verdict") else ""))


def _slo_vline(v: View) -> list[dict]:
    """The SLO as a dashed line with the region beyond it tinted, when the goal has one."""
    if v.slo is None:
        return []
    text = f"SLO: {metric_label(v.x_key)} ≤ {fmt_metric(v.slo, v.x_key)}"
    return [{"x": v.slo, "label": text, "tag": "SLO", "color": SLO_COLOR, "shade": "right"}]


def trials_chart(v: View) -> Chart:
    """Figure 1: every measured trial, by step, with the baseline."""
    pts, _ = v.plotted()
    series = []
    for i, step in enumerate(v.step_order):
        sp = [{"x": x, "y": y, "id": as_text(t.get("id")), "tip": _tip(v, t, x, y)}
              for t, x, y in pts if as_text(t.get("step")) == step]
        if sp:
            series.append({"name": f"step {step}" if step else "no step", "label": v.step_label(step), "points": sp,
                           "color": PALETTE[i % len(PALETTE)], "shape": SHAPES[i % len(SHAPES)]})
    b = v.baseline_point()
    if b:
        tip = f"baseline · {config_text(v.baseline.get('config'))} · {fmt_metric(b[1], v.y_key)} · " \
              f"{metric_label(v.x_key)} {fmt_metric(b[0], v.x_key)}"
        series.append({"name": "baseline", "label": "baseline (mean)", "points": [{"x": b[0], "y": b[1], "id": "baseline",
                       "tip": tip}], "color": "#000", "shape": "star", "size": 6})
    return Chart("scatter", series, title=f"{upper_first(metric_label(v.y_key))} vs {metric_label(v.x_key)}, every measured trial",
                 x_label=axis_label(v.x_key), y_label=axis_label(v.y_key), vlines=_slo_vline(v),
                 empty_text="no measured trial to plot")


def pareto_chart(v: View) -> Chart:
    """Figure 3: the Pareto front, the knee and the recommendation, the other trials greyed."""
    pts, _ = v.plotted()
    front = v.front()
    front_ids = {as_text(p.get("trial_id")) for p, _, _ in front}
    others = [{"x": x, "y": y, "id": as_text(t.get("id")), "tip": _tip(v, t, x, y)}
              for t, x, y in pts if as_text(t.get("id")) not in front_ids]
    series = []
    if others:
        series.append({"name": "other trials", "label": "other measured trials", "points": others, "color": MUTED,
                       "shape": "circle", "size": 3.5, "filled": False})
    fp = []
    for p, x, y in front:
        tid = as_text(p.get("trial_id"))
        tip = (f"{tid} · {config_text(p.get('config'))} · {fmt_metric(y, v.y_key)} · {metric_label(v.x_key)} "
               f"{fmt_metric(x, v.x_key)} · dominance rate {fmt_pct(p.get('dominance_rate'))}")
        fp.append({"x": x, "y": y, "id": tid, "tip": tip})
    if fp:
        series.append({"name": "pareto", "label": "Pareto configurations", "points": fp, "color": FRONT_COLOR,
                       "shape": "circle", "size": 4.5, "line": "straight"})
    kp = v.point_of(v.knee_id, v.knee)
    rp = v.point_of(v.rec_id, v.rec)
    same = bool(kp and rp and v.knee_is_rec())
    if same:
        rp = kp  # one configuration, one point
    if kp:
        note = "knee = recommendation" if same else "knee"
        series.append({"name": "knee", "label": f"knee ({v.knee_id})", "points": [{"x": kp[0], "y": kp[1], "id": v.knee_id,
                       "tip": f"knee: {v.knee_line()}", "note": note}], "color": KNEE_COLOR, "shape": "ring",
                       "size": 9, "filled": False})
    if rp:
        series.append({"name": "recommendation", "label": f"recommendation ({v.rec_id})",
                       "points": [{"x": rp[0], "y": rp[1], "id": v.rec_id, "note": "" if same else "recommended",
                                   "tip": f"recommended: {v.rec_id} · {config_text(v.rec.get('config'))}"}],
                       "color": REC_COLOR, "shape": "square", "size": 15 if same else 10, "filled": False})
    return Chart("scatter", series, title=f"Pareto front: {metric_label(v.y_key)} vs {metric_label(v.x_key)}, knee and SLO",
                 x_label=axis_label(v.x_key), y_label=axis_label(v.y_key), vlines=_slo_vline(v),
                 empty_text=v.empty_pareto_text())


def progress_chart(v: View) -> Chart:
    """Figure 2: the goal metric trial by trial, the kept configuration's level as a staircase."""
    ticks, pts, kept = {}, [], []
    b = v.baseline_point()
    level = b[1] if b else None
    # under the capacity objective the staircase starts where the tune started, not at a rebased baseline
    start = num(as_dict(as_dict(v.capacity.get("achieved")).get("start")).get("req_s")) if v.y_key == "slo_capacity" else None
    if start is not None:
        level = start
    if level is not None:
        kept.append({"x": 0, "y": level})
        ticks[0] = "start" if start is not None else "base"
    for i, t in enumerate(v.trials, start=1):
        tid = as_text(t.get("id")) or str(i)
        ticks[i] = tid
        m = as_dict(t.get("metrics"))
        y = num(m.get(v.y_key))
        if t.get("status") == "measured" and t.get("valid") is not False and y is not None:
            x = num(m.get(v.x_key))
            tip = _tip(v, t, x, y) if x is not None else f"{tid} · {fmt_metric(y, v.y_key)}"
            pts.append({"x": i, "y": y, "id": tid, "tip": tip})
            if t.get("kept") is True:
                level = y
        if level is not None:
            kept.append({"x": i, "y": level})
    series = []
    if kept and pts:
        series.append({"name": "kept", "label": "kept configuration", "points": kept, "color": REC_COLOR,
                       "line": "step", "markers": False})
    if pts:
        series.append({"name": "trials", "label": "measured trial", "points": pts, "color": PALETTE[0],
                       "line": None, "shape": "circle", "size": 4})
    bands = []
    bm = as_dict(as_dict(v.baseline.get("metrics")).get(v.y_key))
    mean, sr = num(bm.get("mean")), num(bm.get("sigma_rel"))
    if pts and mean is not None and sr is not None:
        bands.append({"lo": mean * (1 - 2 * sr), "hi": mean * (1 + 2 * sr), "label": "baseline ± 2σ", "color": "#666"})
    return Chart("lines", series, title=f"{upper_first(metric_label(v.y_key))} trial by trial", x_label="trial (in run order)",
                 y_label=axis_label(v.y_key), hbands=bands, x_tick_labels=ticks if pts else None,
                 empty_text="no measured trial to plot")


@dataclass(frozen=True)
class TextPlot:
    """The terminal's scatter plot: latency across, the goal metric up.

    ``points`` are the measured trials as (mark, x, y), the mark a step's one-character name
    or a letter; ``front`` the Pareto configurations by latency; ``legend`` one entry a mark.
    """

    title: str
    x_label: str
    points: list[tuple[str, float, float]]
    front: list[tuple[float, float]]
    baseline: tuple[float, float] | None
    knee: tuple[float, float] | None
    rec: tuple[float, float] | None
    slo: float | None
    legend: list[str]


def text_plot(v: View) -> TextPlot:
    """What the terminal plots: the same trials, front, knee and recommendation as the SVG figures."""
    def mark(i: int, step: str) -> str:
        return step if len(step) == 1 else chr(ord("a") + i % 26)

    marks = {step: mark(i, step) for i, step in enumerate(v.step_order)}  # a repeated step: the last one's mark
    pts, _ = v.plotted()
    legend = [f"{mark(i, step)} {v.step_label(step)}" for i, step in enumerate(v.step_order)]
    legend += ["B baseline", "* Pareto (joined by .)"]
    same = v.knee_is_rec()
    if same:
        legend.append("K knee, also the recommendation")
    else:
        legend += ["K knee", "R recommendation"]
    if v.slo is not None:
        legend.append(f": SLO {fmt_metric(v.slo, v.x_key)}")
    return TextPlot(title=f"{upper_first(metric_label(v.y_key))} vs {metric_label(v.x_key)}", x_label=axis_label(v.x_key),
                    points=[(marks.get(as_text(t.get("step")), "o"), x, y) for t, x, y in pts],
                    front=[(x, y) for _, x, y in v.front()], baseline=v.baseline_point(),
                    knee=v.point_of(v.knee_id, v.knee), rec=None if same else v.point_of(v.rec_id, v.rec), slo=v.slo,
                    legend=legend)


def capacity_chart(v: View) -> Chart:
    """Figure 4 (the capacity objective): each measured configuration's load–latency curve from its
    first capacity search — the binding SLO's metric against the offered rate, the limit dashed."""
    metric = as_text(as_dict(v.capacity.get("kept")).get("binding_slo"))
    limits = as_dict(as_dict(v.capacity.get("settings")).get("slo"))
    if metric not in limits:
        metric = next(iter(limits), "p95_ttft_ms")
    series = []
    for i, (tid, cfg, c) in enumerate(v.capacity_rows()):
        pts = [{"x": p["load"], "y": as_dict(p.get("metrics")).get(metric), "id": tid,
                "tip": f"{tid} · {as_text(p.get('load'))} req/s · {metric_label(metric)} "
                       f"{fmt_metric(as_dict(p.get('metrics')).get(metric), metric)} · {as_text(p.get('verdict'))}"}
               for p in sorted((p for p in c.get("curve") or [] if isinstance(p, dict) and num(p.get("load")) is not None),
                               key=lambda p: p["load"]) if num(as_dict(p.get("metrics")).get(metric)) is not None]
        if pts:
            series.append({"name": tid, "label": f"{tid} {cfg}", "points": pts, "color": PALETTE[i % len(PALETTE)],
                           "line": "straight", "shape": SHAPES[i % len(SHAPES)], "size": 4})
    limit = num(limits.get(metric))
    return Chart("lines", series, title=f"{upper_first(metric_label(metric))} against the offered load, each configuration",
                 x_label="offered load (req/s)", y_label=axis_label(metric),
                 hbands=[{"lo": limit, "hi": limit, "label": f"SLO {fmt_metric(limit, metric)}", "color": SLO_COLOR}]
                 if limit is not None else [], empty_text="no capacity search to plot")


def sparkline(values: list[float]) -> str:
    """A row of block characters, one per value, scaled between their minimum and maximum."""
    bars = "▁▂▃▄▅▆▇█"
    vals = [x for x in values if num(x) is not None]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    return "".join(bars[0 if hi == lo else min(7, int((x - lo) / (hi - lo) * 7 + 0.5))] for x in vals)
