"""Check what a policy returned before it goes on the wire.

A policy returns ``{"allocations": [ALLOCATION, ...]}`` (one per allocation
request in its inputs), or a single ALLOCATION. An allocation is the seed's
``{"cluster_id", "node_id" (optional), "gpus" (optional)}`` plus any other
JSON fields (``reason``, ``request_id`` ...), or ``{"error": "..."}`` for a
request it could not place. The cluster must be one of the candidates, the
node one of that cluster's nodes, the GPUs distinct ids of that node's GPUs
(integers are accepted and sent as strings). An allocation may carry
``alternatives``: up to 64 more allocations in order of preference, checked
alike, handed out instead when it collides with a lease (`leases`).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple

from .schema import BAD_POLICY_RESULT, AllocatorError, is_finite_json

MAX_ALTERNATIVES = 64


def check_result(policy: str, result: Any,
                 cluster_data: Mapping[str, Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The allocations of ``result``; AllocatorError(bad_policy_result) naming every problem."""
    problems: List[str] = []
    items = _allocations(result, problems)
    out: List[Dict[str, Any]] = []
    for i, item in enumerate(items):
        checked = _allocation(item, "allocations[%d]" % i, cluster_data, problems)
        if checked is not None:
            out.append(checked)
    if problems:
        raise AllocatorError(BAD_POLICY_RESULT, "policy %s returned a malformed result: %s"
                             % (policy, problems[0]), problems[:20])
    return out


def _allocations(result: Any, problems: List[str]) -> List[Any]:
    if isinstance(result, Mapping) and "allocations" in result:
        items = result["allocations"]
        if not isinstance(items, list):
            problems.append("allocations must be a list, got %s" % type(items).__name__)
            return []
        return items
    if isinstance(result, Mapping) and ("cluster_id" in result or "error" in result):
        return [result]
    problems.append("expected {\"allocations\": [...]} or one allocation "
                    "{\"cluster_id\": ...}, got %s" % _shape(result))
    return []


def _allocation(item: Any, where: str, cluster_data: Mapping[str, Mapping[str, Any]],
                problems: List[str], nested: bool = False) -> Any:
    if not isinstance(item, dict):
        problems.append("%s must be an object, got %s" % (where, _shape(item)))
        return None
    if not is_finite_json(item):
        problems.append("%s is not plain JSON data (str keys; finite numbers; lists, objects)"
                        % where)
        return None
    if "cluster_id" not in item:
        if isinstance(item.get("error"), str):
            return dict(item)
        problems.append("%s has neither cluster_id nor an error message" % where)
        return None
    out = dict(item)
    cluster = item["cluster_id"]
    if not isinstance(cluster, str) or cluster not in cluster_data:
        problems.append("%s.cluster_id %r is not a candidate cluster (candidates: %s)"
                        % (where, cluster, ", ".join(sorted(cluster_data)) or "none"))
        return None
    nodes = cluster_data[cluster].get("data", {}).get("nodes")
    node = item.get("node_id")
    if node is not None and (not isinstance(node, str) or
                             (isinstance(nodes, Mapping) and node not in nodes)):
        problems.append("%s.node_id %r is not a node of cluster %s" % (where, node, cluster))
        return None
    if "gpus" in item:
        gpus, bad = _gpus(item["gpus"], node, nodes)
        if bad:
            problems.append("%s.gpus: %s" % (where, bad))
            return None
        out["gpus"] = gpus
    if "alternatives" in item:
        others = item["alternatives"]
        if not isinstance(others, list) or len(others) > MAX_ALTERNATIVES or nested:
            problems.append("%s.alternatives must be a list of at most %d allocations "
                            "(without alternatives of their own)" % (where, MAX_ALTERNATIVES))
            return None
        checked = [_allocation(o, "%s.alternatives[%d]" % (where, i), cluster_data, problems,
                               nested=True) for i, o in enumerate(others)]
        if any(c is None for c in checked):
            return None                     # the problem is listed already
        if any("cluster_id" not in c for c in checked):
            problems.append("%s.alternatives: each must name a cluster" % where)
            return None
        out["alternatives"] = checked
    return out


def _gpus(value: Any, node: Any, nodes: Any) -> Tuple[List[str], str]:
    """GPU ids as strings, or a problem: a list of distinct ids the node has."""
    if not isinstance(value, list):
        return [], "must be a list of GPU ids, got %s" % _shape(value)
    if value and node is None:
        return [], "GPUs named without a node_id"
    ids: List[str] = []
    for gpu in value:
        if isinstance(gpu, bool) or not isinstance(gpu, (str, int)):
            return [], "GPU id %r is neither a string nor an integer" % (gpu,)
        ids.append(str(gpu))
    if len(set(ids)) != len(ids):
        return [], "GPU ids repeat: %s" % ", ".join(ids)
    count = nodes.get(node, {}).get("gpu_count") if isinstance(nodes, Mapping) else None
    if isinstance(count, int):
        wrong = [g for g in ids if not (g.isdigit() and int(g) < count)]
        if wrong:
            return [], "node %s has GPUs 0-%d, not %s" % (node, count - 1, ", ".join(wrong)) \
                if count else "node %s has no GPUs" % node
    return ids, ""


def _shape(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, Mapping):
        return "an object with keys %s" % ", ".join(map(str, list(value)[:5]))
    return "%s %r" % (type(value).__name__, value) if len(repr(value)) < 60 \
        else type(value).__name__
