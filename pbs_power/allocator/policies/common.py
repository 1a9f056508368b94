"""What the shipped policies share: their inputs, and the nodes they choose from.

Inputs: ``{"requests": [ASK, ...]}`` or a single ASK; an empty object asks
for one node. An ASK is ``{"id": "job-1", "gpus": 2, "power_policy":
"Node-High"}``, all optional: ``gpus`` (default 0) GPUs on one node, the
job's ``power_policy`` (default: the ``power_policy`` parameter, else the
node's topology policy). Every ask gets a node of its own. Nodes come from
the clusters' ``data.nodes`` in order; failed nodes, nodes in a resource
group (running a job, unless ``allow_busy_nodes``), nodes leased to an
earlier answer whose job has not started (``cluster_metrics.nodes[N].lease``)
and nodes already given to an earlier ask of the same request are never
chosen.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Set, Tuple

from ..policy_base import InputError

MAX_ASKS = 1024
#: Next-best nodes an allocation names, for the server to use when a request
#: running at the same time leased the first (see `pbs_power.allocator.leases`).
ALTERNATIVES = 16
ASK_KEYS = ("id", "gpus", "power_policy")


@dataclass(frozen=True)
class Ask:
    """One allocation request of the inputs."""

    id: Optional[str]
    gpus: int
    power_policy: Optional[str]
    where: str = "inputs"

    def label(self) -> str:
        return self.id if self.id is not None else self.where


@dataclass
class Node:
    """A node a policy may choose, with its static and live data."""

    cluster_id: str
    name: str
    order: int
    info: Mapping[str, Any]
    live: Mapping[str, Any]

    @property
    def gpu_count(self) -> int:
        count = self.info.get("gpu_count", 0)
        return count if isinstance(count, int) else 0

    @property
    def power_state(self) -> str:
        return str(self.live.get("power_state", "unknown"))


def parse_asks(inputs: Any, power_policy: Optional[str]) -> List[Ask]:
    """The asks of ``inputs``; InputError naming the field when one is malformed."""
    if not isinstance(inputs, Mapping):
        raise InputError("inputs must be an object")
    items = inputs["requests"] if "requests" in inputs else [inputs]
    if "requests" in inputs and set(inputs) != {"requests"}:
        raise InputError("inputs: with \"requests\", no other field is accepted (got %s)"
                         % ", ".join(sorted(set(inputs) - {"requests"})))
    if not isinstance(items, list) or not items or len(items) > MAX_ASKS:
        raise InputError("inputs.requests must be a list of 1 to %d requests" % MAX_ASKS)
    return [_ask(item, "inputs.requests[%d]" % i if "requests" in inputs else "inputs",
                 power_policy) for i, item in enumerate(items)]


def _ask(item: Any, where: str, default_policy: Optional[str]) -> Ask:
    if not isinstance(item, Mapping):
        raise InputError("%s must be an object" % where)
    unknown = sorted(set(item) - set(ASK_KEYS))
    if unknown:
        raise InputError("%s: unknown field(s) %s (known: %s)"
                         % (where, ", ".join(unknown), ", ".join(ASK_KEYS)))
    ident, gpus, policy = item.get("id"), item.get("gpus", 0), item.get("power_policy")
    if ident is not None and not isinstance(ident, str):
        raise InputError("%s.id must be a string" % where)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= 1024:
        raise InputError("%s.gpus must be an integer from 0 to 1024, got %r" % (where, gpus))
    if policy is not None and not isinstance(policy, str):
        raise InputError("%s.power_policy must be a string" % where)
    return Ask(ident, gpus, policy if policy is not None else default_policy, where)


@dataclass
class Pool:
    """The nodes of every candidate cluster, and which ones this run has given out."""

    clusters: Mapping[str, Mapping[str, Any]]
    allow_busy: bool = False
    taken: Set[Tuple[str, str]] = field(default_factory=set)
    nodes: List[Node] = field(default_factory=list)
    skipped_clusters: List[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        order = 0
        for cid, cluster in self.clusters.items():
            data = cluster.get("data") if isinstance(cluster, dict) else None
            nodes = data.get("nodes") if isinstance(data, dict) else None
            if not isinstance(nodes, dict):
                self.skipped_clusters.append(cid)
                continue
            live = (cluster.get("cluster_metrics") or {}).get("nodes") or {}
            for name, info in nodes.items():
                if isinstance(info, dict):
                    self.nodes.append(Node(cid, name, order, info, live.get(name) or {}))
                    order += 1

    def free(self, ask: Ask, why: Dict[str, int]) -> Iterator[Node]:
        """Nodes that can take ``ask``; ``why`` counts the others by reason."""
        for node in self.nodes:
            reason = self._unfit(node, ask)
            if reason:
                why[reason] = why.get(reason, 0) + 1
            else:
                yield node

    def _unfit(self, node: Node, ask: Ask) -> str:
        if (node.cluster_id, node.name) in self.taken:
            return "given to an earlier request"
        if node.gpu_count < ask.gpus:
            return "fewer than %d GPUs" % ask.gpus
        if node.power_state == "failed":
            return "failed"
        if node.live.get("lease"):
            return "leased to a job not started yet"
        if node.live.get("resource_group") and not self.allow_busy:
            return "in a resource group"
        return ""

    def take(self, node: Node) -> None:
        self.taken.add((node.cluster_id, node.name))


def no_node(ask: Ask, why: Mapping[str, int], pool: Pool) -> Dict[str, Any]:
    """The allocation of an ask nothing fits: why, counted."""
    counted = ", ".join("%d %s" % (n, r) for r, n in sorted(why.items(), key=lambda x: -x[1]))
    msg = "no node for %s (%d GPUs): %s" % (ask.label(), ask.gpus,
                                            counted or "no nodes in the candidate clusters")
    if pool.skipped_clusters:
        msg += "; cluster(s) without a node list: %s" % ", ".join(pool.skipped_clusters)
    return with_id(ask, {"error": msg})


def with_id(ask: Ask, allocation: Dict[str, Any]) -> Dict[str, Any]:
    """The allocation, carrying the ask's id first when it has one."""
    return {"request_id": ask.id, **allocation} if ask.id is not None else allocation


def gpu_ids(node: Node) -> List[str]:
    """The node's GPU ids ("0", "1", ...)."""
    return [str(i) for i in range(node.gpu_count)]
