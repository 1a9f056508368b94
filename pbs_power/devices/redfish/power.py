"""Host power through Redfish: ComputerSystem PowerState and ComputerSystem.Reset.

Reads a system's ``PowerState``, sends ``ComputerSystem.Reset`` to the target
the system's own ``Actions`` names (falling back to the standard path) with a
``ResetType`` the BMC offers (inline ``AllowableValues``, else the action's
``@Redfish.ActionInfo``, read when a reset is sent), and
polls until a state is reached. `power_off` is the blocking form with the
ForceOff fallback: GracefulShutdown, wait up to ``graceful_timeout``, then
ForceOff and wait again.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Optional, Tuple
from urllib.parse import quote

from pbs_power.states.model import PowerState
from .client import RedfishClient, RedfishError
from .options import Bmc

#: Redfish PowerState -> ours (Paused and anything unknown: UNKNOWN).
STATES = {"On": PowerState.ON, "Off": PowerState.OFF,
          "PoweringOn": PowerState.TRANSITIONING, "PoweringOff": PowerState.TRANSITIONING}
SYSTEMS = "/redfish/v1/Systems"


@dataclass(frozen=True)
class SystemView:
    """What one GET of a ComputerSystem tells about its power."""

    path: str
    power_state: str
    reset_target: str
    reset_types: Tuple[str, ...]   # empty: the BMC does not say inline
    chassis: Tuple[str, ...]       # Links.Chassis paths
    action_info: str = ""          # the Reset action's @Redfish.ActionInfo, if any

    @property
    def state(self) -> PowerState:
        return STATES.get(self.power_state, PowerState.UNKNOWN)


class ConfigNeeded(RedfishError):
    """The BMC answers, but the configuration does not say which resource to use."""


def member_path(collection: str, ident: str) -> str:
    """``collection/ident``; an id with ``/`` in it ("RackMount/Baseboard") stays nested."""
    parts = ident.strip("/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise RedfishError("id %r is not a resource id" % ident)
    return "%s/%s" % (collection, "/".join(quote(p, safe="") for p in parts))


def system_path(client: RedfishClient, bmc: Bmc, deadline: Optional[float]) -> str:
    """The system's path: the configured id, else the BMC's only system."""
    if bmc.system_id:
        return member_path(SYSTEMS, bmc.system_id)
    members = client.get(SYSTEMS, deadline).get("Members") or []
    paths = [m.get("@odata.id") for m in members if isinstance(m, dict) and m.get("@odata.id")]
    if len(paths) != 1:
        raise ConfigNeeded("%s: %d systems at %s (%s); set system_id for host %s"
                           % (client.name, len(paths), SYSTEMS,
                              ", ".join(p.rstrip("/").rsplit("/", 1)[-1] for p in paths[:8])
                              or "none", bmc.host))
    return paths[0]


def read_system(client: RedfishClient, path: str, deadline: Optional[float]) -> SystemView:
    """GET the system and pick out its power state, Reset action and chassis."""
    doc = client.get(path, deadline)
    action = (doc.get("Actions") or {}).get("#ComputerSystem.Reset") or {}
    target = action.get("target") or "%s/Actions/ComputerSystem.Reset" % path.rstrip("/")
    allowed = action.get("ResetType@Redfish.AllowableValues") or ()
    links = (doc.get("Links") or {}).get("Chassis") or []
    chassis = tuple(c["@odata.id"] for c in links if isinstance(c, dict) and c.get("@odata.id"))
    info = action.get("@Redfish.ActionInfo")
    return SystemView(doc.get("@odata.id") or path, str(doc.get("PowerState", "")), target,
                      tuple(str(a) for a in allowed), chassis,
                      info if isinstance(info, str) else "")


def offered_types(client: RedfishClient, view: SystemView,
                  deadline: Optional[float]) -> Tuple[str, ...]:
    """The ResetTypes the BMC allows: inline, else from the ActionInfo (empty: not said)."""
    if view.reset_types or not view.action_info:
        return view.reset_types
    try:
        info = client.get(view.action_info, deadline)
    except RedfishError as exc:
        if exc.status == 404:
            return ()
        raise
    for param in info.get("Parameters") or []:
        if isinstance(param, dict) and param.get("Name") == "ResetType":
            return tuple(str(v) for v in param.get("AllowableValues") or ())
    return ()


def reset_type(view: SystemView, wanted: str) -> str:
    """``wanted``, or its closest stand-in among the types the BMC allows."""
    if not view.reset_types or wanted in view.reset_types:
        return wanted
    for alternative in {"On": ("ForceOn",), "GracefulShutdown": ("ForceOff",),
                        "ForceOff": ("GracefulShutdown",)}.get(wanted, ()):
        if alternative in view.reset_types:
            return alternative
    raise RedfishError("%s does not offer ResetType %s (it offers %s)"
                       % (view.path, wanted, ", ".join(view.reset_types)))


def reset(client: RedfishClient, view: SystemView, wanted: str,
          deadline: Optional[float]) -> str:
    """POST ComputerSystem.Reset; the ResetType actually sent."""
    types = offered_types(client, view, deadline)
    if types != view.reset_types:
        view = replace(view, reset_types=types)
    kind = reset_type(view, wanted)
    client.post(view.reset_target, {"ResetType": kind}, deadline)
    return kind


def wait_for(client: RedfishClient, path: str, want: PowerState, deadline: float,
             poll: float, until: Optional[float] = None) -> SystemView:
    """Poll the system until it is in ``want`` or ``until`` (default ``deadline``) passes.

    Times are monotonic; each read must end by ``deadline``.
    """
    until = deadline if until is None else min(until, deadline)
    while True:
        view = read_system(client, path, deadline)
        if view.state is want or time.monotonic() + poll >= until:
            return view
        time.sleep(poll)


@dataclass(frozen=True)
class OffResult:
    """How a blocking power off went."""

    state: PowerState
    forced: bool
    diag: str


def power_off(client: RedfishClient, path: str, mode: str, graceful_timeout: float,
              deadline: float, poll: float) -> OffResult:
    """Power the system off and wait; after GracefulShutdown, ForceOff once it is overdue."""
    view = read_system(client, path, deadline)
    if view.state is PowerState.OFF:
        return OffResult(PowerState.OFF, False, "already off")
    sent = reset(client, view, mode, deadline)
    if sent == "ForceOff":
        view = wait_for(client, path, PowerState.OFF, deadline, poll)
        return OffResult(view.state, True, "ForceOff sent; system is %s" % view.power_state)
    view = wait_for(client, path, PowerState.OFF, deadline, poll,
                    until=time.monotonic() + graceful_timeout)
    if view.state is PowerState.OFF:
        return OffResult(PowerState.OFF, False, "GracefulShutdown done")
    reset(client, view, "ForceOff", deadline)
    view = wait_for(client, path, PowerState.OFF, deadline, poll)
    return OffResult(view.state, True, "GracefulShutdown did not finish within %gs; ForceOff "
                     "sent; system is %s" % (graceful_timeout, view.power_state))


def power_on(client: RedfishClient, path: str, deadline: float, poll: float) -> SystemView:
    """Power the system on and wait until it reports On (or the deadline)."""
    view = read_system(client, path, deadline)
    if view.state is not PowerState.ON:
        reset(client, view, "On", deadline)
        view = wait_for(client, path, PowerState.ON, deadline, poll)
    return view
