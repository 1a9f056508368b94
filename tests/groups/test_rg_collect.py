"""Collecting groups nothing else ends: interrupted operations and groups of ended jobs."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from pbs_power.cli.main import main
from pbs_power.groups.collect import collect
from pbs_power.slurm.client import SlurmJob
from pbs_power.slurm.cycle import collect_job_groups
from rg_invariants import violations
from test_rg_budget import group, open_service, svc  # noqa: F401  (the fixture)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_delete_killed_midway_is_repaired_within_the_budget(svc):  # noqa: F811
    group(svc, "rg_7", ["n1", "n2"], "High")
    assert svc.activate("rg_7").status.ok
    svc.store.set_group("rg_7", status="deactivating", owner_pid=dead_pid())
    done = collect(svc)
    assert [(c.group, c.action) for c in done] == [("rg_7", "repaired")]
    assert "deactivating by pid" in done[0].why
    assert svc.store.group("rg_7").status == "inactive"
    assert violations(svc) == []


def test_groups_of_ended_jobs_are_deleted_and_the_rest_kept(svc):  # noqa: F811
    for name, node in (("rg_1", "n1"), ("rg_2", "n2"), ("rg_3", "n3"), ("mine", "n4")):
        group(svc, name, [node], "Med")
        assert svc.activate(name).status.ok
    alive = {"1": False, "2": True, "3": None}
    done = collect(svc, lambda g: g[3:] if g.startswith("rg_") else None, alive.get)
    assert {(c.group, c.action) for c in done} == {("rg_1", "deleted"), ("rg_3", "kept")}
    assert sorted(r.name for r in svc.store.groups()) == ["mine", "rg_2", "rg_3"]
    assert violations(svc) == []


def test_a_group_younger_than_the_job_list_is_spared(svc):  # noqa: F811
    before = time.time() - 60
    group(svc, "rg_9", ["n1"], "Med")
    assert collect(svc, lambda g: g[3:], lambda job: False, created_before=before) == []
    assert svc.store.group("rg_9") is not None


def test_dry_run_changes_nothing(svc):  # noqa: F811
    group(svc, "rg_5", ["n1"], "Med")
    svc.store.set_group("rg_5", status="activating", owner_pid=dead_pid())
    done = collect(svc, lambda g: g[3:], lambda job: False, dry_run=True)
    assert {c.action for c in done} == {"repaired", "deleted"}
    assert svc.store.group("rg_5").status == "activating"


def test_the_cli_repairs_and_reports(svc, tmp_path, capsys):  # noqa: F811
    group(svc, "rg_4", ["n1"], "Med")
    svc.store.set_group("rg_4", status="deactivating", owner_pid=dead_pid())
    argv = ["resource-group", "gc", "--scheduler", "none", "--state-dir", str(tmp_path),
            "--device-option", "simulated.latency_ms=0"]
    assert main(argv + ["--dry-run"]) == 0
    assert "rg_4: would be repaired" in capsys.readouterr().out
    assert main(argv) == 0
    assert "rg_4: repaired (deactivating by pid" in capsys.readouterr().out
    assert main(argv) == 0
    assert "nothing to collect" in capsys.readouterr().out


class Jobs:
    """A Slurm client that only lists jobs."""

    def __init__(self, jobs):
        self._jobs = jobs

    def jobs(self):
        return self._jobs


def test_the_slurm_cycle_deletes_groups_of_jobs_slurm_no_longer_runs(svc, tmp_path):  # noqa: F811
    import logging
    from pbs_power.config.hook_config import parse_config
    for name, node in (("rg_11", "n1"), ("rg_12", "n2"), ("rg_13", "n3")):
        group(svc, name, [node], "Med")
        assert svc.activate(name).status.ok
    svc.store._conn.execute("UPDATE groups SET created = created - 3600")
    config = parse_config({"state_dir": str(tmp_path), "job_policies": {
        "device_options": {"simulated": {"latency_ms": 0}}}})
    client = Jobs([SlurmJob("11", "COMPLETED"), SlurmJob("12", "RUNNING")])
    collect_job_groups(config, client, logging.getLogger("test"))
    assert sorted(r.name for r in svc.store.groups()) == ["rg_12"]
    assert violations(svc) == []


def test_the_pbs_periodic_cleanup_repairs_interrupted_groups(svc, tmp_path):  # noqa: F811
    from pbs_power.config.hook_config import parse_config
    from pbs_power.pbs.jobs import cleanup_after_qstat
    group(svc, "rg_21.pbssvr", ["n1"], "Med")
    assert svc.activate("rg_21.pbssvr").status.ok
    svc.store.set_group("rg_21.pbssvr", status="deactivating", owner_pid=dead_pid())
    config = parse_config({"state_dir": str(tmp_path), "job_policies": {
        "device_options": {"simulated": {"latency_ms": 0}}}})
    lines = []
    cleanup_after_qstat(config, ["21.pbssvr"], time.time(), lambda lvl, msg: lines.append(msg))
    assert svc.store.group("rg_21.pbssvr").status == "inactive"
    assert any("rg_21.pbssvr: repaired" in line for line in lines)
