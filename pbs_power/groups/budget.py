"""Power-budget arithmetic over a topology's domain tree. Pure: no I/O.

Every entity counts, in every domain above it, the watts the power ledger
holds for it (see ledger.py), else its topology policy's. A change fits
when no domain on the way up goes over its budget.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Overrun:
    """A domain that would go over budget, and by how much."""

    domain: str
    need_watts: float
    budget_watts: float

    def __str__(self) -> str:
        return "%s needs %.0f W of its %.0f W budget (%.0f W over)" % (
            self.domain, self.need_watts, self.budget_watts,
            self.need_watts - self.budget_watts)


def usage(topology, allocations: Mapping[str, float]) -> Dict[str, float]:
    """Watts allocated per domain, every entity counted in its whole chain.

    ``allocations`` overrides an entity's topology watts (active groups).
    """
    out = {name: 0.0 for name in topology.domains}
    for entity in topology.entities:
        watts = allocations.get(entity)
        if watts is None:
            watts = topology.node_watts(entity, topology.topology_policy(entity))
        for domain in topology.domain_chain(entity):
            out[domain] += watts
    return out


def baseline(topology) -> Dict[str, float]:
    """Watts per domain with every entity at its topology policy (computed once per
    topology object; a copy, so callers may change it)."""
    cache = topology.__dict__.get("_baseline_usage")
    if cache is None:
        cache = topology.__dict__["_baseline_usage"] = usage(topology, {})
    return dict(cache)


def overruns(topology, current: Mapping[str, float], now_watts: Mapping[str, float],
             new_watts: Mapping[str, float]) -> List[Overrun]:
    """Domains over budget if entities move from ``now_watts`` to ``new_watts``."""
    delta: Dict[str, float] = {}
    for entity, watts in new_watts.items():
        change = watts - now_watts.get(entity, 0.0)
        if change:
            for domain in topology.domain_chain(entity):
                delta[domain] = delta.get(domain, 0.0) + change
    out = []
    for domain, change in delta.items():
        budget = topology.domains[domain].budget_watts
        need = current.get(domain, 0.0) + change
        if budget is not None and change > 0 and need > budget + 1e-6:
            out.append(Overrun(domain, need, budget))
    return sorted(out, key=lambda o: o.domain)


def step_down(topology, entities: Sequence[str], policies: Mapping[str, Optional[object]]
              ) -> Optional[Dict[str, object]]:
    """Every entity one topology policy lower, or None when one cannot go lower."""
    lowered = {}
    for entity in entities:
        lower = topology.lower_policy(entity, policies[entity])
        if lower is None:
            return None
        lowered[entity] = lower
    return lowered


def watts_of(topology, policies: Mapping[str, Optional[object]]) -> Dict[str, float]:
    """Node watts each entity may draw under its policy."""
    return {e: topology.node_watts(e, p) for e, p in policies.items()}


def describe(found: Sequence[Overrun]) -> str:
    """One line for a diagnostic: every domain over budget."""
    return "; ".join(str(o) for o in found)


__all__: Tuple[str, ...] = ("Overrun", "usage", "baseline", "overruns", "step_down", "watts_of", "describe")
