"""drift: detectors, their calibration, and the CLI on series of summaries and numbers."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from tests.conftest import REPO, call, load_script
from vkit.decide import drift as vd
from vkit.state import StateFile, new_state

pytestmark = pytest.mark.unit

G = os.path.join(REPO, "tests", "golden", "gate")


def _fixtures_module():
    return load_script(os.path.join(G, "make_fixtures.py"), "make_fixtures")


def series(n=40, step_at=None, step=-0.05, sigma=0.02, seed=3):
    rng = np.random.default_rng(seed)
    y = rng.normal(0, sigma, n)
    if step_at is not None:
        y[step_at:] += math.log1p(step)
    return np.exp(y) * 650.0


# --------------------------------------------------------------------------- library


def test_step_is_detected_where_it_happened():
    res = vd.detect(series(step_at=25), sigma=0.02)
    assert res["changed"] and res["verdict"] == "changed"
    assert 22 <= res["change_index"] <= 27 and res["alarm_index"] >= res["change_index"]
    assert -0.08 < res["shift"] < -0.03
    assert set(res["detectors"]) == set(vd.DETECTORS)


def test_stable_series_is_stable_with_either_sigma():
    for sigma in (0.02, None):
        res = vd.detect(series(seed=4), sigma=sigma)
        assert not res["changed"] and res["verdict"] == "stable", res["why"]


def test_too_short_and_bad_input():
    res = vd.detect(series(n=8))
    assert res["verdict"] == "too_short" and not res["changed"]
    with pytest.raises(ValueError):
        vd.detect([1.0, -2.0] * 10)
    with pytest.raises(ValueError):
        vd.detect(series(), detector="nope")


def test_long_series_judged_on_its_last_window():
    res = vd.detect(series(n=200, step_at=180, seed=5), sigma=0.02)
    assert res["offset"] == 200 - max(vd.LENGTHS) and res["changed"]
    assert 175 <= res["change_index"] <= 185


def test_threshold_picks_the_next_calibrated_length():
    h, length = vd.threshold("cusum", 33, True)
    assert length == 40 and h == vd.THRESHOLDS["known"]["cusum"][40]
    assert vd.threshold("cusum", 500, False)[1] == max(vd.LENGTHS)


def test_stored_thresholds_reproduce():
    # A smaller, independent calibration lands within 10% of the stored constants.
    cal = vd.calibrate(lengths=(40,), reps=3000, seed=7)
    for mode in ("known", "estimated"):
        for det in vd.DETECTORS:
            assert cal[mode][det][40] == pytest.approx(vd.THRESHOLDS[mode][det][40], rel=0.10), (mode, det)


def test_false_alarms_near_five_percent_on_fresh_streams():
    rng = np.random.default_rng(99)
    y = rng.normal(0, 0.02, (2000, 40))
    for sigma in (0.02, None):
        st, _m, _s = vd.statistics(y, sigma)
        for det in vd.DETECTORS:
            h, _ = vd.threshold(det, 40, sigma is not None)
            fa = float(np.mean((st[det] > h).any(axis=1)))
            assert 0.025 < fa < 0.08, (det, sigma, fa)


def test_self_starting_residuals_are_standard_normal_under_no_change():
    rng = np.random.default_rng(1)
    y = rng.normal(5.0, 0.03, (4000, 30))
    for sigma in (0.03, None):
        u = vd.self_starting(y, 8, sigma)[:, 8:]
        assert abs(float(u.mean())) < 0.02 and abs(float(u.std()) - 1) < 0.03


def test_bocpd_predictive_scale():
    # Known variance (large α0 = β0) and a long stable run: the change probability stays small;
    # after a 4σ step it jumps.
    z = np.zeros((1, 30))
    z[0, 20:] = 4.0
    stat = vd.bocpd_stat(z, 8, (1.0, 1000.0, 1000.0))
    assert stat[0, 19] < 0.2 and stat[0, 21] > 0.9


def test_stale_runs():
    import datetime as dt

    d = [dt.datetime(2026, 1, 1, 12, i) for i in range(4)]
    assert vd.stale_runs(d + [None], dt.datetime(2026, 1, 1, 12, 2)) == [0, 1, 4]


# --------------------------------------------------------------------------- CLI


def _summary_series(tmp_path, n=24, step_at=None, step=-0.06, seed=1) -> str:
    mk = _fixtures_module()
    with open(os.path.join(G, "sample_streaming.json")) as fh:
        base = json.load(fh)
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(n):
        shift = rng.normal(0, 0.02) - (math.log1p(step) if step_at is not None and i >= step_at else 0.0)
        doc = mk.rescale(base, math.exp(shift))  # times × s, throughput ÷ s
        doc["date"] = f"20260103-12{i:02d}00"
        lines.append(json.dumps(doc))
    p = tmp_path / "repeats.jsonl"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def test_cli_detects_a_step_in_summaries(tmp_path):
    path = _summary_series(tmp_path, step_at=14)
    r = call("drift", path, "--sigma", "2%")
    assert r.code == 1, r
    d = json.loads(r.out)
    assert d["changed"] and d["metric"] == "output_throughput" and d["change_date"].startswith("2026-01-03T12:1")
    assert "CHANGED" in r.err


def test_cli_stable_numbers_from_a_file(tmp_path):
    p = tmp_path / "nums.jsonl"
    p.write_text("\n".join(str(x) for x in series(n=20, seed=6)) + "\n")
    r = call("drift", str(p))
    assert r.code == 0, r
    assert json.loads(r.out)["verdict"] == "stable"


def test_cli_too_short_is_undecided(tmp_path):
    p = tmp_path / "nums.jsonl"
    p.write_text("1\n2\n3\n")
    r = call("drift", str(p))
    assert r.code == 6 and json.loads(r.out)["verdict"] == "too_short"


def test_cli_refuses_a_gauge_change(tmp_path):
    path = _summary_series(tmp_path, n=14)
    lines = open(path).read().splitlines()
    doc = json.loads(lines[5])
    doc["vkit"]["dataset"]["random_input_len"] = 2048
    lines[5] = json.dumps(doc)
    open(path, "w").write("\n".join(lines) + "\n")
    r = call("drift", path)
    assert r.code == 3 and "random_input_len" in r.err


def test_cli_usage_errors(tmp_path):
    assert call("drift", str(tmp_path / "missing.json")).code == 2
    assert call("drift", "--record", str(tmp_path / "x")).code == 2
    assert call("drift", "--sigma", "200%", "x").code == 2


def test_kept_repeats_record_and_gate_refuses_the_old_baseline(tmp_path):
    path = _summary_series(tmp_path, n=24, step_at=14, step=-0.08)
    files = []
    for i, line in enumerate(open(path).read().splitlines()):
        p = tmp_path / f"rep{i:02d}.json"
        p.write_text(line)
        files.append(p.name)
    st = str(tmp_path / "vkit.json")
    doc = new_state("http://127.0.0.1:8000", "sim-8b", ["vllm", "serve", "x"])
    doc["kept"]["repeats"] = files
    doc["sigma_baseline"] = {"output_throughput": 0.02}
    doc["trials"] = [{"id": "t1", "baseline": [str(tmp_path / n) for n in files[:6]],
                      "candidate": [os.path.join(G, f"aa_c{i}.json") for i in range(1, 4)]}]
    StateFile(st).create(doc)
    r = call("drift", "--state", st, "--kept", "--record")
    assert r.code == 1, r
    s = StateFile(st).read()
    assert s["drift"]["changed"] and s["drift"]["change_date"]
    r = call("gate", "--state", st, "--trial", "t1")
    assert r.code == 3 and "change point" in r.err
