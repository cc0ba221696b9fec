"""The soak's length from the measured drift rate (vkit.decide.drift: drift_rate, soak_plan,
soak_advice; the tune result's soak recommendation; make soak's re-baseline line), against answers
worked by hand."""

from __future__ import annotations

import datetime as dt
import json
import math

import pytest

from vkit.decide.drift import drift_rate, format_hours, soak_advice, soak_plan
from vkit.tune import assemble

pytestmark = pytest.mark.unit

T95_2 = 2.919986  # Student t, 2 degrees of freedom, 0.95 quantile (tables)


def test_drift_rate_is_the_least_squares_slope_of_the_log_with_its_t_interval():
    # ln v = 0, .01, .03, .03 at 0..3 h: t̄ = 1.5, Sxx = 5, slope = 0.055 / 5 = 0.011 per hour; residuals
    # -0.001, -0.002, 0.007, -0.004 (SS 7e-5), se = sqrt(7e-5 / 2 / 5) = 0.0026458
    r = drift_rate([0, 1, 2, 3], [math.exp(x) for x in (0, 0.01, 0.03, 0.03)])
    assert r["per_h"] == pytest.approx(0.011)
    assert r["se"] == pytest.approx(math.sqrt(7e-6))
    assert r["interval"] == pytest.approx([0.011 - T95_2 * math.sqrt(7e-6), 0.011 + T95_2 * math.sqrt(7e-6)], rel=1e-6)
    assert (r["runs"], r["span_h"], r["level"]) == (4, 3.0, 0.90)


def test_no_rate_from_fewer_than_three_runs_or_no_time_between_them():
    assert drift_rate([0, 1], [100, 90]) is None
    assert drift_rate([2, 2, 2], [100, 90, 80]) is None
    with pytest.raises(ValueError):
        drift_rate([0, 1, 2], [100, 0, 90])


def test_soak_plan_the_fastest_drift_the_interval_allows_reaches_the_threshold():
    # the interval above: [0.0032744, 0.0187256]/h; at 3 %: T = ln(1.03) / 0.0187256 = 1.5785 h,
    # 12 windows of ceil(1.5785 × 3600 / 12) = 474 s; at the measured 1.1 %/h itself, ln(1.03) / 0.011 = 2.6872 h
    r = drift_rate([0, 1, 2, 3], [math.exp(x) for x in (0, 0.01, 0.03, 0.03)])
    p = soak_plan(r, 0.03, run_s=60)
    assert p["fastest_per_h"] == pytest.approx(0.0187256, rel=1e-5)
    assert p["hours"] == pytest.approx(1.5785, abs=1e-4)
    assert p["at_rate_h"] == pytest.approx(2.6872, abs=1e-4)
    assert (p["windows"], p["window_s"], p["drifting"]) == (12, 474, True)


def test_soak_plan_a_falling_level_and_a_window_no_shorter_than_the_runs():
    # exactly -2 %/h (no noise, so the interval is the slope): at 5 %, ln(1.05) / 0.02 = 2.4395 h;
    # 12 windows would be 732 s, but the runs lasted 900 s, so windows of 900 s (3 h in all)
    r = drift_rate([0, 0.5, 1, 1.5, 2], [100 * math.exp(-0.02 * t) for t in (0, 0.5, 1, 1.5, 2)])
    assert r["interval"] == pytest.approx([-0.02, -0.02])
    p = soak_plan(r, 0.05, run_s=900)
    assert p["hours"] == pytest.approx(math.log(1.05) / 0.02)
    assert (p["window_s"], p["soak_h"], p["drifting"]) == (900, 3.0, True)


def test_format_hours():
    assert [format_hours(h) for h in (16.4 / 3600, 119 / 3600, 0.5, 0.999, 1.5785, math.inf)] == \
        ["16 s", "119 s", "30.0 min", "59.9 min", "1.58 h", "no finite time"]


def test_soak_advice_says_the_numbers_and_the_formula():
    a = soak_advice([0, 1, 2, 3], [math.exp(x) for x in (0, 0.01, 0.03, 0.03)], 0.03, run_s=60)
    t = a["text"]
    assert "+1.10%/h (90% interval +0.33% to +1.87%/h) over 4 runs in 3.00 h" in t
    assert "ln(1 + 0.030) / 0.0187 = 1.579 h" in t and "`make soak WINDOWS=12 WINDOW_S=474`, 1.58 h)" in t
    assert "re-measure the baseline at least every 1.58 h" in t and "crosses the threshold in 2.69 h" in t
    stable = soak_advice([0, 1, 2, 3], [math.exp(x) for x in (0, 0.01, -0.01, 0.0)], 0.03, run_s=60)
    assert stable["plan"]["drifting"] is False and "The level is moving" not in stable["text"]
    none = soak_advice([0, 0.01], [100, 101], 0.03, run_s=60)
    assert none["rate"] is None and none["text"].startswith("no drift rate measured: 2 dated run(s) of the kept configuration over 36 s")


class _Tune:
    """What the tune result's soak recommendation reads of a tune: the kept configuration's series and
    the gate's threshold on output throughput."""

    def __init__(self, docs: list[dict], threshold: float | None):
        self.docs, self.threshold = docs, threshold
        self.sentinel = self.budget = self  # the soak reads the sentinel's series and the budget's plan

    def kept_series(self):
        return [(f"r{i}.json", d) for i, d in enumerate(self.docs)]

    def confirm_plan(self, versus):
        assert (versus.primary, versus.guards) == ("output_throughput:+", ())  # throughput alone, whatever the tune's objective
        rows = [] if self.threshold is None else [{"metric": "output_throughput", "role": "primary", "threshold": self.threshold}]
        return {"metrics": rows}


def test_the_tune_result_soak_recommendation_is_computed_from_the_kept_series():
    # runs at 0, 30, 60, 90 min of 120 s each, ln tok/s falling 0, -0.01, -0.03, -0.03 (the first example,
    # mirrored, over half the time): slope -0.022 per hour, interval ±2 × 0.0052915 × 2.919986
    t0 = dt.datetime(2026, 12, 2, 9, 0, 0)
    docs = [{"date": (t0 + dt.timedelta(minutes=30 * i)).strftime("%Y%m%d-%H%M%S"), "output_throughput": 5000 * math.exp(-x),
             "duration": 120.0} for i, x in enumerate((0, 0.01, 0.03, 0.03))]
    docs.append({"date": None, "output_throughput": 1.0, "duration": 120.0})  # undated: not in the rate
    text = assemble.soak(_Tune(docs, 0.041))
    fastest = 0.022 + T95_2 * 2 * math.sqrt(7e-6)
    hours = math.log1p(0.041) / fastest
    assert "output_throughput -2.20%/h" in text and "over 4 runs in 1.50 h" in text
    assert f"(4.1%, max(2σ, 3%)) in ln(1 + 0.041) / {fastest:.4f} = {hours:.4g} h" in text
    assert f"re-measure the baseline at least every {format_hours(hours)}" in text
    assert f"WINDOW_S={math.ceil(hours * 3600 / 12)}`" in text
    floor = assemble.soak(_Tune(docs, None))
    assert "(3.0%, the 3% floor: no σ measured)" in floor
    assert assemble.soak(_Tune(docs[:2], 0.041)).startswith("no drift rate measured: 2 dated run(s)")


@pytest.mark.e2e
@pytest.mark.slow
def test_make_soak_says_how_often_to_rebaseline_from_its_windows(tmp_path):
    from tests.test_soak import run_soak, sim, soak_env

    with sim("--sim-noise", "0", "--sim-drift", "30") as url:
        p = run_soak(soak_env(tmp_path, url))
    d = tmp_path / "soak"
    docs = [json.loads(x) for x in (d / "soak.jsonl").read_text().splitlines()]
    sigma = json.loads((d / "drift.json").read_text())["sigma"]
    when = [dt.datetime.strptime(x["date"], "%Y%m%d-%H%M%S") for x in docs]
    r = drift_rate([(w - when[0]).total_seconds() / 3600 for w in when], [x["output_throughput"] for x in docs])
    thr = max(2 * sigma, 0.03)
    plan = soak_plan(r, thr, 1.5)
    line = next((x for x in p.stderr.splitlines() if x.startswith("soak: drift rate")), None)
    assert line is not None, p.stderr[-3000:]
    assert f"soak: drift rate {r['per_h']:+.2%}/h (90% interval {r['interval'][0]:+.2%} to {r['interval'][1]:+.2%}/h)" in line
    assert f"over {len(docs)} windows in {r['span_h']:.2f} h" in line
    assert f"in ln(1 + {thr:.3f}) / {plan['fastest_per_h']:.4f} = {plan['hours']:.4g} h" in line
    assert line.endswith(f"re-measure the baseline at least every {format_hours(plan['hours'])}") and r["per_h"] < 0
