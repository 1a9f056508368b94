"""Node power states: the model, the pure planner and transitions, the cycle, the SQLite store.

A periodic run (PBS hook, ``pbs-power slurm cycle``, the simulator) builds a
`Snapshot`, hands it to `Cycle`, which reconciles transitions in flight,
`plan`s and commands the power backend, keeping what must survive in `Store`.
"""
from pbs_power._lazy import exports, names

_PUBLIC = {
    **{n: ".model" for n in ("Snapshot", "Vnode", "QueuedJob", "Reservation", "Transition",
                             "TransitionKind", "PowerState", "Plan", "Action", "Deferral")},
    "plan": ".planner", "needed_back": ".planner",
    "Cycle": ".cycle", "CycleReport": ".cycle", "Mark": ".cycle",
    "Store": ".store", "StoreError": ".store",
}
__all__ = names(_PUBLIC)
__getattr__ = exports(__name__, _PUBLIC)
