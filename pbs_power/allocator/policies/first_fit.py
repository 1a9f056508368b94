"""``first-fit``: the first free node, in cluster and topology order, with enough GPUs.

The baseline: it ignores power state, budgets and GPU draw, and takes the
node's lowest-numbered GPUs.
"""
from __future__ import annotations

import itertools
from typing import Any, Dict, List

from ..policy_base import PolicyRule
from .common import ALTERNATIVES, Pool, gpu_ids, no_node, parse_asks, with_id


class FirstFitPolicy(PolicyRule):
    """First free node with enough GPUs; its first GPUs."""

    DEFAULT_PARAMETERS = {"power_policy": None, "allow_busy_nodes": False}
    READS_INPUT_ONLY = True

    def eval(self, parameters: Dict[str, Any], input_data: Dict[str, Any],
             context: Dict[str, Any]) -> Dict[str, Any]:
        params = self.merged(parameters)
        asks = parse_asks(input_data.get("inputs", {}), params["power_policy"])
        pool = Pool(input_data.get("cluster_data", {}), bool(params["allow_busy_nodes"]))
        out: List[Dict[str, Any]] = []
        for ask in asks:
            why: Dict[str, int] = {}
            free = pool.free(ask, why)
            node = next(free, None)
            if node is None:
                out.append(no_node(ask, why, pool))
                continue
            pool.take(node)
            choice = with_id(ask, {
                "cluster_id": node.cluster_id, "node_id": node.name,
                "gpus": gpu_ids(node)[:ask.gpus],
                "reason": "%s: first free node in topology order with %d GPU(s)"
                          % (node.name, ask.gpus)})
            others = [with_id(ask, {"cluster_id": n.cluster_id, "node_id": n.name,
                                    "gpus": gpu_ids(n)[:ask.gpus],
                                    "reason": "%s: next free node after %s" % (n.name,
                                                                               node.name)})
                      for n in itertools.islice(free, ALTERNATIVES)]
            if others:
                choice["alternatives"] = others
            out.append(choice)
        context["runs"] = context.get("runs", 0) + 1
        return {"allocations": out}
