"""Slurm's SuspendProgram: ``SuspendProgram=/path/to/pbs-power-slurm-suspend`` in slurm.conf.

The work is in `pbs_power.slurm.power`; see `slurm_spank.run_power_program`.
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from slurm_spank import run_power_program


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the SuspendProgram; returns its exit status."""
    return run_power_program("suspend", argv)


if __name__ == "__main__":
    sys.exit(main())
