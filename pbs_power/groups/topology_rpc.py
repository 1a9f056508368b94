"""Topology RPCs of the resource-group service: import, activate, policies.

A mixin of `ResourceGroupService`. The topology is stored as JSON in the
service's database; activating it applies each entity's topology policy
through the device controller.
"""
from __future__ import annotations

from .policy import PolicyObject
from .types import Response, Status, fail, outcomes_of, policy_dict


class TopologyMixin:
    """Topology import/activation and policy creation for ResourceGroupService."""

    def topology(self):
        """(Topology or None, active?) as stored."""
        from .topology import parse_topology
        stamp, active = self.store.topology_stamp()
        if stamp is None:
            return None, False
        cached_stamp, cached = self._topology_cache
        if cached is not None and cached_stamp == stamp:
            return cached, active
        doc, active = self.store.topology_doc()
        topo = parse_topology(doc, "stored topology", trusted=True)
        self._topology_cache = (stamp, topo)
        return topo, active

    def import_topology(self, topology) -> Status:
        """Store ``topology`` (inactive); refused while any resource group exists."""
        with self.store.transaction():
            if self.store.groups():
                return Status(False, "resource groups exist; delete them before importing "
                                     "a new topology", "failed")
            self.store.put_topology(topology.to_dict(), False, self.clock())
        return Status(True, "topology %s imported (%d entities); activate it next"
                      % (topology.name, len(topology.entities)))

    def set_topology_active(self, active: bool) -> Response:
        """Activate (apply topology policies to every entity) or deactivate."""
        topo, is_active = self.topology()
        if topo is None:
            return fail("no topology: import one first", "invalid")
        if any(g.status != "inactive" for g in self.store.groups()):
            return fail("active resource groups exist; delete them first")
        kind = "topology_activate" if active else "topology_deactivate"
        # an entity with no topology policy runs uncapped: "unset", never "set" nothing
        requests = [self._request(topo, e, kind, {
            "policy_action": "set" if active and topo.topology_policy(e) else "unset",
            "policy": policy_dict(topo.topology_policy(e))}) for e in topo.entities]
        outcomes = outcomes_of(self.controller.send(requests))
        failed = sorted(e for e, o in outcomes.items() if not o.ok)
        if active and topo.entities and len(failed) == len(topo.entities):
            return Response(Status(False, "topology %s not activated: every device failed "
                                   "(%s)" % (topo.name, outcomes[failed[0]].diag_msg)),
                            outcomes)
        with self.store.transaction():
            self.store.put_topology(topo.to_dict(), active, self.clock())
            if active:
                _book_topology(topo, self.store, outcomes)
        msg = "topology %s %s" % (topo.name, "active" if active else "inactive")
        if failed:
            return Response(Status(False, "%s, but %d device(s) failed: %s"
                                   % (msg, len(failed), ", ".join(failed[:10]))), outcomes)
        return Response(Status(True, msg), outcomes)

    def create_policy(self, policy: PolicyObject) -> Status:
        """Add a policy to the stored topology (names are unique)."""
        from .topology import TopologyError
        with self.store.transaction():
            topo, active = self.topology()
            if topo is None:
                return Status(False, "no topology: import one first", "invalid")
            try:
                topo = topo.with_policy(policy)
            except TopologyError as exc:
                return Status(False, str(exc), "invalid")
            self.store.put_topology(topo.to_dict(), active, self.clock())
        return Status(True, "policy %s created" % policy.name)


def _book_topology(topo, store, outcomes) -> None:
    """The ledger after topology activation: confirmed where the device took it."""
    from .ledger import Book
    book = Book(topo, store)
    for entity, outcome in outcomes.items():
        policy = topo.topology_policy(entity)
        watts = topo.node_watts(entity, policy)
        if outcome.ok:
            book.confirm(entity, watts, policy.name if policy is not None else None)
        else:
            book.reserve_anyway(entity, watts)
    book.flush()
