"""Programs slurmctld runs: SuspendProgram/ResumeProgram and PrologSlurmctld/EpilogSlurmctld.

Thin entry points over the library (`pbs_power.slurm_power`, `pbs_power.slurm_jobs`);
the SPANK plugin `power_policy.c` adds the ``--power-policy`` job option.
"""
