"""Energy checks: the counter does not run backwards, power under load is not below idle, the samples
cover the run; each passes, fails and is not applicable once, and a vkit summary's energy block reaches
them without touching the run's verdict."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import REPO
from vkit.validate.formats import load_report
from vkit.validate.invariants import (
    CHECKS,
    ENERGY_CHECKS,
    FAIL,
    INFO,
    NA,
    PASS,
    Thresholds,
    check_energy_counter_monotone,
    check_power_above_idle,
    check_power_coverage,
    evaluate,
)

pytestmark = pytest.mark.unit

GOLDEN = os.path.join(REPO, "tests", "golden", "invariants")


def block(**kw) -> dict:
    """An energy block as a vkit summary carries it: 600 s run, 1 s samples, a counter, sound figures."""
    e = {"available": True, "why": None, "source": "counter", "energy_j": 240000.0, "mean_w": 400.0, "idle_w": 78.0,
         "coverage": 0.99, "covered_s": 594.0, "duration_s": 600.0, "samples": 595, "interval_s": 1.0,
         "counter_j": 240000.0, "sampled_j": 237600.0, "j_per_output_token": 0.5, "j_per_request": 240.0}
    e.update(kw)
    return e


def run(check, energy: dict | None) -> dict:
    rep = {} if energy is None else {"energy": energy}
    return check(rep, Thresholds(), {})


UNAVAILABLE = {"available": False, "why": "nvidia-smi gave no power.draw ([N/A])", "source": None, "energy_j": None,
               "mean_w": None, "idle_w": None, "coverage": None, "covered_s": None, "duration_s": 600.0, "samples": None,
               "interval_s": 1.0, "counter_j": None, "sampled_j": None, "j_per_output_token": None, "j_per_request": None}


@pytest.mark.parametrize("check,energy,status", [
    (check_energy_counter_monotone, block(), PASS),
    (check_energy_counter_monotone, block(counter_j=-1234.5), FAIL),
    (check_energy_counter_monotone, block(counter_j=None, source="sampled"), NA),
    (check_power_above_idle, block(), PASS),
    (check_power_above_idle, block(mean_w=60.0), FAIL),
    (check_power_above_idle, block(idle_w=None), NA),
    (check_power_coverage, block(), PASS),
    (check_power_coverage, block(coverage=0.5, covered_s=300.0), FAIL),
    (check_power_coverage, UNAVAILABLE, NA),
])
def test_each_check_passes_fails_and_is_not_applicable(check, energy, status):
    r = run(check, energy)
    assert r["status"] == status
    assert r["severity"] == INFO  # an energy failure voids the energy figures, not the run


def test_counter_backwards_says_so_with_the_number():
    r = run(check_energy_counter_monotone, block(counter_j=-1234.5))
    assert r["explanation"].startswith("the energy counter went backwards: -1234.5 J")
    assert r["evidence"]["counter_j"] == -1234.5


def test_power_just_under_the_idle_floor_fails_and_at_it_passes():
    assert run(check_power_above_idle, block(mean_w=70.1, idle_w=78.0))["status"] == FAIL  # 0.9 × 78 = 70.2
    assert run(check_power_above_idle, block(mean_w=70.2, idle_w=78.0))["status"] == PASS
    assert "idle" in run(check_power_above_idle, block(mean_w=60.0))["explanation"]


def test_too_few_samples_fail_coverage_and_name_the_run_length_and_interval():
    r = run(check_power_coverage, block(samples=2, coverage=1.0, covered_s=2.0, duration_s=2.0, interval_s=1.0))
    assert r["status"] == FAIL
    assert "2 s run sampled every 1 s" in r["explanation"] and "shorter sampling interval" in r["explanation"]
    assert "longer run" in r["explanation"]


def test_coverage_from_covered_and_duration_when_not_given():
    assert run(check_power_coverage, block(coverage=None, covered_s=300.0, duration_s=600.0))["status"] == FAIL


def test_no_energy_block_at_all_is_not_applicable():
    for check in (check_energy_counter_monotone, check_power_above_idle, check_power_coverage):
        assert run(check, None)["status"] == NA


def summary_with(tmp_path, energy: dict | None) -> str:
    doc = json.load(open(os.path.join(GOLDEN, "vkit_healthy.json")))
    doc["vkit"].pop("records", None)
    if energy is not None:
        doc["vkit"]["energy"] = energy
    p = tmp_path / "summary.json"
    p.write_text(json.dumps(doc))
    return str(p)


def test_the_summary_energy_block_reaches_the_checks_and_leaves_the_verdict(tmp_path):
    base = evaluate(load_report(summary_with(tmp_path, None)))
    assert [c["id"] for c in base["checks"]] == [cid for cid, _ in CHECKS] and "energy_findings" not in base
    e = block(counter_j=-5.0, mean_w=10.0, coverage=0.1, samples=2)
    rep = load_report(summary_with(tmp_path, e))
    assert rep["energy"] == e
    out = evaluate(rep)
    ids = [c["id"] for c in out["checks"]]
    assert ids == [cid for cid, _ in CHECKS] + [cid for cid, _ in ENERGY_CHECKS]
    assert out["energy_findings"] == ["energy_counter_monotone", "power_above_idle", "power_coverage"]
    assert out["verdict"] == base["verdict"] and out["findings"] == base["findings"]
    good = evaluate(load_report(summary_with(tmp_path, block())))
    assert good["energy_findings"] == [] and good["verdict"] == base["verdict"]
