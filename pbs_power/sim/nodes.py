"""SIMULATED nodes: their power states, per-node boot times and energy model.

A node is UP (idle or busy), going DOWN, DOWN (asleep or off, by the
manager's mode) or BOOTING. Watts per state come from a `NodeModel`;
boot and shutdown durations are drawn per node from a seeded distribution
so that learning each node's boot time matters, as it does on real hosts.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Mapping, Optional

# Node states (small ints: the engine touches them millions of times).
#: HELD: up and allocated to a job that waits for its other nodes to boot (Slurm).
IDLE, BUSY, SHUTTING, DOWN, BOOTING, HELD = range(6)
STATE_NAMES = ("idle", "busy", "shutting_down", "down", "booting", "held")


@dataclass(frozen=True)
class NodeModel:
    """Watts and seconds of one node type; ``down_watts`` is off or asleep by mode.

    The watts are ASSUMED round figures for a dual-socket CPU node at the
    wall (no single measured machine stands behind them); give your own with
    ``--node-power`` or the hook config's ``node_power``. ``shutdown_seconds``
    is 30 s, Slurm's default SuspendTimeout, so every manager's node goes
    down in the time Slurm would wait for it.

    ``boot_seconds`` is the mean boot time and ``boot_spread`` the fraction
    by which a node's own boot time may differ from it (uniform, per node),
    ``boot_noise`` the extra random fraction of each single boot.
    ``power_on_seconds`` is how long after a power-on or wake command the
    node's BMC reports it on (ASSUMED: a BMC reports PowerState On once the
    chassis has power, while the operating system boots for minutes).
    """

    name: str = "cpu"
    busy_watts: float = 450.0
    idle_watts: float = 250.0
    sleep_watts: float = 90.0
    off_watts: float = 10.0
    boot_watts: float = 300.0
    boot_seconds: float = 300.0
    boot_spread: float = 0.5
    boot_noise: float = 0.05
    wake_seconds: float = 30.0
    shutdown_seconds: float = 30.0
    sleep_seconds: float = 10.0
    power_on_seconds: float = 10.0

    def with_overrides(self, values: Mapping[str, Any]) -> "NodeModel":
        """A copy with the fields named in ``values`` replaced (unknown names refused)."""
        known = set(self.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError("unknown node model field(s): %s (known: %s)"
                             % (", ".join(unknown), ", ".join(sorted(known))))
        return replace(self, **{k: (v if k == "name" else float(v)) for k, v in values.items()})


#: ASSUMED defaults for a dual-socket CPU node and a 4-GPU node (watts at the wall).
NODE_MODELS: Dict[str, NodeModel] = {
    "cpu": NodeModel(),
    "gpu": NodeModel(name="gpu", busy_watts=2400.0, idle_watts=600.0, sleep_watts=150.0,
                     off_watts=15.0, boot_watts=700.0, boot_seconds=420.0,
                     wake_seconds=45.0, shutdown_seconds=90.0),
}


class Node:
    """One simulated node; plain attributes for speed."""

    __slots__ = ("idx", "name", "state", "boot_s", "job", "marked", "idle_since",
                 "changed", "down_since", "downs", "failed", "pending_up")

    def __init__(self, idx: int, name: str, boot_s: float):
        self.idx = idx
        self.name = name
        self.state = IDLE
        self.boot_s = boot_s
        self.job: Optional[int] = None
        self.marked = False          # PBS sleep mark: not schedulable
        self.idle_since = 0.0
        self.changed = 0.0           # last scheduler-visible state change
        self.down_since: Optional[float] = None
        self.downs = 0               # power cycles (times taken down)
        self.failed = False
        self.pending_up = False      # power up as soon as the shutdown ends


def make_nodes(count: int, model: NodeModel, seed: int = 1,
               prefix: str = "n") -> List[Node]:
    """``count`` nodes named ``n00001``...; each gets its own mean boot time."""
    rng = random.Random(seed)
    width = max(5, len(str(count)))
    nodes = []
    for i in range(count):
        own = model.boot_seconds * (1.0 + model.boot_spread * (2.0 * rng.random() - 1.0))
        nodes.append(Node(i, "%s%0*d" % (prefix, width, i + 1), max(1.0, own)))
    return nodes


def watts_by_state(model: NodeModel, sleep_mode: bool) -> List[float]:
    """Watts per state index; DOWN draws sleep or off watts by mode."""
    down = model.sleep_watts if sleep_mode else model.off_watts
    return [model.idle_watts, model.busy_watts, model.idle_watts, down, model.boot_watts,
            model.idle_watts]
