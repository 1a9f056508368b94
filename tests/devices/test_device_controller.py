"""The device controller (fan-out, timeouts, state) and the SIMULATED devices."""
from __future__ import annotations

import json
import threading
import time
from typing import Dict, List, Mapping, Optional

import pytest

from pbs_power.devices.base import BackendError
from pbs_power.devices.controller import (KINDS, DeviceBackend, DeviceController,
                                          DeviceRequest, DeviceResponse, DeviceStateStore,
                                          GPUPolicyResult)
from pbs_power.devices import simulated_devices
from pbs_power.devices.simulated_devices import SimulatedDevices

NODE = {"min_watts": 3000, "idle_watts": 3500, "max_watts": 10000}
GPU = {"count": 8, "min_watts": 200, "max_watts": 700, "default_watts": 600}


def model(entity: str = "n1", backend: Optional[str] = "simulated", gpu=GPU) -> str:
    doc = {"entity": entity, "device_spec": "dgx", "type": "ComputerSystem", "model": "DGX",
           "node": NODE, "gpu": gpu, "cpu": None, "memory": None}
    if backend is not None:
        doc["backend"] = backend
    return json.dumps(doc)


def policy(name: str, node: Dict[str, float], gpu: Optional[Dict[str, float]] = None) -> dict:
    limits = [{"element_type": "NODE", "power_limit": node}]
    if gpu is not None:
        limits.append({"element_type": "GPU", "power_limit": gpu})
    return {"name": name, "limits": limits, "properties": {}}


def req(device: str, kind: str = "ping", payload=None, **kw) -> DeviceRequest:
    return DeviceRequest(device, kind, payload or {"retry_count": 0}, kw.pop("dm", model(device)),
                         **kw)


class DictStore(DeviceStateStore):
    """An in-memory state store that counts its batch writes."""

    def __init__(self) -> None:
        self.states: Dict[str, str] = {}
        self.writes: List[Dict[str, str]] = []

    def get_device_state(self, device: str) -> Optional[str]:
        return self.states.get(device)

    def put_device_states(self, states: Mapping[str, str]) -> None:
        self.writes.append(dict(states))
        self.states.update(states)


class Probe(DeviceBackend):
    """Counts concurrent calls; devices in ``block`` wait for ``release``."""

    name = "probe"

    def __init__(self, delay: float = 0.0, block=(), state: str = '{"x": 1}') -> None:
        self.delay, self.block, self.state = delay, set(block), state
        self.lock = threading.Lock()
        self.now = self.peak = self.calls = 0
        self.release = threading.Event()
        self.finished = threading.Event()
        self.seen: List[DeviceRequest] = []

    def handle(self, request: DeviceRequest) -> DeviceResponse:
        with self.lock:
            self.now += 1
            self.calls += 1
            self.peak = max(self.peak, self.now)
            self.seen.append(request)
        try:
            if request.device in self.block:
                self.release.wait(10)
            else:
                time.sleep(self.delay)
            return DeviceResponse(request.device, request.request_id, True,
                                  device_state_json=self.state)
        finally:
            with self.lock:
                self.now -= 1
            if request.device in self.block:
                self.finished.set()


class Answer(DeviceBackend):
    """Answers through a function of the request."""

    name = "answer"

    def __init__(self, fn) -> None:
        self.fn = fn

    def handle(self, request: DeviceRequest) -> DeviceResponse:
        return self.fn(request)


@pytest.fixture
def logs():
    return []


@pytest.fixture
def make(logs):
    """Controllers closed after the test; log lines collected in ``logs``."""
    made = []

    def _make(backends, **kw):
        kw.setdefault("log", lambda level, msg: logs.append((level, msg)))
        ctl = DeviceController(backends, **kw)
        made.append(ctl)
        return ctl

    yield _make
    for ctl in made:
        ctl.close()


def sim(**kw) -> SimulatedDevices:
    kw.setdefault("latency_ms", 0)
    return SimulatedDevices(**kw)


# -- controller ---------------------------------------------------------------
def test_kinds_are_the_documented_ones():
    assert KINDS == ("resource_group_activate", "resource_group_deactivate",
                     "resource_group_update", "topology_activate", "topology_deactivate",
                     "gpu_policies_update", "ping")


def test_concurrency_is_bounded_by_max_workers(make):
    probe = Probe(delay=0.05)
    ctl = make({"probe": probe}, max_workers=16)
    start = time.monotonic()
    out = ctl.send([req("n%d" % i, dm=model(backend="probe")) for i in range(64)])
    took = time.monotonic() - start
    assert len(out) == 64 and all(r.success for r in out.values())
    assert probe.calls == 64
    assert probe.peak <= 16
    assert probe.peak >= 8  # it really runs in parallel
    assert took >= 4 * 0.05 * 0.9  # at least 4 rounds
    assert took < 10  # generous: 64 serial calls would be 3.2 s


def test_bound_holds_across_concurrent_batches(make):
    probe = Probe(delay=0.03)
    ctl = make({"probe": probe}, max_workers=4)
    results = {}

    def batch(tag):
        results[tag] = ctl.send([req("%s%d" % (tag, i), dm=model(backend="probe"))
                                 for i in range(12)])

    threads = [threading.Thread(target=batch, args=(t,)) for t in "abc"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(len(results[t]) == 12 and all(r.success for r in results[t].values())
               for t in "abc")
    assert probe.peak <= 4


def test_response_fields_filled_by_the_controller(make):
    probe = Probe()
    ctl = make({"probe": probe}, default_timeout=7)
    out = ctl.send([req("n1", dm=model(backend="probe")),
                    req("n2", dm=model(backend="probe"), request_id="mine", timeout_seconds=2)])
    seen = {r.device: r for r in probe.seen}
    assert len(seen["n1"].request_id) == 32 and seen["n1"].timeout_seconds == 7
    assert seen["n2"].request_id == "mine" and seen["n2"].timeout_seconds == 2
    assert out["n1"].request_id == seen["n1"].request_id
    assert list(out) == ["n1", "n2"]  # in request order
    assert out["n1"].elapsed_seconds >= 0


def test_hung_device_times_out_while_others_succeed(make, logs, monkeypatch):
    monkeypatch.setattr(simulated_devices, "HANG_EXTRA_S", 4.0)  # closing the backend ends it
    backend = sim(latency_ms=5, hang_devices="n[3]")
    ctl = make({"simulated": backend}, max_workers=4)
    start = time.monotonic()
    out = ctl.send([req("n%d" % i, timeout_seconds=0.3 if i == 3 else None) for i in range(8)])
    assert time.monotonic() - start < 3.0  # answered at the timeout, not when the hang ends
    assert out["n3"].success is False
    assert out["n3"].error == "timed out after 0.3s"
    assert out["n3"].elapsed_seconds >= 0.29
    assert all(out["n%d" % i].success for i in range(8) if i != 3)
    lines = [m for lvl, m in logs if lvl == "warning"]
    assert lines == ["device n3: ping: failed: timed out after 0.3s"]


def test_a_timed_out_slot_is_freed_for_the_rest(make):
    probe = Probe(delay=0.01, block={"n0", "n1"})
    ctl = make({"probe": probe}, max_workers=2)
    out = ctl.send([req("n%d" % i, dm=model(backend="probe"),
                        timeout_seconds=0.2 if i < 2 else None) for i in range(6)])
    probe.release.set()
    assert [out["n%d" % i].success for i in range(6)] == [False, False, True, True, True, True]


def test_late_result_is_ignored_and_not_persisted(make):
    probe = Probe(block={"late"}, state='{"late": true}')
    store = DictStore()
    ctl = make({"probe": probe}, state=store)
    out = ctl.send([req("late", dm=model(backend="probe"), timeout_seconds=0.1),
                    req("ok", dm=model(backend="probe"))])
    assert out["late"].error == "timed out after 0.1s"
    probe.release.set()
    assert probe.finished.wait(5)
    time.sleep(0.05)
    out2 = ctl.send([req("other", dm=model(backend="probe"))])
    assert out2["other"].success
    assert "late" not in store.states
    assert store.states == {"ok": '{"late": true}', "other": '{"late": true}'}


def test_backend_exception_is_a_failure_response(make, logs):
    def boom(request):
        raise RuntimeError("BMC said no")
    ctl = make({"answer": Answer(boom)})
    out = ctl.send([req("n1", kind="topology_activate", dm=model(backend="answer"))])
    assert out["n1"].success is False
    assert out["n1"].error == "backend 'answer' raised RuntimeError: BMC said no"
    assert logs == [("error", "device n1: topology_activate: failed: backend 'answer' "
                              "raised RuntimeError: BMC said no")]


def test_backend_returning_garbage_is_a_failure(make):
    ctl = make({"answer": Answer(lambda r: {"success": True})})
    out = ctl.send([req("n1", dm=model(backend="answer"))])
    assert out["n1"].error == "backend 'answer' returned dict, not a DeviceResponse"


def test_request_id_mismatch_is_ignored(make, logs):
    store = DictStore()
    wrong = Answer(lambda r: DeviceResponse(r.device, "other-id", True, device_state_json="{}"))
    ctl = make({"answer": wrong}, state=store)
    out = ctl.send([req("n1", dm=model(backend="answer"), request_id="abc")])
    assert out["n1"].success is False
    assert out["n1"].error == "no matching response (request_id mismatch)"
    assert store.states == {}
    assert logs[0][0] == "warning" and "'other-id'" in logs[0][1] and "'abc'" in logs[0][1]
    assert len(logs) == 1


def test_device_named_twice_is_refused_before_sending(make):
    probe = Probe()
    ctl = make({"probe": probe})
    with pytest.raises(ValueError, match=r"requests\[2\]: device 'n1' is already named"):
        ctl.send([req("n1", dm=model(backend="probe")), req("n2", dm=model(backend="probe")),
                  req("n1", dm=model(backend="probe"))])
    with pytest.raises(ValueError, match="already named"):
        ctl.stream([req("n1", dm=model(backend="probe"))] * 2)  # eager, not on iteration
    assert probe.calls == 0


@pytest.mark.parametrize("bad, match", [
    (DeviceRequest("n1", "reboot", {}, "{}"), "kind 'reboot' is not one of"),
    (DeviceRequest("", "ping", {}, "{}"), "device must be a non-empty string"),
    (DeviceRequest("n1", "ping", {}, "{}", timeout_seconds=0), "timeout_seconds must be"),
    ("n1", "must be a DeviceRequest"),
])
def test_malformed_requests_are_value_errors(make, bad, match):
    with pytest.raises(ValueError, match=match):
        make({}).send([bad])


def test_constructor_checks_its_arguments():
    with pytest.raises(ValueError, match="max_workers"):
        DeviceController({}, max_workers=0)
    with pytest.raises(ValueError, match="default_timeout"):
        DeviceController({}, default_timeout=float("nan"))


def test_unknown_backend_and_bad_model(make):
    ctl = make({"simulated": sim(), "probe": Probe()})
    out = ctl.send([req("n1", dm=model(backend="redfish")), req("n2", dm="not json"),
                    req("n3", dm=model(backend=None))])
    assert out["n1"].error == "no device backend 'redfish' (available: probe, simulated)"
    assert out["n2"].error.startswith("device model JSON is not valid JSON")
    assert out["n3"].success  # no backend named: simulated


def test_state_round_trip_through_the_store(make):
    store = DictStore()
    ctl = make({"simulated": sim()}, state=store)
    act = {"policy_action": "set", "policy": policy("p", {"watts": 5000})}
    ctl.send([req("n1", "topology_activate", act), req("n2", "topology_activate", act)])
    assert len(store.writes) == 1 and set(store.writes[0]) == {"n1", "n2"}
    first = json.loads(store.states["n1"])
    assert first["calls"] == 1 and first["node_cap_watts"] == 5000
    ctl.send([req("n1")])
    assert json.loads(store.states["n1"])["calls"] == 2
    given = json.dumps(dict(first, calls=41))  # an explicit state wins over the store
    ctl.send([req("n1", device_state_json=given)])
    assert json.loads(store.states["n1"])["calls"] == 42


def test_no_write_when_nothing_to_persist(make):
    store = DictStore()
    ctl = make({"answer": Answer(lambda r: DeviceResponse(r.device, r.request_id, True))},
               state=store)
    ctl.send([req("n1", dm=model(backend="answer"))])
    assert store.writes == []


def test_stream_yields_as_completed(make):
    fast = Answer(lambda r: DeviceResponse(r.device, r.request_id, True))
    probe = Probe(block={"slow"})
    ctl = make({"answer": fast, "probe": probe})
    it = ctl.stream([req("slow", dm=model(backend="probe")),
                     req("fast", dm=model(backend="answer"))])
    first = next(it)
    assert first.device == "fast"  # while "slow" is still blocked
    assert probe.now == 1
    probe.release.set()
    rest = list(it)
    assert [r.device for r in rest] == ["slow"] and rest[0].success


def test_stream_persists_in_batches_of_a_hundred(make):
    store = DictStore()
    ctl = make({"simulated": sim()}, state=store, max_workers=32)
    got = list(ctl.stream([req("n%d" % i) for i in range(250)]))
    assert len(got) == 250
    sizes = [len(w) for w in store.writes]  # >= 100 responses apart, then the rest at the end
    assert sum(sizes) == 250 and all(n >= 100 for n in sizes[:-1])


def test_stream_left_early_persists_what_it_got(make):
    store = DictStore()
    probe = Probe(block={"slow"})
    ctl = make({"probe": probe}, state=store)
    it = ctl.stream([req("slow", dm=model(backend="probe")),
                     req("fast", dm=model(backend="probe"))])
    assert next(it).device == "fast"
    it.close()
    assert store.states == {"fast": '{"x": 1}'}
    probe.release.set()
    assert ctl.send([req("again", dm=model(backend="probe"))])["again"].success


def test_store_failure_is_logged_not_raised(make, logs):
    class Broken(DictStore):
        def put_device_states(self, states):
            raise OSError("disk full")
    ctl = make({"simulated": sim()}, state=Broken())
    assert ctl.send([req("n1")])["n1"].success
    assert any(lvl == "error" and "disk full" in m for lvl, m in logs)


def test_closed_controller_refuses_batches():
    ctl = DeviceController({"simulated": sim()})
    ctl.close()
    with pytest.raises(RuntimeError, match="closed"):
        ctl.send([req("n1")])


# -- simulated devices ----------------------------------------------------------
def run(backend, device="n1", kind="ping", payload=None, state=None, gpu=GPU):
    return backend.handle(DeviceRequest(device, kind, payload or {"retry_count": 1},
                                        model(device, gpu=gpu), state, "rid", 5.0))


def test_node_cap_in_watts_and_percent_clamped():
    b = sim()
    for limit, cap in [({"watts": 5000}, 5000), ({"percentage": 50}, 5000),
                       ({"watts": 100}, 3000), ({"watts": 99999}, 10000)]:
        r = run(b, kind="topology_activate",
                payload={"policy_action": "set", "policy": policy("p", limit)})
        assert r.success and r.power_cap_watts == cap and r.request_id == "rid"
        assert r.policy == policy("p", limit)
        assert json.loads(r.device_state_json)["node_cap_watts"] == cap


def test_gpu_policies_resolve_clamp_and_unknown_gpu():
    b = sim()
    r = run(b, kind="gpu_policies_update", payload={
        "resource_group": "rg_1", "gpu_policy_action": "set", "current_policy": None,
        "gpu_policies": [{"gpu_id": 0, "power_limit": {"watts": 500}},
                         {"gpu_id": 1, "power_limit": {"percentage": 50}},
                         {"gpu_id": 2, "power_limit": {"watts": 50}},
                         {"gpu_id": 9, "power_limit": {"watts": 500}}]})
    assert r.success is False and r.error == "GPU 9: no GPU 9 (the device has 8)"
    assert r.power_cap_watts is None
    assert r.gpu_results == (GPUPolicyResult(0, True, 500.0), GPUPolicyResult(1, True, 350.0),
                             GPUPolicyResult(2, True, 200.0),
                             GPUPolicyResult(9, False, None, "no GPU 9 (the device has 8)"))
    caps = json.loads(r.device_state_json)["gpu_caps"]
    assert caps == {"0": 500, "1": 350, "2": 200, "3": 600, "4": 600, "5": 600, "6": 600,
                    "7": 600}  # the others keep their limit
    reset = run(b, kind="gpu_policies_update", state=r.device_state_json,
                payload={"resource_group": "rg_1", "gpu_policy_action": "reset",
                         "current_policy": None, "gpu_policies": []})
    assert set(json.loads(reset.device_state_json)["gpu_caps"].values()) == {600}


def test_gpu_percentage_in_node_policy_sets_every_gpu():
    r = run(sim(), kind="topology_activate", payload={
        "policy_action": "set", "policy": policy("g", {"watts": 8000}, {"percentage": 50})})
    assert [g.power_cap_watts for g in r.gpu_results] == [350.0] * 8
    assert set(json.loads(r.device_state_json)["gpu_caps"].values()) == {350}


def test_allocation_then_deactivation_restores_topology_policy():
    b = sim()
    topo = policy("topo", {"watts": 9000})
    s = run(b, kind="topology_activate",
            payload={"policy_action": "set", "policy": topo}).device_state_json
    act = run(b, kind="resource_group_activate", state=s, payload={
        "resource_group": "rg_7", "policy": {"policy_action": "set",
                                             "policy": policy("job", {"percentage": 40})},
        "gpu_policies": {"gpu_policy_action": "set", "current_policy": None,
                         "gpu_policies": [{"gpu_id": 3, "power_limit": {"watts": 300}}]}})
    assert act.success and act.power_cap_watts == 4000
    doc = json.loads(act.device_state_json)
    assert (doc["policy"], doc["resource_group"], doc["gpu_caps"]["3"]) == ("job", "rg_7", 300)
    off = run(b, kind="resource_group_deactivate", state=act.device_state_json, payload={
        "resource_group": "rg_7", "policy": {"policy_action": "unset", "policy": topo},
        "gpu_policies": {"gpu_policy_action": "reset", "current_policy": topo,
                         "gpu_policies": []}})
    assert off.success and off.power_cap_watts == 9000 and off.policy["name"] == "topo"
    doc = json.loads(off.device_state_json)
    assert (doc["policy"], doc["resource_group"], doc["gpu_caps"]["3"]) == ("topo", None, 600)
    assert doc["calls"] == 3
    assert doc["history"] == [["topology_activate", None, "topo", 9000],
                              ["resource_group_activate", "rg_7", "job", 4000],
                              ["resource_group_deactivate", "rg_7", "topo", 9000]]
    bare = run(b, kind="topology_deactivate", state=off.device_state_json,
               payload={"policy_action": "unset", "policy": None})
    assert bare.power_cap_watts == 10000 and bare.policy is None  # uncapped


def test_history_keeps_the_last_twenty():
    b, s = sim(), None
    for i in range(25):
        s = run(b, kind="topology_activate", state=s, payload={
            "policy_action": "set", "policy": policy("p%d" % i, {"watts": 4000 + i})}
        ).device_state_json
    doc = json.loads(s)
    assert doc["calls"] == 25 and len(doc["history"]) == 20
    assert doc["history"][0][2] == "p5" and doc["history"][-1][2] == "p24"


def test_bad_payload_and_bad_model_fail_clearly():
    b = sim()
    r = run(b, kind="topology_activate", payload={
        "policy_action": "set", "policy": {"name": "x", "limits": []}})
    assert r.success is False and r.error.startswith("bad topology_activate payload: ")
    assert "policy.limits: must be a non-empty list" in r.error
    r = b.handle(DeviceRequest("n1", "ping", {}, '{"node": {}}', None, "rid", 1.0))
    assert r.error == ("simulated device n1: device model JSON: node.max_watts must be a "
                       "finite number of watts >= 0, not None")
    r = run(b, state="[1]")
    assert r.success is False and "starting afresh" in r.error
    assert json.loads(r.device_state_json)["calls"] == 0


def test_fail_devices_and_ping():
    b = sim(fail_devices="n[2-3]")
    ok, bad = run(b, device="n1"), run(b, device="n3")
    assert ok.success and ok.ping_time is not None
    assert (bad.success, bad.error, bad.ping_error) == (False, "simulated device failure",
                                                         "simulated device failure")


def test_failure_rate_is_reproducible_with_seed(make):
    def failed(seed):
        ctl = make({"simulated": sim(failure_rate=0.3, seed=seed)})
        out = ctl.send([req("n%d" % i) for i in range(60)])
        errors = {r.error for r in out.values() if not r.success}
        assert errors <= {"simulated random failure (failure_rate=0.3)"}
        return {d for d, r in out.items() if not r.success}
    a, b, c = failed(1), failed(1), failed(2)
    assert a == b and a != c and 5 < len(a) < 35


def test_a_failed_call_advances_the_counter_so_retries_draw_again(make):
    store = DictStore()
    ctl = make({"simulated": sim(failure_rate=0.5, seed=3)}, state=store)
    outcomes = [ctl.send([req("n1")])["n1"].success for _ in range(12)]
    assert json.loads(store.states["n1"])["calls"] == 12
    assert True in outcomes and False in outcomes


def test_latency_and_jitter_are_real_sleeps(make):
    ctl = make({"simulated": SimulatedDevices(latency_ms=40, jitter_ms=10)}, max_workers=50)
    start = time.monotonic()
    out = ctl.send([req("n%d" % i) for i in range(50)])
    took = time.monotonic() - start
    assert all(r.success for r in out.values())
    assert 0.03 <= took < 5  # in parallel: about one latency, not fifty


@pytest.mark.parametrize("options, match", [
    ({"latency": 5}, r"unknown option\(s\) 'latency' \(known: latency_ms, jitter_ms"),
    ({"latency_ms": -1}, "option latency_ms must be a finite number >= 0, not -1"),
    ({"jitter_ms": "5"}, "option jitter_ms must be a finite number >= 0"),
    ({"failure_rate": 1.5}, "option failure_rate must be a number from 0 to 1, not 1.5"),
    ({"seed": "x"}, "seed must be an integer, not 'x'"),
    ({"seed": True}, "seed must be an integer"),
    ({"fail_devices": "n[1-"}, "option fail_devices: bad hostlist 'n\\[1-'"),
    ({"hang_devices": 3}, "option hang_devices must be a hostlist expression, not 3"),
])
def test_option_validation(options, match):
    with pytest.raises(BackendError, match="device backend 'simulated': " + match):
        SimulatedDevices.from_options(options)


def test_from_options_accepts_hostlists_and_defaults():
    b = SimulatedDevices.from_options({"fail_devices": ["n[1-3]", "gpu01"], "seed": 7})
    assert b.fail_devices == frozenset({"n1", "n2", "n3", "gpu01"})
    d = SimulatedDevices.from_options(None)
    assert (d.latency_ms, d.jitter_ms, d.failure_rate, d.seed) == (20, 0, 0, 0)
    assert d.name == "simulated"
