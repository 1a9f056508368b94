"""The checks behind :func:`pbs_power.groups.topology.parse_topology`, over plain data.

JSON with duplicate keys caught, JSON Schema errors turned into one plain sentence
each, then the relations between keys the schema cannot state (watts ranges, unique
domain and entity names, references to device specs, domains and policies). Every
problem names its key path.

:mod:`pbs_power.groups.topology` imports this module, so the model classes it builds are
imported inside the functions that build them, never at module level.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Tuple

from pbs_power.config.checks import (
    ConfigProblem, describe, did_you_mean, format_path, load_packaged_schema, parse_hostlist,
)
from pbs_power.groups.policy import PolicyElementType, PolicyError, PolicyObject, parse_policies

if TYPE_CHECKING:  # pragma: no cover
    from pbs_power.groups.topology_model import DeviceSpec, Entity, PowerDomain, Topology

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


def decode_json(text: str) -> Tuple[Any, List[str]]:
    """The decoded document, and a problem for each key repeated within one object.

    ``json.JSONDecodeError`` and ``RecursionError`` pass through to the caller.
    """
    duplicates: List[str] = []

    def pairs(items: List[Tuple[str, Any]]) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for key, value in items:
            if key in out:
                duplicates.append("duplicate key %r in one object: JSON would keep only its "
                                  "last value" % key)
            out[key] = value
        return out

    return json.loads(text, object_pairs_hook=pairs), duplicates


def check_topology(doc: Mapping[str, Any], schema: bool = True
                   ) -> Tuple[Optional[Topology], List[ConfigProblem]]:
    """Check a decoded topology object: the Topology if nothing is wrong, and the problems.

    Unsorted problems; ``RecursionError`` passes through for a document nested too deeply.
    ``schema=False`` skips the JSON Schema pass (and importing jsonschema): only for
    documents this package wrote itself from a validated topology.
    """
    problems = _schema_problems(doc) if schema else []
    topology = _build(doc, _Flagged(problems), problems)
    return topology, problems


# -- the schema ----------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def load_schema() -> Dict[str, Any]:
    """The topology JSON Schema shipped in ``pbs_power/schemas``."""
    return load_packaged_schema(SCHEMA_NAME)


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
    from pbs_power.groups.topology_model import Topology
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
    topology = Topology(doc["name"], specs, domains, entities, policies, default,
                        _budget_warnings(domains, paths))
    return dataclasses.replace(topology, warnings=topology.warnings + tuple(
        _default_overruns(topology, paths)) + tuple(_clamp_warnings(topology)))


def _default_overruns(topology: "Topology", paths: Mapping[str, str]) -> List[str]:
    """A warning for each budget its entities overrun under their topology policies alone
    (an entity with none counts at max_watts): activation cannot hold that budget."""
    out = []
    for name, domain in topology.domains.items():
        if domain.budget_watts is None:
            continue
        under = topology.entities_under(name)
        watts = sum(topology.node_watts(e, topology.topology_policy(e)) for e in under)
        if watts > domain.budget_watts:
            out.append("%s.budget_watts: %r holds %d entities that draw %g W under their "
                       "topology policies (default %s), over its budget of %g W: raise the "
                       "budget or set a lower default_policy" % (
                           paths[name], name, len(under), watts,
                           topology.default_policy or "none: uncapped", domain.budget_watts))
    return out


def _clamp_warnings(topology: "Topology") -> List[str]:
    """A warning for each policy whose NODE limit no device spec can hold: it is clamped
    on every node (a policy meant for one kind of node may well be clamped on another)."""
    nodes = [spec.node for spec in topology.device_specs.values()]
    if not nodes:
        return []
    floor, ceiling = min(n.min_watts for n in nodes), max(n.max_watts for n in nodes)
    out = []
    for policy in topology.policies.values():
        limit = policy.limit(PolicyElementType.NODE)
        watts = limit.watts if limit is not None else None
        if watts is not None and (watts > ceiling or watts < floor):
            out.append("policy %r: NODE limit %g W is outside every device spec's range "
                       "(%g-%g W across the specs); each node applies its own min_watts or "
                       "max_watts instead" % (policy.name, watts, floor, ceiling))
    return out


def _device_spec(name: str, raw: Mapping[str, Any], problems: List[ConfigProblem]) -> DeviceSpec:
    """A DeviceSpec from a schema-valid spec; its watts relations checked."""
    from pbs_power.groups.topology_model import DeviceSpec, GPUSpec, NodeSpec, RangeSpec
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
    from pbs_power.groups.topology_model import PowerDomain
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
    from pbs_power.groups.topology_model import Entity
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
