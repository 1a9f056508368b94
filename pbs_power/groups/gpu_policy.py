"""Per-GPU power policies (UpdateGPUPolicies): one limit per GPU id of a node.

A null ``power_limit`` removes a GPU's own policy, so the node's policy
applies to it again.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from .policy import PolicyError, PowerLimit, _object, parse_power_limit


@dataclass(frozen=True)
class GPUPolicy:
    """One GPU's limit; ``power_limit`` None removes its GPU-specific policy."""

    gpu_id: int
    power_limit: Optional[PowerLimit]


@dataclass(frozen=True)
class GPUPolicies:
    """Policies for distinct GPUs of one node."""

    policies: Tuple[GPUPolicy, ...]


def parse_gpu_policies(value: Any, path: str = "gpu_policies") -> GPUPolicies:
    """GPU policies with distinct ids; a null power_limit removes a GPU's policy."""
    problems: List[str] = []
    if not isinstance(value, list):
        raise PolicyError(["%s: must be a list" % path])
    out, seen = [], set()
    for i, item in enumerate(value):
        ipath = "%s[%d]" % (path, i)
        doc = _object(item, ipath, problems, ("gpu_id", "power_limit"))
        gid = doc.get("gpu_id")
        if isinstance(gid, bool) or not isinstance(gid, int) or gid < 0:
            problems.append("%s.gpu_id: must be an integer >= 0, got %r" % (ipath, gid))
            continue
        if gid in seen:
            problems.append("%s.gpu_id: GPU %d is named twice" % (ipath, gid))
        seen.add(gid)
        limit = doc.get("power_limit")
        parsed = None if limit is None else parse_power_limit(limit, ipath + ".power_limit",
                                                              problems)
        out.append(GPUPolicy(gid, parsed))
    if problems:
        raise PolicyError(problems)
    return GPUPolicies(tuple(out))
