"""A baseline whose capacity searches a disturbed machine measured is measured once more, on the virtual backend:
which loads are disturbed is tests/test_loadfit.py's (real vLLM's curves); here, what the tune does with them."""

from __future__ import annotations

import json

import pytest

from tests.conftest import call
from tests.test_twin import TUNE, sim_state
from vkit.tune import baseline

pytestmark = pytest.mark.slow

WHY = "mean TPOT 3.96 ms at load 8, 3.0x the 1.32 ms at 16"
STAGED = [*[a for a in TUNE if a not in ("--search", "twin")], "--search", "staged"]
STAGED[STAGED.index("--steps") + 1], STAGED[STAGED.index("--budget") + 1] = "3", "1"


def tuned(tmp_path, monkeypatch, disturbed) -> tuple[object, list[dict], dict]:
    """A staged capacity tune (step 3, one trial) whose baselines' curves read as ``disturbed(call number)`` says."""
    calls = []

    def fake(docs):
        calls.append(len(docs))
        return disturbed(len(calls))

    monkeypatch.setattr(baseline, "disturbed_loads", fake)
    path = sim_state(tmp_path, monkeypatch)
    r = call("tune", *STAGED)
    assert r.code == 0, r.err[-2000:]
    log = [json.loads(x) for x in open(tmp_path / "decisions.jsonl")]
    return r, log, json.load(open(path))


def test_a_disturbed_baseline_is_measured_once_more_and_the_new_one_sets_the_reference(tmp_path, monkeypatch):
    r, log, st = tuned(tmp_path, monkeypatch, lambda n: [WHY] if n == 1 else [])
    again = [e for e in log if e.get("event") == "baseline_remeasure"]
    assert len(again) == 1 and again[0]["disturbed"] == [WHY] and again[0]["generation"] == 1
    first = again[0]["runs"]
    bases = [e for e in log if e.get("event") == "baseline" and not e.get("rebased_from")]
    assert [e["runs"] == first for e in bases[:2]] == [True, False]  # the disturbed one, then its re-measure
    assert bases[0]["disturbed"] == [WHY] and "disturbed" not in bases[1]
    b = st["baseline"]  # the trial kept was not rebased on (too few runs of it): the baseline is the re-measure
    assert (b["generation"], b["remeasure_of"], b.get("rebased_from"), "disturbed" in b) == (2, 1, None, False)
    # on fresh server starts: as many as the first measurement's
    starts = [i for i, e in enumerate(log) if e.get("event") in ("applied", "rolled_back")]
    cut = log.index(again[0])
    assert len([i for i in starts if i < cut]) == len([i for i in starts if cut < i < log.index(bases[1])]) > 0
    assert not set(bases[1]["runs"]) & set(first)
    # the reference load came from the disturbed searches: it is taken again from the new ones
    assert st["capacity_reference"]["from"] == bases[1]["runs"][0]
    assert "measuring it once more on fresh server starts" in r.err and WHY in r.err


def test_a_baseline_still_disturbed_when_measured_again_is_kept_with_its_warning(tmp_path, monkeypatch):
    r, log, st = tuned(tmp_path, monkeypatch, lambda n: [WHY])
    assert len([e for e in log if e.get("event") == "baseline_remeasure"]) == 1  # once, never again
    bases = [e for e in log if e.get("event") == "baseline" and not e.get("rebased_from")]
    assert len(bases) == 2 and bases[1]["disturbed"] == [WHY]
    assert "measured once more and still disturbed" in r.err
    assert [e for e in log if e.get("event") in ("screen", "propose", "trial")]  # the tune went on to its step
