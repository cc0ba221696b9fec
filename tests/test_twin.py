"""tune --search twin: the twin's space, its bisection and correction, and a whole twin-guided tune
on the virtual backend (calibrated on the baseline's load points, its evidence in the decision log)."""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import sys

import pytest

from tests.conftest import REPO, call
from vkit.apply.policy import Policy
from vkit.errors import ExitCode
from vkit.tune import twin
from vkit.tune.steps.twinsearch import RESERVED_RESTARTS, twin_space

SIM = [sys.executable, os.path.join(REPO, "bin", "sim_server"), "sim-8b", "--port", "1", "--max-model-len", "1024",
       "--sim-gpu", "H200", "--sim-model", "llama-3.1-8b", "--sim-seed", "11", "--sim-startup-s", "60"]
TUNE = ["--virtual", "--sandbox", "--objective", "capacity", "--search", "twin", "--input-len", "512", "--output-len", "128",
        "--num-prompts", "100", "--slo", "p95_ttft_ms=1000", "--slo", "mean_tpot_ms=50", "--steps", "2,3,4", "--budget", "8",
        "--screen-repeats", "1", "--confirm-front", "0", "--ablation", "off", "--point-seconds", "4", "--capacity-start", "32",
        "--capacity-noise", "0.03", "--max-point-seconds", "8", "--verify-seconds", "40",
        "--vocab-size", "2000", "--json"]


def small_space(tmp_path, monkeypatch) -> None:
    """The packaged policy with one token budget (8192) and two sequence counts (64, 128) as candidates: with
    the kept values and the doublings past the largest, the twin ranks 2 x 6 = 12 configurations rather than
    40 (each a bisection of simulated runs), and every rule it follows is the same."""
    data = json.load(open(Policy.load().source))
    for row in data["situational"]:
        if row["param"] == "max_num_batched_tokens":
            row["candidates"] = [8192]
        elif row["param"] == "max_num_seqs":
            row["candidates"] = [64, 128]
    path = tmp_path / "params.json"
    path.write_text(json.dumps(data))
    monkeypatch.setenv("VKIT_POLICY", str(path))
    assert len(twin_space(Policy.load(str(path)), {"max_num_batched_tokens": 2048, "max_num_seqs": 16})) == 12


def sim_state(tmp_path, monkeypatch, *sim_flags: str) -> str:
    """A state of the 8B / H200 simulator kept at 2,048 batched tokens, 16 sequences and 1,024 tokens, over
    :func:`small_space` (``sim_flags``: more of sim_server's flags); its path (VKIT_STATE)."""
    path = str(tmp_path / "state.json")
    monkeypatch.setenv("VKIT_STATE", path)
    small_space(tmp_path, monkeypatch)
    r = call("state", "init", "--url", "http://127.0.0.1:1", "--model", "sim-8b", "--set", "max_num_batched_tokens=2048",
             "--set", "max_num_seqs=16", "--set", "max_model_len=1024", "--", *SIM, *sim_flags)
    assert r.code == 0, r.err
    return path


def res_report(tmp_path) -> str:
    import glob

    return glob.glob(str(tmp_path / "reports" / "*" / "report.md"))[0]


@pytest.mark.unit
def test_the_space_is_the_policys_lattice_with_the_kept_values_and_step_3s_doublings():
    space = twin_space(Policy.load(), {"max_num_batched_tokens": 2048, "max_num_seqs": 16})
    tokens = sorted({c["max_num_batched_tokens"] for c in space})
    seqs = sorted({c["max_num_seqs"] for c in space})
    assert tokens == [2048, 4096, 8192, 16384, 32768]  # the policy's 4 and the kept 2048
    assert seqs == [8, 16, 32, 64, 128, 256, 512, 1024]  # 8-128, then doubled 3 times past 128
    assert len(space) == 40
    frozen = twin_space(Policy.load(), {"max_num_batched_tokens": 2048, "max_num_seqs": 16}, frozen={"max_num_seqs": 64})
    assert {c["max_num_seqs"] for c in frozen} == {64} and len(frozen) == 5


@pytest.mark.unit
def test_bisection_lands_within_its_tolerance_below_the_edge_from_either_side():
    for hint in (0.5, 7.0, 300.0):
        got = twin.bisect(lambda r: r <= 7.3, hint)
        assert 7.3 / (1 + twin.TOLERANCE) <= got <= 7.3
    assert twin.bisect(lambda r: False, 4.0) == 0.0


@pytest.mark.unit
def test_a_prediction_is_corrected_by_its_nearest_measured_configuration():
    a, b = {"max_num_batched_tokens": 2048, "max_num_seqs": 16}, {"max_num_batched_tokens": 2048, "max_num_seqs": 512}
    ratios = [(a, 0.0), (b, math.log(1.25))]
    assert twin.nearest_ratio({"max_num_batched_tokens": 4096, "max_num_seqs": 512}, ratios) == pytest.approx(math.log(1.25))
    assert twin.nearest_ratio({"max_num_batched_tokens": 2048, "max_num_seqs": 32}, ratios) == 0.0
    assert twin.nearest_ratio(a, []) == 0.0
    assert twin.distance(a, b) == pytest.approx(5.0)


@pytest.mark.unit
def test_the_miss_pools_each_measured_ones_error_from_its_nearest_other_with_the_fits_error():
    tw = twin.Twin(point=None, isl=1, osl=1, slo=None, seconds=1.0, params=None, stderr_log={}, fit_error=0.1)
    a, b = {"max_num_seqs": 16}, {"max_num_seqs": 512}
    assert tw.miss([]) == pytest.approx(0.1)
    assert tw.miss([(a, 0.0)]) == pytest.approx(0.1)
    # two measured, 0.2 apart in log: each predicted from the other misses by 0.2; with the fit's 0.1: sqrt((.04+.04+.01)/3)
    assert tw.miss([(a, 0.0), (b, 0.2)]) == pytest.approx(math.sqrt(0.09 / 3))


@pytest.mark.unit
def test_spread_points_keeps_the_lowest_and_highest_load():
    class P:
        def __init__(self, rate):
            self.rate = rate

    pts = [P(r) for r in range(21, 0, -1)]
    got = twin.spread_points(pts, 10)
    assert len(got) == 10 and got[0].rate == 1 and got[-1].rate == 21
    assert twin.spread_points(pts[:3], 10) == pts[:3]


@pytest.mark.unit
def test_search_twin_needs_the_capacity_objective_and_a_positive_restart_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("VKIT_STATE", str(tmp_path / "state.json"))
    assert call("state", "init", "--url", "http://127.0.0.1:1", "--model", "sim-8b", "--", *SIM).code == 0
    r = call("tune", "--sandbox", "--search", "twin", "--objective", "throughput")
    assert r.code == 2 and "--objective capacity" in r.err
    r = call("tune", "--sandbox", "--search", "twin", "--max-restarts", "0")
    assert r.code == 2 and "--max-restarts must be >= 1" in r.err


@pytest.mark.unit
def test_the_default_search_is_the_twin_where_it_can_search_and_the_staged_steps_elsewhere(tmp_path):
    from tests.test_energy_tune import parsed
    from vkit.cli._tuneargs import tune_plan
    from vkit.errors import UsageError

    def plan(*flags: str):
        p = tune_plan(parsed(*flags))
        return p.mode, p.twin_fallback

    assert plan() == ("twin", True)  # --objective capacity is the default objective
    assert plan("--steps", "1,3") == ("twin", True)
    assert plan("--search", "twin") == ("twin", False)  # asked for: no fallback, a usage error where it cannot calibrate
    assert plan("--search", "staged") == ("staged", False) and plan("--search", "bo") == ("bo", False)
    assert plan("--objective", "throughput") == ("staged", False)  # the twin predicts SLO capacity only
    assert plan("--energy-axis") == ("staged", False)
    assert plan("--trace", str(tmp_path / "t.jsonl")) == ("staged", False)  # a trace's capacity is its speed-up
    assert plan("--steps", "1,4m,5") == ("staged", False)  # no step the twin replaces
    with pytest.raises(UsageError, match="speed-up"):
        tune_plan(parsed("--search", "twin", "--trace", str(tmp_path / "t.jsonl")))


@pytest.mark.slow
def test_by_default_a_twin_that_cannot_calibrate_gives_way_to_the_staged_steps_and_asked_for_it_refuses(tmp_path,
                                                                                                       monkeypatch):
    """The baseline's load points all refused (as on an accelerator or model the engine has no profile of): under the
    default --search auto the tune says why and runs the staged steps; under --search twin it stops with the reason."""
    from vkit.sim import loadfit

    why = "runs/b/rep1-points/p1/rep1.json: say which model and GPU served it (--sim-model M --sim-gpu G)"
    monkeypatch.setattr(loadfit, "points_from_state", lambda *a, **k: ([], [why]))
    auto = [a for a in TUNE if a not in ("--search", "twin")]
    auto[auto.index("--steps") + 1], auto[auto.index("--budget") + 1] = "3", "1"
    path = sim_state(tmp_path, monkeypatch)
    from vkit.state import StateFile

    # an earlier run's twin in the same decision log: this run's result still says it fell back
    StateFile(path).log.append("tune", "twin_profile", profile=str(tmp_path / "earlier" / "twin-profile.json"))
    r = call("tune", *auto)
    assert r.code == 0, r.err[-2000:]
    log = [json.loads(x) for x in open(tmp_path / "decisions.jsonl")]
    fell = [e for e in log if e.get("event") == "twin_fallback"]
    assert len(fell) == 1 and why in fell[0]["reason"] and fell[0]["search"] == "staged"
    assert "the staged steps search instead" in r.err and why in r.err
    assert [e["profile"] for e in log if e.get("event") == "twin_profile"] == [str(tmp_path / "earlier" / "twin-profile.json")]
    res = json.loads(r.out)
    steps = [t["step"] for t in res["trials"]]
    assert steps and set(steps) == {"3"}
    assert res["capacity"]["twin"] == {"fallback": fell[0]["reason"], "rows": []}  # the report says so too
    md = open(res_report(tmp_path)).read()
    assert "The twin was not used." in md and f"{fell[0]['reason']}; the staged steps searched instead." in md
    d = tmp_path / "asked"
    d.mkdir()
    sim_state(d, monkeypatch)
    r = call("tune", *auto, "--search", "twin")
    assert r.code == 2 and "the twin has no load point to calibrate on" in r.err and why in r.err
    # points it can use, and a fit that fails numerically: the default says so and searches staged too
    monkeypatch.undo()
    d = tmp_path / "numeric"
    d.mkdir()
    sim_state(d, monkeypatch)

    def broken(*a, **k):
        raise ValueError("Residuals are not finite in the initial point.")

    monkeypatch.setattr(loadfit, "fit_points", broken)
    r = call("tune", *auto)
    assert r.code == 0, r.err[-2000:]
    fell = [json.loads(x) for x in open(d / "decisions.jsonl") if '"twin_fallback"' in x]
    assert [e["reason"] for e in fell] == ["the twin's fit failed (ValueError: Residuals are not finite in the initial point.)"]


@pytest.mark.slow
def test_a_twin_guided_tune_calibrates_proposes_with_intervals_and_respects_its_restart_budget(tmp_path, monkeypatch):
    path = sim_state(tmp_path, monkeypatch)
    r = call("tune", *TUNE, "--max-restarts", "8")
    assert r.code == 0, r.err[-2000:]
    res = json.loads(r.out)
    log = [json.loads(x) for x in open(tmp_path / "decisions.jsonl")]
    prof = next(e for e in log if e["event"] == "twin_profile")
    with open(prof["profile"], "rb") as f:  # the profile the proposals name is the file written
        assert hashlib.sha256(f.read()).hexdigest() == prof["profile_sha256"]
    props = [e for e in log if e["event"] == "propose"]
    assert props, "the twin proposed nothing"
    for e in props:
        p = e["audit"]["twin"]["prediction"]
        assert p["lo"] < p["capacity"] < p["hi"] and e["audit"]["twin"]["profile_sha256"] == prof["profile_sha256"]
        assert e["config"]["max_model_len"] == 1024  # the kept configuration's other parameters go with a candidate
    # the start (16 sequences) carries a fraction of what the simulated H200 can: the twin's first pick is kept
    assert res["recommendation"]["config"]["max_num_seqs"] >= 128
    # the budget: no trial proposed once its start, confirmation and promise would pass 8 restarts
    starts = [e for e in log if e["event"] in ("applied", "rolled_back", "start_failed")]
    before_last = [e for e in log[: log.index(props[-1])] if e["event"] in ("applied", "rolled_back", "start_failed")]
    assert len(before_last) + RESERVED_RESTARTS <= 8
    # ... and past it only by a confirmation's further blocks (two starts each), never cut short
    blocks = sum(-(-len(c.get("sequence") or []) // 4) for c in json.loads(open(path).read()).get("confirmations") or [])
    assert res["timings"]["restarts"] == len(starts) <= 8 + 2 * max(blocks - 1, 0)
    # the drift sentinel ran after the twin step, on the process of the kept configuration (no restart), and held
    checks = [e for e in log if e["event"] == "drift_check"]
    assert [(c["detector"], c["changed"], c["fresh_start"]) for c in checks] == [("capacity_low_end", False, False)], checks
    # no search of an unchanged server said its level moved
    assert not [e for e in log if e["event"] == "remeasure" and "level_moved" in e.get("findings", [])]
    # the result and the report carry the twin's predictions beside what the server measured
    rows = res["capacity"]["twin"]["rows"]
    assert [r["trial_id"] for r in rows] == [e["trial"] for e in props]
    measured = {t["id"]: t["metrics"].get("slo_capacity") for t in res["trials"]}
    assert all(r["measured"] == measured[r["trial_id"]] for r in rows if r["status"] == "done")
    md = open(res_report(tmp_path)).read()
    assert "## Twin vs measured" in md and rows[0]["trial_id"] in md
    # sweep --replay re-derives every twin proposal from its profile and logged inputs, without a server
    r = call("sweep", "--replay", str(tmp_path))
    assert r.code == 0, r.err[-1000:]
    rep = json.loads(r.out)
    assert rep["proposals"] == rep["identical"] == len(props) and rep["differences"] == []
    # the knowledge base keeps the run's last fit; a later twin-guided run of the same environment starts from it
    last = [e for e in log if e["event"] == "twin_profile"][-1]
    kb = [json.loads(x) for x in open(tmp_path / "knowledge.jsonl")]
    assert prof["started_from"] is None and kb[-1]["twin"]["profile_sha256"] == last["profile_sha256"]
    assert kb[-1]["twin"]["params"] == json.load(open(last["profile"]))["params"]
    r = call("tune", *TUNE, "--max-restarts", "4")
    assert r.code == 0, r.err[-2000:]
    assert "starting from run " + kb[-1]["run_id"] + "'s fit (knowledge base)" in r.err
    again = [json.loads(x) for x in open(tmp_path / "decisions.jsonl")][len(log):]
    first = next(e for e in again if e["event"] == "twin_profile")
    assert first["started_from"] == {"run_id": kb[-1]["run_id"], "profile_sha256": last["profile_sha256"]}
    with open(prof["profile"], "a") as f:  # a profile that is not the one the proposals name is refused
        f.write(" ")
    r = call("sweep", "--replay", str(tmp_path))
    assert r.code == 2 and "sha256 differs" in r.err


@pytest.mark.unit
def test_the_report_shows_the_twins_predictions_beside_the_measurements():
    from vkit.report.render import render_html, render_markdown, render_terminal

    rows = [{"trial_id": "t001", "config": {"max_num_seqs": 512}, "predicted": 74.0, "lo": 55.2, "hi": 99.0, "measured": 81.47,
             "status": "done", "inside": True},
            {"trial_id": "t002", "config": {"max_num_seqs": 128}, "predicted": 60.0, "lo": 50.0, "hi": 70.0, "measured": 40.0,
             "status": "done", "inside": False}]
    md = render_markdown({"capacity": {"twin": {"rows": rows, "misses": 1, "spearman": None, "profile_sha256": "ab" * 32,
                                                "rms_log_error": 0.1}}})
    assert "## Twin vs measured" in md
    assert "| `t001` | `max_num_seqs=512` | 74 | 55.2–99 | 81.47 | yes |" in md
    assert "no (twin miss)" in md and "Misses (measured outside the interval): 1" in md
    assert "## Twin vs measured" not in render_markdown({"capacity": {}})
    term = render_terminal({"capacity": {"twin": {"rows": rows, "misses": 1}}})
    assert "t002: predicted 60 [50, 70], measured 40 (twin miss); max_num_seqs=128" in term
    # the figure: measured against predicted, a marker per measured proposal (a miss apart), its interval a bar
    html = render_html({"capacity": {"twin": {"rows": rows, "misses": 1}}})
    fig = html.split('id="plot-twin"', 1)[1].split("</svg>", 1)[0]
    assert 'data-series="trials" data-count="1"' in fig and 'data-series="misses" data-count="1"' in fig
    assert 'data-config="t001" data-x="74.0" data-y="81.47"' in fig and 'data-config="t002" data-x="60.0" data-y="40.0"' in fig
    assert 'data-series="t001 interval" data-count="0"' in fig and "M" in fig.split('data-series="t001 interval"', 1)[1][:200]


@pytest.mark.unit
def test_twin_refit_fits_again_on_each_measured_trials_load_points_and_replays(tmp_path, monkeypatch):
    path = str(tmp_path / "state.json")
    monkeypatch.setenv("VKIT_STATE", path)
    small_space(tmp_path, monkeypatch)
    r = call("state", "init", "--url", "http://127.0.0.1:1", "--model", "sim-8b", "--set", "max_num_batched_tokens=2048",
             "--set", "max_num_seqs=16", "--", *SIM)
    assert r.code == 0, r.err
    r = call("tune", *TUNE[:TUNE.index("--budget") + 1], "3", *TUNE[TUNE.index("--budget") + 2:], "--twin-refit")
    assert r.code == 0, r.err[-2000:]
    log = [json.loads(x) for x in open(tmp_path / "decisions.jsonl")]
    fits = [e for e in log if e["event"] == "twin_profile"]
    props = [e for e in log if e["event"] == "propose"]
    measured = [e for e in log if e["event"] == "screened" and e.get("status") == "done"]  # a skipped trial has no runs
    assert len(props) >= 2 and measured, "nothing measured before a later proposal: nothing to refit on"
    # the baseline's fit, then a refit after trials measured before a later proposal, on their load points too (at
    # most one a trial: a trial whose points the fit refuses, a client saturated on a busy machine, brings none)
    last = log.index(props[-1])
    assert 2 <= len([f for f in fits if log.index(f) < last]) <= 1 + len([e for e in measured if log.index(e) < last])
    assert fits[0]["trials"] == 0 and all(b["trials"] > a["trials"] for a, b in zip(fits, fits[1:], strict=False))
    assert all(b["load_points"] > a["load_points"] for a, b in zip(fits, fits[1:], strict=False))  # the trial's points joined
    assert len({f["profile_sha256"] for f in fits}) == len(fits)  # each fit its own profile
    for p in props:  # each proposal names the fit it was ranked with: the latest before it
        assert p["audit"]["twin"]["profile_sha256"] == [f for f in fits if log.index(f) < log.index(p)][-1]["profile_sha256"]
    # the last fit is a profile sim_predict reads: the refit's view of the recommendation at a load
    r = call("sim_predict", "--sim-model", "llama-3.1-8b", "--sim-gpu", "H200", "--sim-profile", fits[-1]["profile"],
             "--max-model-len", "1024", "--max-num-seqs", "512", "--max-num-batched-tokens", "8192", "--random-input-len",
             "512", "--random-output-len", "128", "--request-rate", "20", "--num-prompts", "100")
    assert r.code == 0, r.err[-500:]
    assert json.loads(r.out)["cost_params"] == json.load(open(fits[-1]["profile"]))["params"]
    r = call("sweep", "--replay", str(tmp_path))
    assert r.code == 0, r.err[-1000:]
    rep = json.loads(r.out)
    assert rep["proposals"] == rep["identical"] == len(props) and rep["differences"] == []


@pytest.mark.unit
@pytest.mark.slow
def test_twin_design_measures_closed_loop_runs_on_the_running_configuration_then_refits(tmp_path, monkeypatch):
    """--twin-design always: after the baseline's fit, closed-loop runs of the kept configuration (concurrency 1 and its
    16 sequences) on the server as it runs, no restart between; the twin refitted on the points and the runs
    (its own profile, each parameter's standard error before and after in the log), and the proposals ranked with
    that fit, which sweep --replay re-derives."""
    from vkit.sim.designfit import requests_for

    path = sim_state(tmp_path, monkeypatch)
    r = call("tune", *TUNE[:TUNE.index("--budget") + 1], "1", *TUNE[TUNE.index("--budget") + 2:], "--twin-design", "always")
    assert r.code == 0, r.err[-2000:]
    log = [json.loads(x) for x in open(tmp_path / "decisions.jsonl")]
    fits = [e for e in log if e["event"] == "twin_profile"]
    design = next(e for e in log if e["event"] == "twin_design")
    assert [f["designed_runs"] for f in fits] == [0, 2] and fits[1]["profile"].endswith("twin-profile-designed.json")
    between = log[log.index(fits[0]):log.index(fits[1])]
    assert log.index(fits[0]) < log.index(design) and not [e for e in between if e["event"] in ("applied", "rolled_back")]
    rec = json.load(open(path))["tune"]["twin_design"]
    assert rec["config"] == {"max_num_batched_tokens": 2048, "max_num_seqs": 16, "max_model_len": 1024}
    # 1 and 16 at a time; no long-prompt run: 8 x 512 prompt tokens do not fit the 1,024-token model length with 128 out
    assert rec["design"] == [[1, 512], [16, 512]] and rec["runs"] == design["runs"]
    assert len(set(rec["for"])) == len(fits[0]["parameters"])
    for rel, c in zip(rec["runs"], (1, 16), strict=True):
        doc = json.load(open(tmp_path / rel))
        assert doc["max_concurrency"] == c and doc["completed"] == requests_for(c) and not doc["failed"]
    assert set(design["parameters"]) == set(fits[1]["parameters"])
    for n, row in design["parameters"].items():
        assert row["before"] == fits[0]["parameters"][n] and row["after"] == fits[1]["parameters"][n]
    props = [e for e in log if e["event"] == "propose"]
    assert props and all(p["audit"]["twin"]["profile_sha256"] == fits[1]["profile_sha256"] for p in props)
    r = call("sweep", "--replay", str(tmp_path))
    assert r.code == 0, r.err[-1000:]
    rep = json.loads(r.out)
    assert rep["proposals"] == rep["identical"] == len(props) and rep["differences"] == []


def _replay_twin(**over) -> twin.Twin:
    from vkit.sim.calibrated import CostParams

    inputs = {"model": "llama-3.1-8b", "gpu": "H200", "tp": 1, "quantization": None, "isl": 256, "osl": 32,
              "serve": {"max_model_len": 1024, "max_num_seqs": 16}, "slo": {"p95_ttft_ms": 1e7}, "goodput": None,
              "seconds": 20.0, "hint": 20.0, "speed": 1.0, "stderr_log": {}, "fit_error": 0.0, **twin.CONSTANTS, **over}
    return twin.Twin.from_inputs(inputs, CostParams())


def test_the_twin_judges_keep_up_with_the_runs_own_share_and_replays_it_from_the_log():
    strict, loose = _replay_twin(keep_up=0.95), _replay_twin(keep_up=0.6)
    assert strict.inputs()["keep_up"] == 0.95 and loose.inputs()["keep_up"] == 0.6
    assert _replay_twin().keep_up == 0.95  # a log from before the field: the default share
    cfg = {"max_num_batched_tokens": 2048, "max_num_seqs": 16}
    # an SLO no latency can miss: the keep-up rule alone bounds the capacity, and a looser share lets more be offered
    a, b = strict.capacity(cfg, hint=20.0), loose.capacity(cfg, hint=20.0)
    assert a > 0 and b > 1.2 * a


def test_on_a_faster_than_life_simulator_the_twin_judges_the_slo_in_the_servers_own_time():
    """A live simulator at --sim-speed 4 answers 4x faster than the hardware it models: the SLO the client
    gives (wall ms) is 4x as many of the server's own ms, where the twin's latencies are. Its capacity is
    then 4x that of the same twin at speed 1 given the SLO in the server's ms."""
    cfg = {"max_num_batched_tokens": 2048, "max_num_seqs": 16}
    fast = _replay_twin(speed=4.0, slo={"mean_tpot_ms": 3.0}, hint=40.0).capacity(cfg, hint=40.0)
    life = _replay_twin(speed=1.0, slo={"mean_tpot_ms": 12.0}, hint=10.0).capacity(cfg, hint=10.0)
    assert life > 0 and fast == pytest.approx(4.0 * life, rel=1e-9)
    # the SLO binds: in the server's ms a 3-ms TPOT holds at a lower rate than a 12-ms one
    assert _replay_twin(slo={"mean_tpot_ms": 3.0}).capacity(cfg, hint=10.0) < life


def test_a_log_made_with_other_twin_constants_is_refused_on_replay_not_replayed_differently():
    from vkit.errors import UsageError

    with pytest.raises(UsageError, match=r"other constants than this version's \(draws 9 here 4\)"):
        _replay_twin(draws=9)


def test_the_knowledge_base_keeps_a_twin_fit_and_the_latest_matching_one_is_the_prior(tmp_path):
    from vkit.tune import knowledge
    from vkit.tune.steps.twinsearch import prior_twin

    kb = str(tmp_path / "kb.jsonl")
    key, work = {"model": "m"}, {"slo": {"p95_ttft_ms": 100}}
    knowledge.record(kb, key, work, [], None, "r1", {"params": {"mfu": 0.4}, "profile_sha256": "a"})
    knowledge.record(kb, key, work, [], None, "r2")  # a staged run: no twin fit
    knowledge.record(kb, key, work, [], None, "r3", {"params": {"mfu": 0.45}, "profile_sha256": "b"})
    knowledge.record(kb, {"model": "other"}, work, [], None, "r4", {"params": {"mfu": 0.9}, "profile_sha256": "c"})
    matched, ignored = knowledge.match(kb, key, work)
    assert [e["run_id"] for e in matched] == ["r1", "r2", "r3"] and len(ignored) == 1
    assert prior_twin(matched) == {"params": {"mfu": 0.45}, "profile_sha256": "b", "run_id": "r3"}
    assert prior_twin(matched[:2]) == {"params": {"mfu": 0.4}, "profile_sha256": "a", "run_id": "r1"}
    assert prior_twin(matched[1:2]) is None and prior_twin([]) is None


def test_the_knowledge_base_entry_carries_only_this_runs_twin_fit(tmp_path):
    from types import SimpleNamespace

    from vkit.sim.calibrated import CostParams, write_profile
    from vkit.tune.steps.twinsearch import kb_twin

    earlier, now = tmp_path / "runs" / "run-1", tmp_path / "runs" / "run-2"
    earlier.mkdir(parents=True)
    now.mkdir()
    write_profile(str(earlier / "twin-profile.json"), CostParams(mfu=0.4))
    log = [{"event": "twin_profile", "profile": str(earlier / "twin-profile.json"), "profile_sha256": "a"}]

    def runner(records):
        return SimpleNamespace(runs_dir=str(now), sf=SimpleNamespace(log=SimpleNamespace(read=lambda: records)))

    assert kb_twin(runner(log)) is None  # a staged run after a twin-guided one: the earlier fit is not its own
    write_profile(str(now / "twin-profile.json"), CostParams(mfu=0.45))
    mine = log + [{"event": "twin_profile", "profile": str(now / "twin-profile.json"), "profile_sha256": "b",
                   "rms_log_error": 0.1, "load_points": 9}]
    got = kb_twin(runner(mine))
    assert got["profile_sha256"] == "b" and got["params"]["mfu"] == 0.45 and got["load_points"] == 9


def test_the_twin_table_shows_only_this_runs_fit_and_proposals(tmp_path):
    """A staged run after a twin-guided one in the same state: the decision log holds the earlier run's fit and
    its proposal of a trial id this run reuses; the result has no twin table. A twin-guided run shows its own
    fit and its own proposals only."""
    from types import SimpleNamespace

    from vkit.tune.steps.twinsearch import twin_table

    earlier, now = tmp_path / "runs" / "run-1", tmp_path / "runs" / "run-2"
    earlier.mkdir(parents=True)
    now.mkdir()
    for d in (earlier, now):
        (d / "twin-profile.json").write_text("{}")
    pred = {"config": {"max_num_seqs": 64}, "capacity": 10.0, "lo": 8.0, "hi": 12.0}
    log = [{"ts": "2026-12-01T10:00:00+00:00", "event": "twin_profile", "profile": str(earlier / "twin-profile.json"),
            "profile_sha256": "a"},
           {"ts": "2026-12-01T10:05:00+00:00", "event": "propose", "trial": "t001", "audit": {"twin": {"prediction": pred}}}]
    trials = [{"id": "t001", "status": "done", "metrics": {"slo_capacity": 11.0}}]

    def runner(records):
        tune = SimpleNamespace(tune={"started": "2026-12-02T09:00:00+00:00"})
        return SimpleNamespace(runs_dir=str(now), sf=SimpleNamespace(log=SimpleNamespace(read=lambda: records)),
                               ledger=SimpleNamespace(tune=lambda: tune, trials=lambda: trials))

    assert twin_table(runner(log)) is None
    mine = log + [{"ts": "2026-12-02T09:01:00+00:00", "event": "twin_profile", "profile": str(now / "twin-profile.json"),
                   "profile_sha256": "b"},
                  {"ts": "2026-12-02T09:02:00+00:00", "event": "propose", "trial": "t001",
                   "audit": {"twin": {"prediction": dict(pred, capacity=10.5)}}}]
    got = twin_table(runner(mine))
    assert got["profile_sha256"] == "b" and [r["predicted"] for r in got["rows"]] == [10.5]
    assert got["rows"][0]["measured"] == 11.0 and got["rows"][0]["inside"] is True


def test_a_miss_of_the_steps_last_trial_is_logged_when_its_budget_ends_the_step():
    """The real-vLLM twin tune's second complete run: the twin proposed 8 sequences at 28.7 req/s [23.0, 35.8], the
    screen measured 61.9 and the step's budget of 1 ended it, so ``next``, which logs misses, never ran again and the
    decision log held no twin_miss. ``settle`` (the driver calls it after the step) logs it against the screen's
    measurement, once; a trial inside its interval, or one of another step, is no miss."""
    from vkit.search import Observation
    from vkit.tune.steps.twinsearch import TwinSearch

    class Runner:
        def __init__(self):
            self.events = []

        def log(self, event, **kw):
            self.events.append((event, kw))

    runner = Runner()
    ts = TwinSearch(runner, Policy.load(), None, lambda s: None)
    ts.twin = type("Fitted", (), {"profile_sha256": "ab" * 32})()
    eight, four = {"max_num_batched_tokens": 2048, "max_num_seqs": 8}, {"max_num_batched_tokens": 2048, "max_num_seqs": 4}
    ts.predicted = {json.dumps(c, sort_keys=True): twin.Prediction(config=c, raw=p, capacity=p, lo=lo, hi=hi, sd_log=0.1)
                    for c, p, lo, hi in ((eight, 28.7, 23.0, 35.8), (four, 20.0, 15.0, 26.0))}
    hist = [Observation(config=eight, objectives={"slo_capacity": 61.9}, step="twin"),
            Observation(config=four, objectives={"slo_capacity": 21.0}, step="twin"),
            Observation(config=four, objectives={"slo_capacity": 90.0}, step="3")]
    ts.settle(hist)
    ts.settle(hist)
    assert [(e, kw["config"], kw["measured"], kw["prediction"]["lo"]) for e, kw in runner.events] == [
        ("twin_miss", eight, 61.9, 23.0)]


@pytest.mark.unit
def test_the_twin_says_more_kv_cache_pays_when_any_parameter_set_predicts_the_gates_least_gain():
    from vkit.tune.steps.twinmemory import memory_verdict

    class Fake:
        hint = 10.0

        def __init__(self, at_hi: list[float]):
            self.at_hi = at_hi  # capacity at the high memory fraction, per parameter set (the fit's first)

        def draws(self):
            return list(range(1, len(self.at_hi)))

        def capacities(self, asks):
            assert [a[0]["gpu_memory_utilization"] for a in asks] == [0.9, 0.98] * len(self.at_hi)
            assert all(a[0]["max_num_seqs"] == 64 and a[2] == 10.0 for a in asks)
            return [x for hi in self.at_hi for x in (10.0, hi)]

    kept = {"max_num_seqs": 64, "gpu_memory_utilization": 0.9}
    v = memory_verdict(Fake([10.1, 10.2, 10.0]), kept, 0.9, 0.98)
    assert v["gains"] == [0.01, 0.02, 0.0] and v["pays"] is False and v["capacity"] == {"lo": 10.0, "hi": 10.1}
    assert memory_verdict(Fake([10.1, 10.3, 10.0]), kept, 0.9, 0.98)["pays"] is True  # one set reaches +3 %


@pytest.mark.slow
def test_after_the_twin_step_4m_makes_no_start_where_the_twin_predicts_more_kv_cache_cannot_pay(tmp_path, monkeypatch):
    """8B on an H200 at 1,024 tokens a request: the KV cache holds far more than any configuration keeps in flight,
    so the twin predicts no gain from 0.98 over the server's 0.92 and step 4m is recorded, not searched."""
    path = sim_state(tmp_path, monkeypatch)
    tune = list(TUNE)
    tune[tune.index("--steps") + 1], tune[tune.index("--budget") + 1] = "3,4m", "1"
    r = call("tune", *tune)
    assert r.code == 0, r.err[-2000:]
    st = json.load(open(path))
    log = [json.loads(x) for x in open(tmp_path / "decisions.jsonl")]
    ev = [e for e in log if e.get("event") == "twin_memory"]
    # step 3 kept another configuration: the server's own value (vLLM's default, the simulator's 0.92) is read from the
    # kept trial's runs (cache_config_info), not the policy's min
    assert len(ev) == 1 and (ev[0]["lo"], ev[0]["hi"], ev[0]["pays"]) == (0.92, 0.98, False)
    assert len(ev[0]["gains"]) == 1 + twin.DRAWS and max(ev[0]["gains"]) < 0.03
    step = next(s for s in st["steps"] if s["step"] == "4m")
    assert step["result"].startswith("not searched") and step["twin"]["gains"] == ev[0]["gains"]
    assert step["lo_from"] == "the kept server's default, from its cache_config_info" and "not searched" in r.err
    assert not [t for t in st["trials"] if t["step"] == "4m"]  # no probe, no validation: no start


def _clocks(tmp_path) -> list[tuple[float, str]]:
    """(virtual clock at its end, path) of every run a virtual tune under ``tmp_path`` measured, in time order."""
    out = []
    for f in glob.glob(str(tmp_path / "runs" / "**" / "*.json"), recursive=True):
        v = (json.load(open(f)).get("vkit") or {}).get("virtual")
        if v and v.get("clock_s") is not None:
            out.append((v["clock_s"], os.path.relpath(f, tmp_path)))
    return sorted(out)


@pytest.mark.slow
def test_a_machine_that_slows_after_the_keep_fails_the_sentinel_and_the_baseline_is_measured_again(
        tmp_path, monkeypatch):
    """The end-to-end drift test under the capacity objective. One tune on the unchanged simulator finds when the
    sentinel's check starts (virtual time is deterministic: the same seed gives the same clock); the same tune
    again, on a simulator whose every step takes 30 % longer from that moment on (``--sim-slowdown``: a neighbour's
    load, a throttled clock), reads everything before it alike, then the kept configuration fails the check's load
    two σ below its capacity, the tune says so and measures the baseline again."""
    a, b = tmp_path / "steady", tmp_path / "slowed"
    a.mkdir(), b.mkdir()
    monkeypatch.setenv("VKIT_SIM_START_FILE", str(a / "sim-starts"))
    sim_state(a, monkeypatch)
    r = call("tune", *TUNE, "--max-restarts", "8")
    assert r.code == 0, r.err[-2000:]
    clocks = _clocks(a)
    at = next(i for i, (_, f) in enumerate(clocks) if f"{os.sep}sentinel{os.sep}" in f)
    onset = clocks[at - 1][0] + 0.01  # the end of the last run before the check
    steady = [json.loads(x) for x in open(a / "decisions.jsonl")]
    assert not [e for e in steady if e["event"] == "drift_check" and e["changed"]]

    monkeypatch.setenv("VKIT_SIM_START_FILE", str(b / "sim-starts"))
    path = sim_state(b, monkeypatch, "--sim-slowdown", "1.3", "--sim-slowdown-after", f"{onset:.3f}")
    r = call("tune", *TUNE, "--max-restarts", "8")
    assert r.code == 0, r.err[-2000:]
    assert [c for c, _ in _clocks(b)][:at] == [c for c, _ in clocks][:at]  # alike up to the check
    log = [json.loads(x) for x in open(b / "decisions.jsonl")]
    checks = [e for e in log if e["event"] == "drift_check"]
    caught = checks[0]
    assert caught["changed"] and caught["detector"] == "capacity_low_end", caught
    assert all(m < 0 for m in caught["margins"]) and not caught["fresh_start"], caught
    assert "drift: the kept configuration fails its SLO at" in r.err
    # the baseline measured again after the alarm: a later generation, started after the check
    i = log.index(caught)
    again = [e for e in log[i:] if e["event"] == "baseline"]
    before = [e for e in log[:i] if e["event"] == "baseline"]
    assert again and again[0]["runs"] != before[-1]["runs"]
    st = json.loads(open(path).read())
    assert st["drift"]["detector"] == "capacity_low_end"


@pytest.mark.slow
def test_a_machine_slowing_through_every_search_has_no_baseline_and_the_tune_says_the_machine_drifts(
        tmp_path, monkeypatch):
    """The step time grows by 500 % an hour of simulated time, whatever the restarts: each of the baseline's
    searches reads its own level move (its last run at its anchor load is slower than its first ones), is measured
    again twice, and still reads it: the tune starts no step and says why, naming the machine, not the serving path."""
    sim_state(tmp_path, monkeypatch, "--sim-drift", "5")
    r = call("tune", *TUNE, "--max-restarts", "8")
    assert r.code == ExitCode.INVALID, r.err[-2000:]
    assert "the server's level moved during its capacity searches (level_moved)" in r.err
    assert "the serving machine is drifting" in r.err and "invariant anomalies" not in r.err
    log = [json.loads(x) for x in open(tmp_path / "decisions.jsonl")]
    assert not [e for e in log if e["event"] == "apply"]  # no step started
