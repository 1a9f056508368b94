"""Plan a resource-group change within the power budget.

Given the topology and what is allocated now, decide each entity's policy
and watts: the effective policy (entity > group > topology) when it fits
every domain; otherwise, for a non-strict request, the next lower topology
policy for the whole group until it fits; with ``allow_reprovision``, first
lower other active groups (lowest priority first, most recently activated
first, never below their floor; ``dpm_enable=false`` groups are never
touched). The plan is plain JSON-able data the store keeps with the
operation, so a worker process can carry it out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from . import budget
from .execute import HostOutcome
from pbs_power._records import evolve
from .store import GroupRow, MemberRow


class PlanError(Exception):
    """The change cannot be made; the message says why (domains and watts)."""


@dataclass
class Plan:
    """What to reserve now and which device requests to send."""

    #: entity -> {"group", "kind", "policy_name", "watts"} (JSON-able)
    requests: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    #: entity -> [policy_name, watts] it had before (kept if its device fails)
    fallback: Dict[str, List[Any]] = field(default_factory=dict)
    reserved: List[MemberRow] = field(default_factory=list)
    lowered_groups: List[List[MemberRow]] = field(default_factory=list)
    refused: Dict[str, HostOutcome] = field(default_factory=dict)
    note: str = ""


class Planner:
    """Budget-aware planning over one topology and the store's allocations."""

    def __init__(self, topology, store):
        self.topo = topology
        self.store = store

    def effective(self, member: MemberRow, group_policy: Optional[str]):
        """Entity policy, else group policy, else topology policy (or None)."""
        name = member.policy or group_policy
        return self.topo.policies[name] if name else self.topo.topology_policy(member.entity)

    # -- activation ------------------------------------------------------------
    def activation(self, group: GroupRow, members: Sequence[MemberRow], strict: bool,
                   allow_reprovision: bool) -> Plan:
        """The highest policy level that fits, lowering other groups only if that gets it."""
        topo = self.topo
        entities = [m.entity for m in members]
        alloc = {e: m.applied_watts for e, m in self.store.allocations().items()}
        wanted = {m.entity: self.effective(m, group.policy) for m in members}
        before = {e: topo.node_watts(e, topo.topology_policy(e)) for e in entities}
        chosen, lowered, first_over = self._highest_fit(group, entities, wanted, alloc, before,
                                                        strict, allow_reprovision)
        plan = Plan(fallback={e: [None, None] for e in entities})
        notes = []
        for name, rows in lowered.items():
            plan.lowered_groups.append(rows)
            for m in rows:
                plan.requests[m.entity] = {"group": name, "kind": "resource_group_update",
                                           "policy_name": m.applied_policy,
                                           "watts": m.applied_watts}
            notes.append("lowered %s to %s to make room" % (name, rows[0].applied_policy))
        if chosen is not wanted:
            notes.append("requested %s does not fit (%s); applied %s" % (
                _names(wanted), budget.describe(first_over), _names(chosen)))
        for m in members:
            policy = chosen[m.entity]
            watts = topo.node_watts(m.entity, policy)
            name = policy.name if policy is not None else None
            plan.requests[m.entity] = {"group": group.name, "kind": "resource_group_activate",
                                       "policy_name": name, "watts": watts}
            plan.reserved.append(evolve(m, applied_policy=name, applied_watts=watts))
        plan.note = "; ".join(notes)
        return plan

    def _highest_fit(self, group, entities, wanted, alloc, before, strict, allow_reprovision):
        """(policies, lowered groups, first overruns): the first level, top down, that fits.

        Each level is tried as it is, then (if allowed) with other groups
        lowered; strict allows only the requested level.
        """
        current, first_over = wanted, []
        usage_now = budget.usage(self.topo, alloc)
        while True:
            over = budget.overruns(self.topo, usage_now, before,
                                   budget.watts_of(self.topo, current))
            if not over:
                return current, {}, first_over
            if allow_reprovision:
                left, lowered = self._reprovision(group, dict(alloc), before, current)
                if not left:
                    return current, lowered, first_over
            first_over = first_over or over
            stepped = None if strict else budget.step_down(self.topo, entities, current)
            if stepped is None:
                raise PlanError("does not fit the power budget%s: %s" % (
                    " (strict)" if strict else " even at the lowest policy",
                    budget.describe(first_over)))
            current = stepped

    def _fit_by_stepping_down(self, entities, wanted, alloc, before, over):
        chosen = wanted
        current = budget.usage(self.topo, alloc) if over else None
        while over:
            stepped = budget.step_down(self.topo, entities, chosen)
            if stepped is None:
                raise PlanError("does not fit the power budget even at the lowest policy: "
                                + budget.describe(over))
            chosen = stepped
            over = budget.overruns(self.topo, current, before,
                                   budget.watts_of(self.topo, chosen))
        return chosen

    def _reprovision(self, group: GroupRow, alloc: Dict[str, float],
                     before: Mapping[str, float], wanted: Mapping[str, Any]
                     ) -> Tuple[List[Any], Dict[str, List[MemberRow]]]:
        """Lower other groups' policies until ``wanted`` fits, or they hit their floor.

        A group is lowered only while a domain over budget contains one of its
        nodes: lowering it could not help any other domain.
        """
        topo = self.topo
        new_watts = budget.watts_of(topo, wanted)
        others = [g for g in self.store.groups(active_only=True)
                  if g.name != group.name and g.dpm_enable]
        others.sort(key=lambda g: (g.priority, -(g.activated or 0.0), g.name))
        lowered: Dict[str, List[MemberRow]] = {}
        over = budget.overruns(topo, budget.usage(topo, alloc), before, new_watts)
        for other in others:
            rows = [m for m in self.store.members(other.name) if m.state == "active"]
            floor = self._floor(other, rows)
            policies = {m.entity: topo.policies.get(m.applied_policy) if m.applied_policy
                        else None for m in rows}
            domains = {d for m in rows for d in topo.domain_chain(m.entity)}
            while rows and any(o.domain in domains for o in over):
                stepped = budget.step_down(topo, list(policies), policies)
                if stepped is None or any(topo.node_watts(e, p) < floor[e] - 1e-6
                                          for e, p in stepped.items()):
                    break
                policies = stepped
                for e, p in stepped.items():
                    alloc[e] = topo.node_watts(e, p)
                lowered[other.name] = [evolve(m, applied_policy=policies[m.entity].name,
                                               applied_watts=alloc[m.entity]) for m in rows]
                over = budget.overruns(topo, budget.usage(topo, alloc), before, new_watts)
            if not over:
                break
        return over, lowered

    def _floor(self, group: GroupRow, rows: Sequence[MemberRow]) -> Dict[str, float]:
        """Watts below which a group is never lowered: its min_policy, else the lowest."""
        name = group.properties.get("min_policy")
        floor_policy = self.topo.policies.get(name) if isinstance(name, str) else None
        out = {}
        for m in rows:
            if floor_policy is not None:
                out[m.entity] = self.topo.node_watts(m.entity, floor_policy)
            else:
                ladder = self.topo.policies_by_node_watts(m.entity)
                out[m.entity] = self.topo.node_watts(m.entity, ladder[-1]) if ladder else 0.0
        return out

    # -- changes to an active group ----------------------------------------------
    def change(self, group: GroupRow, members: Sequence[MemberRow], strict: bool,
               per_entity: bool = False) -> Plan:
        """Re-plan an active group after its group or entity policies changed.

        ``per_entity`` (update resources): each entity that does not fit is
        refused on its own; otherwise the group steps down as a whole unless
        strict.
        """
        topo = self.topo
        alloc = {e: m.applied_watts for e, m in self.store.allocations().items()}
        active = [m for m in members if m.state == "active"]
        wanted = {m.entity: self.effective(m, group.policy) for m in active}
        changed = [m for m in active
                   if (wanted[m.entity].name if wanted[m.entity] else None) != m.applied_policy]
        plan = Plan(fallback={m.entity: [m.applied_policy, m.applied_watts] for m in changed})
        before = {m.entity: m.applied_watts or 0.0 for m in changed}
        current = budget.usage(topo, alloc)
        target = {m.entity: wanted[m.entity] for m in changed}
        if per_entity:
            target = self._fit_each(target, before, current, plan)
        else:
            over = budget.overruns(topo, current, before, budget.watts_of(topo, target))
            if over and strict:
                raise PlanError("does not fit the power budget (strict): "
                                + budget.describe(over))
            chosen = self._fit_by_stepping_down(list(target), target, alloc, before, over)
            if chosen is not target:
                plan.note = "requested %s does not fit (%s); applied %s" % (
                    _names(target), budget.describe(over), _names(chosen))
            target = chosen
        by_entity = {m.entity: m for m in changed}
        for e, policy in target.items():
            watts = topo.node_watts(e, policy)
            name = policy.name if policy is not None else None
            plan.requests[e] = {"group": group.name, "kind": "resource_group_update",
                                "policy_name": name, "watts": watts}
            plan.reserved.append(evolve(by_entity[e], applied_policy=name,
                                         applied_watts=max(watts, before[e])))
        return plan

    def _fit_each(self, target, before, current, plan: Plan):
        kept = {}
        for e, policy in target.items():
            watts = self.topo.node_watts(e, policy)
            over = budget.overruns(self.topo, current, {e: before[e]}, {e: watts})
            if over:
                plan.refused[e] = HostOutcome(False, "does not fit the power budget: "
                                              + budget.describe(over))
                continue
            for d in self.topo.domain_chain(e):
                current[d] += watts - before[e]
            kept[e] = policy
        return kept


def build_requests(topo, planned: Mapping[str, Mapping[str, Any]], timeout: Optional[float],
                   make: Callable[..., Any]) -> List[Any]:
    """Device requests for a stored plan (``make`` builds one DeviceRequest)."""
    out = []
    for entity, r in planned.items():
        policy = topo.policies.get(r["policy_name"]) if r["policy_name"] else None
        fallback = policy if policy is not None else topo.topology_policy(entity)
        payload = {"resource_group": r["group"],
                   "policy": {"policy_action": "set" if policy is not None else "unset",
                              "policy": None if fallback is None else fallback.to_dict()},
                   "gpu_policies": None}
        out.append(make(topo, entity, r["kind"], payload, timeout))
    return out


def _names(policies: Mapping[str, Any]) -> str:
    names = sorted({p.name if p is not None else "uncapped" for p in policies.values()})
    return "/".join(names)


__all__ = ["Plan", "Planner", "PlanError", "build_requests", "Sequence"]
