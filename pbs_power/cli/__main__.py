"""``python -m pbs_power.cli``: the ``pbs-power`` command."""
import sys

from pbs_power.cli.main import main

sys.exit(main())
