"""``pbs-power devices check`` end to end, with the simulated and command backends."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading

import pytest

from pbs_power.cli.main import main
from pbs_power.config.hook_config import HookConfig, parse_config
from pbs_power.devices.base import HostPower, PowerBackend
from pbs_power.devices.check import check_power, run_check
from pbs_power.states.model import PowerState
from pbs_power.groups.service import ResourceGroupService
from pbs_power.groups.topology import parse_topology

#: A BMC front end as a site script: g2's BMC does not answer.
SITE_SCRIPT = """
import json, sys
operation, host = sys.argv[-2], sys.argv[-1]
json.load(sys.stdin)
if host == "g2":
    sys.stderr.write("ipmi: Unable to establish IPMI v2 session\\n")
    sys.exit(1)
print(json.dumps({"success": True, "power_state": "on", "power_cap_watts": 2400}))
"""

TOPOLOGY = {
    "name": "check",
    "device_specs": {"box": {"node": {"min_watts": 200, "idle_watts": 300, "max_watts": 1000},
                             "gpu": {"count": 2, "min_watts": 100, "max_watts": 400}}},
    "power_domains": [{"name": "feed", "budget_watts": 100000}],
    "policies": [{"name": "Low", "limits": [{"element_type": "NODE",
                                             "power_limit": {"watts": 500}}]}],
    "default_policy": "Low",
    "entities": [{"names": "n[1-2]", "device": "box", "domain": "feed"}],
}


@pytest.fixture
def site(tmp_path):
    path = tmp_path / "bmc.py"
    path.write_text(textwrap.dedent(SITE_SCRIPT))
    return [sys.executable, str(path)]


def hook_config(tmp_path, site, **device_options):
    doc = {"state_dir": str(tmp_path / "state"),
           "power_backend": {"type": "groups", "groups": [
               {"nodes": "n[1-2]", "backend": {"type": "simulated"}},
               {"nodes": "g[1-2]", "backend": {"type": "command", "argv": site,
                                               "timeout_seconds": 20}}]},
           "job_policies": {"device_options": dict({"simulated": {"latency_ms": 0}},
                                                   **device_options)}}
    path = tmp_path / "hook.json"
    path.write_text(json.dumps(doc))
    return path


def import_topology(state_dir):
    svc = ResourceGroupService(str(state_dir), {"simulated": {"latency_ms": 0}})
    assert svc.import_topology(parse_topology(TOPOLOGY)).ok
    assert svc.set_topology_active(True).status.ok
    svc.close()


def test_simulated_power_backend_rows(tmp_path):
    report = run_check(HookConfig(state_dir=str(tmp_path)), ["n1", "n2"])
    assert report.ok and [(r.node, r.backend, r.reachable, r.power_state)
                          for r in report.rows] == [("n1", "simulated", True, "on"),
                                                    ("n2", "simulated", True, "on")]
    assert all(r.latency_ms is not None and r.latency_ms >= 0 for r in report.rows)


def test_cli_table_mixed_groups_and_topology(tmp_path, site, capsys):
    config = hook_config(tmp_path, site)
    import_topology(tmp_path / "state")
    code = main(["devices", "check", "--config", str(config)])
    out, err = capsys.readouterr()
    assert code == 1  # g2 does not answer
    lines = out.splitlines()
    assert lines[0].split() == ["NODE", "BACKEND", "REACHABLE", "POWER", "CAP", "LATENCY_MS",
                                "DIAGNOSTIC"]
    rows = [line.split(None, 6) for line in lines[1:]]
    assert [r[:4] for r in rows] == [
        ["g1", "command", "yes", "on"], ["g2", "command", "NO", "-"],
        ["n1", "simulated", "yes", "on"], ["n1", "simulated", "yes", "-"],
        ["n2", "simulated", "yes", "on"], ["n2", "simulated", "yes", "-"]]
    assert rows[3][4:6] == ["500", "W,"] and "gpu 400/400 W" in lines[4]  # device caps
    assert rows[0][4:6] == ["2400", "W"]
    assert rows[1][6].endswith("status: exited with status 1; stderr: ipmi: Unable to "
                               "establish IPMI v2 session")
    assert err.strip() == "1 of 6 check(s) failed"


def test_cli_json_and_a_failing_device(tmp_path, site, capsys):
    config = hook_config(tmp_path, site, simulated={"latency_ms": 0, "fail_devices": "n2"})
    import_topology(tmp_path / "state")
    assert main(["devices", "check", "n[1-2]", "--config", str(config), "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    assert [(r["node"], r["reachable"], r["diag"]) for r in rows] == [
        ("n1", True, ""), ("n1", True, ""), ("n2", True, ""),
        ("n2", False, "simulated device failure")]
    assert rows[1]["cap_watts"] == 500 and rows[1]["gpu_caps"] == [400, 400]
    assert [r["kind"] for r in rows] == ["power", "device", "power", "device"]
    # the check read the stored device states but wrote none
    svc = ResourceGroupService(str(tmp_path / "state"))
    try:
        assert json.loads(svc.store.get_device_state("n1"))["calls"] == 1  # the activation
    finally:
        svc.close()


def test_every_node_answering_exits_0(tmp_path, site, capsys):
    config = hook_config(tmp_path, site)
    assert main(["devices", "check", "g1,n[1-2]", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["g1", "n1", "n2"]


def test_nodes_outside_every_group_are_unreachable(tmp_path, site, capsys):
    config = hook_config(tmp_path, site)
    assert main(["devices", "check", "x1", "--config", str(config), "--json"]) == 1
    row = json.loads(capsys.readouterr().out)[0]
    assert (row["node"], row["backend"], row["reachable"]) == ("x1", "-", False)
    assert row["diag"] == "in no power_backend group: no backend powers it"


@pytest.mark.parametrize("argv,fragment", [
    (["devices", "check", "n[1-"], "bad hostlist 'n[1-'"),
    (["devices", "check", "--timeout", "0"], "--timeout must be > 0"),
    (["devices", "check", "--config", "/nonexistent/hook.json"], "file not found"),
])
def test_bad_input_exits_2(argv, fragment, capsys):
    assert main(argv) == 2
    assert fragment in capsys.readouterr().err


def test_no_nodes_known_exits_2(tmp_path, capsys):
    config = tmp_path / "hook.json"
    config.write_text(json.dumps({"state_dir": str(tmp_path / "state")}))
    assert main(["devices", "check", "--config", str(config)]) == 2
    assert "no nodes to check" in capsys.readouterr().err


class Probed(PowerBackend):
    """A backend offering the check protocol: one host raises, one never answers."""

    name = "probed"

    def __init__(self):
        self.release = threading.Event()

    def request(self, kind, hosts, now):
        raise NotImplementedError

    def status(self, hosts, now):
        return {h: HostPower(PowerState.UNKNOWN) for h in hosts}

    def check(self, host):
        if host == "boom":
            raise RuntimeError("BMC session table full")
        if host == "hung":
            self.release.wait(60)
        return {"reachable": True, "power_state": "off", "power_cap_watts": 350.0,
                "diag": "", "backend": "probed-bmc"}


def test_check_protocol_errors_and_hangs_are_rows():
    backend = Probed()
    try:
        rows = {r.node: r for r in check_power(backend, ["ok", "boom", "hung"], timeout=0.5)}
    finally:
        backend.release.set()
    assert (rows["ok"].backend, rows["ok"].power_state, rows["ok"].cap_watts) == (
        "probed-bmc", "off", 350.0)
    assert rows["boom"].diag == "check raised RuntimeError: BMC session table full"
    assert not rows["hung"].reachable and rows["hung"].diag == "no answer within 0.5s"


def test_the_installed_command_runs_it(tmp_path, site):
    config = hook_config(tmp_path, site)
    done = subprocess.run([sys.executable, "-m", "pbs_power.cli.main", "devices", "check", "n1,g2",
                           "--config", str(config)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines()[1].split()[:3] == ["g2", "command", "NO"]
    assert done.stdout.splitlines()[2].split()[:3] == ["n1", "simulated", "yes"]


def test_a_single_backend_config_still_checks(tmp_path, site):
    config = parse_config({"state_dir": str(tmp_path), "power_backend": {
        "type": "command", "argv": site}})
    report = run_check(config, ["g1", "g2"])
    assert [(r.node, r.reachable) for r in report.rows] == [("g1", True), ("g2", False)]
