"""Slurm's ResumeProgram: ``ResumeProgram=/path/to/pbs-power-slurm-resume`` in slurm.conf.

slurmctld runs it with the hostlist in argv[1], fds 0-2 closed, no PATH and
signals blocked; the work is in `pbs_power.slurm_power`.
"""
from __future__ import annotations

import os
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the ResumeProgram; returns its exit status."""
    from pbs_power.slurm_env import prepare_program_env
    prepare_program_env()
    from pbs_power.slurm_power import program_main
    return program_main("resume", list(sys.argv if argv is None else argv), os.environ)


if __name__ == "__main__":
    sys.exit(main())
