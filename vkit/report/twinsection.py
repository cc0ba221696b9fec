"""The report's "Twin vs measured" section (tune --search twin): every configuration the twin proposed,
its predicted SLO capacity with the 90 % interval it was proposed on, and what the server measured."""

from __future__ import annotations

from dataclasses import dataclass, field

from vkit.report.charts import Chart
from vkit.report.model import CODE, STRONG, VALUE, WORDS, Figure, Para, Row, Section, Span, Table, words
from vkit.report.text import as_dict, as_list, as_text, config_text, fmt_num, num
from vkit.report.view import View


@dataclass(kw_only=True)
class TwinSection(Section):
    lines: list[str] = field(default_factory=list)  # one per proposal, for the terminal
    summary: str = ""


def twin_section(v: View) -> TwinSection:
    """Empty (no heading) when the run made no twin proposal; one line when the default search gave way to the staged
    steps (the twin could not calibrate)."""
    tw = as_dict(v.capacity.get("twin"))
    rows = [r for r in as_list(tw.get("rows")) if isinstance(r, dict)]
    if tw.get("fallback"):
        said = f"not used: {as_text(tw.get('fallback'))}; the staged steps searched instead"
        return TwinSection(id="twin", title="Twin vs measured", lines=[said], summary="not used",
                           blocks=[Para([Span(STRONG, "The twin was not used. "), Span(WORDS, said[len('not used: '):] + ".")])])
    if not rows:
        return TwinSection(id="twin")
    def measured(r: dict) -> str:  # the trial's capacity, or why it has none
        return fmt_num(r.get("measured")) if num(r.get("measured")) is not None else as_text(r.get("status"))

    body = []
    for r in rows:
        inside = r.get("inside")
        body.append(Row([Span(CODE, as_text(r.get("trial_id"))), Span(CODE, config_text(r.get("config"))),
                         Span(VALUE, fmt_num(r.get("predicted"))),
                         Span(VALUE, f"{fmt_num(r.get('lo'))}–{fmt_num(r.get('hi'))}"),
                         Span(VALUE, measured(r)),
                         Span(VALUE, "–" if inside is None else "yes" if inside else "no (twin miss)")]))
    rho = num(tw.get("spearman"))
    sha = as_text(tw.get("profile_sha256"))[:12]
    intro = [Span(STRONG, "The twin proposes, the gate decides. "),
             Span(WORDS, f"The simulator fitted to the baseline's load points (profile sha256 {sha}…, rms log error "
                         f"{fmt_num(tw.get('rms_log_error'))}) predicted every configuration's SLO capacity; the server "
                         f"measured those below. Misses (measured outside the interval): {fmt_num(tw.get('misses'))}"
                         + (f"; Spearman of predicted against measured {rho:.2f}." if rho is not None else "."))]
    head = ["trial", "configuration", "predicted (req/s)", "90 % interval", "measured (req/s)", "inside"]
    lines = [f"{as_text(r.get('trial_id'))}: predicted {fmt_num(r.get('predicted'))} [{fmt_num(r.get('lo'))}, "
             f"{fmt_num(r.get('hi'))}], measured {measured(r)}"
             f"{' (twin miss)' if r.get('inside') is False else ''}; {config_text(r.get('config'))}" for r in rows]
    summary = f"misses {fmt_num(tw.get('misses'))}" + (f", Spearman {rho:.2f}" if rho is not None else "")
    return TwinSection(id="twin", title="Twin vs measured", lines=lines, summary=summary, blocks=[
        Para(intro), Table(head, body, {2: "n", 4: "n"}, "twin-table"),
        Para(words("Predicted: the twin's capacity when it proposed the configuration, corrected by the measured "
                   "configuration nearest it; measured: the trial's capacity search on the server.")),
        Figure("plot-twin", twin_chart(rows), words(
            "Figure 5. Each restarted configuration's measured SLO capacity against the twin's prediction, its 90 % "
            "interval as a bar; on the dashed line the twin was exact, a bar that misses the line is a twin miss."))])


def twin_chart(rows: list[dict]) -> Chart:
    """Measured against predicted capacity (req/s) for every proposal the server measured: a point per
    trial, its interval a horizontal bar, and the line measured = predicted."""
    done = [r for r in rows if num(r.get("measured")) is not None and num(r.get("predicted")) is not None]
    series: list[dict] = []
    for r in done:
        tid, m = as_text(r.get("trial_id")), float(r["measured"])
        if num(r.get("lo")) is not None and num(r.get("hi")) is not None:
            series.append({"name": f"{tid} interval", "points": [{"x": float(r["lo"]), "y": m}, {"x": float(r["hi"]), "y": m}],
                           "line": "straight", "markers": False, "color": "#888", "legend": False})
    series.append({"name": "trials", "label": "a restarted configuration (miss: hollow)", "color": "#1f77b4",
                   "points": [{"x": float(r["predicted"]), "y": float(r["measured"]), "id": as_text(r.get("trial_id")),
                               "note": as_text(r.get("trial_id")),
                               "tip": f"{as_text(r.get('trial_id'))} · predicted {fmt_num(r.get('predicted'))} "
                                      f"[{fmt_num(r.get('lo'))}, {fmt_num(r.get('hi'))}] · measured {fmt_num(r.get('measured'))}"}
                              for r in done if r.get("inside") is not False]})
    misses = [r for r in done if r.get("inside") is False]
    if misses:
        series.append({"name": "misses", "label": "a twin miss", "color": "#d62728", "filled": False,
                       "points": [{"x": float(r["predicted"]), "y": float(r["measured"]), "id": as_text(r.get("trial_id")),
                                   "note": as_text(r.get("trial_id"))} for r in misses]})
    ends = [float(x) for r in done for x in (r.get("lo"), r.get("hi"), r.get("measured"), r.get("predicted"))
            if num(x) is not None]
    if ends:
        series.append({"name": "exact", "label": "measured = predicted", "points": [{"x": min(ends), "y": min(ends)},
                       {"x": max(ends), "y": max(ends)}], "line": "straight", "markers": False, "dash": True, "color": "#333"})
    return Chart("scatter", series, title="Measured against predicted SLO capacity", x_label="predicted (req/s)",
                 y_label="measured (req/s)", empty_text="no proposal measured yet")
