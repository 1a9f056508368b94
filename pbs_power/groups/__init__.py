"""Resource groups: each job's power policy, within the topology's power budget.

`ResourceGroupService` is the service (create, add, activate, update, delete,
GPU policies) over its SQLite store; `topology` and `policy` read and check
what the admin imports; `budget` and `planning` are the pure arithmetic.
"""
from pbs_power._lazy import exports, names

_PUBLIC = {
    **{n: ".service" for n in ("ResourceGroupService", "AsyncStrategy", "PartialActivation",
                               "Status", "Response")},
    **{n: ".topology" for n in ("Topology", "TopologyError", "load_topology", "parse_topology")},
    **{n: ".policy" for n in ("PolicyObject", "PolicyError", "PowerLimit", "parse_policy")},
}
__all__ = names(_PUBLIC)
__getattr__ = exports(__name__, _PUBLIC)
