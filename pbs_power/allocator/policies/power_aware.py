"""``power-aware``: the node that can run the job soonest, then the most budget headroom.

For each ask, among the free nodes (see `common`), in this order:

1. the power state, by what using the node now costs: awake (``on``), then
   waking, then asleep, then off or down, then going down, then unknown;
2. within a state, the fewest seconds until the node could run work
   (``ready_seconds``: the wake or boot time the hook's store learned for
   that host, else the fleet's, else the hook config's default);
3. the most headroom under the power budget for the job's power policy: the
   least, over the domains above the node, of budget minus what the domain
   uses (drawn watts when the metrics service reports them, else allocated
   caps; plus leased watts) minus what the node needs beyond its current
   allocation (no budgeted domain above it: unlimited; negative: the
   activation would fall back to a lower policy);
4. cluster and topology order. The node's first GPUs are taken.

Each choice is counted in the domains above it before the next ask, and the
answer says which node and why (``reason``), with the headroom's source.
The next best nodes follow as ``alternatives``: the server hands one out
instead when a request running at the same time leased the first.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..policy_base import PolicyRule
from .common import ALTERNATIVES, Ask, Node, Pool, gpu_ids, no_node, parse_asks, with_id

#: Power states in the order of what using the node now costs; others rank last.
STATE_RANK = {"on": 0, "waking": 1, "asleep": 2, "off": 3, "down": 3, "going_down": 4}
UNRANKED = 5
STATE_WORDS = {0: "awake", 1: "waking", 2: "asleep", 3: "off", 4: "going down", 5: "unknown"}


@dataclass
class Score:
    """How one node would serve one ask."""

    node: Node
    rank: int
    ready: Optional[float]
    policy: Optional[str]
    delta: float
    headroom: Optional[float]
    tightest: Optional[str]
    source: str

    @property
    def key(self) -> Tuple[Any, ...]:
        return (self.rank, math.inf if self.ready is None else self.ready,
                -(math.inf if self.headroom is None else self.headroom), self.node.order)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


class Budgets:
    """Budget and used watts per (cluster, domain), updated as asks are placed."""

    def __init__(self, clusters: Mapping[str, Mapping[str, Any]]):
        self.budget: Dict[Tuple[str, str], float] = {}
        self.used: Dict[Tuple[str, str], float] = {}
        self.source: Dict[Tuple[str, str], str] = {}
        for cid, cluster in clusters.items():
            domains = (cluster.get("data") or {}).get("power_domains") or {}
            live = (cluster.get("cluster_metrics") or {}).get("domains") or {}
            for name, dom in domains.items():
                budget = dom.get("budget_watts") if isinstance(dom, Mapping) else None
                if _number(budget):
                    key = (cid, name)
                    self.budget[key] = float(budget)
                    state = live.get(name) or {}
                    drawn, leased = state.get("drawn_watts"), state.get("leased_watts")
                    if _number(drawn):
                        used, source = float(drawn), "drawn watts (metrics service)"
                    else:
                        used, source = float(state.get("allocated_watts") or 0.0), \
                            "allocated caps"
                    if _number(leased) and leased:
                        used += float(leased)
                        source += " + leases"
                    self.used[key], self.source[key] = used, source

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
    """Soonest ready (awake, waking, asleep, off), then power-budget headroom."""

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
            ranked = sorted(scored, key=lambda s: s.key)
            best = ranked[0]
            pool.take(best.node)
            budgets.commit(best)
            choice = _answer(ask, best, explain(best, scored))
            others = [_answer(ask, s, "next best after %s: %s, ready in about %s s"
                              % (best.node.name, s.node.power_state,
                                 "?" if s.ready is None else "%.0f" % s.ready))
                      for s in ranked[1:ALTERNATIVES + 1]]
            if others:
                choice["alternatives"] = others
            out.append(choice)
        context["runs"] = context.get("runs", 0) + 1
        return {"allocations": out}

    def _score(self, node: Node, ask: Ask, clusters: Mapping[str, Any], budgets: Budgets,
               params: Mapping[str, Any], why: Dict[str, int]) -> Optional[Score]:
        rank = STATE_RANK.get(node.power_state, UNRANKED)
        if rank and not params["allow_asleep_nodes"]:
            return _skip(why, "not awake (allow_asleep_nodes is false)")
        data = clusters[node.cluster_id].get("data") or {}
        policy = ask.power_policy
        if policy is not None and policy not in (data.get("policies") or ()):
            return _skip(why, "in a cluster without power policy %s" % policy)
        delta = _delta(node, data, policy)
        headroom, tightest = budgets.headroom(node, delta)
        ready = node.live.get("ready_seconds")
        source = budgets.source.get((node.cluster_id, tightest), "no budget") if tightest \
            else "no budget"
        return Score(node, rank, float(ready) if _number(ready) else None,
                     policy or node.info.get("topology_policy"), delta, headroom, tightest,
                     source)


def _answer(ask: Ask, score: Score, reason: str) -> Dict[str, Any]:
    """The allocation of ``ask`` to the node of ``score``."""
    return with_id(ask, {
        "cluster_id": score.node.cluster_id, "node_id": score.node.name,
        "gpus": gpu_ids(score.node)[:ask.gpus], "power_state": score.node.power_state,
        "ready_seconds": score.ready, "power_policy": score.policy,
        "headroom_watts": score.headroom, "headroom_source": score.source, "reason": reason})


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


def explain(best: Score, scored: List[Score]) -> str:
    """One line: which node and why, in the order the criteria were applied."""
    counts: Dict[int, int] = {}
    for s in scored:
        counts[s.rank] = counts.get(s.rank, 0) + 1
    state = STATE_WORDS[best.rank] if best.rank != UNRANKED else best.node.power_state
    ready = "" if best.rank == 0 else (
        ", ready in about %.0f s" % best.ready if best.ready is not None else
        ", time to ready unknown")
    tally = ", ".join("%d %s" % (counts[r], STATE_WORDS[r]) for r in sorted(counts))
    parts = ["%s: %s%s (candidates: %s)" % (best.node.name, state, ready, tally)]
    peers = [s for s in scored if s.rank == best.rank]
    sooner = [s for s in peers if s.ready is not None and best.ready is not None and
              s.ready > best.ready]
    if sooner:
        parts.append("sooner ready than %d other %s node(s)" % (len(sooner), state))
    at = " at %s" % best.policy if best.policy else ""
    if best.headroom is None:
        parts.append("no power budget above it")
    else:
        tied = sum(1 for s in peers if s.ready == best.ready)
        most = "most headroom among %d %s candidate(s) as soon ready" % (tied, state)
        if best.headroom >= 0:
            parts.append("%s: %s keeps %.0f W under its budget%s (from %s)"
                         % (most, best.tightest, best.headroom, at, best.source))
        else:
            parts.append("%s, yet %s would be %.0f W over its budget%s (from %s; activation "
                         "falls back to a lower policy)" % (most, best.tightest, -best.headroom,
                                                            at, best.source))
    return "; ".join(parts)
