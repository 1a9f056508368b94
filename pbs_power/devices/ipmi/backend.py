"""IPMI backends: host power and DCMI node power caps through the hosts' BMCs.

`IpmiPowerBackend` (``power_backend.type = "ipmi"``) powers hosts on
(``chassis power on``) and off (``chassis power soft``, the ACPI shutdown
request, or ``off`` with ``"power_off": "hard"``), after reading the chassis
power (a host already there is left alone: some BMCs refuse a soft off of a
host that is off with 0xD5). A soft off is remembered in
``<state_dir>/ipmi_soft_off.json``; a later ``status`` that finds the host
still on ``soft_off_timeout`` seconds after it sends ``chassis power off``.
It reports chassis power
as ON or OFF (UNKNOWN when the BMC does not answer; the last diagnostic per
host is kept in ``last_errors``). IPMI has no sleep state: SLEEP and WAKE are
refused per host. `IpmiDevices` (device backend ``"ipmi"``) applies the NODE
power limit of resource-group and topology policies as a DCMI power limit
(one Set Power Limit with our correction time and exception action, then
``dcmi power activate``; ``deactivate`` when the node
goes back to uncapped). A BMC without DCMI power limiting fails the request
with a one-line diagnostic, except when the node is to run uncapped (nothing
to lift). GPU caps are not set over IPMI: GPUs a request names fail (use a
GPU backend for them). Both classes offer ``probe(hosts)`` (see `Probe`) for
health checks; the power backend also answers ``pbs-power devices check``
(``check(host)``). All BMC calls go through `pbs_power.devices.ipmi.ipmitool`.

Options: see `pbs_power.devices.ipmi.options`.
"""
from __future__ import annotations

import logging
import math
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, TypeVar

from pbs_power._records import evolve
from pbs_power.states.model import PowerState, TransitionKind
from pbs_power.devices.base import BackendError, HostPower, PowerBackend, Result
from pbs_power.devices.controller import (DeviceBackend, DeviceRequest, DeviceResponse,
                                          GPUPolicyResult, failure)
from pbs_power.devices.credentials import load_credentials
from pbs_power.devices.pending_off import PendingOffLog
from pbs_power.devices.simulated_devices import DeviceModel, DeviceState, apply_request
from .ipmitool import Bmc, IpmiTool
from .options import ADDRESS, IpmiConfig

LOG = logging.getLogger(__name__)
SOFT_OFF_FILE = "ipmi_soft_off.json"

DEFAULT_REQUEST_TIMEOUT_S = 60.0  # a device request that carries no timeout
T = TypeVar("T")


@dataclass(frozen=True)
class Probe:
    """One host's BMC health: reachable, chassis power, DCMI cap, answer time."""

    host: str
    bmc: str                              # "ipmi ADDRESS:PORT", "" when the host has none
    reachable: bool
    power: PowerState = PowerState.UNKNOWN
    cap_watts: Optional[float] = None     # the limit the BMC holds (active or not)
    cap_active: Optional[bool] = None     # None: unknown (DCMI unsupported or no answer)
    latency_s: Optional[float] = None     # seconds ipmitool took for chassis power status
    error: str = ""                       # "host: ipmi ADDR:PORT: why" when not reachable
    cap_error: str = ""                   # why there is no cap reading

    def to_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        out["power"] = self.power.value
        return out


class IpmiFleet:
    """The BMCs of many hosts, called concurrently; shared by both backends."""

    def __init__(self, config: IpmiConfig) -> None:
        if shutil.which(config.settings.ipmitool) is None:
            raise BackendError("ipmi: %s not found (install the ipmitool package, or set "
                               "option ipmitool to its path)" % config.settings.ipmitool)
        self.config = config
        self.tool = IpmiTool(config.settings)
        self.credentials = load_credentials(config.credentials_file)

    def bmc(self, host: str) -> Tuple[Optional[Bmc], str]:
        """The BMC of ``host`` with its credentials, or None and why."""
        if host in self.config.bmcs:
            address, port = self.config.bmcs[host]
        elif self.config.bmc_template is not None:
            address, port = self.config.bmc_template.replace("{host}", host), self.config.port
            if not ADDRESS.match(address) or address.startswith("-"):
                return None, "ipmi: bmc_template gives %r, not a BMC address" % address
        else:
            return None, "ipmi: no BMC address (host not in option bmcs, no bmc_template)"
        try:
            cred = self.credentials.for_host(host)
        except BackendError as exc:
            return None, "ipmi: %s" % exc
        return Bmc(host, address, port, cred.username, cred.password), ""

    def each(self, hosts: Sequence[str], work: Callable[[Bmc], T],
             missing: Callable[[str, str], T]) -> Dict[str, T]:
        """``work(bmc)`` for every host at once (``missing(host, why)`` without a BMC)."""
        unique = list(dict.fromkeys(hosts))
        out: Dict[str, T] = {}
        targets = []
        for host in unique:
            bmc, why = (self.bmc(host) if isinstance(host, str) and host
                        else (None, "ipmi: invalid host name %r" % (host,)))
            if bmc is None:
                out[host] = missing(host, why)
            else:
                targets.append(bmc)
        if len(targets) == 1:
            out[targets[0].host] = work(targets[0])
        elif targets:
            with ThreadPoolExecutor(min(self.config.max_workers, len(targets))) as pool:
                for bmc, value in zip(targets, pool.map(work, targets)):
                    out[bmc.host] = value
        return {host: out[host] for host in unique}

    def probe(self, bmc: Bmc, deadline: Optional[float] = None) -> Probe:
        """Chassis power and DCMI limit of one BMC (two ipmitool calls)."""
        power, answer = self.tool.power_state(bmc, _left(deadline))
        if power is None:
            return Probe(bmc.host, bmc.label, False, latency_s=answer.seconds or None,
                         error=_line(bmc, answer.diag))
        reading, limit = self.tool.get_limit(bmc, _left(deadline))
        if reading is None:
            return Probe(bmc.host, bmc.label, True, power, latency_s=answer.seconds,
                         cap_error=_line(bmc, limit.diag))
        return Probe(bmc.host, bmc.label, True, power, float(reading.watts), reading.active,
                     answer.seconds)

    def probe_all(self, hosts: Sequence[str]) -> Dict[str, Probe]:
        """`probe` for every host at once; a host without a BMC is unreachable."""
        return self.each(hosts, self.probe,
                         lambda host, why: Probe(host, "", False, error="%s: %s" % (host, why)))


class IpmiPowerBackend(PowerBackend):
    """Host power through each host's BMC: chassis power on, soft (or hard) off, status."""

    name = "ipmi"

    def __init__(self, options: Optional[Mapping[str, Any]], state_dir: str) -> None:
        self.fleet = IpmiFleet(IpmiConfig.parse(options, "power backend 'ipmi'"))
        self.last_errors: Dict[str, str] = {}
        try:
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise BackendError("power backend 'ipmi': cannot create state directory %s (%s)"
                               % (state_dir, exc.strerror)) from None
        self.soft_offs = PendingOffLog(os.path.join(state_dir, SOFT_OFF_FILE), "ipmi")

    def request(self, kind: TransitionKind, hosts: Sequence[str],
                now: float) -> Dict[str, Result]:
        """Send the chassis command for ``kind`` to every host's BMC at once."""
        kind = TransitionKind(kind)
        if kind in (TransitionKind.SLEEP, TransitionKind.WAKE):
            diag = ("ipmi: IPMI has no sleep state, so %s is not possible; use power on/off "
                    "(power_ramp_rate_enable false)" % kind.value)
            return {host: Result(False, diag) for host in hosts}
        up = kind is TransitionKind.POWER_ON
        action = "on" if up else ("soft" if self.fleet.config.power_off == "soft" else "off")
        want = PowerState.ON if up else PowerState.OFF
        soft: List[str] = []

        def send(bmc: Bmc) -> Result:
            now_state, _answer = self.fleet.tool.power_state(bmc)
            if now_state is want:
                return Result(True, "%s: already %s" % (bmc.label, want.value))
            answer = self.fleet.tool.chassis(bmc, action)
            if answer.ok:
                note = ""
                if action == "soft":
                    soft.append(bmc.host)
                    note = " (hard off if still on after %gs)" % self.fleet.config.soft_off_timeout
                return Result(True, "%s: chassis power %s sent%s" % (bmc.label, action, note))
            return Result(False, "%s: chassis power %s failed: %s"
                          % (bmc.label, action, answer.diag))
        results = self.fleet.each(hosts, send, lambda host, why: Result(False, why))
        done = [h for h, r in results.items() if r.ok and h not in soft]
        self.soft_offs.update({h: now for h in soft}, done)
        return results

    def status(self, hosts: Sequence[str], now: float) -> Dict[str, HostPower]:
        """Chassis power of every host (UNKNOWN, with ``last_errors[host]``, on failure)."""
        def ask(bmc: Bmc) -> Tuple[PowerState, str]:
            power, answer = self.fleet.tool.power_state(bmc)
            return (power, "") if power is not None else (PowerState.UNKNOWN,
                                                          _line(bmc, answer.diag))
        found = self.fleet.each(hosts, ask, lambda host, why: (PowerState.UNKNOWN,
                                                               "%s: %s" % (host, why)))
        pending = self.soft_offs.load()
        out: Dict[str, HostPower] = {}
        drop = []
        for host, (state, error) in found.items():
            if host in pending and state is PowerState.OFF:
                drop.append(host)
            elif host in pending and state is PowerState.ON:
                state = PowerState.TRANSITIONING  # the OS is shutting down
                waited = now - pending[host]
                if waited >= self.fleet.config.soft_off_timeout and self._hard_off(host, waited):
                    drop.append(host)
            out[host] = HostPower(state, None)
            if error:
                self.last_errors[host] = error
            else:
                self.last_errors.pop(host, None)
        self.soft_offs.update({}, drop)
        return out

    def _hard_off(self, host: str, waited: float) -> bool:
        """``chassis power off`` for a host a soft off did not bring down; whether it went."""
        bmc, why = self.fleet.bmc(host)
        answer = self.fleet.tool.chassis(bmc, "off") if bmc is not None else None
        if bmc is None or not answer.ok:
            LOG.error("%s: hard off after soft off failed: %s", host,
                      why if bmc is None else _line(bmc, answer.diag))
            return False
        LOG.warning("%s: still on %.0fs after chassis power soft (soft_off_timeout=%g); "
                    "chassis power off sent", host, waited, self.fleet.config.soft_off_timeout)
        return True

    def probe(self, hosts: Sequence[str]) -> Dict[str, Probe]:
        """Reachability, chassis power, DCMI cap and latency of every host's BMC."""
        return self.fleet.probe_all(hosts)

    def check(self, host: str) -> Dict[str, Any]:
        """The ``pbs-power devices check`` protocol (see `pbs_power.devices.check`).

        One `probe` within ``call_timeout``; the cap is the DCMI limit when it is active.
        """
        bmc, why = self.fleet.bmc(host)
        if bmc is None:
            return check_answer(Probe(host, "", False, error="%s: %s" % (host, why)))
        deadline = time.monotonic() + self.fleet.config.settings.call_timeout
        return check_answer(self.fleet.probe(bmc, deadline))


def check_answer(probe: Probe) -> Dict[str, Any]:
    """A probe as the check protocol's answer: reachable, power, active cap, one-line note."""
    out: Dict[str, Any] = {"reachable": probe.reachable, "backend": "ipmi", "power_state": None,
                           "power_cap_watts": None, "diag": probe.error}
    if not probe.reachable:
        return out
    out["power_state"] = probe.power.value
    if probe.cap_error:
        out["diag"] = "no power cap: " + probe.cap_error
    elif probe.cap_active:
        out["power_cap_watts"] = probe.cap_watts
    else:
        stored = " (%g W stored)" % probe.cap_watts if probe.cap_watts else ""
        out["diag"] = "DCMI power limit not active%s: node uncapped" % stored
    return out


class IpmiDevices(DeviceBackend):
    """Node power caps of resource-group and topology policies, as DCMI power limits."""

    name = "ipmi"

    def __init__(self, config: IpmiConfig) -> None:
        self.fleet = IpmiFleet(config)

    @classmethod
    def from_options(cls, options: Optional[Mapping[str, Any]]) -> "IpmiDevices":
        """Built from the device options; BackendError names a bad option."""
        return cls(IpmiConfig.parse(options, "device backend 'ipmi'"))

    def probe(self, hosts: Sequence[str]) -> Dict[str, Probe]:
        """Reachability, chassis power, DCMI cap and latency of every host's BMC."""
        return self.fleet.probe_all(hosts)

    def handle(self, request: DeviceRequest) -> DeviceResponse:
        """Apply ``request``'s node power limit to the device's BMC, within its timeout."""
        deadline = time.monotonic() + (request.timeout_seconds or DEFAULT_REQUEST_TIMEOUT_S)
        bmc, why = self.fleet.bmc(request.device)
        if bmc is None:
            return failure(request, "%s: %s" % (request.device, why))
        if request.kind == "ping":
            return self._ping(request, bmc, deadline)
        if request.kind == "gpu_policies_update":
            return failure(request, _line(bmc, "GPU power caps are not set over IPMI; use a "
                                               "GPU backend (nvml) for this device's GPUs"),
                           device_state_json=request.device_state_json)
        try:
            model = evolve(DeviceModel.parse(request.device_model_json), gpu_count=0)
        except ValueError as exc:
            return failure(request, _line(bmc, str(exc)))
        try:
            state = DeviceState.parse(request.device_state_json, model)
        except ValueError:  # another backend's state: start from an uncapped node
            state = DeviceState.initial(model)
        payload = dict(request.payload) if isinstance(request.payload, Mapping) else {}
        gpu_results = _refused_gpus(payload.pop("gpu_policies", None))
        try:
            out = apply_request(request.kind, payload, model, state)
        except ValueError as exc:  # PolicyError is a ValueError
            return failure(request, _line(bmc, "bad %s payload: %s" % (request.kind, exc)),
                           device_state_json=state.to_json())
        return self._apply(request, bmc, model, state, out, gpu_results, deadline)

    def _apply(self, request: DeviceRequest, bmc: Bmc, model: DeviceModel, state: DeviceState,
               out: Any, gpu_results: Tuple[GPUPolicyResult, ...],
               deadline: float) -> DeviceResponse:
        """Set (or lift) the DCMI limit the new state asks for; report what the BMC holds."""
        target = out.state.node_cap_watts
        if target >= model.node_max:
            answer = self.fleet.tool.deactivate_limit(bmc, _left(deadline))
            applied = model.node_max
            ok = answer.ok or answer.reason == "unsupported"  # no limiting: already uncapped
        else:
            applied = float(math.floor(target))
            c = self.fleet.config
            answer = self.fleet.tool.set_limit(bmc, int(applied), deadline,
                                               c.dcmi_correction_ms, c.dcmi_exception_action)
            ok = answer.ok
        if not ok:
            return failure(request, _line(bmc, answer.diag), device_state_json=state.to_json())
        new_state = evolve(out.state, node_cap_watts=applied, calls=state.calls + 1)
        errors = [r.diag_msg for r in gpu_results[:1]]
        return DeviceResponse(
            request.device, request.request_id, not errors,
            _line(bmc, errors[0]) if errors else "", device_state_json=new_state.to_json(),
            power_cap_watts=applied, policy=None if out.policy is None else out.policy.to_dict(),
            gpu_results=gpu_results)

    def _ping(self, request: DeviceRequest, bmc: Bmc, deadline: float) -> DeviceResponse:
        probe = self.fleet.probe(bmc, deadline)
        cap = probe.cap_watts if probe.cap_active else None
        return DeviceResponse(request.device, request.request_id, probe.reachable, probe.error,
                              device_state_json=request.device_state_json,
                              power_cap_watts=cap, ping_time=time.time(),
                              ping_error=probe.error)


def _refused_gpus(doc: Any) -> Tuple[GPUPolicyResult, ...]:
    """A failed GPU result for every GPU a 'set' names (resets and empty sets pass)."""
    if not isinstance(doc, Mapping) or doc.get("gpu_policy_action", "set") != "set":
        return ()
    out = []
    for item in doc.get("gpu_policies") or []:
        gpu_id = item.get("gpu_id") if isinstance(item, Mapping) else None
        if isinstance(gpu_id, int) and not isinstance(gpu_id, bool):
            out.append(GPUPolicyResult(gpu_id, False, None, "GPU power caps are not set over "
                                                            "IPMI; use a GPU backend (nvml)"))
    return tuple(out)


def _line(bmc: Bmc, diag: str) -> str:
    """``host: ipmi ADDRESS:PORT: diag``, the one-line form of every per-node diagnostic."""
    return "%s: %s: %s" % (bmc.host, bmc.label, diag)


def _left(deadline: Optional[float]) -> Optional[float]:
    return None if deadline is None else deadline - time.monotonic()


