"""SIMULATED device backend for the device controller: no hardware is touched.

`SimulatedDevices` pretends to be the BMCs and GPUs of the datacenter, for
demos, tests and benchmarks. Each request waits ``latency_ms`` +/- ``jitter_ms``
(a real blocking sleep, so the controller's concurrency is real), then applies
the request to the device model it carries and returns what it did:

* node cap: the policy's NODE limit (watts, or percent of ``node.max_watts``)
  clamped to [node.min_watts, node.max_watts]; a GPU limit in the policy sets
  every GPU. Unset (and every deactivation) goes back to the topology-level
  policy given in the payload, or to node max and each GPU's default.
* GPU policies: each named GPU's limit resolved against gpu.max_watts and
  clamped to [gpu.min_watts, gpu.max_watts]; a null limit, or a reset, goes
  back to the current node policy's GPU limit if it has one, else to
  gpu.default_watts; GPUs not named keep their limit; an id >= the GPU count
  fails that GPU (and the response) while the others are applied.

Everything it knows about a device lives in the returned device state JSON
(``node_cap_watts``, ``gpu_caps``, ``policy``, ``resource_group``, ``calls``,
``history`` of the last 20 changes), so it keeps no memory of its own.
Failures and jitter are reproducible: drawn from (seed, device, kind, calls).
"""
from __future__ import annotations

import functools
import json
import math
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Mapping, Optional, Tuple

from pbs_power._records import evolve
from pbs_power.groups.gpu_policy import parse_gpu_policies
from pbs_power.groups.policy import PolicyElementType, PolicyObject, PowerLimit, parse_policy
from .errors import BackendError
from .controller import DeviceBackend, DeviceRequest, DeviceResponse, GPUPolicyResult, failure

HISTORY = 20
HANG_EXTRA_S = 0.5        # a hung device answers this long after its request timed out
DEFAULT_TIMEOUT_S = 30.0  # for a request that carries none (called without the controller)
OPTIONS = ("latency_ms", "jitter_ms", "failure_rate", "seed", "fail_devices", "hang_devices")
_ALLOCATION = ("resource_group_activate", "resource_group_deactivate", "resource_group_update")
_TOPOLOGY = ("topology_activate", "topology_deactivate")


@dataclass(frozen=True)
class DeviceModel:
    """The power envelope of a device, from its topology model JSON."""

    node_min: float
    node_max: float
    gpu_count: int = 0
    gpu_min: float = 0.0
    gpu_max: float = 0.0
    gpu_default: float = 0.0

    @classmethod
    def parse(cls, text: str) -> "DeviceModel":
        """ValueError naming the field when the model is unusable."""
        doc = _json_object(text, "device model JSON")
        node = doc.get("node")
        if not isinstance(node, dict):
            raise ValueError("device model JSON: node must be an object with max_watts")
        node_max = _watts(node, "max_watts", "node", None)
        node_min = _watts(node, "min_watts", "node", 0.0)
        gpu = doc.get("gpu")
        if gpu is None:
            return cls(node_min, node_max)
        if not isinstance(gpu, dict):
            raise ValueError("device model JSON: gpu must be an object or null")
        count = gpu.get("count", 0)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError("device model JSON: gpu.count must be an integer >= 0, not %r"
                             % (count,))
        gpu_max = _watts(gpu, "max_watts", "gpu", None)
        return cls(node_min, node_max, count, _watts(gpu, "min_watts", "gpu", 0.0), gpu_max,
                   _watts(gpu, "default_watts", "gpu", gpu_max))


@dataclass(frozen=True)
class DeviceState:
    """What the simulated device is set to; round-trips through device_state_json."""

    node_cap_watts: float
    gpu_caps: Mapping[int, float]
    policy: Optional[str] = None
    resource_group: Optional[str] = None
    calls: int = 0
    history: Tuple[Tuple[Any, ...], ...] = field(default_factory=tuple)

    @classmethod
    def initial(cls, model: DeviceModel) -> "DeviceState":
        """Uncapped node, every GPU at its default."""
        return cls(model.node_max, {i: model.gpu_default for i in range(model.gpu_count)})

    @classmethod
    def parse(cls, text: Optional[str], model: DeviceModel) -> "DeviceState":
        """The state from its JSON (None: initial); ValueError when it is not ours."""
        if text is None or text == "":
            return cls.initial(model)
        doc = _json_object(text, "device state JSON")
        try:
            caps = {int(k): float(v) for k, v in doc.get("gpu_caps", {}).items()}
            return cls(float(doc["node_cap_watts"]), caps, doc.get("policy"),
                       doc.get("resource_group"), int(doc.get("calls", 0)),
                       tuple(tuple(h) for h in doc.get("history", [])[-HISTORY:]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError("device state JSON is not a simulated device's state (%s: %s)"
                             % (type(exc).__name__, exc)) from None

    def to_json(self) -> str:
        return json.dumps({"node_cap_watts": self.node_cap_watts,
                           "gpu_caps": {str(k): v for k, v in sorted(self.gpu_caps.items())},
                           "policy": self.policy, "resource_group": self.resource_group,
                           "calls": self.calls, "history": [list(h) for h in self.history]},
                          sort_keys=True)


@functools.lru_cache(maxsize=256)
def _model_of(text: str) -> "DeviceModel":
    """DeviceModel.parse, memoised: a fan-out sends one model text per device spec."""
    return DeviceModel.parse(text)


@dataclass(frozen=True)
class Applied:
    """The outcome of applying one request: new state and what to report."""

    state: DeviceState
    policy: Optional[PolicyObject] = None
    gpu_results: Tuple[GPUPolicyResult, ...] = ()
    errors: Tuple[str, ...] = ()


# -- pure application of requests -----------------------------------------------
def apply_request(kind: str, payload: Mapping[str, Any], model: DeviceModel,
                  state: DeviceState) -> Applied:
    """The device after ``kind``; ValueError (or PolicyError) for a malformed payload."""
    if not isinstance(payload, Mapping):
        raise ValueError("payload must be an object, not %s" % type(payload).__name__)
    deactivate = kind.endswith("_deactivate")
    if kind in _TOPOLOGY:
        out = _apply_policy_set(payload, model, state, deactivate)
    elif kind in _ALLOCATION:
        out = Applied(state)
        policy_set, gpu_set = payload.get("policy"), payload.get("gpu_policies")
        if policy_set is not None or deactivate:
            out = _apply_policy_set(policy_set or {}, model, state, deactivate)
        if gpu_set is not None:
            out = _merge(out, _apply_gpu_set(gpu_set, model, out.state))
        group = None if deactivate else payload.get("resource_group")
        out = evolve(out, state=evolve(out.state, resource_group=group))
    elif kind == "gpu_policies_update":
        out = _apply_gpu_set(payload, model, state)
    else:
        raise ValueError("kind %r is not simulated" % kind)
    entry = (kind, payload.get("resource_group"), out.state.policy, out.state.node_cap_watts)
    history = (out.state.history + (entry,))[-HISTORY:]
    return evolve(out, state=evolve(out.state, history=history))


def _apply_policy_set(doc: Any, model: DeviceModel, state: DeviceState,
                      deactivate: bool) -> Applied:
    """A PolicySetRequest: set a node policy, or unset back to the topology-level one."""
    if not isinstance(doc, Mapping):
        raise ValueError("policy request must be an object, not %s" % type(doc).__name__)
    action = "unset" if deactivate else doc.get("policy_action", "set")
    if action not in ("set", "unset"):
        raise ValueError("policy_action must be 'set' or 'unset', not %r" % (action,))
    policy = None if doc.get("policy") is None else _parsed_policy(doc["policy"], "policy")
    if policy is None and action == "set":
        raise ValueError("policy_action 'set' needs a policy")
    node_cap = model.node_max
    if policy is not None:
        node_cap = _clamp(policy.node_watts(model.node_max), model.node_min, model.node_max)
    gpu_limit = None if policy is None else policy.limit(PolicyElementType.GPU)
    caps, results = dict(state.gpu_caps), ()
    if gpu_limit is not None or action == "unset":
        caps = {i: _gpu_watts(gpu_limit, model) for i in range(model.gpu_count)}
        results = tuple(GPUPolicyResult(i, True, w) for i, w in sorted(caps.items()))
    new = evolve(state, node_cap_watts=node_cap, gpu_caps=caps,
                  policy=None if policy is None else policy.name)
    return Applied(new, policy, results)


def _apply_gpu_set(doc: Any, model: DeviceModel, state: DeviceState) -> Applied:
    """A GPUPoliciesSetRequest: set named GPUs, or reset them all."""
    if not isinstance(doc, Mapping):
        raise ValueError("GPU policies request must be an object, not %s" % type(doc).__name__)
    action = doc.get("gpu_policy_action", "set")
    if action not in ("set", "reset"):
        raise ValueError("gpu_policy_action must be 'set' or 'reset', not %r" % (action,))
    current = doc.get("current_policy")
    base = None
    if current is not None:
        base = _parsed_policy(current, "current_policy").limit(PolicyElementType.GPU)
    if action == "reset":
        caps = {i: _gpu_watts(base, model) for i in range(model.gpu_count)}
        results = tuple(GPUPolicyResult(i, True, w) for i, w in sorted(caps.items()))
        return Applied(evolve(state, gpu_caps=caps), None, results)
    caps, results, errors = dict(state.gpu_caps), [], []
    for gpu in parse_gpu_policies(doc.get("gpu_policies") or [], "gpu_policies").policies:
        if gpu.gpu_id >= model.gpu_count:
            diag = "no GPU %d (the device has %d)" % (gpu.gpu_id, model.gpu_count)
            results.append(GPUPolicyResult(gpu.gpu_id, False, None, diag))
            errors.append("GPU %d: %s" % (gpu.gpu_id, diag))
            continue
        caps[gpu.gpu_id] = _gpu_watts(gpu.power_limit or base, model)
        results.append(GPUPolicyResult(gpu.gpu_id, True, caps[gpu.gpu_id]))
    return Applied(evolve(state, gpu_caps=caps), None, tuple(results), tuple(errors))


_POLICY_CACHE: Dict[str, Any] = {}


def _parsed_policy(doc: Any, path: str):
    """parse_policy, memoised: a fan-out sends the same policy to thousands of devices."""
    try:
        key = path + json.dumps(doc, sort_keys=True)
    except (TypeError, ValueError):
        return parse_policy(doc, path)
    found = _POLICY_CACHE.get(key)
    if found is None:
        if len(_POLICY_CACHE) > 256:
            _POLICY_CACHE.clear()
        found = _POLICY_CACHE[key] = parse_policy(doc, path)
    return found


def _merge(first: Applied, then: Applied) -> Applied:
    """``then`` applied after ``first``: later GPU results win, errors add up."""
    results = {r.gpu_id: r for r in first.gpu_results}
    results.update({r.gpu_id: r for r in then.gpu_results})
    return Applied(then.state, first.policy,
                   tuple(results[k] for k in sorted(results)), first.errors + then.errors)


def _gpu_watts(limit: Optional[PowerLimit], model: DeviceModel) -> float:
    """A GPU limit in watts, clamped; None means the GPU's default."""
    if limit is None:
        return model.gpu_default
    return _clamp(limit.resolve(model.gpu_max), model.gpu_min, model.gpu_max)


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


def _json_object(text: Any, what: str) -> Dict[str, Any]:
    try:
        doc = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise ValueError("%s is not valid JSON: %s" % (what, exc)) from None
    if not isinstance(doc, dict):
        raise ValueError("%s must be an object, not %s" % (what, type(doc).__name__))
    return doc


def _watts(doc: Mapping[str, Any], key: str, section: str, default: Optional[float]) -> float:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError("device model JSON: %s.%s must be a finite number of watts >= 0, "
                         "not %r" % (section, key, value))
    return float(value)


# -- the backend --------------------------------------------------------------
class SimulatedDevices(DeviceBackend):
    """SIMULATED devices: answers device requests from the model it is sent, no hardware."""

    name = "simulated"

    def __init__(self, *, latency_ms: float = 20, jitter_ms: float = 0,
                 failure_rate: float = 0, seed: int = 0, fail_devices: Any = "",
                 hang_devices: Any = "") -> None:
        self.latency_ms = _non_negative("latency_ms", latency_ms)
        self.jitter_ms = _non_negative("jitter_ms", jitter_ms)
        self.failure_rate = _fraction("failure_rate", failure_rate)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise _option_error("seed must be an integer, not %r" % (seed,))
        self.seed = seed
        self.fail_devices = _hostlist("fail_devices", fail_devices)
        self.hang_devices = _hostlist("hang_devices", hang_devices)
        self._closed = threading.Event()

    @classmethod
    def from_options(cls, options: Optional[Mapping[str, Any]]) -> "SimulatedDevices":
        """Built from a config mapping; BackendError names an unknown or bad option."""
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise _option_error("options must be an object, not %s" % type(options).__name__)
        unknown = sorted(set(options) - set(OPTIONS), key=str)
        if unknown:
            raise _option_error("unknown option(s) %s (known: %s)"
                                % (", ".join(map(repr, unknown)), ", ".join(OPTIONS)))
        return cls(**dict(options))

    def handle(self, request: DeviceRequest) -> DeviceResponse:
        """Wait the simulated latency, then apply ``request`` (see the module doc)."""
        ready = self._begin(request)
        if isinstance(ready, DeviceResponse):
            return ready
        if ready[2] > 0:
            self._closed.wait(ready[2])
        return self._end(request, *ready)

    async def handle_async(self, request: DeviceRequest) -> DeviceResponse:
        """`handle` on the controller's event loop: the latency costs no thread."""
        ready = self._begin(request)
        if isinstance(ready, DeviceResponse):
            return ready
        if ready[2] > 0:
            import asyncio  # already loaded: this runs on the controller's event loop
            await asyncio.sleep(ready[2])
        return self._end(request, *ready)

    def _begin(self, request: DeviceRequest):
        """Parse model and state; (model, state, delay, fail draw), or a failure."""
        try:
            model = _model_of(request.device_model_json)
        except ValueError as exc:
            return failure(request, "simulated device %s: %s" % (request.device, exc))
        try:
            state = DeviceState.parse(request.device_state_json, model)
        except ValueError as exc:  # answer with a fresh state, so the next call works
            return failure(request, "simulated device %s: %s; starting afresh"
                           % (request.device, exc),
                           device_state_json=DeviceState.initial(model).to_json())
        state = evolve(state, calls=state.calls + 1)
        rng = random.Random("%d\0%s\0%s\0%d" % (self.seed, request.device, request.kind,
                                               state.calls))
        delay = self._delay(request, rng.random())
        return model, state, delay, rng.random()

    def _end(self, request: DeviceRequest, model: DeviceModel, state: DeviceState,
             _delay: float, fail_draw: float) -> DeviceResponse:
        if self._closed.is_set():
            return failure(request, "simulated devices backend is closed")
        if request.device in self.fail_devices:
            return failure(request, "simulated device failure", device_state_json=state.to_json())
        if fail_draw < self.failure_rate:
            return failure(request, "simulated random failure (failure_rate=%g)"
                           % self.failure_rate, device_state_json=state.to_json())
        if request.kind == "ping":
            return DeviceResponse(request.device, request.request_id, True,
                                  device_state_json=state.to_json(), ping_time=time.time(),
                                  power_cap_watts=state.node_cap_watts,
                                  gpu_results=tuple(GPUPolicyResult(i, True, w) for i, w
                                                    in sorted(state.gpu_caps.items())))
        return self._apply(request, model, state)

    def _apply(self, request: DeviceRequest, model: DeviceModel,
               state: DeviceState) -> DeviceResponse:
        try:
            out = apply_request(request.kind, request.payload, model, state)
        except ValueError as exc:  # PolicyError is a ValueError
            return failure(request, "bad %s payload: %s" % (request.kind, exc),
                           device_state_json=state.to_json())
        has_cap = request.kind != "gpu_policies_update"
        return DeviceResponse(
            request.device, request.request_id, not out.errors, "; ".join(out.errors),
            device_state_json=out.state.to_json(),
            power_cap_watts=out.state.node_cap_watts if has_cap else None,
            policy=None if out.policy is None else out.policy.to_dict(),
            gpu_results=out.gpu_results)

    def _delay(self, request: DeviceRequest, draw: float) -> float:
        """Seconds of latency +/- jitter, or past the timeout for a hung device."""
        if request.device in self.hang_devices:
            timeout = request.timeout_seconds or DEFAULT_TIMEOUT_S
            return timeout + HANG_EXTRA_S
        return max(0.0, self.latency_ms + self.jitter_ms * (2 * draw - 1)) / 1000.0

    def close(self) -> None:
        """Wake every sleeping request; later requests fail."""
        self._closed.set()


def _option_error(msg: str) -> BackendError:
    return BackendError("device backend 'simulated': " + msg)


def _non_negative(name: str, value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value >= 0):
        raise _option_error("option %s must be a finite number >= 0, not %r" % (name, value))
    return float(value)


def _fraction(name: str, value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and 0 <= value <= 1):
        raise _option_error("option %s must be a number from 0 to 1, not %r" % (name, value))
    return float(value)


def _hostlist(name: str, value: Any) -> FrozenSet[str]:
    """A ClusterShell hostlist expression (or a list of them) as a set of names."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        value = ",".join(value)
    if not isinstance(value, str):
        raise _option_error("option %s must be a hostlist expression, not %r" % (name, value))
    if not value.strip():
        return frozenset()
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException
    from ClusterShell.RangeSet import RangeSetException
    try:
        return frozenset(NodeSet(value, resolver=RESOLVER_NOGROUP))
    except (NodeSetException, RangeSetException) as exc:
        raise _option_error("option %s: bad hostlist %r (%s)" % (name, value, exc)) from None
