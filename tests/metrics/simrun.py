"""A small simulated run that fills a state directory the way the hooks would.

Six hosts under the real periodic `Cycle` with the simulated power backend
and a real SQLite store: idle hosts go down (max_concurrent_nodes holds two
back at first), a job arrives and wakes two of them, n1 never comes back up
(boot_timeout: failed), then two resource groups go through their lifecycle
on simulated devices (one activation, one deactivation, one device failing).
"""
from dataclasses import dataclass, field
from typing import Dict, List

from pbs_power.config.hook_config import BackendConfig, HookConfig, NodePower
from pbs_power.devices import get_backend
from pbs_power.groups.service import ResourceGroupService
from pbs_power.groups.topology import parse_topology
from pbs_power.sim.cluster import SimCluster
from pbs_power.sim.workload import SimJob
from pbs_power.states.cycle import Cycle
from pbs_power.states.store import Store

HOSTS = ["n1", "n2", "n3", "n4", "n5", "n6"]
POWER = NodePower(busy_watts=450.0, idle_watts=250.0, sleep_watts=90.0, off_watts=10.0)
TOPOLOGY = {
    "name": "obs",
    "device_specs": {"box": {"node": {"min_watts": 200, "idle_watts": 300, "max_watts": 1000}}},
    "power_domains": [{"name": "feed", "budget_watts": 10000, "children": [
        {"name": "rack-a", "budget_watts": 3000}, {"name": "rack-b", "budget_watts": 3000}]}],
    "policies": [{"name": n, "limits": [{"element_type": "NODE", "power_limit": {"watts": w}}]}
                 for n, w in [("High", 1000), ("Med", 700), ("Low", 500)]],
    "default_policy": "Low",
    "entities": [{"names": "a[1-4]", "device": "box", "domain": "rack-a"},
                 {"names": "b[1-4]", "device": "box", "domain": "rack-b"}],
}


@dataclass
class SimRun:
    state_dir: str
    t0: float
    end: float = 0.0
    cycles: int = 0
    reports: List = field(default_factory=list)
    logs: List = field(default_factory=list)
    cluster: object = None


def config(state_dir: str) -> HookConfig:
    return HookConfig(
        power_on_off_enable=True, node_idle_limit=1800, min_node_down_delay=0,
        max_concurrent_nodes=4, node_boot_time=300, boot_timeout=600, shutdown_timeout=300,
        cycle_interval=300, node_power=POWER, state_dir=state_dir,
        power_backend=BackendConfig("simulated", {"boot_seconds": 200, "shutdown_seconds": 30,
                                                  "fail_nodes": "n1"}))


def run_cycles(state_dir: str, t0: float, cycles: int = 14) -> SimRun:
    """``cycles`` passes, 300 s apart from ``t0``; a 2-host job arrives at t0 + 1800."""
    cfg = config(state_dir)
    out = SimRun(state_dir, t0, cycles=cycles)
    with Store.open(state_dir) as store, get_backend(cfg.power_backend, state_dir) as backend:
        cycle = Cycle(cfg, store, backend, lambda lvl, msg: out.logs.append((lvl, msg)))
        cluster = SimCluster(HOSTS, POWER, backend, t0 - 7200)
        out.cluster = cluster
        for i in range(cycles):
            now = t0 + 300 * i
            arrivals = [SimJob("42.sim", now, 2, 1200, 1800)] if i == 6 else []
            cluster.step(now, arrivals)
            report = cycle.run(cluster.snapshot(now), now)
            cluster.apply(report.marks, now)
            cluster.step(now, [])
            out.reports.append(report)
            out.end = now
    return out


def run_groups(state_dir: str) -> Dict[str, bool]:
    """rg_1 activated and kept, rg_2 activated then deactivated, rg_3 with a failing device."""
    setup = ResourceGroupService(state_dir, {"simulated": {"latency_ms": 0}})
    assert setup.import_topology(parse_topology(TOPOLOGY)).ok
    assert setup.set_topology_active(True).status.ok
    setup.close()
    svc = ResourceGroupService(state_dir, {"simulated": {"latency_ms": 0, "fail_devices": "b4"}})
    results = {}
    for name, hosts, policy in (("rg_1", ["a1", "a2"], "High"), ("rg_2", ["b1"], "Med"),
                                ("rg_3", ["b3", "b4"], "Med")):
        assert svc.create(name, 1, policy).status.ok
        assert svc.add_resources(name, hosts).status.ok
        results[name] = svc.activate(name).status.ok
    results["rg_2 deactivated"] = svc.deactivate("rg_2").status.ok
    svc.close()
    return results
