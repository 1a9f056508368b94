"""PrologSlurmctld: give the starting job its resource group and power policy.

slurm.conf: ``PrologSlurmctld=/usr/local/bin/pbs-power-slurm-prolog`` (an
absolute path). Exit 1 when the job's policy cannot be activated (Slurm
requeues a batch job, cancels an srun/salloc job); see pbs_power.slurm.jobs.
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the prolog in the environment slurmctld gave us."""
    from pbs_power.slurm.env import prepare_program_env
    prepare_program_env()
    from pbs_power.slurm.jobs import main as jobs_main
    return jobs_main("prolog", argv)


if __name__ == "__main__":
    sys.exit(main())
