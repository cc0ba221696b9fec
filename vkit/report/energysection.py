"""The report's "Energy" section: each measured configuration's board energy per output token at its capacity
(or at the run's load), the configuration with the most capacity beside the one with the fewest joules per
token and their gap, and Figure 6 (output tokens/s per accelerator against tokens/s per user, coloured by
J/token). Board power only: no host, network or cooling."""

from __future__ import annotations

from dataclasses import dataclass, field

from vkit.report.charts import Chart
from vkit.report.model import CODE, STRONG, VALUE, WORDS, Figure, Para, Row, Section, Span, Table, words
from vkit.report.text import as_dict, as_text, config_text, fmt_num, num, upper_first
from vkit.report.view import View

# J/token classes, fewest first (Okabe–Ito: green, yellow, vermillion)
CLASS_COLORS = ("#009E73", "#E69F00", "#D55E00")


@dataclass(kw_only=True)
class EnergySection(Section):
    lines: list[str] = field(default_factory=list)  # for the terminal


@dataclass(frozen=True)
class Point:
    tid: str
    config: str
    capacity: float | None  # req/s (capacity objective) or None
    tok_s: float  # output tokens/s at the capacity (or at the run's load)
    per_user: float | None  # output tokens/s one user sees
    j_per_token: float
    watts: float | None
    ref_j: float | None = None  # J per output token at the reference load (the required capacity, j-per-token)


def points(v: View) -> list[Point]:
    """Measured trials with board energy; under the capacity objective only those with a capacity (step 1's
    single runs at one load are another measurement)."""
    out = []
    by_capacity = any(num(as_dict(t.get("metrics")).get("slo_capacity")) is not None for t in v.trials)
    for t in v.trials:
        m = as_dict(t.get("metrics"))
        j = num(m.get("j_per_output_token"))
        cap = num(m.get("slo_capacity"))
        if t.get("status") != "measured" or t.get("valid") is False or j is None or (by_capacity and cap is None):
            continue
        tok = num(m.get("capacity_output_tok_s")) if cap is not None else num(m.get("output_throughput"))
        tpot = num(m.get("ref_mean_tpot_ms")) if cap is not None else num(m.get("mean_tpot_ms"))
        if tok is None:
            continue
        per_user = num(m.get("ref_per_user_output_tok_s")) or (1000.0 / tpot if tpot else None)
        w = num(m.get("mean_power_w"))
        out.append(Point(as_text(t.get("id")), config_text(t.get("config")), cap, tok, per_user, j, w,
                         num(m.get("ref_j_per_output_token"))))
    return out


def val(p: Point) -> float:
    """What the objective ranks by: the capacity (req/s), or the output throughput at one load."""
    return p.capacity if p.capacity is not None else p.tok_s


def energy_section(v: View) -> EnergySection:
    """Empty (no heading) when no trial carries board energy."""
    pts = points(v)
    if not pts:
        return EnergySection(id="energy")
    acc = num(as_dict(v.capacity.get("settings")).get("accelerators"))
    by_cap = max(pts, key=val)
    by_j = min(pts, key=lambda p: p.j_per_token)
    what = "capacity" if by_cap.capacity is not None else "output throughput"
    if by_cap.tid == by_j.tid:
        gap = f"the same configuration carries the most {what} and spends the fewest J per output token ({by_cap.tid})."
    else:
        gap = (f"the most {what}: {by_cap.tid} ({fmt_num(val(by_cap))}, {fmt_num(by_cap.j_per_token)} J/token); the fewest "
               f"J per output token: {by_j.tid} ({fmt_num(by_j.j_per_token)} J/token, {fmt_num(val(by_j))}): "
               f"{1 - by_j.j_per_token / by_cap.j_per_token:.0%} fewer joules per token for "
               f"{1 - val(by_j) / val(by_cap):.0%} less {what}.")
    req = num(v.goal.get("required_capacity"))
    head = ["trial", "configuration", "capacity (req/s)" if by_cap.capacity is not None else "output (tok/s)",
            "J per output token", "board power (W)", "output tok/s per kW"] + ([f"J/token at {fmt_num(req)}"] if req else [])
    body = [Row([Span(CODE, p.tid), Span(CODE, p.config), Span(VALUE, fmt_num(val(p))), Span(VALUE, fmt_num(p.j_per_token)),
                 Span(VALUE, fmt_num(p.watts)), Span(VALUE, fmt_num(p.tok_s / (p.watts / 1000.0) if p.watts else None)),
                 *([Span(VALUE, fmt_num(p.ref_j))] if req else [])])
            for p in sorted(pts, key=lambda p: p.j_per_token)]
    lines = [gap] + [f"{p.tid}: {fmt_num(p.j_per_token)} J/token, {fmt_num(p.watts)} W, {fmt_num(val(p))}; {p.config}"
                     for p in sorted(pts, key=lambda p: p.j_per_token)[:5]]
    where = "at each configuration's SLO capacity" if by_cap.capacity is not None else "at the workload's load"
    rec = " ".join(x for x in (recommended(v), at_required(v, pts, req)) if x)
    if rec:
        lines.insert(1, rec)
    return EnergySection(id="energy", title="Energy", lines=lines, blocks=[*([Para(words(rec))] if rec else []),
        Para([Span(STRONG, "Board energy "), Span(WORDS, f"{where}, from the accelerators' own power readings (an energy "
                                                         "counter where the driver has one); the boards only, no host, "
                                                         "network or cooling. ")]),
        Para(words(upper_first(gap))),
        Table(head, body, {k: "n" for k in range(2, len(head))}, "energy-table"),
        Figure("plot-energy", energy_chart(pts, acc), words(
            "Figure 6. Output tokens/s " + ("per accelerator " if acc else "of the server ") + f"{where} against the "
            "tokens/s one user sees, each configuration coloured by its J per output token (thirds, fewest green)."))])


def recommended(v: View) -> str:
    """The recommendation's energy and cost at its capacity, in one sentence ("" without them)."""
    e = as_dict(as_dict(v.rec.get("capacity")).get("energy"))
    if not e.get("available"):
        return ""
    out = (f"The recommendation at its capacity: {fmt_num(e.get('j_per_output_token'))} J per output token, "
           f"{fmt_num(e.get('mean_w'))} W of board power, {fmt_num(e.get('output_tok_s_per_kw'))} output tok/s per kW")
    cost = as_dict(e.get("cost_per_m_output_tokens"))
    if num(cost.get("total")) is not None:
        out += (f"; {fmt_num(cost.get('total'))} per million output tokens (accelerators {fmt_num(cost.get('accelerators'))}, "
                f"energy {fmt_num(cost.get('energy'))})")
    return out + "."


def at_required(v: View, pts: list[Point], req: float | None) -> str:
    """--objective j-per-token: the recommendation's J per output token at the required load, and the range
    over the measured configurations there ("" for another objective)."""
    there = [p.ref_j for p in pts if p.ref_j is not None]
    if not req or not there:
        return ""
    mine = next((p.ref_j for p in pts if p.tid == as_text(v.rec.get("trial_id"))), None)
    head = f"At the required {fmt_num(req)} req/s: " + (f"{fmt_num(mine)} J per output token for the recommendation; " if mine else "")
    return head + f"{fmt_num(min(there))}–{fmt_num(max(there))} over the {len(there)} configurations measured there."


def energy_chart(pts: list[Point], accelerators: float | None) -> Chart:
    ok = sorted((p for p in pts if p.per_user is not None), key=lambda p: p.j_per_token)
    series = []
    n = len(ok)
    for k in range(3):
        part = ok[k * n // 3:(k + 1) * n // 3]
        if not part:
            continue
        lo, hi = part[0].j_per_token, part[-1].j_per_token
        series.append({"name": f"j{k}", "label": f"{fmt_num(lo)}–{fmt_num(hi)} J/token", "color": CLASS_COLORS[k],
                       "shape": "circle", "size": 5,
                       "points": [{"x": p.per_user, "y": p.tok_s / (accelerators or 1), "id": p.tid, "note": p.tid,
                                   "tip": f"{p.tid} · {p.config} · {fmt_num(p.j_per_token)} J/token · {fmt_num(p.watts)} W"}
                                  for p in part]})
    return Chart("scatter", series, title="Throughput per accelerator against per-user speed, by J per output token",
                 x_label="output tok/s per user", y_label="output tok/s per accelerator" if accelerators else "output tok/s",
                 empty_text="no configuration with board energy and a per-user speed")
