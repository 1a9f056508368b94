"""The redfish backends against real sushy-tools Redfish emulators.

Each test starts its own ``sushy-emulator`` processes (fake systems driver,
fresh state directory, 127.0.0.1, free port), killed by PID at teardown.
Power-limit resources, the SessionService, ignored GracefulShutdown and
injected faults are OUR extensions to the emulator (tests/emulators/
redfish_extensions.py), not sushy-tools features. Hung and refused BMCs are
plain 127.0.0.1 sockets.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, List

import pytest
import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from emulators.redfish_emulator import (HungBmc, RedfishEmulator, System,  # noqa: E402
                                        closed_port_url, make_tls, systems_for)

from pbs_power.config.hook_config import parse_config  # noqa: E402
from pbs_power.states.cycle import Cycle  # noqa: E402
from pbs_power.devices import BackendError, get_backend  # noqa: E402
from pbs_power.devices.controller import DeviceController, DeviceRequest  # noqa: E402
from pbs_power.devices.credentials import CredentialsError, load_credentials  # noqa: E402
from pbs_power.devices.redfish.backend import RedfishBackend, RedfishDevices  # noqa: E402
from pbs_power.states.model import PowerState, TransitionKind as K  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
USERS = {"admin": "s3cret-pw"}
NODE = {"min_watts": 50, "idle_watts": 200, "max_watts": 1000}
WAIT_S = 30.0  # generous: the emulator applies a power change within ~1 s


@pytest.fixture
def lab(tmp_path):
    """Starts emulators and writes credentials; everything stopped at teardown."""
    started: List[Any] = []

    class Lab:
        dir = tmp_path

        def emulator(self, systems: List[System], **kw: Any) -> RedfishEmulator:
            kw.setdefault("users", USERS)
            if kw.get("tls") is None and kw.pop("https", True):
                kw["tls"] = self.tls
            emu = RedfishEmulator(str(tmp_path / ("emu%d" % len(started))), systems, **kw)
            started.append(emu)
            return emu.start()

        @property
        def tls(self):
            if not hasattr(self, "_tls"):
                self._tls = make_tls(str(tmp_path / "tls"), "trusted")
            return self._tls

        def credentials(self, doc: Dict[str, Any] = None, mode: int = 0o600) -> str:
            path = str(tmp_path / ("cred%d.json" % len(list(tmp_path.glob("cred*.json")))))
            with open(path, "w") as f:
                json.dump(doc if doc is not None else {"username": "admin",
                                                       "password": USERS["admin"]}, f)
            os.chmod(path, mode)
            return path

        def options(self, emu: RedfishEmulator, systems: List[System], **kw: Any) -> Dict:
            opts = {"bmcs": {s.host: {"url": emu.url, "system_id": s.uuid} for s in systems},
                    "credentials_file": self.credentials(), "poll_seconds": 0.2,
                    "timeout_seconds": 10, "backoff_seconds": 0.1}
            if emu.tls is not None:
                opts["ca_file"] = emu.tls.ca_file
            else:
                opts["allow_http"] = True
            opts.update(kw)
            return opts

        def track(self, thing: Any) -> Any:
            started.append(thing)
            return thing

    yield Lab()
    for thing in reversed(started):
        (thing.stop if hasattr(thing, "stop") else thing.close)()


def caps_for(systems: List[System], style: str, low: float = 100, high: float = 800,
             limit: float = None) -> Dict[str, Dict[str, Any]]:
    return {s.chassis: {"style": style, "min": low, "max": high,
                        "limit": high if limit is None else limit} for s in systems}


def model() -> str:
    return json.dumps({"backend": "redfish", "device_spec": "n", "node": NODE})


def cap_request(host: str, watts: float, rid: str = "r1", timeout: float = 20.0) -> DeviceRequest:
    policy = {"name": "cap%g" % watts,
              "limits": [{"element_type": "NODE", "power_limit": {"watts": watts}}]}
    return DeviceRequest(host, "resource_group_activate",
                         {"resource_group": "rg_1", "policy": {"policy_action": "set",
                                                               "policy": policy}},
                         model(), None, rid, timeout)


def bmc_state(emu: RedfishEmulator, system: System) -> str:
    """The emulator's own answer, read past our backend (auth and TLS as configured)."""
    resp = requests.get(emu.url + "/redfish/v1/Systems/" + system.uuid, auth=tuple(
        next(iter(USERS.items()))), verify=emu.tls.ca_file if emu.tls else True, timeout=10)
    return resp.json()["PowerState"]


# -- host power ------------------------------------------------------------------
def test_power_on_graceful_off_force_off_with_state_polling(lab, tmp_path):
    systems = systems_for(["n01", "n02", "n03"], "Off")
    emu = lab.emulator(systems)
    backend = lab.track(RedfishBackend(lab.options(emu, systems), str(tmp_path / "state")))
    hosts = [s.host for s in systems]
    assert {h: p.state for h, p in backend.status(hosts, time.time()).items()} == \
        dict.fromkeys(hosts, PowerState.OFF)

    results = backend.request(K.POWER_ON, hosts, time.time())
    assert all(r.ok and r.diag == "Reset On sent" for r in results.values()), results
    for host in hosts:
        assert backend.fleet.wait_for(host, PowerState.ON, WAIT_S).state is PowerState.ON
    assert backend.request(K.POWER_ON, ["n01"], time.time())["n01"].diag == "already On"

    off = backend.request(K.POWER_OFF, ["n01"], time.time())["n01"]
    assert off.ok and off.diag.startswith("Reset GracefulShutdown sent"), off
    assert backend.fleet.wait_for("n01", PowerState.OFF, WAIT_S).state is PowerState.OFF
    assert backend.status(["n01"], time.time())["n01"].state is PowerState.OFF
    assert backend.graceful.load() == {}  # done: forgotten

    forced = RedfishBackend(lab.options(emu, systems, off_mode="ForceOff"),
                            str(tmp_path / "state2"))
    lab.track(forced)
    assert forced.request(K.POWER_OFF, ["n02"], time.time())["n02"].diag == "Reset ForceOff sent"
    assert forced.fleet.wait_for("n02", PowerState.OFF, WAIT_S).state is PowerState.OFF
    assert bmc_state(emu, systems[1]) == "Off" and bmc_state(emu, systems[2]) == "On"
    sleep = backend.request(K.SLEEP, ["n03"], time.time())["n03"]
    assert not sleep.ok and "redfish has no sleep" in sleep.diag


def test_graceful_shutdown_ignored_falls_back_to_force_off(lab, tmp_path):
    systems = systems_for(["h1", "h2"], "On")
    emu = lab.emulator(systems, ignore_graceful=[s.uuid for s in systems])
    # The blocking helper: GracefulShutdown, wait graceful_timeout, ForceOff, wait.
    fleet_backend = lab.track(RedfishBackend(
        lab.options(emu, systems, graceful_timeout_seconds=1.5), str(tmp_path / "a")))
    result = fleet_backend.fleet.power_off("h1", timeout=WAIT_S)
    assert result.state is PowerState.OFF and result.forced
    assert "GracefulShutdown did not finish within 1.5s; ForceOff sent" in result.diag

    # The planner backend: request() only starts; a later status() past the
    # graceful timeout sends ForceOff (times are the caller's clock).
    backend = lab.track(RedfishBackend(lab.options(emu, systems, graceful_timeout_seconds=60),
                                       str(tmp_path / "b")))
    t0 = time.time()
    assert backend.request(K.POWER_OFF, ["h2"], t0)["h2"].ok
    time.sleep(1.5)  # longer than the emulator's power delay: the OS ignored it
    assert backend.status(["h2"], t0 + 30)["h2"].state is PowerState.TRANSITIONING
    assert bmc_state(emu, systems[1]) == "On" and "h2" in backend.graceful.load()
    assert backend.status(["h2"], t0 + 61)["h2"].state is PowerState.TRANSITIONING
    assert backend.graceful.load() == {}  # ForceOff sent: no longer pending
    assert backend.fleet.wait_for("h2", PowerState.OFF, WAIT_S).state is PowerState.OFF
    assert backend.status(["h2"], t0 + 70)["h2"].state is PowerState.OFF


def test_planner_drives_emulated_bmcs_through_a_cycle(lab, tmp_path):
    from pbs_power.sim.cluster import SimCluster
    from pbs_power.states.store import Store
    systems = systems_for(["c1", "c2"], "On")
    emu = lab.emulator(systems)
    cfg = parse_config({  # through the hook config's schema, as a site would write it
        "power_on_off_enable": True, "node_idle_limit": 1800, "min_node_down_delay": 0,
        "max_concurrent_nodes": 10, "cycle_interval": 300, "boot_timeout": 1200,
        "power_backend": dict(lab.options(emu, systems), type="redfish"),
        "state_dir": str(tmp_path / "state")})
    assert cfg.power_backend.type == "redfish"
    backend = lab.track(get_backend(cfg.power_backend, cfg.state_dir))
    assert isinstance(backend, RedfishBackend)
    store = Store.open(cfg.state_dir)
    logs: List[Any] = []
    cycle = Cycle(cfg, store, backend, lambda lvl, msg: logs.append((lvl, msg)))
    now = time.time()
    cluster = SimCluster(["c1", "c2"], cfg.node_power, backend, now - 7200)

    def run(at: float):
        cluster.step(at, [])
        report = cycle.run(cluster.snapshot(at), at)
        cluster.apply(report.marks, at)
        return report

    assert sorted(run(now).marked(True)) == ["c1", "c2"]           # drain
    run(now + 300)                                                 # power_off sent
    assert sum("power_off sent" in m for _l, m in logs) == 2, logs
    for s in systems:
        assert backend.fleet.wait_for(s.host, PowerState.OFF, WAIT_S).state is PowerState.OFF
    third = run(now + 600)                                         # BMCs report Off
    assert len(third.completed) == 2 and store.transitions() == ()
    assert set(store.down_since()) == {"c1", "c2"}
    assert [bmc_state(emu, s) for s in systems] == ["Off", "Off"]
    store.close()


# -- node power caps ---------------------------------------------------------------
@pytest.mark.parametrize("style", ["environment", "power", "controls"])
def test_cap_set_read_back_clamp_and_refuse(lab, style):
    systems = systems_for(["g1", "g2"])
    emu = lab.emulator(systems, caps=caps_for(systems, style, 100, 800))
    devices = lab.track(RedfishDevices(lab.options(emu, systems)))
    described = {"environment": "EnvironmentMetrics PowerLimitWatts",
                 "power": "Power PowerControl[0].PowerLimit",
                 "controls": "Controls PowerLimit SetPoint"}[style]  # not the CPUTemp control

    ok = devices.handle(cap_request("g1", 333.6))
    assert ok.success and ok.power_cap_watts == 334.0, ok  # the BMC rounds; we report it
    state = json.loads(ok.device_state_json)
    assert state["note"] == "the BMC holds 334 W after 333.6 W was sent"
    assert state["resource_group"] == "rg_1" and state["policy"] == "cap333.6"
    ping = devices.ping(["g1"])["g1"]
    assert (ping.cap_watts, ping.cap_resource) == (334.0, described)
    pinged = devices.handle(DeviceRequest("g1", "ping", {"retry_count": 0}, model(), None, "p", 20))
    assert pinged.success and pinged.power_cap_watts == 334.0 and pinged.ping_time
    assert json.loads(pinged.device_state_json)["power_state"] == "on"

    high = devices.handle(cap_request("g1", 950))
    assert high.success and high.power_cap_watts == 800.0
    assert "requested 950 W, clamped to 800 W" in json.loads(high.device_state_json)["note"]

    strict = lab.track(RedfishDevices(lab.options(emu, systems, cap_out_of_range="refuse")))
    refused = strict.handle(cap_request("g2", 950))
    assert not refused.success
    span, source = (("100-800", "AllowableMin/AllowableMax") if style != "power"
                    else ("50-800", "PowerCapacityWatts"))  # Power has no lower bound
    assert refused.error == ("g2: redfish %s: cap 950 W is outside the allowed range %s W "
                             "(from %s and the node's min_watts/max_watts); nothing changed"
                             % (emu.url, span, source))
    assert strict.ping(["g2"])["g2"].cap_watts == 800.0  # unchanged

    if style != "power":  # AllowableMin is advertised: clamped up before sending
        low = devices.handle(cap_request("g2", 60))
        assert low.success and low.power_cap_watts == 100.0
    else:  # the Power resource has no lower bound: the BMC itself says no (400)
        low = devices.handle(cap_request("g2", 60))
        assert not low.success
        assert low.error.startswith("g2: redfish %s: HTTP 400 on PATCH /redfish/v1/Chassis/"
                                    "g2-chassis/Power: The value 60 for the power limit is out "
                                    "of range 100 to 800." % emu.url), low.error
    uncap = devices.handle(DeviceRequest("g1", "resource_group_deactivate",
                                         {"resource_group": "rg_1", "policy": None},
                                         model(), None, "r9", 20))
    assert uncap.success and uncap.power_cap_watts is None  # lifted: no limit, not the max
    lifted = devices.ping(["g1"])["g1"]
    assert lifted.cap_watts is None and lifted.error == "uncapped: %s: %s" % (described, (
        "no limit set (LimitInWatts null)" if style == "power"
        else "capping disabled (ControlMode Disabled, SetPoint 800 W)"))


def test_cap_resource_choice_when_both_are_offered(lab):
    systems = systems_for(["b1"])
    emu = lab.emulator(systems, caps=caps_for(systems, "both", 100, 700))
    auto = lab.track(RedfishDevices(lab.options(emu, systems)))
    older = lab.track(RedfishDevices(lab.options(emu, systems, cap_resource="PowerControl")))
    assert older.handle(cap_request("b1", 456)).power_cap_watts == 456.0
    found = auto.ping(["b1"])["b1"]  # the newer resource reads what the older one set
    assert (found.cap_resource, found.cap_watts, found.cap_range) == \
        ("EnvironmentMetrics PowerLimitWatts", 456.0, (100.0, 700.0))
    gpu = auto.handle(DeviceRequest("b1", "gpu_policies_update", {}, model(), None, "g", 20))
    assert not gpu.success and "node power caps only" in gpu.error


def test_controls_only_chassis_and_a_forced_cap_resource(lab):
    systems = systems_for(["k1", "k2"])
    caps = caps_for(systems[:1], "controls", 100, 700, limit=650)
    caps.update(caps_for(systems[1:], "environment", 100, 700))
    emu = lab.emulator(systems, caps=caps)
    forced = lab.track(RedfishDevices(lab.options(emu, systems, cap_resource="Controls")))
    found = forced.ping(["k1", "k2"])
    assert (found["k1"].cap_resource, found["k1"].cap_watts, found["k1"].cap_range) == \
        ("Controls PowerLimit SetPoint", 650.0, (100.0, 700.0))
    assert found["k2"].reachable and found["k2"].cap_watts is None
    assert found["k2"].error.startswith("uncapped: k2: redfish %s: no power limit resource at "
                                        "chassis " % emu.url)
    assert found["k2"].error.endswith(" (no Controls)")
    assert forced.handle(cap_request("k1", 420)).power_cap_watts == 420.0
    env = lab.track(RedfishDevices(lab.options(emu, systems, cap_resource="EnvironmentMetrics")))
    assert env.ping(["k1"])["k1"].error.endswith(" (no EnvironmentMetrics)")


@pytest.mark.parametrize("style, described", [
    ("environment", "EnvironmentMetrics PowerLimitWatts"),
    ("controls", "Controls PowerLimit SetPoint")])
def test_a_disabled_control_is_no_cap_until_a_cap_is_set(lab, style, described):
    # ControlMode Disabled: the BMC holds a SetPoint (500 W) it does not apply.
    systems = systems_for(["d1"])
    caps = caps_for(systems, style, 100, 700, limit=500)
    caps[systems[0].chassis]["mode"] = "Disabled"
    emu = lab.emulator(systems, caps=caps)
    devices = lab.track(RedfishDevices(lab.options(emu, systems)))
    found = devices.ping(["d1"])["d1"]
    assert found.reachable and found.cap_watts is None
    assert found.error == ("uncapped: %s: capping disabled (ControlMode Disabled, SetPoint "
                           "500 W)" % described)
    got = devices.handle(cap_request("d1", 420))
    assert got.success and got.power_cap_watts == 420.0
    assert json.loads(got.device_state_json)["note"] == ("ControlMode was Disabled; set to "
                                                         "Automatic")
    again = devices.ping(["d1"])["d1"]
    assert (again.cap_watts, again.error) == (420.0, "")


# -- authentication and TLS -----------------------------------------------------------
def test_session_auth_logs_in_uses_the_token_and_deletes_the_session(lab):
    systems = systems_for(["s1"])
    emu = lab.emulator(systems, session_only=True, caps=caps_for(systems, "environment"))
    basic = lab.track(RedfishBackend(lab.options(emu, systems), str(lab.dir / "a")))
    refused = basic.ping(["s1"])["s1"]
    assert not refused.reachable and "HTTP 401 on GET" in refused.error
    assert "Log in through the SessionService first" in refused.error

    session = RedfishBackend(lab.options(emu, systems, auth="session"), str(lab.dir / "b"))
    assert session.status(["s1"], time.time())["s1"].state is PowerState.ON
    sessions = emu.url + "/redfish/v1/SessionService/Sessions"

    def count() -> int:
        return requests.get(sessions, auth=("admin", USERS["admin"]), timeout=10,
                            verify=emu.tls.ca_file).json()["Members@odata.count"]
    assert count() == 1
    session.ping(["s1"])
    assert count() == 1  # one session, reused
    listed = requests.get(sessions, auth=("admin", USERS["admin"]), timeout=10,
                          verify=emu.tls.ca_file).json()["Members"][0]["@odata.id"]
    requests.delete(emu.url + listed, auth=("admin", USERS["admin"]), timeout=10,
                    verify=emu.tls.ca_file)  # the BMC drops the session (expiry, reboot)
    assert count() == 0
    assert session.check("s1") == {"reachable": True, "backend": "redfish", "power_state": "on",
                                   "power_cap_watts": 800.0, "diag": ""}  # logged in again
    assert count() == 1
    session.close()
    assert count() == 0

    wrong = lab.credentials({"username": "admin", "password": "nope"})
    bad = lab.track(RedfishBackend(lab.options(emu, systems, auth="session",
                                               credentials_file=wrong), str(lab.dir / "c")))
    got = bad.ping(["s1"])["s1"]
    assert not got.reachable
    assert got.error == ("s1: redfish %s: session login failed: HTTP 401 on POST /redfish/v1/"
                         "SessionService/Sessions: Invalid username or password. (authentication "
                         "failed for user 'admin'; check credentials_file %s)" % (emu.url, wrong))
    assert "nope" not in got.error


def test_wrong_basic_credentials_give_a_clear_401_and_one_attempt_only(lab):
    systems = systems_for(["w1", "w2", "w3"])
    emu = lab.emulator(systems)
    wrong = lab.credentials({"username": "admin", "password": "wrong-password",
                             "hosts": {"w[0-9]": {"username": "operator"}}})
    backend = lab.track(RedfishBackend(lab.options(emu, systems, credentials_file=wrong),
                                       str(lab.dir / "s")))
    state = backend.status(["w1", "w2", "w3"], time.time())
    assert {p.state for p in state.values()} == {PowerState.UNKNOWN}
    first = [d for d in backend.last_errors.values() if "HTTP 401 on GET" in d]
    assert len(first) == 1, backend.last_errors  # the one host whose request was sent
    diag = first[0]
    host = diag.split(":")[0]
    assert diag.startswith("%s: redfish %s: HTTP 401 on GET /redfish/v1/Systems/%s: "
                           % (host, emu.url, systems[int(host[1]) - 1].uuid))
    assert diag.endswith("(authentication failed for user 'operator'; check credentials_file "
                         "%s)" % wrong)
    others = [d for d in backend.last_errors.values() if d != diag]
    assert len(others) == 2 and all(
        "not sent: the BMC rejected the credentials earlier (HTTP 401: " in d
        and "authentication failed for user 'operator'" in d for d in others), others
    assert "wrong-password" not in " ".join(backend.last_errors.values())
    # Only one request reached the BMC with the bad password (no account lock-out).
    assert emu.log_tail(10 ** 6).count('" 401 -') == 1


def test_tls_trusted_ca_file_and_untrusted_certificate(lab):
    systems = systems_for(["t1"])
    other = make_tls(str(lab.dir / "other"), "other")
    emu = lab.emulator(systems, tls=other)  # serves a certificate our CA did not sign
    trusted = lab.track(RedfishBackend(lab.options(emu, systems, ca_file=other.ca_file),
                                       str(lab.dir / "a")))
    assert trusted.ping(["t1"])["t1"].reachable
    per_bmc = lab.options(emu, systems, ca_file=lab.tls.ca_file)  # the wrong CA by default...
    per_bmc["bmcs"]["t1"]["ca_file"] = other.ca_file             # ...but this BMC's own
    assert lab.track(RedfishBackend(per_bmc, str(lab.dir / "p"))).ping(["t1"])["t1"].reachable
    untrusted = lab.track(RedfishBackend(lab.options(emu, systems, ca_file=lab.tls.ca_file),
                                         str(lab.dir / "b")))
    got = untrusted.ping(["t1"])["t1"]
    assert not got.reachable
    assert got.error.startswith("t1: redfish %s: GET /redfish/v1/Systems/%s: TLS failed: "
                                "certificate not trusted (" % (emu.url, systems[0].uuid))
    assert got.error.endswith("give the BMC's CA certificate in ca_file, or set verify false")
    insecure = lab.track(RedfishBackend(lab.options(emu, systems, verify=False),
                                        str(lab.dir / "c")))
    assert insecure.ping(["t1"])["t1"].reachable


def test_ca_bundle_environment_variables_do_not_override_the_config(lab, monkeypatch):
    systems = systems_for(["e1"])
    emu = lab.emulator(systems)                 # signed by lab.tls's CA
    decoy = make_tls(str(lab.dir / "decoy"), "decoy")
    # Control: plain requests lets the environment replace a Session's verify setting.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", lab.tls.ca_file)
    monkeypatch.setenv("CURL_CA_BUNDLE", lab.tls.ca_file)
    naive = requests.Session()
    naive.verify = True  # "system CAs", which do not include our test CA...
    assert naive.get(emu.url + "/redfish/v1/", timeout=10).status_code == 200  # ...yet it passed
    naive.close()
    # Ours: verify=true means the system CAs, whatever the environment says.
    opts = lab.options(emu, systems)
    del opts["ca_file"]
    strict = lab.track(RedfishBackend(opts, str(lab.dir / "a")))
    got = strict.ping(["e1"])["e1"]
    assert not got.reachable and "certificate not trusted" in got.error
    # ca_file wins over an environment naming another CA.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", decoy.ca_file)
    monkeypatch.setenv("CURL_CA_BUNDLE", decoy.ca_file)
    good = lab.track(RedfishBackend(lab.options(emu, systems), str(lab.dir / "b")))
    assert good.ping(["e1"])["e1"].reachable
    # verify=false stays off even when the environment names a bundle.
    off = lab.track(RedfishBackend(lab.options(emu, systems, verify=False), str(lab.dir / "c")))
    assert off.ping(["e1"])["e1"].reachable


# -- failing BMCs ---------------------------------------------------------------------
def test_bmc_error_500_with_extended_info_is_one_line_per_node(lab):
    systems = systems_for(["node012"], "Off")
    emu = lab.emulator(systems, faults=[{
        "method": "POST", "path_suffix": "/Actions/ComputerSystem.Reset", "status": 500,
        "message": "The power controller is busy.\nTry again later."}])
    backend = lab.track(RedfishBackend(lab.options(emu, systems), str(lab.dir / "s")))
    result = backend.request(K.POWER_ON, ["node012"], time.time())["node012"]
    assert not result.ok
    assert result.diag == ("node012: redfish %s: HTTP 500 on POST /redfish/v1/Systems/%s/Actions/"
                           "ComputerSystem.Reset: The power controller is busy. Try again later."
                           % (emu.url, systems[0].uuid))


def test_hung_bmc_times_out_with_a_diagnostic(lab):
    hung = lab.track(HungBmc())
    opts = {"bmcs": {"x1": hung.url}, "system_id": "1", "auth": "none", "allow_http": True,
            "timeout_seconds": 1, "retries": 1, "backoff_seconds": 0.1}
    backend = lab.track(RedfishBackend(opts, str(lab.dir / "s")))
    begin = time.monotonic()
    assert backend.status(["x1"], time.time())["x1"].state is PowerState.UNKNOWN
    assert time.monotonic() - begin < 30  # 2 tries of 1 s, generous margin
    assert backend.last_errors["x1"] == ("x1: redfish %s: GET /redfish/v1/Systems/1: no answer "
                                         "within 1s (2 tries)" % hung.url)
    checked = backend.check("x1")
    assert checked["reachable"] is False and "GET /redfish/v1/Systems/1: no answer within" \
        in checked["diag"]
    refused = lab.track(RedfishBackend(dict(opts, bmcs={"x2": closed_port_url()}),
                                       str(lab.dir / "r")))
    result = refused.request(K.POWER_ON, ["x2"], time.time())["x2"]
    assert not result.ok and "cannot connect (Connection refused) (2 tries)" in result.diag


def test_fanout_over_64_systems_with_4_dead_bmcs_finishes_in_time(lab):
    live = systems_for(["r%02d" % i for i in range(60)])
    emu = lab.emulator(live, https=False, caps=caps_for(live, "environment", 100, 900))
    hung = [lab.track(HungBmc()) for _ in range(2)]
    dead = {"r60": hung[0].url, "r61": hung[1].url, "r62": closed_port_url(),
            "r63": closed_port_url()}
    opts = lab.options(emu, live)
    opts["bmcs"].update({h: {"url": u, "system_id": "1"} for h, u in dead.items()})
    timeout = 15.0  # the live systems answer in a few seconds even on a loaded machine
    devices = RedfishDevices(opts)
    with DeviceController({"redfish": devices}, default_timeout=timeout) as ctl:
        hosts = ["r%02d" % i for i in range(64)]
        begin = time.monotonic()
        answers = ctl.send([cap_request(h, 400 + i, "q%d" % i, timeout)
                            for i, h in enumerate(hosts)])
        elapsed = time.monotonic() - begin
    assert elapsed < timeout + 30.0, elapsed  # the explicit "timeout plus margin" check
    ok = {h for h, r in answers.items() if r.success}
    assert ok == {s.host for s in live}, {h: r.error for h, r in answers.items()
                                          if not r.success}
    assert all(answers[h].power_cap_watts == 400 + i for i, h in enumerate(hosts[:60]))
    for host in ("r60", "r61"):
        assert "no answer within" in answers[host].error or "timed out" in answers[host].error
    for host in ("r62", "r63"):
        assert "cannot connect (Connection refused)" in answers[host].error


# -- credentials and options (no emulator) ---------------------------------------------
def test_credentials_file_must_be_private(lab):
    open_file = lab.credentials(mode=0o644)
    with pytest.raises(CredentialsError) as err:
        load_credentials(open_file)
    assert str(err.value) == ("credentials file %s has mode 0644 (group or others can get at "
                              "it); it must be 0600 or stricter: run `chmod 600 %s`"
                              % (open_file, open_file))
    with pytest.raises(BackendError, match="chmod 600"):
        RedfishBackend({"url_template": "https://{host}-bmc", "credentials_file": open_file},
                       str(lab.dir / "s"))
    link = str(lab.dir / "link.json")
    os.symlink(lab.credentials(), link)
    with pytest.raises(CredentialsError, match="is a symbolic link"):
        load_credentials(link)
    if os.geteuid() == 0:
        theirs = lab.credentials()
        os.chown(theirs, 4242, -1)
        with pytest.raises(CredentialsError, match=r"is owned by uid 4242.*run `chown root"):
            load_credentials(theirs)
    assert load_credentials(lab.credentials(mode=0o400)).default.username == "admin"


def test_credentials_overrides_by_host_and_hostlist(lab):
    creds = load_credentials(lab.credentials({
        "username": "admin", "password": "top",
        "hosts": {"n[01-10]": {"password": "rack1"}, "n05": {"username": "root",
                                                              "password": "five"}}}))
    assert creds.for_host("n05").username == "root" and creds.for_host("n05").password == "five"
    assert (creds.for_host("n07").username, creds.for_host("n07").password) == ("admin", "rack1")
    assert creds.for_host("m1").password == "top"
    assert "top" not in repr(creds) and "rack1" not in repr(creds)
    with pytest.raises(CredentialsError, match=r"hosts\[\"n\[1-\"\]: bad hostlist"):
        load_credentials(lab.credentials({"hosts": {"n[1-": {"username": "a", "password": "b"}}}))
    with pytest.raises(CredentialsError, match="no entry for host z9"):
        load_credentials(lab.credentials({"hosts": {"n1": {"username": "a",
                                                           "password": "b"}}})).for_host("z9")


@pytest.mark.parametrize("options, message", [
    ({"url_template": "https://{host}-bmc", "auth": "none", "colour": 1},
     "unknown option(s) 'colour'"),
    ({"url_template": "http://{host}-bmc", "auth": "none"}, None),
    ({"url_template": "https://{host}-bmc"}, "option credentials_file is required"),
    ({"url_template": "https://{host}-bmc", "auth": "none", "off_mode": "Nap"},
     "option off_mode must be one of GracefulShutdown, ForceOff"),
    ({"url_template": "https://{name}-bmc", "auth": "none"}, "only {host} may be used"),
    ({"auth": "none"}, "give the BMC of each host"),
    ({"bmcs": {"n[1-2]": "https://a", "n2": "https://b"}, "auth": "none"},
     "host n2 is already named by another bmcs entry"),
])
def test_bad_options_are_refused_by_name(tmp_path, options, message):
    if message is None:  # plain http is refused per host, when it is used
        backend = RedfishBackend(options, str(tmp_path))
        result = backend.request(K.POWER_ON, ["n1"], time.time())["n1"]
        assert not result.ok and "is plain http" in result.diag and "allow_http" in result.diag
        return
    with pytest.raises(BackendError) as err:
        RedfishBackend(options, str(tmp_path))
    assert message in str(err.value)
