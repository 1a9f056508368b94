"""GPU power limits through NVML: pynvml mocked (a fake driver), plus one read-only real-GPU test."""
from __future__ import annotations

import json
import sys

import pytest

pynvml = pytest.importorskip("pynvml")

from pbs_power.devices.controller import DeviceRequest  # noqa: E402
from pbs_power.devices.gpu_cap_state import STATE_FILE, CapStateError  # noqa: E402
from pbs_power.devices.nvml import (RESTORE, CapPlan, GpuCaps, NvmlDevices,  # noqa: E402
                                    NvmlUnavailable, plan_of)
from pbs_power.groups.policy import PowerLimit  # noqa: E402


class FakeDriver:
    """What the mocked pynvml functions answer: GPUs with limits in milliwatts."""

    def __init__(self, gpus):
        self.gpus = [dict(g) for g in gpus]
        self.sets = []
        self.init_error = None

    def install(self, mocker):
        nv = pynvml
        gpu = lambda h: self.gpus[h]  # noqa: E731 - the handle is the index
        mocker.patch.object(nv, "nvmlInit", side_effect=self._init)
        mocker.patch.object(nv, "nvmlShutdown")
        mocker.patch.object(nv, "nvmlDeviceGetCount", side_effect=lambda: len(self.gpus))
        mocker.patch.object(nv, "nvmlDeviceGetHandleByIndex", side_effect=self._handle)
        mocker.patch.object(nv, "nvmlDeviceGetUUID", side_effect=lambda h: gpu(h)["uuid"])
        mocker.patch.object(nv, "nvmlDeviceGetName", side_effect=lambda h: b"NVIDIA H100")
        mocker.patch.object(nv, "nvmlDeviceGetPowerUsage", side_effect=lambda h: 81234)
        mocker.patch.object(nv, "nvmlDeviceGetPowerManagementLimit",
                            side_effect=lambda h: gpu(h)["limit"])
        mocker.patch.object(nv, "nvmlDeviceGetPowerManagementDefaultLimit",
                            side_effect=lambda h: gpu(h)["default"])
        mocker.patch.object(nv, "nvmlDeviceGetEnforcedPowerLimit",
                            side_effect=lambda h: gpu(h)["limit"])
        mocker.patch.object(nv, "nvmlDeviceGetPowerManagementLimitConstraints",
                            side_effect=lambda h: [gpu(h)["min"], gpu(h)["max"]])
        mocker.patch.object(nv, "nvmlDeviceSetPowerManagementLimit", side_effect=self._set)
        return self

    def _init(self):
        if self.init_error is not None:
            raise self.init_error

    def _handle(self, index):
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return index

    def _set(self, handle, milliwatts):
        if self.gpus[handle].get("locked"):
            raise pynvml.NVMLError_NoPermission()
        if not self.gpus[handle]["min"] <= milliwatts <= self.gpus[handle]["max"]:
            raise pynvml.NVMLError_InvalidArgument()
        self.sets.append((handle, milliwatts))
        self.gpus[handle]["limit"] = milliwatts

    def limits(self):
        return [g["limit"] / 1000 for g in self.gpus]


def h100(uuid, limit=700000, **extra):
    return dict(uuid=uuid, limit=limit, default=700000, min=200000, max=700000, **extra)


@pytest.fixture
def driver(mocker):
    return FakeDriver([h100("GPU-aaa"), h100("GPU-bbb", 650000)]).install(mocker)


def caps(tmp_path, mode="clamp"):
    return GpuCaps(str(tmp_path), mode)


def test_inventory_reads_every_field(driver, tmp_path):
    gpus = caps(tmp_path).inventory()
    assert [(g.index, g.uuid, g.name) for g in gpus] == [(0, "GPU-aaa", "NVIDIA H100"),
                                                         (1, "GPU-bbb", "NVIDIA H100")]
    g = gpus[1]
    assert (g.power_watts, g.limit_watts, g.default_limit_watts, g.enforced_limit_watts,
            g.min_limit_watts, g.max_limit_watts, g.diag) == (81.234, 650, 700, 650, 200, 700, "")


def test_a_field_nvml_refuses_is_reported_not_fatal(driver, mocker, tmp_path):
    mocker.patch.object(pynvml, "nvmlDeviceGetPowerUsage",
                        side_effect=pynvml.NVMLError_NotSupported())
    gpu = caps(tmp_path).inventory()[0]
    assert gpu.power_watts is None and gpu.limit_watts == 700
    assert gpu.diag == "power_watts: Not Supported"


def test_set_within_constraints_and_restore_exactly_the_previous_limit(driver, tmp_path):
    results = caps(tmp_path).apply(CapPlan({0: PowerLimit(watts=300), 1: PowerLimit(watts=400)}))
    assert [(r.gpu_id, r.ok, r.power_cap_watts, r.diag_msg) for r in results] == [
        (0, True, 300, "set"), (1, True, 400, "set")]
    assert driver.limits() == [300, 400]
    # a second change keeps the first previous limit
    caps(tmp_path).apply(CapPlan({1: PowerLimit(watts=250)}))
    saved = json.loads((tmp_path / STATE_FILE).read_text())["gpus"]
    assert saved["GPU-bbb"]["previous_mw"] == 650000 and saved["GPU-bbb"]["set_mw"] == 250000
    # another process (a new object reading the state file) restores 700 W and 650 W
    results = caps(tmp_path).restore()
    assert [(r.gpu_id, r.ok, r.power_cap_watts, r.diag_msg) for r in results] == [
        (0, True, 700, "restored 700 W"), (1, True, 650, "restored 650 W")]
    assert driver.limits() == [700, 650]
    assert json.loads((tmp_path / STATE_FILE).read_text())["gpus"] == {}
    again = caps(tmp_path).apply(CapPlan({0: RESTORE}))[0]
    assert again.ok and again.diag_msg.startswith("nothing to restore")


def test_percentages_are_of_the_max_constraint(driver, tmp_path):
    caps(tmp_path).apply(CapPlan(default=PowerLimit(percentage=50)))
    assert driver.limits() == [350, 350]


def test_out_of_range_is_clamped_and_says_so(driver, tmp_path):
    results = caps(tmp_path).apply(CapPlan({0: PowerLimit(watts=900), 1: PowerLimit(watts=50)}))
    assert [(r.ok, r.power_cap_watts) for r in results] == [(True, 700), (True, 200)]
    assert results[0].diag_msg == ("clamped: 900 W is outside the GPU's limit range 200-700 W; "
                                   "set 700 W")
    assert results[1].diag_msg.startswith("clamped: 50 W is outside")
    assert driver.limits() == [700, 200] and driver.sets == [(1, 200000)]  # 700 was unchanged


def test_out_of_range_is_refused_when_configured(driver, tmp_path):
    results = caps(tmp_path, "refuse").apply(CapPlan({0: PowerLimit(watts=900),
                                                      1: PowerLimit(watts=300)}))
    assert (results[0].ok, results[0].power_cap_watts) == (False, 700)
    assert results[0].diag_msg == ("refused: 900 W is outside the GPU's limit range 200-700 W "
                                   "(out_of_range: refuse)")
    assert results[1].ok and driver.sets == [(1, 300000)]
    with pytest.raises(Exception, match="out_of_range must be one of clamp, refuse"):
        caps(tmp_path, "wrap")


def test_permission_errors_are_per_gpu(mocker, tmp_path):
    driver = FakeDriver([h100("GPU-aaa"), h100("GPU-bbb", locked=True)]).install(mocker)
    results = caps(tmp_path).apply(CapPlan(default=PowerLimit(watts=300)))
    assert (results[0].ok, results[0].power_cap_watts) == (True, 300)
    assert (results[1].ok, results[1].power_cap_watts) == (False, 700)
    assert results[1].diag_msg == ("cannot set 300 W: no permission (Insufficient Permissions): "
                                   "setting GPU power limits needs root")
    saved = json.loads((tmp_path / STATE_FILE).read_text())["gpus"]
    assert list(saved) == ["GPU-aaa"]  # nothing to restore on the GPU that did not change
    assert driver.limits() == [300, 700]


def test_unknown_gpu_index_fails_only_that_gpu(driver, tmp_path):
    results = caps(tmp_path).apply(CapPlan({0: PowerLimit(watts=300), 5: PowerLimit(watts=1)}))
    assert [(r.gpu_id, r.ok) for r in results] == [(0, True), (5, False)]
    assert results[1].diag_msg == "no GPU 5 (this node has 2)"


def test_nvml_missing_is_a_clear_error(mocker, tmp_path):
    mocker.patch.dict(sys.modules, {"pynvml": None})
    with pytest.raises(NvmlUnavailable, match=r"pynvml is missing \(install pbs-power\[nvml\]"):
        caps(tmp_path).inventory()
    resp = NvmlDevices(str(tmp_path)).handle(DeviceRequest("g1", "ping", {}, "{}", None, "r", 5))
    assert not resp.success and resp.ping_error.startswith("NVML is not available")


def test_no_driver_is_a_clear_error(driver, tmp_path):
    driver.init_error = pynvml.NVMLError_LibraryNotFound()
    with pytest.raises(NvmlUnavailable) as err:
        caps(tmp_path).apply(CapPlan(default=PowerLimit(watts=300)))
    assert str(err.value) == ("NVML is not available: nvmlInit failed: NVML Shared Library Not "
                              "Found (is the NVIDIA driver loaded on this node?)")


def test_an_unreadable_state_file_is_never_overwritten(driver, tmp_path):
    (tmp_path / STATE_FILE).write_text("{not json")
    with pytest.raises(CapStateError, match="is unreadable"):
        caps(tmp_path).apply(CapPlan(default=PowerLimit(watts=300)))
    assert driver.sets == [] and (tmp_path / STATE_FILE).read_text() == "{not json"


# -- device requests -------------------------------------------------------------------
def policy(name, gpu=None):
    limits = [{"element_type": "NODE", "power_limit": {"watts": 5000}}]
    if gpu is not None:
        limits.append({"element_type": "GPU", "power_limit": gpu})
    return {"name": name, "limits": limits}


def request(kind, payload):
    return DeviceRequest("g1", kind, payload, "{}", None, "rid", 10.0)


def test_requests_map_to_gpu_plans():
    assert plan_of("topology_deactivate", {}) == CapPlan(default=RESTORE)
    assert plan_of("topology_activate", {"policy_action": "set", "policy": policy("A", {
        "percentage": 80})}) == CapPlan(default=PowerLimit(percentage=80))
    assert plan_of("topology_activate", {"policy_action": "set", "policy": policy("A")}) == \
        CapPlan()  # no GPU limit: GPUs left alone
    assert plan_of("resource_group_deactivate", {"policy": None}) == CapPlan(default=RESTORE)
    update = {"gpu_policy_action": "set", "current_policy": policy("A", {"watts": 500}),
              "gpu_policies": [{"gpu_id": 0, "power_limit": {"watts": 300}},
                               {"gpu_id": 1, "power_limit": None}]}
    assert plan_of("gpu_policies_update", update) == CapPlan(
        {0: PowerLimit(watts=300), 1: PowerLimit(watts=500)})
    assert plan_of("gpu_policies_update", {"gpu_policy_action": "reset"}) == \
        CapPlan(default=RESTORE)
    with pytest.raises(ValueError, match="gpu_policy_action must be"):
        plan_of("gpu_policies_update", {"gpu_policy_action": "zap"})


def test_a_job_lifecycle_through_device_requests(driver, tmp_path):
    devices = NvmlDevices(str(tmp_path))
    ping = devices.handle(request("ping", {}))
    assert ping.success and [r.power_cap_watts for r in ping.gpu_results] == [700, 650]
    act = devices.handle(request("resource_group_activate", {
        "resource_group": "rg_1", "policy": {"policy_action": "set",
                                             "policy": policy("Low", {"percentage": 60})},
        "gpu_policies": None}))
    assert act.success and act.power_cap_watts is None and act.policy["name"] == "Low"
    assert driver.limits() == [420, 420]
    upd = devices.handle(request("gpu_policies_update", {
        "gpu_policy_action": "set", "gpu_policies": [{"gpu_id": 1, "power_limit": {
            "watts": 1000}}]}))
    assert upd.success and upd.gpu_results[0].diag_msg.startswith("clamped: 1000 W")
    done = devices.handle(request("resource_group_deactivate", {"resource_group": "rg_1",
                                                                "policy": None}))
    assert done.success and driver.limits() == [700, 650]
    bad = devices.handle(request("gpu_policies_update", {"gpu_policies": [{"gpu_id": -1}]}))
    assert not bad.success and bad.error.startswith("bad gpu_policies_update payload")


def test_failed_gpus_fail_the_response_and_name_the_gpu(mocker, tmp_path):
    FakeDriver([h100("GPU-aaa", locked=True), h100("GPU-bbb")]).install(mocker)
    resp = NvmlDevices(str(tmp_path)).handle(request("topology_activate", {
        "policy_action": "set", "policy": policy("A", {"watts": 300})}))
    assert not resp.success
    assert resp.error.startswith("GPU 0: cannot set 300 W: no permission")
    assert [r.ok for r in resp.gpu_results] == [False, True]


# -- a real GPU, read only -----------------------------------------------------------
@pytest.mark.gpu
def test_real_gpu_limits_are_readable(tmp_path):
    """Reads (never sets) the limits of the GPUs of this machine; skipped without one."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        pytest.skip("no NVML here: %s" % exc)
    try:
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    if count == 0:
        pytest.skip("NVML sees no GPU")
    gpus = GpuCaps(str(tmp_path)).inventory()
    assert len(gpus) == count
    for gpu in gpus:
        assert gpu.uuid and gpu.uuid.startswith("GPU-") and gpu.name
        if gpu.limit_watts is not None and gpu.min_limit_watts is not None:
            assert gpu.min_limit_watts <= gpu.limit_watts <= gpu.max_limit_watts
            assert gpu.default_limit_watts is None or \
                gpu.min_limit_watts <= gpu.default_limit_watts <= gpu.max_limit_watts
    assert not (tmp_path / STATE_FILE).exists()  # nothing was set
