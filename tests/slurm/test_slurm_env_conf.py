"""The Slurm programs find the slurm.conf slurmctld runs with, though it gives them none."""
from __future__ import annotations

import os
from pathlib import Path

from pbs_power.slurm.env import slurmctld_conf


def fake_proc(tmp_path: Path, comm: bytes, argv, environ) -> Path:
    proc = tmp_path / "proc"
    entry = proc / "4242"
    entry.mkdir(parents=True)
    (entry / "comm").write_bytes(comm + b"\n")
    (entry / "cmdline").write_bytes(b"\0".join(argv) + b"\0")
    (entry / "environ").write_bytes(b"\0".join(environ) + b"\0")
    return proc


def test_conf_from_slurmctlds_environment(tmp_path):
    proc = fake_proc(tmp_path, b"slurmctld", [b"/usr/sbin/slurmctld", b"-D"],
                     [b"PATH=/bin", b"SLURM_CONF=/srv/slurm/slurm.conf"])
    assert slurmctld_conf(4242, str(proc)) == "/srv/slurm/slurm.conf"


def test_conf_from_slurmctlds_f_option_wins(tmp_path):
    proc = fake_proc(tmp_path, b"slurmctld", [b"slurmctld", b"-f", b"/opt/slurm.conf"],
                     [b"SLURM_CONF=/elsewhere.conf"])
    assert slurmctld_conf(4242, str(proc)) == "/opt/slurm.conf"
    proc2 = fake_proc(tmp_path / "b", b"slurmctld", [b"slurmctld", b"-f/opt/x.conf"], [])
    assert slurmctld_conf(4242, str(proc2)) == "/opt/x.conf"


def test_only_a_slurmctld_parent_is_trusted(tmp_path):
    proc = fake_proc(tmp_path, b"bash", [b"bash"], [b"SLURM_CONF=/tmp/evil.conf"])
    assert slurmctld_conf(4242, str(proc)) is None
    assert slurmctld_conf(4242, str(tmp_path / "none")) is None


def test_the_built_in_path_is_left_to_slurm(tmp_path):
    proc = fake_proc(tmp_path, b"slurmctld", [b"slurmctld"], [b"PATH=/bin"])
    assert slurmctld_conf(4242, str(proc)) is None


def test_this_process_parent_is_not_slurmctld():
    assert slurmctld_conf(os.getppid()) is None
