"""pbs_power.slurm.env: programs started the way slurmctld starts them (fds 0-2 closed,
no PATH, signals blocked) get a usable environment and a one-line-per-event log."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from pbs_power.config.hook_config import parse_config
from pbs_power.slurm.env import SAFE_PATH, config_path, program_logger

CHILD = r"""
import json, os, signal, subprocess, sys
out = sys.argv[1]
before = {"stdout_none": sys.stdout is None,
          "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))}
from pbs_power.slurm.env import prepare_program_env, program_logger
from pbs_power.config.hook_config import parse_config
prepare_program_env()
print("stdout works now")
child_mask = subprocess.run(["grep", "SigBlk", "/proc/self/status"], stdout=subprocess.PIPE,
                            universal_newlines=True).stdout.split()[1]
log = program_logger("resume", parse_config({"slurm_log_file": sys.argv[2]}))
log.info("node2: power_on sent")
after = {"fds": [os.readlink("/proc/self/fd/%d" % fd) for fd in (0, 1, 2)],
         "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
         "path": os.environ.get("PATH"), "child_mask": child_mask}
with open(out, "w") as f:
    json.dump({"before": before, "after": after}, f)
"""


def _as_slurmctld_does() -> None:
    """In the child before exec: close fds 0-2 and block the signals slurmctld blocks."""
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM, signal.SIGHUP, signal.SIGINT,
                                              signal.SIGUSR1, signal.SIGPIPE, signal.SIGALRM])
    for fd in (0, 1, 2):
        os.close(fd)


def test_prepare_program_env_repairs_what_slurmctld_gives(tmp_path):
    out, log_file = tmp_path / "out.json", tmp_path / "slurm.log"
    env = {"PYTHONPATH": os.getcwd(), "SLURM_CONF": "/nonexistent/slurm.conf"}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(out), str(log_file)], env=env,
                          preexec_fn=_as_slurmctld_does, timeout=60)
    assert proc.returncode == 0
    got = json.loads(out.read_text())
    assert got["before"]["stdout_none"] is True
    assert int(signal.SIGTERM) in got["before"]["blocked"]
    assert got["after"]["fds"] == ["/dev/null"] * 3
    assert got["after"]["blocked"] == []
    assert got["after"]["child_mask"] == "0000000000000000"
    assert got["after"]["path"] == SAFE_PATH
    lines = log_file.read_text().splitlines()
    assert len(lines) == 1 and " resume[" in lines[0]
    assert lines[0].endswith("]: INFO node2: power_on sent")


def test_config_path_and_unwritable_log_file(tmp_path, capsys):
    assert config_path({}) == "/etc/pbs_power.json"
    assert config_path({"PBS_POWER_CONFIG": "/x/y.json"}) == "/x/y.json"
    log = program_logger("suspend", parse_config({"slurm_log_file": str(tmp_path / "no/such.log")}))
    log.warning("node3: suspend refused")
    err = capsys.readouterr().err
    assert "cannot open slurm_log_file" in err and "node3: suspend refused" in err
