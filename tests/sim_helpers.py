"""Helpers for tests that start sim_server processes through vkit's own launcher."""

from __future__ import annotations

import json
import os
import sys

from bench.harness import free_port  # noqa: F401  (one definition, bench's and the tests')
from tests.conftest import REPO

SIM_FAST = ["--sim-speed", "20", "--sim-startup-s", "0.2", "--sim-seed", "1"]


def sim_argv(port: int, *extra: str, model: str = "sim-8b") -> list[str]:
    return [sys.executable, os.path.join(REPO, "bin", "sim_server"), model, "--port", str(port), *SIM_FAST, *extra]


def make_test_policy(tmp_path) -> str:
    """The shipped policy plus the simulator's fault flags as tunables, so tests can make a
    candidate fail through the same --set path a real parameter takes."""
    from vkit.apply.policy import Policy

    data = json.loads(json.dumps(Policy.load().data))
    data["situational"] += [
        {"id": "T1", "param": "sim_fail_at_start", "type": "bool", "candidates": [True], "step": 9, "why": "test fault"},
        {"id": "T2", "param": "sim_hang_health", "type": "bool", "candidates": [True], "step": 9, "why": "test fault"},
        {"id": "T3", "param": "sim_crash_after", "type": "int", "min": 0, "max": 10**6, "candidates": [0], "step": 9, "why": "test fault"},
        {"id": "T4", "param": "sim_startup_s", "type": "float", "min": 0, "max": 600, "candidates": [1], "step": 9, "why": "test"},
        {"id": "T5", "param": "sim_gpu", "type": "str", "candidates": ["H200"], "step": 9, "why": "test"},
    ]
    p = tmp_path / "policy.json"
    p.write_text(json.dumps(data))
    return str(p)
