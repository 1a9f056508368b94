"""The IPMI backends against real BMC simulators: OpenIPMI's ipmi_sim, driven by ipmitool.

Every test starts its own ipmi_sim processes on 127.0.0.1 (tests/emulators/
ipmi_sim.py); nothing here fakes ipmitool or the BMC. Plain ipmi_sim has no
DCMI power limiting, so its BMCs answer DCMI with completion code 0xc1; BMCs
started with ``dcmi=True`` load our ipmi_sim extension (ipmi_sim_dcmi.c) that
implements the DCMI power-limit commands. Missing tools fail the tests
(tests/setup.sh installs them); nothing is skipped.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from emulators.ipmi_sim import PASSWORD, USERNAME, SimFleet, free_udp_port, write_credentials
from pbs_power.config.hook_config import BackendConfig, ConfigError, HookConfig, NodePower, parse_config
from pbs_power.states.cycle import Cycle
from pbs_power.devices import BackendError, get_backend
from pbs_power.devices.controller import DeviceController, DeviceRequest
from pbs_power.devices.ipmi.backend import IpmiDevices, IpmiPowerBackend
from pbs_power.devices.ipmi.ipmitool import Bmc, IpmiTool, Settings
from pbs_power.devices.ipmi.options import IpmiConfig
from pbs_power.devices.selection import build_device_backends
from pbs_power.states.model import PowerState, TransitionKind as K
from pbs_power.sim.cluster import SimCluster
from pbs_power.sim.workload import SimJob
from pbs_power.states.store import Store

ON, OFF, UNKNOWN = PowerState.ON, PowerState.OFF, PowerState.UNKNOWN
NODE = {"min_watts": 100, "idle_watts": 150, "max_watts": 1000}
T0 = 1_800_000_000.0


@pytest.fixture
def creds(tmp_path) -> Path:
    return write_credentials(tmp_path / "ipmi-credentials.json")


def opts(creds: Path, bmcs, **extra) -> dict:
    """Backend options for these simulated BMCs (generous timeouts: a loaded CI machine)."""
    out = {"credentials_file": str(creds), "bmcs": {b.name: b.address for b in bmcs},
           "timeout": 2, "retries": 2, "call_timeout": 30,
           "cipher_suite": 3}  # ipmi_sim offers suites 0-3 only; the default is 17
    out.update(extra)
    return out


def start(sims: SimFleet, count: int, **kw):
    return [sims.start("node%03d" % (i + 1), **kw) for i in range(count)]


def model(entity: str) -> str:
    return json.dumps({"entity": entity, "device_spec": "cpu", "type": "ComputerSystem",
                       "backend": "ipmi", "node": NODE, "gpu": None})


def policy(name: str, node_limit: dict) -> dict:
    return {"name": name, "properties": {},
            "limits": [{"element_type": "NODE", "power_limit": node_limit}]}


def activate(entity: str, node_limit: dict, gpu_policies=None) -> DeviceRequest:
    return DeviceRequest(entity, "resource_group_activate", {
        "resource_group": "rg_1", "gpu_policies": gpu_policies,
        "policy": {"policy_action": "set", "policy": policy("p", node_limit)}}, model(entity))


def deactivate(entity: str) -> DeviceRequest:
    return DeviceRequest(entity, "resource_group_deactivate", {
        "resource_group": "rg_1", "policy": {"policy_action": "unset", "policy": None},
        "gpu_policies": {"gpu_policy_action": "reset", "gpu_policies": [],
                         "current_policy": None}}, model(entity))


# -- host power -----------------------------------------------------------------
def test_power_round_trip_soft_off_then_on(sims, creds, tmp_path):
    bmcs = start(sims, 4)
    hosts = [b.name for b in bmcs]
    backend = get_backend(BackendConfig("ipmi", opts(creds, bmcs)), str(tmp_path))
    assert isinstance(backend, IpmiPowerBackend)
    assert {h: s.state for h, s in backend.status(hosts, 0).items()} == dict.fromkeys(hosts, ON)

    sent = backend.request(K.POWER_OFF, hosts[:2], 0)
    assert all(r.ok and "chassis power soft sent" in r.diag for r in sent.values()), sent
    states = {h: s.state for h, s in backend.status(hosts, 0).items()}
    assert states == {"node001": OFF, "node002": OFF, "node003": ON, "node004": ON}
    assert bmcs[0].chassis_log() == ["shutdown 1"]          # the soft (ACPI) request
    assert bmcs[2].chassis_log() == []

    back = backend.request(K.POWER_ON, hosts[:2], 0)
    assert all(r.ok for r in back.values()), back
    assert [s.state for s in backend.status(hosts, 0).values()] == [ON] * 4
    assert bmcs[1].chassis_log() == ["shutdown 1", "power 1"]

    bmcs[3].set_power(False)                   # switched off by hand: status reads it live
    assert backend.status(["node004"], 0)["node004"].state is OFF
    assert backend.last_errors == {}


def test_hosts_already_there_get_no_command(sims, creds, tmp_path):
    bmcs = [sims.start("node001", power_on=False), sims.start("node002")]
    backend = get_backend(BackendConfig("ipmi", opts(creds, bmcs)), str(tmp_path))
    off = backend.request(K.POWER_OFF, ["node001"], 0)["node001"]
    on = backend.request(K.POWER_ON, ["node002"], 0)["node002"]
    assert off.ok and off.diag.endswith("already off") and on.ok and on.diag.endswith("already on")
    assert bmcs[0].chassis_log() == [] and bmcs[1].chassis_log() == []


def test_a_soft_off_the_os_ignores_becomes_a_hard_off_after_the_timeout(sims, creds, tmp_path):
    bmcs = start(sims, 2)
    for bmc in bmcs:
        bmc.ignore_soft_off()
    backend = get_backend(BackendConfig("ipmi", opts(creds, bmcs, soft_off_timeout=60)),
                          str(tmp_path / "state"))
    sent = backend.request(K.POWER_OFF, ["node001", "node002"], T0)
    assert all(r.ok and "hard off if still on after 60s" in r.diag for r in sent.values())
    assert [b.power() for b in bmcs] == ["on", "on"]
    early = backend.status(["node001", "node002"], T0 + 30)
    assert {s.state for s in early.values()} == {PowerState.TRANSITIONING}
    assert bmcs[0].chassis_log() == ["shutdown 1"]           # nothing more yet
    bmcs[1].set_power(False)                                 # this one did shut down late
    # a new backend object (a later hook run) reads the soft offs from the state directory
    later = get_backend(BackendConfig("ipmi", opts(creds, bmcs, soft_off_timeout=60)),
                        str(tmp_path / "state"))
    states = later.status(["node001", "node002"], T0 + 61)
    assert bmcs[0].chassis_log() == ["shutdown 1", "power 0"] and bmcs[0].power() == "off"
    assert bmcs[1].chassis_log() == ["shutdown 1"]
    assert states["node002"].state is OFF
    assert later.status(["node001"], T0 + 62)["node001"].state is OFF


def test_hard_power_off_option_sends_chassis_power_off(sims, creds, tmp_path):
    bmcs = start(sims, 2)
    backend = get_backend(BackendConfig("ipmi", opts(creds, bmcs, power_off="hard")),
                          str(tmp_path))
    assert backend.request(K.POWER_OFF, ["node001"], 0)["node001"].ok
    assert bmcs[0].chassis_log() == ["power 0"] and bmcs[0].power() == "off"
    assert bmcs[1].power() == "on"


def test_sleep_wake_and_unknown_hosts_fail_per_host(sims, creds, tmp_path):
    bmcs = start(sims, 1)
    backend = get_backend(BackendConfig("ipmi", opts(creds, bmcs)), str(tmp_path))
    refused = backend.request(K.SLEEP, ["node001"], 0)["node001"]
    assert not refused.ok and "IPMI has no sleep state" in refused.diag
    assert bmcs[0].chassis_log() == []
    out = backend.request(K.POWER_ON, ["node001", "ghost"], 0)
    assert out["node001"].ok
    assert not out["ghost"].ok and "no BMC address" in out["ghost"].diag
    assert backend.status(["ghost"], 0)["ghost"].state is UNKNOWN
    assert backend.last_errors["ghost"].startswith("ghost: ipmi: no BMC address")
    assert backend.check("ghost") == {  # what `pbs-power devices check` prints for it
        "reachable": False, "backend": "ipmi", "power_state": None, "power_cap_watts": None,
        "diag": "ghost: ipmi: no BMC address (host not in option bmcs, no bmc_template)"}


def test_bmc_template_addresses_hosts_without_a_map_entry(sims, creds, tmp_path):
    bmc = start(sims, 1)[0]
    options = opts(creds, [], bmc_template="{host}", port=bmc.port)
    backend = get_backend(BackendConfig("ipmi", options), str(tmp_path))
    assert backend.status(["127.0.0.1"], 0)["127.0.0.1"].state is ON


def test_cycle_powers_idle_hosts_off_and_wakes_them_for_a_job(sims, creds, tmp_path):
    bmcs = start(sims, 4)
    hosts = [b.name for b in bmcs]
    cfg = HookConfig(power_on_off_enable=True, node_idle_limit=1800, min_node_down_delay=0,
                     max_concurrent_nodes=10, node_boot_time=900, boot_timeout=1200,
                     cycle_interval=300, state_dir=str(tmp_path),
                     power_backend=BackendConfig("ipmi", opts(creds, bmcs)))
    backend = get_backend(cfg.power_backend, cfg.state_dir)
    store = Store.open(cfg.state_dir)
    logs = []
    cycle = Cycle(cfg, store, backend, lambda level, msg: logs.append((level, msg)))
    cluster = SimCluster(hosts, NodePower(), backend, T0 - 7200)

    def run(now, arrivals=()):
        cluster.step(now, list(arrivals))
        report = cycle.run(cluster.snapshot(now), now)
        cluster.apply(report.marks, now)
        cluster.step(now, [])
        return report

    assert sorted(run(T0).marked(True)) == hosts                 # drained first
    assert [b.power() for b in bmcs] == ["on"] * 4
    run(T0 + 300)                                                # then powered off
    assert [b.power() for b in bmcs] == ["off"] * 4
    assert all(b.chassis_log() == ["shutdown 1"] for b in bmcs)
    assert len(run(T0 + 600).completed) == 4                     # and seen off
    assert set(store.down_since()) == set(hosts)

    job = SimJob("9.sim", T0 + 1000, 2, 600, 1200)
    report = run(T0 + 900, [job])
    woken = sorted(t.host for t in report.started if t.kind is K.POWER_ON)
    assert len(woken) == 2, logs
    assert sorted(b.name for b in bmcs if b.power() == "on") == woken
    assert any("power_on sent" in msg for _, msg in logs)
    run(T0 + 1200)
    assert job.start is not None and set(job.hosts) == set(woken)
    store.close()


# -- failures: wrong password, dead BMC, cipher suite ------------------------------------
def test_wrong_password_and_unknown_user_are_per_node_diagnostics(sims, creds, tmp_path):
    bmcs = start(sims, 3)
    write_credentials(creds, hosts={"node002": {"password": "not-the-password"},
                                    "node003": {"username": "nobody"}})
    backend = get_backend(BackendConfig("ipmi", opts(creds, bmcs)), str(tmp_path))
    states = backend.status(["node001", "node002", "node003"], 0)
    assert [states[h].state for h in ("node001", "node002", "node003")] == [ON, UNKNOWN, UNKNOWN]
    assert backend.last_errors["node002"] == (
        "node002: ipmi %s: authentication failed: wrong password for user 'admin'"
        % bmcs[1].address)
    assert backend.last_errors["node003"] == (
        "node003: ipmi %s: authentication failed: user 'nobody' unknown to the BMC"
        % bmcs[2].address)
    refused = backend.request(K.POWER_OFF, ["node002"], 0)["node002"]
    assert not refused.ok and "wrong password" in refused.diag
    assert bmcs[1].power() == "on" and bmcs[1].chassis_log() == []


def test_ipmi_15_interface_authenticates_too(sims, creds, tmp_path):
    bmcs = start(sims, 2)
    write_credentials(creds, hosts={"node002": {"password": "not-the-password"}})
    options = opts(creds, bmcs, interface="lan", timeout=1, retries=1)
    backend = get_backend(BackendConfig("ipmi", options), str(tmp_path))
    states = backend.status(["node001", "node002"], 0)
    assert states["node001"].state is ON and states["node002"].state is UNKNOWN
    assert "authentication failed" in backend.last_errors["node002"]


def test_dead_bmc_gives_a_timeout_diagnostic_and_stalls_nobody(sims, creds, tmp_path):
    live = start(sims, 1)[0]
    dead_port = free_udp_port()                    # nothing listens there
    options = opts(creds, [live], timeout=1, retries=1, call_timeout=15)
    options["bmcs"]["dead001"] = "127.0.0.1:%d" % dead_port
    backend = get_backend(BackendConfig("ipmi", options), str(tmp_path))
    began = time.monotonic()
    states = backend.status(["node001", "dead001"], 0)
    elapsed = time.monotonic() - began
    assert states["node001"].state is ON and states["dead001"].state is UNKNOWN
    assert backend.last_errors["dead001"] == (
        "dead001: ipmi 127.0.0.1:%d: no answer from the BMC (ipmitool -N 1 -R 1): "
        "unreachable, wrong port or no IPMI over LAN there" % dead_port)
    assert elapsed < 15 + 10, elapsed               # call_timeout plus a generous margin


def test_call_timeout_kills_ipmitool_that_would_wait_longer(creds, tmp_path):
    dead_port = free_udp_port()
    options = {"credentials_file": str(creds), "bmcs": {"dead001": "127.0.0.1:%d" % dead_port},
               "timeout": 5, "retries": 3, "call_timeout": 2}  # ipmitool alone: > 20 s
    backend = get_backend(BackendConfig("ipmi", options), str(tmp_path))
    began = time.monotonic()
    result = backend.request(K.POWER_ON, ["dead001"], 0)["dead001"]
    elapsed = time.monotonic() - began
    assert not result.ok
    assert result.diag.endswith("no answer within 2s (ipmitool killed): BMC unreachable or "
                                "too slow"), result.diag
    assert elapsed < 2 + 10, elapsed


def test_cipher_suite_is_passed_to_the_bmc(sims, creds, tmp_path):
    bmcs = start(sims, 1)
    refused = get_backend(BackendConfig("ipmi", opts(creds, bmcs, cipher_suite=17)),
                          str(tmp_path))
    assert refused.status(["node001"], 0)["node001"].state is UNKNOWN
    assert ("cipher suite 17 refused by the BMC (invalid authentication algorithm)"
            in refused.last_errors["node001"])
    accepted = get_backend(BackendConfig("ipmi", opts(creds, bmcs, cipher_suite=1)),
                           str(tmp_path))
    assert accepted.status(["node001"], 0)["node001"].state is ON


def test_cipher_suite_17_is_the_default():
    assert "-C 17 " in " ".join(IpmiTool(Settings()).argv(Bmc("n1", "10.0.0.7"), ["x"]))
    parsed = IpmiConfig.parse({"credentials_file": "/etc/creds.json"}, "ipmi")
    assert parsed.settings.cipher_suite == 17


def test_argv_carries_settings_but_never_the_password():
    tool = IpmiTool(Settings(cipher_suite=17, privilege="OPERATOR", timeout=4, retries=3))
    argv = tool.argv(Bmc("n1", "10.0.0.7", 6230, "admin", "s3cret!"), ["chassis", "power",
                                                                         "status"])
    assert argv == ["ipmitool", "-v", "-I", "lanplus", "-H", "10.0.0.7", "-p", "6230", "-U",
                    "admin", "-E", "-C", "17", "-L", "OPERATOR", "-N", "4", "-R", "3",
                    "chassis", "power", "status"]
    assert not any("s3cret" in arg for arg in argv)
    assert "s3cret" not in repr(Bmc("n1", "10.0.0.7", 6230, "admin", "s3cret!"))


# -- node power caps (device backend) ----------------------------------------------
def test_bmc_without_dcmi_fails_caps_with_a_clear_per_node_diagnostic(sims, creds):
    bmcs = start(sims, 2)
    with DeviceController(build_device_backends({"ipmi": opts(creds, bmcs)})) as ctl:
        got = ctl.send([activate(b.name, {"watts": 300}) for b in bmcs])
        for b in bmcs:
            assert not got[b.name].success
            assert got[b.name].error == ("%s: ipmi %s: BMC does not support DCMI power "
                                         "limiting (completion code 0xc1)" % (b.name, b.address))
        lifted = ctl.send([deactivate(b.name) for b in bmcs])  # nothing to lift: fine
        assert all(r.success and r.power_cap_watts == 1000 for r in lifted.values()), lifted


def test_dcmi_cap_is_set_read_back_and_lifted(sims, creds):
    bmc = sims.start("node001", dcmi=True, dcmi_min=50, dcmi_max=2000)
    plain = sims.start("node002")
    devices = IpmiDevices.from_options(opts(creds, [bmc, plain]))
    with DeviceController({"ipmi": devices}) as ctl:
        got = ctl.send([activate("node001", {"watts": 300}), activate("node002", {"watts": 300})])
        assert got["node001"].success and got["node001"].power_cap_watts == 300
        assert not got["node002"].success                       # one BMC's failure is its own
        assert bmc.dcmi_state()["active"] == 1 and bmc.dcmi_state()["limit"] == 300
        assert json.loads(got["node001"].device_state_json)["node_cap_watts"] == 300

        probe = devices.probe(["node001", "node002"])
        assert probe["node001"].cap_watts == 300 and probe["node001"].cap_active is True
        assert probe["node001"].power is ON and probe["node001"].latency_s > 0
        assert probe["node002"].reachable and probe["node002"].cap_watts is None
        assert "does not support DCMI" in probe["node002"].cap_error

        update = DeviceRequest("node001", "resource_group_update", {
            "resource_group": "rg_1", "gpu_policies": None,
            "policy": {"policy_action": "set", "policy": policy("half", {"percentage": 45.5})}},
            model("node001"), got["node001"].device_state_json)
        assert ctl.send([update])["node001"].power_cap_watts == 455
        assert bmc.dcmi_state()["limit"] == 455

        lifted = ctl.send([deactivate("node001")])["node001"]
        assert lifted.success and lifted.power_cap_watts == 1000
        assert bmc.dcmi_state()["active"] == 0

        topology = DeviceRequest("node001", "topology_activate", {
            "policy_action": "set", "policy": policy("site", {"watts": 600})}, model("node001"))
        assert ctl.send([topology])["node001"].power_cap_watts == 600
        assert bmc.dcmi_state()["active"] == 1 and bmc.dcmi_state()["limit"] == 600


def test_bmc_refusing_a_limit_names_the_completion_code(sims, creds):
    bmc = sims.start("node001", dcmi=True, dcmi_min=200, dcmi_max=2000)
    devices = IpmiDevices.from_options(opts(creds, [bmc]))
    resp = devices.handle(activate("node001", {"watts": 150}))
    assert not resp.success
    assert resp.error == ("node001: ipmi %s: BMC refused the power limit: power limit 150 W "
                          "is out of the range this BMC accepts (it enforces a minimum or "
                          "maximum limit): raise the cap, or set the node's min_watts to the "
                          "BMC's minimum (DCMI completion code 0x84)" % bmc.address)
    assert bmc.dcmi_state()["active"] == 0 and bmc.dcmi_state()["limit"] == 0


def test_set_limit_sends_our_correction_time_and_exception_action(sims, creds):
    bmc = sims.start("node001", dcmi=True)
    # the BMC holds "hard power off" and a 0 ms correction time, stored earlier by someone else
    env = dict(os.environ, IPMI_PASSWORD=PASSWORD)
    subprocess.run(["ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", str(bmc.port), "-U",
                    USERNAME, "-E", "-C", "3", "-N", "2", "-R", "2", "raw", "0x2c", "0x04",
                    "0xdc", "0", "0", "0", "0x01", "0x2c", "0x01", "0", "0", "0", "0", "0", "0",
                    "1", "0"], env=env, check=True, timeout=60,
                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert (bmc.dcmi_state()["action"], bmc.dcmi_state()["correction"]) == (0x01, 0)
    devices = IpmiDevices.from_options(opts(creds, [bmc], dcmi_correction_ms=6000))
    resp = devices.handle(activate("node001", {"watts": 600}))
    assert resp.success, resp.error
    held = bmc.dcmi_state()
    assert (held["active"], held["limit"], held["correction"], held["action"]) == \
        (1, 600, 6000, 0x11)                                   # log event only, our time
    hard = IpmiDevices.from_options(opts(creds, [bmc], dcmi_exception_action="none"))
    assert hard.handle(activate("node001", {"watts": 500})).success
    assert bmc.dcmi_state()["action"] == 0x00 and bmc.dcmi_state()["correction"] == 1000


def test_gpu_caps_are_refused_but_the_node_cap_applies(sims, creds):
    bmc = sims.start("node001", dcmi=True)
    devices = IpmiDevices.from_options(opts(creds, [bmc]))
    gpus = {"gpu_policy_action": "set", "current_policy": None,
            "gpu_policies": [{"gpu_id": 0, "power_limit": {"watts": 200}}]}
    resp = devices.handle(activate("node001", {"watts": 400}, gpus))
    assert not resp.success and resp.power_cap_watts == 400
    assert [(r.gpu_id, r.ok) for r in resp.gpu_results] == [(0, False)]
    assert "GPU power caps are not set over IPMI" in resp.error
    assert bmc.dcmi_state()["limit"] == 400 and bmc.dcmi_state()["active"] == 1
    update = devices.handle(DeviceRequest("node001", "gpu_policies_update", gpus,
                                          model("node001")))
    assert not update.success and "use a GPU backend" in update.error


def test_ping_reports_reachability_and_dead_bmcs(sims, creds):
    bmc = sims.start("node001", dcmi=True)
    options = opts(creds, [bmc], timeout=1, retries=1, call_timeout=15)
    options["bmcs"]["dead001"] = "127.0.0.1:%d" % free_udp_port()
    with DeviceController({"ipmi": IpmiDevices.from_options(options)}) as ctl:
        got = ctl.send([DeviceRequest(h, "ping", {}, model(h), timeout_seconds=30)
                        for h in ("node001", "dead001")])
    assert got["node001"].success and got["node001"].ping_time is not None
    assert not got["dead001"].success and "no answer from the BMC" in got["dead001"].ping_error


# -- options --------------------------------------------------------------------
def test_hook_config_selects_the_ipmi_backend(sims, creds, tmp_path):
    bmc = start(sims, 1)[0]
    cfg = parse_config({"power_backend": {
        "type": "ipmi", "credentials_file": str(creds), "bmcs": {"node001": bmc.address},
        "timeout": "2", "retries": "2", "cipher_suite": "3"}})  # numeric strings, as in PBS
    assert cfg.power_backend.options["timeout"] == 2
    backend = get_backend(cfg.power_backend, str(tmp_path))
    assert backend.status(["node001"], 0)["node001"].state is ON
    with pytest.raises(ConfigError, match="did you mean 'cipher_suite'"):
        parse_config({"power_backend": {"type": "ipmi", "credentials_file": str(creds),
                                        "cipher": 3}})


@pytest.mark.parametrize("bad, message", [
    ({"colour": "red"}, "unknown option(s) 'colour'"),
    ({"cipher_suite": "3"}, "option cipher_suite must be an integer"),
    ({"retries": 0}, "option retries must be an integer from 1"),
    ({"interface": "open"}, "option interface must be one of lanplus, lan"),
    ({"bmcs": {"n1": "-oProxyCommand"}}, "option bmcs['n1']"),
    ({"bmcs": {"n1": "10.0.0.1:99999"}}, "option bmcs['n1']"),
    ({"bmc_template": "bmc-%s"}, "must be a string containing {host}"),
    ({"power_off": "pull-the-plug"}, "option power_off must be one of soft, hard"),
    ({"ipmitool": "/nonexistent/ipmitool"}, "/nonexistent/ipmitool not found (install"),
])
def test_bad_options_are_named(creds, tmp_path, bad, message):
    options = {"credentials_file": str(creds)}
    options.update(bad)
    with pytest.raises(BackendError) as err:
        get_backend(BackendConfig("ipmi", options), str(tmp_path))
    assert message in str(err.value)


def test_credentials_file_must_be_absolute_and_private(creds, tmp_path):
    with pytest.raises(BackendError, match="absolute path"):
        get_backend(BackendConfig("ipmi", {"credentials_file": "ipmi.json"}), str(tmp_path))
    os.chmod(str(creds), 0o644)
    with pytest.raises(BackendError, match="chmod 600") as err:
        IpmiDevices.from_options({"credentials_file": str(creds)})
    assert PASSWORD not in str(err.value)
