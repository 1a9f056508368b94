"""Power levels of one entity: a policy and the node watts it gives. Pure: no I/O.

A level is ``(policy name or None, watts)``. An entity with GPU limits set
needs at least the watts its GPUs and the rest of the node draw, so its
level never goes below that (``gpu_need``). Ladders list the levels an
entity may take, best first; step-down lowers only entities in the power
domains that are short.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from .policy import PolicyElementType, PolicyObject

if TYPE_CHECKING:
    from .gpu_policy import GPUPolicies

Level = Tuple[Optional[str], float]
EPS = 1e-6


def gpu_limits(text: Optional[str]) -> Optional[Dict[str, float]]:
    """The stored GPU limits of a member (``{"0": watts, ...}``), or None."""
    if not text:
        return None
    return {str(k): float(v) for k, v in json.loads(text).items()}


def gpu_need(topo, entity: str, gpus: Optional[Mapping[str, float]]) -> float:
    """Node watts the GPU limits need: the rest of the node at its max plus every GPU."""
    if not gpus:
        return 0.0
    return topo.entities[entity].device.non_gpu_max_watts + sum(gpus.values())


def level_of(topo, entity: str, policy: Optional[PolicyObject],
             gpus: Optional[Mapping[str, float]] = None) -> Level:
    """The level ``policy`` gives ``entity``, raised to what its GPU limits need."""
    watts = max(topo.node_watts(entity, policy), gpu_need(topo, entity, gpus))
    return (policy.name if policy is not None else None, watts)


def topology_level(topo, entity: str) -> Level:
    """The level of the entity's topology policy (memoised on the topology object)."""
    cache = topo.__dict__.setdefault("_topology_levels", {})
    found = cache.get(entity)
    if found is None:
        found = cache[entity] = level_of(topo, entity, topo.topology_policy(entity))
    return found


def ladder(topo, entity: str, top: Level, gpus: Optional[Mapping[str, float]] = None,
           above: float = -1.0) -> Tuple[Level, ...]:
    """``top``, then every lower topology policy's level (distinct watts) above ``above``."""
    if gpus:
        return _ladder(topo, entity, top, gpus, above)
    cache = topo.__dict__.setdefault("_ladders", {})
    key = (topo.entities[entity].device.node, top, above)
    found = cache.get(key)
    if found is None:
        found = cache[key] = _ladder(topo, entity, top, None, above)
    return found


def _ladder(topo, entity: str, top: Level, gpus: Optional[Mapping[str, float]],
            above: float) -> Tuple[Level, ...]:
    out: List[Level] = [top]
    for policy in topo.policies_by_node_watts(entity):
        name, watts = level_of(topo, entity, policy, gpus)
        if out[-1][1] - EPS > watts > above + EPS:
            out.append((name, watts))
    return tuple(out)


def step_down(topo, policies: Mapping[str, Optional[PolicyObject]], short: Sequence[str],
              gpus: Optional[Mapping[str, Optional[Mapping[str, float]]]] = None,
              floor: Optional[Mapping[str, float]] = None
              ) -> Optional[Dict[str, Optional[PolicyObject]]]:
    """One policy lower for each entity in a ``short`` domain (not below its floor).

    None when no entity could go lower: the plan has run out of room to give.
    """
    short_set, gpus, floor = set(short), gpus or {}, floor or {}
    out = dict(policies)
    moved = False
    for entity, policy in policies.items():
        if not short_set.intersection(topo.domain_chain(entity)):
            continue
        before = level_of(topo, entity, policy, gpus.get(entity))[1]
        lower = topo.lower_policy(entity, policy)
        while lower is not None:
            watts = level_of(topo, entity, lower, gpus.get(entity))[1]
            if watts < before - EPS:
                break
            lower = topo.lower_policy(entity, lower)
        if lower is None or watts < floor.get(entity, 0.0) - EPS:
            continue
        out[entity] = lower
        moved = True
    return out if moved else None


def names(levels: Mapping[str, Optional[PolicyObject]]) -> str:
    """``High/Med``: the distinct policy names of a plan (``uncapped`` for none)."""
    return "/".join(sorted({p.name if p is not None else "uncapped" for p in levels.values()}))


def plan_gpus(topo, entity: str, node_policy: Optional[PolicyObject],
              wanted: GPUPolicies) -> Tuple[Dict[str, float], Dict[int, str]]:
    """Each GPU's watts and, per GPU, a note when its request was clamped.

    A null limit means the node policy's GPU limit, else the GPU's default.
    Values outside the GPU's range are clamped, and the note says so.
    """
    gpu = topo.entities[entity].device.gpu
    base = node_policy.limit(PolicyElementType.GPU) if node_policy is not None else None
    planned: Dict[str, float] = {}
    notes: Dict[int, str] = {}
    for p in wanted.policies:
        limit = p.power_limit or base
        asked = gpu.default_watts if limit is None else limit.resolve(gpu.max_watts)
        watts = min(max(asked, gpu.min_watts), gpu.max_watts)
        if abs(watts - asked) > EPS:
            notes[p.gpu_id] = ("requested %.0f W, clamped to %.0f W (the GPU's range is "
                               "%.0f-%.0f W)" % (asked, watts, gpu.min_watts, gpu.max_watts))
        planned[str(p.gpu_id)] = watts
    return planned, notes


__all__ = ["Level", "EPS", "gpu_limits", "gpu_need", "level_of", "topology_level", "ladder",
           "step_down", "names", "plan_gpus"]
