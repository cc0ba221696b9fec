"""The section model: the tune result as one ordered list of typed sections, built once.

``build(result)`` reads the result through a ``View`` and returns a ``Report``: the title,
the SIMULATED flag and the sections in report order (intro, goal, baseline, trials, plots,
knee, Pareto, recommendation, stop rule, drift, warnings, soak, end). Each section has its
heading and its body as blocks (paragraphs of spans, tables as header and rows, bullet lists,
the serve command, figures with their chart data), which the Markdown and the HTML renderer
draw the same way, and the facts the terminal's shorter page is made of.

A span says what its text is, and so how each format marks it up and escapes it: vkit's own
``WORDS`` go out as they are; a ``VALUE`` (a number or a label from the result) is escaped in
HTML only; free ``TEXT`` from the result is escaped in both documents; ``CODE``, ``FLAGS``,
``STRONG``, ``TRIAL``, ``VERDICT`` and ``STATUS`` are marked up by each format its own way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vkit.report import plots
from vkit.report.charts import Chart
from vkit.report.text import (
    CONFIRMATION_NOTE,
    SCHEMA,
    as_dict,
    as_text,
    axis_label,
    config_text,
    confirmation_text,
    fmt_metric,
    fmt_num,
    fmt_pct,
    metric_label,
    num,
    upper_first,
)
from vkit.report.view import View
from vkit.tune.result import TuneResult

WORDS, VALUE, TEXT, CODE, FLAGS, STRONG = "words", "value", "text", "code", "flags", "strong"
TRIAL, VERDICT, STATUS = "trial", "verdict", "status"


# ----------------------------------------------------------------------------- blocks


@dataclass(frozen=True)
class Span:
    """A piece of inline text of one ``kind``; ``attr`` is a trial's decision id (TRIAL) or
    the raw status (STATUS), ``flags`` the flag list (FLAGS)."""

    kind: str
    text: str = ""
    attr: str = ""
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Para:
    """A paragraph. ``style``: "" plain, "lead" (the goal, bold on the page), "meta" (small
    print), "note" (a caution). ``only``: "markdown" or "html" when one document alone shows it."""

    spans: list[Span]
    style: str = ""
    only: str = ""


@dataclass(frozen=True)
class Row:
    cells: list[Span]
    cls: str = ""  # "kept", "hl" (the knee or the recommendation): the page marks the row


@dataclass(frozen=True)
class Table:
    """A table as header and rows. The column names go out as VALUE spans do (as they are in
    Markdown, escaped on the page); ``classes`` maps a column to its class there ("n": numbers)."""

    head: list[str]
    rows: list[Row]
    classes: dict[int, str] = field(default_factory=dict)
    id: str = ""


@dataclass(frozen=True)
class Bullets:
    """A bulleted list, an item a list of spans."""

    items: list[list[Span]]
    id: str = ""


@dataclass(frozen=True)
class Command:
    """The ``vllm serve`` command to deploy with."""

    text: str
    id: str = "serve-command"


@dataclass(frozen=True)
class Figure:
    """A chart with its caption; only the page draws figures (the Markdown points to it)."""

    id: str
    chart: Chart
    caption: list[Span]


Block = Para | Table | Bullets | Command | Figure


# ----------------------------------------------------------------------------- sections


@dataclass(kw_only=True)
class Section:
    """A heading (none when ``title`` is empty), its anchor ``id`` and its body."""

    id: str
    title: str = ""
    blocks: list[Block] = field(default_factory=list)


@dataclass(kw_only=True)
class Intro(Section):
    generated: str
    server: str


@dataclass(kw_only=True)
class Goal(Section):
    goal: str
    workload: str


@dataclass(kw_only=True)
class Baseline(Section):
    config: str
    repeats: str | None
    metrics: list[tuple[str, str, str]]  # (label, mean, σ)
    parts: str = ""  # σ's within-process and between-restart parts, when the baseline measured both


@dataclass(frozen=True)
class TrialRow:
    """One trial's facts, for the trial table and the terminal's list."""

    id: str
    step: str
    changes: str
    status: str  # as the result gives it ("measured", "start_failed", …)
    status_text: str  # with ", kept"
    verdict: str  # "–" when there is none
    has_verdict: bool
    why: str
    repeats: str | None
    kept: bool
    highlighted: bool  # the knee or the recommendation
    decision_id: str
    metrics: dict


@dataclass(kw_only=True)
class Trials(Section):
    y_key: str
    x_key: str
    rows: list[TrialRow]


@dataclass(kw_only=True)
class Plots(Section):
    plot: plots.TextPlot


@dataclass(kw_only=True)
class Knee(Section):
    trial_id: str
    line: str
    method: str
    has_front: bool


@dataclass(frozen=True)
class ParetoRow:
    """One Pareto configuration's facts, for the Pareto table and the terminal's list."""

    trial_id: str
    config: str
    roles: list[str]  # "knee", "recommended"
    y: Any  # the goal metric as the result gives it
    x: Any  # the latency as the result gives it
    dominance: str
    confirmation: str
    flags: tuple[str, ...]


@dataclass(frozen=True)
class Dropped:
    """A configuration dropped from the front when it was re-confirmed."""

    trial_id: str
    config: str
    claim: str
    decision: str
    why: str


@dataclass(kw_only=True)
class Pareto(Section):
    y_key: str
    x_key: str
    rows: list[ParetoRow]
    dropped: list[Dropped]
    empty: str  # the sentence for no front


@dataclass(frozen=True)
class CapacityRow:
    """One configuration's SLO capacity, for the capacity table and the terminal's list."""

    trial_id: str
    config: str
    capacity: str  # req/s: the estimate over the configuration's searches
    interval: str  # its 95 % interval, "lo–hi"
    tok_s: str  # output tok/s at the capacity
    per_user: str  # output tok/s per user at the reference load
    binding: str
    searches: str
    spark: str  # the binding metric along the load points, as block characters


@dataclass(kw_only=True)
class CapacitySection(Section):
    reference: str
    rows: list[CapacityRow]


@dataclass(kw_only=True)
class Recommendation(Section):
    present: bool
    trial_id: str
    config: str
    why: str
    command: str
    has_front: bool


@dataclass(kw_only=True)
class StopRule(Section):
    rule: str
    timings: str


@dataclass(kw_only=True)
class Drift(Section):
    count: int
    runs: list[int]  # the sentinel series' lengths
    need: int | None  # the runs the detectors need (below: the start-level check)
    changed: list[tuple[str, str]]  # (after trial, detail) of each check that saw a change


@dataclass(kw_only=True)
class Warnings(Section):
    items: list[str]


@dataclass(kw_only=True)
class Soak(Section):
    text: str


@dataclass(frozen=True)
class Report:
    """The section model: the title, the SIMULATED flag and the sections in report order."""

    title: str
    simulated: bool
    sections: list[Section]


# ----------------------------------------------------------------------------- building


def words(text: str) -> list[Span]:
    return [Span(WORDS, text)]


def _text_or(s: str, missing: str) -> Span:
    """The result's text, or vkit's words for it missing."""
    return Span(TEXT, s) if s else Span(WORDS, missing)


def _text_or_dash(s: str) -> Span:
    return _text_or(s, "–")


def _flags(flags: Any) -> tuple[str, ...]:
    return tuple(as_text(f) for f in flags) if isinstance(flags, list) and flags else ()


def _intro(v: View) -> Intro:
    meta: list[Span] = []
    for label, value in (("Generated ", v.generated), ("server: ", v.server_text())):
        if value:
            meta += ([Span(WORDS, ". ")] if meta else []) + [Span(WORDS, label), Span(TEXT, value)]
    blocks: list[Block] = [Para(meta + [Span(WORDS, ".")], "meta")] if meta else []
    if v.schema and v.schema != SCHEMA:
        blocks.append(Para([Span(WORDS, "Result schema "), Span(CODE, v.schema), Span(WORDS, "; this renderer knows "),
                            Span(CODE, SCHEMA), Span(WORDS, ": some parts may be missing.")], "note"))
    return Intro(id="intro", blocks=blocks, generated=v.generated, server=v.server_text())


def _goal(v: View) -> Goal:
    goal, workload = v.goal_text(), v.workload_text()
    blocks: list[Block] = [Para([_text_or(goal, "No goal in the result.")], "lead")]
    if workload:
        blocks.append(Para([Span(WORDS, "Workload: "), Span(TEXT, workload), Span(WORDS, ".")]))
    return Goal(id="goal", title="Goal", blocks=blocks, goal=goal, workload=workload)


def _baseline(v: View) -> Baseline:
    config = config_text(v.baseline.get("config"))
    repeats = as_text(v.baseline["repeats"]) if v.baseline.get("repeats") is not None else None
    metrics = [(metric_label(k), fmt_metric(m.get("mean"), k), fmt_pct(m.get("sigma_rel"))) for k, m in v.baseline_metrics()]
    if metrics:
        head = [Span(WORDS, "Configuration "), Span(CODE, config)]
        if repeats is not None:
            head += [Span(WORDS, ", "), Span(TEXT, repeats), Span(WORDS, " repeats")]
        head.append(Span(WORDS, "; σ is the relative standard deviation of the repeats, measured now."))
        comps = as_dict(v.baseline.get("sigma_components"))
        split = any(num(as_dict(c).get("between")) is not None for c in comps.values())
        rows = []
        for (k, _), cells in zip(v.baseline_metrics(), metrics, strict=True):
            c = as_dict(comps.get(k))
            extra = [fmt_pct(c.get("within")) if num(c.get("within")) is not None else "–",
                     fmt_pct(c.get("between")) if num(c.get("between")) is not None else "–"] if split else []
            rows.append(Row([Span(VALUE, x) for x in [*cells, *extra]]))
        cols = ["metric", "mean", "σ"] + (["σ within a process", "σ between restarts"] if split else [])
        blocks: list[Block] = [Para(head), Table(cols, rows, {i: "n" for i in range(1, len(cols))})]
        parts = sigma_parts_text(comps)
        if parts:
            blocks.append(Para([Span(TEXT, parts)]))
    else:
        blocks, parts = [Para(words("No baseline in the result."))], ""
    return Baseline(id="baseline", title="Baseline", blocks=blocks, config=config, repeats=repeats, metrics=metrics, parts=parts)


def sigma_parts_text(comps: dict) -> str:
    """One sentence on σ's two parts for the first metric that has both (the objective's first)."""
    for k in ("slo_capacity", "output_throughput", *comps):
        c = as_dict(comps.get(k))
        if num(c.get("between")) is None or num(c.get("within")) is None:
            continue
        wl, wh = (list(c.get("within_ci") or []) + [None, None])[:2]
        bl, bh = (list(c.get("between_ci") or []) + [None, None])[:2]
        return (f"σ of {metric_label(k)}: within one server process {fmt_pct(c['within'])} (90 % interval "
                f"{fmt_pct(wl)}–{fmt_pct(wh)}), between restarts {fmt_pct(c['between'])} ({fmt_pct(bl)}–{fmt_pct(bh)}), "
                f"from {c.get('runs')} runs on {c.get('groups')} server starts. Every comparison of two configurations "
                "compares two processes, so the gate's σ carries both parts: for runs that share one process, "
                "sqrt(within² + n·between²) per run.")
    return ""


def _trial_row(v: View, t: dict) -> TrialRow:
    tid = as_text(t.get("id"))
    return TrialRow(id=tid, step=as_text(t.get("step")),
                    changes=config_text(t.get("changes") if t.get("changes") is not None else t.get("config")),
                    status=as_text(t.get("status")), status_text=v.status_text(t), verdict=v.verdict_text(t),
                    has_verdict=bool(t.get("verdict")), why=v.why_text(t),
                    repeats=as_text(t["repeats"]) if t.get("repeats") is not None else None, kept=t.get("kept") is True,
                    highlighted=bool(tid and tid in (v.knee_id, v.rec_id)),
                    decision_id=as_text(t.get("decision_id")) if t.get("decision_id") else "",
                    metrics=as_dict(t.get("metrics")))


def _trial_table(rows: list[TrialRow], keys: list[str]) -> Table:
    """Every trial with its verdict and why, and the key metrics."""
    head = ["trial", "step", "changes", "status", "verdict", "why", "n"] + [axis_label(k) for k in keys]
    body = []
    for r in rows:
        cells = [Span(TRIAL, r.id, r.decision_id), _text_or_dash(r.step), Span(CODE, r.changes),
                 Span(STATUS, r.status_text, r.status), Span(VERDICT, r.verdict) if r.has_verdict else Span(WORDS, "–"),
                 _text_or_dash(r.why), Span(TEXT, r.repeats) if r.repeats is not None else Span(WORDS, "–")]
        cells += [Span(VALUE, fmt_num(r.metrics.get(k))) if num(r.metrics.get(k)) is not None else Span(WORDS, "–")
                  for k in keys]
        body.append(Row(cells, " ".join(c for c, on in (("kept", r.kept), ("hl", r.highlighted)) if on)))
    classes = {i: "n" for i in range(7, 7 + len(keys))} | {5: "why"}
    return Table(head, body, classes, "trial-table")


def _trials(v: View) -> Trials:
    rows = [_trial_row(v, t) for t in v.trials]
    blocks: list[Block] = []
    if rows:
        blocks.append(_trial_table(rows, v.trial_metric_keys()))
        blocks.append(Para(words("A green left edge marks a kept configuration; hover a trial id for its decision id."),
                           only="html"))
    else:
        blocks.append(Para(words("No trials were run.")))
    if v.steps:
        blocks.append(Para(words("Steps:"), only="markdown"))
        blocks.append(Bullets([[Span(TEXT, v.step_label(as_text(s.get("step")))), Span(WORDS, " — "),
                                _text_or(as_text(s.get("stop_rule")), "no stop rule recorded")] for s in v.steps]))
    return Trials(id="trials", title=f"Trials ({len(rows)})", blocks=blocks, y_key=v.y_key, x_key=v.x_key, rows=rows)


def _plots(v: View) -> Plots:
    pts, left = v.plotted()
    cap = f"Figure 1. {len(pts)} measured trial{'s' if len(pts) != 1 else ''}, colour and shape by step"
    if v.baseline_point():
        cap += "; the star is the baseline's mean"
    if v.slo is not None:
        cap += "; right of the dashed line breaks the SLO"
    if left:
        cap += ". Not plotted: " + ", ".join(f"{as_text(t.get('id')) or '?'} ({as_text(t.get('status')) or 'no status'})"
                                             for t in left)
    progress = [Span(WORDS, "Figure 2. "), Span(VALUE, upper_first(metric_label(v.y_key))),
                Span(WORDS, " of each measured trial in run order; the line is the kept configuration's level, "
                            "the band the baseline's mean ± 2σ.")]
    blocks: list[Block] = [Figure("plot-trials", plots.trials_chart(v), [Span(TEXT, cap), Span(WORDS, ".")]),
                           Figure("plot-progress", plots.progress_chart(v), progress)]
    return Plots(id="plots", blocks=blocks, plot=plots.text_plot(v))


def _knee(v: View) -> Knee:
    method = as_text(v.knee["method"]) if v.knee.get("method") else ""
    if v.knee_id:
        blocks: list[Block] = [Para([Span(STRONG, v.knee_line())])]
        if method:
            blocks.append(Para([Span(WORDS, "Method: "), Span(TEXT, method), Span(WORDS, ".")]))
        if v.knee.get("why"):
            blocks.append(Para([Span(WORDS, "Why: "), Span(TEXT, as_text(v.knee["why"]))]))
    else:
        blocks = [Para(words("No knee: " + ("no Pareto front to find it on." if not v.pareto else "the result names none.")))]
    return Knee(id="knee", title="Knee", blocks=blocks, trial_id=v.knee_id, line=v.knee_line() if v.knee_id else "",
                method=method, has_front=bool(v.pareto))


def _pareto_row(v: View, p: dict) -> ParetoRow:
    tid = as_text(p.get("trial_id"))
    m = v.metrics_of(tid, p)
    return ParetoRow(trial_id=tid, config=config_text(p.get("config")), roles=v.roles_of(tid), y=m.get(v.y_key),
                     x=m.get(v.x_key), dominance=fmt_pct(p.get("dominance_rate")), confirmation=confirmation_text(p),
                     flags=_flags(p.get("serve_flags")))


def _pareto_table(v: View, rows: list[ParetoRow]) -> Table:
    """The Pareto configurations: one table for every format that draws tables."""
    head = ["trial", "configuration", axis_label(v.y_key), axis_label(v.x_key), "dominance rate", "confirmed",
            "vllm serve flags", "note"]
    body = [Row([Span(CODE, r.trial_id), Span(CODE, r.config), Span(VALUE, fmt_num(r.y)), Span(VALUE, fmt_num(r.x)),
                 Span(VALUE, r.dominance), Span(TEXT, r.confirmation), Span(FLAGS, flags=r.flags),
                 Span(VALUE, ", ".join(r.roles) or "–")], "hl" if r.roles else "") for r in rows]
    return Table(head, body, {2: "n", 3: "n", 4: "n"}, "pareto-table")


def _dropped_item(d: Dropped) -> list[Span]:
    return [Span(WORDS, "Dropped from the front: "), Span(CODE, d.trial_id), Span(WORDS, " ("), Span(CODE, d.config),
            Span(WORDS, "), claim "), Span(TEXT, d.claim), Span(WORDS, ": "), Span(TEXT, d.decision), Span(WORDS, " — "),
            Span(TEXT, d.why)]


def _pareto(v: View) -> Pareto:
    rows = [_pareto_row(v, p) for p in v.pareto]
    dropped = [Dropped(trial_id=as_text(d.get("trial_id")), config=config_text(d.get("config")), claim=as_text(d.get("claim")),
                       decision=as_text(d.get("decision")), why=as_text(d.get("why"))) for d in v.dropped]
    blocks: list[Block] = [_pareto_table(v, rows), Para([Span(TEXT, CONFIRMATION_NOTE)])] if rows else []
    if dropped:
        blocks.append(Bullets([_dropped_item(d) for d in dropped], "dropped"))
    elif not rows:
        blocks.append(Para(words(v.empty_pareto_text())))
    blocks.append(Figure("plot-pareto", plots.pareto_chart(v), words(
        "Figure 3. The Pareto configurations joined by latency, the knee ringed, the recommendation boxed; "
        "grey circles are the other measured trials.")))
    return Pareto(id="pareto", title="Pareto configurations", blocks=blocks, y_key=v.y_key, x_key=v.x_key, rows=rows, dropped=dropped,
                  empty=v.empty_pareto_text())


def reference_source(v: View) -> str:
    """Where the reference load came from: the required capacity (j-per-token), else the first baseline search."""
    return "the required capacity" if v.goal.get("required_capacity") is not None else "the first baseline search's capacity"


def _capacity(v: View) -> CapacitySection:
    """The capacity objective: every measured configuration's SLO capacity and its load–latency curve."""
    rows = []
    limits = as_dict(as_dict(v.capacity.get("settings")).get("slo"))
    for tid, cfg, c in v.capacity_rows():
        metric = as_text(c.get("binding_slo"))
        curve_metric = metric if metric in limits else next(iter(limits), "")
        curve = sorted((p for p in c.get("curve") or [] if isinstance(p, dict) and num(p.get("load")) is not None),
                       key=lambda p: p["load"])
        spark = plots.sparkline([as_dict(p.get("metrics")).get(curve_metric) for p in curve]) if curve_metric else ""
        ci = c.get("interval") if isinstance(c.get("interval"), list) and len(c["interval"]) == 2 else [None, None]
        rows.append(CapacityRow(trial_id=tid, config=cfg, capacity=fmt_num(c.get("estimate")),
                                interval=f"{fmt_num(ci[0])}–{fmt_num(ci[1])}", tok_s=fmt_num(c.get("output_tok_s")),
                                per_user=fmt_num(c.get("ref_per_user_output_tok_s")), binding=metric or "–",
                                searches=as_text(c.get("searches")), spark=spark))
    ref = fmt_num(v.capacity.get("reference_load"))
    if not rows:
        return CapacitySection(id="capacity", blocks=[], reference=ref, rows=[])
    head = ["trial", "configuration", "capacity (req/s)", "95 % interval", "output tok/s at capacity",
            f"per-user tok/s at {ref} req/s", "binding SLO", "searches", "curve"]
    body = [Row([Span(CODE, r.trial_id), Span(CODE, r.config), Span(VALUE, r.capacity), Span(VALUE, r.interval),
                 Span(VALUE, r.tok_s), Span(VALUE, r.per_user), Span(VALUE, r.binding),
                 Span(VALUE, r.searches), Span(VALUE, r.spark or "–")]) for r in rows]
    promise = as_dict(as_dict(v.rec.get("capacity")).get("verified"))
    promised = []
    if promise:
        got, searched = fmt_num(as_dict(v.rec.get("capacity")).get("req_s")), fmt_num(as_dict(v.rec.get("capacity")).get("searched_req_s"))
        tried = ", ".join(f"{fmt_num(r.get('load'))} " + ("held" if r.get("holds") else r.get("verdict") or "again")
                          for r in promise.get("runs") or [])
        promised = [Para([Span(STRONG, "Promise: "), Span(VALUE, got if got != "–" else "none held"),
                          Span(WORDS, f" req/s for the recommendation, verified by {fmt_num(promise.get('held_seconds') or promise.get('seconds'))}-second runs "
                                      f"on a fresh start (the searches' figure: {searched}; runs: {tried}). A short load point "
                                      "cannot show a queue that grows slowly; a long run can.")])]
    blocks: list[Block] = [*promised,
        Para(words("SLO capacity: the highest open-loop request rate at which every SLO holds: where the binding SLO's "
                   "fitted margin crosses zero, the geometric mean over a configuration's searches, with its 95 % interval "
                   "(the searches' spread, at least their own sd). It is what the gate compares and what the promise verifies. Per-user output is 1000 / mean TPOT at "
                   f"the reference load ({ref} req/s, {reference_source(v)}).")),
        Table(head, body, {2: "n", 4: "n", 5: "n"}, "capacity-table"),
        Figure("plot-capacity", plots.capacity_chart(v), words(
            "Figure 4. Each configuration's first capacity search: the binding SLO's metric at every load offered, "
            "the SLO as a line."))]
    return CapacitySection(id="capacity", title="SLO capacity", blocks=blocks, reference=ref, rows=rows)


def _recommendation(v: View) -> Recommendation:
    present = bool(v.rec_id or v.rec.get("config") or v.serve_command())
    config, why, cmd = config_text(v.rec.get("config")), as_text(v.rec["why"]) if v.rec.get("why") else "", v.serve_command()
    if present:
        blocks: list[Block] = [Para([Span(STRONG, v.rec_id or "configuration"), Span(WORDS, " — "), Span(CODE, config)])]
        if why:
            blocks.append(Para([Span(TEXT, why)]))
        if cmd:
            blocks.append(Command(cmd))
    else:
        blocks = [Para(words("No recommendation: " + ("no configuration meets the goal." if v.pareto
                                                      else "nothing was measured.")))]
    return Recommendation(id="recommendation", title="Recommendation", blocks=blocks, present=present, trial_id=v.rec_id,
                          config=config, why=why, command=cmd, has_front=bool(v.pareto))


def _stop_rule(v: View) -> StopRule:
    blocks: list[Block] = [Para([_text_or(v.stop_rule, "No stop rule recorded.")])]
    if v.timings_text():
        blocks.append(Para([Span(WORDS, "Run: "), Span(TEXT, v.timings_text()), Span(WORDS, ".")]))
    return StopRule(id="stop-rule", title="Stop rule", blocks=blocks, rule=v.stop_rule, timings=v.timings_text())


def _drift(v: View) -> Drift:
    def changed(d: dict) -> str:
        return "yes" if d.get("changed") is True else "no" if d.get("changed") is False else "–"

    if v.drift:
        rows = [Row([Span(CODE, as_text(d.get("after_trial"))), Span(WORDS, changed(d)),
                     _text_or_dash(as_text(d.get("detail")))]) for d in v.drift]
        blocks: list[Block] = [Table(["after trial", "changed", "detail"], rows)]
    else:
        blocks = [Para(words("No drift check was run."))]
    return Drift(id="drift", title="Drift checks", blocks=blocks, count=len(v.drift),
                 runs=[d["runs"] for d in v.drift if isinstance(d.get("runs"), int)],
                 need=next((d["min_runs"] for d in v.drift if isinstance(d.get("min_runs"), int)), None),
                 changed=[(as_text(d.get("after_trial")), as_text(d.get("detail"))) for d in v.drift
                          if d.get("changed") is True])


def _warnings(v: View) -> Warnings:
    blocks: list[Block] = [Bullets([[Span(TEXT, w)] for w in v.warnings])] if v.warnings else [Para(words("None."))]
    return Warnings(id="warnings", title="Warnings", blocks=blocks, items=v.warnings)


def _soak(v: View) -> Soak:
    blocks: list[Block] = [Para([_text_or(v.soak, "No soak recommendation in the result.")])]
    return Soak(id="soak", title="Soak run", blocks=blocks, text=v.soak)


def _end(v: View) -> Section:
    """The Markdown's pointer to the plots; the page's footer."""
    return Section(id="end", blocks=[
        Para(words("Plots: see report.html."), only="markdown"),
        Para([Span(WORDS, "Schema "), Span(TEXT, v.schema or "unknown"), Span(WORDS, ". Generated by vkit.")], "meta",
             only="html")])


def build(result: Any) -> Report:
    """The section model of a tune result: a :class:`TuneResult`, or any value (a ``result.json``
    of another version, a partial dict): what is not a result reads as empty."""
    v = View(result.to_dict() if isinstance(result, TuneResult) else result)
    from vkit.report.achievedsection import achieved_section  # these build on this module's blocks
    from vkit.report.energysection import energy_section
    from vkit.report.twinsection import twin_section

    sections = [step(v) for step in (_intro, achieved_section, _goal, _baseline, _trials, _plots, _capacity, twin_section, energy_section, _knee, _pareto,
                                     _recommendation, _stop_rule, _drift, _warnings, _soak, _end)]
    return Report(title=v.title, simulated=v.simulated, sections=sections)
