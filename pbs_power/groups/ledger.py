"""The power ledger: the one account of what each entity counts against the budget.

An entity counts the watts its device was last told and confirmed. While a
request is out, failed or timed out, it counts the higher of its old and new
watts (``told`` keeps the new value) until a later answer confirms one. An
entity with no row runs its topology policy, confirmed. Every change of a
device's limit reserves here first, inside the store's transaction, and only
when no power domain above the entity goes over budget; that is how the
budget holds whatever order activations, updates and deletions come in.
One request at a time per entity: while a process has one in flight
(``sender``, a live pid) no other may reserve that entity, since the device
would end at whichever request reached it last.
"""
from __future__ import annotations

from dataclasses import dataclass
import os
from typing import Dict, List, Mapping, Optional

from . import budget
from .execute import process_alive
from .levels import EPS, topology_level


@dataclass(frozen=True)
class Holding:
    """One entity's entry: watts counted, confirmed policy, unconfirmed request."""

    entity: str
    watts: float
    policy: Optional[str] = None
    told: Optional[float] = None
    sender: Optional[int] = None      # pid whose request is in flight

    @property
    def confirmed(self) -> bool:
        return self.told is None


class Book:
    """The ledger as read inside one transaction, with per-domain usage kept current."""

    def __init__(self, topo, store):
        self.topo = topo
        self.store = store
        self.rows: Dict[str, Holding] = {r.entity: r for r in
                                         (Holding(*row) for row in store.ledger_rows())
                                         if r.entity in topo.entities}
        self._dirty: Dict[str, Optional[Holding]] = {}    # written by flush()
        self.usage = budget.baseline(topo)
        for e, h in self.rows.items():
            delta = h.watts - topology_level(topo, e)[1]
            if delta:
                for d in topo.domain_chain(e):
                    self.usage[d] += delta

    def holding(self, entity: str) -> Holding:
        """The entity's entry (its topology level when it has none)."""
        found = self.rows.get(entity)
        if found is not None:
            return found
        name, watts = topology_level(self.topo, entity)
        return Holding(entity, watts, name)

    def counted(self, entity: str) -> float:
        return self.holding(entity).watts

    def overruns(self, moves: Mapping[str, float]) -> List[budget.Overrun]:
        """Domains over budget if each entity in ``moves`` counted those watts instead."""
        now = {e: self.counted(e) for e in moves}
        return budget.overruns(self.topo, self.usage, now, moves)

    def reserve(self, entity: str, watts: float) -> str:
        """Tell ``entity`` ``watts``: count max(old, new) if that fits; else why not."""
        held = self.holding(entity)
        if held.sender not in (None, os.getpid()) and process_alive(held.sender):
            return "busy: a request of pid %d to %s is in flight" % (held.sender, entity)
        counted = max(held.watts, watts)
        over = self.overruns({entity: counted})
        if over:
            return "does not fit the power budget: " + budget.describe(over)
        self._put(Holding(entity, counted, held.policy, watts, os.getpid()))
        return ""

    def reserve_anyway(self, entity: str, watts: float) -> None:
        """Count a request that went out without a budget check (topology activation)."""
        held = self.holding(entity)
        self._put(Holding(entity, max(held.watts, watts), held.policy, watts))

    def confirm(self, entity: str, watts: float, policy: Optional[str]) -> None:
        """The device took ``watts``: count exactly that from now on."""
        self._put(Holding(entity, watts, policy, None))

    def unanswered(self, entity: str) -> None:
        """The request failed or timed out: still counted high, no longer in flight."""
        held = self.holding(entity)
        self._put(Holding(entity, held.watts, held.policy, held.told, None))

    def _put(self, new: Holding) -> None:
        old = self.counted(new.entity)
        if abs(new.watts - old) > EPS:
            for d in self.topo.domain_chain(new.entity):
                self.usage[d] += new.watts - old
        name, watts = topology_level(self.topo, new.entity)
        at_topology = (new.told is None and new.policy == name and
                       abs(new.watts - watts) <= EPS)
        if at_topology:
            self.rows.pop(new.entity, None)
            self._dirty[new.entity] = None
        else:
            self.rows[new.entity] = self._dirty[new.entity] = new

    def flush(self) -> None:
        """Write the entries changed since the last flush (in the caller's transaction)."""
        self.store.drop_ledger([e for e, h in self._dirty.items() if h is None])
        self.store.put_ledger([(h.entity, h.watts, h.policy, h.told, h.sender)
                               for h in self._dirty.values() if h is not None])
        self._dirty = {}


def domain_usage(topo, store) -> Dict[str, float]:
    """Watts counted per power domain now (read in the caller's transaction)."""
    return Book(topo, store).usage


__all__ = ["Holding", "Book", "domain_usage"]
