"""Fixtures shared by several test files."""
from __future__ import annotations

import pytest

from emulators.ipmi_sim import SimFleet, build_dcmi_plugin, require_tools


@pytest.fixture(scope="session")
def dcmi_plugin(tmp_path_factory):
    """Our DCMI extension for ipmi_sim, built once per run (skips without the tools)."""
    require_tools()
    return build_dcmi_plugin(tmp_path_factory.mktemp("ipmi_sim_dcmi"))


@pytest.fixture
def sims(tmp_path, dcmi_plugin):
    """A fleet of ipmi_sim BMCs on 127.0.0.1; every one stopped at teardown."""
    fleet = SimFleet(tmp_path / "bmcs", dcmi_plugin)
    yield fleet
    fleet.stop()
