"""EpilogSlurmctld: delete the ended job's resource group, restoring topology policies.

slurm.conf: ``EpilogSlurmctld=/usr/local/bin/pbs-power-slurm-epilog`` (an
absolute path). Idempotent: a job without a group is fine; see
pbs_power.slurm.jobs.
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the epilog in the environment slurmctld gave us."""
    from pbs_power.slurm.env import prepare_program_env
    prepare_program_env()
    from pbs_power.slurm.jobs import main as jobs_main
    return jobs_main("epilog", argv)


if __name__ == "__main__":
    sys.exit(main())
