"""Plan a resource-group change within the power budget, as ledger `Change`s.

Given the topology and the ledger, decide each entity's level: the effective
policy (entity > group > topology) when it fits every domain; otherwise, for
a non-strict request, one topology policy lower for the entities in the
domains that are short, until it fits. With ``allow_reprovision`` other
active groups are lowered first, only in the short domains: lowest priority
first, most recently activated first, never a group of higher priority than
the requester's, never below their floor (``min_policy``), never a
``dpm_enable=false`` group. The plan is plain JSON-able data the store keeps
with the operation, so a worker process can carry it out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import budget
from .apply import ACTIVATE, DEACTIVATE, UPDATE, Change
from .execute import HostOutcome
from .ledger import Book
from .levels import EPS, gpu_limits, ladder, level_of, names, step_down
from .store import GroupRow, MemberRow


class PlanError(Exception):
    """The change cannot be made; the message says why (domains and watts)."""


@dataclass
class Plan:
    """The changes to carry out, in order (lowerings of other groups first)."""

    changes: List[Change] = field(default_factory=list)
    refused: Dict[str, HostOutcome] = field(default_factory=dict)
    note: str = ""


class Planner:
    """Budget-aware planning over one topology and the ledger (read in a transaction)."""

    def __init__(self, topology, store):
        self.topo = topology
        self.store = store
        self.book = Book(topology, store)

    def effective(self, member: MemberRow, group_policy: Optional[str]):
        """Entity policy, else group policy, else topology policy (or None)."""
        name = member.policy or group_policy
        return self.topo.policies[name] if name else self.topo.topology_policy(member.entity)

    def wanted_level(self, member: MemberRow, group_policy: Optional[str]):
        return level_of(self.topo, member.entity, self.effective(member, group_policy),
                        gpu_limits(member.gpu_policies))

    # -- activation ------------------------------------------------------------
    def activation(self, group: GroupRow, members: Sequence[MemberRow], strict: bool,
                   allow_reprovision: bool) -> Plan:
        """The highest levels that fit, lowering other groups only if that gets them."""
        wanted = {m.entity: self.effective(m, group.policy) for m in members}
        current, first_over = wanted, []
        while True:
            moves = self._watts(current)
            over = self.book.overruns(moves)
            lowered: Dict[str, Dict[str, Any]] = {}
            if not over:
                break
            if allow_reprovision:
                lowered, left = self._reprovision(group, moves)
                if not left:
                    break
            first_over = first_over or over
            stepped = None if strict else step_down(self.topo, current,
                                                    [o.domain for o in over])
            if stepped is None:
                raise PlanError("does not fit the power budget%s: %s" % (
                    " (strict)" if strict else " even at the lowest policy",
                    budget.describe(first_over)))
            current = stepped
        plan, notes = Plan(), []
        for name, policies in lowered.items():
            for entity, (policy, gpus) in policies.items():
                plan.changes.append(Change(entity, name, UPDATE,
                                           (level_of(self.topo, entity, policy, gpus),), gpus))
            notes.append("lowered %s to %s to make room" % (
                name, names({e: p for e, (p, _g) in policies.items()})))
        if current is not wanted:
            notes.append("requested %s does not fit (%s); applied %s" % (
                names(wanted), budget.describe(first_over), names(current)))
        for m in members:
            top = level_of(self.topo, m.entity, current[m.entity])
            steps = (top,) if strict else ladder(self.topo, m.entity, top)
            plan.changes.append(Change(m.entity, group.name, ACTIVATE, steps))
        plan.note = "; ".join(notes)
        return plan

    def _watts(self, policies: Mapping[str, Any], gpus: Optional[Mapping[str, Any]] = None
               ) -> Dict[str, float]:
        gpus = gpus or {}
        return {e: level_of(self.topo, e, p, gpus.get(e))[1] for e, p in policies.items()}

    def _reprovision(self, group: GroupRow, moves: Dict[str, float]
                     ) -> Tuple[Dict[str, Dict[str, Any]], List[budget.Overrun]]:
        """Lower other groups in the short domains until ``moves`` fit, or none can give."""
        topo = self.topo
        others = [g for g in self.store.groups(active_only=True)
                  if g.name != group.name and g.dpm_enable and g.priority <= group.priority]
        others.sort(key=lambda g: (g.priority, -(g.activated or 0.0), g.name))
        moves = dict(moves)
        lowered: Dict[str, Dict[str, Any]] = {}
        over = self.book.overruns(moves)
        for other in others:
            rows = [m for m in self.store.members(other.name)
                    if m.state == "active" and self.book.holding(m.entity).confirmed]
            gpus = {m.entity: gpu_limits(m.gpu_policies) for m in rows}
            policies = {m.entity: topo.policies.get(m.applied_policy) if m.applied_policy
                        else None for m in rows}
            floor = self._floor(other, rows)
            while over:
                stepped = step_down(topo, policies, [o.domain for o in over], gpus, floor)
                if stepped is None:
                    break
                policies = stepped
                moves.update(self._watts(policies, gpus))
                lowered[other.name] = {e: (p, gpus[e]) for e, p in policies.items()
                                       if moves[e] < self.book.counted(e) - EPS}
                over = self.book.overruns(moves)
            if not over:
                break
        return {k: v for k, v in lowered.items() if v}, over

    def _floor(self, group: GroupRow, rows: Sequence[MemberRow]) -> Dict[str, float]:
        """Watts below which a group is never lowered: its min_policy, else none."""
        name = group.properties.get("min_policy")
        floor_policy = self.topo.policies.get(name) if isinstance(name, str) else None
        if floor_policy is None:
            return {}
        return {m.entity: self.topo.node_watts(m.entity, floor_policy) for m in rows}

    # -- changes to an active group ----------------------------------------------
    def change(self, group: GroupRow, members: Sequence[MemberRow], strict: bool,
               per_entity: bool = False) -> Plan:
        """Re-plan an active group after its group or entity policies changed.

        ``per_entity`` (update resources): each entity that does not fit is
        refused on its own; otherwise the entities in short domains step down
        unless strict. GPU limits stay set, and keep the node limit up.
        """
        topo = self.topo
        live = [m for m in members if m.state in ("active", "failed")]
        gpus = {m.entity: gpu_limits(m.gpu_policies) for m in live}
        wanted = {m.entity: self.effective(m, group.policy) for m in live}
        changed = {}
        for m in live:
            name, watts = level_of(topo, m.entity, wanted[m.entity], gpus[m.entity])
            held = self.book.holding(m.entity)
            if (name, watts) != (m.applied_policy, held.watts) or not held.confirmed \
                    or m.state != "active":
                changed[m.entity] = wanted[m.entity]
        plan = Plan()
        if per_entity:
            changed = self._fit_each(changed, gpus, plan)
        else:
            over = self.book.overruns(self._watts(changed, gpus))
            if over and strict:
                raise PlanError("does not fit the power budget (strict): "
                                + budget.describe(over))
            chosen, first_over = changed, over
            while over:
                chosen = step_down(topo, chosen, [o.domain for o in over], gpus)
                if chosen is None:
                    raise PlanError("does not fit the power budget even at the lowest policy: "
                                    + budget.describe(first_over))
                over = self.book.overruns(self._watts(chosen, gpus))
            if chosen is not changed:
                plan.note = "requested %s does not fit (%s); applied %s" % (
                    names(changed), budget.describe(first_over), names(chosen))
            changed = chosen
        for e, policy in changed.items():
            top = level_of(topo, e, policy, gpus[e])
            steps = (top,) if strict or per_entity else ladder(topo, e, top, gpus[e])
            plan.changes.append(Change(e, group.name, UPDATE, steps, gpus[e]))
        return plan

    def _fit_each(self, target, gpus, plan: Plan):
        kept, moves = {}, {}
        for e, policy in target.items():
            watts = level_of(self.topo, e, policy, gpus[e])[1]
            over = self.book.overruns(dict(moves, **{e: watts}))
            if over:
                plan.refused[e] = HostOutcome(False, "does not fit the power budget: "
                                              + budget.describe(over))
                continue
            moves[e] = watts
            kept[e] = policy
        return kept

    # -- ending a group ----------------------------------------------------------
    def restore(self, group_name: str, entities: Sequence[str]) -> List[Change]:
        """Changes that send entities back to their topology policy, never higher than
        they count now: one below it waits at its level, and is raised when the freed
        watts flow back (running groups first, see rebalance)."""
        out = []
        for e in entities:
            if e in self.topo.entities:
                top = level_of(self.topo, e, self.topo.topology_policy(e))
                held = self.book.counted(e)
                steps = ladder(self.topo, e, top)
                fits = tuple(level for level in steps if level[1] <= held + EPS)
                out.append(Change(e, group_name, DEACTIVATE, fits or steps[-1:]))
        return out


__all__ = ["Plan", "Planner", "PlanError"]
