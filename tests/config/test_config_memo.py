"""The checked-config memo: a config that passed the schema check once is not
run through jsonschema again; anything else still is."""
from __future__ import annotations

import json

import jsonschema
import pytest

from pbs_power.config.hook_config import ConfigError, load_config
from pbs_power.config.checks import if_holds, load_schema
from pbs_power.config.memo import KEEP, MEMO_NAME

GOOD = {"power_on_off_enable": True, "node_idle_limit": "900",
        "power_backend": {"type": "simulated", "boot_seconds": 30}}


def write(tmp_path, doc, name="hook.json"):
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    path = tmp_path / name
    path.write_text(json.dumps(dict(doc, state_dir=str(state))))
    return path, state / MEMO_NAME


def no_jsonschema(mocker):
    return mocker.patch.object(jsonschema, "Draft7Validator",
                               side_effect=AssertionError("jsonschema used"))


def test_a_config_checked_once_loads_again_without_jsonschema(tmp_path, mocker):
    path, memo = write(tmp_path, GOOD)
    first = load_config(path)
    assert len(memo.read_text().split()) == 1
    no_jsonschema(mocker)
    again = load_config(path)
    assert again == first and again.node_idle_limit == 900   # coercion still runs


def test_an_edited_config_is_checked_again(tmp_path):
    path, memo = write(tmp_path, GOOD)
    load_config(path)
    path.write_text(json.dumps(dict(GOOD, state_dir=str(memo.parent), node_idle_limt=60)))
    with pytest.raises(ConfigError, match="node_idle_limt.*did you mean 'node_idle_limit'"):
        load_config(path)
    assert len(memo.read_text().split()) == 1             # the bad one is not remembered


def test_our_own_checks_run_even_for_a_remembered_config(tmp_path, mocker):
    path, memo = write(tmp_path, dict(GOOD, exclude_nodes="n[1-3]"))
    assert sorted(load_config(path).excluded_hosts) == ["n1", "n2", "n3"]
    no_jsonschema(mocker)
    assert sorted(load_config(path).excluded_hosts) == ["n1", "n2", "n3"]


def test_without_a_state_dir_nothing_is_written(tmp_path):
    path = tmp_path / "hook.json"
    path.write_text(json.dumps(dict(GOOD, state_dir=str(tmp_path / "missing"))))
    assert load_config(path).node_idle_limit == 900
    assert not (tmp_path / "missing").exists()


def test_a_damaged_memo_is_ignored_and_the_memo_stays_small(tmp_path):
    path, memo = write(tmp_path, GOOD)
    memo.write_bytes(b"\xff\xfe not a digest\n")
    assert load_config(path).node_idle_limit == 900
    assert len(memo.read_text().split()) == 1
    for limit in range(KEEP + 5):
        path.write_text(json.dumps(dict(GOOD, state_dir=str(memo.parent),
                                        node_idle_limit=600 + limit)))
        load_config(path)
    assert len(memo.read_text().split()) == KEEP


def _if_schemas(node):
    if isinstance(node, dict):
        if "if" in node:
            yield node["if"]
        for value in node.values():
            yield from _if_schemas(value)
    elif isinstance(node, list):
        for value in node:
            yield from _if_schemas(value)


@pytest.mark.parametrize("value", [
    {}, {"type": "simulated"}, {"type": "command"}, {"type": "ipmi", "auth": "none"},
    {"type": "redfish", "auth": "basic"}, {"auth": "none"}, {"type": 1}, {"type": None},
    {"type": ["redfish"]}, {"type": "Redfish"}])
def test_if_holds_agrees_with_jsonschema_on_every_shipped_if(value):
    schemas = list(_if_schemas(load_schema()))
    assert len(schemas) >= 10
    for schema in schemas:
        assert if_holds(schema, value) == jsonschema.Draft7Validator(schema).is_valid(value)
    other = {"properties": {"n": {"minimum": 3}}}             # not the simple form
    assert if_holds(other, {"n": 2}) is False and if_holds(other, {"n": 4}) is True
