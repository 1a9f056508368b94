"""Power policies: named sets of power limits, and their validation.

The semantics follow the policy API our seeds document: a `PolicyObject` has
a unique name and limits per element type (NODE, GPU, CPU, MEMORY), each a
`PowerLimit` in watts or as a percentage of the device's maximum; at least
one limit must be for the NODE. Every rule is checked with an error that
names the field (``policies[2].limits[0].power_limit.watts``). Per-GPU policies are in
`gpu_policy`, ComputerSystemLimits.v1 policies in `limits_policy`.
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
