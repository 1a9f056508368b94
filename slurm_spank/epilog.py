"""EpilogSlurmctld: delete the ended job's resource group, restoring topology policies.

slurm.conf: ``EpilogSlurmctld=/usr/local/bin/pbs-power-slurm-epilog`` (an
absolute path). Idempotent: a job without a group is fine; see
pbs_power.slurm.jobs. With ``pbs-power-slurm-jobd`` running, its child does
the run (see pbs_power.slurm.jobserver).
"""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    """Run the epilog in the environment slurmctld gave us; ``argv``: ``[--config FILE]``."""
    from pbs_power.slurm.jobclient import program_main
    return program_main("epilog", argv)


if __name__ == "__main__":
    sys.exit(main())
