"""PrologSlurmctld: give the starting job its resource group and power policy.

slurm.conf: ``PrologSlurmctld=/usr/local/bin/pbs-power-slurm-prolog`` (an
absolute path). Exit 1 when the job's policy cannot be activated (Slurm
requeues a batch job, cancels an srun/salloc job); see pbs_power.slurm.jobs.
With ``pbs-power-slurm-jobd`` running, its child does the run (see
pbs_power.slurm.jobserver).
"""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    """Run the prolog in the environment slurmctld gave us; ``argv``: ``[--config FILE]``."""
    from pbs_power.slurm.jobclient import program_main
    return program_main("prolog", argv)


if __name__ == "__main__":
    sys.exit(main())
