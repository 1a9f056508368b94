"""What a device request asks of a Redfish node: its watt range, its node limit, GPU refusals.

Pure functions over the request's JSON: the node's ``min_watts``/``max_watts``
from its device model, the NODE `PowerLimit` a policy request sets (None:
uncapped), and a failed result for every GPU a request would cap (Redfish
caps whole nodes here; GPU caps need the nvml backend).
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Optional, Tuple

from pbs_power.devices.controller import GPUPolicyResult
from pbs_power.groups.policy import PolicyElementType, PolicyObject, PowerLimit, parse_policy


def node_range(model_json: str) -> Tuple[Optional[float], Optional[float]]:
    """The node's (min_watts, max_watts) from its device model JSON (either may be None)."""
    try:
        doc = json.loads(model_json)
    except (TypeError, ValueError) as exc:
        raise ValueError("device model JSON is not valid JSON: %s" % exc) from None
    node = doc.get("node") if isinstance(doc, dict) else None
    if not isinstance(node, dict):
        return None, None
    out = []
    for key in ("min_watts", "max_watts"):
        value = node.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ValueError("device model JSON: node.%s must be a number, not %r" % (key, value))
        out.append(None if value is None else float(value))
    return out[0], out[1]


def node_limit(kind: str, payload: Mapping[str, Any]
               ) -> Tuple[bool, Optional[PowerLimit], Optional[PolicyObject]]:
    """(change the cap?, the node PowerLimit or None for "uncapped", the policy or None)."""
    if not isinstance(payload, Mapping):
        raise ValueError("payload must be an object")
    deactivate = kind.endswith("_deactivate")
    doc: Any = payload
    if kind.startswith("resource_group_"):
        doc = payload.get("policy")
        if doc is None and not deactivate:
            return False, None, None  # GPU policies only: the node cap stays
        doc = doc or {}
    if not isinstance(doc, Mapping):
        raise ValueError("policy request must be an object")
    action = "unset" if deactivate else doc.get("policy_action", "set")
    if action not in ("set", "unset"):
        raise ValueError("policy_action must be 'set' or 'unset', not %r" % (action,))
    policy = None if doc.get("policy") is None else parse_policy(doc["policy"], "policy")
    if policy is None and action == "set":
        raise ValueError("policy_action 'set' needs a policy")
    if policy is None:
        return True, None, None
    return True, policy.limit(PolicyElementType.NODE), policy


def gpu_refusals(payload: Mapping[str, Any]) -> Tuple[GPUPolicyResult, ...]:
    """A failed result per GPU a request asks to cap: Redfish caps whole nodes here."""
    doc = payload.get("gpu_policies") if isinstance(payload, Mapping) else None
    if not isinstance(doc, Mapping) or doc.get("gpu_policy_action", "set") != "set":
        return ()
    out = []
    for entry in doc.get("gpu_policies") or []:
        gpu = entry.get("gpu_id") if isinstance(entry, Mapping) else None
        out.append(GPUPolicyResult(gpu if isinstance(gpu, int) else -1, False, None,
                                   "GPU %s: not set: the redfish backend caps the node only; "
                                   "GPU caps need the nvml backend" % gpu))
    return tuple(out)
