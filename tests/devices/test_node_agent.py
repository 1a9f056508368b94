"""The node agent ``pbs-power node gpu-caps``: in-process over mocked pynvml, and end to end
from the device controller through the command backend to the agent in its own processes,
where a stand-in pynvml module written by the test plays the GPUs (no GPU needed)."""
from __future__ import annotations

import io
import json
import os
import sys
import textwrap

import pytest

from pbs_power.cli.main import main
from pbs_power.devices.command import CommandDevices
from pbs_power.devices.controller import DeviceController, DeviceRequest
from pbs_power.devices.gpu_cap_state import STATE_FILE
from pbs_power.devices.node_agent import gpu_caps
from pbs_power.devices.nvml import NvmlDevices

pynvml = pytest.importorskip("pynvml")
from test_devices_nvml import FakeDriver, h100  # noqa: E402

SET_300 = {"gpu_policies": [{"gpu_id": 0, "power_limit": {"watts": 300}}]}


@pytest.fixture
def driver(mocker):
    return FakeDriver([h100("GPU-aaa"), h100("GPU-bbb", 650000)]).install(mocker)


def agent(tmp_path, operation, stdin="", device="gpu01"):
    return gpu_caps(operation, device, stdin, NvmlDevices(str(tmp_path)))


def test_show_set_restore(driver, tmp_path):
    shown = agent(tmp_path, "show")
    assert shown.code == 0 and shown.doc["saved"] == {}
    assert [(g["uuid"], g["limit_watts"], g["max_limit_watts"]) for g in shown.doc["gpus"]] == [
        ("GPU-aaa", 700, 700), ("GPU-bbb", 650, 700)]
    done = agent(tmp_path, "set", json.dumps(SET_300))
    assert done.code == 0 and done.doc["success"] is True
    assert done.doc["gpu_results"] == [{"gpu_id": 0, "ok": True, "power_cap_watts": 300,
                                        "diag_msg": "set"}]
    assert agent(tmp_path, "show").doc["saved"]["GPU-aaa"]["previous_mw"] == 700000
    back = agent(tmp_path, "restore", json.dumps({"gpu_ids": [0]}))
    assert back.code == 0 and back.doc["gpu_results"][0]["diag_msg"] == "restored 700 W"
    assert driver.limits() == [700, 650]


def test_device_kinds_take_a_device_request(driver, tmp_path):
    req = {"kind": "topology_activate", "request_id": "r-1", "device": "gpu01",
           "payload": {"policy_action": "set", "policy": {"name": "P", "limits": [
               {"element_type": "NODE", "power_limit": {"watts": 5000}},
               {"element_type": "GPU", "power_limit": {"watts": 400}}]}}}
    out = agent(tmp_path, "topology_activate", json.dumps(req))
    assert out.code == 0 and out.doc["request_id"] == "r-1" and driver.limits() == [400, 400]
    out = agent(tmp_path, "topology_deactivate", json.dumps({"payload": {}}))
    assert out.code == 0 and driver.limits() == [700, 650]


@pytest.mark.parametrize("operation,stdin,fragment", [
    ("set", "{oops", "stdin: not JSON"),
    ("set", "[1]", "stdin: must be a JSON object"),
    ("ping", json.dumps({"kind": "topology_activate"}), "does not match the operation"),
    ("restore", json.dumps({"gpu_ids": ["0"]}), "gpu_ids must be a list of GPU indices"),
    ("reboot", "", "unknown operation 'reboot'"),
])
def test_bad_input_exits_2(driver, tmp_path, operation, stdin, fragment):
    out = agent(tmp_path, operation, stdin)
    assert out.code == 2 and out.doc["success"] is False and fragment in out.doc["error"]
    assert driver.sets == []


def test_cli_prints_json_and_returns_the_status(driver, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(SET_300)))
    assert main(["node", "gpu-caps", "set", "gpu01", "--state-dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["gpu_results"][0]["power_cap_watts"] == 300
    driver.init_error = pynvml.NVMLError_DriverNotLoaded()
    assert main(["node", "gpu-caps", "show", "--state-dir", str(tmp_path)]) == 1
    answer = json.loads(capsys.readouterr().out)
    assert answer["success"] is False and "nvmlInit failed: Driver Not Loaded" in answer["error"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("{oops"))
    assert main(["node", "gpu-caps", "set", "--state-dir", str(tmp_path)]) == 2
    assert "pbs-power node gpu-caps set: stdin: not JSON" in capsys.readouterr().err


# -- end to end: controller -> command backend -> agent process -> (stand-in) NVML -----
FAKE_PYNVML = '''
"""Stand-in for pynvml, written by the test: GPUs live in the JSON file $FAKE_NVML_GPUS."""
import json, os

class NVMLError(Exception):
    pass

class NVMLError_NoPermission(NVMLError):
    def __str__(self):
        return "Insufficient Permissions"

def _load():
    with open(os.environ["FAKE_NVML_GPUS"]) as f:
        return json.load(f)

def nvmlInit():
    if not os.path.exists(os.environ["FAKE_NVML_GPUS"]):
        raise NVMLError("Driver Not Loaded")

def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return len(_load())
def nvmlDeviceGetHandleByIndex(i): return i
def nvmlDeviceGetUUID(h): return _load()[h]["uuid"]
def nvmlDeviceGetName(h): return "Stand-in GPU"
def nvmlDeviceGetPowerUsage(h): return 50000
def nvmlDeviceGetPowerManagementLimit(h): return _load()[h]["limit"]
def nvmlDeviceGetPowerManagementDefaultLimit(h): return 700000
def nvmlDeviceGetEnforcedPowerLimit(h): return _load()[h]["limit"]
def nvmlDeviceGetPowerManagementLimitConstraints(h): return [200000, 700000]

def nvmlDeviceSetPowerManagementLimit(h, mw):
    gpus = _load()
    if gpus[h].get("locked"):
        raise NVMLError_NoPermission()
    gpus[h]["limit"] = mw
    with open(os.environ["FAKE_NVML_GPUS"], "w") as f:
        json.dump(gpus, f)
'''

MODEL = json.dumps({"backend": "gpu-agent", "node": {"max_watts": 10000},
                    "gpu": {"count": 2, "max_watts": 700}})


@pytest.fixture
def remote(tmp_path, monkeypatch):
    """A controller whose 'gpu-agent' backend runs the agent as a separate process."""
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "pynvml.py").write_text(textwrap.dedent(FAKE_PYNVML))
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps([{"uuid": "GPU-1", "limit": 700000},
                                {"uuid": "GPU-2", "limit": 600000}]))
    monkeypatch.setenv("FAKE_NVML_GPUS", str(gpus))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(tmp_path / "fake")] + [p for p in os.environ.get("PYTHONPATH", "").split(
            os.pathsep) if p]))
    # what a site writes with its remote shell in front: ["ssh", "{host}", "pbs-power", ...]
    argv = [sys.executable, "-m", "pbs_power.cli.main", "node", "gpu-caps", "{operation}", "{host}",
            "--state-dir", str(tmp_path / "node-state")]
    ctl = DeviceController({"gpu-agent": CommandDevices(argv)}, default_timeout=60.0)
    yield ctl, gpus
    ctl.close()


def send(ctl, kind, payload):
    return ctl.send([DeviceRequest("gpu01", kind, payload, MODEL)])["gpu01"]


def limits(gpus):
    return [g["limit"] / 1000 for g in json.loads(gpus.read_text())]


def test_agent_through_the_command_backend(tmp_path, remote):
    ctl, gpus = remote
    ping = send(ctl, "ping", {"retry_count": 0})
    assert ping.success, ping.error
    assert [r.power_cap_watts for r in ping.gpu_results] == [700, 600]
    act = send(ctl, "resource_group_activate", {
        "resource_group": "rg_7", "gpu_policies": None, "policy": {
            "policy_action": "set", "policy": {"name": "Half", "limits": [
                {"element_type": "NODE", "power_limit": {"watts": 5000}},
                {"element_type": "GPU", "power_limit": {"percentage": 50}}]}}})
    assert act.success, act.error
    assert limits(gpus) == [350, 350]
    saved = json.loads((tmp_path / "node-state" / STATE_FILE).read_text())["gpus"]
    assert {u: e["previous_mw"] for u, e in saved.items()} == {"GPU-1": 700000,
                                                                "GPU-2": 600000}
    # deactivation is another process: it restores exactly what was there before
    off = send(ctl, "resource_group_deactivate", {"resource_group": "rg_7", "policy": None})
    assert off.success, off.error
    assert limits(gpus) == [700, 600]


def test_a_gpu_without_permission_is_reported_through_the_command_backend(remote):
    ctl, gpus = remote
    doc = json.loads(gpus.read_text())
    doc[1]["locked"] = True
    gpus.write_text(json.dumps(doc))
    resp = send(ctl, "gpu_policies_update", {"gpu_policies": [
        {"gpu_id": 0, "power_limit": {"watts": 300}}, {"gpu_id": 1, "power_limit": {"watts": 300}}]})
    assert not resp.success
    assert [(r.gpu_id, r.ok) for r in resp.gpu_results] == [(0, True), (1, False)]
    assert "GPU 1: cannot set 300 W: no permission" in resp.error
    assert resp.error.endswith("(exit status 1)")
    assert limits(gpus) == [300, 600]


def test_no_driver_on_the_node_is_a_clear_failure(remote):
    ctl, gpus = remote
    gpus.unlink()
    resp = send(ctl, "ping", {})
    assert not resp.success
    assert "NVML is not available: nvmlInit failed: Driver Not Loaded" in resp.ping_error
