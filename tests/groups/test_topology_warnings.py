"""Topology import says what cannot hold: budgets its own defaults overrun, policies no
device can apply as written."""
from __future__ import annotations

from pbs_power.cli.main import main
from pbs_power.groups.topology import parse_topology


def topology(budget=100, default="Node-Med", med_watts=200):
    return {
        "name": "t",
        "device_specs": {"cpu": {"type": "ComputerSystem", "backend": "simulated",
                                 "node": {"min_watts": 50, "idle_watts": 80,
                                          "max_watts": 250}}},
        "power_domains": [{"name": "rack-a", "kind": "rack", "budget_watts": budget}],
        "policies": [{"name": "Node-Med",
                      "limits": [{"element_type": "NODE",
                                  "power_limit": {"watts": med_watts}}]}],
        "default_policy": default,
        "entities": [{"names": "n[1-16]", "device": "cpu", "domain": "rack-a"}],
    }


def test_a_budget_under_the_defaults_is_named_at_import():
    topo = parse_topology(topology(budget=100))
    assert any("'rack-a' holds 16 entities that draw 3200 W" in w and "budget of 100 W" in w
               for w in topo.warnings)
    assert not parse_topology(topology(budget=3200)).warnings


def test_no_default_policy_counts_nodes_uncapped():
    topo = parse_topology(topology(budget=3500, default=None))
    assert any("4000 W" in w and "none: uncapped" in w for w in topo.warnings)


def test_a_limit_no_device_can_hold_is_named():
    topo = parse_topology(topology(budget=10 ** 6, med_watts=50000))
    assert any("policy 'Node-Med': NODE limit 50000 W is outside every device spec" in w
               for w in topo.warnings)


def test_the_cli_prints_them_on_import(tmp_path, capsys):
    import json
    path = tmp_path / "t.json"
    path.write_text(json.dumps(topology(budget=100)))
    assert main(["topology", "import", "--state-dir", str(tmp_path / "s"), str(path)]) == 0
    assert "over its budget of 100 W" in capsys.readouterr().err


def service(tmp_path, doc, **sim):
    from pbs_power.groups.service import ResourceGroupService
    svc = ResourceGroupService(str(tmp_path), {"simulated": dict({"latency_ms": 0}, **sim)})
    assert svc.import_topology(parse_topology(doc)).ok
    return svc


def test_a_topology_without_a_default_policy_activates_its_nodes_uncapped(tmp_path):
    svc = service(tmp_path, topology(budget=10 ** 6, default=None))
    try:
        r = svc.set_topology_active(True)
        assert r.status.ok, r.status
        assert svc.topology()[1] is True
    finally:
        svc.close()


def test_a_topology_no_device_took_is_not_marked_active(tmp_path):
    svc = service(tmp_path, topology(budget=10 ** 6), fail_devices="n[1-16]")
    try:
        r = svc.set_topology_active(True)
        assert not r.status.ok and "not activated: every device failed" in r.status.diag_msg
        assert svc.topology()[1] is False
    finally:
        svc.close()
