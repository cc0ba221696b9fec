"""Shared test helpers: the repo root, a fresh state path, and calling a tool's main()."""

from __future__ import annotations

import importlib
import io
import os
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


class Result:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    def __repr__(self) -> str:  # shown when an assertion fails
        return f"Result(code={self.code}, out={self.out[-800:]!r}, err={self.err[-800:]!r})"


def call(tool: str, *argv: str) -> Result:
    """Run ``vkit.cli.<tool>.main(argv)`` in-process and capture its streams."""
    mod = importlib.import_module(f"vkit.cli.{tool}")
    out, err = io.StringIO(), io.StringIO()
    code = mod.main(list(argv), stdout=out, stderr=err)
    return Result(code, out.getvalue(), err.getvalue())


@pytest.fixture
def state_path(tmp_path):
    return str(tmp_path / "st" / "vkit.json")


@pytest.fixture
def repo():
    return REPO
