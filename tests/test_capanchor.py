"""A capacity search's own drift check (vkit.tune.capanchor): the search's first load measured again at
its end, on the real-vLLM replay of test_capacity_interval (margins with a 5 % run-to-run sd on TTFT,
2.5 % on TPOT) and on the same server made slower part-way through the search."""

from __future__ import annotations

import pytest

from tests.test_capacity_interval import SLO, real_vllm_like, tune_plan
from vkit.tune import capacity as cap
from vkit.tune import capanchor, capsearch

pytestmark = pytest.mark.unit


def slowed(measure, after: int, factor: float):
    """``measure`` with every latency ``factor`` times higher from run ``after + 1`` on (a step time that grew)."""
    calls = []

    def m(load: float, k: int, n: int | None = None) -> dict:
        calls.append(load)
        s = measure(load, k, n)
        if len(calls) > after:
            s = dict(s, p95_ttft_ms=s["p95_ttft_ms"] * factor, mean_tpot_ms=s["mean_tpot_ms"] * factor)
        return s

    return m, calls


def search(factor: float, seed: int):
    measure, _ = real_vllm_like(stall_first=False, seed=seed)
    m, calls = slowed(measure, 4, factor)
    return capsearch.search(m, cap.Slo(SLO), tune_plan()), calls


def test_an_unchanged_server_is_never_said_to_have_moved_and_pays_one_run_for_the_check():
    for seed in range(20):
        res, calls = search(1.0, seed)
        assert res.drift is not None and res.drift["moved"] is False, (seed, res.drift)
        assert "level moved" not in res.stop
        # the anchor, the lowest load of the search's first half, measured once more as the last run
        assert calls[-1] == res.drift["load"] == min(calls[1: len(calls) // 2])
        assert calls.count(calls[-1]) == 2
        assert sum(len(p.runs) for p in res.points) == tune_plan().max_runs + 1


def test_a_server_that_slowed_by_thirty_percent_mid_search_is_caught_in_nineteen_searches_of_twenty():
    caught = 0
    for seed in range(20):
        res, _ = search(1.3, seed)
        d = res.drift
        assert d["shift"] < 0, (seed, d)  # the later run read a smaller margin: slower, caught or not
        if d["moved"]:
            caught += 1
            assert d["z"] < -capanchor.Z and res.as_dict()["drift"]["moved"] is True
            assert res.stop.startswith("the level moved during the search") and "slower" in res.stop
    assert caught >= 19


def test_the_check_judges_by_the_prior_noise_not_by_replicates_that_straddle_the_change():
    # the search measures a load before the slowdown and again after it: their spread is the shift itself,
    # and a σ from it would hide the shift it judges (measured: z -1.8 at a 30 % slowdown)
    res, _ = search(1.3, 3)
    straddling = [p for p in res.points if len(p.runs) >= 2 and p.load != res.drift["load"]]
    assert straddling and res.drift["moved"]


def test_a_short_search_and_a_search_that_measured_its_anchor_late_need_no_extra_run():
    p = [cap.Point(0.5, [{"valid": True, "order": 0, "margins": {"a": 1.5}}]),
         cap.Point(1.0, [{"valid": True, "order": 1, "margins": {"a": 1.0}}]),
         cap.Point(2.0, [{"valid": True, "order": 2, "margins": {"a": 0.5}}])]
    assert capanchor.anchor(p) is None  # three runs: too short to tell a level change from noise
    p.append(cap.Point(3.0, [{"valid": True, "order": 3, "margins": {"a": 0.1}}]))
    p.append(cap.Point(4.0, [{"valid": True, "order": 4, "margins": {"a": -0.1}}]))
    assert capanchor.anchor(p) == (1.0, True)  # the lowest load of the first half, its first run (0.5) excepted
    assert capanchor.anchor(p, "a") == (1.0, True)
    assert capanchor.anchor(p, "throughput") is None  # the keep-up binds: no margin at a held anchor to judge, no run
    p[1].runs.append({"valid": True, "order": 5, "margins": {"a": 0.98}})
    assert capanchor.anchor(p) == (1.0, False)  # measured again in the search's last third
    d = capanchor.judge(p, 1.0, {"*": 0.05}, 0.05, "a")
    assert d["moved"] is False and d["shift"] == pytest.approx(-0.02)
    p[1].runs[-1]["margins"]["a"] = 0.6  # 0.4 lower: z = -0.4 / (0.05 x √2) = -5.7
    d = capanchor.judge(p, 1.0, {"*": 0.05}, 0.05, "a")
    assert d["moved"] is True and d["z"] == pytest.approx(-0.4 / (0.05 * 2 ** 0.5))


def test_a_shift_within_the_precision_is_not_a_move_however_quiet_the_server():
    p = [cap.Point(0.5, [{"valid": True, "order": 0, "margins": {"a": 1.5}}]),
         cap.Point(1.0, [{"valid": True, "order": 1, "margins": {"a": 1.0}}, {"valid": True, "order": 5, "margins": {"a": 0.97}}]),
         *[cap.Point(2.0 + i, [{"valid": True, "order": 2 + i, "margins": {"a": 0.5}}]) for i in range(3)]]
    d = capanchor.judge(p, 1.0, {"*": 0.001}, 0.05, "a")
    assert abs(d["z"]) > capanchor.Z and d["moved"] is False  # 3 % < log(1.05)


def test_inside_tune_a_search_whose_level_moved_is_measured_again_as_a_busy_clients_run_is():
    from vkit.tune.measurement import Measurer

    assert Measurer.transient({"level_moved"}) and not Measurer.transient({"level_moved", "littles_law"})


def test_only_the_binding_slo_is_judged():
    # a loose SLO's margin far from zero moved a lot (a TTFT of 60 s allowed, the run read 40 % slower): the answer,
    # set by the binding SLO, moved nothing
    p = [cap.Point(0.5, [{"valid": True, "order": 0, "margins": {"a": 1.5, "loose": 7.5}}]),
         cap.Point(1.0, [{"valid": True, "order": 1, "margins": {"a": 1.0, "loose": 7.0}},
                         {"valid": True, "order": 5, "margins": {"a": 0.99, "loose": 6.6}}]),
         *[cap.Point(2.0 + i, [{"valid": True, "order": 2 + i, "margins": {"a": 0.5, "loose": 6.0}}]) for i in range(3)]]
    assert capanchor.judge(p, 1.0, {"*": 0.05}, 0.05, "a")["moved"] is False
    assert capanchor.judge(p, 1.0, {"*": 0.05}, 0.05, "loose")["moved"] is True
    assert capanchor.judge(p, 1.0, {"*": 0.05}, 0.05, "throughput")["slo"] is None  # not carried by a held run
