"""A small topology and hook config for the Slurm prolog/epilog tests.

Nodes node1..node4 (the test cluster's names) on one rack whose budget
(2600 W) fits every node at the default policy Node-Med (600 W) but not two
at Node-High (1000 W) next to two at Node-Low (400 W): a two-node job asking
for Node-High falls back, or fails under ``strict``. The device backend is
the SIMULATED one (no hardware): activation goes through the real service
and device controller, and each node's cap ends up in the state database.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

from pbs_power.groups.service import ResourceGroupService
from pbs_power.groups.topology import parse_topology

TOPOLOGY: Dict[str, Any] = {
    "name": "slurm-test",
    "device_specs": {"cpu-node": {
        "type": "ComputerSystem", "model": "simulated CPU node",
        "node": {"min_watts": 200, "idle_watts": 250, "max_watts": 1000},
        "backend": "simulated"}},
    "power_domains": [{"name": "rack-1", "kind": "rack", "budget_watts": 2600}],
    "policies": [
        {"name": "Node-High", "limits": [{"element_type": "NODE", "power_limit": {"watts": 1000}}]},
        {"name": "Node-Med", "limits": [{"element_type": "NODE", "power_limit": {"watts": 600}}]},
        {"name": "Node-Low", "limits": [{"element_type": "NODE", "power_limit": {"watts": 400}}]},
        {"name": "Node-Min", "limits": [{"element_type": "NODE", "power_limit": {"watts": 250}}]},
    ],
    "default_policy": "Node-Med",
    "entities": [{"names": "node[1-4]", "device": "cpu-node", "domain": "rack-1"}],
}
FAST_DEVICES = {"simulated": {"latency_ms": 0}}


def make_state(state_dir: Path) -> None:
    """Import TOPOLOGY into ``state_dir`` and activate it (every node gets Node-Med)."""
    service = ResourceGroupService(str(state_dir), FAST_DEVICES)
    try:
        assert service.import_topology(parse_topology(TOPOLOGY)).ok
        assert service.set_topology_active(True).status.ok
    finally:
        service.close()


def write_config(path: Path, state_dir: Path, log_file: Path, **job_policies: Any) -> Path:
    """A hook config for the prolog/epilog: state, log file, job policies."""
    policies = dict({"device_options": FAST_DEVICES}, **job_policies)
    path.write_text(json.dumps({"state_dir": str(state_dir), "slurm_log_file": str(log_file),
                                "job_policies": policies}, indent=1))
    return path


def node_caps(state_dir: Path) -> Dict[str, Any]:
    """node -> (policy, node_cap_watts) as the simulated devices hold them."""
    service = ResourceGroupService(str(state_dir), FAST_DEVICES)
    try:
        states = service.store.get_device_states(["node%d" % i for i in range(1, 5)])
    finally:
        service.close()
    out = {}
    for node, text in states.items():
        doc = json.loads(text)
        out[node] = (doc.get("policy"), doc.get("node_cap_watts"))
    return out


def groups(state_dir: Path) -> Dict[str, Any]:
    """group name -> (status, external id, {node: applied policy})."""
    service = ResourceGroupService(str(state_dir), FAST_DEVICES)
    try:
        return {g.group_name: (g.activation_status, g.external_id,
                               {p.resource_name: p.applied_policy_name
                                for p in g.resource_policies})
                for g in service.list().resource_groups}
    finally:
        service.close()


LAUNCHER = r"""
import os, signal, sys, time
prog = sys.argv[1]
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGHUP, signal.SIGINT, signal.SIGTERM,
                                          signal.SIGPIPE, signal.SIGALRM, signal.SIGUSR1])
start = time.monotonic()
pid = os.fork()
if pid == 0:
    for fd in (0, 1, 2):
        os.close(fd)
    os.execve(prog, [prog], {k: v for k, v in os.environ.items() if k != "PATH"})
_, status = os.waitpid(pid, 0)
with open(sys.argv[2], "w") as out:
    rc = os.WEXITSTATUS(status) if os.WIFEXITED(status) else -os.WTERMSIG(status)
    out.write("%d %f" % (rc, time.monotonic() - start))
"""


def run_like_slurmctld(program: str, env):
    """(exit status, wall seconds) of ``program`` started with fds 0-2 closed, no PATH."""
    result = Path(env["PBS_POWER_CONFIG"]).parent / "launch.out"
    subprocess.run([sys.executable, "-c", LAUNCHER, program, str(result)],
                   env=dict(env, PATH=os.environ.get("PATH", "")), check=True, timeout=120)
    rc, seconds = result.read_text().split()
    return int(rc), float(seconds)
