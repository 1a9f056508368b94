"""The topology's model: entities (nodes) with device specs, power domains with budgets, policies.

Plain frozen dataclasses and the lookups the service needs; reading and checking a
topology file is `pbs_power.groups.topology`'s business.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from pbs_power.groups.policy import PolicyElementType, PolicyError, PolicyObject, parse_policy


class TopologyError(ValueError):
    """A topology that cannot be used, with every problem found (``path: message`` each)."""

    def __init__(self, problems: Union[str, Sequence[str]], source: Optional[str] = None):
        self.problems: List[str] = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        super().__init__(self.__str__())

    def __str__(self) -> str:
        prefix = "%s: " % self.source if self.source else ""
        return "\n".join(prefix + p for p in self.problems)

    def __reduce__(self):
        return (type(self), (self.problems, self.source))


# -- the model -----------------------------------------------------------------
@dataclass(frozen=True)
class GPUSpec:
    """GPUs per node and the power-limit range of one GPU."""

    count: int
    min_watts: float
    max_watts: float
    default_watts: float


@dataclass(frozen=True)
class RangeSpec:
    """A component's power range (CPU, memory)."""

    min_watts: float
    max_watts: float


@dataclass(frozen=True)
class NodeSpec:
    """A whole node's power: lowest cap, idle draw, uncapped full-load draw."""

    min_watts: float
    idle_watts: float
    max_watts: float


@dataclass(frozen=True)
class DeviceSpec:
    """One kind of device (a node model) and the backend that drives it."""

    name: str
    type: str
    model: str
    node: NodeSpec
    gpu: Optional[GPUSpec]
    cpu: Optional[RangeSpec]
    memory: Optional[RangeSpec]
    backend: str

    @property
    def gpu_count(self) -> int:
        return self.gpu.count if self.gpu is not None else 0

    @property
    def non_gpu_max_watts(self) -> float:
        """Watts left for the rest of the node when every GPU draws its max (>= 0)."""
        gpus = self.gpu.count * self.gpu.max_watts if self.gpu is not None else 0.0
        return max(0.0, self.node.max_watts - gpus)

    def to_dict(self) -> Dict[str, Any]:
        """The spec in the file's form (without its name; absent parts left out)."""
        out: Dict[str, Any] = {"type": self.type, "model": self.model,
                               "node": dataclasses.asdict(self.node)}
        for part in ("gpu", "cpu", "memory"):
            if getattr(self, part) is not None:
                out[part] = dataclasses.asdict(getattr(self, part))
        out["backend"] = self.backend
        return out


@dataclass(frozen=True)
class PowerDomain:
    """A node of the power tree (feed, row, rack ...); budget None is unlimited."""

    name: str
    kind: str
    budget_watts: Optional[float]
    parent: Optional[str]
    children: Tuple[str, ...]


@dataclass(frozen=True)
class Entity:
    """A node: its device spec, the domain it sits in, its own topology policy."""

    name: str
    device: DeviceSpec
    domain: str
    policy: Optional[str]


@dataclass(frozen=True)
class Topology:
    """A validated topology; lookups are precomputed (do not mutate the mappings)."""

    name: str
    device_specs: Mapping[str, DeviceSpec]
    domains: Mapping[str, PowerDomain]
    entities: Mapping[str, Entity]
    policies: Mapping[str, PolicyObject]
    default_policy: Optional[str] = None
    warnings: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        chains: Dict[str, Tuple[str, ...]] = {}
        for name in self.domains:
            chain, at = [name], self.domains[name].parent
            while at is not None and at in self.domains and len(chain) <= len(self.domains):
                chain.append(at)
                at = self.domains[at].parent
            chains[name] = tuple(chain)
        under: Dict[str, List[str]] = {name: [] for name in self.domains}
        for entity in self.entities.values():
            for name in chains.get(entity.domain, ()):
                under[name].append(entity.name)
        object.__setattr__(self, "_chains", chains)
        object.__setattr__(self, "_under", {k: tuple(v) for k, v in under.items()})
        object.__setattr__(self, "_ranked", {})

    def _entity(self, entity: str) -> Entity:
        try:
            return self.entities[entity]
        except KeyError:
            raise KeyError("%r is not an entity of topology %r" % (entity, self.name)) from None

    def domain_chain(self, entity: str) -> Tuple[str, ...]:
        """The entity's domain, then each ancestor up to the root (KeyError if unknown)."""
        return self._chains[self._entity(entity).domain]  # type: ignore[attr-defined]

    def entities_under(self, domain: str) -> Tuple[str, ...]:
        """Entities in ``domain`` or any domain below it, in entity order."""
        try:
            return self._under[domain]  # type: ignore[attr-defined]
        except KeyError:
            raise KeyError("%r is not a power domain of topology %r"
                           % (domain, self.name)) from None

    def topology_policy(self, entity: str) -> Optional[PolicyObject]:
        """The entity's own policy, else the default policy, else None (uncapped)."""
        name = self._entity(entity).policy or self.default_policy
        return self.policies.get(name) if name is not None else None

    def node_watts(self, entity: str, policy: Optional[PolicyObject]) -> float:
        """Watts the node may draw under ``policy``: its NODE limit, within the node's range.

        No policy (or one without a NODE limit) leaves the node uncapped: max_watts.
        """
        node = self._entity(entity).device.node
        if policy is None:
            return _node_watts(node, None)
        key = (node, policy.name, policy.limit(PolicyElementType.NODE))
        cache = self.__dict__.setdefault("_watts_cache", {})
        found = cache.get(key)
        if found is None:
            found = cache[key] = _node_watts(node, policy)
        return found

    def policies_by_node_watts(self, entity: str) -> Tuple[PolicyObject, ...]:
        """The topology's policies, most node watts for this entity first (ties: by name)."""
        return tuple(p for _w, p in self._ranking(self._entity(entity).device))

    def lower_policy(self, entity: str,
                     policy: Optional[PolicyObject]) -> Optional[PolicyObject]:
        """The topology policy next below ``policy``'s node watts for this entity, or None."""
        device = self._entity(entity).device
        current = _node_watts(device.node, policy)
        return next((p for watts, p in self._ranking(device) if watts < current), None)

    def _ranking(self, device: DeviceSpec) -> Tuple[Tuple[float, PolicyObject], ...]:
        ranked = self._ranked  # type: ignore[attr-defined]  # by NodeSpec: all watts depend on
        found = ranked.get(device.node)
        if found is None:
            pairs = [(_node_watts(device.node, p), p) for p in self.policies.values()]
            found = ranked[device.node] = tuple(sorted(pairs, key=lambda wp: (-wp[0], wp[1].name)))
        return found

    def device_model(self, entity: str) -> Dict[str, Any]:
        """The entity's device as JSON-able data, for device-controller requests."""
        device = self._entity(entity).device
        return dict(_spec_model(device), entity=entity)

    def with_policy(self, policy: PolicyObject) -> "Topology":
        """A copy with one more (valid) policy; TopologyError if the name is taken."""
        if not isinstance(policy, PolicyObject):
            raise TopologyError(["policies: a policy must be a PolicyObject, got %r" % (policy,)])
        if policy.name in self.policies:
            raise TopologyError(["policies: topology %r already has a policy named %r"
                                 % (self.name, policy.name)])
        try:
            parse_policy(policy.to_dict(), "policies[%d]" % len(self.policies))
        except PolicyError as exc:
            raise TopologyError(exc.problems) from None
        return dataclasses.replace(self, policies={**self.policies, policy.name: policy})

    def to_dict(self) -> Dict[str, Any]:
        """The topology in the file's form; ``parse_topology`` gives an equal Topology back."""
        def tree(name: str) -> Dict[str, Any]:
            dom = self.domains[name]
            out = {"name": name, "kind": dom.kind, "budget_watts": dom.budget_watts}
            if dom.children:
                out["children"] = [tree(child) for child in dom.children]
            return out
        return {"name": self.name,
                "device_specs": {n: s.to_dict() for n, s in self.device_specs.items()},
                "power_domains": [tree(n) for n, d in self.domains.items() if d.parent is None],
                "policies": [p.to_dict() for p in self.policies.values()],
                "default_policy": self.default_policy,
                "entities": _entity_entries(list(self.entities.values()))}


def _node_watts(node: NodeSpec, policy: Optional[PolicyObject]) -> float:
    """A policy's NODE limit on ``node``, clamped to [min_watts, max_watts]."""
    limit = policy.limit(PolicyElementType.NODE) if policy is not None else None
    if limit is None:
        return node.max_watts
    return min(max(limit.resolve(node.max_watts), node.min_watts), node.max_watts)


def _entity_entries(entities: List[Entity]) -> List[Dict[str, Any]]:
    """Entries for runs of entities alike, as hostlists that expand back in the same order."""
    out: List[Dict[str, Any]] = []
    start = 0
    for i in range(1, len(entities) + 1):
        if i < len(entities) and _alike(entities[i]) == _alike(entities[start]):
            continue
        first = entities[start]
        for expr in _hostlists([e.name for e in entities[start:i]]):
            entry = {"names": expr, "device": first.device.name, "domain": first.domain}
            if first.policy is not None:
                entry["policy"] = first.policy
            out.append(entry)
        start = i
    return out


def _hostlists(names: List[str]) -> List[str]:
    """Fewest hostlist expressions that expand to ``names`` in this order (NodeSet sorts)."""
    from ClusterShell.NodeSet import NodeSet

    def folded(seg: List[str]) -> Optional[str]:
        expr = seg[0] if len(seg) == 1 else str(NodeSet.fromlist(seg))
        return expr if len(seg) == 1 or list(NodeSet(expr)) == seg else None

    whole = folded(names)
    if whole is not None:
        return [whole]
    rank = {name: i for i, name in enumerate(NodeSet.fromlist(names))}
    cuts = [0] + [i for i in range(1, len(names)) if rank[names[i]] < rank[names[i - 1]]]
    out = []
    for a, b in zip(cuts, cuts[1:] + [len(names)]):
        expr = folded(names[a:b])
        out.extend([expr] if expr is not None else names[a:b])
    return out


def _alike(entity: Entity) -> Tuple[str, str, Optional[str]]:
    return (entity.device.name, entity.domain, entity.policy)


@functools.lru_cache(maxsize=256)
def _spec_model(device: DeviceSpec) -> Dict[str, Any]:
    """A device spec as device-model JSON data (computed once per spec)."""
    part = (lambda x: dataclasses.asdict(x) if x is not None else None)
    return {"device_spec": device.name, "type": device.type, "model": device.model,
            "backend": device.backend, "node": dataclasses.asdict(device.node),
            "gpu": part(device.gpu), "cpu": part(device.cpu), "memory": part(device.memory)}
