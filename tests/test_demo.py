"""`make demo`'s own script on the simulator: the capacity tune, step 1 then the twin-guided search.
What a newcomer sees is what this test reads."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.conftest import REPO
from tests.sim_helpers import free_port
from vkit.state import StateFile

pytestmark = pytest.mark.e2e


def test_demo_script_tunes_the_slo_capacity_with_the_twin_and_shows_its_predictions_beside_the_server(tmp_path):
    d = tmp_path / "demo"
    env = dict(os.environ, PY=sys.executable, DEMO_DIR=str(d), DEMO_PORT=str(free_port()))
    env.pop("VKIT_STATE", None)
    p = subprocess.run(["bash", os.path.join(REPO, "runbook", "demo_tune.sh")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    out, err = p.stdout, p.stderr
    st = StateFile(str(d / "vkit.json")).read()
    # said loudly: a simulated server, the speed-up
    assert "SIMULATED" in err and "8x faster" in err and "SIMULATED" in out
    # the objective: SLO capacity; the baseline's capacity with its σ (three capacity searches)
    assert "Goal: max SLO capacity" in out
    # σ is printed to 3 significant figures: at the capacity σ's 5 % floor that is "5%", no decimal point
    # three repeats, or more where a run the client fell behind on was measured again on a new start
    m = re.search(r"Baseline \(.*?(\d+)\s+repeats\): SLO capacity [\d.]+ req/s σ \d+(\.\d+)?%", out, re.S)
    assert m and int(m.group(1)) >= 3, out[:1500]
    # step 1, then the twin's proposals, each trial with its verdict and why
    steps = [t["step"] for t in st["trials"]]
    assert steps[0] == "1" and "twin" in steps and set(steps) == {"1", "twin"}, steps
    flat = " ".join(out.split())
    for t in st["trials"]:
        assert re.search(rf"\b{t['id']}\s+{t['step']}\s", out), t["id"]
        if t.get("why"):
            assert f"why: {' '.join(t['why'].split())[:60]}" in flat, t["id"]
    # the twin: fitted to the baseline's load points (the profile in the decision log), and every configuration
    # it had restarted shown with its prediction and 90 % interval beside what the server measured
    res = json.load(open(st["tune"]["report"]["json"]))
    tw = res["capacity"]["twin"]
    assert len(tw["profile_sha256"]) == 64 and tw["rows"], tw
    twin_trials = [t["id"] for t in st["trials"] if t["step"] == "twin"]
    assert [r["trial_id"] for r in tw["rows"]] == twin_trials
    assert "Twin vs measured" in out
    for r in tw["rows"]:
        assert r["lo"] <= r["predicted"] <= r["hi"], r
        line = f"{r['trial_id']}: predicted "
        assert line in flat and "measured" in flat.split(line, 1)[1][:80], r["trial_id"]
    # the stop rule names the twin's reason: the restart budget, no interval reaching past the best, or its trials
    stop = next(s["stop_rule"] for s in st["steps"] if s["step"] == "twin")
    assert any(w in stop for w in ("--max-restarts 8", "interval reaches", "trials for step twin spent")), stop
    # every configuration's capacity with its 95 % interval, tok/s, per-user tok/s at the reference load, binding SLO
    ref = st["capacity_reference"]["load"]
    assert f"SLO capacity (req/s; per-user tok/s at {ref:.4g} req/s):" in out
    assert re.search(r"kept: [\d.]+ \[[\d.]+–[\d.]+\], \d+ tok/s, [\d.]+ tok/s per user, binding \w+", flat)
    # the lead: where the tune started and what it recommends, each with its interval, the gain with its interval
    assert re.search(r"Started at [\d.]+ req/s \[[\d.]+, [\d.]+\]", flat), flat[:800]
    ach = json.load(open(st["tune"]["report"]["json"]))["capacity"]["achieved"]
    start = ach["start"]["config"]
    assert (start["max_num_batched_tokens"], start["max_num_seqs"]) == (2048, 16)  # the demo's starting configuration
    lo, hi = ach["start"]["interval"]
    assert lo < ach["start"]["req_s"] < hi
    # one gauge: every capacity search of the tune is the interval estimate, and the tune stays within its restarts
    for f in [p for t in st["trials"] for p in t.get("runs") or []]:
        doc = json.load(open(os.path.join(d, f)))
        if "slo_capacity" in doc:
            assert doc["vkit"]["capacity"]["method"] == "model" and doc["capacity_holds"] < doc["capacity_fails"]
    assert res["timings"]["restarts"] <= 8 + 3 + 1, res["timings"]
    # the knee, the Pareto configurations with dominance rates, the recommendation and the flags to deploy
    # (the terminal wraps at 78 columns: "dominance rate" can break across a line, so it is looked for in the flat text)
    assert "Knee: " in out and "dominance rate" in flat and "Recommendation:" in out
    deploy = out.split("Deploy with:\n", 1)[1]
    for k, v in res["recommendation"]["config"].items():  # the kept configuration, or the goal's pick (said why)
        assert f"--{k.replace('_', '-')}" in deploy and str(v) in deploy
    if res["recommendation"]["config"] != st["kept"]["config"]:
        assert "then interactivity" in res["recommendation"]["why"]
    # the report: Markdown and one self-contained HTML page with inline SVG plots, the capacity curves among them
    rep = st["tune"]["report"]
    html = open(rep["html"], encoding="utf-8").read()
    root = ET.fromstring(html.split("<!DOCTYPE html>", 1)[-1].strip())
    svgs = [e for e in root.iter() if e.tag.endswith("svg")]
    assert len(svgs) >= 4 and 'id="plot-capacity"' in html and 'id="plot-twin"' in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # self-contained: nothing fetched
    assert os.path.getsize(rep["md"]) > 1000
    res = json.load(open(rep["json"]))
    assert res["recommendation"]["capacity"]["req_s"] > 0 and res["recommendation"]["binding_slo"]
    # the server is left running the kept configuration (the demo's script stops it on exit)
    assert (st["service"].get("running") or {}).get("config") in (None, st["kept"]["config"])
