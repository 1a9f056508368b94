"""Power caps and resets on the shapes real BMCs give, served by the faithful mock BMC.

Each test takes a captured tree (../shared/redfish-mockups), changes what it
needs to in the mock's live resources, and checks what the mock BMC holds
afterwards, not only what the backend says.
"""
from __future__ import annotations

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from redfish_vendor import cap_request, limit_held, options  # noqa: E402
from emulators.mock_bmc import MockBmc, key, mockup_dir, mockup_names  # noqa: E402

from pbs_power.devices.redfish.backend import RedfishBackend, RedfishDevices  # noqa: E402
from pbs_power.states.model import TransitionKind as K  # noqa: E402

pytestmark = pytest.mark.skipif(not mockup_names(), reason="../shared/redfish-mockups absent")
TOWER_POWER = "/redfish/v1/Chassis/Tower/Power"
CRAY_LIMIT = "/redfish/v1/Chassis/Node0/Controls/NodePowerLimit"


@pytest.fixture
def lab(tmp_path):
    started = []

    class Lab:
        def bmc(self, tree: str, **kw) -> MockBmc:
            bmc = MockBmc(mockup_dir(tree), users={"admin": "pw"}, **kw)
            started.append(bmc)
            return bmc

        def devices(self, bmc: MockBmc, system_id=None, **kw) -> RedfishDevices:
            if bmc.server is None:
                bmc.start()
            dev = RedfishDevices(options(bmc, "n1", str(tmp_path), system_id, **kw))
            started.append(dev)
            return dev

        def backend(self, bmc: MockBmc, system_id=None, **kw) -> RedfishBackend:
            if bmc.server is None:
                bmc.start()
            back = RedfishBackend(options(bmc, "n1", str(tmp_path), system_id, **kw),
                                  str(tmp_path / "state"))
            started.append(back)
            return back

    yield Lab()
    for thing in reversed(started):
        (thing.stop if isinstance(thing, MockBmc) else thing.close)()


def patches(bmc: MockBmc):
    return [(r.path, r.body) for r in bmc.requests if r.method == "PATCH"]


# -- PowerCapacityWatts is a supply's capacity, not a limit ------------------------------
def test_capacity_zero_is_unknown_never_a_limit_and_uncap_restores_the_limit(lab):
    bmc = lab.bmc("dmtf-public-tower")
    bmc.doc(TOWER_POWER)["PowerControl"][0]["PowerCapacityWatts"] = 0
    devices = lab.devices(bmc, cap_out_of_range="refuse")
    resp = devices.handle(cap_request("n1", 400, None))
    assert resp.success, resp.error
    assert resp.power_cap_watts == 400 and limit_held(bmc, TOWER_POWER) == (400, None)
    resp = devices.handle(cap_request("n1", None, resp.device_state_json))
    assert resp.success, resp.error
    assert limit_held(bmc, TOWER_POWER) == (1045, None)  # what it held before: not 0, not max
    assert [body for _p, body in patches(bmc)] == [
        {"PowerControl": [{"PowerLimit": {"LimitInWatts": 400}}]},
        {"PowerControl": [{"PowerLimit": {"LimitInWatts": 1045}}]}]


def test_a_percentage_is_never_taken_of_psu_capacity(lab, tmp_path):
    bmc = lab.bmc("hpe-ilo5-dl325").start()
    devices = lab.devices(bmc)
    node_less = cap_request("n1", None, None, percentage=50)
    node_less = node_less.__class__(**dict(node_less.__dict__, device_model_json=json.dumps(
        {"backend": "redfish", "device_spec": "n", "node": {}})))
    resp = devices.handle(node_less)
    assert not resp.success
    assert "needs a maximum" in resp.error and "PowerCapacityWatts (1000 W) is the power " \
        "supplies' capacity, not a limit" in resp.error
    assert patches(bmc) == []
    resp = devices.handle(cap_request("n1", None, None, percentage=50))  # node max 1000 W
    assert resp.success and limit_held(bmc, "/redfish/v1/Chassis/1/Power") == (500, None)


def test_uncap_on_a_bmc_that_was_uncapped_writes_null_back(lab):
    bmc = lab.bmc("hpe-ilo5-dl325")
    devices = lab.devices(bmc)
    first = devices.handle(cap_request("n1", 600, None))
    assert first.success and limit_held(bmc, "/redfish/v1/Chassis/1/Power") == (600, None)
    lifted = devices.handle(cap_request("n1", None, first.device_state_json))
    assert lifted.success and lifted.power_cap_watts is None
    assert limit_held(bmc, "/redfish/v1/Chassis/1/Power") == (None, None)
    # iLO needs If-Match with its ETag; each PATCH carried the current one
    assert all(r.headers.get("If-Match", "").startswith('W/"') for r in bmc.requests
               if r.method == "PATCH")


def test_uncap_without_a_saved_state_sends_null_not_the_maximum(lab):
    bmc = lab.bmc("dmtf-public-tower")
    devices = lab.devices(bmc)
    resp = devices.handle(cap_request("n1", None, None))
    assert resp.success and resp.power_cap_watts is None
    assert limit_held(bmc, TOWER_POWER) == (None, None)


# -- Controls: SettingRange, ControlMode, PhysicalContext, SetPointUnits -----------------
def test_cray_control_setting_range_clamps_enables_and_restores_disabled(lab):
    bmc = lab.bmc("hpe-cray-ex425")
    devices = lab.devices(bmc, system_id="Node0")
    ping = devices.ping(["n1"])["n1"]
    assert ping.cap_watts is None and ping.cap_range == (350, 925)
    assert "capping disabled (ControlMode Disabled" in ping.error
    resp = devices.handle(cap_request("n1", 200, None))    # below SettingRangeMin 350
    assert resp.success, resp.error
    assert resp.power_cap_watts == 350 and limit_held(bmc, CRAY_LIMIT) == (350, "Automatic")
    assert "clamped to 350 W" in json.loads(resp.device_state_json)["note"]
    resp = devices.handle(cap_request("n1", None, resp.device_state_json))
    assert resp.success and limit_held(bmc, CRAY_LIMIT) == (350, "Disabled")
    strict = lab.devices(bmc, system_id="Node0", cap_out_of_range="refuse")
    refused = strict.handle(cap_request("n1", 200, None))
    assert not refused.success and "outside the allowed range 350-925 W" in refused.error


def test_absolute_watts_need_no_maximum(lab):
    bmc = lab.bmc("hpe-cray-ex425")
    devices = lab.devices(bmc, system_id="Node1")
    request = cap_request("n1", 400, None)
    request = request.__class__(**dict(request.__dict__, device_model_json=json.dumps(
        {"backend": "redfish", "device_spec": "n", "node": {}})))
    resp = devices.handle(request)
    assert resp.success, resp.error
    assert limit_held(bmc, "/redfish/v1/Chassis/Node1/Controls/NodePowerLimit")[0] == 400


def _gpu_control_first(bmc: MockBmc) -> str:
    """A GPU power control listed before the chassis one (as some BMCs order them)."""
    gpu = "/redfish/v1/Chassis/1U/Controls/GPU0Power"
    bmc.docs[key(gpu)] = {"@odata.id": gpu, "@odata.type": "#Control.v1_7_0.Control",
                          "Id": "GPU0Power", "ControlType": "Power", "PhysicalContext": "GPU",
                          "ControlMode": "Automatic", "SetPoint": 300, "SetPointUnits": "W",
                          "AllowableMin": 100, "AllowableMax": 400}
    members = bmc.doc("/redfish/v1/Chassis/1U/Controls")["Members"]
    members.insert(0, {"@odata.id": gpu})
    return gpu


def test_the_node_control_is_chosen_by_physical_context_not_order(lab):
    bmc = lab.bmc("dmtf-public-rackmount1")
    gpu = _gpu_control_first(bmc)
    devices = lab.devices(bmc, cap_resource="Controls")
    resp = devices.handle(cap_request("n1", 400, None))
    assert resp.success, resp.error
    assert limit_held(bmc, "/redfish/v1/Chassis/1U/Controls/PowerLimit") == (400, "Automatic")
    assert bmc.doc(gpu)["SetPoint"] == 300 and [p for p, _b in patches(bmc)] == [
        "/redfish/v1/Chassis/1U/Controls/PowerLimit"]


def test_a_percent_control_is_read_and_written_in_percent(lab):
    bmc = lab.bmc("dmtf-public-liquid-cooled-server")
    control = bmc.doc("/redfish/v1/Chassis/1U/Controls/PowerLimit")
    control.update(SetPoint=80, SetPointUnits="%", AllowableMin=20, AllowableMax=100)
    devices = lab.devices(bmc, cap_resource="Controls")
    resp = devices.handle(cap_request("n1", 400, None))      # node max_watts 1000
    assert resp.success, resp.error
    assert control["SetPoint"] == 40 and resp.power_cap_watts == 400
    resp = devices.handle(cap_request("n1", 100, None))      # 10% is below AllowableMin 20%
    assert control["SetPoint"] == 20 and resp.power_cap_watts == 200


# -- resets: ActionInfo ----------------------------------------------------------------
@pytest.mark.parametrize("tree,system_id", [("hpe-cray-ex425", "Node0"),
                                            ("openbmc-bmcweb", None)])
def test_reset_types_from_action_info(lab, tree, system_id):
    bmc = lab.bmc(tree)
    backend = lab.backend(bmc, system_id=system_id)
    system = bmc.systems()[0]
    bmc.doc(system)["PowerState"] = "On"
    sent = backend.request(K.POWER_OFF, ["n1"], 0)["n1"]
    assert sent.ok, sent.diag
    expected = "ForceOff" if tree == "hpe-cray-ex425" else "GracefulShutdown"
    assert bmc.resets == [(system, expected)] and bmc.power_state(system) == "Off"
    assert any(key(r.path) == key(system + "/ResetActionInfo") for r in bmc.requests)


# -- chassis links, nested ids, ETags -------------------------------------------------------
def test_every_linked_chassis_is_tried(lab):
    bmc = lab.bmc("dmtf-public-rackmount1")
    system = bmc.doc(bmc.systems()[0])
    system["Links"]["Chassis"] = [{"@odata.id": "/redfish/v1/Chassis/Gone"}] + \
        system["Links"]["Chassis"]
    devices = lab.devices(bmc)
    resp = devices.handle(cap_request("n1", 400, None))
    assert resp.success, resp.error
    assert limit_held(bmc, "/redfish/v1/Chassis/1U/EnvironmentMetrics") == (400, "Automatic")


def test_a_nested_system_id_is_sent_as_a_path(lab):
    bmc = lab.bmc("dmtf-public-tower")
    old = "/redfish/v1/Systems/437XR1238R2"
    doc = bmc.docs.pop(key(old))
    nested = "/redfish/v1/Systems/RackMount/Baseboard"
    doc["@odata.id"] = nested
    doc["Actions"]["#ComputerSystem.Reset"]["target"] = nested + "/Actions/ComputerSystem.Reset"
    bmc.docs[key(nested)] = doc
    backend = lab.backend(bmc, system_id="RackMount/Baseboard")
    assert backend.status(["n1"], 0)["n1"].state.value == "on", backend.last_errors
    assert backend.request(K.POWER_OFF, ["n1"], 0)["n1"].ok
    assert doc["PowerState"] == "Off"
    assert not any("%2F" in r.path.upper() for r in bmc.requests)


def test_an_etag_given_only_as_a_header_is_sent_as_if_match(lab):
    bmc = lab.bmc("hpe-ilo5-dl325", etag_in_body=False, require_if_match=True)
    devices = lab.devices(bmc)
    resp = devices.handle(cap_request("n1", 500, None))
    assert resp.success, resp.error
    assert limit_held(bmc, "/redfish/v1/Chassis/1/Power") == (500, None)


def test_a_stale_etag_is_refused_by_the_bmc_and_reported(lab):
    bmc = lab.bmc("hpe-ilo5-dl325")
    devices = lab.devices(bmc)
    original = bmc.handle

    def change_between_read_and_patch(method, path, headers, body):
        if method == "PATCH":
            bmc._bump(bmc.doc("/redfish/v1/Chassis/1/Power"))
        return original(method, path, headers, body)
    bmc.handle = change_between_read_and_patch
    resp = devices.handle(cap_request("n1", 500, None))
    assert not resp.success and "HTTP 412 on PATCH /redfish/v1/Chassis/1/Power" in resp.error
