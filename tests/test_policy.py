"""The parameter policy: refusals name the rule and the override; the runbook shows the same table."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import REPO, call
from vkit.apply.policy import Policy, parse_assignments, render_table, splice_table, to_serve_flags
from vkit.cli._common import load_policy
from vkit.errors import MustRunMissing, PolicyRefusal, UsageError

pytestmark = pytest.mark.unit


@pytest.fixture
def policy():
    return Policy.load()


@pytest.mark.parametrize("param", ["tensor_parallel_size", "--tensor-parallel-size", "dtype", "quantization", "model"])
def test_forbidden_change_refused_with_rule_and_override(policy, param):
    with pytest.raises(PolicyRefusal) as e:
        policy.check_change({param: 2})
    msg = str(e.value)
    assert "forbidden" in msg and "rule F" in msg and "--allow" in msg


def test_override_is_returned_for_the_log(policy):
    used = policy.check_change({"tensor_parallel_size": 2, "max_num_seqs": 64}, allow=["tensor-parallel-size"])
    assert len(used) == 1 and used[0].startswith("tensor_parallel_size")


def test_frozen_max_model_len(policy):
    assert policy.check_change({"max_model_len": 4096}) == []  # step 1 may move it
    policy.check_change({"max_model_len": 4096}, frozen={"max_model_len": 4096})  # unchanged value is fine
    with pytest.raises(PolicyRefusal, match="frozen at 4096.*F11"):
        policy.check_change({"max_model_len": 8192}, frozen={"max_model_len": 4096})


def test_unlisted_parameter_refused(policy):
    with pytest.raises(PolicyRefusal, match="not in the parameter table"):
        policy.check_change({"enforce_eager": True})


def test_situational_values_typed_and_range_checked(policy):
    got = parse_assignments(
        ["max-num-seqs=64", "enable_prefix_caching=false", "gpu_memory_utilization=0.9", "scheduling_policy=priority"], policy
    )
    assert got == {"max_num_seqs": 64, "enable_prefix_caching": False, "gpu_memory_utilization": 0.9, "scheduling_policy": "priority"}
    for bad in ("max_num_seqs=abc", "max_num_seqs=1.5", "scheduling_policy=lifo", "enable_prefix_caching=maybe", "noequals", "=3"):
        with pytest.raises(UsageError):
            parse_assignments([bad], policy)


def test_out_of_range_refused_with_override(policy):
    for change in ({"max_num_seqs": 0}, {"gpu_memory_utilization": 1.5}):
        with pytest.raises(PolicyRefusal, match="outside the policy range.*--allow"):
            policy.check_change(change)
    assert policy.check_change({"gpu_memory_utilization": 1.5}, allow=["gpu_memory_utilization"])


def test_serve_flags_are_argv_items_never_a_shell_string():
    argv = to_serve_flags({"max_num_seqs": 64, "enable_chunked_prefill": False, "enable_prefix_caching": True, "scheduling_policy": "a; rm -rf /"})
    assert argv == ["--no-enable-chunked-prefill", "--enable-prefix-caching", "--max-num-seqs", "64", "--scheduling-policy", "a; rm -rf /"]


def test_must_run_missing_refuses_analysis(policy):
    with pytest.raises(MustRunMissing, match="check_invariants"):
        policy.require({"post_start_verify"}, before="analysis")
    policy.require({"check_invariants"}, before="analysis")
    with pytest.raises(MustRunMissing, match="repeats"):
        policy.require({"check_invariants"}, before="gate")
    policy.require({"check_invariants", "repeats"}, before="gate")


def test_runbook_opens_with_the_same_table(policy):
    text = open(os.path.join(REPO, "runbook", "README.md"), encoding="utf-8").read()
    assert splice_table(text, render_table(policy)) == text, "runbook table is stale: run `make runbook-table`"
    # on the first page: the table starts within the first 15 lines
    first = text.splitlines()[:15]
    assert any(line.startswith("| class | rule |") for line in first)
    # and every rule id of the data appears in it
    for cls in ("forbidden", "must_change", "must_run", "situational"):
        for r in policy.data[cls]:
            assert f"| {r['id']} |" in text


def test_runbook_params_json_is_the_policy_the_tools_read():
    with open(os.path.join(REPO, "runbook", "params.json"), encoding="utf-8") as f:
        assert json.load(f) == Policy.load().data


def test_site_policy_from_env(tmp_path, monkeypatch, policy):
    data = dict(policy.data)
    data["forbidden"] = data["forbidden"] + [{"id": "F99", "param": "max_num_seqs", "why": "site rule"}]
    p = tmp_path / "site.json"
    p.write_text(json.dumps(data))
    monkeypatch.setenv("VKIT_POLICY", str(p))
    with pytest.raises(PolicyRefusal, match="F99"):
        load_policy().check_change({"max_num_seqs": 8})
    p.write_text("{broken")
    with pytest.raises(UsageError, match="not valid JSON"):
        load_policy()


def test_state_policy_command_prints_the_table():
    r = call("state", "policy")
    assert r.code == 0 and r.out == render_table(Policy.load())
    r = call("state", "policy", "--json")
    assert json.loads(r.out)["forbidden"][0]["id"] == "F1"


def test_one_config_value_comparison():
    from vkit.apply import verify
    from vkit.apply.policy import TRUE, same_value
    from vkit.validate import invariants

    assert same_value(True, "1") and same_value("on", True) and same_value(False, "0") and same_value(0.9, "0.9")
    assert same_value(16, "16.0") and same_value("FP8", "fp8") and same_value(None, "none")
    assert not same_value(True, "0") and not same_value(64, "65") and not same_value("auto", "fp8")
    assert invariants.same_value is same_value and verify.same_value is same_value
    assert Policy.load().coerce("enable_prefix_caching", "1") is True and "1" in TRUE
