"""GPU power limits through NVML, on the GPU node itself (``pynvml`` from nvidia-ml-py).

What it does: inventory (index, UUID, name, power draw, current / default /
enforced limit and the limit constraints), setting one limit per GPU and
restoring exactly the limit a GPU had before pbs_power first changed it (kept
in the state directory, see `pbs_power.devices.gpu_cap_state`, so another
process restores it). A requested limit outside the GPU's constraints is
clamped into them or refused (``out_of_range``: ``clamp``, the default, or
``refuse``), and the result says which. Errors are per GPU (no permission,
unsupported, GPU lost); only NVML as a whole missing (no pynvml, no driver)
fails the request.

How the head node reaches it: NVML only sees the GPUs of the machine it runs
on, so the device controller on the head node uses the ``command`` device
backend to run the node agent ``pbs-power node gpu-caps OPERATION`` on the node
through the site's remote shell (its ssh or pdsh argv, from the config). The
agent reads the device request as JSON on stdin, handles it here
(`NvmlDevices`) and prints the device response as JSON: the ``command``
backend's contract. ``NvmlDevices`` can also be a device backend in-process
(``"backend": "nvml"``) where the controller runs on the GPU node itself.

Request semantics (as the simulated devices): a policy's GPU limit sets every
GPU; GPU policies set the GPUs they name (a null limit: the node policy's GPU
limit, else the saved limit); a reset, a deactivation without a topology GPU
limit and ``topology_deactivate`` restore the saved limits. Percentages are of
the GPU's maximum limit constraint. NODE limits are the BMC's business: this
backend leaves them alone and reports no node cap.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from pbs_power.groups.gpu_policy import parse_gpu_policies
from pbs_power.groups.policy import PolicyElementType, PowerLimit, parse_policy
from .errors import BackendError
from .controller import DeviceBackend, DeviceRequest, DeviceResponse, GPUPolicyResult, failure
from .gpu_cap_state import CapState, CapStateError, SavedLimits

OUT_OF_RANGE = ("clamp", "refuse")
OPTIONS = ("state_dir", "out_of_range")
STATE_DIR_ENV = "PBS_POWER_STATE_DIR"
DEFAULT_STATE_DIR = "/var/spool/pbs_power"
RESTORE = "restore"  # a target meaning: put back the saved limit

Target = Union[PowerLimit, str]  # a limit to set, or RESTORE


class NvmlUnavailable(Exception):
    """NVML cannot be used on this machine at all (no pynvml, no driver, init failed)."""


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as NVML reports it; a field NVML would not give is None (see diag)."""

    index: int
    uuid: Optional[str] = None
    name: Optional[str] = None
    power_watts: Optional[float] = None
    limit_watts: Optional[float] = None
    default_limit_watts: Optional[float] = None
    enforced_limit_watts: Optional[float] = None
    min_limit_watts: Optional[float] = None
    max_limit_watts: Optional[float] = None
    diag: str = ""


@dataclass(frozen=True)
class CapPlan:
    """What to do: ``gpus`` by index, ``default`` for every GPU not named (None: leave it)."""

    gpus: Mapping[int, Target] = field(default_factory=dict)
    default: Optional[Target] = None


def load_pynvml() -> Any:
    """The pynvml module; NvmlUnavailable naming the extra to install when missing."""
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable("NVML is not available: the Python module pynvml is missing "
                              "(install pbs-power[nvml], which brings nvidia-ml-py)") from None
    return pynvml


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _watts(milliwatts: Any) -> float:
    return float(milliwatts) / 1000.0


class Nvml:
    """An initialised NVML session (a context manager) and per-GPU reads."""

    def __init__(self) -> None:
        self.nv = load_pynvml()

    def __enter__(self) -> "Nvml":
        try:
            self.nv.nvmlInit()
        except self.nv.NVMLError as exc:
            raise NvmlUnavailable("NVML is not available: nvmlInit failed: %s (is the NVIDIA "
                                  "driver loaded on this node?)" % exc) from None
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass

    def count(self) -> int:
        try:
            return int(self.nv.nvmlDeviceGetCount())
        except self.nv.NVMLError as exc:
            raise NvmlUnavailable("NVML cannot count the GPUs: %s" % exc) from None

    def describe(self, exc: Exception) -> str:
        """An NVML error in admin words (a permission problem says so)."""
        if isinstance(exc, self.nv.NVMLError_NoPermission):
            return "no permission (%s): setting GPU power limits needs root" % exc
        return str(exc)

    def info(self, index: int) -> Tuple[GpuInfo, Any]:
        """GPU ``index``'s inventory and handle (None if NVML has no handle for it)."""
        nv, errors, values = self.nv, [], {}
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as exc:
            return GpuInfo(index, diag="no handle: %s" % self.describe(exc)), None
        reads = (("uuid", nv.nvmlDeviceGetUUID, _text), ("name", nv.nvmlDeviceGetName, _text),
                 ("power_watts", nv.nvmlDeviceGetPowerUsage, _watts),
                 ("limit_watts", nv.nvmlDeviceGetPowerManagementLimit, _watts),
                 ("default_limit_watts", nv.nvmlDeviceGetPowerManagementDefaultLimit, _watts),
                 ("enforced_limit_watts", nv.nvmlDeviceGetEnforcedPowerLimit, _watts))
        for key, read, convert in reads:
            try:
                values[key] = convert(read(handle))
            except nv.NVMLError as exc:
                errors.append("%s: %s" % (key, self.describe(exc)))
        try:
            low, high = nv.nvmlDeviceGetPowerManagementLimitConstraints(handle)
            values.update(min_limit_watts=_watts(low), max_limit_watts=_watts(high))
        except nv.NVMLError as exc:
            errors.append("limit constraints: %s" % self.describe(exc))
        return GpuInfo(index, diag="; ".join(errors), **values), handle


class GpuCaps:
    """Set and restore this node's GPU power limits, remembering what they were."""

    def __init__(self, state_dir: str, out_of_range: str = "clamp") -> None:
        if out_of_range not in OUT_OF_RANGE:
            raise BackendError("device backend 'nvml': option out_of_range must be one of %s, "
                               "not %r" % (", ".join(OUT_OF_RANGE), out_of_range))
        self.state = CapState(state_dir)
        self.out_of_range = out_of_range

    def inventory(self) -> List[GpuInfo]:
        """Every GPU of the node; NvmlUnavailable when NVML cannot be used."""
        with Nvml() as nvml:
            return [nvml.info(i)[0] for i in range(nvml.count())]

    def saved(self) -> Dict[str, Dict[str, Any]]:
        """The limits saved for restore, by GPU UUID."""
        return self.state.read()

    def apply(self, plan: CapPlan) -> List[GPUPolicyResult]:
        """Carry out ``plan`` under the state lock; one result per GPU touched, by index."""
        with Nvml() as nvml, self.state.locked() as saved:
            count = nvml.count()
            targets = dict(plan.gpus)
            if plan.default is not None:
                for index in range(count):
                    targets.setdefault(index, plan.default)
            results = []
            for index in sorted(targets):
                if not 0 <= index < count:
                    results.append(GPUPolicyResult(index, False, None, "no GPU %d (this node "
                                                   "has %d)" % (index, count)))
                    continue
                results.append(self._one(nvml, saved, index, targets[index]))
            return results

    def restore(self, indices: Optional[List[int]] = None) -> List[GPUPolicyResult]:
        """Restore the saved limit of the given GPUs (default: every GPU with one)."""
        if indices is not None:
            return self.apply(CapPlan({i: RESTORE for i in indices}))
        with Nvml() as nvml, self.state.locked() as saved:
            results = []
            for index in range(nvml.count()):
                info, handle = nvml.info(index)
                if info.uuid in saved.gpus:
                    results.append(self._restore(nvml, saved, info, handle))
            return results

    def _one(self, nvml: Nvml, saved: SavedLimits, index: int, target: Target
             ) -> GPUPolicyResult:
        info, handle = nvml.info(index)
        if handle is None or info.uuid is None:
            return GPUPolicyResult(index, False, None, "cannot identify the GPU: %s" % info.diag)
        if target == RESTORE:
            return self._restore(nvml, saved, info, handle)
        if None in (info.limit_watts, info.min_limit_watts, info.max_limit_watts):
            return GPUPolicyResult(index, False, info.limit_watts,
                                   "cannot read its power limits: %s" % info.diag)
        return self._set(nvml, saved, info, handle, target)

    def _set(self, nvml: Nvml, saved: SavedLimits, info: GpuInfo, handle: Any,
             limit: PowerLimit) -> GPUPolicyResult:
        low, high = info.min_limit_watts, info.max_limit_watts
        asked = limit.resolve(high)
        watts, note = asked, ""
        if not low <= asked <= high:
            if self.out_of_range == "refuse":
                return GPUPolicyResult(info.index, False, info.limit_watts, (
                    "refused: %g W is outside the GPU's limit range %g-%g W "
                    "(out_of_range: refuse)" % (asked, low, high)))
            watts = min(max(asked, low), high)
            note = "clamped: %g W is outside the GPU's limit range %g-%g W; set %g W" % (
                asked, low, high, watts)
        milliwatts = int(round(watts * 1000))
        current = int(round(info.limit_watts * 1000))
        if milliwatts == current:
            return GPUPolicyResult(info.index, True, watts, note or "unchanged")
        fresh = info.uuid not in saved.gpus
        saved.remember(info.uuid, info.index, current, milliwatts, time.time())
        saved.flush()  # the limit to restore is on disk before the GPU changes
        try:
            nvml.nv.nvmlDeviceSetPowerManagementLimit(handle, milliwatts)
        except nvml.nv.NVMLError as exc:
            if fresh:
                saved.forget(info.uuid)
            return GPUPolicyResult(info.index, False, info.limit_watts,
                                   "cannot set %g W: %s" % (watts, nvml.describe(exc)))
        return GPUPolicyResult(info.index, True, watts, note or "set")

    def _restore(self, nvml: Nvml, saved: SavedLimits, info: GpuInfo, handle: Any
                 ) -> GPUPolicyResult:
        entry = saved.get(info.uuid)
        if not entry:
            return GPUPolicyResult(info.index, True, info.limit_watts,
                                   "nothing to restore: pbs_power has not changed this limit")
        previous = int(entry["previous_mw"])
        try:
            nvml.nv.nvmlDeviceSetPowerManagementLimit(handle, previous)
        except nvml.nv.NVMLError as exc:
            return GPUPolicyResult(info.index, False, info.limit_watts,
                                   "cannot restore %g W: %s" % (_watts(previous),
                                                                nvml.describe(exc)))
        saved.forget(info.uuid)
        outside = ""
        current = None if info.limit_watts is None else int(round(info.limit_watts * 1000))
        if current is not None and entry.get("set_mw") not in (None, current):
            outside = " (it had been changed outside pbs_power to %g W)" % _watts(current)
        return GPUPolicyResult(info.index, True, _watts(previous),
                               "restored %g W%s" % (_watts(previous), outside))


# -- device requests ----------------------------------------------------------
def plan_of(kind: str, payload: Mapping[str, Any]) -> CapPlan:
    """The GPU limits a device request asks for; ValueError (or PolicyError) if malformed."""
    if not isinstance(payload, Mapping):
        raise ValueError("payload must be an object, not %s" % type(payload).__name__)
    if kind == "topology_deactivate":
        return CapPlan(default=RESTORE)
    if kind == "topology_activate":
        return _policy_plan(payload, deactivate=False)
    if kind == "gpu_policies_update":
        return _gpu_plan(payload, CapPlan())
    if kind == "resource_group_deactivate":
        return _policy_plan(payload.get("policy") or {}, deactivate=True)
    if kind in ("resource_group_activate", "resource_group_update"):
        plan = CapPlan()
        if payload.get("policy") is not None:
            plan = _policy_plan(payload["policy"], deactivate=False)
        if payload.get("gpu_policies") is not None:
            plan = _gpu_plan(payload["gpu_policies"], plan)
        return plan
    raise ValueError("kind %r carries no GPU limits" % (kind,))


def _gpu_limit(doc: Any, path: str) -> Optional[PowerLimit]:
    return None if doc is None else parse_policy(doc, path).limit(PolicyElementType.GPU)


def _policy_plan(doc: Any, deactivate: bool) -> CapPlan:
    """A PolicySetRequest: the policy's GPU limit on every GPU; unset restores."""
    if not isinstance(doc, Mapping):
        raise ValueError("policy request must be an object, not %s" % type(doc).__name__)
    action = "unset" if deactivate else doc.get("policy_action", "set")
    if action not in ("set", "unset"):
        raise ValueError("policy_action must be 'set' or 'unset', not %r" % (action,))
    limit = _gpu_limit(doc.get("policy"), "policy")
    if limit is not None:
        return CapPlan(default=limit)
    return CapPlan(default=RESTORE if action == "unset" else None)


def _gpu_plan(doc: Any, base: CapPlan) -> CapPlan:
    """A GPUPoliciesSetRequest over ``base``: named GPUs set, or every GPU reset."""
    if not isinstance(doc, Mapping):
        raise ValueError("GPU policies request must be an object, not %s" % type(doc).__name__)
    action = doc.get("gpu_policy_action", "set")
    if action not in ("set", "reset"):
        raise ValueError("gpu_policy_action must be 'set' or 'reset', not %r" % (action,))
    fallback: Target = _gpu_limit(doc.get("current_policy"), "current_policy") or RESTORE
    if action == "reset":
        return CapPlan(default=fallback)
    gpus = dict(base.gpus)
    for gpu in parse_gpu_policies(doc.get("gpu_policies") or [], "gpu_policies").policies:
        gpus[gpu.gpu_id] = gpu.power_limit or fallback
    return CapPlan(gpus, base.default)


class NvmlDevices(DeviceBackend):
    """Device requests carried out on this node's GPUs (see the module doc)."""

    name = "nvml"

    def __init__(self, state_dir: Optional[str] = None, out_of_range: str = "clamp") -> None:
        state_dir = state_dir or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
        self.caps = GpuCaps(state_dir, out_of_range)

    @classmethod
    def from_options(cls, options: Optional[Mapping[str, Any]]) -> "NvmlDevices":
        """Built from config options (state_dir, out_of_range); BackendError names a bad one."""
        options = dict(options or {})
        unknown = sorted(set(options) - set(OPTIONS), key=str)
        if unknown:
            raise BackendError("device backend 'nvml': unknown option(s) %s (known: %s)"
                               % (", ".join(map(repr, unknown)), ", ".join(OPTIONS)))
        return cls(options.get("state_dir"), options.get("out_of_range", "clamp"))

    def handle(self, request: DeviceRequest) -> DeviceResponse:
        """Apply ``request`` to the local GPUs; a failure names the GPU and why."""
        started = time.time()
        try:
            if request.kind == "ping":
                gpus = self.caps.inventory()
                return DeviceResponse(request.device, request.request_id, True,
                                      gpu_results=tuple(_limit_result(g) for g in gpus),
                                      ping_time=started)
            try:
                plan = plan_of(request.kind, request.payload)
            except ValueError as exc:  # PolicyError is a ValueError
                return failure(request, "bad %s payload: %s" % (request.kind, exc))
            results = self.caps.apply(plan)
        except (NvmlUnavailable, CapStateError) as exc:
            return failure(request, str(exc), ping_time=started if request.kind == "ping"
                           else None)
        errors = ["GPU %d: %s" % (r.gpu_id, r.diag_msg) for r in results if not r.ok]
        policy = request.payload.get("policy") if isinstance(request.payload, Mapping) else None
        if isinstance(policy, Mapping) and "policy_action" in policy:
            policy = policy.get("policy")
        return DeviceResponse(request.device, request.request_id, not errors, "; ".join(errors),
                              policy=policy if isinstance(policy, Mapping) else None,
                              gpu_results=tuple(results))


def _limit_result(gpu: GpuInfo) -> GPUPolicyResult:
    """A GPU's current limit as a result (for ping and show)."""
    return GPUPolicyResult(gpu.index, not gpu.diag and gpu.limit_watts is not None,
                           gpu.limit_watts, gpu.diag or (gpu.name or ""))


def inventory_dicts(gpus: List[GpuInfo]) -> List[Dict[str, Any]]:
    """GPU inventory as JSON-ready dicts."""
    return [asdict(g) for g in gpus]
