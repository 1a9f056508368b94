"""The SIMULATED power backend: transitions, timing, persistence, errors."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pbs_power.config.hook_config import BackendConfig
from pbs_power.devices import (BackendError, HostPower, PowerBackend, Result,
                               get_backend)
from pbs_power.devices.simulated import (FLEET_DB, SimOptions,
                                         SimulatedBackend)
from pbs_power.states.model import PowerState, TransitionKind

ON, OFF = PowerState.ON, PowerState.OFF
ASLEEP, TRANS = PowerState.ASLEEP, PowerState.TRANSITIONING
P_ON, P_OFF = TransitionKind.POWER_ON, TransitionKind.POWER_OFF
SLEEP, WAKE = TransitionKind.SLEEP, TransitionKind.WAKE
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def make(tmp_path):
    """Build simulated backends on one state dir, closing them afterwards."""
    made = []

    def _make(**options):
        backend = get_backend(BackendConfig("simulated", options), str(tmp_path))
        made.append(backend)
        return backend

    yield _make
    for backend in made:
        backend.close()


def state(backend, host, now):
    return backend.status([host], now)[host]


def test_factory_builds_simulated_backend(make, tmp_path):
    backend = make()
    assert isinstance(backend, SimulatedBackend)
    assert isinstance(backend, PowerBackend)
    assert backend.name == "simulated"
    assert (tmp_path / FLEET_DB).exists()


def test_factory_rejects_unknown_type(tmp_path):
    with pytest.raises(BackendError,
                       match="power backend 'capmc' is not available in this version"):
        get_backend(BackendConfig("capmc"), str(tmp_path))


def test_unseen_hosts_are_on_forever(make):
    backend = make()
    assert backend.status(["n1", "n2"], 0.0) == {
        "n1": HostPower(ON, None), "n2": HostPower(ON, None)}
    assert backend.fleet.snapshot(0.0) == {}


def test_power_off_then_on_timing(make):
    backend = make(boot_seconds=300, shutdown_seconds=60)
    assert backend.request(P_OFF, ["n1"], 1000.0) == {"n1": Result(True, "power_off started")}
    assert state(backend, "n1", 1000.0) == HostPower(TRANS, 1000.0)
    assert state(backend, "n1", 1059.9) == HostPower(TRANS, 1000.0)
    assert state(backend, "n1", 1060.0) == HostPower(OFF, 1060.0)
    assert backend.request(P_ON, ["n1"], 2000.0)["n1"].ok
    assert state(backend, "n1", 2299.0) == HostPower(TRANS, 2000.0)
    assert state(backend, "n1", 2300.0) == HostPower(ON, 2300.0)
    assert backend.fleet.snapshot(5000.0) == {"n1": HostPower(ON, 2300.0)}


def test_sleep_then_wake_timing(make):
    backend = make(sleep_seconds=10, wake_seconds=30)
    assert backend.request(SLEEP, ["n1"], 0.0)["n1"] == Result(True, "sleep started")
    assert state(backend, "n1", 9.0).state is TRANS
    assert state(backend, "n1", 10.0) == HostPower(ASLEEP, 10.0)
    assert backend.request(WAKE, ["n1"], 100.0)["n1"].ok
    assert state(backend, "n1", 129.0) == HostPower(TRANS, 100.0)
    assert state(backend, "n1", 130.0) == HostPower(ON, 130.0)


def test_default_timings():
    options = SimOptions.parse({})
    assert (options.boot_seconds, options.boot_jitter_seconds, options.wake_seconds,
            options.shutdown_seconds, options.sleep_seconds) == (300, 0, 30, 60, 10)


def test_numeric_strings_are_accepted(make):
    backend = make(shutdown_seconds="5")
    backend.request(P_OFF, ["n1"], 0.0)
    assert state(backend, "n1", 5.0) == HostPower(OFF, 5.0)


def test_already_in_target_state_is_ok(make):
    backend = make()
    assert backend.request(P_ON, ["n1"], 0.0)["n1"] == Result(True, "already on")
    assert backend.request(WAKE, ["n1"], 0.0)["n1"] == Result(True, "already on")
    backend.request(P_OFF, ["n1"], 0.0)
    assert backend.request(P_OFF, ["n1"], 100.0)["n1"] == Result(True, "already off")


def test_repeat_request_while_transitioning_keeps_the_clock(make):
    backend = make(boot_seconds=300)
    backend.request(P_OFF, ["n1"], 0.0)
    backend.request(P_ON, ["n1"], 100.0)
    result = backend.request(P_ON, ["n1"], 200.0)["n1"]
    assert result.ok and "already transitioning to on" in result.diag
    assert state(backend, "n1", 400.0) == HostPower(ON, 400.0)


def test_invalid_requests_name_the_state(make):
    backend = make(shutdown_seconds=60, sleep_seconds=10)
    backend.request(P_OFF, ["off"], 0.0)
    backend.request(SLEEP, ["asleep"], 0.0)
    backend.request(P_OFF, ["going"], 100.0)
    now = 110.0
    cases = [
        (WAKE, "off", "cannot wake: host is off"),
        (SLEEP, "off", "cannot sleep: host is off"),
        (P_ON, "asleep", "cannot power_on: host is asleep"),
        (P_OFF, "asleep", "cannot power_off: host is asleep"),
        (WAKE, "n-on", None),                      # already on: ok
        (SLEEP, "going", "cannot sleep: host is transitioning to off"),
        (P_ON, "going", "cannot power_on: host is transitioning to off"),
    ]
    for kind, host, diag in cases:
        result = backend.request(kind, [host], now)[host]
        if diag is None:
            assert result.ok
        else:
            assert result == Result(False, diag), (kind, host)
    # Refused requests change nothing.
    assert state(backend, "off", now) == HostPower(OFF, 60.0)
    assert state(backend, "asleep", now) == HostPower(ASLEEP, 10.0)
    assert state(backend, "going", now) == HostPower(TRANS, 100.0)


def test_invalid_host_names_fail_per_host(make):
    backend = make()
    results = backend.request(P_OFF, ["", "n1"], 0.0)
    assert not results[""].ok and "invalid host name" in results[""].diag
    assert results["n1"].ok


def test_batch_request_and_duplicates(make):
    backend = make(shutdown_seconds=60)
    results = backend.request(P_OFF, ["n1", "n2", "n1"], 0.0)
    assert set(results) == {"n1", "n2"} and all(r.ok for r in results.values())
    assert backend.status(["n1", "n2", "n3"], 60.0) == {
        "n1": HostPower(OFF, 60.0), "n2": HostPower(OFF, 60.0), "n3": HostPower(ON, None)}


def test_jitter_is_deterministic_and_in_range():
    options = SimOptions.parse({"boot_seconds": 300, "boot_jitter_seconds": 60, "seed": 7})
    hosts = [f"node{i:03d}" for i in range(200)]
    boots = [options.boot_seconds_of(h) for h in hosts]
    assert all(240 <= b <= 360 for b in boots)
    assert len(set(boots)) > 150                       # hosts differ
    assert min(boots) < 260 and max(boots) > 340       # the range is used
    again = SimOptions.parse({"boot_seconds": 300, "boot_jitter_seconds": 60, "seed": 7})
    assert [again.boot_seconds_of(h) for h in hosts] == boots
    other = SimOptions.parse({"boot_seconds": 300, "boot_jitter_seconds": 60, "seed": 8})
    assert [other.boot_seconds_of(h) for h in hosts] != boots


def test_jitter_is_stable_across_processes():
    """hashlib, not hash(): another interpreter (other PYTHONHASHSEED) agrees."""
    code = ("from pbs_power.devices.simulated import SimOptions;"
            "o = SimOptions.parse({'boot_jitter_seconds': 60, 'seed': 'x'});"
            "print(repr(o.boot_seconds_of('n17')))")
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONHASHSEED="123")
    out = subprocess.run([sys.executable, "-OO", "-c", code], env=env,
                         stdout=subprocess.PIPE, check=True, timeout=60).stdout
    here = SimOptions.parse({"boot_jitter_seconds": 60, "seed": "x"})
    assert float(out) == here.boot_seconds_of("n17")


def test_jittered_boot_is_what_the_fleet_uses(make):
    backend = make(boot_seconds=300, boot_jitter_seconds=100, shutdown_seconds=0)
    boot = backend.options.boot_seconds_of("n5")
    backend.request(P_OFF, ["n5"], 0.0)
    backend.request(P_ON, ["n5"], 10.0)
    assert state(backend, "n5", 10.0 + boot - 0.01).state is TRANS
    assert state(backend, "n5", 10.0 + boot) == HostPower(ON, 10.0 + boot)


def test_fail_nodes_never_come_up(make):
    backend = make(boot_seconds=10, shutdown_seconds=0, fail_nodes="n[2-3]")
    backend.request(P_OFF, ["n1", "n2", "n3"], 0.0)
    results = backend.request(P_ON, ["n1", "n2", "n3"], 1.0)
    assert all(r.ok for r in results.values())
    later = backend.status(["n1", "n2", "n3"], 1e9)
    assert later == {"n1": HostPower(ON, 11.0), "n2": HostPower(TRANS, 1.0),
                     "n3": HostPower(TRANS, 1.0)}


def test_fail_nodes_can_be_hard_powered_off(make):
    backend = make(boot_seconds=10, shutdown_seconds=5, fail_nodes="n2")
    backend.request(P_OFF, ["n2"], 0.0)
    backend.request(P_ON, ["n2"], 10.0)
    result = backend.request(P_OFF, ["n2"], 1000.0)["n2"]
    assert result.ok and "hard power off" in result.diag
    assert state(backend, "n2", 1005.0) == HostPower(OFF, 1005.0)


def test_fail_nodes_never_wake(make):
    backend = make(sleep_seconds=1, wake_seconds=1, fail_nodes=["n2"])
    backend.request(SLEEP, ["n2"], 0.0)
    backend.request(WAKE, ["n2"], 5.0)
    assert state(backend, "n2", 1e9) == HostPower(TRANS, 5.0)


def test_state_persists_across_backend_instances(make):
    first = make(shutdown_seconds=60, boot_seconds=300)
    first.request(P_OFF, ["n1", "n2"], 0.0)
    first.request(P_ON, ["n2"], 100.0)
    first.close()
    # Options changed in between: in-flight transitions keep their duration.
    second = make(shutdown_seconds=1, boot_seconds=1)
    assert second.status(["n1", "n2"], 200.0) == {
        "n1": HostPower(OFF, 60.0), "n2": HostPower(TRANS, 100.0)}
    assert state(second, "n2", 400.0) == HostPower(ON, 400.0)
    assert second.request(P_OFF, ["n1"], 500.0)["n1"] == Result(True, "already off")


@pytest.mark.parametrize("options, words", [
    ({"boot_seconds": -1}, "boot_seconds must be a finite number"),
    ({"wake_seconds": "soon"}, "wake_seconds must be a finite number"),
    ({"sleep_seconds": float("nan")}, "sleep_seconds must be a finite number"),
    ({"shutdown_seconds": True}, "shutdown_seconds must be a finite number"),
    ({"boot_seconds": 10, "boot_jitter_seconds": 20}, "must not exceed boot_seconds"),
    ({"fail_nodes": "n[1-"}, "fail_nodes: bad hostlist"),
    ({"fail_nodes": 3}, "fail_nodes must be a hostlist expression"),
    ({"boot_secs": 3}, "unknown option(s) 'boot_secs'"),
])
def test_bad_options_name_the_option(tmp_path, options, words):
    with pytest.raises(BackendError) as info:
        get_backend(BackendConfig("simulated", options), str(tmp_path))
    assert words in str(info.value)
    assert "simulated" in str(info.value)


def test_corrupt_fleet_db_names_the_file(tmp_path):
    (tmp_path / FLEET_DB).write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(BackendError, match="simulated_fleet.db"):
        get_backend(BackendConfig("simulated"), str(tmp_path))


def test_creates_missing_state_dir(tmp_path):
    target = tmp_path / "a" / "b"
    with get_backend(BackendConfig("simulated"), str(target)) as backend:
        backend.request(P_OFF, ["n1"], 0.0)
    assert (target / FLEET_DB).exists()
