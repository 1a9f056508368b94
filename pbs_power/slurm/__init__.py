"""Slurm: job power policies (PrologSlurmctld/EpilogSlurmctld), node power programs
(Suspend/Resume/ResumeFailProgram), the periodic cycle and the slurm.conf lines.

Slurm is read through `SlurmClient` (its commands, or pyslurm); the programs in
``slurm_spank/`` call `prepare_program_env`, then `jobs.main` or `program_main`.
"""
from pbs_power._lazy import exports, names

_PUBLIC = {
    "SlurmClient": ".client", "SlurmError": ".client",
    "get_client": ".adapter", "read_view": ".adapter",
    "prepare_program_env": ".env",
    "program_main": ".power",
    "cycle_main": ".cycle", "run_cycle": ".cycle",
}
__all__ = names(_PUBLIC)
__getattr__ = exports(__name__, _PUBLIC)
