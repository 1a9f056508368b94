"""The Slurm test-cluster harness itself, on each real Slurm: starts, runs jobs, stops clean."""
from __future__ import annotations

import pytest

from slurm_cluster import alive, requires_slurm, running_cluster

pytestmark = [pytest.mark.slurm, requires_slurm]


def test_cluster_runs_a_job_and_stop_leaves_no_process(tmp_path, slurm_install):
    with running_cluster(tmp_path / "c", num_nodes=2, install=slurm_install) as cluster:
        states = cluster.node_states()
        assert states == {"node1": "idle", "node2": "idle~"}
        pids = [cluster.slurmd_pid("node1")]
        assert pids[0] and cluster.slurmd_pid("node2") is None
        job = cluster.sbatch("-w", "node1", script="#!/bin/sh\necho hello > %s\n"
                             % (tmp_path / "out"))
        assert cluster.wait_job(job, timeout=60) == "COMPLETED"
        assert (tmp_path / "out").read_text() == "hello\n"
        pids += [int((cluster.run_dir / name).read_text())
                 for name in ("slurmctld.pid", "munged.pid")]
        assert all(alive(p) for p in pids)
    assert not any(alive(p) for p in pids)
    assert cluster.stray_pids() == []
