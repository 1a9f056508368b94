"""Job power policies on real Slurm clusters (22.05, 24.11): our prolog, epilog, SPANK plugin.

slurmctld runs the installed ``pbs-power-slurm-prolog`` / ``-epilog`` (fds
0-2 closed, no PATH, signals blocked); the SPANK plugin is built from
slurm_spank/ into a tmp dir and listed in plugstack.conf. The topology's
devices are SIMULATED (tests/slurm/slurm_jobs_setup.py): activation is the real
service's, only the hardware is not. The state database is read back with
``pbs-power resource-group list --json``.
"""
from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pbs_power.config.hook_config import load_config
from pbs_power.groups.service import ResourceGroupService
from pbs_power.slurm.install import plan_install, write_wrappers
from slurm_cluster import SlurmCluster, requires_slurm
from slurm_jobs_setup import FAST_DEVICES, make_state, node_caps, write_config

pytestmark = [pytest.mark.slurm, requires_slurm]

BIN = Path(sys.executable).parent
#: The signals slurmctld blocks in the programs it runs (/proc's SigBlk), as measured.
BLOCKED_SIGNALS = {"22.05": "0000000000887a27",   # HUP INT QUIT ABRT USR1 USR2 PIPE ALRM TERM ...
                   "24.11": "0000000000000002"}   # INT only
HOLD = "#!/bin/sh\ni=0\nwhile [ ! -e %s ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done\n"
TIME_IN_LINE = re.compile(r"job (\d+) (prolog|epilog): .* \((\d+\.\d+) s\)$")


class Site:
    """The cluster plus our state dir, hook config and log, for one test module."""

    def __init__(self, base: Path, install):
        self.base = base
        self.state = base / "state"
        self.log = base / "pbs_power-slurm.log"
        self.config = base / "hook.json"
        self.generation = 0  # per test: a release left by one test never frees the next one's jobs
        make_state(self.state)
        self.set_policies()
        plugin_dir = base / "plugin"
        plugin_dir.mkdir()
        # built where Slurm runs, against that Slurm's <slurm/spank.h>
        subprocess.run(install.argv(["make", "-s", "-C", str(install.repo / "slurm_spank"),
                                     "OUT=%s" % plugin_dir, "CFLAGS=-O2 -Werror"]),
                       check=True, timeout=120, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        # the programs as a site gets them: the wrappers `slurm install --program-dir`
        # writes (they set only PBS_POWER_CONFIG), run with what slurmctld gives them
        plan = plan_install(load_config(str(self.config)), str(self.config),
                            bin_dir=str(install.program_bin), program_dir=str(base / "programs"))
        write_wrappers(plan)
        programs = dict(line.split("=", 1) for line in plan.slurm_conf if "=" in line)
        self.cluster = SlurmCluster(
            base / "cluster", num_nodes=4, power_down_at_start=False, suspend_time=3600,
            cred_expire=5, prolog_slurmctld=programs["PrologSlurmctld"],
            epilog_slurmctld=programs["EpilogSlurmctld"],
            plugstack_lines=["optional %s" % (plugin_dir / "power_policy.so")],
            extra_conf=["PartitionName=gpu Nodes=node[3-4] MaxTime=INFINITE State=UP"],
            install=install)

    def set_policies(self, **job_policies) -> None:
        """Rewrite the hook config's job_policies (read by every prolog run)."""
        job_policies.setdefault("partition_defaults", {"gpu": "Node-High"})
        write_config(self.config, self.state, self.log, **job_policies)

    def hold(self, name: str) -> str:
        """A job script that runs until ``release(name)`` in the same test."""
        return HOLD % self.release_file(name)

    def release(self, name: str) -> None:
        self.release_file(name).write_text("")

    def release_file(self, name: str) -> Path:
        return self.base / ("release-%d-%s" % (self.generation, name))

    def groups(self):
        """name -> (status, external id, {node: applied policy}), through the CLI."""
        out = subprocess.run([str(BIN / "pbs-power"), "resource-group", "list", "--json",
                              "--state-dir", str(self.state)], check=True, timeout=60,
                             stdout=subprocess.PIPE, universal_newlines=True).stdout
        return {g["group_name"]: (g["activation_status"], g["external_id"],
                                  {p["resource_name"]: p["applied_policy_name"]
                                   for p in g["resource_policies"]})
                for g in json.loads(out)["resource_groups"]}

    def wait_group(self, name: str, timeout: float = 60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.groups().get(name)
            if got and got[0] == "active":
                return got
            time.sleep(0.3)
        raise AssertionError("%s not active after %ds; log:\n%s" % (name, timeout, self.lines()))

    def job_nodes(self, job_id: int):
        out = self.cluster.run("scontrol", "show", "hostnames",
                               self.job_field(job_id, "NodeList")).stdout
        return sorted(out.split())

    def job_field(self, job_id: int, name: str) -> str:
        out = self.cluster.run("scontrol", "-o", "show", "job", str(job_id)).stdout
        match = re.search(r"(?:^|\s)%s=(\S*)" % name, out)
        return match.group(1) if match else ""

    def lines(self):
        return self.log.read_text().splitlines() if self.log.exists() else []

    def wait_line(self, pattern: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [l for l in self.lines() if re.search(pattern, l)]
            if found:
                return found[-1]
            time.sleep(0.3)
        raise AssertionError("no log line %r after %ds:\n%s" % (pattern, timeout,
                                                               "\n".join(self.lines())))


@pytest.fixture(scope="module")
def site(tmp_path_factory, slurm_install):
    s = Site(tmp_path_factory.mktemp("slurm-jobs"), slurm_install)
    s.cluster.start()
    try:
        yield s
    finally:
        s.cluster.stop()


@pytest.fixture(autouse=True)
def clean_policies(site):
    site.generation += 1
    site.set_policies()
    yield
    site.set_policies()
    # A test that failed half-way must not leave held jobs for the next one.
    for name in ("a", "b", "c"):
        site.release(name)
    site.cluster.run("scancel", "--state=PENDING", "--user=root", check=False)


def test_policies_from_option_comment_partition_and_topology(site):
    c = site.cluster
    option = c.sbatch("-N2", "-p", "debug", "--power-policy=Node-Min",
                      "--comment", "power_policy=Node-Low", script=site.hold("a"))
    comment = c.sbatch("-N1", "-p", "debug", "--comment", "keep=1 power_policy=Node-Low",
                       script=site.hold("a"))
    # Node-High on node4 fits the rack budget only once the other three nodes
    # are at Node-Min/Node-Low: the partition job comes after their groups.
    site.wait_group("rg_%d" % option)
    site.wait_group("rg_%d" % comment)
    partition = c.sbatch("-N1", "-p", "gpu", script=site.hold("a"))
    want = {option: "Node-Min", comment: "Node-Low", partition: "Node-High"}
    for job_id, policy in want.items():
        status, ext, applied = site.wait_group("rg_%d" % job_id)
        nodes = site.job_nodes(job_id)
        assert (status, ext) == ("active", job_id)
        assert applied == {n: policy for n in nodes}, (job_id, applied, nodes)
        assert all(node_caps(site.state)[n][0] == policy for n in nodes)
    assert site.job_field(partition, "Partition") == "gpu"
    site.release("a")
    for job_id in want:
        assert c.wait_job(job_id, timeout=60) == "COMPLETED"
    site.wait_line(r"job %d epilog: job ended" % max(want))
    deadline = time.monotonic() + 30
    while any("rg_%d" % j in site.groups() for j in want) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert not any("rg_%d" % j in site.groups() for j in want)
    assert {cap[0] for cap in node_caps(site.state).values()} == {"Node-Med"}
    default = c.sbatch("-N1", script=site.hold("b"))
    assert site.wait_group("rg_%d" % default)[2] == {n: "Node-Med"
                                                     for n in site.job_nodes(default)}
    assert "no policy requested: topology default" in site.wait_line(r"job %d prolog" % default)
    site.release("b")
    assert c.wait_job(default, timeout=60) == "COMPLETED"
    assert "requested by --power-policy" in site.wait_line(r"job %d prolog" % option)
    # slurmctld ran them as in production: signals blocked, no PATH
    hook_log = c.hook_log("prolog_slurmctld")
    assert "SigBlk:%s" % BLOCKED_SIGNALS[c.install.version] in hook_log
    assert "\nPATH=" not in hook_log


def test_group_left_by_a_missed_epilog_is_deleted_by_the_next_prolog(site):
    c = site.cluster
    ended = c.sbatch("-w", "node1", script="#!/bin/sh\ntrue\n")
    assert c.wait_job(ended, timeout=60) == "COMPLETED"
    site.wait_line(r"job %d epilog" % ended)
    service = ResourceGroupService(str(site.state), FAST_DEVICES)
    try:  # the group as it would be had slurmctld died before the epilog
        name = "rg_%d" % ended
        assert service.create(name, ended, "Node-Min").status.ok
        assert service.add_resources(name, ["node1"]).status.ok
        assert service.activate(name).status.ok
    finally:
        service.close()
    job_id = c.sbatch("-w", "node1", "--power-policy=Node-Low", script=site.hold("c"))
    assert site.wait_group("rg_%d" % job_id)[2] == {"node1": "Node-Low"}
    assert "rg_%d" % ended not in site.groups()
    assert "deleted rg_%d: job %d has ended but its group still held node1" % (ended, ended) \
        in site.wait_line(r"job %d prolog" % job_id)
    site.release("c")
    assert c.wait_job(job_id, timeout=60) == "COMPLETED"


@pytest.mark.parametrize("value, why", [("no good", "may hold only letters"),
                                        ("x" * 65, "is longer than 64 characters")])
def test_bad_option_value_is_refused_at_submission(site, value, why):
    proc = site.cluster.run("sbatch", "--power-policy=" + value, "--wrap", "true", check=False)
    assert proc.returncode != 0 and why in proc.stderr
    assert site.cluster.run("squeue", "-h", "-t", "all", "-o", "%j").stdout.count("wrap") == 0


def test_failed_activation_requeues_the_batch_job_and_fail_open_lets_it_run(site):
    c = site.cluster
    site.set_policies(strict=True)
    job_id = c.sbatch("-N2", "-p", "debug", "--power-policy=Node-High",
                      script="#!/bin/sh\nsleep 1\n")
    line = site.wait_line(r"job %d prolog: .*exit 1: Slurm requeues a batch job" % job_id)
    assert "does not fit the power budget (strict)" in line
    # requeued: pending again (eligible after cred_expire + 1 s), its restart counted
    assert c.wait_job(job_id, states=("PENDING",), timeout=60) == "PENDING"
    assert int(site.job_field(job_id, "Restarts")) >= 1
    assert site.job_field(job_id, "Requeue") == "1"
    assert "rg_%d" % job_id not in site.groups()
    site.set_policies(strict=True, fail_open=True)
    assert c.wait_job(job_id, timeout=90) == "COMPLETED"
    assert "fail_open: started without a resource group" in site.wait_line(
        r"job %d prolog: .*fail_open" % job_id)
    proc = c.run("srun", "-N2", "-p", "debug", "--power-policy=Node-High", "true", check=False)
    assert proc.returncode == 0, proc.stderr
    site.set_policies(strict=True)
    proc = c.run("srun", "-N2", "-p", "debug", "--power-policy=Node-High", "true", check=False)
    assert proc.returncode != 0 and "PrologSlurmctld failed" in proc.stderr


def test_twenty_jobs_at_once_get_and_lose_their_groups(site):
    c = site.cluster
    policies = ("Node-Low", "Node-Min")
    jobs = {c.sbatch("-N1", "-p", "debug", "--power-policy=%s" % policies[i % 2],
                     script="#!/bin/sh\nsleep 0.5\n"): policies[i % 2] for i in range(20)}
    for job_id in jobs:
        assert c.wait_job(job_id, timeout=120) == "COMPLETED"
    times = {"prolog": [], "epilog": []}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = {}
        for line in site.lines():
            match = TIME_IN_LINE.search(line)
            if match and int(match.group(1)) in jobs:
                found[(int(match.group(1)), match.group(2))] = (float(match.group(3)), line)
        if len(found) == 40:
            break
        time.sleep(0.3)
    assert len(found) == 40, sorted(found)
    for job_id, policy in jobs.items():
        assert "policy %s (%s requested by --power-policy)" % (policy, policy) \
            in found[(job_id, "prolog")][1]
        assert "topology policies restored" in found[(job_id, "epilog")][1]
    for (job_id, program), (seconds, _) in found.items():
        times[program].append(seconds)
    assert site.groups() == {}
    assert {cap[0] for cap in node_caps(site.state).values()} == {"Node-Med"}
    print("\nmedian wall time over 20 jobs (process start to exit, loaded 2-core host): "
          "prolog %.3f s (max %.3f), epilog %.3f s (max %.3f)" % (
              statistics.median(times["prolog"]), max(times["prolog"]),
              statistics.median(times["epilog"]), max(times["epilog"])))


def test_jobs_run_on_the_job_server_when_it_listens(site, slurm_install):
    """pbs-power-slurm-jobd where slurmctld runs; the wrappers name its socket."""
    c = site.cluster
    sock = site.base / "jobd" / "jobs.sock"
    server = subprocess.Popen(slurm_install.argv([str(slurm_install.program_bin
                                                      / "pbs-power-slurm-jobd"),
                                                  "--socket", str(sock)]),
                              stderr=subprocess.PIPE, universal_newlines=True)
    wrappers = sorted((site.base / "programs").iterdir())
    saved = {w: w.read_text() for w in wrappers}
    try:
        deadline = time.monotonic() + 60
        while not sock.exists() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sock.exists(), server.stderr.read() if server.poll() is not None else "no socket"
        for wrapper, text in saved.items():
            wrapper.write_text(text.replace(" exec ", " PBS_POWER_JOB_SOCKET=%s exec " % sock))
        site.config.write_text(site.config.read_text().replace("{", '{"log_level": "debug", ', 1))
        job = c.sbatch("-N2", "-p", "debug", "--power-policy=Node-Low", script=site.hold("a"))
        status, ext, applied = site.wait_group("rg_%d" % job)
        assert (status, ext) == ("active", job)
        assert applied == {n: "Node-Low" for n in site.job_nodes(job)}
        site.release("a")
        assert c.wait_job(job, timeout=60) == "COMPLETED"
        site.wait_line(r"job %d epilog: job ended" % job)
        ran_by = [l for l in site.lines() if re.search(
            r"job %d (prolog|epilog): run by pbs-power-slurm-jobd\[\d+\]" % job, l)]
        assert len(ran_by) == 2, "\n".join(site.lines())
        assert server.poll() is None
    finally:
        for wrapper, text in saved.items():
            wrapper.write_text(text)
        server.terminate()
        server.wait(10)
