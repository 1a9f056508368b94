"""Node power caps through a Redfish Chassis: find the limit resource and read it.

Three DMTF resources carry a chassis power limit; a BMC offers one or more,
and ``auto`` takes the first found in this order:

* ``EnvironmentMetrics.PowerLimitWatts`` (newer): ``SetPoint``;
* ``Power.PowerControl[i].PowerLimit.LimitInWatts`` (older), the member
  whose ``PhysicalContext`` is the node (or says none);
* the chassis' ``Controls`` collection (Redfish 2021.2): a ``ControlType``
  ``Power`` member whose ``PhysicalContext`` is the node (``Chassis``,
  ``SystemBoard``, or none given); a control of a GPU, CPU or other part
  is never taken, whatever the order of the members.

The range a limit may take is what the BMC states: ``AllowableMin/Max`` and
``SettingRangeMin/Max`` (both, when both are given). ``PowerCapacityWatts``
is the power supplies' capacity, not a limit range: 0 or absent means
unknown, and it is never the base of a percentage. A limit of ``null`` (or
0) means no limit, and a ``ControlMode`` of ``Disabled`` means the limit is
not applied. ``SetPointUnits`` ``%`` marks a control in percent, converted
with the node's ``max_watts``. Setting and lifting caps: see `cap_set`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Tuple

from .client import RedfishClient, RedfishError

ENV = "EnvironmentMetrics"
POWER = "PowerControl"
CONTROLS = "Controls"
#: The ControlMode of a control that is not applied, and the one we set instead.
DISABLED = "Disabled"
ENABLED = "Automatic"
#: PhysicalContext values that mean the whole node (absent: taken last).
NODE_CONTEXTS = ("Chassis", "SystemBoard", "ComputeBay", "Board")
PERCENT = "%"


class NoCapResource(RedfishError):
    """The chassis offers no power limit of the node."""


@dataclass(frozen=True)
class CapReading:
    """A chassis power-limit resource and what it holds (values in ``units``)."""

    path: str                   # the resource to GET and PATCH
    style: str                  # ENV, POWER or CONTROLS
    index: int                  # PowerControl member (0 otherwise)
    setpoint: Optional[float]   # the limit now (None: no limit set; 0 counts as none)
    low: Optional[float]        # what the BMC allows
    high: Optional[float]
    etag: Optional[str] = None
    mode: Optional[str] = None  # ControlMode (None when not given)
    units: str = "W"            # "W" or "%" (SetPointUnits)
    capacity: Optional[float] = None  # PowerCapacityWatts when > 0: an upper bound only
    range_from: str = ""        # which properties gave low/high
    raw: Any = None             # the limit property as the BMC gave it (for restoring)

    @property
    def has_mode(self) -> bool:
        return self.mode is not None

    @property
    def enforced(self) -> bool:
        """False when the BMC holds no limit, or one it does not act on (``Disabled``)."""
        return self.mode != DISABLED and self.setpoint is not None

    def watts(self, node_max: Optional[float]) -> Optional[float]:
        """The set point in watts (None: none, or a % control with no node maximum)."""
        if self.setpoint is None or self.units != PERCENT:
            return self.setpoint
        return None if node_max is None else self.setpoint * node_max / 100.0

    def enforced_watts(self, node_max: Optional[float] = None) -> Optional[float]:
        """The limit the BMC applies, in watts: None when there is none or it is disabled."""
        return self.watts(node_max) if self.enforced else None

    def describe(self) -> str:
        if self.style == ENV:
            return "EnvironmentMetrics PowerLimitWatts"
        if self.style == CONTROLS:
            return "Controls %s SetPoint" % self.path.rstrip("/").rsplit("/", 1)[-1]
        return "Power PowerControl[%d].PowerLimit" % self.index

    def why_uncapped(self) -> str:
        """One line on why no limit is applied ('' when one is)."""
        if self.mode == DISABLED:
            return "%s: capping disabled (ControlMode Disabled, SetPoint %s)" % (
                self.describe(), fmt_value(number(self.raw), self.units))
        if self.setpoint is None:
            prop = "LimitInWatts" if self.style == POWER else "SetPoint"
            return "%s: no limit set (%s %s)" % (self.describe(), prop,
                                                 "null" if self.raw is None else self.raw)
        return ""


def find_cap(client: RedfishClient, chassis: str, prefer: str,
             deadline: Optional[float]) -> CapReading:
    """The power-limit resource of ``chassis`` (path), per ``prefer``; NoCapResource says why not."""
    doc = client.get(chassis, deadline)
    order: List[Tuple[str, Optional[str]]] = [(style, _link(doc, key)) for style, key in (
        (ENV, "EnvironmentMetrics"), (POWER, "Power"), (CONTROLS, "Controls"))]
    if prefer != "auto":
        order = [(style, path) for style, path in order if style == prefer]
    why = []
    for style, path in order:
        if not path:
            why.append("no %s" % ("Power" if style == POWER else style))
            continue
        found = (find_power_control(client, path, deadline) if style == CONTROLS
                 else read_cap(client, path, style, deadline))
        if found is not None:
            return found
        why.append({ENV: "EnvironmentMetrics has no PowerLimitWatts",
                    POWER: "Power has no PowerControl with a PowerLimit",
                    CONTROLS: "Controls has no Power control of the node"}[style])
    raise NoCapResource("%s: no power limit resource at chassis %s (%s)"
                        % (client.name, doc.get("@odata.id", chassis), "; ".join(why)))


def _link(doc: Mapping[str, Any], key: str) -> Optional[str]:
    link = doc.get(key)
    return link.get("@odata.id") if isinstance(link, dict) else None


def node_context(context: Any) -> int:
    """Rank of a PhysicalContext for a node limit: 0 best, 1 unnamed, -1 never."""
    if context in NODE_CONTEXTS:
        return 0
    return 1 if context in (None, "") else -1


def find_power_control(client: RedfishClient, collection: str,
                       deadline: Optional[float]) -> Optional[CapReading]:
    """The node's ``ControlType: Power`` member of a Controls collection (None: no such)."""
    found: List[Tuple[int, CapReading]] = []
    for member in client.get(collection, deadline).get("Members") or []:
        path = member.get("@odata.id") if isinstance(member, dict) else None
        if path:
            doc = client.get(path, deadline)
            rank = node_context(doc.get("PhysicalContext"))
            if doc.get("ControlType") == "Power" and rank >= 0:
                found.append((rank, _control(path, CONTROLS, doc, doc.get("@odata.etag"))))
                if rank == 0:
                    break
    return min(found, key=lambda f: f[0])[1] if found else None


def read_cap(client: RedfishClient, path: str, style: str,
             deadline: Optional[float]) -> Optional[CapReading]:
    """The limit at ``path`` (None when the resource carries no power limit of the node)."""
    doc = client.get(path, deadline)
    etag = doc.get("@odata.etag")
    if style == CONTROLS:
        ok = doc.get("ControlType") == "Power" and node_context(doc.get("PhysicalContext")) >= 0
        return _control(path, style, doc, etag) if ok else None
    if style == ENV:
        limit = doc.get("PowerLimitWatts")
        return _control(path, style, limit, etag) if isinstance(limit, dict) else None
    members = [(i, m) for i, m in enumerate(doc.get("PowerControl") or [])
               if isinstance(m, dict) and isinstance(m.get("PowerLimit"), dict)
               and node_context(m.get("PhysicalContext")) >= 0]
    if not members:
        return None
    index, member = min(members, key=lambda im: node_context(im[1].get("PhysicalContext")))
    raw = member["PowerLimit"].get("LimitInWatts")
    capacity = number(member.get("PowerCapacityWatts"))
    return CapReading(path, POWER, index, _limit(raw), None, None, etag, None, "W",
                      capacity if capacity else None, "", raw)


def _control(path: str, style: str, doc: Mapping[str, Any], etag: Any) -> CapReading:
    """A Control (or the PowerLimitWatts excerpt): SetPoint, mode, units and range."""
    lows, highs, names = [], [], []
    for low_key, high_key in (("AllowableMin", "AllowableMax"),
                              ("SettingRangeMin", "SettingRangeMax")):
        low, high = number(doc.get(low_key)), number(doc.get(high_key))
        if low is not None or high is not None:
            names.append("%s/%s" % (low_key, high_key))
        if low is not None:
            lows.append(low)
        if high is not None and high > 0:
            highs.append(high)
    mode = doc.get("ControlMode")
    units = PERCENT if doc.get("SetPointUnits") == PERCENT else "W"
    raw = doc.get("SetPoint")
    return CapReading(path, style, 0, _limit(raw), max(lows) if lows else None,
                      min(highs) if highs else None, etag if isinstance(etag, str) else None,
                      mode if isinstance(mode, str) else None, units, None,
                      " and ".join(names), raw)


def reread(client: RedfishClient, cap: CapReading, deadline: Optional[float]) -> CapReading:
    found = read_cap(client, cap.path, cap.style, deadline)
    if found is None:
        raise RedfishError("%s: %s no longer carries a power limit" % (client.name, cap.path))
    return found


def _limit(value: Any) -> Optional[float]:
    """A limit value: None for null, absent, or 0 and below (no limit)."""
    found = number(value)
    return found if found is not None and found > 0 else None


def number(value: Any) -> Optional[float]:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


def fmt_watts(value: Optional[float]) -> str:
    """``500`` for 500.0 watts, ``?`` when unknown."""
    return "?" if value is None else "%g" % value


def fmt_value(value: Optional[float], units: str) -> str:
    """``500 W`` or ``80%``; ``null`` when there is none."""
    if value is None:
        return "null"
    return "%g%s" % (value, "%" if units == PERCENT else " W")
