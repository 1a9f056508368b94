"""Programs slurmctld runs: SuspendProgram/ResumeProgram and PrologSlurmctld/EpilogSlurmctld.

Thin entry points over the library (`pbs_power.slurm.power`, `pbs_power.slurm.jobs`);
the SPANK plugin `power_policy.c` adds the ``--power-policy`` job option.
"""
from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is not imported at run time: every job's prolog loads this
if TYPE_CHECKING:
    from typing import Optional, Sequence


def run_power_program(kind: str, argv: Optional[Sequence[str]] = None) -> int:
    """Run the Suspend/Resume/ResumeFailProgram ``kind``; returns its exit status.

    slurmctld runs these with the hostlist in argv[1], fds 0-2 closed, no
    PATH and signals blocked: the environment is made safe first.
    """
    from pbs_power.slurm.env import prepare_program_env
    prepare_program_env()
    from pbs_power.slurm.power import program_main
    return program_main(kind, list(sys.argv if argv is None else argv), os.environ)
