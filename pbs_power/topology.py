"""The topology: entities (nodes) with device specs, a tree of power domains with budgets,
and the topology's policies.

A topology file is checked against ``schemas/topology.schema.json``, then for the
relations between keys; every problem names its key path. Whether a topology is
active is the service's business, not this module's.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pkgutil
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from pbs_power.config_check import (
    ConfigProblem, describe, did_you_mean, format_path, parse_hostlist, sort_problems,
)
from pbs_power.policy import (
    PolicyElementType, PolicyError, PolicyObject, parse_policies, parse_policy,
)

SCHEMA_NAME = "topology.schema.json"
SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemas", SCHEMA_NAME)
DEFAULT_BACKEND = "simulated"
DEFAULT_DEVICE_TYPE = "ComputerSystem"
DEFAULT_DOMAIN_KIND = "domain"

_TYPE_WORDS = {"integer": "an integer", "number": "a number", "string": "a string",
               "boolean": "true or false", "object": "an object", "array": "a list",
               "null": "null"}
_POLICY_ITEM = re.compile(r"policies\[\d+\]")
_PLAIN_HOST = re.compile(r"[A-Za-z0-9_.-]+")  # one host, no hostlist syntax: no NodeSet needed
_ENTITY_KEYS = frozenset(("names", "device", "domain", "policy"))


class TopologyError(ValueError):
    """A topology that cannot be used, with every problem found (``path: message`` each)."""

    def __init__(self, problems: Union[str, Sequence[str]], source: Optional[str] = None):
        self.problems: List[str] = [problems] if isinstance(problems, str) else list(problems)
        self.source = source
        super().__init__(self.__str__())

    def __str__(self) -> str:
        prefix = "%s: " % self.source if self.source else ""
        return "\n".join(prefix + p for p in self.problems)

    def __reduce__(self):
        return (type(self), (self.problems, self.source))


# -- the model -----------------------------------------------------------------
@dataclass(frozen=True)
class GPUSpec:
    """GPUs per node and the power-limit range of one GPU."""

    count: int
    min_watts: float
    max_watts: float
    default_watts: float


@dataclass(frozen=True)
class RangeSpec:
    """A component's power range (CPU, memory)."""

    min_watts: float
    max_watts: float


@dataclass(frozen=True)
class NodeSpec:
    """A whole node's power: lowest cap, idle draw, uncapped full-load draw."""

    min_watts: float
    idle_watts: float
    max_watts: float


@dataclass(frozen=True)
class DeviceSpec:
    """One kind of device (a node model) and the backend that drives it."""

    name: str
    type: str
    model: str
    node: NodeSpec
    gpu: Optional[GPUSpec]
    cpu: Optional[RangeSpec]
    memory: Optional[RangeSpec]
    backend: str

    @property
    def gpu_count(self) -> int:
        return self.gpu.count if self.gpu is not None else 0

    @property
    def non_gpu_max_watts(self) -> float:
        """Watts left for the rest of the node when every GPU draws its max (>= 0)."""
        gpus = self.gpu.count * self.gpu.max_watts if self.gpu is not None else 0.0
        return max(0.0, self.node.max_watts - gpus)

    def to_dict(self) -> Dict[str, Any]:
        """The spec in the file's form (without its name; absent parts left out)."""
        out: Dict[str, Any] = {"type": self.type, "model": self.model,
                               "node": dataclasses.asdict(self.node)}
        for part in ("gpu", "cpu", "memory"):
            if getattr(self, part) is not None:
                out[part] = dataclasses.asdict(getattr(self, part))
        out["backend"] = self.backend
        return out


@dataclass(frozen=True)
class PowerDomain:
    """A node of the power tree (feed, row, rack ...); budget None is unlimited."""

    name: str
    kind: str
    budget_watts: Optional[float]
    parent: Optional[str]
    children: Tuple[str, ...]


@dataclass(frozen=True)
class Entity:
    """A node: its device spec, the domain it sits in, its own topology policy."""

    name: str
    device: DeviceSpec
    domain: str
    policy: Optional[str]


@dataclass(frozen=True)
class Topology:
    """A validated topology; lookups are precomputed (do not mutate the mappings)."""

    name: str
    device_specs: Mapping[str, DeviceSpec]
    domains: Mapping[str, PowerDomain]
    entities: Mapping[str, Entity]
    policies: Mapping[str, PolicyObject]
    default_policy: Optional[str] = None
    warnings: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        chains: Dict[str, Tuple[str, ...]] = {}
        for name in self.domains:
            chain, at = [name], self.domains[name].parent
            while at is not None and at in self.domains and len(chain) <= len(self.domains):
                chain.append(at)
                at = self.domains[at].parent
            chains[name] = tuple(chain)
        under: Dict[str, List[str]] = {name: [] for name in self.domains}
        for entity in self.entities.values():
            for name in chains.get(entity.domain, ()):
                under[name].append(entity.name)
        object.__setattr__(self, "_chains", chains)
        object.__setattr__(self, "_under", {k: tuple(v) for k, v in under.items()})
        object.__setattr__(self, "_ranked", {})

    def _entity(self, entity: str) -> Entity:
        try:
            return self.entities[entity]
        except KeyError:
            raise KeyError("%r is not an entity of topology %r" % (entity, self.name)) from None

    def domain_chain(self, entity: str) -> Tuple[str, ...]:
        """The entity's domain, then each ancestor up to the root (KeyError if unknown)."""
        return self._chains[self._entity(entity).domain]  # type: ignore[attr-defined]

    def entities_under(self, domain: str) -> Tuple[str, ...]:
        """Entities in ``domain`` or any domain below it, in entity order."""
        try:
            return self._under[domain]  # type: ignore[attr-defined]
        except KeyError:
            raise KeyError("%r is not a power domain of topology %r"
                           % (domain, self.name)) from None

    def topology_policy(self, entity: str) -> Optional[PolicyObject]:
        """The entity's own policy, else the default policy, else None (uncapped)."""
        name = self._entity(entity).policy or self.default_policy
        return self.policies.get(name) if name is not None else None

    def node_watts(self, entity: str, policy: Optional[PolicyObject]) -> float:
        """Watts the node may draw under ``policy``: its NODE limit, within the node's range.

        No policy (or one without a NODE limit) leaves the node uncapped: max_watts.
        """
        return _node_watts(self._entity(entity).device.node, policy)

    def policies_by_node_watts(self, entity: str) -> Tuple[PolicyObject, ...]:
        """The topology's policies, most node watts for this entity first (ties: by name)."""
        return tuple(p for _w, p in self._ranking(self._entity(entity).device))

    def lower_policy(self, entity: str,
                     policy: Optional[PolicyObject]) -> Optional[PolicyObject]:
        """The topology policy next below ``policy``'s node watts for this entity, or None."""
        device = self._entity(entity).device
        current = _node_watts(device.node, policy)
        return next((p for watts, p in self._ranking(device) if watts < current), None)

    def _ranking(self, device: DeviceSpec) -> Tuple[Tuple[float, PolicyObject], ...]:
        ranked = self._ranked  # type: ignore[attr-defined]  # by NodeSpec: all watts depend on
        found = ranked.get(device.node)
        if found is None:
            pairs = [(_node_watts(device.node, p), p) for p in self.policies.values()]
            found = ranked[device.node] = tuple(sorted(pairs, key=lambda wp: (-wp[0], wp[1].name)))
        return found

    def device_model(self, entity: str) -> Dict[str, Any]:
        """The entity's device as JSON-able data, for device-controller requests."""
        device = self._entity(entity).device
        part = (lambda x: dataclasses.asdict(x) if x is not None else None)
        return {"entity": entity, "device_spec": device.name, "type": device.type,
                "model": device.model, "backend": device.backend,
                "node": dataclasses.asdict(device.node), "gpu": part(device.gpu),
                "cpu": part(device.cpu), "memory": part(device.memory)}

    def with_policy(self, policy: PolicyObject) -> "Topology":
        """A copy with one more (valid) policy; TopologyError if the name is taken."""
        if not isinstance(policy, PolicyObject):
            raise TopologyError(["policies: a policy must be a PolicyObject, got %r" % (policy,)])
        if policy.name in self.policies:
            raise TopologyError(["policies: topology %r already has a policy named %r"
                                 % (self.name, policy.name)])
        try:
            parse_policy(policy.to_dict(), "policies[%d]" % len(self.policies))
        except PolicyError as exc:
            raise TopologyError(exc.problems) from None
        return dataclasses.replace(self, policies={**self.policies, policy.name: policy})

    def to_dict(self) -> Dict[str, Any]:
        """The topology in the file's form; ``parse_topology`` gives an equal Topology back."""
        def tree(name: str) -> Dict[str, Any]:
            dom = self.domains[name]
            out = {"name": name, "kind": dom.kind, "budget_watts": dom.budget_watts}
            if dom.children:
                out["children"] = [tree(child) for child in dom.children]
            return out
        return {"name": self.name,
                "device_specs": {n: s.to_dict() for n, s in self.device_specs.items()},
                "power_domains": [tree(n) for n, d in self.domains.items() if d.parent is None],
                "policies": [p.to_dict() for p in self.policies.values()],
                "default_policy": self.default_policy,
                "entities": _entity_entries(list(self.entities.values()))}


def _node_watts(node: NodeSpec, policy: Optional[PolicyObject]) -> float:
    """A policy's NODE limit on ``node``, clamped to [min_watts, max_watts]."""
    limit = policy.limit(PolicyElementType.NODE) if policy is not None else None
    if limit is None:
        return node.max_watts
    return min(max(limit.resolve(node.max_watts), node.min_watts), node.max_watts)


def _entity_entries(entities: List[Entity]) -> List[Dict[str, Any]]:
    """Entries for runs of entities alike, as hostlists that expand back in the same order."""
    out: List[Dict[str, Any]] = []
    start = 0
    for i in range(1, len(entities) + 1):
        if i < len(entities) and _alike(entities[i]) == _alike(entities[start]):
            continue
        first = entities[start]
        for expr in _hostlists([e.name for e in entities[start:i]]):
            entry = {"names": expr, "device": first.device.name, "domain": first.domain}
            if first.policy is not None:
                entry["policy"] = first.policy
            out.append(entry)
        start = i
    return out


def _hostlists(names: List[str]) -> List[str]:
    """Fewest hostlist expressions that expand to ``names`` in this order (NodeSet sorts)."""
    from ClusterShell.NodeSet import NodeSet

    def folded(seg: List[str]) -> Optional[str]:
        expr = seg[0] if len(seg) == 1 else str(NodeSet.fromlist(seg))
        return expr if len(seg) == 1 or list(NodeSet(expr)) == seg else None

    whole = folded(names)
    if whole is not None:
        return [whole]
    rank = {name: i for i, name in enumerate(NodeSet.fromlist(names))}
    cuts = [0] + [i for i in range(1, len(names)) if rank[names[i]] < rank[names[i - 1]]]
    out = []
    for a, b in zip(cuts, cuts[1:] + [len(names)]):
        expr = folded(names[a:b])
        out.extend([expr] if expr is not None else names[a:b])
    return out


def _alike(entity: Entity) -> Tuple[str, str, Optional[str]]:
    return (entity.device.name, entity.domain, entity.policy)


# -- loading -------------------------------------------------------------------
def load_topology(path: Union[str, "os.PathLike[str]"]) -> Topology:
    """Read and validate a topology JSON file; TopologyError names the file."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as f:
            text = f.read().decode("utf-8-sig")
    except FileNotFoundError:
        raise TopologyError("file not found", source) from None
    except IsADirectoryError:
        raise TopologyError("is a directory, not a topology file", source) from None
    except OSError as exc:
        raise TopologyError("cannot read the file: %s" % (exc.strerror or exc), source) from None
    except UnicodeDecodeError as exc:
        raise TopologyError("not UTF-8 text (bad byte at offset %d)" % exc.start, source) from None
    duplicates: List[str] = []

    def pairs(items: List[Tuple[str, Any]]) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for key, value in items:
            if key in out:
                duplicates.append("duplicate key %r in one object: JSON would keep only its "
                                  "last value" % key)
            out[key] = value
        return out

    try:
        data = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise TopologyError("invalid JSON at line %d, column %d: %s"
                            % (exc.lineno, exc.colno, exc.msg), source) from None
    except RecursionError:
        raise TopologyError("invalid JSON: nested too deeply", source) from None
    try:
        topology = parse_topology(data, source)
    except TopologyError as exc:
        raise TopologyError(duplicates + exc.problems, source) from None
    if duplicates:
        raise TopologyError(duplicates, source)
    return topology


def parse_topology(doc: Any, source: str = "<topology>") -> Topology:
    """Validate a decoded topology document and build the Topology; ``doc`` is not modified.

    TopologyError lists every problem found, each naming its key path.
    """
    if not isinstance(doc, dict):
        raise TopologyError("the topology must be a JSON object ({...}), got %s"
                            % describe(doc), source)
    try:
        problems = _schema_problems(doc)
        bad = _Flagged(problems)
        topology = _build(doc, bad, problems)
    except RecursionError:
        raise TopologyError("the topology is nested too deeply", source) from None
    if problems:
        raise TopologyError([p.message for p in sort_problems(problems)], source)
    return topology


@functools.lru_cache(maxsize=1)
def load_schema() -> Dict[str, Any]:
    """The topology JSON Schema shipped in ``pbs_power/schemas``."""
    try:
        with open(SCHEMA_FILE, "rb") as f:
            raw = f.read()
    except OSError:  # e.g. installed in a zip: ask the loader instead
        raw = pkgutil.get_data("pbs_power", "schemas/" + SCHEMA_NAME) or b""
    return json.loads(raw.decode("utf-8"))


@functools.lru_cache(maxsize=None)
def _validator(definition: Optional[str] = None) -> Any:
    """A validator of the whole topology, or of one of the schema's definitions."""
    from jsonschema import Draft7Validator
    root = load_schema()
    if definition is None:
        return Draft7Validator(root)
    return Draft7Validator({"definitions": root["definitions"],
                            "$ref": "#/definitions/%s" % definition})


def _problem(parts: Sequence[Any], text: str, shown: Optional[Sequence[Any]] = None) -> ConfigProblem:
    """A problem at ``parts``, worded ``path: text`` (``shown`` overrides the path shown)."""
    where = format_path(parts if shown is None else shown)
    return ConfigProblem(format_path(parts), "%s: %s" % (where, text) if where else text)


def _schema_problems(doc: Mapping[str, Any]) -> List[ConfigProblem]:
    """Non-finite numbers, then schema errors (one per mistake), as problems."""
    out: List[ConfigProblem] = []
    stack: List[Tuple[Tuple[Any, ...], Any]] = [((), doc)]
    while stack:
        parts, value = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            out.append(_problem(parts, "must be a finite number, got %s" % value))
        elif isinstance(value, dict):
            stack.extend((parts + (k,), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((parts + (i,), v) for i, v in enumerate(value))
    nonfinite = {p.path for p in out}
    entities = doc.get("entities")
    errors = []
    if isinstance(entities, list):  # jsonschema is slow: check plain entries by hand
        doc = dict(doc, entities=[])
        errors = [(("entities", i) + tuple(err.absolute_path), err)
                  for i, entry in enumerate(entities) if not _plain_entity(entry)
                  for err in _validator("entity").iter_errors(entry)]
    errors += [(tuple(err.absolute_path), err) for err in _validator().iter_errors(doc)]
    for parts, err in errors:
        if format_path(parts) not in nonfinite:
            out.extend(_explain(err, parts))
    return out


def _plain_entity(entry: Any) -> bool:
    """True for an entry the entity schema surely accepts (a quick test for the common case)."""
    return isinstance(entry, dict) and _ENTITY_KEYS.issuperset(entry) and all(
        isinstance(entry.get(k), str) and entry[k] for k in ("names", "device", "domain")) \
        and (entry.get("policy") is None or isinstance(entry["policy"], str) and entry["policy"])


def _explain(err: Any, parts: Tuple[Any, ...]) -> List[ConfigProblem]:
    """One jsonschema error in plain words."""
    kind, want, got = err.validator, err.validator_value, err.instance
    if kind == "additionalProperties":
        known = sorted(err.schema.get("properties", {}))
        out = []
        for key in (k for k in got if k not in known):
            hint = did_you_mean(key, known)
            if not hint:
                hint = " (known keys: %s)" % ", ".join(known)
            out.append(_problem(parts + (key,), "unknown key %r%s" % (key, hint), parts))
        return out
    if kind == "type":
        wanted = " or ".join(_TYPE_WORDS.get(t, t) for t in ([want] if isinstance(want, str)
                                                              else want))
        text = "must be %s, got %s" % (wanted, describe(got))
    elif kind == "exclusiveMinimum":
        text = "must be greater than %s, got %s" % (want, describe(got))
    elif kind == "minimum":
        text = "must be %s or more, got %s" % (want, describe(got))
    elif kind == "maximum":
        text = "must be %s or less, got %s" % (want, describe(got))
    elif kind in ("minLength", "minItems"):
        text = "must not be empty"
    elif kind == "required":  # flagged at the missing key, so the rest is still checked
        missing = [k for k in want if k not in got]
        return [_problem(parts + (missing[0],), "needs the key %s"
                         % ", ".join(repr(k) for k in missing), parts or ["the topology"])]
    else:
        text = err.message
    return [_problem(parts, text, parts or ["the topology"])]


class _Flagged:
    """Key paths with a problem: checks of anything at, above or below them are skipped."""

    def __init__(self, problems: Sequence[ConfigProblem]):
        self.paths = [p.path for p in problems]

    def __call__(self, *parts: Any) -> bool:
        if not self.paths:
            return False
        path = format_path(parts)
        return any(p == path or _within(p, path) or _within(path, p) for p in self.paths)


def _within(path: str, ancestor: str) -> bool:
    return ancestor == "" or path.startswith(ancestor + ".") or path.startswith(ancestor + "[")


# -- relations between keys ---------------------------------------------------
def _build(doc: Mapping[str, Any], bad: _Flagged,
           problems: List[ConfigProblem]) -> Optional[Topology]:
    """Check what the schema cannot; the Topology if nothing at all is wrong."""
    raw_specs = doc.get("device_specs") if isinstance(doc.get("device_specs"), dict) else {}
    specs = {name: _device_spec(name, raw, problems) for name, raw in raw_specs.items()
             if not bad("device_specs", name)}
    domains, paths = _domains(doc.get("power_domains"), bad, problems)
    policies, policy_names = _policies(doc.get("policies", []), bad, problems)
    default = doc.get("default_policy")
    if isinstance(default, str) and not bad("default_policy") and policy_names is not None:
        _reference(("default_policy",), default, "policy", policy_names, problems)
    entities = _entities(doc.get("entities"), bad, problems, specs, list(raw_specs),
                         list(paths), policy_names)
    if problems:
        return None
    return Topology(doc["name"], specs, domains, entities, policies, default,
                    _budget_warnings(domains, paths))


def _device_spec(name: str, raw: Mapping[str, Any], problems: List[ConfigProblem]) -> DeviceSpec:
    """A DeviceSpec from a schema-valid spec; its watts relations checked."""
    parts = ("device_specs", name)
    node = NodeSpec(*(float(raw["node"][k]) for k in ("min_watts", "idle_watts", "max_watts")))
    if not node.min_watts <= node.idle_watts <= node.max_watts:
        problems.append(_problem(parts + ("node",), "needs min_watts <= idle_watts <= max_watts, "
                                 "got %g <= %g <= %g" % dataclasses.astuple(node)))
    gpu = None
    if "gpu" in raw:
        g = raw["gpu"]
        gpu = GPUSpec(int(g["count"]), float(g["min_watts"]), float(g["max_watts"]),
                      float(g.get("default_watts", g["max_watts"])))
        if not gpu.min_watts <= gpu.default_watts <= gpu.max_watts:
            problems.append(_problem(parts + ("gpu",), "needs min_watts <= default_watts <= "
                                     "max_watts, got %g <= %g <= %g"
                                     % (gpu.min_watts, gpu.default_watts, gpu.max_watts)))
        if gpu.count * gpu.min_watts > node.max_watts:
            problems.append(_problem(parts + ("gpu", "min_watts"), (
                "%d GPUs at min_watts %g W draw %g W, more than node.max_watts %g W"
                % (gpu.count, gpu.min_watts, gpu.count * gpu.min_watts, node.max_watts))))
    ranges = {}
    for part in ("gpu", "cpu", "memory"):
        if part in raw and raw[part]["max_watts"] > node.max_watts:
            problems.append(_problem(parts + (part, "max_watts"), "%g W is more than "
                                     "node.max_watts %g W" % (raw[part]["max_watts"],
                                                              node.max_watts)))
        if part != "gpu" and part in raw:
            ranges[part] = RangeSpec(float(raw[part]["min_watts"]), float(raw[part]["max_watts"]))
            if ranges[part].min_watts > ranges[part].max_watts:
                problems.append(_problem(parts + (part,), "needs min_watts <= max_watts, got "
                                         "%g > %g" % dataclasses.astuple(ranges[part])))
    return DeviceSpec(name, raw.get("type", DEFAULT_DEVICE_TYPE), raw.get("model", name), node,
                      gpu, ranges.get("cpu"), ranges.get("memory"),
                      raw.get("backend", DEFAULT_BACKEND))


def _domains(roots: Any, bad: _Flagged, problems: List[ConfigProblem]
             ) -> Tuple[Dict[str, PowerDomain], Dict[str, str]]:
    """Domains in tree pre-order, and the key path of each name (all names, valid or not)."""
    domains: Dict[str, Optional[PowerDomain]] = {}
    paths: Dict[str, str] = {}

    def visit(raw: Any, parts: Tuple[Any, ...], parent: Optional[str]) -> Optional[str]:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) \
                or bad(*parts, "name"):
            return None
        name = raw["name"]
        if name in paths:
            problems.append(_problem(parts + ("name",), "%r is already the name of %s"
                                     % (name, paths[name])))
            name = None
        else:
            paths[name] = format_path(parts)
            domains[name] = None  # keeps pre-order: filled in below
        kids = raw.get("children") if isinstance(raw.get("children"), list) else []
        children = [visit(kid, parts + ("children", i), name) for i, kid in enumerate(kids)]
        if name is not None:
            budget = raw.get("budget_watts")
            domains[name] = PowerDomain(
                name, raw.get("kind", DEFAULT_DOMAIN_KIND),
                float(budget) if budget is not None and not bad(*parts, "budget_watts") else None,
                parent, tuple(c for c in children if c is not None))
        return name

    for i, root in enumerate(roots if isinstance(roots, list) else []):
        visit(root, ("power_domains", i), None)
    return {k: v for k, v in domains.items() if v is not None}, paths


def _budget_warnings(domains: Mapping[str, PowerDomain], paths: Mapping[str, str]
                     ) -> Tuple[str, ...]:
    """A warning for each budget above the budget of its nearest budgeted ancestor."""
    out = []
    for dom in domains.values():
        above = dom.parent
        while above is not None and domains[above].budget_watts is None:
            above = domains[above].parent
        if dom.budget_watts is not None and above is not None \
                and dom.budget_watts > domains[above].budget_watts:
            out.append("%s.budget_watts: budget of %r (%g W) exceeds the %g W of %s %r; "
                       "allowed, %r still limits" % (
                           paths[dom.name], dom.name, dom.budget_watts,
                           domains[above].budget_watts,
                           "its parent" if above == dom.parent else "its ancestor",
                           above, above))
    return tuple(out)


def _policies(raw: Any, bad: _Flagged, problems: List[ConfigProblem]
              ) -> Tuple[Dict[str, PolicyObject], Optional[List[str]]]:
    """Policies by name, and the names declared (None: the list itself is broken)."""
    if not isinstance(raw, list):
        return {}, None
    names = [p["name"].strip() for p in raw if isinstance(p, dict)
             and isinstance(p.get("name"), str)]
    try:
        return {p.name: p for p in parse_policies(raw, "policies")}, names
    except PolicyError as exc:
        for text in exc.problems:
            path = text.split(": ", 1)[0]
            item = _POLICY_ITEM.match(path)
            if not bad(item.group(0) if item else path):
                problems.append(ConfigProblem(path, text))
        return {}, names


def _entities(raw: Any, bad: _Flagged, problems: List[ConfigProblem],
              specs: Mapping[str, DeviceSpec], spec_names: List[str], domain_names: List[str],
              policy_names: Optional[List[str]]) -> Dict[str, Entity]:
    """Entities in file order; each named once, with a known device, domain and policy."""
    first: Dict[str, int] = {}
    out: Dict[str, Entity] = {}
    for i, entry in enumerate(raw if isinstance(raw, list) else []):
        parts = ("entities", i)
        if not isinstance(entry, dict):
            continue
        refs = (("device", "device spec", spec_names), ("domain", "power domain", domain_names),
                ("policy", "policy", policy_names))
        for key, what, known in refs:
            if isinstance(entry.get(key), str) and known is not None and not bad(*parts, key):
                _reference(parts + (key,), entry[key], what, known, problems)
        if not isinstance(entry.get("names"), str) or bad(*parts, "names"):
            continue
        hosts = _hostlist(entry["names"], parts + ("names",), problems)
        again: Dict[int, List[str]] = {}
        for host in hosts:
            if host in first:
                again.setdefault(first[host], []).append(host)
                continue
            first[host] = i
            if not problems:
                out[host] = Entity(host, specs[entry["device"]], entry["domain"],
                                   entry.get("policy"))
        for j, hosts_again in again.items():
            problems.append(_problem(parts + ("names",), "%s already named by entities[%d].names"
                                     " (each entity belongs to one entry)"
                                     % (_fold(hosts_again), j)))
    return out


def _hostlist(expr: str, parts: Tuple[Any, ...], problems: List[ConfigProblem]) -> List[str]:
    """The hosts of a hostlist expression, in expansion order; [] after a problem."""
    if _PLAIN_HOST.fullmatch(expr):
        return [expr]
    found: List[ConfigProblem] = []
    nodes = parse_hostlist(expr, parts, found)
    path = format_path(parts)
    for p in found:  # config_check words them "<path> is ...": reword as "<path>: is ..."
        text = p.message[len(path) + 1:] if p.message.startswith(path + " ") else p.message
        problems.append(_problem(parts, text))
    if nodes is not None and len(nodes) == 0:
        problems.append(_problem(parts, "names no host: %r" % expr))
    return list(nodes) if nodes is not None and not found else []


def _reference(parts: Tuple[Any, ...], name: str, what: str, known: List[str],
               problems: List[ConfigProblem]) -> None:
    """A problem unless ``name`` is one of ``known``; suggests a close match."""
    if name in known:
        return
    hint = did_you_mean(name, known)
    if not hint:
        hint = " (known: %s)" % (", ".join(map(repr, known[:10])) or "none")
    problems.append(_problem(parts, "no %s named %r%s" % (what, name, hint)))


def _fold(hosts: List[str]) -> str:
    from ClusterShell.NodeSet import NodeSet
    return str(NodeSet.fromlist(hosts))
