"""A throw-away Slurm cluster on localhost for tests: munged, slurmctld, N emulated nodes.

Debian 12's Slurm 22.05 (``slurmctld slurmd slurm-client munge``, installed by
tests/setup.sh) runs as root with no systemd, accounting or cgroups. Every
node is its own ``slurmd -N nodeX`` on 127.0.0.1 with its own free port
(Debian builds Slurm with MULTIPLE_SLURMD). node1 is always on
(SuspendExcNodes); node2..N are power-managed: powering a node on starts its
``slurmd -b``, powering it off stops it. Nothing is faked: slurmctld really
calls the configured Suspend/Resume/PrologSlurmctld/EpilogSlurmctld programs,
with closed fds 0-2, an environment of only SLURM_CONF (+ SLURM_RESUME_FILE)
and a blocked signal mask, as in production.

slurm.conf always points at wrappers ``DIR/bin/{suspend,resume,resume_fail,
prolog_slurmctld,epilog_slurmctld}``: each appends its argv, signal mask and
environment to ``DIR/log/hooks/<name>.log``, exports SLURM_CONF when missing
(a production slurm.conf sits where the commands find it without) and the
``program_env`` variables, then execs the program under test unchanged.
Without one, suspend/resume power nodes off/on directly, and the others
exit with the number in ``DIR/control/<name>.rc``. ``power_on_cmd`` /
``power_off_cmd`` take a hostlist; ``power_site_cmd`` speaks the `command`
power backend's protocol (``node-power-site OPERATION HOST``, JSON answer).

Two clusters may run at once (ports are picked free, every path lives under
``base_dir``); `stop` ends every process of this cluster by PID. ``install``
picks the Slurm that runs it (`slurm_installs`: the host's, or the Slurm
24.11 chroot's, where every daemon and command of the cluster runs inside).
"""
from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence

import pytest

from slurm_cluster_scripts import (HOOK_ENV, LOG_HOOK, NODE_POWER_OFF, NODE_POWER_ON,
                                   NODE_POWER_SITE, SAFE_PATH, wrapper_script)
from slurm_installs import HOST, SlurmInstall


def skip_reason() -> Optional[str]:
    """Why real-cluster tests cannot run on the host's Slurm, or None when they can."""
    return HOST.skip_reason()


#: Apply to real-cluster test modules: ``pytestmark = [pytest.mark.slurm, requires_slurm]``.
requires_slurm = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")


def free_ports(count: int) -> List[int]:
    """``count`` distinct TCP ports free on 127.0.0.1, outside the ephemeral range."""
    ports: List[int] = []
    while len(ports) < count:
        port = random.randint(20000, 32000)
        if port in ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports


def alive(pid: Optional[int]) -> bool:
    """Running and not a zombie (daemons re-parented to PID 1 may be reaped late)."""
    if not pid:
        return False
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("State:"):
                    return "Z" not in line.split()[1]
    except OSError:
        return False
    return False


def stop_pid(pid: Optional[int], wait: float = 10.0) -> None:
    """SIGTERM, wait up to ``wait`` seconds, then SIGKILL."""
    if not alive(pid):
        return
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if not alive(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)


def read_pid(path: Path) -> Optional[int]:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


class SlurmCluster:
    """munged + slurmctld + ``num_nodes`` slurmds under ``base_dir``; see the module doc."""

    def __init__(self, base_dir: Path, num_nodes: int = 4, node_mode: str = "regular",
                 suspend_program: Optional[str] = None, resume_program: Optional[str] = None,
                 prolog_slurmctld: Optional[str] = None, epilog_slurmctld: Optional[str] = None,
                 extra_conf: Sequence[str] = (), plugstack_lines: Sequence[str] = (),
                 suspend_time: int = 10, resume_timeout: int = 30, cred_expire: int = 10,
                 power_down_at_start: bool = True, suspend_rate: int = 0, resume_rate: int = 0,
                 program_env: Optional[Mapping[str, str]] = None,
                 resume_fail_program: Optional[str] = None, suspend_timeout: int = 5,
                 install: SlurmInstall = HOST):
        if node_mode not in ("regular", "cloud"):
            raise ValueError("node_mode must be 'regular' or 'cloud'")
        if num_nodes < 1:
            raise ValueError("num_nodes must be >= 1")
        self.dir = Path(base_dir).resolve()
        self.install = install
        self.num_nodes = num_nodes
        self.node_mode = node_mode
        self.programs = {"suspend": suspend_program, "resume": resume_program,
                         "prolog_slurmctld": prolog_slurmctld,
                         "epilog_slurmctld": epilog_slurmctld,
                         "resume_fail": resume_fail_program}
        self.extra_conf = tuple(extra_conf)
        self.plugstack_lines = tuple(plugstack_lines)
        self.suspend_time = suspend_time
        self.suspend_timeout = suspend_timeout
        self.resume_timeout = resume_timeout
        self.cred_expire = max(5, cred_expire)
        self.power_down_at_start = power_down_at_start
        self.suspend_rate = suspend_rate
        self.resume_rate = resume_rate
        self.program_env = dict(program_env or {})
        self.conf_path = self.dir / "etc" / "slurm.conf"
        self.log_dir = self.dir / "log"
        self.bin_dir = self.dir / "bin"
        self.run_dir = self.dir / "run"
        self.power_on_cmd = self.bin_dir / "node-power-on"
        self.power_off_cmd = self.bin_dir / "node-power-off"
        #: `command` power backend site script: ``node-power-site OPERATION HOST``.
        self.power_site_cmd = self.bin_dir / "node-power-site"
        self.nodes = ["node%d" % i for i in range(1, num_nodes + 1)]
        self.managed = self.nodes[1:]
        self.env: Dict[str, str] = dict(os.environ, SLURM_CONF=str(self.conf_path))
        self.env["PATH"] = self.env.get("PATH") or SAFE_PATH
        self._munge_sock_dir: Optional[Path] = None
        self.started = False

    # -- life cycle ----------------------------------------------------------------
    def start(self) -> None:
        """Start munged, slurmctld and the nodes; return once they are ready."""
        reason = self.install.skip_reason()
        if reason:
            raise RuntimeError(reason)
        self._make_dirs()
        self.started = True
        try:
            self._start_munge()
            self._write_scripts()
            self._write_config()
            self._start_slurmctld()
            self._start_nodes()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every process of this cluster by PID (idempotent)."""
        ctld = read_pid(self.run_dir / "slurmctld.pid")
        if alive(ctld):
            self._cancel_jobs()
            with contextlib.suppress(Exception):
                self.run("scontrol", "shutdown", check=False, timeout=20)
            deadline = time.monotonic() + 10
            while alive(ctld) and time.monotonic() < deadline:
                time.sleep(0.1)
        stop_pid(ctld)
        for pid_file in sorted(self.run_dir.glob("slurmd-*.pid")):
            stop_pid(read_pid(pid_file))
            for path in (pid_file, Path(str(pid_file) + ".stopping")):
                with contextlib.suppress(OSError):
                    path.unlink()
        for pid in self.stray_pids():
            stop_pid(pid)
        stop_pid(read_pid(self.run_dir / "munged.pid"))
        if self._munge_sock_dir is not None:
            shutil.rmtree(self._munge_sock_dir, ignore_errors=True)
            self._munge_sock_dir = None
        self.started = False

    def stray_pids(self) -> List[int]:
        """Slurm daemons of this cluster without a PID file (found through /proc)."""
        out = []
        conf = b"SLURM_CONF=" + str(self.conf_path).encode()
        marker = (str(self.dir) + "/").encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                comm = (entry / "comm").read_text().strip()
                if comm not in ("slurmd", "slurmstepd", "slurmctld", "munged"):
                    continue
                environ = (entry / "environ").read_bytes().split(b"\0")
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if (conf in environ or marker in cmdline) and alive(int(entry.name)):
                out.append(int(entry.name))
        return out

    def _cancel_jobs(self) -> None:
        """Cancel every job so that no job process outlives the cluster."""
        with contextlib.suppress(Exception):
            jobs = self.run("squeue", "-h", "-o", "%A", check=False, timeout=20).stdout.split()
            if jobs:
                self.run("scancel", *jobs, check=False, timeout=20)
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and self.run(
                        "squeue", "-h", "-t", "R,CG,CF", "-o", "%A", check=False,
                        timeout=20).stdout.strip():
                    time.sleep(0.2)

    def _make_dirs(self) -> None:
        if self.started or alive(read_pid(self.run_dir / "slurmctld.pid")):
            self.stop()
        for sub in ("etc", "state", "spool", "log", "run", "bin", "control", "munge"):
            shutil.rmtree(self.dir / sub, ignore_errors=True)
        for sub in ("etc", "state", "spool", "log/hooks", "run", "bin", "control", "munge"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        for node in self.nodes:     # 22.05's slurmd makes its SlurmdSpoolDir, 24.11's does not
            (self.dir / "spool" / node).mkdir()
        for path in (self.dir, self.dir / "etc", self.bin_dir):
            path.chmod(0o755)
        (self.dir / "munge").chmod(0o700)

    def _start_munge(self) -> None:
        # munged refuses a socket unless every directory above it is o+x; pytest's
        # tmp_path (/tmp/pytest-of-root, mode 700) is not, so the socket lives in /tmp.
        self._munge_sock_dir = Path(tempfile.mkdtemp(prefix="slurm-test-munge.", dir="/tmp"))
        self._munge_sock_dir.chmod(0o755)
        self.munge_socket = self._munge_sock_dir / "munge.socket"
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.run("munged", "--socket=%s" % self.munge_socket, "--key-file=%s" % key,
                 "--pid-file=%s" % (self.run_dir / "munged.pid"),
                 "--log-file=%s" % (self.log_dir / "munged.log"),
                 "--seed-file=%s" % (self.dir / "munge" / "munged.seed"), timeout=30)
        self._wait(lambda: self.munge_socket.exists(), 20, "munged socket")

    def _write_scripts(self) -> None:
        scripts = {"hook-env": HOOK_ENV.format(dir=self.dir), "log-hook": LOG_HOOK,
                   "node-power-on": NODE_POWER_ON, "node-power-off": NODE_POWER_OFF,
                   "node-power-site": NODE_POWER_SITE}
        for name, program in self.programs.items():
            scripts[name] = wrapper_script(self.dir, name, program, self.program_env)
        for name, text in scripts.items():
            path = self.bin_dir / name
            path.write_text(text)
            # slurmctld disables power saving for a group/world-writable program
            path.chmod(0o755)

    def _write_config(self) -> None:
        ports = free_ports(1 + self.num_nodes)
        self.ctld_port, self.node_ports = ports[0], dict(zip(self.nodes, ports[1:]))
        d = self.dir
        lines = [
            "ClusterName=testcluster", "SlurmctldHost=localhost", "SlurmUser=root",
            "SlurmdUser=root", "SlurmctldPort=%d" % self.ctld_port,
            "SlurmdPort=%d" % self.node_ports["node1"], "AuthType=auth/munge",
            "CredType=cred/munge",
            "AuthInfo=socket=%s,cred_expire=%d" % (self.munge_socket, self.cred_expire),
            "StateSaveLocation=%s/state" % d, "SlurmdSpoolDir=%s/spool/%%n" % d,
            "SlurmctldPidFile=%s/run/slurmctld.pid" % d,
            "SlurmdPidFile=%s/run/slurmd-%%n.pid" % d,
            "SlurmctldLogFile=%s/log/slurmctld.log" % d,
            "SlurmdLogFile=%s/log/slurmd-%%n.log" % d,
            "SlurmctldDebug=debug", "SlurmdDebug=debug", "DebugFlags=Power",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/backfill",
            "SchedulerParameters=batch_sched_delay=0,sched_interval=5,bf_interval=5",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none", "MpiDefault=none", "MailProg=/bin/true",
            "ReturnToService=2", "SlurmdTimeout=30", "InactiveLimit=0", "KillWait=5",
            "Waittime=0", "MinJobAge=300", "TreeWidth=65533", "PrivateData=cloud",
            "PlugStackConfig=%s/etc/plugstack.conf" % d,
            "PrologSlurmctld=%s/bin/prolog_slurmctld" % d,
            "EpilogSlurmctld=%s/bin/epilog_slurmctld" % d,
            "SuspendProgram=%s/bin/suspend" % d, "ResumeProgram=%s/bin/resume" % d,
            "ResumeFailProgram=%s/bin/resume_fail" % d,
            "SuspendTime=%d" % self.suspend_time, "SuspendTimeout=%d" % self.suspend_timeout,
            "ResumeTimeout=%d" % self.resume_timeout, "SuspendRate=%d" % self.suspend_rate,
            "ResumeRate=%d" % self.resume_rate, "SuspendExcNodes=node1",
            "SlurmctldParameters=power_save_interval=1,power_save_min_interval=0",
        ]
        for node in self.nodes:
            managed = node != "node1"
            state = "CLOUD" if managed and self.node_mode == "cloud" else "UNKNOWN"
            lines.append("NodeName=%s NodeHostname=localhost NodeAddr=127.0.0.1 Port=%d CPUs=1 "
                         "RealMemory=500 Feature=%s State=%s" % (
                             node, self.node_ports[node],
                             "powersave" if managed else "alwayson", state))
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        lines.extend(self.extra_conf)
        self.conf_path.write_text("# generated by tests/slurm/slurm_cluster.py\n"
                                  + "\n".join(lines) + "\n")
        (d / "etc" / "plugstack.conf").write_text("".join(l + "\n" for l in self.plugstack_lines))
        if self.install.version_at_least(23, 2):
            # slurmd loads a cgroup plugin whatever the task/proctrack plugins are (22.05
            # does not); none is mounted here, so tell it there are none.
            (d / "etc" / "cgroup.conf").write_text("CgroupPlugin=disabled\n")

    def _start_slurmctld(self) -> None:
        self.run("slurmctld", "-i", timeout=30)
        ok = self._poll(lambda: "is UP" in self.run("scontrol", "ping", check=False,
                                                    timeout=10).stdout, 30)
        if not ok:
            raise RuntimeError("slurmctld not answering; log tail:\n" + self.log_tail())

    def _start_nodes(self) -> None:
        first = self.nodes if self.node_mode == "regular" else self.nodes[:1]
        self.run(str(self.power_on_cmd), _hostlist(first), timeout=60)
        self.wait_nodes(lambda s: all(s.get(n) == "idle" for n in first), 90)
        if not self.managed:
            return
        managed = _hostlist(self.managed)
        if self.node_mode == "regular" and self.power_down_at_start:
            self.run("scontrol", "update", "nodename=%s" % managed, "state=power_down")
        if self.node_mode == "cloud" or self.power_down_at_start:
            self.wait_nodes(lambda s: all(s.get(n, "").endswith("~") for n in self.managed),
                            self.suspend_timeout + 60)

    # -- using it ------------------------------------------------------------------
    def run(self, *argv: str, check: bool = True, timeout: float = 60,
            input: Optional[str] = None) -> subprocess.CompletedProcess:
        """Run a command (argv list) against this cluster; stdout/stderr as text."""
        proc = subprocess.run(self.install.argv(argv), env=self.env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, universal_newlines=True,
                              timeout=timeout, input=input,
                              stdin=None if input is not None else subprocess.DEVNULL)
        if check and proc.returncode != 0:
            raise RuntimeError("%s exited %d: %s%s" % (" ".join(argv), proc.returncode,
                                                       proc.stderr.strip(), proc.stdout.strip()))
        return proc

    def sbatch(self, *args: str, script: str = "#!/bin/sh\nsleep 1\n") -> int:
        """Submit a batch job (extra sbatch ``args``); returns its job id."""
        out = self.run("sbatch", "--parsable", "-o", "/dev/null", *args, input=script).stdout
        return int(out.strip().split(";")[0])

    def job_state(self, job_id: int) -> str:
        """The job's state (PENDING, RUNNING, COMPLETED ...), '' when unknown."""
        out = self.run("scontrol", "show", "job", "-o", str(job_id), check=False).stdout
        for field in out.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return ""

    def wait_job(self, job_id: int, states: Sequence[str] = ("COMPLETED",),
                 timeout: float = 120) -> str:
        """Wait until the job is in one of ``states``; returns the state."""
        seen = [""]

        def reached() -> bool:
            seen[0] = self.job_state(job_id)
            return seen[0] in states
        if not self._poll(reached, timeout):
            raise AssertionError("job %d is %s, not %s, after %ds; nodes %s\nslurmctld log:\n%s"
                                 % (job_id, seen[0] or "unknown", "/".join(states), timeout,
                                    self.node_states(), self.log_tail()))
        return seen[0]

    def node_states(self) -> Dict[str, str]:
        """node -> sinfo's state with its suffix (``idle``, ``idle~``, ``mixed#`` ...)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout
        return dict(line.split(None, 1) for line in out.splitlines() if " " in line)

    def wait_nodes(self, predicate: Callable[[Dict[str, str]], bool],
                   timeout: float = 90) -> None:
        """Wait until ``predicate(node_states())`` holds."""
        if not self._poll(lambda: predicate(self.node_states()), timeout):
            raise AssertionError("nodes did not reach the expected states within %ds: %s\n"
                                 "slurmctld log:\n%s" % (timeout, self.node_states(),
                                                         self.log_tail()))

    def slurmd_pid(self, node: str) -> Optional[int]:
        """PID of the node's running slurmd (None when it is powered off)."""
        pid = read_pid(self.run_dir / ("slurmd-%s.pid" % node))
        return pid if alive(pid) else None

    def never_boots(self, node: str, never: bool = True) -> None:
        """Make ``node`` take power-on commands without ever starting its slurmd."""
        flag = self.run_dir / ("never-boots-" + node)
        if never:
            flag.write_text("")
        elif flag.exists():
            flag.unlink()

    def hook_log(self, name: str) -> str:
        """What the wrapper ``name`` logged (argv, signal mask, environment per call)."""
        path = self.log_dir / "hooks" / ("%s.log" % name)
        return path.read_text() if path.exists() else ""

    def set_rc(self, name: str, rc: int) -> None:
        """Exit status of the default prolog/epilog wrapper ``name`` (no program given)."""
        (self.dir / "control" / ("%s.rc" % name)).write_text("%d\n" % rc)

    def log_tail(self, lines: int = 30) -> str:
        path = self.log_dir / "slurmctld.log"
        if not path.exists():
            return "(no slurmctld log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    @staticmethod
    def _poll(check: Callable[[], bool], timeout: float, every: float = 0.3) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if check():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(every)

    def _wait(self, check: Callable[[], bool], timeout: float, what: str) -> None:
        if not self._poll(check, timeout):
            raise RuntimeError("%s not ready after %ds" % (what, timeout))


def _hostlist(nodes: Sequence[str]) -> str:
    return ",".join(nodes)


@contextlib.contextmanager
def running_cluster(base_dir: Path, **kwargs) -> Iterator[SlurmCluster]:
    """A started `SlurmCluster`, stopped (every process, by PID) on exit."""
    cluster = SlurmCluster(base_dir, **kwargs)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
