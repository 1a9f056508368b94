"""Backend selection per node group: the groups power backend, its config, device backends."""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

from pbs_power.cli.main import main
from pbs_power.config.hook_config import BackendConfig, ConfigError, config_to_dict, parse_config
from pbs_power.devices import BackendError, HostPower, get_backend
from pbs_power.devices.command import CommandDevices
from pbs_power.devices.routing import GroupedBackend
from pbs_power.devices.selection import build_device_backends, device_backend_class
from pbs_power.devices.simulated_devices import SimulatedDevices
from pbs_power.states.model import PowerState, TransitionKind

ON, OFF, UNKNOWN = PowerState.ON, PowerState.OFF, PowerState.UNKNOWN
P_ON, P_OFF = TransitionKind.POWER_ON, TransitionKind.POWER_OFF

#: A site script that answers every host's power requests and logs them.
SITE_SCRIPT = """
import json, os, sys
operation, host = sys.argv[-2], sys.argv[-1]
json.load(sys.stdin)
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "hosts.log"), "a") as f:
    f.write(operation + " " + host + "\\n")
if operation == "status":
    print(json.dumps({"success": True, "power_state": "asleep"}))
else:
    print(json.dumps({"success": True}))
"""


@pytest.fixture
def site_argv(tmp_path):
    path = tmp_path / "site.py"
    path.write_text(textwrap.dedent(SITE_SCRIPT))
    return [sys.executable, str(path)]


def grouped(tmp_path, groups):
    return get_backend(BackendConfig("groups", {"groups": groups}), str(tmp_path / "state"))


def test_hosts_go_to_their_group_backend_and_answers_merge(tmp_path, site_argv):
    backend = grouped(tmp_path, [
        {"nodes": "n[1-2]", "backend": {"type": "simulated", "boot_seconds": 100}},
        {"nodes": "g[1-2]", "backend": {"type": "command", "argv": site_argv}}])
    assert isinstance(backend, GroupedBackend)
    try:
        results = backend.request(P_OFF, ["n1", "g1", "x9"], 0.0)
        assert results["n1"].ok and results["g1"].ok and results["g1"].diag == "power_off sent"
        assert (results["x9"].ok, results["x9"].diag) == (
            False, "in no power_backend group: no backend powers it")
        status = backend.status(["n1", "n2", "g2", "x9"], 1000.0)
        assert status == {"n1": HostPower(OFF, 60.0), "n2": HostPower(ON, None),
                          "g2": HostPower(PowerState.ASLEEP, None), "x9": HostPower(UNKNOWN)}
        logged = (tmp_path / "hosts.log").read_text().split("\n")
        assert sorted(filter(None, logged)) == ["power_off g1", "status g2"]
    finally:
        backend.close()


def test_a_broken_group_fails_only_its_own_nodes(tmp_path):
    backend = grouped(tmp_path, [
        {"nodes": "n1", "backend": {"type": "simulated"}},
        {"nodes": "r[1-2]", "backend": {"type": "redfish-next"}}])
    try:
        results = backend.request(P_ON, ["n1", "r1"], 0.0)
        assert results["n1"].ok
        assert not results["r1"].ok
        assert results["r1"].diag.startswith("node group r[1-2]: power backend 'redfish-next' "
                                             "is not available")
        assert backend.status(["r2"], 0.0) == {"r2": HostPower(UNKNOWN)}
    finally:
        backend.close()


@pytest.mark.parametrize("groups,fragment", [
    ([{"nodes": "n[1-4]", "backend": {"type": "simulated"}},
      {"nodes": "n[4-6]", "backend": {"type": "simulated"}}],
     "groups[1].nodes names n4, already in groups[0]"),
    ([{"nodes": "n1", "backend": {"type": "groups", "groups": []}}],
     "groups[0].backend.type must name a backend other than 'groups'"),
    ([{"nodes": "n[1-", "backend": {"type": "simulated"}}], "groups[0].nodes: bad hostlist"),
    ([], "option groups must be a non-empty list"),
])
def test_bad_groups_are_refused(tmp_path, groups, fragment):
    with pytest.raises(BackendError) as err:
        grouped(tmp_path, groups)
    assert fragment in str(err.value)


# -- the hook config ------------------------------------------------------------------
def problems(doc):
    with pytest.raises(ConfigError) as err:
        parse_config(doc)
    return {p.path: p.message for p in err.value.problems}


GROUPS = {"type": "groups", "groups": [
    {"nodes": "node[001-032]", "backend": {"type": "simulated", "boot_seconds": "120"}},
    {"nodes": ["gpu01", "gpu[02-04]"], "backend": {"type": "command",
                                                   "argv": ["/usr/sbin/capmc-wrap"]}}]}


def test_a_single_backend_config_is_unchanged():
    config = parse_config({"power_backend": {"type": "simulated", "boot_seconds": 10}})
    assert config.power_backend == BackendConfig("simulated", {"boot_seconds": 10})
    assert parse_config({}).power_backend == BackendConfig()


def test_groups_config_loads_normalized_and_round_trips():
    config = parse_config({"power_backend": GROUPS})
    assert config.power_backend.type == "groups"
    assert config.power_backend.options["groups"] == [
        {"nodes": "node[001-032]", "backend": {"type": "simulated", "boot_seconds": 120}},
        {"nodes": "gpu[01-04]", "backend": {"type": "command",
                                            "argv": ["/usr/sbin/capmc-wrap"]}}]
    shown = config_to_dict(config)["power_backend"]
    assert shown["groups"][1]["backend"] == {"type": "command", "timeout_seconds": 60,
                                             "max_workers": 16,
                                             "argv": ["/usr/sbin/capmc-wrap"]}
    again = parse_config(json.loads(json.dumps(config_to_dict(config))))
    assert config_to_dict(again) == config_to_dict(config)


@pytest.mark.parametrize("backend,path,message", [
    ({"type": "groups", "groups": [{"nodes": "n[1-4]", "backend": {"type": "simulated"}},
                                   {"nodes": "n[3-9]", "backend": {"type": "simulated"}}]},
     "power_backend.groups[1].nodes",
     "power_backend.groups[1].nodes names n[3-4], already in power_backend.groups[0].nodes: "
     "a node may be in one group only"),
    ({"type": "groups", "groups": [{"nodes": "n1", "backend": {"type": "bmc"}}]},
     "power_backend.groups[0].backend.type",
     "power_backend.groups[0].backend.type 'bmc' is not a known backend type "
     "(available: simulated, command"),
    ({"type": "groups", "groups": [{"nodes": "n1", "backend": {"type": "groups",
                                                                "groups": [{}]}}]},
     "power_backend.groups[0].backend.type",
     "power_backend.groups[0].backend.type cannot be 'groups': node groups do not nest"),
    ({"type": "groups", "groups": [{"nodes": "n1", "backend": {"boot_seconds": 5}}]},
     "power_backend.groups[0].backend", "power_backend.groups[0].backend needs the key 'type'"),
    ({"type": "groups", "groups": [{"nodes": "n1", "backend": {"type": "command"}}]},
     "power_backend.groups[0].backend", "power_backend.groups[0].backend needs the key 'argv'"),
    ({"type": "groups", "groups": [{"nodes": "n1", "backend": {
        "type": "simulated", "boot_jitter_seconds": 400}}]},
     "power_backend.groups[0].backend.boot_jitter_seconds",
     "power_backend.groups[0].backend.boot_jitter_seconds (400) must not exceed "
     "power_backend.groups[0].backend.boot_seconds (300, the default)"),
    ({"type": "groups", "groups": [{"nodes": "", "backend": {"type": "simulated"}}]},
     "power_backend.groups[0].nodes", "power_backend.groups[0].nodes must name at least one"),
    ({"type": "groups", "groups": [{"nodes": "n1", "backend": {"type": "simulated"},
                                    "options": {}}]},
     "power_backend.groups[0].options", "unknown key 'options' in power_backend.groups[0]"),
    ({"type": "groups"}, "power_backend", "power_backend needs the key 'groups'"),
    ({"type": "groups", "groups": []}, "power_backend.groups",
     "power_backend.groups must not be empty"),
    ({"type": "command", "argv": "capmc power_on"}, "power_backend.argv",
     "power_backend.argv must be a list of strings (the program and its arguments; no shell)"),
    ({"type": "command", "argv": ["capmc"], "timeout_seconds": "soon"},
     "power_backend.timeout_seconds", "wants seconds as a number or a numeric string"),
    ({"type": "nvml"}, "power_backend.type",
     "power_backend.type 'nvml' names a device backend (power caps), not a power backend"),
])
def test_bad_backend_configs_name_their_key(backend, path, message):
    found = problems({"power_backend": backend})
    assert path in found, found
    assert message in found[path]


@pytest.mark.parametrize("options,path,message", [
    ({"foo": {}}, "job_policies.device_options.foo",
     "job_policies.device_options.foo: 'foo' is not a device backend type"),
    ({"bmc2": {"type": "redfsh"}}, "job_policies.device_options.bmc2.type",
     "(did you mean 'redfish'?)"),
    ({"simulated": {"type": "command"}}, "job_policies.device_options.simulated.type",
     "must be 'simulated': the key 'simulated' is a backend type"),
    ({"command": {"argv": "ssh gpu01"}}, "job_policies.device_options.command.argv",
     "must be a list of strings"),
    ({"agent": {"type": "command"}}, "job_policies.device_options.agent",
     "job_policies.device_options.agent needs the key 'argv'"),
    ({"nvml": {"out_of_range": "wrap"}}, "job_policies.device_options.nvml.out_of_range",
     "must be one of 'clamp', 'refuse'"),
    ({"simulated": {"latency": 5}}, "job_policies.device_options.simulated.latency",
     "(did you mean 'latency_ms'?)"),
])
def test_bad_device_options_name_their_key(options, path, message):
    found = problems({"job_policies": {"device_options": options}})
    assert path in found, found
    assert message in found[path]


def test_config_validate_accepts_groups_and_reports_key_paths(tmp_path, capsys):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"power_backend": GROUPS, "job_policies": {"device_options": {
        "gpu-agent": {"type": "command", "argv": ["ssh", "{host}", "pbs-power", "node",
                                                  "gpu-caps", "{operation}"]}}}}))
    assert main(["config", "validate", str(good)]) == 0
    assert capsys.readouterr().out.strip() == "%s: OK" % good
    bad = tmp_path / "bad.json"
    doc = json.loads(json.dumps(GROUPS))
    doc["groups"][1]["nodes"] = "node032"
    bad.write_text(json.dumps({"power_backend": doc}))
    assert main(["config", "validate", str(bad)]) == 2
    assert capsys.readouterr().err.strip() == (
        "%s: power_backend.groups[1].nodes names node032, already in "
        "power_backend.groups[0].nodes: a node may be in one group only" % bad)


# -- device backends for the resource-group service ----------------------------------
def test_device_backends_are_built_only_when_configured():
    built = build_device_backends({"max_workers": 4})
    assert list(built) == ["simulated"] and isinstance(built["simulated"], SimulatedDevices)
    built = build_device_backends({"simulated": {"latency_ms": 1},
                                   "agent": {"type": "command", "argv": ["true"]}})
    assert sorted(built) == ["agent", "simulated"] and isinstance(built["agent"], CommandDevices)
    assert built["simulated"].latency_ms == 1
    with pytest.raises(BackendError, match="no device backend type 'bmc'"):
        build_device_backends({"x": {"type": "bmc"}})
    with pytest.raises(BackendError, match="device options 'agent': device backend 'command'"):
        build_device_backends({"agent": {"type": "command", "argv": []}})


def test_device_backend_classes_are_found_by_name(monkeypatch):
    import types
    from pbs_power import devices
    from pbs_power.devices.controller import DeviceBackend
    module = types.ModuleType("pbs_power_test_fake_bmc")

    class FakeBmc(DeviceBackend):
        name = "fakebmc"

        def handle(self, request):
            raise NotImplementedError

    module.FakeBmc = FakeBmc
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(devices.DEVICE_BACKENDS, "fakebmc", (module.__name__, ""))
    monkeypatch.setitem(devices.DEVICE_BACKENDS, "gone", ("pbs_power.devices.gone_xyz", ""))
    assert device_backend_class("fakebmc") is FakeBmc
    with pytest.raises(BackendError, match="device backend 'gone' is not available"):
        device_backend_class("gone")


TOPOLOGY = {
    "name": "mixed",
    "device_specs": {
        "sim-box": {"node": {"min_watts": 200, "idle_watts": 300, "max_watts": 1000}},
        "agent-box": {"node": {"min_watts": 200, "idle_watts": 300, "max_watts": 1000}, "backend": "gpu-agent",
                      "gpu": {"count": 2, "min_watts": 100, "max_watts": 400}}},
    "power_domains": [{"name": "feed", "budget_watts": 100000}],
    "policies": [{"name": "Low", "limits": [{"element_type": "NODE",
                                             "power_limit": {"watts": 500}}]}],
    "default_policy": "Low",
    "entities": [{"names": "c[1-2]", "device": "sim-box", "domain": "feed"},
                 {"names": "g[1-2]", "device": "agent-box", "domain": "feed"}],
}

AGENT = """
import json, os, sys
kind, device = sys.argv[-2], sys.argv[-1]
req = json.load(sys.stdin)
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent.log"), "a") as f:
    f.write("%s %s\\n" % (kind, device))
print(json.dumps({"success": True, "power_cap_watts": 500.0,
                  "device_state_json": json.dumps({"agent": kind})}))
"""


def test_resource_group_service_routes_each_node_group_to_its_backend(tmp_path):
    from pbs_power.groups.service import ResourceGroupService
    from pbs_power.groups.topology import parse_topology
    agent = tmp_path / "agent.py"
    agent.write_text(textwrap.dedent(AGENT))
    options = {"simulated": {"latency_ms": 0},
               "gpu-agent": {"type": "command", "argv": [sys.executable, str(agent)]}}
    svc = ResourceGroupService(str(tmp_path / "state"), options)
    try:
        assert svc.import_topology(parse_topology(TOPOLOGY)).ok
        response = svc.set_topology_active(True)
        assert response.status.ok, response.status.diag_msg
        logged = sorted((tmp_path / "agent.log").read_text().split())
        assert logged == ["g1", "g2", "topology_activate", "topology_activate"]
        assert json.loads(svc.store.get_device_state("g1")) == {"agent": "topology_activate"}
        assert json.loads(svc.store.get_device_state("c1"))["node_cap_watts"] == 500
    finally:
        svc.close()
