"""Report: a tune run's result as Markdown, one self-contained HTML page and a terminal plot.

The last step of ``make tune`` / ``make demo``: the tune driver builds a result document
(schema ``vkit.tune/1``) and ``write_report(result, out_dir)`` writes ``report.md``,
``report.html`` and ``result.json`` beside each other; ``render_terminal`` gives the key
facts and a text plot for stderr.

The page is for air-gapped machines: inline CSS, inline SVG, no script, no font, no link to
anything outside the file. It is XHTML-compatible (every element closed, only XML's own
entities), so ``xml.etree`` parses it whole; each plotted marker carries ``data-series``,
``data-config`` (the trial id), ``data-x`` and ``data-y``, and each series group its
``data-count``, so a test can check that a plot holds exactly the points it claims. Every
number in the Markdown is one of the result's own numbers (rounded), never a derived one,
except the number of trials.

Order of the report: the SIMULATED banner, the goal, the baseline with σ, every trial with
its verdict and why, the knee, the Pareto configurations with their dominance rates, the
recommendation with the exact ``vllm serve`` flags, the stop rule, the drift checks, the
warnings, the soak recommendation. Missing optional keys are said to be missing, not guessed.

Nothing here prints or exits; ``write_report`` raises ``ReportWriteError`` with a sentence.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import shlex
import textwrap
from typing import Any, Iterable, Sequence

from vkit.errors import StateWriteError, Unavailable
from vkit.state import atomic_write_text

SCHEMA = "vkit.tune/1"
BANNER = "SIMULATED server: figures are simulated, not measured"
X_KEY = "p95_ttft_ms"  # the latency axis of both plots
Y_DEFAULT = "output_throughput"

# key: (label, unit). Keys not listed get a label from their name and a unit from the suffix.
METRIC_INFO = {
    "output_throughput": ("output throughput", "tok/s"),
    "total_token_throughput": ("total throughput", "tok/s"),
    "request_throughput": ("request throughput", "req/s"),
    "request_goodput": ("goodput", "req/s"),
    "p95_ttft_ms": ("P95 TTFT", "ms"),
    "p99_ttft_ms": ("P99 TTFT", "ms"),
    "mean_ttft_ms": ("mean TTFT", "ms"),
    "median_ttft_ms": ("median TTFT", "ms"),
    "mean_tpot_ms": ("mean TPOT", "ms"),
    "p95_tpot_ms": ("P95 TPOT", "ms"),
    "mean_itl_ms": ("mean ITL", "ms"),
    "p95_e2el_ms": ("P95 E2EL", "ms"),
}
TRIAL_METRICS = ("output_throughput", "request_goodput", "p95_ttft_ms", "mean_ttft_ms", "mean_tpot_ms")
MAX_TRIAL_METRICS = 6
# Okabe–Ito: distinguishable with the common colour-vision deficiencies; shapes repeat the cue.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#8C6D1F", "#444444")
SHAPES = ("circle", "square", "triangle", "diamond", "triangle_down", "cross")
SLO_COLOR = "#B22222"
KNEE_COLOR = "#C2185B"
REC_COLOR = "#2E7D32"
FRONT_COLOR = "#222222"
MUTED = "#A0A0A0"


class ReportWriteError(Unavailable):
    """A report file could not be written; any earlier file of that name is intact."""


# ----------------------------------------------------------------------------- small helpers


def _num(v: Any) -> float | None:
    """A finite float, or None for anything else (bools, strings, NaN, missing)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _d(v: Any) -> dict:
    return v if isinstance(v, dict) else {}


def _l(v: Any) -> list:
    return v if isinstance(v, list) else []


def _s(v: Any) -> str:
    """Text for a value given as text; empty for None."""
    if v is None:
        return ""
    return v if isinstance(v, str) else str(v)


def fmt_num(v: Any) -> str:
    """A number as a person reads it: at most 4 significant digits, integers kept whole."""
    f = _num(v)
    if f is None:
        return "–" if v is None or isinstance(v, (int, float)) and not isinstance(v, bool) else _s(v)
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    if abs(f) >= 1e4:
        return f"{f:.0f}"
    if f != 0 and abs(f) < 1e-3:
        return f"{f:.2e}"
    out = f"{f:.4g}"
    return "0" if out == "-0" else out


def fmt_pct(v: Any) -> str:
    f = _num(v)
    return "–" if f is None else f"{fmt_num(float(f'{100 * f:.3g}'))}%"


def metric_label(key: str) -> str:
    if key in METRIC_INFO:
        return METRIC_INFO[key][0]
    name = key
    for suf in ("_tok_s", "_ms", "_s"):
        if name.endswith(suf):
            name = name[: -len(suf)]
            break
    words = name.split("_")
    if words and words[0][:1] == "p" and words[0][1:].isdigit():
        words[0] = words[0].upper()
    return " ".join(words)


def metric_unit(key: str) -> str:
    if key in METRIC_INFO:
        return METRIC_INFO[key][1]
    if key.endswith("_tok_s"):
        return "tok/s"
    if key.endswith("_ms"):
        return "ms"
    if key.endswith("_s"):
        return "s"
    return ""


def axis_label(key: str) -> str:
    unit = metric_unit(key)
    return f"{metric_label(key)} ({unit})" if unit else metric_label(key)


def fmt_metric(v: Any, key: str) -> str:
    if _num(v) is None:
        return "–"
    unit = metric_unit(key)
    return f"{fmt_num(v)} {unit}" if unit else fmt_num(v)


def _val_text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, bool) or v is None:
        return json.dumps(v)
    if isinstance(v, (int, float)):
        return fmt_num(v) if isinstance(v, float) else str(v)
    return json.dumps(v, sort_keys=True, default=str)


def config_text(cfg: Any) -> str:
    """``max_num_seqs=64, max_num_batched_tokens=8192`` in the config's own order."""
    if isinstance(cfg, dict):
        return ", ".join(f"{k}={_val_text(v)}" for k, v in cfg.items()) or "(defaults)"
    return _s(cfg) or "–"


CONFIRMATION_NOTE = ("confirmed: kept = the kept configuration; confirmed on M = the gate accepted its advantage in "
                     "metric M over the kept configuration on fresh interleaved runs (each objective's change on those "
                     "runs in brackets); undecided = more runs needed; "
                     "screening only = never re-confirmed (its numbers carry the winner's curse).")


def confirmation_text(p: dict) -> str:
    """How a delivered configuration was confirmed, in a few words."""
    c = p.get("confirmation") if isinstance(p.get("confirmation"), dict) else {}
    d = c.get("decision")
    if d == "kept" or (p.get("confirmed") is True and not c):
        return "kept"
    if d == "accept":
        claim = _s(c.get("claim")).split(":")[0]
        vs = c.get("vs_kept") if isinstance(c.get("vs_kept"), dict) else {}
        parts = [f"{metric_label(k)} {v:+.1%}" for k, v in sorted(vs.items(), key=lambda kv: kv[0] != claim)
                 if isinstance(v, (int, float))]
        return f"confirmed on {metric_label(claim)}" + (f" ({', '.join(parts)} vs kept)" if parts else "")
    if d == "undecided":
        return "undecided"
    if d is None and "confirmed" in p:
        return "screening only"
    return _s(d) if d else "–"


def _flags_text(flags: Any) -> str:
    if isinstance(flags, list) and flags:
        return shlex.join(_s(f) for f in flags)
    return ""


# ----------------------------------------------------------------------------- the result, read once


class _View:
    """What the three renderings need, read defensively from the result."""

    def __init__(self, result: Any):
        r = _d(result)
        self.r = r
        self.schema = _s(r.get("schema"))
        self.title = _s(r.get("title")) or "vkit tuning report"
        self.generated = _s(r.get("generated"))
        self.simulated = bool(r.get("simulated"))
        self.server = _d(r.get("server"))
        self.workload = _d(r.get("workload"))
        self.goal = _d(r.get("goal"))
        self.baseline = _d(r.get("baseline"))
        self.trials = [t for t in _l(r.get("trials")) if isinstance(t, dict)]
        self.steps = [s for s in _l(r.get("steps")) if isinstance(s, dict)]
        self.knee = _d(r.get("knee"))
        self.pareto = [p for p in _l(r.get("pareto")) if isinstance(p, dict)]
        self.dropped = [p for p in _l(r.get("not_confirmed")) if isinstance(p, dict)]
        self.rec = _d(r.get("recommendation"))
        self.stop_rule = _s(r.get("stop_rule"))
        self.drift = [x for x in _l(r.get("drift")) if isinstance(x, dict)]
        self.warnings = [_s(w) for w in _l(r.get("warnings")) if w is not None]
        self.soak = _s(r.get("soak"))
        self.timings = _d(r.get("timings"))
        self.by_id = {_s(t.get("id")): t for t in self.trials if t.get("id") is not None}
        self.knee_id = _s(self.knee.get("trial_id"))
        self.rec_id = _s(self.rec.get("trial_id"))
        self.slo = _num(_d(self.goal.get("subject_to")).get(X_KEY))
        if self.slo is None:
            self.slo = _num(_d(self.workload.get("slo")).get(X_KEY))
        self.y_key = self._y_key()
        self.step_names = {}
        for s in self.steps:
            if s.get("step") is not None and s.get("name"):
                self.step_names[_s(s.get("step"))] = _s(s.get("name"))
        order: list[str] = [_s(s.get("step")) for s in self.steps if s.get("step") is not None]
        for t in self.trials:
            k = _s(t.get("step"))
            if k not in order:
                order.append(k)
        self.step_order = order

    def _y_key(self) -> str:
        """The goal's metric when the trials carry it, else output throughput."""
        want = _s(self.goal.get("maximize"))
        if want and want != Y_DEFAULT:
            pts = [_d(t.get("metrics")) for t in self.trials] + [_d(p.get("metrics")) for p in self.pareto]
            if any(_num(m.get(want)) is not None for m in pts):
                return want
        return Y_DEFAULT

    def step_label(self, step: str) -> str:
        if step == "":
            return "no step"
        name = self.step_names.get(step)
        return f"step {step}: {name}" if name else f"step {step}"

    def roles_of(self, trial_id: str) -> list[str]:
        """"knee" and/or "recommended", for a Pareto row's note."""
        return [n for n, ok in (("knee", trial_id == self.knee_id), ("recommended", trial_id == self.rec_id)) if ok]

    def metrics_of(self, trial_id: str, entry: dict | None = None) -> dict:
        """Metrics of a Pareto/knee entry, falling back on the trial's own."""
        m = dict(_d(self.by_id.get(trial_id, {}).get("metrics")))
        if entry:
            m.update({k: v for k, v in _d(entry.get("metrics")).items() if v is not None})
        return m

    def plotted(self) -> tuple[list[tuple[dict, float, float]], list[dict]]:
        """Measured, valid trials with both plot metrics; and the trials left out."""
        pts, left = [], []
        for t in self.trials:
            m = _d(t.get("metrics"))
            x, y = _num(m.get(X_KEY)), _num(m.get(self.y_key))
            if t.get("status") == "measured" and t.get("valid") is not False and x is not None and y is not None:
                pts.append((t, x, y))
            else:
                left.append(t)
        return pts, left

    def baseline_point(self) -> tuple[float, float] | None:
        bm = _d(self.baseline.get("metrics"))
        x, y = _num(_d(bm.get(X_KEY)).get("mean")), _num(_d(bm.get(self.y_key)).get("mean"))
        return None if x is None or y is None else (x, y)

    def front(self) -> list[tuple[dict, float, float]]:
        """Pareto entries with both plot metrics, by latency."""
        out = []
        for p in self.pareto:
            m = self.metrics_of(_s(p.get("trial_id")), p)
            x, y = _num(m.get(X_KEY)), _num(m.get(self.y_key))
            if x is not None and y is not None:
                out.append((p, x, y))
        return sorted(out, key=lambda e: (e[1], e[2]))

    def point_of(self, trial_id: str, entry: dict | None = None) -> tuple[float, float] | None:
        if not trial_id:
            return None
        m = self.metrics_of(trial_id, entry)
        for p in self.pareto:
            if _s(p.get("trial_id")) == trial_id:
                m.update({k: v for k, v in _d(p.get("metrics")).items() if v is not None})
        x, y = _num(m.get(X_KEY)), _num(m.get(self.y_key))
        return None if x is None or y is None else (x, y)

    def trial_metric_keys(self) -> list[str]:
        present: set[str] = set()
        for t in self.trials:
            present.update(k for k, v in _d(t.get("metrics")).items() if _num(v) is not None)
        return self._key_metrics(present)

    def _key_metrics(self, present: set[str]) -> list[str]:
        """The metrics worth a column: the usual ones and the goal's; only when none of them is
        there, whatever is (a full bench summary has dozens of keys)."""
        keys = [k for k in TRIAL_METRICS if k in present]
        for k in [self.y_key] + list(_d(self.goal.get("subject_to"))):
            if k in present and k not in keys:
                keys.insert(0 if k == self.y_key else len(keys), k)
        return (keys or sorted(present))[:MAX_TRIAL_METRICS]

    def baseline_metrics(self) -> list[tuple[str, dict]]:
        bm = _d(self.baseline.get("metrics"))
        keys = self._key_metrics({k for k, m in bm.items() if _num(_d(m).get("mean")) is not None})
        return [(k, _d(bm[k])) for k in keys]

    def serve_command(self) -> str:
        cmd = _s(self.rec.get("serve_command"))
        if cmd:
            return cmd
        flags = _flags_text(self.rec.get("serve_flags"))
        return f"vllm serve MODEL {flags}" if flags else ""

    def verdict_text(self, t: dict) -> str:
        v = t.get("verdict")
        return _s(v) if v else "–"

    def status_text(self, t: dict) -> str:
        s = _s(t.get("status")) or "–"
        if t.get("kept") is True:
            s += ", kept"
        return s

    def why_text(self, t: dict) -> str:
        why = _s(t.get("why"))
        diag = t.get("diagnosis")
        if diag:
            d = diag if isinstance(diag, str) else json.dumps(diag, sort_keys=True, default=str)
            why = f"{why} (diagnosis: {d})" if why else f"diagnosis: {d}"
        return why

    def workload_text(self) -> str:
        w = self.workload
        parts = []
        known = {"dataset": "dataset {}", "input_len": "input {} tokens", "output_len": "output {} tokens",
                 "max_concurrency": "max concurrency {}", "num_prompts": "{} prompts", "request_rate": "request rate {} req/s"}
        for k, pat in known.items():
            if w.get(k) is not None:
                parts.append(pat.format(_val_text(w[k])))
        for k, v in w.items():
            if k not in known and k != "slo" and v is not None:
                parts.append(f"{k} {_val_text(v)}")
        slo = _d(w.get("slo"))
        if slo:
            parts.append("SLO " + ", ".join(f"{metric_label(k)} ≤ {fmt_metric(v, k)}" for k, v in slo.items()))
        return "; ".join(parts)

    def server_text(self) -> str:
        s = self.server
        parts = []
        if s.get("model"):
            parts.append(f"model {_s(s['model'])}")
        if s.get("version"):
            parts.append(f"vLLM {_s(s['version'])}")
        if s.get("url"):
            parts.append(f"at {_s(s['url'])}")
        sim = _d(s.get("sim"))
        if sim:
            parts.append("simulator: " + ", ".join(f"{k} {_val_text(v)}" for k, v in sim.items()))
        return "; ".join(parts)

    def goal_text(self) -> str:
        if self.goal.get("text"):
            return _s(self.goal["text"])
        parts = []
        if self.goal.get("maximize"):
            parts.append(f"maximize {metric_label(_s(self.goal['maximize']))}")
        st = _d(self.goal.get("subject_to"))
        if st:
            parts.append("subject to " + ", ".join(f"{metric_label(k)} ≤ {fmt_metric(v, k)}" for k, v in st.items()))
        return " ".join(parts)

    def timings_text(self) -> str:
        parts = []
        if _num(self.timings.get("total_s")) is not None:
            parts.append(f"total {fmt_num(self.timings['total_s'])} s")
        if _num(self.timings.get("restarts")) is not None:
            parts.append(f"{fmt_num(self.timings['restarts'])} server restarts")
        return ", ".join(parts)

    def empty_pareto_text(self) -> str:
        return ("No Pareto front: no trial was measured." if not self.plotted()[0]
                else "No Pareto front in the result.")


def _knee_line(v: _View) -> str:
    pt = v.point_of(v.knee_id, v.knee)
    s = f"{v.knee_id} — {config_text(v.knee.get('config') or _d(v.by_id.get(v.knee_id)).get('config'))}"
    if pt:
        s += f" — {fmt_metric(pt[1], v.y_key)} at {metric_label(X_KEY)} {fmt_metric(pt[0], X_KEY)}"
    return s


# ----------------------------------------------------------------------------- SVG


def _e(s: Any) -> str:
    return html.escape(_s(s), quote=True)


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


def _domain(values: Iterable[float], n: int = 5, pad: float = 0.05) -> tuple[float, float, list[float], float]:
    """A padded range snapped to 'nice' ticks (1, 2, 2.5, 5 × 10^k)."""
    vals = [float(v) for v in values if _num(v) is not None]
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


def _tick_text(v: float, step: float) -> str:
    d = 0
    while d < 6 and abs(step * 10**d - round(step * 10**d)) > 1e-6:
        d += 1
    out = f"{v:.{d}f}"
    return "0" if out.strip("-0.") == "" else out


def _marker(shape: str, x: float, y: float, r: float, color: str, filled: bool, attrs: str, tip: str) -> str:
    fill = color if filled else "none"
    style = f'fill="{fill}" stroke="{color}" stroke-width="{1.2 if filled else 1.8}"'
    t = f"<title>{_e(tip)}</title>" if tip else ""
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


def _svg_plot(series: Sequence[dict], *, kind: str, title: str, x_label: str, y_label: str, width: int,
              height: int, vlines: Sequence[dict], hbands: Sequence[dict], x_tick_labels: dict | None,
              empty_text: str) -> str:
    left, right, top, bottom = 72, 24, 34, 46
    pw = width - left - right
    legend_items = [(_s(s.get("label") or s.get("name")), s) for s in series if s.get("legend", True)]
    legend_items += [(_s(v.get("label")), {"_vline": v}) for v in vlines if v.get("label")]
    legend_items += [(_s(b.get("label")), {"_band": b}) for b in hbands if b.get("label")]
    rows = _legend_rows(legend_items, pw)
    ph = height - top - bottom
    total_h = height + 18 * len(rows) + (6 if rows else 0)
    xs = [p["x"] for s in series for p in s.get("points", []) if _num(p.get("x")) is not None]
    ys = [p["y"] for s in series for p in s.get("points", []) if _num(p.get("y")) is not None]
    n_markers = sum(1 for s in series if s.get("markers", True) for p in s.get("points", [])
                    if _num(p.get("x")) is not None and _num(p.get("y")) is not None)
    if not xs:  # nothing to draw: a small box that says so, not an empty frame
        ph, total_h = 56, top + 56 + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="plot" viewBox="0 0 {width} {total_h}" '
           f'width="{width}" height="{total_h}" font-family="sans-serif" font-size="12" role="img" '
           f'aria-label="{_e(title)}" data-kind="{kind}" data-points="{n_markers}">', f"<title>{_e(title)}</title>"]
    out.append(f'<text x="{left}" y="20" font-size="14" font-weight="bold">{_e(title)}</text>')
    if not xs:
        out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#ccc"/>')
        out.append(f'<text x="{_f(left + pw / 2)}" y="{_f(top + ph / 2)}" text-anchor="middle" fill="#666">'
                   f"{_e(empty_text)}</text>")
        out.append("</svg>")
        return "\n".join(out)
    xs_all = xs + [v["x"] for v in vlines if _num(v.get("x")) is not None]
    ys_all = ys + [b[k] for b in hbands for k in ("lo", "hi") if _num(b.get(k)) is not None]
    if x_tick_labels:
        x0, x1 = min(xs_all) - 0.5, max(xs_all) + 0.5
        every = max(1, math.ceil(len(x_tick_labels) * 44 / pw))
        xt = [k for i, k in enumerate(sorted(x_tick_labels)) if i % every == 0]
        xstep = 1.0
    else:
        x0, x1, xt, xstep = _domain(xs_all)
    y0, y1, yt, ystep = _domain(ys_all)

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (y - y0) / (y1 - y0) * ph

    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fff" stroke="#999"/>')
    grid, labels = [], []
    for t in yt:
        y = sy(t)
        grid.append(f"M{left} {_f(y)}H{left + pw}")
        labels.append(f'<text x="{left - 6}" y="{_f(y + 4)}" text-anchor="end">{_tick_text(t, ystep)}</text>')
    for t in xt:
        x = sx(t)
        grid.append(f"M{_f(x)} {top}V{top + ph}")
        text = _s(x_tick_labels[t]) if x_tick_labels else _tick_text(t, xstep)
        labels.append(f'<text x="{_f(x)}" y="{top + ph + 16}" text-anchor="middle">{_e(text)}</text>')
    out.append(f'<path d="{"".join(grid)}" stroke="#e6e6e6" fill="none"/>')
    out += labels
    out.append(f'<text x="{_f(left + pw / 2)}" y="{top + ph + 36}" text-anchor="middle">{_e(x_label)}</text>')
    out.append(f'<text transform="translate(16 {_f(top + ph / 2)}) rotate(-90)" text-anchor="middle">'
               f"{_e(y_label)}</text>")
    for b in hbands:
        lo, hi = _num(b.get("lo")), _num(b.get("hi"))
        if lo is None or hi is None:
            continue
        c = b.get("color", "#888")
        out.append(f'<rect x="{left}" y="{_f(sy(hi))}" width="{pw}" height="{_f(max(sy(lo) - sy(hi), 0.5))}" '
                   f'fill="{c}" fill-opacity="0.15" stroke="none"/>')
    for v in vlines:
        x = _num(v.get("x"))
        if x is None:
            continue
        c = v.get("color", SLO_COLOR)
        if v.get("shade") == "right" and sx(x) < left + pw:
            out.append(f'<rect x="{_f(sx(x))}" y="{top}" width="{_f(left + pw - sx(x))}" height="{ph}" '
                       f'fill="{c}" fill-opacity="0.06" stroke="none"/>')
        out.append(f'<path d="M{_f(sx(x))} {top}V{top + ph}" stroke="{c}" stroke-width="1.5" '
                   f'stroke-dasharray="6 4" fill="none"/>')
        if v.get("tag"):
            out.append(f'<text x="{_f(sx(x) - 4)}" y="{top + 14}" text-anchor="end" fill="{c}">{_e(v["tag"])}</text>')
    for s in series:
        pts = [p for p in s.get("points", []) if _num(p.get("x")) is not None and _num(p.get("y")) is not None]
        color = s.get("color", "#333")
        name = _s(s.get("name"))
        mk = s.get("markers", True)
        out.append(f'<g data-series="{_e(name)}" data-count="{len(pts) if mk else 0}">')
        line = s.get("line")
        if line and len(pts) >= 2:
            seq = sorted(pts, key=lambda p: p["x"]) if s.get("sort", True) else pts
            d = f"M{_f(sx(seq[0]['x']))} {_f(sy(seq[0]['y']))}"
            for b in seq[1:]:
                if line == "step":
                    d += f"H{_f(sx(b['x']))}V{_f(sy(b['y']))}"
                else:
                    d += f"L{_f(sx(b['x']))} {_f(sy(b['y']))}"
            dash = ' stroke-dasharray="4 3"' if s.get("dash") else ""
            out.append(f'<path d="{d}" fill="none" stroke="{color}" stroke-width="{s.get("line_width", 1.5)}"{dash}/>')
        if mk:
            for p in pts:
                attrs = (f'class="pt" data-series="{_e(name)}" data-config="{_e(p.get("id", ""))}" '
                         f'data-x="{_e(repr(float(p["x"])))}" data-y="{_e(repr(float(p["y"])))}"')
                out.append(_marker(s.get("shape", "circle"), sx(p["x"]), sy(p["y"]), s.get("size", 4.5), color,
                                   s.get("filled", True), attrs, _s(p.get("tip"))))
                if p.get("note"):
                    # Above-left of the marker, or below when the point is near the top edge.
                    ny = sy(p["y"]) - s.get("size", 4.5) - 5
                    if ny < top + 12:
                        ny = sy(p["y"]) + s.get("size", 4.5) + 14
                    out.append(f'<text x="{_f(sx(p["x"]))}" y="{_f(ny)}" text-anchor="middle" fill="{color}" '
                               f'font-weight="bold">{_e(p["note"])}</text>')
        out.append("</g>")
    ly = top + ph + 58
    for r_i, row in enumerate(rows):
        y = ly + 18 * r_i
        for text, spec, off in row:
            x = left + off
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
            out.append(f'<text x="{_f(x + 24)}" y="{_f(y)}">{_e(text)}</text>')
    out.append("</svg>")
    return "\n".join(out)


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


def _tip(v: _View, t: dict, x: float, y: float) -> str:
    tid = _s(t.get("id"))
    return (f"{tid} · {v.step_label(_s(t.get('step')))} · {config_text(t.get('config'))} · "
            f"{fmt_metric(y, v.y_key)} · {metric_label(X_KEY)} {fmt_metric(x, X_KEY)}"
            + (f" · {_s(t.get('verdict'))}" if t.get("verdict") else ""))


def _slo_vline(v: _View) -> list[dict]:
    if v.slo is None:
        return []
    text = f"SLO: {metric_label(X_KEY)} ≤ {fmt_metric(v.slo, X_KEY)}"
    return [{"x": v.slo, "label": text, "tag": "SLO", "color": SLO_COLOR, "shade": "right"}]


def plot_trials_svg(v: _View) -> str:
    """Plot 1: every measured trial, by step, with the baseline."""
    pts, _ = v.plotted()
    series = []
    for i, step in enumerate(v.step_order):
        sp = [{"x": x, "y": y, "id": _s(t.get("id")), "tip": _tip(v, t, x, y)}
              for t, x, y in pts if _s(t.get("step")) == step]
        if sp:
            series.append({"name": f"step {step}" if step else "no step", "label": v.step_label(step), "points": sp,
                           "color": PALETTE[i % len(PALETTE)], "shape": SHAPES[i % len(SHAPES)]})
    b = v.baseline_point()
    if b:
        tip = f"baseline · {config_text(v.baseline.get('config'))} · {fmt_metric(b[1], v.y_key)} · " \
              f"{metric_label(X_KEY)} {fmt_metric(b[0], X_KEY)}"
        series.append({"name": "baseline", "label": "baseline (mean)", "points": [{"x": b[0], "y": b[1], "id": "baseline",
                       "tip": tip}], "color": "#000", "shape": "star", "size": 6})
    return svg_scatter(series, title=f"{metric_label(v.y_key).capitalize()} vs {metric_label(X_KEY)}, every measured trial",
                       x_label=axis_label(X_KEY), y_label=axis_label(v.y_key), vlines=_slo_vline(v),
                       empty_text="no measured trial to plot")


def plot_pareto_svg(v: _View) -> str:
    """Plot 2: the Pareto front, the knee and the recommendation, the other trials greyed."""
    pts, _ = v.plotted()
    front = v.front()
    front_ids = {_s(p.get("trial_id")) for p, _, _ in front}
    others = [{"x": x, "y": y, "id": _s(t.get("id")), "tip": _tip(v, t, x, y)}
              for t, x, y in pts if _s(t.get("id")) not in front_ids]
    series = []
    if others:
        series.append({"name": "other trials", "label": "other measured trials", "points": others, "color": MUTED,
                       "shape": "circle", "size": 3.5, "filled": False})
    fp = []
    for p, x, y in front:
        tid = _s(p.get("trial_id"))
        tip = (f"{tid} · {config_text(p.get('config'))} · {fmt_metric(y, v.y_key)} · {metric_label(X_KEY)} "
               f"{fmt_metric(x, X_KEY)} · dominance rate {fmt_pct(p.get('dominance_rate'))}")
        fp.append({"x": x, "y": y, "id": tid, "tip": tip})
    if fp:
        series.append({"name": "pareto", "label": "Pareto configurations", "points": fp, "color": FRONT_COLOR,
                       "shape": "circle", "size": 4.5, "line": "straight"})
    kp = v.point_of(v.knee_id, v.knee)
    rp = v.point_of(v.rec_id, v.rec)
    same = bool(kp and rp and v.knee_id == v.rec_id)
    if kp:
        note = "knee = recommendation" if same else "knee"
        series.append({"name": "knee", "label": f"knee ({v.knee_id})", "points": [{"x": kp[0], "y": kp[1], "id": v.knee_id,
                       "tip": f"knee: {_knee_line(v)}", "note": note}], "color": KNEE_COLOR, "shape": "ring",
                       "size": 9, "filled": False})
    if rp:
        series.append({"name": "recommendation", "label": f"recommendation ({v.rec_id})",
                       "points": [{"x": rp[0], "y": rp[1], "id": v.rec_id, "note": "" if same else "recommended",
                                   "tip": f"recommended: {v.rec_id} · {config_text(v.rec.get('config'))}"}],
                       "color": REC_COLOR, "shape": "square", "size": 15 if same else 10, "filled": False})
    return svg_scatter(series, title=f"Pareto front: {metric_label(v.y_key)} vs {metric_label(X_KEY)}, knee and SLO",
                       x_label=axis_label(X_KEY), y_label=axis_label(v.y_key), vlines=_slo_vline(v),
                       empty_text=v.empty_pareto_text())


def plot_progress_svg(v: _View) -> str:
    """Plot 3: the goal metric trial by trial, the kept configuration's level as a staircase."""
    ticks, pts, kept = {}, [], []
    b = v.baseline_point()
    level = b[1] if b else None
    if level is not None:
        kept.append({"x": 0, "y": level})
        ticks[0] = "base"
    for i, t in enumerate(v.trials, start=1):
        tid = _s(t.get("id")) or str(i)
        ticks[i] = tid
        m = _d(t.get("metrics"))
        y = _num(m.get(v.y_key))
        if t.get("status") == "measured" and t.get("valid") is not False and y is not None:
            x = _num(m.get(X_KEY))
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
    bm = _d(_d(v.baseline.get("metrics")).get(v.y_key))
    mean, sr = _num(bm.get("mean")), _num(bm.get("sigma_rel"))
    if pts and mean is not None and sr is not None:
        bands.append({"lo": mean * (1 - 2 * sr), "hi": mean * (1 + 2 * sr), "label": "baseline ± 2σ", "color": "#666"})
    return svg_lines(series, title=f"{metric_label(v.y_key).capitalize()} trial by trial", x_label="trial (in run order)",
                     y_label=axis_label(v.y_key), hbands=bands, x_tick_labels=ticks if pts else None,
                     empty_text="no measured trial to plot")


# ----------------------------------------------------------------------------- Markdown


def _md(s: Any) -> str:
    """Free text in a Markdown table cell or paragraph: no raw HTML, no broken table."""
    text = _s(s).replace("\r", " ").replace("\n", " ").replace("|", "\\|")
    # Only a '<' that could open a tag, comment or declaration is raw HTML in Markdown; '<= 2000' stays legible.
    return _TAG_START.sub("&lt;", text)


_TAG_START = re.compile(r"<(?=[A-Za-z/!?])")


def _md_code(s: Any) -> str:
    s = _s(s).replace("\r", " ").replace("\n", " ")
    if not s:
        return "–"
    fence = "``" if "`" in s else "`"
    pad = " " if "`" in s else ""
    return f"{fence}{pad}{s}{pad}{fence}".replace("|", "\\|")


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def render_markdown(result: dict) -> str:
    """The whole report as GitHub-flavoured Markdown (the plots are in report.html)."""
    v = _View(result)
    L: list[str] = [f"# {_md(v.title)}", ""]
    if v.simulated:
        L += [f"> **{BANNER}**", ""]
    meta = []
    if v.generated:
        meta.append(f"Generated {_md(v.generated)}")
    if v.server_text():
        meta.append(f"server: {_md(v.server_text())}")
    if meta:
        L += [". ".join(meta) + ".", ""]
    if v.schema and v.schema != SCHEMA:
        L += [f"> Result schema {_md_code(v.schema)}; this renderer knows {_md_code(SCHEMA)}: some parts may be missing.", ""]

    L += ["## Goal", "", _md(v.goal_text()) or "No goal in the result.", ""]
    if v.workload_text():
        L += [f"Workload: {_md(v.workload_text())}.", ""]

    L += ["## Baseline", ""]
    bm = v.baseline_metrics()
    if bm:
        head = f"Configuration {_md_code(config_text(v.baseline.get('config')))}"
        if v.baseline.get("repeats") is not None:
            head += f", {_md(v.baseline['repeats'])} repeats"
        L += [head + "; σ is the relative standard deviation of the repeats, measured now.", ""]
        rows = [[metric_label(k), fmt_metric(m.get("mean"), k), fmt_pct(m.get("sigma_rel"))] for k, m in bm]
        L += _md_table(["metric", "mean", "σ"], rows) + [""]
    else:
        L += ["No baseline in the result.", ""]

    L += [f"## Trials ({len(v.trials)})", ""]
    if v.trials:
        keys = v.trial_metric_keys()
        head = ["trial", "step", "changes", "status", "verdict", "why", "n"] + [axis_label(k) for k in keys]
        rows = []
        for t in v.trials:
            m = _d(t.get("metrics"))
            rows.append([_md_code(t.get("id")), _md(t.get("step")) or "–",
                         _md_code(config_text(t.get("changes") if t.get("changes") is not None else t.get("config"))),
                         _md(v.status_text(t)), _md(v.verdict_text(t)), _md(v.why_text(t)) or "–",
                         _md(t.get("repeats")) if t.get("repeats") is not None else "–"]
                        + [fmt_num(m.get(k)) if _num(m.get(k)) is not None else "–" for k in keys])
        L += _md_table(head, rows) + [""]
    else:
        L += ["No trials were run.", ""]
    if v.steps:
        L += ["Steps:", ""]
        for s in v.steps:
            L.append(f"- {_md(v.step_label(_s(s.get('step'))))} — {_md(s.get('stop_rule')) or 'no stop rule recorded'}")
        L.append("")

    L += ["## Knee", ""]
    if v.knee_id:
        L += [f"**{_md(_knee_line(v))}**", ""]
        if v.knee.get("method"):
            L += [f"Method: {_md(v.knee['method'])}.", ""]
        if v.knee.get("why"):
            L += [f"Why: {_md(v.knee['why'])}", ""]
    else:
        L += ["No knee: " + ("no Pareto front to find it on." if not v.pareto else "the result names none."), ""]

    L += ["## Pareto configurations", ""]
    if v.pareto:
        head = ["trial", "configuration", axis_label(v.y_key), axis_label(X_KEY), "dominance rate", "confirmed",
                "vllm serve flags", "note"]
        rows = []
        for p in v.pareto:
            tid = _s(p.get("trial_id"))
            m = v.metrics_of(tid, p)
            note = ", ".join(v.roles_of(tid))
            rows.append([_md_code(tid), _md_code(config_text(p.get("config"))), fmt_num(m.get(v.y_key)),
                         fmt_num(m.get(X_KEY)), fmt_pct(p.get("dominance_rate")), _md(confirmation_text(p)),
                         _md_code(_flags_text(p.get("serve_flags"))), note or "–"])
        L += _md_table(head, rows) + [""]
        L += [_md(CONFIRMATION_NOTE), ""]
    for d in v.dropped:
        L += [f"- Dropped from the front: {_md_code(_s(d.get('trial_id')))} ({_md_code(config_text(d.get('config')))}), "
              f"claim {_md(_s(d.get('claim')))}: {_md(_s(d.get('decision')))} — {_md(_s(d.get('why')))}"]
    if v.dropped:
        L.append("")
    else:
        L += [v.empty_pareto_text(), ""]

    L += ["## Recommendation", ""]
    if v.rec_id or v.rec.get("config") or v.serve_command():
        L += [f"**{_md(v.rec_id or 'configuration')}** — {_md_code(config_text(v.rec.get('config')))}", ""]
        if v.rec.get("why"):
            L += [_md(v.rec["why"]), ""]
        cmd = v.serve_command()
        if cmd:
            L += ["Deploy with:", "", "```sh", cmd.replace("```", "` ` `"), "```", ""]
    else:
        L += ["No recommendation: " + ("no configuration meets the goal." if v.pareto else "nothing was measured."), ""]

    L += ["## Stop rule", "", _md(v.stop_rule) or "No stop rule recorded.", ""]
    if v.timings_text():
        L += [f"Run: {_md(v.timings_text())}.", ""]

    L += ["## Drift checks", ""]
    if v.drift:
        L += _md_table(["after trial", "changed", "detail"],
                       [[_md_code(d.get("after_trial")), "yes" if d.get("changed") is True else "no" if d.get("changed") is False else "–",
                         _md(d.get("detail")) or "–"] for d in v.drift]) + [""]
    else:
        L += ["No drift check was run.", ""]

    L += ["## Warnings", ""]
    L += ([f"- {_md(w)}" for w in v.warnings] if v.warnings else ["None."]) + [""]

    L += ["## Soak run", "", _md(v.soak) or "No soak recommendation in the result.", ""]
    L += ["Plots: see report.html.", ""]
    return "\n".join(L)


# ----------------------------------------------------------------------------- HTML

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


def _h_table(head: list[str], rows: list[tuple[str, list[str]]], num_cols: Iterable[int] = (),
             col_class: dict | None = None, table_id: str = "") -> str:
    cc = {i: "n" for i in num_cols}
    cc.update(col_class or {})
    out = [f'<table id="{table_id}">' if table_id else "<table>", "<thead><tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr></thead>", "<tbody>"]
    for cls, cells in rows:
        c = f' class="{cls}"' if cls else ""
        out.append(f"<tr{c}>" + "".join(f'<td class="{cc[i]}">{x}</td>' if i in cc else f"<td>{x}</td>"
                                        for i, x in enumerate(cells)) + "</tr>")
    out += ["</tbody>", "</table>"]
    return "\n".join(out)


def _h_code(s: Any) -> str:
    return f"<code>{_e(s)}</code>" if _s(s) else "–"


def _h_flags(flags: Any) -> str:
    """Flags as code, each flag with its value kept on one line."""
    if not (isinstance(flags, list) and flags):
        return "–"
    groups: list[list[str]] = [[]]
    for f in flags:
        if _s(f).startswith("-") and groups[-1]:
            groups.append([])
        groups[-1].append(_s(f))
    return "<code>" + " ".join(f'<span class="nw">{_e(shlex.join(g))}</span>' for g in groups) + "</code>"


def render_html(result: dict) -> str:
    """One self-contained, XHTML-compatible page: inline CSS and SVG, no script, no link."""
    v = _View(result)
    H: list[str] = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8"/>',
                    '<meta name="viewport" content="width=device-width, initial-scale=1"/>',
                    f"<title>{_e(v.title)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>"]
    if v.simulated:
        H.append(f'<div class="banner" id="simulated">{_e(BANNER)}</div>')
    H.append(f"<h1>{_e(v.title)}</h1>")
    meta = [x for x in (f"Generated {v.generated}" if v.generated else "", f"server: {v.server_text()}" if v.server_text() else "") if x]
    if meta:
        H.append(f'<p class="meta">{_e(". ".join(meta))}.</p>')
    if v.schema and v.schema != SCHEMA:
        H.append(f'<p class="note">Result schema {_h_code(v.schema)}; this renderer knows {_h_code(SCHEMA)}: '
                 "some parts may be missing.</p>")

    H.append('<h2 id="goal">Goal</h2>')
    H.append(f"<p><strong>{_e(v.goal_text() or 'No goal in the result.')}</strong></p>")
    if v.workload_text():
        H.append(f"<p>Workload: {_e(v.workload_text())}.</p>")

    H.append('<h2 id="baseline">Baseline</h2>')
    bm = v.baseline_metrics()
    if bm:
        head = f"Configuration {_h_code(config_text(v.baseline.get('config')))}"
        if v.baseline.get("repeats") is not None:
            head += f", {_e(v.baseline['repeats'])} repeats"
        H.append(f"<p>{head}; σ is the relative standard deviation of the repeats, measured now.</p>")
        H.append(_h_table(["metric", "mean", "σ"], [("", [_e(metric_label(k)), _e(fmt_metric(m.get("mean"), k)),
                                                           _e(fmt_pct(m.get("sigma_rel")))]) for k, m in bm], (1, 2)))
    else:
        H.append("<p>No baseline in the result.</p>")

    H.append(f'<h2 id="trials">Trials ({len(v.trials)})</h2>')
    if v.trials:
        keys = v.trial_metric_keys()
        head = ["trial", "step", "changes", "status", "verdict", "why", "n"] + [axis_label(k) for k in keys]
        rows = []
        for t in v.trials:
            m = _d(t.get("metrics"))
            verdict = v.verdict_text(t)
            vcell = f'<span class="v v-{_e(verdict)}">{_e(verdict)}</span>' if t.get("verdict") else "–"
            status = _s(t.get("status"))
            tid = _s(t.get("id"))
            cls = " ".join(c for c in ("kept" if t.get("kept") is True else "",
                                       "hl" if tid and tid in (v.knee_id, v.rec_id) else "") if c)
            title = f' title="{_e(t.get("decision_id"))}"' if t.get("decision_id") else ""
            rows.append((cls, [f"<code{title}>{_e(tid) or '–'}</code>", _e(t.get("step")) or "–",
                               _h_code(config_text(t.get("changes") if t.get("changes") is not None else t.get("config"))),
                               f'<span class="s-{_e(status)}">{_e(v.status_text(t))}</span>', vcell,
                               _e(v.why_text(t)) or "–", _e(t.get("repeats")) if t.get("repeats") is not None else "–"]
                         + [_e(fmt_num(m.get(k))) if _num(m.get(k)) is not None else "–" for k in keys]))
        H.append(_h_table(head, rows, range(7, 7 + len(keys)), {5: "why"}, "trial-table"))
        H.append("<p>A green left edge marks a kept configuration; hover a trial id for its decision id.</p>")
    else:
        H.append("<p>No trials were run.</p>")
    if v.steps:
        H.append("<ul>" + "".join(f"<li>{_e(v.step_label(_s(s.get('step'))))} — "
                                  f"{_e(s.get('stop_rule')) or 'no stop rule recorded'}</li>" for s in v.steps) + "</ul>")
    pts, left = v.plotted()
    cap = f"Figure 1. {len(pts)} measured trial{'s' if len(pts) != 1 else ''}, colour and shape by step"
    if v.baseline_point():
        cap += "; the star is the baseline's mean"
    if v.slo is not None:
        cap += "; right of the dashed line breaks the SLO"
    if left:
        cap += ". Not plotted: " + ", ".join(f"{_s(t.get('id')) or '?'} ({_s(t.get('status')) or 'no status'})" for t in left)
    H.append(f'<figure id="plot-trials">{plot_trials_svg(v)}<figcaption>{_e(cap)}.</figcaption></figure>')
    H.append(f'<figure id="plot-progress">{plot_progress_svg(v)}<figcaption>Figure 2. '
             f"{_e(metric_label(v.y_key).capitalize())} of each measured trial in run order; the line is the "
             "kept configuration's level, the band the baseline's mean ± 2σ.</figcaption></figure>")

    H.append('<h2 id="knee">Knee</h2>')
    if v.knee_id:
        H.append(f"<p><strong>{_e(_knee_line(v))}</strong></p>")
        if v.knee.get("method"):
            H.append(f"<p>Method: {_e(v.knee['method'])}.</p>")
        if v.knee.get("why"):
            H.append(f"<p>Why: {_e(v.knee['why'])}</p>")
    else:
        H.append("<p>No knee: " + ("no Pareto front to find it on." if not v.pareto else "the result names none.") + "</p>")

    H.append('<h2 id="pareto">Pareto configurations</h2>')
    if v.pareto:
        head = ["trial", "configuration", axis_label(v.y_key), axis_label(X_KEY), "dominance rate", "confirmed",
                "vllm serve flags", "note"]
        rows = []
        for p in v.pareto:
            tid = _s(p.get("trial_id"))
            m = v.metrics_of(tid, p)
            note = ", ".join(v.roles_of(tid))
            rows.append(("hl" if note else "", [_h_code(tid), _h_code(config_text(p.get("config"))),
                                               _e(fmt_num(m.get(v.y_key))), _e(fmt_num(m.get(X_KEY))),
                                               _e(fmt_pct(p.get("dominance_rate"))), _e(confirmation_text(p)),
                                               _h_flags(p.get("serve_flags")), _e(note) or "–"]))
        H.append(_h_table(head, rows, (2, 3, 4), table_id="pareto-table"))
        H.append(f"<p>{_e(CONFIRMATION_NOTE)}</p>")
    if v.dropped:
        H.append('<ul id="dropped">' + "".join(
            f"<li>Dropped from the front: {_h_code(_s(d.get('trial_id')))} ({_h_code(config_text(d.get('config')))}), "
            f"claim {_e(_s(d.get('claim')))}: {_e(_s(d.get('decision')))} — {_e(_s(d.get('why')))}</li>" for d in v.dropped) + "</ul>")
    else:
        H.append(f"<p>{_e(v.empty_pareto_text())}</p>")
    H.append(f'<figure id="plot-pareto">{plot_pareto_svg(v)}<figcaption>Figure 3. The Pareto configurations joined '
             "by latency, the knee ringed, the recommendation boxed; grey circles are the other measured trials."
             "</figcaption></figure>")

    H.append('<h2 id="recommendation">Recommendation</h2>')
    if v.rec_id or v.rec.get("config") or v.serve_command():
        H.append(f"<p><strong>{_e(v.rec_id or 'configuration')}</strong> — {_h_code(config_text(v.rec.get('config')))}</p>")
        if v.rec.get("why"):
            H.append(f"<p>{_e(v.rec['why'])}</p>")
        if v.serve_command():
            H.append(f'<p>Deploy with:</p><pre id="serve-command"><code>{_e(v.serve_command())}</code></pre>')
    else:
        H.append("<p>No recommendation: " + ("no configuration meets the goal." if v.pareto else "nothing was measured.")
                 + "</p>")

    H.append('<h2 id="stop-rule">Stop rule</h2>')
    H.append(f"<p>{_e(v.stop_rule or 'No stop rule recorded.')}</p>")
    if v.timings_text():
        H.append(f"<p>Run: {_e(v.timings_text())}.</p>")

    H.append('<h2 id="drift">Drift checks</h2>')
    if v.drift:
        H.append(_h_table(["after trial", "changed", "detail"],
                          [("", [_h_code(d.get("after_trial")),
                                 "yes" if d.get("changed") is True else "no" if d.get("changed") is False else "–",
                                 _e(d.get("detail")) or "–"]) for d in v.drift]))
    else:
        H.append("<p>No drift check was run.</p>")

    H.append('<h2 id="warnings">Warnings</h2>')
    H.append("<ul>" + "".join(f"<li>{_e(w)}</li>" for w in v.warnings) + "</ul>" if v.warnings else "<p>None.</p>")
    H.append('<h2 id="soak">Soak run</h2>')
    H.append(f"<p>{_e(v.soak or 'No soak recommendation in the result.')}</p>")
    H += [f'<p class="meta">Schema {_e(v.schema or "unknown")}. Generated by vkit.</p>', "</body>", "</html>", ""]
    return "\n".join(H)


# ----------------------------------------------------------------------------- terminal

_ANSI = {"K": "1;35", "R": "1;32", "*": "32", "B": "1;36", ":": "31", ".": "2;32"}


def _term_plot(v: _View, width: int, height: int, color: bool) -> list[str]:
    pts, _ = v.plotted()
    front = v.front()
    b = v.baseline_point()
    kp = v.point_of(v.knee_id, v.knee)
    rp = v.point_of(v.rec_id, v.rec)
    xs = [x for _, x, _ in pts] + [x for _, x, _ in front] + ([b[0]] if b else [])
    ys = [y for _, _, y in pts] + [y for _, _, y in front] + ([b[1]] if b else [])
    for extra in (kp, rp):
        if extra:
            xs.append(extra[0])
            ys.append(extra[1])
    if not xs:
        return ["(no measured trial to plot)"]
    x0, x1, xt, xstep = _domain(xs + ([v.slo] if v.slo is not None else []), n=5)
    y0, y1, yt, ystep = _domain(ys, n=4)
    ylabels = {t: _tick_text(t, ystep) for t in yt}
    lw = max(len(s) for s in ylabels.values())
    cols = max(20, width - lw - 2)
    grid = [[" "] * cols for _ in range(height)]
    prio = [[0] * cols for _ in range(height)]

    def cell(x: float, y: float) -> tuple[int, int]:
        c = int(round((x - x0) / (x1 - x0) * (cols - 1)))
        r = int(round((y1 - y) / (y1 - y0) * (height - 1)))
        return min(max(r, 0), height - 1), min(max(c, 0), cols - 1)

    def put(r: int, c: int, ch: str, p: int) -> None:
        if p > prio[r][c]:
            grid[r][c], prio[r][c] = ch, p

    if v.slo is not None:
        _, c = cell(v.slo, y0)
        for r in range(height):
            put(r, c, ":", 1)
    fcells = [cell(x, y) for _, x, y in front]
    for (r0, c0), (r1, c1) in zip(fcells, fcells[1:], strict=False):
        n = max(abs(r1 - r0), abs(c1 - c0))
        for i in range(1, n):
            put(int(round(r0 + (r1 - r0) * i / n)), int(round(c0 + (c1 - c0) * i / n)), ".", 2)
    marks = {}
    for i, step in enumerate(v.step_order):
        marks[step] = step if len(step) == 1 and step != "" else chr(ord("a") + i % 26)
    for t, x, y in pts:
        r, c = cell(x, y)
        put(r, c, marks.get(_s(t.get("step")), "o"), 3)
    if b:
        put(*cell(*b), "B", 4)
    for r, c in fcells:
        put(r, c, "*", 5)
    if rp:
        put(*cell(*rp), "R", 6)
    if kp:
        put(*cell(*kp), "K", 7)
    tick_rows = {cell(x0, t)[0]: ylabels[t] for t in yt}
    lines = []
    for r in range(height):
        lab = tick_rows.get(r, "")
        row = "".join(f"\x1b[{_ANSI[ch]}m{ch}\x1b[0m" if color and ch in _ANSI else ch for ch in grid[r])
        lines.append(f"{lab:>{lw}} {'+' if lab else '|'}{row.rstrip() if not color else row}".rstrip())
    axis = ["-"] * cols
    under = [" "] * cols
    last_end = -2
    for t in xt:
        _, c = cell(t, y0)
        axis[c] = "+"
        s = _tick_text(t, xstep)
        start = min(max(0, c - len(s) // 2), cols - len(s))
        if start > last_end + 1 and start >= 0:
            under[start:start + len(s)] = list(s)
            last_end = start + len(s)
    lines.append(" " * lw + " +" + "".join(axis))
    lines.append(" " * (lw + 2) + "".join(under).rstrip())
    xl = axis_label(X_KEY)
    lines.append(" " * (lw + 2 + max(0, (cols - len(xl)) // 2)) + xl)
    return lines


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


def render_terminal(result: dict, width: int = 78, color: bool = False) -> str:
    """The key facts and a text scatter plot (P95 TTFT across, throughput up) for stderr.

    Marks: a digit per step (the step's number, or a letter), B baseline, * a Pareto
    configuration joined by dots, K the knee, R the recommendation, : the SLO. Where marks
    fall in one cell the later in that list wins. ``color`` adds ANSI colours.
    """
    width = max(40, int(width))
    v = _View(result)
    bold = (lambda s: f"\x1b[1m{s}\x1b[0m") if color else (lambda s: s)
    L: list[str] = []
    head = v.title + (f" — {v.generated}" if v.generated else "")
    L += _wrap(head, width)
    if v.simulated:
        ban = f"!! {BANNER} !!"
        L.append(f"\x1b[1;33m{ban}\x1b[0m" if color else ban)
    if v.server_text():
        L += _wrap(f"Server: {v.server_text()}", width, "  ")
    L += _wrap(f"Goal: {v.goal_text() or 'none in the result'}", width, "  ")
    if v.workload_text():
        L += _wrap(f"Workload: {v.workload_text()}", width, "  ")
    bm = v.baseline_metrics()
    if bm:
        parts = [f"{metric_label(k)} {fmt_metric(m.get('mean'), k)} σ {fmt_pct(m.get('sigma_rel'))}" for k, m in bm]
        rep = f", {v.baseline['repeats']} repeats" if v.baseline.get("repeats") is not None else ""
        L += _wrap(f"Baseline ({config_text(v.baseline.get('config')).strip('()')}{rep}): " + "; ".join(parts), width, "  ")
    else:
        L.append("Baseline: none in the result")
    L.append("")
    if v.trials:
        L.append(bold(f"Trials ({len(v.trials)}):"))
        yh = metric_unit(v.y_key) or metric_label(v.y_key)[:7]
        L.append(f"  {'trial':<5} {'step':>4} {'outcome':<12} {yh:>7} {'P95 ms':>7}  changes")
        for t in v.trials:
            m = _d(t.get("metrics"))
            status = _s(t.get("status")) or "-"
            outcome = (v.verdict_text(t) if status == "measured" else status) + (", kept" if t.get("kept") is True else "")
            changes = config_text(t.get("changes") if t.get("changes") is not None else t.get("config"))
            s = (f"{_s(t.get('id')):<5} {_s(t.get('step')) or '-':>4} {outcome:<12} {fmt_num(m.get(v.y_key)):>7} "
                 f"{fmt_num(m.get(X_KEY)):>7}  {changes}")
            L += _wrap(s, width, " " * (45 if width - 45 >= 32 else 8), "  ")
            why = v.why_text(t)
            if why:
                L += _wrap(f"why: {why}", width, "          ", "        ")
    else:
        L.append("No trials were run.")
    L.append("")
    L.append(bold(f"{metric_label(v.y_key).capitalize()} vs {metric_label(X_KEY)}:"))
    plot = _term_plot(v, width, 15, color)
    L += plot
    legend = []
    for i, step in enumerate(v.step_order):
        ch = step if len(step) == 1 else chr(ord("a") + i % 26)
        legend.append(f"{ch} {v.step_label(step)}")
    legend += ["B baseline", "* Pareto (joined by .)"]
    if v.knee_id and v.knee_id == v.rec_id:
        legend.append("K knee, also the recommendation")
    else:
        legend += ["K knee", "R recommendation"]
    if v.slo is not None:
        legend.append(f": SLO {fmt_metric(v.slo, X_KEY)}")
    if len(plot) > 1:
        L += _pack(legend, width, "  ")
    L.append("")
    if v.knee_id:
        L += _wrap(f"Knee: {_knee_line(v)}" + (f" ({v.knee['method']})" if v.knee.get("method") else ""), width, "  ")
    else:
        L.append("Knee: none" + (" (no Pareto front)" if not v.pareto else ""))
    if v.pareto:
        L.append(bold("Pareto configurations:"))
        for p in v.pareto:
            tid = _s(p.get("trial_id"))
            m = v.metrics_of(tid, p)
            tag = "".join(f" [{n}]" for n in v.roles_of(tid))
            conf = confirmation_text(p)
            s = (f"{tid}{tag}: {fmt_metric(m.get(v.y_key), v.y_key)}, {metric_label(X_KEY)} "
                 f"{fmt_metric(m.get(X_KEY), X_KEY)}, dominance rate {fmt_pct(p.get('dominance_rate'))}"
                 + (f", {conf}" if conf != "–" else "") + f"; {config_text(p.get('config'))}")
            L += _wrap(s, width, "      ", "  ")
        for d in v.dropped:
            L += _wrap(f"dropped from the front: {_s(d.get('trial_id'))} ({config_text(d.get('config'))}), claim "
                       f"{_s(d.get('claim'))}: {_s(d.get('decision'))} — {_s(d.get('why'))}", width, "      ", "  ")
    else:
        L.append(v.empty_pareto_text())
    L.append("")
    if v.rec_id or v.rec.get("config") or v.serve_command():
        L += [bold(f"Recommendation: {v.rec_id or 'configuration'}")]
        L += _wrap(config_text(v.rec.get("config")), width, "  ", "  ")
        if v.rec.get("why"):
            L += _wrap(_s(v.rec["why"]), width, "  ", "  ")
        if v.serve_command():
            L.append("Deploy with:")
            L += _command_lines(v.serve_command(), width)
    else:
        L.append("Recommendation: none" + (" (no configuration meets the goal)" if v.pareto else " (nothing measured)"))
    L.append("")
    L += _wrap(f"Stop rule: {v.stop_rule or 'none recorded'}" + (f" ({v.timings_text()})" if v.timings_text() else ""),
               width, "  ")
    if v.drift:
        changed = [d for d in v.drift if d.get("changed") is True]
        runs = [d.get("runs") for d in v.drift if isinstance(d.get("runs"), int)]
        need = next((d.get("min_runs") for d in v.drift if isinstance(d.get("min_runs"), int)), None)
        series = (f" (series of {', '.join(map(str, runs))} runs of the kept configuration"
                  + (f"; a verdict needs {need}" if need else "") + ")") if runs else ""
        L += _wrap(f"Drift checks: {len(v.drift)}{series}, {len(changed)} with a change", width, "  ")
        for d in changed:
            L += _wrap(f"after {_s(d.get('after_trial'))}: {_s(d.get('detail'))}", width, "      ", "  ")
    else:
        L.append("Drift checks: none")
    if v.warnings:
        L.append(f"Warnings ({len(v.warnings)}):")
        for w in v.warnings:
            L += _wrap(w, width, "    ", "  - ")
    if v.soak:
        L += _wrap(f"Soak: {v.soak}", width, "  ")
    return "\n".join(L) + "\n"


# ----------------------------------------------------------------------------- files


def _atomic_write(path: str, text: str) -> None:
    """vkit's one atomic writer (temp file beside it, fsync, replace), with the report's advice."""
    try:
        atomic_write_text(path, text)
    except StateWriteError as e:
        raise ReportWriteError(f"{e}; choose a writable report directory") from e


def write_report(result: dict, out_dir: str) -> dict:
    """Write ``report.md``, ``report.html`` and ``result.json`` into ``out_dir`` (created when
    missing), each atomically; return ``{"md": path, "html": path, "json": path}``."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ReportWriteError(f"could not create the report directory {out_dir}: "
                               f"{os.strerror(e.errno) if e.errno else e}") from e
    # Render everything before writing anything: a rendering bug leaves no half-written report.
    texts = {
        "md": ("report.md", render_markdown(result)),
        "html": ("report.html", render_html(result)),
        "json": ("result.json", json.dumps(result, indent=2, sort_keys=True, ensure_ascii=False, default=str) + "\n"),
    }
    paths = {}
    for key, (name, text) in texts.items():
        path = os.path.join(out_dir, name)
        _atomic_write(path, text)
        paths[key] = path
    return paths
