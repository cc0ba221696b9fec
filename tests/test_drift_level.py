"""drift.level_check: a tune's sentinel against the kept configuration's earlier starts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vkit.decide import drift as vd

pytestmark = pytest.mark.unit

REF = [[100.0, 102.0], [95.0, 96.0]]
REF4 = [[100.0, 102.0], [95.0, 96.0], [101.0, 99.0], [97.0, 98.0]]


def _by_hand(reference, latest):
    """T and the relative shift from the formulas, on logs, without the library."""
    logs = [np.log(g) for g in reference]
    k, n = len(logs), sum(len(g) for g in logs)
    means = np.array([g.mean() for g in logs])
    msw = sum(((g - g.mean()) ** 2).sum() for g in logs) / (n - k)
    grand = np.concatenate(logs).mean()
    msb = sum(len(g) * (g.mean() - grand) ** 2 for g in logs) / (k - 1)
    n0 = (n - sum(len(g) ** 2 for g in logs) / n) / (k - 1)
    b2 = max(0.0, (msb - msw) / n0)
    diff = float(np.log(latest).mean() - means.mean())
    var = b2 + msw / len(latest) + sum(b2 + msw / len(g) for g in logs) / k**2
    return diff / math.sqrt(var), math.expm1(diff), math.sqrt(msw), math.sqrt(b2)


def test_statistic_and_shift_are_the_hand_computed_ones():
    r = vd.level_check(REF, [80.0])
    t, shift, w, b = _by_hand(REF, [80.0])
    level = math.exp(np.mean([np.log(g).mean() for g in REF]))
    assert r["shift"] == pytest.approx(80.0 / level - 1, rel=1e-12)
    assert r["shift"] == pytest.approx(shift, rel=1e-12)
    assert r["statistic"] == pytest.approx(t, rel=1e-12)
    assert r["within"] == pytest.approx(w, rel=1e-12) and r["between"] == pytest.approx(b, rel=1e-12)
    assert (r["reference_starts"], r["reference_runs"], r["latest_runs"]) == (2, 4, 1)
    assert r["false_alarm_per_check"] == pytest.approx(0.05 / 4)


def test_two_starts_cannot_call_an_18_percent_drop_but_four_can():
    # Two starts give the between part one degree of freedom: |T| 4.2 is below any threshold the
    # worst-case calibration can give there (even b = 0 needs about 4.6 at 1.25 %).
    r = vd.level_check(REF, [80.0])
    assert abs(r["statistic"]) == pytest.approx(4.18, abs=0.01)
    assert r["threshold"] > 4.6
    assert r["verdict"] == "stable" and r["changed"] is False
    r4 = vd.level_check(REF4, [80.0])
    t4, shift4, _w, _b = _by_hand(REF4, [80.0])
    assert r4["statistic"] == pytest.approx(t4, rel=1e-12) and r4["shift"] == pytest.approx(shift4, rel=1e-12)
    assert r4["verdict"] == "changed" and r4["changed"] is True
    assert abs(r4["statistic"]) > r4["threshold"]
    assert "above" in r4["why"] and "4 starts" in r4["why"]
    # The same two starts do call a halving.
    assert vd.level_check(REF, [50.0])["changed"] is True


def test_latest_at_the_reference_level_is_stable():
    level = math.exp(np.mean([np.log(g).mean() for g in REF4]))
    r = vd.level_check(REF4, [level])
    assert r["verdict"] == "stable" and r["changed"] is False
    assert r["shift"] == pytest.approx(0.0, abs=1e-12)
    assert r["statistic"] == pytest.approx(0.0, abs=1e-9)
    assert "within" in r["why"]


def test_too_short():
    one = vd.level_check([[100.0, 101.0, 99.0]], [90.0])
    assert one["verdict"] == "too_short" and one["changed"] is False and one["statistic"] is None
    assert "1 start" in one["why"]
    no_df = vd.level_check([[100.0], [95.0], [97.0]], [90.0])
    assert no_df["verdict"] == "too_short" and no_df["reference_starts"] == 3 and no_df["reference_runs"] == 3
    assert "0 within-start" in no_df["why"]
    flat = vd.level_check([[100.0, 100.0], [100.0, 100.0]], [90.0])
    assert flat["verdict"] == "too_short" and "no spread" in flat["why"]


def test_threshold_is_the_worst_ratio_and_shrinks_with_more_starts():
    thr = [vd.level_check([[100.0, 101.0]] * k + [[99.0, 98.0]], [100.0])["threshold"] for k in (1, 3, 7)]
    assert thr[0] > thr[1] > thr[2]
    r = vd.level_check(REF4, [100.0])
    assert r["threshold"] == max(r["calibration"]["quantiles"])
    assert r["calibration"]["quantiles"] == sorted(r["calibration"]["quantiles"])  # grows with b/w
    # Fewer checks, a larger false-alarm share per check, a lower threshold.
    assert vd.level_check(REF4, [100.0], checks=1)["threshold"] < r["threshold"]


def test_batched_statistic_matches_the_one_series_path():
    rng = np.random.default_rng(11)
    sizes = (2, 3, 2, 1)
    y = rng.normal(0, 0.02, (5, sum(sizes)))
    lat = rng.normal(0, 0.02, (5, 2))
    t, _d, _w, _b = vd._level_t(y, sizes, lat)
    for i in range(5):
        cut = np.cumsum((0,) + sizes)
        ref = [list(np.exp(y[i, cut[j]:cut[j + 1]])) for j in range(len(sizes))]
        assert vd.level_check(ref, list(np.exp(lat[i])))["statistic"] == pytest.approx(t[i], rel=1e-9)


def _false_alarms(w, b, reps, seed):
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(reps):
        u = rng.normal(0.0, b, 3)
        ref = [list(600.0 * np.exp(u[j] + rng.normal(0.0, w, 2))) for j in range(2)]
        latest = [float(600.0 * np.exp(u[2] + rng.normal(0.0, w)))]
        hits += vd.level_check(ref, latest, checks=1, alpha=0.05)["changed"]
    return hits / reps


def test_calibration_holds_at_the_worst_ratio():
    # b/w = 4 is the ratio the threshold is set at: the false-alarm rate is alpha.
    assert 0.03 <= _false_alarms(0.02, 0.08, 2000, seed=5) <= 0.07


def test_realistic_noise_false_alarms_at_most_alpha():
    # w = 2 %, b = 1.5 %: below the worst case, so fewer false alarms than alpha (about 1.4 %).
    assert 0.005 <= _false_alarms(0.02, 0.015, 2000, seed=6) <= 0.05


@pytest.mark.parametrize("reference, latest", [
    ([[100.0, 0.0], [95.0, 96.0]], [90.0]),
    ([[100.0, -1.0], [95.0, 96.0]], [90.0]),
    ([[100.0, float("nan")], [95.0, 96.0]], [90.0]),
    ([[100.0, 101.0], [95.0, float("inf")]], [90.0]),
    (REF, [0.0]),
    (REF, [float("nan")]),
    (REF, []),
])
def test_bad_values_raise(reference, latest):
    with pytest.raises(ValueError):
        vd.level_check(reference, latest)


def test_bad_settings_raise():
    with pytest.raises(ValueError):
        vd.level_check(REF, [90.0], checks=0)
    with pytest.raises(ValueError):
        vd.level_check(REF, [90.0], alpha=0.0)
