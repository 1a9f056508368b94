"""``power-aware``: awake nodes first, then budget headroom, then the coolest GPUs.

For each ask, among the free nodes (see `common`), in this order:

1. nodes already awake (``on``), then waking ones, then the rest (asleep,
   off, going down, unknown): no boot to wait for, no power step to pay;
2. the most headroom under the power budget for the job's power policy: the
   least, over the domains above the node, of budget minus allocated watts
   minus what the node needs beyond its current allocation at that policy
   (no budgeted domain above it: unlimited; negative: the activation would
   fall back to a lower policy);
3. the lowest recent draw of the GPUs it would get (each node's coolest
   GPUs are chosen; unknown draw counts after any known one);
4. cluster and topology order.

Each choice is counted in the domains above it before the next ask, and the
answer says why (``reason``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..policy_base import PolicyRule
from .common import Ask, Node, Pool, no_node, parse_asks, with_id

STATE_RANK = {"on": 0, "waking": 1}


@dataclass
class Score:
    """How one node would serve one ask."""

    node: Node
    rank: int
    policy: Optional[str]
    delta: float
    headroom: Optional[float]
    tightest: Optional[str]
    gpus: List[str] = field(default_factory=list)
    draws: List[Optional[float]] = field(default_factory=list)

    @property
    def prefix(self) -> Tuple[int, float]:
        """The first two criteria: power state, then headroom (most first)."""
        return (self.rank, -(math.inf if self.headroom is None else self.headroom))

    @property
    def key(self) -> Tuple[Any, ...]:
        known = [d for d in self.draws if d is not None]
        return self.prefix + (len(self.draws) - len(known), sum(known), self.node.order)


class Budgets:
    """Budget and allocated watts per (cluster, domain), updated as asks are placed."""

    def __init__(self, clusters: Mapping[str, Mapping[str, Any]]):
        self.budget: Dict[Tuple[str, str], float] = {}
        self.used: Dict[Tuple[str, str], float] = {}
        for cid, cluster in clusters.items():
            domains = (cluster.get("data") or {}).get("power_domains") or {}
            live = (cluster.get("cluster_metrics") or {}).get("domains") or {}
            for name, dom in domains.items():
                budget = dom.get("budget_watts") if isinstance(dom, Mapping) else None
                if isinstance(budget, (int, float)) and not isinstance(budget, bool):
                    self.budget[(cid, name)] = float(budget)
                    used = (live.get(name) or {}).get("allocated_watts", 0.0)
                    self.used[(cid, name)] = float(used or 0.0)

    def headroom(self, node: Node, delta: float) -> Tuple[Optional[float], Optional[str]]:
        """(least watts left over the node's budgeted domains after ``delta``, that domain)."""
        best: Tuple[Optional[float], Optional[str]] = (None, None)
        for dom in node.info.get("domains") or ():
            key = (node.cluster_id, dom)
            if key in self.budget:
                left = self.budget[key] - self.used[key] - delta
                if best[0] is None or left < best[0]:
                    best = (left, dom)
        return best

    def commit(self, score: Score) -> None:
        for dom in score.node.info.get("domains") or ():
            key = (score.node.cluster_id, dom)
            if key in self.used:
                self.used[key] += score.delta


class PowerAwarePolicy(PolicyRule):
    """Awake first, then power-budget headroom, then the GPUs drawing least."""

    DEFAULT_PARAMETERS = {"power_policy": None, "allow_busy_nodes": False,
                          "allow_asleep_nodes": True}
    READS_INPUT_ONLY = True

    def eval(self, parameters: Dict[str, Any], input_data: Dict[str, Any],
             context: Dict[str, Any]) -> Dict[str, Any]:
        params = self.merged(parameters)
        asks = parse_asks(input_data.get("inputs", {}), params["power_policy"])
        clusters = input_data.get("cluster_data", {})
        pool = Pool(clusters, bool(params["allow_busy_nodes"]))
        budgets = Budgets(clusters)
        out: List[Dict[str, Any]] = []
        for ask in asks:
            why: Dict[str, int] = {}
            scored = [s for s in (self._score(n, ask, clusters, budgets, params, why)
                                  for n in pool.free(ask, why)) if s is not None]
            if not scored:
                out.append(no_node(ask, why, pool))
                continue
            best = self._best(scored, ask.gpus)
            pool.take(best.node)
            budgets.commit(best)
            out.append(with_id(ask, {
                "cluster_id": best.node.cluster_id, "node_id": best.node.name,
                "gpus": best.gpus, "power_state": best.node.power_state,
                "power_policy": best.policy, "headroom_watts": best.headroom,
                "reason": explain(best, scored)}))
        context["runs"] = context.get("runs", 0) + 1
        return {"allocations": out}

    @staticmethod
    def _best(scored: List[Score], gpus: int) -> Score:
        """The best score; GPU draw is looked at only among those tied on state and headroom."""
        first = min(s.prefix for s in scored)
        finalists = [s for s in scored if s.prefix == first]
        for s in finalists:
            s.gpus, s.draws = _coolest(s.node, gpus)
        return min(finalists, key=lambda s: s.key)

    def _score(self, node: Node, ask: Ask, clusters: Mapping[str, Any], budgets: Budgets,
               params: Mapping[str, Any], why: Dict[str, int]) -> Optional[Score]:
        rank = STATE_RANK.get(node.power_state, 2)
        if rank and not params["allow_asleep_nodes"]:
            return _skip(why, "not awake (allow_asleep_nodes is false)")
        data = clusters[node.cluster_id].get("data") or {}
        policy = ask.power_policy
        if policy is not None and policy not in (data.get("policies") or ()):
            return _skip(why, "in a cluster without power policy %s" % policy)
        delta = _delta(node, data, policy)
        headroom, tightest = budgets.headroom(node, delta)
        return Score(node, rank, policy or node.info.get("topology_policy"), delta, headroom,
                     tightest)


def _skip(why: Dict[str, int], reason: str) -> None:
    """Count a node left out, for the message of an ask nothing fits."""
    why[reason] = why.get(reason, 0) + 1


def _delta(node: Node, data: Mapping[str, Any], policy: Optional[str]) -> float:
    """Watts the node needs at ``policy`` beyond what it is allocated now (0 if unknown)."""
    spec = (data.get("device_specs") or {}).get(node.info.get("device_spec")) or {}
    need = (spec.get("policy_watts") or {}).get(policy) if policy else \
        node.info.get("topology_watts")
    current = node.live.get("allocated_watts", node.info.get("topology_watts"))
    if not isinstance(need, (int, float)) or not isinstance(current, (int, float)):
        return 0.0
    return float(need) - float(current)


def _coolest(node: Node, count: int) -> Tuple[List[str], List[Optional[float]]]:
    """The ``count`` GPUs with the lowest recent draw (unknown last), and their draws."""
    if count == 0:
        return [], []
    live = node.live.get("gpus") or {}
    known, unknown = [], []
    for i in range(node.gpu_count):
        value = (live.get(str(i)) or {}).get("power_watts")
        if type(value) in (int, float) and math.isfinite(value):
            known.append((float(value), i))
        else:
            unknown.append(i)
    known.sort()
    chosen = known[:count] + [(None, i) for i in unknown[:max(0, count - len(known))]]
    return [str(i) for _w, i in chosen], [w for w, _i in chosen]


def explain(best: Score, scored: List[Score]) -> str:
    """One line: why this node, in the order the criteria were applied."""
    awake = sum(1 for s in scored if s.rank == 0)
    state = "awake" if best.rank == 0 else best.node.power_state
    parts = ["%s: %s (%d of %d candidates awake)" % (best.node.name, state, awake, len(scored))]
    peers = sum(1 for s in scored if s.rank == best.rank)
    at = " at %s" % best.policy if best.policy else ""
    if best.headroom is None:
        parts.append("no power budget above it")
    else:
        most = "most headroom among %d %s candidate(s)" % (
            peers, "awake" if best.rank == 0 else "not-awake")
        if best.headroom >= 0:
            parts.append("%s: %s keeps %.0f W under its budget%s" % (most, best.tightest,
                                                                    best.headroom, at))
        else:
            parts.append("%s, yet %s would be %.0f W over its budget%s (activation falls back "
                         "to a lower policy)" % (most, best.tightest, -best.headroom, at))
    if best.gpus:
        known = [d for d in best.draws if d is not None]
        if len(known) == len(best.draws):
            parts.append("GPUs %s drew %s W, the node's lowest" % (
                ", ".join(best.gpus), ", ".join("%.0f" % d for d in known)))
        else:
            parts.append("GPUs %s (recent draw unknown for %d)"
                         % (", ".join(best.gpus), len(best.draws) - len(known)))
    return "; ".join(parts)
