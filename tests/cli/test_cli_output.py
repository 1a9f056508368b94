"""`pbs-power` as a pipeline member and with hostile values: no traceback, no non-JSON."""
from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

from pbs_power.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "config" / "topology.json"


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path, monkeypatch, capsys):
    state = str(tmp_path / "state")
    assert main(["topology", "import", "--state-dir", state, str(TOPOLOGY)]) == 0
    capsys.readouterr()
    read_end, write_end = os.pipe()
    os.close(read_end)                           # `| head` that has read enough
    gone = io.TextIOWrapper(os.fdopen(write_end, "wb"), line_buffering=True)
    monkeypatch.setattr(sys, "stdout", gone)
    assert main(["topology", "show", "--state-dir", state]) == 141
    monkeypatch.undo()
    gone.close()


def test_a_nan_property_is_refused_and_list_json_stays_json(tmp_path, capsys):
    state = str(tmp_path / "state")
    assert main(["topology", "import", "--state-dir", state, str(TOPOLOGY)]) == 0
    assert main(["topology", "activate", "--state-dir", state]) == 0
    assert main(["resource-group", "create", "--state-dir", state, "g1",
                 "--property", "ratio=NaN"]) == 2
    assert "NaN is not a JSON number" in capsys.readouterr().err
    assert main(["resource-group", "create", "--state-dir", state, "g1",
                 "--property", "ratio=0.5", "--property", "note=NaN-free"]) == 0
    capsys.readouterr()
    assert main(["resource-group", "list", "--state-dir", state, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out, parse_constant=lambda word: 1 / 0)
    assert listed


def test_a_deeply_nested_property_is_a_usage_error(tmp_path, capsys):
    deep = "[" * 5000 + "]" * 5000
    assert main(["resource-group", "create", "--state-dir", str(tmp_path / "s"), "g",
                 "--property", "a=" + deep]) == 2
    assert "nested too deeply" in capsys.readouterr().err
