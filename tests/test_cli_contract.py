"""Every bin/ tool: a console script, a runbook page, --help with examples and exit codes,
runs from a plain checkout, and ends quietly in a pipe."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, call
from vkit.errors import EXIT_CODE_HELP, ExitCode

TOOLS = sorted(f for f in os.listdir(os.path.join(REPO, "bin")) if not f.startswith("."))


def project_scripts() -> dict:
    """[project.scripts] of pyproject.toml (read by hand: tomllib is 3.11+, vkit supports 3.10)."""
    text = open(os.path.join(REPO, "pyproject.toml"), encoding="utf-8").read()
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^([\w.-]+)\s*=\s*"([^"]+)"', section, flags=re.M))


def test_there_are_tools():
    assert "state" in TOOLS


@pytest.mark.parametrize("tool", TOOLS)
def test_console_script_and_runbook_page(tool):
    scripts = project_scripts()
    assert scripts.get(f"vkit-{tool}") == f"vkit.cli.{tool}:main"
    assert os.path.exists(os.path.join(REPO, "runbook", f"{tool}.md"))
    assert os.access(os.path.join(REPO, "bin", tool), os.X_OK)
    assert callable(importlib.import_module(f"vkit.cli.{tool}").main)


@pytest.mark.parametrize("tool", TOOLS)
def test_help_lists_examples_and_exit_codes(tool):
    r = call(tool, "--help")
    assert r.code == 0
    assert "Examples:" in r.out and "Exit codes" in r.out
    for code in ExitCode:  # the whole enum, in every tool: a code means the same everywhere
        assert f"\n  {int(code):<4d}{EXIT_CODE_HELP[code]}" in r.out


def test_every_exit_code_has_help_text():
    from vkit.errors import EXIT_CODE_HELP

    assert set(EXIT_CODE_HELP) == set(ExitCode)


@pytest.mark.parametrize("tool", TOOLS)
def test_bad_flag_is_usage_error(tool):
    r = call(tool, "--no-such-flag-xyz")
    assert r.code == 2 and f"{tool}: error:" in r.err


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.e2e
def test_real_script_in_a_pipe(tool):
    # `tool --help | head -1` must end quietly (SIGPIPE default) from a plain checkout.
    p = subprocess.run(
        f"'{sys.executable}' bin/{tool} --help | head -1", shell=True, cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0 and p.stdout.startswith("usage:") and "Traceback" not in p.stderr


@pytest.mark.e2e
def test_state_smoke_pipe(tmp_path):
    st = str(tmp_path / "s.json")
    env = dict(os.environ, VKIT_STATE=st)
    p = subprocess.run(
        [sys.executable, "bin/state", "init", "--url", "http://127.0.0.1:8000", "--model", "m", "--set", "max_num_seqs=32",
         "--", "vllm", "serve", "/models/x", "--port", "8000"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )
    assert p.returncode == 0, p.stderr
    p = subprocess.run(
        f"'{sys.executable}' bin/state show --json | '{sys.executable}' -c 'import json,sys; d=json.load(sys.stdin); print(d[\"serve_command\"])'",
        shell=True, cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "vllm serve /models/x --port 8000 --max-num-seqs 32"


def test_internal_error_is_one_line_and_exit_5(monkeypatch, state_path):
    import vkit.cli.state as st

    def boom(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(st, "_show", boom)
    r = call("state", "--state", state_path, "show")
    assert r.code == 5 and "internal error" in r.err and "--traceback" in r.err and "Traceback" not in r.err
    r = call("state", "--state", state_path, "--traceback", "show")
    assert r.code == 5 and "Traceback" in r.err


def test_interrupt_is_130(monkeypatch, state_path):
    import vkit.cli.state as st

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(st, "_show", stop)
    assert call("state", "--state", state_path).code == 130


def test_json_flag_before_or_after_subcommand(state_path):
    assert call("state", "--state", state_path, "init", "--url", "http://h:1", "--model", "m", "--", "x").code == 0
    a = call("state", "--json", "--state", state_path, "show")
    b = call("state", "show", "--json", "--state", state_path)
    assert json.loads(a.out)["service"] == json.loads(b.out)["service"]


def test_state_default_from_env(tmp_path, monkeypatch):
    st = str(tmp_path / "env.json")
    monkeypatch.setenv("VKIT_STATE", st)
    assert call("state", "init", "--url", "http://h:1", "--model", "m", "--", "x").code == 0
    assert os.path.exists(st)


@pytest.mark.parametrize("tool", TOOLS)
def test_main_takes_the_four_streams(tool):
    import inspect

    params = list(inspect.signature(importlib.import_module(f"vkit.cli.{tool}").main).parameters)
    assert params == ["argv", "stdin", "stdout", "stderr"]


def test_stdin_is_a_parameter(monkeypatch):
    import io

    from vkit.cli import check_invariants

    text = open(os.path.join(REPO, "tests", "golden", "invariants", "aisbench_healthy.json"), encoding="utf-8").read()
    monkeypatch.setattr(sys, "stdin", io.StringIO("not a report"))  # never read: the parameter is
    out, err = io.StringIO(), io.StringIO()
    code = check_invariants.main(["-", "--json"], stdin=io.StringIO(text), stdout=out, stderr=err)
    assert code == 0 and json.loads(out.getvalue())["verdict"] == "valid", err.getvalue()
