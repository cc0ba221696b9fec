"""`make demo`'s own script on the simulator: the capacity tune, steps 1 to 3. What a newcomer sees
is what this test reads."""

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


def test_demo_script_tunes_the_slo_capacity_steps_1_to_3(tmp_path):
    d = tmp_path / "demo"
    env = dict(os.environ, PY=sys.executable, DEMO_DIR=str(d), DEMO_PORT=str(free_port()), SIM_SPEED="4")
    env.pop("VKIT_STATE", None)
    p = subprocess.run(["bash", os.path.join(REPO, "runbook", "demo_tune.sh")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    out, err = p.stdout, p.stderr
    st = StateFile(str(d / "vkit.json")).read()
    # said loudly: a simulated server, the speed-up
    assert "SIMULATED" in err and "4x faster" in err and "SIMULATED" in out
    # the objective: SLO capacity; the baseline's capacity with its σ (three capacity searches)
    assert "Goal: max SLO capacity" in out
    # σ is printed to 3 significant figures: at the capacity σ's 5 % floor that is "5%", no decimal point
    assert re.search(r"Baseline \(.*3\s+repeats\): SLO capacity [\d.]+ req/s σ \d+(\.\d+)?%", out, re.S), out[:1500]
    # steps 1 to 3 ran, each trial with its verdict and why
    steps = {t["step"] for t in st["trials"]}
    assert {"1", "2", "3"} <= steps, steps
    flat = " ".join(out.split())
    for t in st["trials"]:
        assert re.search(rf"\b{t['id']}\s+{t['step']}\s", out), t["id"]
        if t.get("why"):
            assert f"why: {' '.join(t['why'].split())[:60]}" in flat, t["id"]
    # every configuration's capacity: holds / fails, tok/s, per-user tok/s at the reference load, binding SLO
    ref = st["capacity_reference"]["load"]
    assert f"SLO capacity (req/s; per-user tok/s at {ref:.4g} req/s):" in out
    assert re.search(r"kept: holds [\d.]+, fails [\d.–]+, \d+ tok/s, [\d.]+ tok/s per user, binding \w+", flat)
    # the drift sentinel under the capacity objective: the kept configuration checked after each step at the
    # low end of its capacity's interval (one or two runs, not a whole search), each check in the report
    checks = st["drift_checks"]
    assert len(checks) == len(st["steps"]) - 1 and all(c["detector"] == "capacity_low_end" for c in checks), checks
    md = open(st["tune"]["report"]["md"], encoding="utf-8").read()
    for c in checks:
        assert c["load"] < c["capacity"] and 1 <= c["runs"] <= 2, c
        assert f"| `{c['after_trial']}` | {'yes' if c['changed'] else 'no'} | {c['why']} |" in md, c
    # the knee, the Pareto configurations with dominance rates, the recommendation and the flags to deploy
    assert "Knee: " in out and "dominance rate" in out and "Recommendation:" in out
    deploy = out.split("Deploy with:\n", 1)[1]
    res = json.load(open(st["tune"]["report"]["json"]))
    for k, v in res["recommendation"]["config"].items():  # the kept configuration, or the goal's pick (said why)
        assert f"--{k.replace('_', '-')}" in deploy and str(v) in deploy
    if res["recommendation"]["config"] != st["kept"]["config"]:
        assert "then interactivity" in res["recommendation"]["why"]
    # the report: Markdown and one self-contained HTML page with inline SVG plots, the capacity curves among them
    rep = st["tune"]["report"]
    html = open(rep["html"], encoding="utf-8").read()
    root = ET.fromstring(html.split("<!DOCTYPE html>", 1)[-1].strip())
    svgs = [e for e in root.iter() if e.tag.endswith("svg")]
    assert len(svgs) >= 3 and 'id="plot-capacity"' in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # self-contained: nothing fetched
    assert os.path.getsize(rep["md"]) > 1000
    res = json.load(open(rep["json"]))
    assert res["recommendation"]["capacity"]["req_s"] > 0 and res["recommendation"]["binding_slo"]
    # the server is left running the kept configuration (the demo's script stops it on exit)
    assert (st["service"].get("running") or {}).get("config") in (None, st["kept"]["config"])
