"""`make demo`'s own script, steps 1 to 5, on the simulator at a higher speed-up: what a newcomer
sees is what this test reads."""

from __future__ import annotations

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


def test_demo_script_runs_the_staged_tune_steps_1_to_5(tmp_path):
    d = tmp_path / "demo"
    env = dict(os.environ, PY=sys.executable, DEMO_DIR=str(d), DEMO_PORT=str(free_port()), SIM_SPEED="8", PROMPTS="100")
    env.pop("VKIT_STATE", None)
    p = subprocess.run(["bash", os.path.join(REPO, "runbook", "demo_tune.sh")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    out, err = p.stdout, p.stderr
    st = StateFile(str(d / "vkit.json")).read()
    # said loudly: a simulated server, the speed-up
    assert "SIMULATED" in err and "8x faster" in err and "SIMULATED" in out
    # the baseline with σ per metric
    assert re.search(r"Baseline \(.*4\s+repeats\): output throughput \d+ tok/s σ \d+\.\d+%", out, re.S)
    # every step ran, each trial with its verdict and why
    steps = {t["step"] for t in st["trials"]}
    assert {"1", "2", "3", "4", "5"} <= steps, steps
    flat = " ".join(out.split())
    for t in st["trials"]:
        assert re.search(rf"\b{t['id']}\s+{t['step']}\s", out), t["id"]
        if t.get("why"):
            assert f"why: {' '.join(t['why'].split())[:60]}" in flat, t["id"]
    # a drift check after every staged step, over the kept configuration's series (its baseline or the runs of
    # the confirmation that kept it, confirmation A runs, sentinels: more than the sentinel alone), in the output
    runs = [c["runs"] for c in st["drift_checks"]]
    assert len(runs) == 3 and min(runs) >= 3, runs  # steps 2, 3 and 4
    assert f"series of {', '.join(map(str, runs))} runs" in flat
    # the knee, the Pareto configurations with dominance rates, the recommendation and the flags to deploy
    assert "Knee: t" in out and "dominance rate" in out and "Recommendation:" in out
    deploy = out.split("Deploy with:\n", 1)[1]
    for k, v in st["kept"]["config"].items():
        assert f"--{k.replace('_', '-')}" in deploy and str(v) in deploy
    # the report: Markdown and one self-contained HTML page with inline SVG plots
    rep = st["tune"]["report"]
    html = open(rep["html"], encoding="utf-8").read()
    root = ET.fromstring(html.split("<!DOCTYPE html>", 1)[-1].strip())
    svgs = [e for e in root.iter() if e.tag.endswith("svg")]
    assert len(svgs) >= 2 and not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # self-contained: nothing fetched
    assert os.path.getsize(rep["md"]) > 1000
    # the server is left running the kept configuration (the demo's script stops it on exit)
    assert (st["service"].get("running") or {}).get("config") in (None, st["kept"]["config"])
