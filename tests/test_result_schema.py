"""The tune result's schema (vkit.tune.result): from_dict refuses another version or a missing
key in one sentence, and a document goes through from_dict and to_dict unchanged."""

from __future__ import annotations

import copy
import json
import os

import pytest

from vkit.errors import ExitCode, UsageError
from vkit.tune.result import KEYS, OPTIONAL, REQUIRED, SCHEMA, SCHEMA_VERSION, ResultSchemaError, TuneResult

pytestmark = pytest.mark.unit

SAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden", "report", "sample_result.json")


def sample() -> dict:
    with open(SAMPLE, encoding="utf-8") as f:
        return json.load(f)


def full() -> dict:
    """The sample as tune writes it now: with the delivery's not_confirmed and the knowledge base."""
    return dict(sample(), not_confirmed=[], knowledge={"path": "/x/knowledge.jsonl", "matched": [], "ignored": []})


def test_the_version_is_the_schema_key_tune_has_always_written():
    assert SCHEMA_VERSION == 1 and SCHEMA == "vkit.tune/1" == sample()["schema"]
    assert set(REQUIRED) | set(OPTIONAL) == set(KEYS) and "schema" not in KEYS


@pytest.mark.parametrize("doc", [sample(), full()], ids=["golden sample", "with every key"])
def test_round_trip_is_exact(doc):
    before = copy.deepcopy(doc)
    r = TuneResult.from_dict(doc)
    assert doc == before  # from_dict does not touch its input
    out = r.to_dict()
    assert out == doc
    assert json.dumps(out, sort_keys=True) == json.dumps(doc, sort_keys=True)
    assert next(iter(out)) == "schema"
    assert TuneResult.from_dict(out) == r


def test_fields_read_as_attributes():
    r = TuneResult.from_dict(full())
    assert r.recommendation == full()["recommendation"] and r.trials == full()["trials"]
    assert r.not_confirmed == [] and r.knowledge["path"].endswith("knowledge.jsonl")


def test_a_missing_optional_key_stays_missing():
    r = TuneResult.from_dict(sample())
    assert set(r.absent) == set(OPTIONAL) and r.not_confirmed is None
    assert not set(OPTIONAL) & set(r.to_dict())


def test_unknown_keys_are_kept():
    doc = dict(full(), later_field={"a": 1})
    r = TuneResult.from_dict(doc)
    assert r.extra == {"later_field": {"a": 1}} and r.to_dict() == doc


def test_another_version_is_refused_with_both_versions_named():
    with pytest.raises(ResultSchemaError) as e:
        TuneResult.from_dict(dict(full(), schema="vkit.tune/2"))
    assert "'vkit.tune/2'" in str(e.value) and "vkit.tune/1" in str(e.value)
    assert isinstance(e.value, UsageError) and e.value.code == ExitCode.USAGE


def test_no_schema_key_is_refused():
    doc = full()
    del doc["schema"]
    with pytest.raises(ResultSchemaError, match="no 'schema' key .*vkit.tune/1"):
        TuneResult.from_dict(doc)


def test_missing_required_keys_are_named():
    doc = full()
    del doc["trials"], doc["timings"]
    with pytest.raises(ResultSchemaError, match=r"lacks the key\(s\) trials, timings"):
        TuneResult.from_dict(doc)


@pytest.mark.parametrize("doc", [None, [], "vkit.tune/1"])
def test_not_an_object_is_refused(doc):
    with pytest.raises(ResultSchemaError, match="JSON object"):
        TuneResult.from_dict(doc)
