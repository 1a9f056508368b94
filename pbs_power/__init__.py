"""pbs_power: power management for HPC batch clusters, from the schedulers' own hooks.

Idle hosts are put to sleep or powered off and brought back ahead of queued
jobs and reservations (`planner`, `cycle`); jobs get power policies through
resource groups. Importing this package needs neither ``pbs``, ``pyslurm``
nor ``pynvml``: adapters import them only when used.
"""

__version__ = "0.1.0"
