"""PBS Pro / OpenPBS: the periodic hook's logic, the job and provisioning hooks, installation.

The hook scripts in ``hooks/`` call `run_periodic`, `on_runjob`, `on_jobobit`
and `on_provision` with PBS's own ``pbs`` module; nothing here imports it.
"""
from pbs_power._lazy import exports, names

_PUBLIC = {
    "run_periodic": ".hook",
    "on_runjob": ".jobs", "on_jobobit": ".jobs", "on_provision": ".jobs",
    "install_commands": ".install",
}
__all__ = names(_PUBLIC)
__getattr__ = exports(__name__, _PUBLIC)
