"""Redfish BMCs: host power for the planner, node power caps for resource groups.

`RedfishFleet` holds one `RedfishClient` per BMC (connections reused,
sessions deleted at `close`) and knows each host's system and cap resource.
On top of it:

* `RedfishBackend` (``power_backend.type = "redfish"``): ``request`` starts
  ComputerSystem.Reset On / GracefulShutdown / ForceOff and returns;
  ``status`` reads PowerState. A GracefulShutdown is remembered in
  ``<state_dir>/redfish_graceful.json``; a later ``status`` that finds the
  host still up ``graceful_timeout_seconds`` after it sends ForceOff.
* `RedfishDevices` (device backend ``"redfish"``): node power caps for
  resource-group and topology policies (node limit only; GPU limits need the
  nvml backend), and ``ping``. What the limit resource held before the first
  cap is kept in the device state and written back when the cap is lifted.

Both offer ``ping(hosts)`` -> `PingResult` (reachable, power state, cap,
latency) for health checks, and the fleet offers blocking ``power_on``,
``power_off`` (with the ForceOff fallback) and ``wait_for``. Every failure
is one line per host: ``node012: redfish https://bmc: HTTP 500 on POST
/redfish/v1/Systems/1/Actions/ComputerSystem.Reset: <BMC's message>``.
Options: see `options`. A ping (and ``devices check``) of a node without an
enforced cap says why; a configuration the BMC's answers leave ambiguous
(several systems, no ``system_id``) is reported as such, not as unreachable.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

from pbs_power.states.model import PowerState, TransitionKind
from pbs_power.groups.policy import PowerLimit
from pbs_power.devices.base import BackendError, HostPower, PowerBackend, Result
from pbs_power.devices.controller import DeviceBackend, DeviceRequest, DeviceResponse, failure
from pbs_power.devices.credentials import Credentials, load_credentials
from pbs_power.devices.pending_off import PendingOffLog
from . import cap_requests, caps
from . import cap_set
from . import power as rpower
from .client import ClientSettings, RedfishClient, RedfishError
from .options import Bmc, RedfishOptions

LOG = logging.getLogger(__name__)
GRACEFUL_FILE = "redfish_graceful.json"
#: Device state key of what the limit resource held before the first cap (restored on uncap).
SAVED_KEY = "bmc_before_cap"
DEFAULT_TIMEOUT_S = 30.0
#: Connections kept per BMC: enough for a device fan-out to a BMC serving many systems.
POOL_PER_BMC = 64
T = TypeVar("T")


@dataclass(frozen=True)
class PingResult:
    """What a health check learns of one host's BMC."""

    host: str
    reachable: bool
    power_state: PowerState = PowerState.UNKNOWN
    cap_watts: Optional[float] = None
    cap_range: Tuple[Optional[float], Optional[float]] = (None, None)
    cap_resource: str = ""
    latency_seconds: Optional[float] = None
    error: str = ""

    def line(self) -> str:
        """One line for an admin: ``n01: ok, on, cap 500 W (100-800 W), 12 ms``."""
        if not self.reachable:
            return "%s: UNREACHABLE: %s" % (self.host, self.error)
        cap = "no cap resource" if not self.cap_resource else "cap %s W (%s-%s W, %s)" % (
            caps.fmt_watts(self.cap_watts), caps.fmt_watts(self.cap_range[0]),
            caps.fmt_watts(self.cap_range[1]), self.cap_resource)
        text = "%s: ok, %s, %s, %.0f ms" % (self.host, self.power_state.value, cap,
                                            (self.latency_seconds or 0) * 1000)
        return text + ("; " + self.error if self.error else "")


def diag(host: str, exc: BaseException, client: Optional[RedfishClient] = None) -> str:
    """``host: redfish URL: message`` on one line."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if client is not None and not text.startswith("redfish "):
        text = "%s: %s" % (client.name, text)
    return "%s: %s" % (host, text)


class RedfishFleet:
    """The BMCs of many hosts (see the module doc); thread-safe."""

    def __init__(self, options: RedfishOptions, credentials: Optional[Credentials]) -> None:
        self.options = options
        self.credentials = credentials
        self._clients: Dict[Tuple[str, Any, Any], RedfishClient] = {}
        self._systems: Dict[str, str] = {}
        self._caps: Dict[str, Tuple[str, str]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_options(cls, options: Optional[Mapping[str, Any]], who: str) -> "RedfishFleet":
        parsed = RedfishOptions.parse(options, who)
        creds = None
        if parsed.auth != "none":
            creds = load_credentials(parsed.credentials_file)  # type: ignore[arg-type]
        return cls(parsed, creds)

    # -- clients and paths --------------------------------------------------------
    def client(self, host: str) -> Tuple[RedfishClient, Bmc]:
        """The client for ``host``'s BMC (shared by every host behind it)."""
        bmc = self.options.bmc_of(host)
        cred = self.credentials.for_host(host) if self.credentials else None
        key = (bmc.url, bmc.verify, cred)
        with self._lock:
            found = self._clients.get(key)
            if found is None:
                o = self.options
                found = self._clients[key] = RedfishClient(ClientSettings(
                    bmc.url, bmc.verify, o.auth, cred, "credentials_file %s" % o.credentials_file,
                    o.timeout_seconds, o.retries, o.backoff_seconds,
                    max(o.max_workers, POOL_PER_BMC)))
        return found, bmc

    def system(self, host: str, deadline: Optional[float]) -> Tuple[RedfishClient, str]:
        client, bmc = self.client(host)
        path = self._systems.get(host)
        if path is None:
            path = self._systems[host] = rpower.system_path(client, bmc, deadline)
        return client, path

    def view(self, host: str, deadline: Optional[float] = None) -> rpower.SystemView:
        client, path = self.system(host, deadline)
        return rpower.read_system(client, path, deadline)

    # -- blocking power helpers ------------------------------------------------------
    def wait_for(self, host: str, want: PowerState, timeout: float) -> rpower.SystemView:
        """Poll until ``host`` is ``want`` or ``timeout`` seconds pass; the last reading."""
        deadline = time.monotonic() + timeout
        client, path = self.system(host, deadline)
        return rpower.wait_for(client, path, want, deadline, self.options.poll_seconds)

    def power_on(self, host: str, timeout: float) -> rpower.SystemView:
        deadline = time.monotonic() + timeout
        client, path = self.system(host, deadline)
        return rpower.power_on(client, path, deadline, self.options.poll_seconds)

    def power_off(self, host: str, timeout: float) -> rpower.OffResult:
        """Off per ``off_mode``; ForceOff after ``graceful_timeout_seconds`` if still up."""
        o = self.options
        deadline = time.monotonic() + timeout
        client, path = self.system(host, deadline)
        return rpower.power_off(client, path, o.off_mode, o.graceful_timeout_seconds,
                                deadline, o.poll_seconds)

    # -- caps -----------------------------------------------------------------------
    def read_cap(self, host: str, deadline: Optional[float] = None,
                 view: Optional[rpower.SystemView] = None) -> caps.CapReading:
        """The node's power-limit resource and value (discovered once per host; ``view``:
        the system, if just read). Every chassis of the system is tried in turn."""
        client, bmc = self.client(host)
        known = self._caps.get(host)
        if known is not None:
            try:
                found = caps.read_cap(client, known[0], known[1], deadline)
                if found is not None:
                    return found
            except RedfishError as exc:
                if exc.status != 404:
                    raise
            self._caps.pop(host, None)
        why = []
        for chassis in self._chassis(host, client, bmc, deadline, view):
            try:
                found = caps.find_cap(client, chassis, self.options.cap_resource, deadline)
            except caps.NoCapResource as exc:
                why.append(str(exc).split(": ", 1)[-1])
                continue
            except RedfishError as exc:
                if exc.status != 404:
                    raise
                why.append("chassis %s answers 404" % chassis)
                continue
            self._caps[host] = (found.path, found.style)
            return found
        raise caps.NoCapResource("%s: %s" % (client.name, "; ".join(why)))

    def _chassis(self, host: str, client: RedfishClient, bmc: Bmc, deadline: Optional[float],
                 view: Optional[rpower.SystemView]) -> List[str]:
        """The chassis to look for the node's limit in, best first."""
        if bmc.chassis_id:
            return [rpower.member_path("/redfish/v1/Chassis", bmc.chassis_id)]
        view = view or self.view(host, deadline)
        if view.chassis:
            return list(view.chassis)
        members = [m["@odata.id"] for m in client.get("/redfish/v1/Chassis", deadline).get(
            "Members") or [] if isinstance(m, dict) and isinstance(m.get("@odata.id"), str)]
        if len(members) == 1:
            return members
        ident = view.path.rstrip("/").rsplit("/", 1)[-1]
        for path in members:  # the chassis that names the system, or shares its id
            doc = client.get(path, deadline)
            linked = (doc.get("Links") or {}).get("ComputerSystems") or []
            if any(isinstance(l, dict) and l.get("@odata.id", "").rstrip("/") ==
                   view.path.rstrip("/") for l in linked) or doc.get("Id") == ident:
                return [path]
        raise rpower.ConfigNeeded("%s: system %s names no chassis (Links.Chassis) and none of "
                                  "the BMC's %d names it; set chassis_id"
                                  % (client.name, view.path, len(members)))

    def set_cap(self, host: str, limit: Optional[PowerLimit], node_min: Optional[float],
                node_max: Optional[float], saved: Optional[cap_set.Saved],
                deadline: Optional[float]) -> cap_set.CapResult:
        """Apply ``limit`` (None: lift the cap, restoring ``saved``) and read back the result."""
        client, _bmc = self.client(host)
        try:
            cap = self.read_cap(host, deadline)
        except caps.NoCapResource as exc:
            if limit is not None:
                raise
            return cap_set.CapResult(None, None, None, "nothing to lift: %s" % exc)
        if limit is None:
            return cap_set.uncap(client, cap, saved, node_max, deadline)
        return cap_set.set_cap(client, cap, limit, self.options.cap_out_of_range, node_min,
                               node_max, saved, deadline)

    # -- health ---------------------------------------------------------------------
    def ping(self, host: str, timeout: Optional[float] = None) -> PingResult:
        """Reachability, power state and cap of one host (never raises)."""
        deadline = time.monotonic() + (timeout or DEFAULT_TIMEOUT_S)
        client = None
        try:
            client, _bmc = self.client(host)
            start = time.monotonic()
            view = self.view(host, deadline)
            latency = time.monotonic() - start
        except rpower.ConfigNeeded as exc:  # the BMC answered: not "unreachable"
            return PingResult(host, True, error="configuration: " + diag(host, exc, client))
        except (RedfishError, BackendError) as exc:
            return PingResult(host, False, error=diag(host, exc, client))
        try:
            cap = self.read_cap(host, deadline, view)
        except caps.NoCapResource as exc:
            return PingResult(host, True, view.state, latency_seconds=latency,
                              error="uncapped: " + diag(host, exc))
        except rpower.ConfigNeeded as exc:
            return PingResult(host, True, view.state, latency_seconds=latency,
                              error="cap: configuration: " + diag(host, exc))
        except RedfishError as exc:
            return PingResult(host, True, view.state, latency_seconds=latency,
                              error="cap not readable: " + diag(host, exc, client))
        note = "" if cap.enforced else "uncapped: " + cap.why_uncapped()
        low, high = cap.low, cap.high
        if cap.units == caps.PERCENT:
            low = high = None  # percent of a maximum the BMC does not state
        return PingResult(host, True, view.state, cap.enforced_watts(), (low, high),
                          cap.describe(), latency, note)

    def map(self, fn: Callable[[str], T], hosts: Sequence[str]) -> Dict[str, T]:
        """``fn(host)`` for every host, at most ``max_workers`` at once."""
        unique = list(dict.fromkeys(hosts))
        if len(unique) <= 1:
            return {h: fn(h) for h in unique}
        with ThreadPoolExecutor(min(len(unique), self.options.max_workers),
                                thread_name_prefix="pbs_power-redfish") as pool:
            return dict(zip(unique, pool.map(fn, unique)))

    def close(self) -> None:
        """Delete sessions and close connections, BMC by BMC."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()


class RedfishBackend(PowerBackend):
    """Host power through Redfish BMCs (``power_backend.type = "redfish"``)."""

    name = "redfish"

    def __init__(self, options: Optional[Mapping[str, Any]], state_dir: str) -> None:
        self.fleet = RedfishFleet.from_options(options, "power backend 'redfish'")
        self.options = self.fleet.options
        try:
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise BackendError("power backend 'redfish': cannot create state directory %s "
                               "(%s)" % (state_dir, exc.strerror)) from None
        self.graceful = PendingOffLog(os.path.join(state_dir, GRACEFUL_FILE), "redfish")
        #: host -> the last diagnostic of a failed status read (for logs and checks)
        self.last_errors: Dict[str, str] = {}

    def request(self, kind: TransitionKind, hosts: Sequence[str],
                now: float) -> Dict[str, Result]:
        kind = TransitionKind(kind)
        results = self.fleet.map(lambda h: self._start(kind, h), hosts)
        graceful = {h: now for h, (_r, sent) in results.items() if sent == "GracefulShutdown"}
        done = [h for h, (r, sent) in results.items() if r.ok and sent != "GracefulShutdown"]
        self.graceful.update(graceful, done)
        return {h: r for h, (r, _sent) in results.items()}

    def _start(self, kind: TransitionKind, host: str) -> Tuple[Result, str]:
        """Start one host's transition: (result, ResetType sent or "")."""
        if kind in (TransitionKind.SLEEP, TransitionKind.WAKE):
            return Result(False, "%s: redfish has no %s (ComputerSystem.Reset offers none); "
                          "use power_on_off_enable, not power_ramp_rate_enable"
                          % (host, kind.value)), ""
        client = None
        try:
            client, path = self.fleet.system(host, None)
            view = rpower.read_system(client, path, None)
            up = kind is TransitionKind.POWER_ON
            if view.state is (PowerState.ON if up else PowerState.OFF):
                return Result(True, "already %s" % view.power_state), ""
            if view.power_state == ("PoweringOn" if up else "PoweringOff"):
                return Result(True, "already %s" % view.power_state), ""
            sent = rpower.reset(client, view, "On" if up else self.options.off_mode, None)
        except (RedfishError, BackendError) as exc:
            return Result(False, diag(host, exc, client)), ""
        note = ""
        if sent == "GracefulShutdown":
            note = " (ForceOff if still up after %gs)" % self.options.graceful_timeout_seconds
        return Result(True, "Reset %s sent%s" % (sent, note)), sent

    def status(self, hosts: Sequence[str], now: float) -> Dict[str, HostPower]:
        views = self.fleet.map(self._read, hosts)
        pending = self.graceful.load()
        out: Dict[str, HostPower] = {}
        drop = []
        for host, view in views.items():
            if isinstance(view, str):
                self.last_errors[host] = view
                LOG.warning("%s", view)
                out[host] = HostPower(PowerState.UNKNOWN)
                continue
            self.last_errors.pop(host, None)
            state = view.state
            if host in pending and state is PowerState.OFF:
                drop.append(host)
            elif host in pending and state in (PowerState.ON, PowerState.TRANSITIONING):
                state = PowerState.TRANSITIONING  # the OS is shutting down
                if now - pending[host] >= self.options.graceful_timeout_seconds:
                    if self._force_off(host, now - pending[host]):
                        drop.append(host)
            out[host] = HostPower(state)
        self.graceful.update({}, drop)
        return out

    def _read(self, host: str) -> Any:
        """The host's SystemView, or its one-line diagnostic."""
        client = None
        try:
            client, path = self.fleet.system(host, None)
            return rpower.read_system(client, path, None)
        except (RedfishError, BackendError) as exc:
            return diag(host, exc, client)

    def _force_off(self, host: str, waited: float) -> bool:
        try:
            client, path = self.fleet.system(host, None)
            view = rpower.read_system(client, path, None)
            rpower.reset(client, view, "ForceOff", None)
        except (RedfishError, BackendError) as exc:
            LOG.error("%s; ForceOff after GracefulShutdown failed", diag(host, exc))
            return False
        LOG.warning("%s: GracefulShutdown not done after %.0fs (graceful_timeout_seconds=%g); "
                    "ForceOff sent", host, waited, self.options.graceful_timeout_seconds)
        return True

    def ping(self, hosts: Sequence[str], timeout: Optional[float] = None) -> Dict[str, PingResult]:
        return self.fleet.map(lambda h: self.fleet.ping(h, timeout), hosts)

    def check(self, host: str) -> Dict[str, Any]:
        """The ``pbs-power devices check`` protocol (see `pbs_power.devices.check`)."""
        found = self.fleet.ping(host, self.options.timeout_seconds * (self.options.retries + 1))
        return {"reachable": found.reachable, "backend": self.name,
                "power_state": found.power_state.value if found.reachable else None,
                "power_cap_watts": found.cap_watts, "diag": found.error}

    def close(self) -> None:
        self.fleet.close()


class RedfishDevices(DeviceBackend):
    """Node power caps through Redfish BMCs (device backend ``"redfish"``)."""

    name = "redfish"

    def __init__(self, options: Optional[Mapping[str, Any]] = None) -> None:
        self.fleet = RedfishFleet.from_options(options, "device backend 'redfish'")

    @classmethod
    def from_options(cls, options: Optional[Mapping[str, Any]]) -> "RedfishDevices":
        return cls(options)

    def handle(self, request: DeviceRequest) -> DeviceResponse:
        host = request.device
        timeout = request.timeout_seconds or DEFAULT_TIMEOUT_S
        deadline = time.monotonic() + timeout
        if request.kind == "ping":
            return self._ping(request, timeout)
        if request.kind == "gpu_policies_update":
            return failure(request, "%s: the redfish backend sets node power caps only; GPU "
                           "policies need the nvml backend" % host)
        try:
            node_min, node_max = cap_requests.node_range(request.device_model_json)
            change, limit, policy = cap_requests.node_limit(request.kind, request.payload)
        except ValueError as exc:  # PolicyError is a ValueError
            return failure(request, "%s: bad %s request: %s" % (host, request.kind, exc))
        previous = _state(request.device_state_json)
        gpu_results = cap_requests.gpu_refusals(request.payload)
        errors = [r.diag_msg for r in gpu_results]
        state = dict(previous, resource_group=_group(request, previous))
        cap_watts = previous.get("node_cap_watts")
        if change:
            client = None
            try:
                client, _bmc = self.fleet.client(host)
                saved = cap_set.Saved.from_dict(previous.get(SAVED_KEY))
                result = self.fleet.set_cap(host, limit, node_min, node_max, saved, deadline)
            except (RedfishError, BackendError) as exc:
                return failure(request, diag(host, exc, client),
                               device_state_json=json.dumps(previous, sort_keys=True))
            cap_watts = result.held
            state.update(node_cap_watts=result.held, requested_watts=result.requested,
                         note=result.note, policy=policy.name if policy else None)
            state[SAVED_KEY] = result.saved.to_dict() if result.saved else None
        return DeviceResponse(host, request.request_id, not errors, "; ".join(errors),
                              device_state_json=json.dumps(state, sort_keys=True),
                              power_cap_watts=cap_watts,
                              policy=policy.to_dict() if policy else None,
                              gpu_results=gpu_results)

    def _ping(self, request: DeviceRequest, timeout: float) -> DeviceResponse:
        found = self.fleet.ping(request.device, timeout)
        state = dict(_state(request.device_state_json), power_state=found.power_state.value)
        if found.cap_watts is not None:
            state["node_cap_watts"] = found.cap_watts
        return DeviceResponse(request.device, request.request_id, found.reachable, found.error
                              if not found.reachable else "",
                              device_state_json=json.dumps(state, sort_keys=True),
                              power_cap_watts=found.cap_watts, ping_time=time.time(),
                              ping_error=found.error if not found.reachable else "")

    def ping(self, hosts: Sequence[str], timeout: Optional[float] = None) -> Dict[str, PingResult]:
        return self.fleet.map(lambda h: self.fleet.ping(h, timeout), hosts)

    def close(self) -> None:
        self.fleet.close()


def _state(text: Optional[str]) -> Dict[str, Any]:
    try:
        doc = json.loads(text) if text else {}
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _group(request: DeviceRequest, previous: Mapping[str, Any]) -> Optional[str]:
    if request.kind == "resource_group_deactivate":
        return None
    if request.kind.startswith("resource_group_"):
        return request.payload.get("resource_group")
    return previous.get("resource_group")
