"""Node power caps through a Redfish Chassis: read, set, and read back.

Three DMTF resources carry a chassis power limit; a BMC offers one or more,
and ``auto`` takes the first found in this order:

* ``EnvironmentMetrics.PowerLimitWatts`` (newer): ``SetPoint``, with
  ``AllowableMin``/``AllowableMax``;
* ``Power.PowerControl[i].PowerLimit.LimitInWatts`` (older), with
  ``PowerCapacityWatts`` as the upper bound and no standard lower bound;
* the chassis' ``Controls`` collection (Redfish 2021.2): the first member
  with ``ControlType`` ``Power``, its ``SetPoint`` with
  ``AllowableMin``/``AllowableMax`` (what some BMCs offer alone).

``EnvironmentMetrics`` and ``Controls`` also carry a ``ControlMode``: a
limit whose mode is ``Disabled`` is not enforced, so it is reported as no
cap, and setting a cap there also sets the mode to ``Automatic``.

The allowed range of a cap is what the BMC advertises, narrowed by the node's
own range from the topology (``node.min_watts``/``max_watts``). A cap outside
it is clamped into it (``clamp``, the default; the result says so) or refused
before anything is sent (``refuse``). After a PATCH the resource is read
again and the value the BMC holds is reported, since BMCs round or adjust.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
import json
from typing import Any, Dict, List, Mapping, Optional, Tuple

from pbs_power.groups.policy import PolicyElementType, PowerLimit, PolicyObject, parse_policy
from pbs_power.devices.controller import GPUPolicyResult
from .client import RedfishClient, RedfishError

ENV = "EnvironmentMetrics"
POWER = "PowerControl"
CONTROLS = "Controls"
#: The ControlMode of a control that is not applied, and the one we set instead.
DISABLED = "Disabled"
ENABLED = "Automatic"


@dataclass(frozen=True)
class CapReading:
    """A chassis power-limit resource and what it holds."""

    path: str                  # the resource to GET and PATCH
    style: str                 # ENV, POWER or CONTROLS
    index: int                 # PowerControl member (0 otherwise)
    watts: Optional[float]     # the limit now (None: no limit set)
    low: Optional[float]       # what the BMC allows
    high: Optional[float]
    etag: Optional[str] = None
    mode: Optional[str] = None  # ControlMode (ENV and CONTROLS; None when not given)

    @property
    def enforced(self) -> bool:
        """False when the BMC holds a SetPoint it does not act on (``Disabled``)."""
        return self.mode != DISABLED

    @property
    def enforced_watts(self) -> Optional[float]:
        """The limit the BMC applies: None when there is none or it is disabled."""
        return self.watts if self.enforced else None

    def describe(self) -> str:
        if self.style == ENV:
            return "EnvironmentMetrics PowerLimitWatts"
        if self.style == CONTROLS:
            return "Controls %s SetPoint" % self.path.rstrip("/").rsplit("/", 1)[-1]
        return "Power PowerControl[%d].PowerLimit" % self.index


@dataclass(frozen=True)
class CapResult:
    """A cap change: what was asked, what was sent, what the BMC holds now."""

    requested: float
    sent: Optional[float]
    held: Optional[float]
    note: str = ""


class CapRefused(RedfishError):
    """A cap outside the allowed range under ``cap_out_of_range: refuse``."""


def find_cap(client: RedfishClient, chassis: str, prefer: str,
             deadline: Optional[float]) -> CapReading:
    """The power-limit resource of ``chassis`` (path), per ``prefer`` (see CAP_RESOURCES)."""
    doc = client.get(chassis, deadline)
    order: List[Tuple[str, Optional[str]]] = [(style, _link(doc, key)) for style, key in (
        (ENV, "EnvironmentMetrics"), (POWER, "Power"), (CONTROLS, "Controls"))]
    if prefer != "auto":
        order = [(style, path) for style, path in order if style == prefer]
    for style, path in order:
        if path:
            found = (find_power_control(client, path, deadline) if style == CONTROLS
                     else read_cap(client, path, style, deadline))
            if found is not None:
                return found
    offered = " or ".join(s for s, _ in order)
    raise RedfishError("%s: chassis %s offers no power limit (%s)"
                       % (client.name, doc.get("@odata.id", chassis), offered))


def _link(doc: Mapping[str, Any], key: str) -> Optional[str]:
    link = doc.get(key)
    return link.get("@odata.id") if isinstance(link, dict) else None


def find_power_control(client: RedfishClient, collection: str,
                       deadline: Optional[float]) -> Optional[CapReading]:
    """The first ``ControlType: Power`` member of a Controls collection (None: no such)."""
    for member in client.get(collection, deadline).get("Members") or []:
        path = member.get("@odata.id") if isinstance(member, dict) else None
        if path:
            found = read_cap(client, path, CONTROLS, deadline)
            if found is not None:
                return found
    return None


def read_cap(client: RedfishClient, path: str, style: str,
             deadline: Optional[float]) -> Optional[CapReading]:
    """The limit at ``path`` (None when the resource carries no power limit)."""
    doc = client.get(path, deadline)
    etag = doc.get("@odata.etag")
    if style in (ENV, CONTROLS):
        limit = doc.get("PowerLimitWatts") if style == ENV else doc
        if not isinstance(limit, dict) or (style == CONTROLS
                                           and limit.get("ControlType") != "Power"):
            return None
        mode = limit.get("ControlMode")
        return CapReading(path, style, 0, _number(limit.get("SetPoint")),
                          _number(limit.get("AllowableMin")), _number(limit.get("AllowableMax")),
                          etag, mode if isinstance(mode, str) else None)
    for index, member in enumerate(doc.get("PowerControl") or []):
        if isinstance(member, dict) and isinstance(member.get("PowerLimit"), dict):
            return CapReading(path, POWER, index,
                              _number(member["PowerLimit"].get("LimitInWatts")), None,
                              _number(member.get("PowerCapacityWatts")), etag)
    return None


def reread(client: RedfishClient, cap: CapReading, deadline: Optional[float]) -> CapReading:
    found = read_cap(client, cap.path, cap.style, deadline)
    if found is None:
        raise RedfishError("%s: %s no longer carries a power limit" % (client.name, cap.path))
    return found


def allowed_range(cap: CapReading, node_min: Optional[float],
                  node_max: Optional[float]) -> Tuple[Optional[float], Optional[float]]:
    """The BMC's range narrowed by the node's (either end may be unknown: None)."""
    lows = [v for v in (cap.low, node_min) if v is not None]
    highs = [v for v in (cap.high, node_max) if v is not None]
    return (max(lows) if lows else None, min(highs) if highs else None)


def fit(watts: float, low: Optional[float], high: Optional[float], mode: str,
        what: str) -> Tuple[float, str]:
    """The value to send and a note; CapRefused when refused (``what`` names the range)."""
    if low is not None and high is not None and low > high:
        raise CapRefused("no cap is possible: the allowed range is empty (%s)" % what)
    above = high is not None and watts > high
    below = low is not None and watts < low
    if not (above or below):
        return watts, ""
    bound = high if above else low
    span = "%s-%s W" % (fmt_watts(low), fmt_watts(high))
    if mode == "refuse":
        raise CapRefused("cap %s W is outside the allowed range %s (%s); nothing changed"
                         % (fmt_watts(watts), span, what))
    return bound, "requested %s W, clamped to %s W (allowed %s, %s)" % (
        fmt_watts(watts), fmt_watts(bound), span, what)


def set_cap(client: RedfishClient, cap: CapReading, watts: float, mode: str,
            node_min: Optional[float], node_max: Optional[float],
            deadline: Optional[float]) -> CapResult:
    """Fit ``watts`` into the allowed range, PATCH it, and read back what the BMC holds."""
    low, high = allowed_range(cap, node_min, node_max)
    what = _range_source(cap, node_min, node_max)
    sent, note = fit(float(watts), low, high, mode, what)
    client.patch(cap.path, _body(cap, sent), deadline, cap.etag)
    after = reread(client, cap, deadline)
    held = after.enforced_watts
    notes = [note] if note else []
    if not cap.enforced:
        notes.append("ControlMode was %s; set to %s" % (DISABLED, ENABLED))
    if not after.enforced:
        notes.append("the BMC keeps ControlMode %s: %s W held but not enforced"
                     % (DISABLED, fmt_watts(after.watts)))
    elif held is None or abs(held - sent) > 1e-6:
        notes.append("the BMC holds %s W after %s W was sent" % (fmt_watts(held), fmt_watts(sent)))
    return CapResult(float(watts), sent, held, "; ".join(notes))


def _body(cap: CapReading, watts: float) -> Dict[str, Any]:
    value: Any = int(watts) if float(watts).is_integer() else round(watts, 3)
    control: Dict[str, Any] = {"SetPoint": value}
    if not cap.enforced:
        control["ControlMode"] = ENABLED
    if cap.style == ENV:
        return {"PowerLimitWatts": control}
    if cap.style == CONTROLS:
        return control
    members: List[Dict[str, Any]] = [{} for _ in range(cap.index)]  # PATCH keeps the others
    return {"PowerControl": members + [{"PowerLimit": {"LimitInWatts": value}}]}


def _range_source(cap: CapReading, node_min: Optional[float], node_max: Optional[float]) -> str:
    parts = []
    if cap.low is not None or cap.high is not None:
        parts.append("PowerCapacityWatts" if cap.style == POWER else "AllowableMin/AllowableMax")
    if node_min is not None or node_max is not None:
        parts.append("the node's min_watts/max_watts")
    return "from " + " and ".join(parts) if parts else "no range known"


def _number(value: Any) -> Optional[float]:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


def fmt_watts(value: Optional[float]) -> str:
    """``500`` for 500.0 watts, ``?`` when unknown."""
    return "?" if value is None else "%g" % value


# -- device requests: which node limit they ask for ---------------------------------
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
