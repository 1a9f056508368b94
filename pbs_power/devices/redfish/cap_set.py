"""Setting and lifting a node's Redfish power cap, and restoring what the BMC held before.

A cap is resolved to watts (a percentage of the node's ``max_watts``, else
of the BMC's stated maximum; never of ``PowerCapacityWatts``, the power
supplies' capacity), fitted into the allowed range (the BMC's
``AllowableMin/Max`` and ``SettingRangeMin/Max``, capacity as an upper
bound, and the node's own range), clamped into it (``clamp``, the default;
the result says so) or refused before anything is sent (``refuse``),
converted to the control's units, and PATCHed. The resource is read again
and the value the BMC holds is reported, since BMCs round or adjust.

Before the first cap, what the resource held (limit and ``ControlMode``) is
kept as `Saved`; lifting the cap writes it back exactly. Without a saved
state, lifting writes ``null`` (the schema's "no limit") or ``ControlMode``
``Disabled`` where the resource has a mode; never a maximum.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

from pbs_power.groups.policy import PowerLimit
from .caps import (CONTROLS, DISABLED, ENABLED, ENV, PERCENT, CapReading, fmt_value, fmt_watts,
                   reread)
from .client import RedfishClient, RedfishError


class CapRefused(RedfishError):
    """A cap that cannot be applied as asked; nothing was sent."""


@dataclass(frozen=True)
class Saved:
    """What a limit resource held before it was first capped (restored on uncap)."""

    path: str
    style: str
    index: int
    raw: Any               # the limit as the BMC gave it (None: null or absent)
    mode: Optional[str]    # its ControlMode (None: the resource has none)

    @classmethod
    def of(cls, cap: CapReading) -> "Saved":
        return cls(cap.path, cap.style, cap.index, cap.raw, cap.mode)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Any) -> Optional["Saved"]:
        """The saved state in a device state document (None when absent or unreadable)."""
        if not isinstance(doc, Mapping) or not isinstance(doc.get("path"), str):
            return None
        try:
            return cls(doc["path"], str(doc["style"]), int(doc.get("index", 0)),
                       doc.get("raw"), doc.get("mode"))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class CapResult:
    """A cap change: what was asked, what was sent, what the BMC applies now."""

    requested: Optional[float]   # watts asked (None: lift the cap)
    sent: Any                    # the value written (in the control's units)
    held: Optional[float]        # the limit the BMC applies now, in watts (None: uncapped)
    note: str = ""
    saved: Optional[Saved] = None  # to keep until the cap is lifted (None: nothing to keep)


def target_watts(limit: PowerLimit, cap: CapReading, node_max: Optional[float],
                 name: str) -> float:
    """The watts ``limit`` means on this node; CapRefused when a percentage has no base."""
    if limit.watts is not None:
        return float(limit.watts)
    base = node_max if node_max is not None else cap.high if cap.units != PERCENT else None
    if base is None:
        capacity = "" if cap.capacity is None else (
            "; PowerCapacityWatts (%s W) is the power supplies' capacity, not a limit"
            % fmt_watts(cap.capacity))
        raise CapRefused("%s: a cap of %g%% needs a maximum to take it of: the node's max_watts "
                         "(topology) or AllowableMax/SettingRangeMax from the BMC, and %s gives "
                         "neither%s; nothing changed" % (name, limit.percentage, cap.describe(),
                                                         capacity))
    return float(base) * float(limit.percentage) / 100.0


def allowed_range(cap: CapReading, node_min: Optional[float], node_max: Optional[float]
                  ) -> Tuple[Optional[float], Optional[float], str]:
    """(low, high, where from) in watts: the BMC's range, capacity, and the node's range."""
    scale = 1.0 if cap.units != PERCENT else (None if node_max is None else node_max / 100.0)
    lows: List[float] = [] if node_min is None else [node_min]
    highs: List[float] = [] if node_max is None else [node_max]
    parts = []
    if scale is not None and (cap.low is not None or cap.high is not None):
        parts.append(cap.range_from)
        lows += [cap.low * scale] if cap.low is not None else []
        highs += [cap.high * scale] if cap.high is not None else []
    if cap.capacity is not None:
        parts.append("PowerCapacityWatts")
        highs.append(cap.capacity)
    if node_min is not None or node_max is not None:
        parts.append("the node's min_watts/max_watts")
    what = "from " + " and ".join(parts) if parts else "no range known"
    return (max(lows) if lows else None, min(highs) if highs else None, what)


def fit(watts: float, low: Optional[float], high: Optional[float], mode: str,
        what: str) -> Tuple[float, str]:
    """The value to send and a note; CapRefused when refused (``what`` names the range)."""
    if low is not None and high is not None and low > high:
        raise CapRefused("no cap is possible: the allowed range is empty (%s-%s W, %s)"
                         % (fmt_watts(low), fmt_watts(high), what))
    above = high is not None and watts > high
    below = low is not None and watts < low
    if not (above or below):
        return watts, ""
    bound = high if above else low
    span = "%s-%s W" % (fmt_watts(low), fmt_watts(high))
    if mode == "refuse":
        raise CapRefused("cap %s W is outside the allowed range %s (%s); nothing changed"
                         % (fmt_watts(watts), span, what))
    return bound, "requested %s W, clamped to %s W (allowed %s, %s)" % (  # type: ignore
        fmt_watts(watts), fmt_watts(bound), span, what)


def set_cap(client: RedfishClient, cap: CapReading, limit: PowerLimit, out_of_range: str,
            node_min: Optional[float], node_max: Optional[float], saved: Optional[Saved],
            deadline: Optional[float]) -> CapResult:
    """Fit ``limit`` into the allowed range, PATCH it, and read back what the BMC applies."""
    watts = target_watts(limit, cap, node_max, client.name)
    low, high, what = allowed_range(cap, node_min, node_max)
    fitted, note = fit(watts, low, high, out_of_range, what)
    if cap.units == PERCENT:
        if node_max is None:
            raise CapRefused("%s: %s is in percent (SetPointUnits %%) and the node has no "
                             "max_watts to convert %s W; nothing changed"
                             % (client.name, cap.describe(), fmt_watts(fitted)))
        value = _number(fitted * 100.0 / node_max)
    else:
        value = _number(fitted)
    control: Dict[str, Any] = {"SetPoint": value}
    if cap.mode == DISABLED:
        control["ControlMode"] = ENABLED
    client.patch(cap.path, _body(cap, control, value), deadline, cap.etag)
    after = reread(client, cap, deadline)
    held = after.enforced_watts(node_max)
    notes = [note] if note else []
    if cap.mode == DISABLED:
        notes.append("ControlMode was %s; set to %s" % (DISABLED, ENABLED))
    if after.mode == DISABLED:
        notes.append("the BMC keeps ControlMode %s: %s held but not enforced"
                     % (DISABLED, fmt_value(after.setpoint, after.units)))
    elif held is None or abs(held - fitted) > 1e-6:
        notes.append("the BMC holds %s after %s was sent" % (
            fmt_value(after.setpoint, after.units), fmt_value(value, cap.units)))
    keep = saved if saved is not None and saved.path == cap.path else Saved.of(cap)
    return CapResult(watts, value, held, "; ".join(notes), keep)


def uncap(client: RedfishClient, cap: CapReading, saved: Optional[Saved],
          node_max: Optional[float], deadline: Optional[float]) -> CapResult:
    """Lift the cap: write back what was saved, else ``null`` / ``ControlMode Disabled``."""
    if saved is not None and saved.path == cap.path and saved.index == cap.index:
        if saved.mode == DISABLED:
            control: Dict[str, Any] = {"ControlMode": DISABLED}
        else:
            control = {"SetPoint": saved.raw}
            if saved.mode is not None and saved.mode != cap.mode:
                control["ControlMode"] = saved.mode
        what = "restored what the BMC held before (%s%s)" % (
            "ControlMode " + saved.mode + ", " if saved.mode else "",
            "limit null" if saved.raw is None else "limit %s" % saved.raw)
        value = saved.raw
    elif not cap.enforced:
        return CapResult(None, None, None, "already uncapped: " + cap.why_uncapped())
    elif cap.has_mode:
        control, value, what = {"ControlMode": DISABLED}, None, "ControlMode set to Disabled"
    else:
        control, value, what = {"SetPoint": None}, None, "limit set to null (no limit)"
    client.patch(cap.path, _body(cap, control, value), deadline, cap.etag)
    after = reread(client, cap, deadline)
    held = after.enforced_watts(node_max)
    note = what
    if held is not None and (saved is None or saved.path != cap.path):
        note += "; the BMC still applies %s" % fmt_value(after.setpoint, after.units)
    return CapResult(None, value, held, note, None)


def _body(cap: CapReading, control: Dict[str, Any], value: Any) -> Dict[str, Any]:
    """The PATCH body for ``cap``'s resource (``value``: the limit, for PowerControl)."""
    if cap.style == ENV:
        return {"PowerLimitWatts": control}
    if cap.style == CONTROLS:
        return control
    members: List[Dict[str, Any]] = [{} for _ in range(cap.index)]  # PATCH keeps the others
    return {"PowerControl": members + [{"PowerLimit": {"LimitInWatts": value}}]}


def _number(watts: float) -> Any:
    return int(watts) if float(watts).is_integer() else round(watts, 3)
