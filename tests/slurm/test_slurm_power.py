"""SuspendProgram / ResumeProgram / ResumeFailProgram on real Slurm clusters (22.05, 24.11).

slurmctld itself runs our console scripts (pbs-power-slurm-suspend/-resume)
with closed fds, no PATH and blocked signals; they power the emulated nodes
through the `command` power backend (the cluster's node-power-site script,
which starts/stops the node's slurmd) and record everything in the state
store. Nothing is simulated but the nodes' hardware: a node "boots" when
its slurmd starts.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from pbs_power.states.store import Store
from slurm_cluster import SlurmCluster, requires_slurm
from test_slurm_power_logic import peak_in_flight

pytestmark = [pytest.mark.slurm, requires_slurm]

MAX_CONCURRENT = 2


def hook_config(path: Path, cluster: SlurmCluster, **extra) -> Path:
    """A hook config powering the cluster's emulated nodes through its site script."""
    doc = {"power_on_off_enable": True, "max_concurrent_nodes": MAX_CONCURRENT,
           "node_boot_time": 5, "boot_timeout": 60, "shutdown_timeout": 30,
           "exclude_nodes": "node1", "state_dir": str(path.parent / "pbs-state"),
           "slurm_log_file": str(path.parent / "pbs_power.log"),
           "power_backend": {"type": "command", "argv": [str(cluster.power_site_cmd)],
                             "timeout_seconds": 60}}
    doc.update(extra)
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, slurm_install):
    base = tmp_path_factory.mktemp("slurm-power")
    programs = slurm_install.program_bin
    c = SlurmCluster(base / "cluster", num_nodes=4, suspend_time=5, resume_timeout=40,
                     suspend_program=str(programs / "pbs-power-slurm-suspend"),
                     resume_program=str(programs / "pbs-power-slurm-resume"),
                     resume_fail_program=str(programs / "pbs-power-slurm-resume-fail"),
                     install=slurm_install)
    config = hook_config(base / "hook.json", c)
    c.program_env = {"PBS_POWER_CONFIG": str(config)}
    c.state_dir = base / "pbs-state"
    c.pbs_log = base / "pbs_power.log"
    c.start()
    yield c
    c.stop()


def log_lines(cluster) -> list:
    return cluster.pbs_log.read_text().splitlines() if cluster.pbs_log.exists() else []


def durations(cluster, host: str, kind: str):
    with Store.open(str(cluster.state_dir)) as store:
        return store.durations(host, kind)


def test_start_powered_nodes_down_through_our_suspend_program(cluster):
    # The harness's `scontrol update state=power_down` at start ran our SuspendProgram.
    assert all(cluster.slurmd_pid(n) is None for n in ("node2", "node3", "node4"))
    calls = cluster.hook_log("suspend")
    assert "argv: node[2-4]" in calls and "SigBlk:0000000000000000" not in calls
    with Store.open(str(cluster.state_dir)) as store:
        assert store.transitions() == ()
        assert set(store.down_since()) == {"node2", "node3", "node4"}
        for node in ("node2", "node3", "node4"):
            assert len(store.durations(node, "power_off")) == 1


def test_job_on_powered_down_nodes_is_resumed_by_our_program_then_suspended(cluster):
    before = time.time()
    job = cluster.sbatch("-N", "2", "-w", "node[2-3]", script="#!/bin/sh\nsleep 2\n")
    assert cluster.wait_job(job, ("COMPLETED",), timeout=120) == "COMPLETED"
    resume_calls = cluster.hook_log("resume")
    assert "argv: node[2-3]" in resume_calls and "SLURM_RESUME_FILE=" in resume_calls
    lines = log_lines(cluster)
    for node in ("node2", "node3"):
        assert any(l.endswith("%s: power_on sent (for job %d)" % (node, job)) for l in lines)
        assert any("%s: power_on done in" % node in l for l in lines)
        boots = durations(cluster, node, "power_on")
        assert len(boots) == 1 and 0 < boots[0] < time.time() - before
    # Idle for SuspendTime: Slurm calls our SuspendProgram, which powers them off.
    cluster.wait_nodes(lambda s: s["node2"] == "idle~" and s["node3"] == "idle~", timeout=90)
    deadline = time.time() + 30
    while time.time() < deadline and (cluster.slurmd_pid("node2") or cluster.slurmd_pid("node3")):
        time.sleep(0.5)
    assert cluster.slurmd_pid("node2") is None and cluster.slurmd_pid("node3") is None
    deadline = time.time() + 30
    while time.time() < deadline and len(durations(cluster, "node2", "power_off")) < 2:
        time.sleep(0.5)
    assert len(durations(cluster, "node2", "power_off")) == 2
    with Store.open(str(cluster.state_dir)) as store:
        assert "node2" in store.down_since() and store.transitions() == ()


def test_resume_of_three_nodes_keeps_max_concurrent_nodes(cluster):
    cluster.wait_nodes(lambda s: all(s[n] == "idle~" for n in ("node2", "node3", "node4")), 90)
    start = len(log_lines(cluster))
    job = cluster.sbatch("-N", "3", "-w", "node[2-4]", script="#!/bin/sh\nsleep 1\n")
    assert cluster.wait_job(job, ("COMPLETED",), timeout=120) == "COMPLETED"
    lines = log_lines(cluster)[start:]
    messages = [line.split(": ", 1)[1].split(" ", 1)[1] for line in lines if ": " in line]
    assert sum(": power_on sent" in m for m in messages) == 3
    assert sum(": power_on done in" in m for m in messages) == 3
    assert peak_in_flight(messages) == MAX_CONCURRENT
    assert any("power_on held back: max_concurrent_nodes=%d" % MAX_CONCURRENT in l for l in lines)


def run_program(cluster, name: str, hostlist: str) -> int:
    """Run one of our programs the way slurmctld does: fds 0-2 closed, only SLURM_CONF."""
    env = {"SLURM_CONF": str(cluster.conf_path)}
    env.update(cluster.program_env)
    argv = cluster.install.argv([str(cluster.install.program_bin / name), hostlist])
    return subprocess.run(argv, env=env, timeout=120,
                          preexec_fn=lambda: [os.close(fd) for fd in (0, 1, 2)]).returncode


def test_suspend_refuses_excluded_node(cluster):
    pid = cluster.slurmd_pid("node1")
    assert run_program(cluster, "pbs-power-slurm-suspend", "node1") == 1
    assert cluster.slurmd_pid("node1") == pid
    assert any(l.endswith("node1: not powered down: listed in exclude_nodes (add it to "
                          "SuspendExcNodes)") for l in log_lines(cluster))


def test_resume_fail_records_failure_powers_off_and_drains(cluster):
    cluster.wait_nodes(lambda s: s["node4"] == "idle~", 90)
    assert run_program(cluster, "pbs-power-slurm-resume-fail", "node4") == 0
    out = cluster.run("scontrol", "show", "node", "-o", "node4").stdout
    assert "DRAIN" in out and "Reason=pbs_power: power_on failed: not usable in Slurm " \
                              "within ResumeTimeout" in out
    with Store.open(str(cluster.state_dir)) as store:
        assert "node4" in store.failed()
    cluster.run("scontrol", "update", "nodename=node4", "state=resume")


def test_node_that_never_comes_up_fails_at_resume_timeout_by_slurmctld(cluster):
    # node3's BMC takes the power-on but its OS never boots. Nothing here calls
    # our ResumeFailProgram: slurmctld does, once ResumeTimeout (40 s) expires.
    cluster.wait_nodes(lambda s: s["node3"] == "idle~", 90)
    fail_calls = cluster.hook_log("resume_fail").count("=== ")
    cluster.never_boots("node3")
    job = None
    try:
        job = cluster.sbatch("-w", "node3", script="#!/bin/sh\ntrue\n")
        want = "node3: power_on failed: not usable in Slurm within ResumeTimeout; powered off, " \
               "drained; not retried until an admin runs 'scontrol update nodename=node3 " \
               "state=resume'"
        deadline = time.time() + 120
        while time.time() < deadline and not any(l.endswith(want) for l in log_lines(cluster)):
            time.sleep(1)
        lines = log_lines(cluster)
        assert any(l.endswith(want) for l in lines), "\n".join(lines[-20:])
        calls = cluster.hook_log("resume_fail").split("=== ")[1:]
        assert len(calls) == fail_calls + 1 and "argv: node3" in calls[-1]
        assert any(l.endswith("node3: power_on sent (for job %d)" % job) for l in lines)
        assert any(l.endswith("node3: power_on still in progress at this run's deadline; "
                              "left recorded") for l in lines)
        out = cluster.run("scontrol", "show", "node", "-o", "node3").stdout
        assert "DRAIN" in out and "Reason=pbs_power: power_on failed" in out
        with Store.open(str(cluster.state_dir)) as store:
            assert "node3" in store.failed()
            assert all(t.host != "node3" for t in store.transitions())
        assert "State=DOWN+DRAIN+POWERED_DOWN" in out
        assert cluster.job_state(job) == "PENDING"        # Slurm requeued it
    finally:
        cluster.never_boots("node3", False)
        if job is not None:
            cluster.run("scancel", str(job), check=False)
        cluster.run("scontrol", "update", "nodename=node3", "state=resume", check=False)
