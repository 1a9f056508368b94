"""``pbs-power devices check`` end to end against real emulated BMCs.

The hook config routes r-nodes to a sushy-tools Redfish emulator (TLS, basic
auth; its power-limit resources, Controls included, are OUR extension in
tests/emulators/redfish_extensions.py) and i-nodes to OpenIPMI ipmi_sim BMCs
(DCMI power limiting from OUR ipmi_sim_dcmi.c extension where started with
``dcmi=True``). Dead BMCs are closed 127.0.0.1 ports. Every emulator is
started by the fixtures on a free port and killed by PID at teardown; the
command is run through `pbs_power.cli.main` as an admin would run it.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest
import requests

from emulators.ipmi_sim import (PASSWORD, USERNAME, SimBmc, free_udp_port,
                                write_credentials)
from emulators.redfish_emulator import RedfishEmulator, free_port, make_tls, systems_for
from pbs_power.cli.main import main
from pbs_power.cli.devices import COLUMNS
from pbs_power.groups.service import ResourceGroupService
from pbs_power.groups.topology import parse_topology

USERS = {"admin": "rf-s3cret"}
NODE = {"min_watts": 100, "idle_watts": 150, "max_watts": 1000}


@pytest.fixture
def redfish(tmp_path):
    """Starts at most one emulator per test (``redfish(systems, caps)``); stopped at teardown."""
    started: List[RedfishEmulator] = []

    def start(systems, caps) -> RedfishEmulator:
        emu = RedfishEmulator(str(tmp_path / "redfish"), systems, users=USERS, caps=caps,
                              tls=make_tls(str(tmp_path / "tls")))
        started.append(emu)
        return emu.start()
    yield start
    for emu in started:
        emu.stop()


def redfish_options(tmp_path: Path, emu: RedfishEmulator, systems, **dead_urls) -> Dict:
    creds = tmp_path / "redfish-credentials.json"
    fd = os.open(str(creds), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"username": "admin", "password": USERS["admin"]}, f)
    bmcs = {s.host: {"url": emu.url, "system_id": s.uuid} for s in systems}
    bmcs.update({host: {"url": url, "system_id": "1"} for host, url in dead_urls.items()})
    return {"type": "redfish", "bmcs": bmcs, "credentials_file": str(creds),
            "ca_file": emu.tls.ca_file, "timeout_seconds": 10, "retries": 1,
            "backoff_seconds": 0.1}


def ipmi_options(tmp_path: Path, bmcs: List[SimBmc], **dead_addresses) -> Dict:
    creds = write_credentials(tmp_path / "ipmi-credentials.json")
    addresses = {b.name: b.address for b in bmcs}
    addresses.update(dead_addresses)
    return {"type": "ipmi", "credentials_file": str(creds), "bmcs": addresses,
            "timeout": 2, "retries": 1, "call_timeout": 30, "cipher_suite": 3}  # ipmi_sim: <= 3


def write_hook_config(tmp_path: Path, redfish_opts: Dict, ipmi_opts: Dict,
                      device_options: Dict = None) -> str:
    doc = {"state_dir": str(tmp_path / "state"),
           "power_backend": {"type": "groups", "groups": [
               {"nodes": "r[1-3]", "backend": redfish_opts},
               {"nodes": "i[1-4]", "backend": ipmi_opts}]}}
    if device_options:
        doc["job_policies"] = {"device_options": device_options}
    path = tmp_path / "hook.json"
    path.write_text(json.dumps(doc))
    return str(path)


def set_dcmi_limit(bmc: SimBmc, watts: int) -> None:
    """Set and activate a DCMI limit with plain ipmitool, past the code under test."""
    base = ["ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", str(bmc.port), "-U",
            USERNAME, "-E", "-C", "3", "-N", "2", "-R", "2", "dcmi", "power"]
    env = dict(os.environ, IPMI_PASSWORD=PASSWORD)
    for args in (["set_limit", "limit", str(watts)], ["activate"]):
        subprocess.run(base + args, env=env, check=True, timeout=60, stdin=subprocess.DEVNULL,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert bmc.dcmi_state()["active"] == 1 and bmc.dcmi_state()["limit"] == watts


def parse_table(out: str) -> List[Dict[str, str]]:
    """The printed table as one dict per row, cut at the header's column positions."""
    lines = out.rstrip("\n").split("\n")
    starts = [lines[0].index(name) for name in COLUMNS]
    assert lines[0].split() == list(COLUMNS)
    bounds = list(zip(starts, starts[1:] + [None]))
    return [{name: line[a:b].strip() for name, (a, b) in zip(COLUMNS, bounds)}
            for line in lines[1:]]


def run(argv: List[str], capsys) -> Any:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_mixed_redfish_and_ipmi_fleet_table_json_and_dead_bmcs(tmp_path, sims, redfish,
                                                                capsys):
    systems = systems_for(["r1"]) + systems_for(["r2"], "Off")
    emu = redfish(systems, {  # r1: EnvironmentMetrics; r2: only a Controls power control
        systems[0].chassis: {"style": "environment", "min": 100, "max": 800, "limit": 600},
        systems[1].chassis: {"style": "controls", "min": 100, "max": 800, "limit": 450}})
    capped = sims.start("i1", dcmi=True)
    uncapped = sims.start("i2", dcmi=True, power_on=False)  # DCMI, but no limit active
    plain = sims.start("i3")                                 # no DCMI power limiting
    set_dcmi_limit(capped, 500)
    dead_rf, dead_ipmi = free_port(), free_udp_port()       # nothing listens there
    config = write_hook_config(
        tmp_path, redfish_options(tmp_path, emu, systems, r3="https://127.0.0.1:%d" % dead_rf),
        ipmi_options(tmp_path, [capped, uncapped, plain], i4="127.0.0.1:%d" % dead_ipmi))

    code, out, err = run(["devices", "check", "--config", config], capsys)
    assert code == 1
    assert err.strip() == "2 of 7 check(s) failed"
    rows = {r["NODE"]: r for r in parse_table(out)}
    assert list(rows) == ["i1", "i2", "i3", "i4", "r1", "r2", "r3"]  # one line per node
    assert [(r["BACKEND"], r["REACHABLE"], r["POWER"], r["CAP"]) for r in rows.values()] == [
        ("ipmi", "yes", "on", "500 W"), ("ipmi", "yes", "off", "-"), ("ipmi", "yes", "on", "-"),
        ("ipmi", "NO", "-", "-"),
        ("redfish", "yes", "on", "600 W"), ("redfish", "yes", "off", "450 W"),
        ("redfish", "NO", "-", "-")]
    assert all(r["LATENCY_MS"].isdigit() for r in rows.values()), rows
    assert all(int(rows[h]["LATENCY_MS"]) > 0 for h in ("i1", "i2", "i3"))  # ipmitool runs
    assert rows["i1"]["DIAGNOSTIC"] == rows["r1"]["DIAGNOSTIC"] == rows["r2"]["DIAGNOSTIC"] == "-"
    assert rows["i2"]["DIAGNOSTIC"] == "DCMI power limit not active: node uncapped"
    assert rows["i3"]["DIAGNOSTIC"] == (
        "no power cap: i3: ipmi %s: BMC does not support DCMI power limiting (completion "
        "code 0xc1)" % plain.address)
    assert rows["i4"]["DIAGNOSTIC"] == (
        "i4: ipmi 127.0.0.1:%d: no answer from the BMC (ipmitool -N 2 -R 1): unreachable, "
        "wrong port or no IPMI over LAN there" % dead_ipmi)
    assert rows["r3"]["DIAGNOSTIC"].startswith("r3: redfish https://127.0.0.1:%d" % dead_rf)
    assert "cannot connect (Connection refused) (2 tries)" in rows["r3"]["DIAGNOSTIC"]

    code, out, err = run(["devices", "check", "--config", config, "--json"], capsys)
    assert code == 1 and err.strip() == "2 of 7 check(s) failed"
    got = json.loads(out)
    assert [r["kind"] for r in got] == ["power"] * 7
    assert all(isinstance(r["latency_ms"], float) and r["latency_ms"] >= 0 for r in got)
    as_table = {r["node"]: (r["backend"], "yes" if r["reachable"] else "NO",
                            r["power_state"] or "-",
                            "-" if r["cap_watts"] is None else "%g W" % r["cap_watts"],
                            r["diag"] or "-") for r in got}
    assert as_table == {h: (r["BACKEND"], r["REACHABLE"], r["POWER"], r["CAP"],
                            r["DIAGNOSTIC"]) for h, r in rows.items()}

    code, out, err = run(["devices", "check", "i[1-3],r[1-2]", "--config", config], capsys)
    assert code == 0 and err == "", err  # the live BMCs alone: all answer
    assert [r["REACHABLE"] for r in parse_table(out)] == ["yes"] * 5


def test_topology_routes_device_caps_to_both_bmc_kinds(tmp_path, sims, redfish, capsys):
    systems = systems_for(["r1"])
    emu = redfish(systems, {systems[0].chassis: {"style": "environment", "min": 100,
                                                 "max": 800, "limit": 800}})
    bmc = sims.start("i1", dcmi=True)
    rf, ipmi = redfish_options(tmp_path, emu, systems), ipmi_options(tmp_path, [bmc])
    devices = {"bmc-redfish": rf, "bmc-ipmi": ipmi}  # instances named by the device specs
    config = write_hook_config(tmp_path, rf, ipmi, devices)
    spec = {"type": "ComputerSystem", "model": "test node", "node": NODE}
    topology = {
        "name": "e2e",
        "device_specs": {"rf-node": dict(spec, backend="bmc-redfish"),
                         "ipmi-node": dict(spec, backend="bmc-ipmi")},
        "power_domains": [{"name": "feed", "budget_watts": 100000}],
        "policies": [{"name": "Cap400", "limits": [{"element_type": "NODE",
                                                    "power_limit": {"watts": 400}}]}],
        "default_policy": "Cap400",
        "entities": [{"names": "r1", "device": "rf-node", "domain": "feed"},
                     {"names": "i1", "device": "ipmi-node", "domain": "feed"}]}
    svc = ResourceGroupService(str(tmp_path / "state"), devices)
    try:
        assert svc.import_topology(parse_topology(topology)).ok
        activated = svc.set_topology_active(True)
        assert activated.status.ok, activated
    finally:
        svc.close()
    # The caps reached the BMCs themselves.
    assert bmc.dcmi_state()["active"] == 1 and bmc.dcmi_state()["limit"] == 400
    env = requests.get(emu.url + "/redfish/v1/Chassis/%s/EnvironmentMetrics"
                       % systems[0].chassis, auth=("admin", USERS["admin"]),
                       verify=emu.tls.ca_file, timeout=30).json()
    assert env["PowerLimitWatts"]["SetPoint"] == 400

    code, out, err = run(["devices", "check", "r1,i1", "--config", config, "--json"], capsys)
    assert code == 0 and err == "", err
    got = [(r["node"], r["kind"], r["backend"], r["reachable"], r["cap_watts"], r["diag"])
           for r in json.loads(out)]
    assert got == [("i1", "power", "ipmi", True, 400.0, ""),
                   ("i1", "device", "bmc-ipmi", True, 400.0, ""),
                   ("r1", "power", "redfish", True, 400.0, ""),
                   ("r1", "device", "bmc-redfish", True, 400.0, "")]
