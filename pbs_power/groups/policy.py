"""Power policies: named sets of power limits, and their validation.

The semantics follow the policy API our seeds document: a `PolicyObject` has
a unique name and limits per element type (NODE, GPU, CPU, MEMORY), each a
`PowerLimit` in watts or as a percentage of the device's maximum; at least
one limit must be for the NODE. Every rule is checked with an error that
names the field (``policies[2].limits[0].power_limit.watts``).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple


class PolicyError(ValueError):
    """One or more policy problems, each ``path: message``."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


class PolicyElementType(enum.Enum):
    """Which part of a system a limit applies to."""

    NODE = 0
    GPU = 1
    CPU = 2
    MEMORY = 3

    @classmethod
    def parse(cls, value: Any, path: str, problems: List[str]) -> Optional["PolicyElementType"]:
        text = str(value).upper().replace("POLICY_ELEMENT_TYPE_", "")
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            problems.append("%s: must be one of NODE, GPU, CPU, MEMORY, got %r" % (path, value))
            return None
        for member in cls:
            if text == member.name or (isinstance(value, int) and value == member.value):
                return member
        problems.append("%s: must be one of NODE, GPU, CPU, MEMORY, got %r" % (path, value))
        return None


@dataclass(frozen=True)
class PowerLimit:
    """A limit in watts, or as a percentage of the device maximum (exactly one)."""

    watts: Optional[float] = None
    percentage: Optional[float] = None

    def resolve(self, max_watts: float) -> float:
        """Watts this limit means on a device whose maximum is ``max_watts``."""
        if self.watts is not None:
            return float(self.watts)
        return float(max_watts) * float(self.percentage) / 100.0

    def to_dict(self) -> Dict[str, float]:
        return {"watts": self.watts} if self.watts is not None else {"percentage": self.percentage}


@dataclass(frozen=True)
class PolicyLimit:
    """A power limit for one element type."""

    element_type: PolicyElementType
    power_limit: PowerLimit


@dataclass(frozen=True)
class PolicyObject:
    """A named power policy: limits per element type, and free-form properties."""

    name: str
    limits: Tuple[PolicyLimit, ...]
    properties: Mapping[str, Any] = field(default_factory=dict)

    def limit(self, element: PolicyElementType) -> Optional[PowerLimit]:
        """The first limit for ``element``, if any."""
        for lim in self.limits:
            if lim.element_type is element:
                return lim.power_limit
        return None

    def node_watts(self, node_max_watts: float) -> float:
        """The node limit in watts for a node whose maximum is ``node_max_watts``."""
        return self.limit(PolicyElementType.NODE).resolve(node_max_watts)

    def to_dict(self) -> Dict[str, Any]:
        return {"name": self.name,
                "limits": [{"element_type": l.element_type.name,
                            "power_limit": l.power_limit.to_dict()} for l in self.limits],
                "properties": dict(self.properties)}


@dataclass(frozen=True)
class OperatingRange:
    """Ceiling, target and floor of an operating range (all finite, >= 0)."""

    ceiling: float
    target: float
    floor: float


@dataclass(frozen=True)
class ComputerSystemLimitsSpec:
    """An operating range in watts or in percent of device max, plus targets."""

    operating_range_watts: Optional[OperatingRange] = None
    operating_range_percent: Optional[OperatingRange] = None
    gpu_target_percent: Optional[float] = None
    cpu_target_percent: Optional[float] = None
    memory_target_percent: Optional[float] = None


@dataclass(frozen=True)
class ScopeDevice:
    """A device selector: type and/or model (at least one)."""

    type: Optional[str] = None
    model: Optional[str] = None


@dataclass(frozen=True)
class PolicyScope:
    """Which entities a policy applies to: exactly one of the selectors."""

    entities: Optional[Tuple[str, ...]] = None
    devices: Optional[Tuple[ScopeDevice, ...]] = None
    resource_groups: Optional[Tuple[str, ...]] = None
    expr: Optional[str] = None


@dataclass(frozen=True)
class ComputerSystemLimitsPolicy:
    """A ComputerSystemLimits.v1 policy bound to the entities its scope selects."""

    type: str
    scope: PolicyScope
    spec: ComputerSystemLimitsSpec


@dataclass(frozen=True)
class GPUPolicy:
    """One GPU's limit; ``power_limit`` None removes its GPU-specific policy."""

    gpu_id: int
    power_limit: Optional[PowerLimit]


@dataclass(frozen=True)
class GPUPolicies:
    """Policies for distinct GPUs of one node."""

    policies: Tuple[GPUPolicy, ...]


# -- parsing with validation --------------------------------------------------
def _number(value: Any, path: str, problems: List[str]) -> Optional[float]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        problems.append("%s: must be a number, got %r" % (path, value))
        return None
    if not math.isfinite(value):
        problems.append("%s: must be finite, got %r" % (path, value))
        return None
    return float(value)


def _object(value: Any, path: str, problems: List[str], known: Iterable[str]) -> Dict[str, Any]:
    if not isinstance(value, Mapping):
        problems.append("%s: must be an object, got %r" % (path, value))
        return {}
    for key in value:
        if key not in known:
            problems.append("%s: unknown field %r (known: %s)" % (path, key, ", ".join(known)))
    return dict(value)


def parse_power_limit(value: Any, path: str, problems: List[str]) -> Optional[PowerLimit]:
    """``{"watts": W}`` (finite, > 0) or ``{"percentage": P}`` (finite, 0 < P <= 100)."""
    doc = _object(value, path, problems, ("watts", "percentage"))
    if not doc and isinstance(value, Mapping):
        problems.append("%s: needs one of watts or percentage" % path)
        return None
    if "watts" in doc and "percentage" in doc:
        problems.append("%s: give watts or percentage, not both" % path)
        return None
    if "watts" in doc:
        watts = _number(doc["watts"], path + ".watts", problems)
        if watts is not None and watts <= 0:
            problems.append("%s.watts: must be greater than 0, got %g" % (path, watts))
            return None
        return None if watts is None else PowerLimit(watts=watts)
    if "percentage" in doc:
        pct = _number(doc["percentage"], path + ".percentage", problems)
        if pct is not None and not 0 < pct <= 100:
            problems.append("%s.percentage: must be greater than 0 and at most 100, got %g"
                            % (path, pct))
            return None
        return None if pct is None else PowerLimit(percentage=pct)
    return None


def parse_policy(value: Any, path: str = "policy") -> PolicyObject:
    """A validated `PolicyObject` from its JSON form; PolicyError names every problem."""
    problems: List[str] = []
    policy = _parse_policy(value, path, problems)
    if problems:
        raise PolicyError(problems)
    return policy


def _parse_policy(value: Any, path: str, problems: List[str]) -> Optional[PolicyObject]:
    doc = _object(value, path, problems, ("name", "limits", "properties"))
    name = doc.get("name")
    if not isinstance(name, str) or not name.strip():
        problems.append("%s.name: must be a non-empty string, got %r" % (path, name))
    limits_doc = doc.get("limits")
    if not isinstance(limits_doc, list) or not limits_doc:
        problems.append("%s.limits: must be a non-empty list" % path)
        limits_doc = []
    limits, elements = [], []
    for i, item in enumerate(limits_doc):
        lpath = "%s.limits[%d]" % (path, i)
        ldoc = _object(item, lpath, problems, ("element_type", "power_limit"))
        element = PolicyElementType.parse(ldoc.get("element_type"), lpath + ".element_type",
                                          problems)
        elements.append(element)
        if "power_limit" not in ldoc:
            problems.append("%s.power_limit: is required" % lpath)
            continue
        limit = parse_power_limit(ldoc["power_limit"], lpath + ".power_limit", problems)
        if element is not None and limit is not None:
            limits.append(PolicyLimit(element, limit))
    if elements and None not in elements and PolicyElementType.NODE not in elements:
        problems.append("%s.limits: must include a NODE limit" % path)
    props = doc.get("properties", {})
    if not isinstance(props, Mapping):
        problems.append("%s.properties: must be an object, got %r" % (path, props))
        props = {}
    if not isinstance(name, str) or not name.strip():
        return None
    return PolicyObject(name.strip(), tuple(limits), dict(props))


def parse_policies(values: Any, path: str = "policies") -> Tuple[PolicyObject, ...]:
    """A list of policies with unique, non-empty names."""
    problems: List[str] = []
    if not isinstance(values, list):
        raise PolicyError(["%s: must be a list" % path])
    out: List[PolicyObject] = []
    seen: Dict[str, int] = {}
    for i, item in enumerate(values):
        policy = _parse_policy(item, "%s[%d]" % (path, i), problems)
        if policy is None:
            continue
        if policy.name in seen:
            problems.append("%s[%d].name: %r is already the name of %s[%d]"
                            % (path, i, policy.name, path, seen[policy.name]))
        seen.setdefault(policy.name, i)
        out.append(policy)
    if problems:
        raise PolicyError(problems)
    return tuple(out)


def parse_operating_range(value: Any, path: str, problems: List[str]) -> Optional[OperatingRange]:
    """Ceiling/target/floor: finite, >= 0, and floor <= target <= ceiling."""
    doc = _object(value, path, problems, ("ceiling", "target", "floor"))
    nums = {}
    for key in ("ceiling", "target", "floor"):
        if key not in doc:
            problems.append("%s.%s: is required" % (path, key))
            continue
        num = _number(doc[key], "%s.%s" % (path, key), problems)
        if num is not None and num < 0:
            problems.append("%s.%s: must be >= 0, got %g" % (path, key, num))
            num = None
        nums[key] = num
    if len(nums) < 3 or None in nums.values():
        return None
    if not nums["floor"] <= nums["target"] <= nums["ceiling"]:
        problems.append("%s: needs floor <= target <= ceiling, got %g <= %g <= %g"
                        % (path, nums["floor"], nums["target"], nums["ceiling"]))
        return None
    return OperatingRange(nums["ceiling"], nums["target"], nums["floor"])


def parse_limits_policy(value: Any, path: str = "policy") -> ComputerSystemLimitsPolicy:
    """A validated ComputerSystemLimits policy (type, scope, spec)."""
    problems: List[str] = []
    doc = _object(value, path, problems, ("type", "scope", "spec"))
    kind = doc.get("type")
    if not isinstance(kind, str) or not kind:
        problems.append("%s.type: must be a non-empty string, got %r" % (path, kind))
    scope = _parse_scope(doc.get("scope"), path + ".scope", problems)
    spec = _parse_spec(doc.get("spec"), path + ".spec", problems)
    if problems:
        raise PolicyError(problems)
    return ComputerSystemLimitsPolicy(kind, scope, spec)


def _parse_spec(value: Any, path: str, problems: List[str]) -> ComputerSystemLimitsSpec:
    keys = ("operating_range_watts", "operating_range_percent", "gpu_target_percent",
            "cpu_target_percent", "memory_target_percent")
    doc = _object(value, path, problems, keys)
    if "operating_range_watts" in doc and "operating_range_percent" in doc:
        problems.append("%s: give operating_range_watts or operating_range_percent, not both"
                        % path)
    ranges = {k: parse_operating_range(doc[k], "%s.%s" % (path, k), problems)
              for k in keys[:2] if k in doc}
    pct = ranges.get("operating_range_percent")
    if pct is not None and pct.ceiling > 100:
        problems.append("%s.operating_range_percent.ceiling: must be <= 100, got %g"
                        % (path, pct.ceiling))
    targets = {}
    for key in keys[2:]:
        if key in doc:
            num = _number(doc[key], "%s.%s" % (path, key), problems)
            if num is not None and not 0 <= num <= 100:
                problems.append("%s.%s: must be between 0 and 100, got %g" % (path, key, num))
            targets[key] = num
    return ComputerSystemLimitsSpec(ranges.get("operating_range_watts"), pct, **targets)


def _parse_scope(value: Any, path: str, problems: List[str]) -> PolicyScope:
    doc = _object(value, path, problems, ("entities", "devices", "resource_groups", "expr"))
    if len(doc) != 1:
        problems.append("%s: needs exactly one of entities, devices, resource_groups, expr"
                        % path)
        return PolicyScope()
    (key, item), = doc.items()
    if key == "expr":
        if not isinstance(item, str) or not item.strip():
            problems.append("%s.expr: must be a non-empty string" % path)
        return PolicyScope(expr=item)
    if not isinstance(item, list) or not item:
        problems.append("%s.%s: must contain at least one item" % (path, key))
        return PolicyScope()
    if key == "devices":
        devices = []
        for i, dev in enumerate(item):
            ddoc = _object(dev, "%s.devices[%d]" % (path, i), problems, ("type", "model"))
            if not ddoc.get("type") and not ddoc.get("model"):
                problems.append("%s.devices[%d]: needs type or model" % (path, i))
            devices.append(ScopeDevice(ddoc.get("type"), ddoc.get("model")))
        return PolicyScope(devices=tuple(devices))
    for i, name in enumerate(item):
        if not isinstance(name, str) or not name.strip():
            problems.append("%s.%s[%d]: must be a non-empty string" % (path, key, i))
    return PolicyScope(**{key: tuple(item)})


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
