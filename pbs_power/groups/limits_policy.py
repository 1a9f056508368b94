"""ComputerSystemLimits.v1 policies: an operating range and targets for the systems a scope selects.

Parsed and checked as the policy API our seeds document; every problem is
named with its path (``policy.spec.operating_range_watts.floor``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from .policy import PolicyError, _number, _object


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
