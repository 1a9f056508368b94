"""``pbs-power``: one module per command group; each only parses arguments and prints.

`main` (in `pbs_power.cli.main`) is the console script; ``python -m pbs_power.cli``
runs it too.
"""
