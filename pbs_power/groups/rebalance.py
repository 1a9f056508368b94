"""Freed watts flow back: raise what runs below the level it asked for.

After a group ends, is lowered or fails to activate, the ledger may have
room. Groups running below their requested policy (stepped down at
activation, lowered to make room for another, or GPU-limited) are raised,
highest priority first (then the earliest activated), as far as the budget
allows; after them, idle nodes that are waiting below their topology policy
(their group ended when the budget had no room for it). Running work comes
first: an idle node draws its idle watts whatever its cap.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from .apply import DEACTIVATE, UPDATE, Change
from .ledger import Book
from .levels import EPS, Level, gpu_limits, ladder, level_of


def raises(topo, store) -> List[Change]:
    """Changes that raise entities toward what they asked for, most deserving first."""
    book = Book(topo, store)
    out: List[Change] = []
    busy = set()
    groups = sorted((g for g in store.groups() if g.status != "inactive"),
                    key=lambda g: (-g.priority, g.activated or 0.0, g.name))
    for g in groups:
        members = store.members(g.name)
        busy.update(m.entity for m in members)
        if g.status != "active":
            continue
        wanted: Dict[Tuple[Optional[str], str, Optional[str]], Level] = {}
        for m in members:
            if m.state != "active" or m.applied_watts is None:
                continue
            name = m.policy or g.policy
            gpus = gpu_limits(m.gpu_policies)
            entity = topo.entities[m.entity]
            key = (name, entity.device.name, None if name else entity.policy)
            top = wanted.get(key) if gpus is None else None
            if top is None:
                policy = topo.policies[name] if name else topo.topology_policy(m.entity)
                top = level_of(topo, m.entity, policy, gpus)
                if gpus is None:
                    wanted[key] = top
            if top[1] <= m.applied_watts + EPS:
                continue
            held = book.holding(m.entity)
            if held.confirmed and top[1] > held.watts + EPS:
                out.append(Change(m.entity, g.name, UPDATE,
                                  ladder(topo, m.entity, top, gpus, above=held.watts), gpus))
    for entity, held in sorted(book.rows.items()):
        if entity in busy or not held.confirmed:
            continue
        top = level_of(topo, entity, topo.topology_policy(entity))
        if top[1] > held.watts + EPS:
            out.append(Change(entity, None, DEACTIVATE,
                              ladder(topo, entity, top, above=held.watts)))
    return out


__all__ = ["raises"]
