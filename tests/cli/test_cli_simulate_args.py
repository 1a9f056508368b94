"""`pbs-power simulate` and `config show` say what they do with what they are given."""
from __future__ import annotations

import json

import pytest

from pbs_power.cli.main import main


@pytest.mark.parametrize("option,value", [("--nodes", "0"), ("--nodes", "-5"),
                                          ("--cycle", "0"), ("--cores-per-node", "0")])
def test_simulate_refuses_counts_below_one(option, value, capsys):
    assert main(["simulate", option, value]) == 2
    assert "must be 1 or more" in capsys.readouterr().err


def test_simulate_explains_its_columns_and_what_to_try_next(capsys):
    assert main(["simulate", "--managers", "pbs-power"]) == 0
    out, err = capsys.readouterr()
    assert "927 jobs, 100 nodes" in out and "days simulated (jobs submitted over 13.9 days" in out
    out = err
    assert "peak ramp: the largest change of cluster power within one minute" in out
    assert "Next: --trace YOUR.swf" in out


def test_config_show_without_a_file_shows_the_one_the_programs_load(tmp_path, monkeypatch,
                                                                    capsys):
    path = tmp_path / "hook.json"
    path.write_text(json.dumps({"node_idle_limit": 1234}))
    monkeypatch.setenv("PBS_POWER_CONFIG", str(path))
    assert main(["config", "show"]) == 0
    assert json.loads(capsys.readouterr().out)["node_idle_limit"] == 1234
    monkeypatch.setenv("PBS_POWER_CONFIG", str(tmp_path / "missing.json"))
    assert main(["config", "show"]) == 2
    assert "missing.json: file not found" in capsys.readouterr().err
