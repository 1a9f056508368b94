"""The budget invariants of the resource-group service, checked from its store.

Per power domain: watts counted <= budget, and device caps summed <= budget.
Per entity: the simulated device's cap <= what the ledger counts; an entity
the ledger holds as confirmed counts exactly its device's cap, and runs the
policy (and GPU limits) its group or the topology says it runs.
"""
import json

from pbs_power.groups.ledger import Book

EPS = 1e-6


def violations(svc):
    """Every broken invariant, as readable lines (empty when all hold)."""
    topo, _active = svc.topology()
    store = svc.store
    with store.transaction():
        book = Book(topo, store)
        states = store.get_device_states(list(topo.entities))
        members = {}
        for g in store.groups():
            for m in store.members(g.name):
                members[m.entity] = (g, m)
    out = []
    caps = {}
    for e in topo.entities:
        state = json.loads(states[e]) if e in states else None
        if state is None:
            out.append("%s: no device state" % e)
            continue
        caps[e] = state["node_cap_watts"]
        held = book.holding(e)
        if caps[e] > held.watts + EPS:
            out.append("%s: device cap %.0f W above the %.0f W counted" % (e, caps[e], held.watts))
        if not held.confirmed:
            continue
        if abs(caps[e] - held.watts) > EPS:
            out.append("%s: confirmed at %.0f W but the device has %.0f W"
                       % (e, held.watts, caps[e]))
        if state.get("policy") != held.policy:
            out.append("%s: confirmed policy %s but the device runs %s"
                       % (e, held.policy, state.get("policy")))
        group, member = members.get(e, (None, None))
        if group is not None and group.status == "active" and member.state == "active":
            if member.applied_policy != held.policy or abs(member.applied_watts - held.watts) > EPS:
                out.append("%s: member says %s/%s, ledger %s/%s" % (
                    e, member.applied_policy, member.applied_watts, held.policy, held.watts))
            if member.gpu_policies:
                wanted = {int(k): v for k, v in json.loads(member.gpu_policies).items()}
                got = {int(k): v for k, v in state.get("gpu_caps", {}).items()}
                if any(abs(got.get(k, -1) - v) > EPS for k, v in wanted.items()):
                    out.append("%s: GPU limits %s booked, device has %s" % (e, wanted, got))
    for name, dom in topo.domains.items():
        if dom.budget_watts is None:
            continue
        if book.usage[name] > dom.budget_watts + EPS:
            out.append("%s: %.0f W counted over its %.0f W budget"
                       % (name, book.usage[name], dom.budget_watts))
        on_devices = sum(caps.get(e, 0.0) for e in topo.entities_under(name))
        if on_devices > dom.budget_watts + EPS:
            out.append("%s: devices capped at %.0f W over its %.0f W budget"
                       % (name, on_devices, dom.budget_watts))
    return out
