"""The hooks every simulated power manager may override, and always-on, which uses none."""
from __future__ import annotations

from typing import List, Optional

from .nodes import Node


class Manager:
    """Does nothing; the hooks every manager may override."""

    name = "always-on"
    scheduler = "pbs"
    sleep_mode = False
    #: PBS: seconds from now at which the scheduler's calendar has a sleeping
    #: vnode up; None (no power_provisioning, as with this package's hook):
    #: never, so a job that needs one gets no start estimate and holds nothing.
    calendar_sleep: Optional[float] = None

    def attach(self, engine) -> None:
        self.engine = engine

    def on_cycle(self, now: float) -> None:
        """A periodic run (only for managers that asked ``engine.every``)."""

    def idle_until(self, now: float) -> float:
        """Until when the periodic runs after this one would do nothing, as long
        as the engine's version stays the same (the engine skips them)."""
        return now

    def on_timer(self, now: float, arg) -> None:
        """A timer the manager set."""

    def on_idle(self, nodes: List[Node], now: float) -> None:
        """Nodes just became idle (their job ended)."""

    def on_allocated_down(self, nodes: List[Node], now: float) -> None:
        """Slurm only: powered-down nodes were allocated to a job."""

    def on_down(self, node: Node, now: float) -> None:
        """A node finished going down."""

    def on_up(self, node: Node, now: float) -> None:
        """A node finished coming up."""


class AlwaysOn(Manager):
    name = "always-on"
