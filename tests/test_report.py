"""The tune report: Markdown, the self-contained HTML page with its SVG plots, the terminal plot."""

from __future__ import annotations

import copy
import html.parser
import json
import os
import re
import shlex
import xml.etree.ElementTree as ET

import pytest

from vkit.report import render as report

pytestmark = pytest.mark.unit

HERE = os.path.dirname(os.path.abspath(__file__))
SAMPLE = os.path.join(HERE, "golden", "report", "sample_result.json")
SVG = "{http://www.w3.org/2000/svg}"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?")
EVIL = "<script>alert('x')</script> & co"


@pytest.fixture
def sample():
    with open(SAMPLE, encoding="utf-8") as f:
        return json.load(f)


def parse(page: str) -> ET.Element:
    return ET.fromstring(page)


def local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def figure(root: ET.Element, fig_id: str) -> ET.Element:
    fig = root.find(f".//figure[@id='{fig_id}']")
    assert fig is not None, fig_id
    svg = fig.find(f"{SVG}svg")
    assert svg is not None
    return svg


def points(svg: ET.Element, series: str | None = None) -> list[ET.Element]:
    return [e for e in svg.iter() if "pt" in (e.get("class") or "").split()
            and (series is None or e.get("data-series") == series)]


def measured(result: dict) -> list[dict]:
    return [t for t in result["trials"] if t["status"] == "measured" and t.get("valid") is not False
            and t["metrics"].get("output_throughput") is not None and t["metrics"].get("p95_ttft_ms") is not None]


def text_of(el: ET.Element) -> str:
    return "".join(el.itertext())


def trial_rows(md: str) -> list[str]:
    section = md.split("## Trials", 1)[1].split("## Knee", 1)[0]
    return [ln for ln in section.splitlines() if ln.startswith("| `")]


# ------------------------------------------------------------------------------------- HTML


def test_html_is_well_formed_and_self_contained(sample):
    page = report.render_html(sample)
    root = parse(page)  # the whole page is XML: every element closed, only XML entities
    assert local(root.tag) == "html"

    class Balance(html.parser.HTMLParser):
        VOID = {"meta", "br", "hr", "img", "input", "link"}

        def __init__(self):
            super().__init__()
            self.stack: list[str] = []

        def handle_starttag(self, tag, attrs):
            if tag not in self.VOID:
                self.stack.append(tag)

        def handle_endtag(self, tag):
            assert self.stack and self.stack[-1] == tag, (tag, self.stack[-5:])
            self.stack.pop()

        def handle_startendtag(self, tag, attrs):
            pass

    b = Balance()
    b.feed(page)
    b.close()
    assert b.stack == []
    # Nothing fetched from anywhere: no script, no link, no src/href, no CSS url() or @import.
    for el in root.iter():
        assert local(el.tag) not in {"script", "link", "img", "iframe", "object", "embed"}
        assert not {"src", "href", "{http://www.w3.org/1999/xlink}href"} & set(el.attrib)
    style = root.find(".//style").text
    assert "url(" not in style and "@import" not in style
    assert len(page) < 100_000
    assert len(root.findall(f".//{SVG}svg")) == 3


def test_html_sections_in_order(sample):
    root = parse(report.render_html(sample))
    heads = [text_of(h) for h in root.iter("h2")]
    want = ["Goal", "Baseline", "Trials", "Knee", "Pareto", "Recommendation", "Stop rule", "Drift", "Warnings", "Soak"]
    pos = [next(i for i, h in enumerate(heads) if h.startswith(w)) for w in want]
    assert pos == sorted(pos)
    body = text_of(root.find("body"))
    assert body.index(report.BANNER) < body.index("Goal")
    assert sample["stop_rule"] in body and sample["soak"] in body
    for w in sample["warnings"]:
        assert w in body
    for d in sample["drift"]:
        assert d["detail"] in body


def test_trials_plot_has_exactly_the_measured_points(sample):
    svg = figure(parse(report.render_html(sample)), "plot-trials")
    pts = points(svg)
    assert int(svg.get("data-points")) == len(pts)
    want = {t["id"]: t for t in measured(sample)}
    got = [p.get("data-config") for p in pts if p.get("data-series") != "baseline"]
    assert sorted(got) == sorted(want)  # each measured trial once, nothing else
    for p in pts:
        if p.get("data-series") == "baseline":
            continue
        m = want[p.get("data-config")]["metrics"]
        assert float(p.get("data-x")) == m["p95_ttft_ms"] and float(p.get("data-y")) == m["output_throughput"]
        assert p.get("data-series") == f"step {want[p.get('data-config')]['step']}"
    # one group per step, its count the trials of that step
    groups = {g.get("data-series"): g for g in svg.iter(f"{SVG}g") if g.get("data-series")}
    for step in {t["step"] for t in want.values()}:
        n = sum(1 for t in want.values() if t["step"] == step)
        g = groups[f"step {step}"]
        assert int(g.get("data-count")) == n == len(points(g))
    base = points(svg, "baseline")
    assert len(base) == 1 and float(base[0].get("data-y")) == sample["baseline"]["metrics"]["output_throughput"]["mean"]
    # not plotted trials are named in the caption
    cap = text_of(parse(report.render_html(sample)).find(".//figure[@id='plot-trials']/figcaption"))
    for t in sample["trials"]:
        if t["id"] not in want:
            assert t["id"] in cap


def test_pareto_plot_front_knee_and_slo(sample):
    svg = figure(parse(report.render_html(sample)), "plot-pareto")
    assert int(svg.get("data-points")) == len(points(svg))
    front = points(svg, "pareto")
    assert sorted(p.get("data-config") for p in front) == sorted(p["trial_id"] for p in sample["pareto"])
    for p in front:
        entry = next(e for e in sample["pareto"] if e["trial_id"] == p.get("data-config"))
        assert float(p.get("data-x")) == entry["metrics"]["p95_ttft_ms"]
    knee = points(svg, "knee")
    assert [k.get("data-config") for k in knee] == [sample["knee"]["trial_id"]]
    rec = points(svg, "recommendation")
    assert [r.get("data-config") for r in rec] == [sample["recommendation"]["trial_id"]]
    others = points(svg, "other trials")
    assert len(others) == len(measured(sample)) - len({p["trial_id"] for p in sample["pareto"]})
    # the SLO line is drawn and labelled with its value
    assert "SLO" in text_of(svg) and "2000" in text_of(svg)
    # axis ticks carry units in the axis labels
    assert "P95 TTFT (ms)" in text_of(svg) and "output throughput (tok/s)" in text_of(svg)


def test_progress_plot_counts(sample):
    svg = figure(parse(report.render_html(sample)), "plot-progress")
    assert int(svg.get("data-points")) == len(points(svg)) == len(points(svg, "trials"))
    ids = [p.get("data-config") for p in points(svg, "trials")]
    assert sorted(ids) == sorted(t["id"] for t in measured(sample))


def test_svg_helpers_count_points():
    series = [{"name": "a", "points": [{"x": 1, "y": 2, "id": "p1"}, {"x": 2, "y": 3, "id": "p2"}]},
              {"name": "b", "points": [{"x": 3, "y": 1, "id": "p3"}], "shape": "diamond"},
              {"name": "line only", "points": [{"x": 1, "y": 1}, {"x": 3, "y": 3}], "markers": False}]
    svg = ET.fromstring(report.svg_scatter(series, title="t", x_label="x (ms)", y_label="y (tok/s)",
                                           vlines=[{"x": 2.5, "label": "SLO"}]))
    assert svg.get("data-points") == "3" and len(points(svg)) == 3
    assert [p.get("data-config") for p in points(svg, "a")] == ["p1", "p2"]
    lines = ET.fromstring(report.svg_lines(series, x_tick_labels={1: "t1", 2: "t2", 3: "t3"},
                                           hbands=[{"lo": 1, "hi": 2, "label": "band"}]))
    assert lines.get("data-points") == "3"
    assert {"t1", "t2", "t3"} <= set(text_of(lines).split())
    empty = ET.fromstring(report.svg_scatter([], title="nothing", empty_text="no points here"))
    assert empty.get("data-points") == "0" and "no points here" in text_of(empty)


# ------------------------------------------------------------------------------------- all three


def test_knee_and_recommendation_in_all_three(sample):
    md = report.render_markdown(sample)
    page = report.render_html(sample)
    term = report.render_terminal(sample)
    root = parse(page)
    knee, rec = sample["knee"]["trial_id"], sample["recommendation"]["trial_id"]
    cmd = sample["recommendation"]["serve_command"]
    assert "## Knee" in md and f"**{knee}" in md.split("## Knee", 1)[1]
    assert f"**{rec}**" in md.split("## Recommendation", 1)[1]
    assert f"```sh\n{cmd}\n```" in md
    assert knee in text_of(root.find(".//h2[@id='knee']/..")) or knee in text_of(root)
    assert text_of(root.find(".//pre[@id='serve-command']")) == cmd
    assert f"Knee: {knee}" in term and f"Recommendation: {rec}" in term
    # each trial's why, in the terminal too (joined back from its wrapped lines)
    flat = " ".join(term.split())
    whys = [t["why"] for t in sample["trials"] if t.get("why")]
    assert whys and all(f"why: {' '.join(w.split())}" in flat for w in whys)
    # the command in the terminal, joined back from its continuation lines, is the same command
    deploy = term.split("Deploy with:\n", 1)[1].split("\n\n", 1)[0]
    assert shlex.split(deploy.replace("\\\n", " ")) == shlex.split(cmd)
    for flag in sample["recommendation"]["serve_flags"]:
        assert flag in md and flag in term and flag in text_of(root)
    # Pareto configurations and their dominance rates everywhere
    for p in sample["pareto"]:
        rate = report.fmt_pct(p["dominance_rate"])
        assert p["trial_id"] in md and rate in md and rate in text_of(root) and rate in term


def test_simulated_banner_only_when_simulated(sample):
    for render in (report.render_markdown, report.render_html, report.render_terminal):
        assert report.BANNER in render(sample)
    real = dict(sample, simulated=False)
    for render in (report.render_markdown, report.render_html, report.render_terminal):
        assert report.BANNER not in render(real)


def test_every_markdown_number_comes_from_the_result(sample):
    md = report.render_markdown(sample)
    allowed: list[float] = []

    def walk(v):
        if isinstance(v, bool):
            return
        if isinstance(v, (int, float)):
            allowed.extend([abs(v), abs(v) * 100])
        elif isinstance(v, str):
            allowed.extend(float(x) for x in NUMBER.findall(v))
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(k)
                walk(x)
        elif isinstance(v, list):
            allowed.append(len(v))
            for x in v:
                walk(x)

    walk(sample)
    for tok in NUMBER.findall(md):
        x = float(tok)
        half_ulp = 0.5 * 10 ** -(len(tok.split(".")[1]) if "." in tok else 0)
        assert any(abs(x - a) <= half_ulp * 1.001 for a in allowed), f"{tok} in the Markdown is not from the result"
    # and a changed number shows up changed: nothing is cached or hard-coded
    changed = copy.deepcopy(sample)
    changed["trials"][3]["metrics"]["output_throughput"] = 4321.0
    changed["baseline"]["metrics"]["output_throughput"]["sigma_rel"] = 0.0777
    md2 = report.render_markdown(changed)
    assert "4321" in md2 and "4321" not in md and "7.77%" in md2


def test_trial_table_has_every_trial_with_its_verdict_and_why(sample):
    md = report.render_markdown(sample)
    rows = trial_rows(md)
    assert len(rows) == len(sample["trials"])
    for t, row in zip(sample["trials"], rows, strict=True):
        assert f"`{t['id']}`" in row and t["status"] in row
        assert (t["verdict"] or "–") in row
        assert t["why"].replace("|", "\\|") in row
        assert row.count(" | ") == rows[0].count(" | ")  # no cell broke the table
    root = parse(report.render_html(sample))
    table = root.find(".//table[@id='trial-table']")
    trs = table.findall("tbody/tr")
    assert [text_of(tr.find("td")) for tr in trs] == [t["id"] for t in sample["trials"]]
    for t, tr in zip(sample["trials"], trs, strict=True):
        assert t["why"] in text_of(tr) and (t["verdict"] or "–") in text_of(tr)


# ------------------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("result", [
    {},
    {"schema": "vkit.tune/1", "trials": [], "pareto": [], "knee": None, "recommendation": None},
    {"schema": "vkit.tune/1", "simulated": True, "goal": {"maximize": "output_throughput", "subject_to": {"p95_ttft_ms": 2000}},
     "trials": [{"id": "t001", "step": "1", "status": "start_failed", "verdict": None, "why": "OOM at start-up",
                 "metrics": {}, "config": {"max_num_seqs": 512}}],
     "pareto": [], "stop_rule": "two start failures in a row: ABNORMAL"},
    {"schema": "vkit.tune/2", "trials": "not a list", "pareto": None, "baseline": {"metrics": {"x": "y"}}},
])
def test_empty_or_odd_results_render_and_say_so(result, capsys):
    md = report.render_markdown(result)
    page = report.render_html(result)
    term = report.render_terminal(result)
    root = parse(page)
    for svg in root.iter(f"{SVG}svg"):
        assert svg.get("data-points") == "0" and points(svg) == []
    trials = result.get("trials") if isinstance(result.get("trials"), list) else []
    if not trials:
        assert "No trials were run." in md and "No trials were run." in text_of(root) and "No trials were run." in term
    assert "No Pareto front" in md and "No Pareto front" in text_of(root) and "No Pareto front" in term
    assert "No knee" in md and "No recommendation" in md
    assert "no measured trial to plot" in text_of(root) and "no measured trial to plot" in term
    assert capsys.readouterr() == ("", "")  # a library never prints


def test_text_is_escaped(sample):
    evil = copy.deepcopy(sample)
    evil["title"] = "tune & <b>report</b>"
    evil["trials"][0]["changes"] = {"model_path": EVIL}
    evil["trials"][0]["config"]["model_path"] = EVIL
    evil["trials"][0]["why"] = f"why {EVIL} | pipe"
    evil["pareto"][0]["config"]["tag"] = EVIL
    evil["recommendation"]["serve_command"] += " --served-model-name 'a<script>&b'"
    evil["warnings"].append(EVIL)
    evil["steps"][0]["name"] = EVIL
    page = report.render_html(evil)
    assert "<script" not in page and "<b>report" not in page
    root = parse(page)
    assert not [e for e in root.iter() if local(e.tag) == "script"]
    assert EVIL in text_of(root) and "tune & <b>report</b>" in text_of(root.find(".//h1"))
    assert "a<script>&b" in text_of(root.find(".//pre[@id='serve-command']"))
    for svg in root.iter(f"{SVG}svg"):  # tooltips and legends escaped too
        ET.fromstring(ET.tostring(svg))
    md = report.render_markdown(evil)
    rows = trial_rows(md)
    assert all(r.count(" | ") == rows[1].count(" | ") for r in rows)
    outside_code = re.sub(r"`[^`]*`|```.*?```", "", md, flags=re.S)
    assert "<script" not in outside_code and "<b>" not in outside_code


def test_terminal_fits_width_and_colour_is_optional(sample):
    for width in (60, 78, 120):
        out = report.render_terminal(sample, width=width)
        assert "\x1b[" not in out
        long = [ln for ln in out.splitlines() if len(ln) > width]
        assert long == []
        assert "K" in out and "*" in out and "B" in out and ":" in out
    col = report.render_terminal(sample, color=True)
    assert "\x1b[" in col
    assert ANSI.sub("", col) == report.render_terminal(sample)


def test_terminal_plot_marks(sample):
    out = report.render_terminal(sample, width=78)
    plot = out.split("Output throughput vs P95 TTFT:\n", 1)[1].split("\n\n", 1)[0]
    grid = [ln for ln in plot.splitlines() if re.match(r"^\s*\d*\s[|+]", ln)]
    body = "".join(ln for ln in grid)
    assert body.count("K") == 1  # the knee, once (it is also the recommendation here)
    assert "P95 TTFT (ms)" in plot
    assert "K knee, also the recommendation" in out


# ------------------------------------------------------------------------------------- files


def test_write_report_writes_three_files_atomically(sample, tmp_path):
    out = tmp_path / "rep"
    paths = report.write_report(sample, str(out))
    assert set(paths) == {"md", "html", "json"}
    assert [os.path.basename(paths[k]) for k in ("md", "html", "json")] == ["report.md", "report.html", "result.json"]
    with open(paths["json"], encoding="utf-8") as f:
        assert json.load(f) == sample
    with open(paths["md"], encoding="utf-8") as f:
        assert f.read() == report.render_markdown(sample)
    with open(paths["html"], encoding="utf-8") as f:
        parse(f.read())
    assert sorted(os.listdir(out)) == ["report.html", "report.md", "result.json"]  # no temp file left
    report.write_report(sample, str(out))  # overwrite in place
    assert sorted(os.listdir(out)) == ["report.html", "report.md", "result.json"]


def test_write_report_refuses_with_a_sentence(sample, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(report.ReportWriteError) as e:
        report.write_report(sample, str(blocker))
    assert str(blocker) in str(e.value)


def test_odd_values_never_crash(sample):
    """A driver bug must not cost the report: wrong types and NaN anywhere still render."""
    paths = [(k,) for k in sample] + [("trials", 0, k) for k in sample["trials"][0]] + \
        [("pareto", 0, k) for k in sample["pareto"][0]] + [("baseline", "metrics", "output_throughput")]
    for path in paths:
        for odd in (None, "x<&>", [], {}, float("nan"), True, [None]):
            doc = copy.deepcopy(sample)
            node = doc
            for k in path[:-1]:
                node = node[k]
            node[path[-1]] = odd
            root = parse(report.render_html(doc))
            assert local(root.tag) == "html" and root.find("body") is not None, path
            md, term = report.render_markdown(doc), report.render_terminal(doc, width=50, color=True)
            assert md.startswith("# ") and md.endswith("Plots: see report.html.\n"), path
            assert term.endswith("\n") and len(term.splitlines()) > 5, path


def test_full_bench_summaries_show_the_key_metrics_only(sample):
    """The driver may pass whole bench summaries: the tables keep to the key metrics."""
    doc = copy.deepcopy(sample)
    extra = {f"p{p}_itl_ms": 1.0 + p for p in (50, 90, 99)} | {"date": "2026-11-29", "completed": 400}
    doc["baseline"]["metrics"].update({k: {"mean": v, "sigma_rel": 0.01} for k, v in extra.items()})
    for t in doc["trials"]:
        t["metrics"].update(extra)
    md = report.render_markdown(doc)
    assert "P99 itl" not in md and "itl" not in md and "completed" not in md
    assert "output throughput (tok/s)" in md and "P95 TTFT (ms)" in md


def test_confirmation_text_says_how_each_member_was_confirmed():
    from vkit.report.render import confirmation_text

    acc = {"confirmed": True, "confirmation": {"decision": "accept", "claim": "p95_ttft_ms:-",
                                               "vs_kept": {"output_throughput": -0.004, "p95_ttft_ms": -0.126}}}
    assert confirmation_text(acc) == "confirmed on P95 TTFT (P95 TTFT -12.6%, output throughput -0.4% vs kept)"
    assert confirmation_text({"confirmed": True, "confirmation": {"decision": "kept"}}) == "kept"
    assert confirmation_text({"confirmed": False, "confirmation": {"decision": "undecided"}}) == "undecided"
    assert confirmation_text({"confirmed": False, "confirmation": {"decision": "underpowered"}}) == \
        "not measured: the budget cannot decide it"
    assert confirmation_text({"confirmed": False, "confirmation": {"decision": None}}) == "screening only"


def test_the_report_reads_the_typed_result_and_says_no_front_only_when_there_is_none(sample, tmp_path):
    from vkit.tune.result import TuneResult

    typed = TuneResult.from_dict(sample)
    assert report.render_markdown(typed) == report.render_markdown(sample) and report.render_html(typed) == report.render_html(sample)
    paths = report.write_report(typed, str(tmp_path))
    assert json.loads(open(paths["json"]).read()) == typed.to_dict()
    assert sample["pareto"] and not sample.get("not_confirmed")
    assert "No Pareto front" not in report.render_markdown(sample) and "No Pareto front" not in report.render_html(sample)
    empty = dict(sample, pareto=[])
    assert "No Pareto front in the result." in report.render_markdown(empty)
