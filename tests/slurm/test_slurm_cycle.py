"""`pbs-power slurm install`, `check` and `cycle` on real Slurm clusters (22.05, 24.11).

The cluster's slurm.conf takes its programs, timeouts and rates from the
lines `pbs-power slurm install --program-dir` prints (the wrappers it writes
name the hook config, so slurmctld needs no environment). The cycle reads
Slurm through the CLI client and acts only through `scontrol update
state=power_up|power_down`; slurmctld then runs our Resume/SuspendProgram,
which powers the emulated nodes through the `command` backend.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from pbs_power.states.store import Store
from slurm_cluster import SlurmCluster, requires_slurm

pytestmark = [pytest.mark.slurm, requires_slurm]


def install_lines(install, config: Path, program_dir: Path) -> dict:
    """slurm.conf settings printed by `pbs-power slurm install` (run where Slurm runs)."""
    argv = install.argv([str(install.program_bin / "pbs-power"), "slurm", "install",
                         "--config", str(config), "--program-dir", str(program_dir)])
    out = subprocess.run(argv, stdout=subprocess.PIPE, universal_newlines=True, timeout=60,
                         check=True).stdout
    conf = out.split("# --- plugstack.conf")[0]
    return dict(line.split("=", 1) for line in conf.splitlines()
                if line and not line.startswith("#"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, slurm_install):
    base = tmp_path_factory.mktemp("slurm-cycle")
    site = SlurmCluster(base / "cluster").power_site_cmd     # where start() will write it
    doc = {"power_on_off_enable": True, "max_concurrent_nodes": 2, "node_idle_limit": 300,
           "min_node_down_delay": 0, "node_boot_time": 10, "boot_timeout": 60,
           "shutdown_timeout": 6, "cycle_interval": 120, "exclude_nodes": "node1",
           "state_dir": str(base / "pbs-state"), "slurm_log_file": str(base / "pbs_power.log"),
           "power_backend": {"type": "command", "argv": [str(site)],
                             "timeout_seconds": 60}}
    config = base / "hook.json"
    config.write_text(json.dumps(doc))
    conf = install_lines(slurm_install, config, base / "programs")
    assert conf["SuspendExcNodes"] == "node1" and conf["ResumeRate"] == "2"
    c = SlurmCluster(base / "cluster", num_nodes=3,
                     suspend_program=conf["SuspendProgram"], resume_program=conf["ResumeProgram"],
                     resume_fail_program=conf["ResumeFailProgram"],
                     prolog_slurmctld=conf["PrologSlurmctld"],
                     epilog_slurmctld=conf["EpilogSlurmctld"],
                     suspend_time=int(conf["SuspendTime"]),
                     suspend_timeout=int(conf["SuspendTimeout"]),
                     resume_timeout=int(conf["ResumeTimeout"]),
                     suspend_rate=int(conf["SuspendRate"]), resume_rate=int(conf["ResumeRate"]),
                     install=slurm_install)
    c.hook_config, c.doc, c.base = config, doc, base
    c.start()
    yield c
    c.stop()


def cycle(cluster, *extra: str, config: Path = None) -> subprocess.CompletedProcess:
    return cluster.run(str(cluster.install.program_bin / "pbs-power"), "slurm", "cycle",
                       "--client", "cli",
                       "--config", str(config or cluster.hook_config), *extra, timeout=120)


def store(cluster) -> Store:
    return Store.open(str(cluster.base / "pbs-state"))


def durations(cluster, host: str, kind: str) -> tuple:
    with store(cluster) as s:
        return s.durations(host, kind)


def eventually(check, timeout: float = 30) -> bool:
    """True once ``check()`` holds (the programs record a moment after Slurm shows it)."""
    deadline = time.time() + timeout
    while not check():
        if time.time() > deadline:
            return False
        time.sleep(0.5)
    return True


def pending_start(cluster, job: int) -> float:
    out = cluster.run("squeue", "-h", "-j", str(job), "-o", "%T %S").stdout.split()
    if out and out[0] == "PENDING" and out[1] not in ("N/A", "Unknown"):
        return time.mktime(time.strptime(out[1], "%Y-%m-%dT%H:%M:%S"))
    return 0.0


def test_install_wrappers_powered_nodes_down_at_start(cluster):
    # The harness's power_down at start went through the installed SuspendProgram wrapper.
    assert cluster.node_states() == {"node1": "idle", "node2": "idle~", "node3": "idle~"}
    with store(cluster) as s:
        assert set(s.down_since()) == {"node2", "node3"}


def test_cycle_wakes_a_node_ahead_of_a_queued_job(cluster):
    blocker = cluster.sbatch("-w", "node1", "-t", "1", script="#!/bin/sh\nsleep 300\n")
    cluster.wait_job(blocker, ("RUNNING",), timeout=60)
    job = cluster.sbatch("-N", "2", "-w", "node[1-2]", "-t", "1", script="#!/bin/sh\nsleep 1\n")
    deadline = time.time() + 60
    while time.time() < deadline and not pending_start(cluster, job):
        time.sleep(1)
    start = pending_start(cluster, job)
    assert start > time.time() + 10, "backfill gave no start estimate in the future"
    far = cluster.sbatch("-w", "node3", "--begin", "now+1hour", script="#!/bin/sh\nsleep 1\n")

    out = cycle(cluster)
    assert "node2: state=power_up requested from Slurm (job %d needs it at" % job in out.stderr
    assert "node3" not in out.stderr
    # up and idle ("planned": backfill holds it for the job), before the job starts
    cluster.wait_nodes(lambda s: s["node2"] in ("idle", "planned"), timeout=90)
    assert cluster.job_state(job) == "PENDING"
    assert cluster.node_states()["node3"] == "idle~"
    assert eventually(lambda: len(durations(cluster, "node2", "power_on")) == 1)
    cluster.run("scancel", str(blocker), str(job), str(far))


def test_cycle_powers_down_idle_node_through_slurm(cluster):
    cluster.wait_nodes(lambda s: s["node2"] == "idle", timeout=60)
    quick = cluster.base / "hook-idle5.json"
    quick.write_text(json.dumps(dict(cluster.doc, node_idle_limit=5)))
    time.sleep(6)
    dry = cycle(cluster, "--dry-run", config=quick)
    assert "node2: would set state=power_down (idle for" in dry.stderr
    assert cluster.node_states()["node2"] == "idle"
    out = cycle(cluster, config=quick)
    assert "node2: state=power_down requested from Slurm (idle for" in out.stderr
    assert "node1" not in out.stderr                     # excluded, never powered down
    cluster.wait_nodes(lambda s: s["node2"] == "idle~", timeout=60)
    deadline = time.time() + 30
    while time.time() < deadline and cluster.slurmd_pid("node2"):
        time.sleep(0.5)
    assert cluster.slurmd_pid("node2") is None
    assert eventually(lambda: len(durations(cluster, "node2", "power_off")) == 2)  # start, now
    with store(cluster) as s:
        assert s.transitions() == ()


def test_check_says_which_command_reads_the_nodes(cluster):
    out = cluster.run(str(cluster.install.program_bin / "pbs-power"), "slurm", "check").stdout
    lines = out.splitlines()
    source = "scontrol --json show node" if cluster.install.version_at_least(23, 2) \
        else "sinfo --json"
    assert lines[0].startswith("Slurm %s." % cluster.install.version)
    assert lines[0].endswith("; nodes read with %s" % source)
    assert "pyslurm not used: pyslurm is not installed" in lines
    assert "nodes: 3 (cli)" in lines
    assert "power settings: ResumeTimeout=%d SuspendTimeout=%d SuspendExcNodes=node1 " \
           "SuspendExcParts=- (cli)" % (cluster.resume_timeout, cluster.suspend_timeout) in lines


def test_check_reads_a_reservation_made_on_the_cluster(cluster):
    # a reservation both releases accept (node3 is idle or powered down, no job on it)
    cluster.run("scontrol", "create", "reservation", "reservationname=maint",
                "nodes=node3", "starttime=now+1hour", "duration=60", "users=root",
                "flags=IGNORE_JOBS")
    try:
        out = cluster.run(str(cluster.install.program_bin / "pbs-power"), "slurm", "check",
                          "--client", "cli").stdout
    finally:
        cluster.run("scontrol", "delete", "reservationname=maint")
    assert "reservations: 1 (cli)" in out.splitlines()
