"""One capacity gauge inside tune: where a search starts (the configuration's last estimate, the twin's
prediction, the kept capacity), what a configuration's capacity over its searches is (the estimate
with its interval), and the report's lead (the start, the recommendation, the gain, each with its interval)."""

from __future__ import annotations

import json
import math
import os

import pytest

from vkit.decide.components import capacity_sigma
from vkit.report import render as report
from vkit.tune.assemble import achieved, capacity_of
from vkit.tune.ledger import TuneView
from vkit.tune.onerun import guess

pytestmark = pytest.mark.unit


def _view(baseline: dict, trials: list[dict], kept: dict) -> TuneView:
    return TuneView({"baseline": baseline, "trials": trials, "kept": {"config": kept}})


def _doc(tmp_path, name: str, capacity: float) -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"slo_capacity": capacity}))
    return name


A, B, C = {"max_num_seqs": 16}, {"max_num_seqs": 64}, {"max_num_seqs": 128}


def test_a_search_starts_where_its_configuration_was_last_measured_else_where_the_twin_put_it(tmp_path):
    base = {"config": A, "runs": [_doc(tmp_path, "b1.json", 10.0), _doc(tmp_path, "b2.json", 11.0)],
            "metrics": {"slo_capacity": 10.5}}
    twin = {"twin": {"prediction": {"capacity": 30.0}}}
    trials = [{"id": "t001", "config": B, "runs": [_doc(tmp_path, "t1.json", 21.0)], "proposal": twin},
              {"id": "t002", "config": C, "runs": [], "proposal": {"twin": {"prediction": {"capacity": 40.0}}}}]
    st = _view(base, trials, A)
    d = str(tmp_path)
    assert guess(st, A, d) == 11.0  # the baseline's own last search
    assert guess(st, B, d) == 21.0  # measured: its own search, not the prediction it was proposed on
    assert guess(st, C, d) == 40.0  # not measured yet: the twin's prediction
    assert guess(st, {"max_num_seqs": 256}, d) == 10.5  # nothing known of it: the kept configuration's capacity
    assert guess(_view({}, [], A), A, d) is None


def test_the_gain_carries_both_estimates_intervals():
    start = {"config": A, "req_s": 10.0, "interval": [9.0, 11.0]}
    rec = {"req_s": 20.0, "interval": [19.0, 21.0]}
    a = achieved(start, B, rec, {"req_s": 19.5, "verified": {"runs": []}})
    assert a["gain"] == pytest.approx(1.0)
    s = math.hypot(math.log(11 / 9), math.log(21 / 19)) / (2 * 1.959963984540054)
    assert a["gain_interval"] == pytest.approx([2 * math.exp(-1.959963984540054 * s) - 1, 2 * math.exp(1.959963984540054 * s) - 1])
    assert a["gain_interval"][0] < 1.0 < a["gain_interval"][1]
    assert a["recommendation"]["verified_req_s"] == 19.5
    assert achieved(start, B, rec, {"req_s": 19.5})["recommendation"]["verified_req_s"] is None  # no promise run
    assert achieved({"config": A}, B, rec, {}) is None


def test_the_report_leads_with_what_the_tune_achieved():
    with open(os.path.join(os.path.dirname(__file__), "golden", "report", "sample_result.json"), encoding="utf-8") as f:
        res = json.load(f)
    res.setdefault("capacity", {})
    res["capacity"] = dict(res["capacity"] or {}, achieved={
        "start": {"config": A, "req_s": 36.5, "interval": [35.0, 38.1]},
        "recommendation": {"config": C, "req_s": 72.4, "interval": [69.9, 75.0], "verified_req_s": 70.1},
        "gain": 0.98, "gain_interval": [0.87, 1.10]})
    term = " ".join(report.render_terminal(res).split())
    assert "Started at 36.5 req/s [35, 38.1]" in term and "recommended 72.4 req/s [69.9, 75]" in term
    assert "a gain of +98 % [+87 %, +110 %]" in term and "held on fresh-start runs at 70.1 req/s" in term
    md = report.render_markdown(res)
    html = report.render_html(res)
    for page in (md, html):
        assert "What the tune achieved" in page
    # it leads: before the goal and the baseline
    assert md.index("What the tune achieved") < md.index("Baseline")


def test_a_configurations_interval_takes_sigma_as_the_gate_does():
    # three searches that agree within 1 % but each claim ±5 %: from three on, σ is their spread (the gate's rule,
    # capacity_sigma); from two, their spread at least their own sd
    docs = {f"r{i}": {"slo_capacity": c, "slo_capacity_sd": 0.05} for i, c in enumerate((40.0, 40.4, 39.6))}
    runner = type("R", (), {"ledger": type("L", (), {"load": staticmethod(lambda p: docs[p])})()})()
    three = capacity_of(runner, ["r0", "r1", "r2"])
    logs = [math.log(d["slo_capacity"]) for d in docs.values()]
    spread = float(__import__("numpy").std(logs, ddof=1))
    se = spread / math.sqrt(3)
    assert se == pytest.approx(capacity_sigma(spread, list(docs.values())) / math.sqrt(3))
    assert three["interval"][1] / three["req_s"] == pytest.approx(math.exp(1.959964 * se), rel=1e-4)
    two = capacity_of(runner, ["r0", "r1"])
    assert two["interval"][1] / two["req_s"] == pytest.approx(math.exp(1.959964 * 0.05 / math.sqrt(2)), rel=1e-4)
