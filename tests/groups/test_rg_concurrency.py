"""Many prologs and epilogs at once, as real processes, against one state directory."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pbs_power.groups.service import ResourceGroupService
from pbs_power.groups.topology import parse_topology

STRESS = Path(__file__).parent / "rg_stress.py"
TOPOLOGY = {
    "name": "stress",
    "device_specs": {"box": {"node": {"min_watts": 200, "idle_watts": 300, "max_watts": 1000}}},
    "power_domains": [{"name": "room", "budget_watts": 76000, "children": [
        {"name": "rack-1", "budget_watts": 33500}, {"name": "rack-2", "budget_watts": 33500}]}],
    "policies": [{"name": n, "limits": [{"element_type": "NODE", "power_limit": {"watts": w}}]}
                 for n, w in (("High", 1000), ("Med", 700), ("Low", 500))],
    "default_policy": "Low",
    "entities": [{"names": "n[001-064]", "device": "box", "domain": "rack-1"},
                 {"names": "n[065-128]", "device": "box", "domain": "rack-2"}],
}


def setup(tmp_path):
    svc = ResourceGroupService(str(tmp_path), {"simulated": {"latency_ms": 0}})
    assert svc.import_topology(parse_topology(TOPOLOGY)).ok
    assert svc.set_topology_active(True).status.ok
    return svc


def run(*args):
    return subprocess.Popen([sys.executable, str(STRESS)] + [str(a) for a in args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_32_processes_x_20_lifecycles_keep_every_invariant(tmp_path):
    svc = setup(tmp_path)
    checker = run("checker", tmp_path, 15)
    workers = [run("worker", tmp_path, seed, 20) for seed in range(32)]
    totals = {"activated": 0, "busy_entity": 0, "budget": 0}
    for w in workers:
        out, err = w.communicate(timeout=600)
        assert w.returncode == 0, err[-2000:]
        for k, v in json.loads(out.strip().splitlines()[-1]).items():
            totals[k] += v
    out, err = checker.communicate(timeout=120)
    assert checker.returncode == 0, err[-2000:]
    sampled = json.loads(out.strip().splitlines()[-1])
    print("outcomes", totals, "checker", sampled)
    assert sum(totals.values()) == 32 * 20
    assert totals["activated"] > 0 and sampled["samples"] > 10
    assert sampled["violations"] == 0
    assert svc.list().resource_groups == []
    assert svc.store._rows("SELECT COUNT(*) FROM members") == [(0,)]
    assert svc.store._rows("SELECT COUNT(*) FROM operations") == [(0,)]
    svc.close()


def test_process_killed_mid_activation_is_repaired(tmp_path):
    svc = setup(tmp_path)
    assert svc.create("rg_k", 1, "High").status.ok
    assert svc.add_resources("rg_k", ["n001", "n002"]).status.ok
    victim = run("activate", tmp_path, "rg_k")
    assert victim.stdout.readline().strip() == "started"
    deadline = time.time() + 20
    while sorted(svc.store.ledger_rows()) != [("n001", 1000.0, "Low", 1000.0, victim.pid),
                                              ("n002", 1000.0, "Low", 1000.0, victim.pid)]:
        assert time.time() < deadline                         # reserved once each, unconfirmed
        time.sleep(0.05)
    assert svc.store.group("rg_k").status == "activating"
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    listed = svc.list().resource_groups[0]
    assert listed.activation_status == "activating"          # reported as it is
    r = svc.activate("rg_k")                                  # the next call repairs
    assert r.status.ok, r.status
    assert "interrupted" in svc.list().resource_groups[0].diag
    assert svc.delete("rg_k").status.ok and svc.store.allocations() == {}
    assert svc.store.ledger_rows() == []                      # confirmed back at Low
    svc.close()
