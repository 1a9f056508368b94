"""The redfish backends against service trees captured from real vendors' BMCs.

Every tree in ``../shared/redfish-mockups`` is served by the faithful mock
BMC (tests/emulators/mock_bmc.py) and put through find system, power
state, on, off, read cap, set cap and uncap (tests/devices/redfish_vendor.py).
Each operation either works, checked against what the mock BMC holds, or
fails with one line that names the missing resource.
"""
from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from redfish_vendor import OPERATIONS, one_line, run_operations  # noqa: E402
from emulators.mock_bmc import mockup_dir, mockup_names  # noqa: E402

#: Trees whose nodes carry no power limit at all (what their README says).
CAPLESS = {"dmtf-public-bladed": "no power limit resource at chassis /redfish/v1/Chassis/Blade1 "
                                 "(no EnvironmentMetrics; no Power; no Controls)",
           "hpe-ilo-xl675d-a100": "no power limit resource at chassis /redfish/v1/Chassis/1/ "
                                  "(no EnvironmentMetrics; Power has no PowerControl with a "
                                  "PowerLimit; no Controls)"}
TREES = mockup_names()


@pytest.mark.skipif(not TREES, reason="../shared/redfish-mockups is not here")
@pytest.mark.parametrize("tree", TREES)
def test_every_operation_works_or_names_what_is_missing(tree, tmp_path):
    found = run_operations(mockup_dir(tree), str(tmp_path))
    assert set(found) == set(OPERATIONS)
    for op in ("find system", "power state", "on", "off"):
        assert found[op].ok, (op, found[op].text)
    for op in ("read cap", "set cap", "uncap"):
        assert one_line(found[op].text), (op, found[op].text)
    if tree in CAPLESS:
        for op in ("read cap", "set cap"):
            assert not found[op].ok
            assert CAPLESS[tree] in found[op].text, (op, found[op].text)
        assert found["uncap"].ok and CAPLESS[tree] in found["uncap"].text  # nothing to lift
        return
    if not found["read cap"].ok:  # a tree not described here: the line must say why
        assert "no power limit resource" in found["read cap"].text
        assert not found["set cap"].ok and "no power limit resource" in found["set cap"].text
        return
    assert found["set cap"].ok, found["set cap"].text
    assert found["uncap"].ok, found["uncap"].text
