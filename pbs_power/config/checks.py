"""The checks behind :func:`pbs_power.config.hook_config.parse_config`, over plain data.

Numeric-string coercion (PBS_power.CF writes ``"1800"``), JSON Schema errors
turned into one plain sentence each, and hostlist parsing. Everything here is
pure: it reads the shipped schema and its arguments and returns new values.
"""
from __future__ import annotations

import functools
import json
import math
import os
import pkgutil
import re
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

SCHEMA_NAME = "hook_config.schema.json"
SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemas", SCHEMA_NAME)

#: Backend types that are planned but not in this version: naming one gets a
#: "not available" error rather than "unknown". Remove a type from here when
#: its ``<type>_backend`` definition and enum entry land in the schema.
FUTURE_BACKENDS = ("ipmi",)
#: Device backends that are not power backends (they cap GPUs, they do not power hosts).
DEVICE_ONLY_BACKENDS = ("nvml",)

#: A hostlist naming more hosts than this is taken for a typo (n[1-100000000]),
#: and refused before ClusterShell expands it (which would take minutes).
MAX_HOSTS = 100000

_INT_RE = re.compile(r"[+-]?[0-9]+")
_FLOAT_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
_HOST_RE = re.compile(r"[A-Za-z0-9_.-]+")
_NEGATIVE_RANGE = re.compile(r"[\[,]\s*-")
_TYPE_WORDS = {
    "integer": "an integer", "number": "a number", "string": "a string",
    "boolean": "true or false", "object": "an object", "array": "a list",
    "null": "null",
}

Parts = Tuple[Any, ...]  # key names (str) and list indices (int)


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a configuration: its key path and a full sentence."""

    path: str
    message: str

    def __str__(self) -> str:
        return self.message


class ConfigError(ValueError):
    """A configuration that cannot be used, with every problem found (not only the first)."""

    def __init__(self, problems: Union[str, Sequence[ConfigProblem]],
                 source: Optional[str] = None):
        if isinstance(problems, str):
            problems = [ConfigProblem("", problems)]
        self.problems: List[ConfigProblem] = list(problems)
        self.source = source
        super().__init__(self.__str__())

    def __str__(self) -> str:
        prefix = "%s: " % self.source if self.source else ""
        return "\n".join(prefix + p.message for p in self.problems)

    def __reduce__(self):
        return (type(self), (self.problems, self.source))


def format_path(parts: Iterable[Any]) -> str:
    """``('node_power_overrides', 0, 'nodes')`` -> ``node_power_overrides[0].nodes``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += "[%d]" % part
        else:
            out += ("." if out else "") + str(part)
    return out


def problem(parts: Parts, message: str) -> ConfigProblem:
    """A problem at ``parts`` (a key path as a tuple)."""
    return ConfigProblem(format_path(parts), message)


def sort_problems(problems: Iterable[ConfigProblem]) -> List[ConfigProblem]:
    """Problems in key-path order (list indices numerically), duplicates dropped."""
    def key(p: ConfigProblem):
        tokens = [t for t in re.split(r"[.\[\]]", p.path) if t]
        return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in tokens]
    unique = list(dict.fromkeys(problems))
    return sorted(unique, key=key)


def describe(value: Any) -> str:
    """A value as an error message quotes it, in JSON words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return repr(value)


def did_you_mean(word: Any, choices: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest choice, or ``''``."""
    if not isinstance(word, str):
        return ""
    lowered = {c.lower(): c for c in choices}
    import difflib  # only when a word is misspelt
    match = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return " (did you mean %r?)" % lowered[match[0]] if match else ""


def load_packaged_schema(name: str) -> Dict[str, Any]:
    """A JSON Schema shipped in ``pbs_power/schemas`` (from a zip too)."""
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemas", name),
                  "rb") as f:
            raw = f.read()
    except OSError:  # e.g. installed in a zip: ask the loader instead
        raw = pkgutil.get_data("pbs_power", "schemas/" + name) or b""
    return json.loads(raw.decode("utf-8"))


@functools.lru_cache(maxsize=1)
def load_schema() -> Dict[str, Any]:
    """The hook-config JSON Schema shipped in ``pbs_power/schemas``."""
    return load_packaged_schema(SCHEMA_NAME)


def _resolve(schema: Dict[str, Any], root: Dict[str, Any]) -> Dict[str, Any]:
    """Follow local ``$ref`` (``#/definitions/x``) until a real schema."""
    while "$ref" in schema:
        node: Any = root
        for name in schema["$ref"].lstrip("#/").split("/"):
            node = node[name]
        schema = node
    return schema


def _types(schema: Dict[str, Any]) -> List[str]:
    kind = schema.get("type", [])
    return [kind] if isinstance(kind, str) else list(kind)


def available_backends() -> Tuple[str, ...]:
    """Power backend types implemented in this version."""
    prop = load_schema()["properties"]["power_backend"]["properties"]["type"]
    return tuple(prop["enum"])


def backend_option_schema(backend_type: str) -> Dict[str, Any]:
    """The schema of one backend's options (definitions/<type>_backend)."""
    return load_schema()["definitions"]["%s_backend" % backend_type]


def backend_defaults(backend_type: str) -> Dict[str, Any]:
    """Defaults of a backend's options, from the schema (``{}`` if unknown)."""
    root = load_schema()
    if "%s_backend" % backend_type not in root["definitions"]:
        return {}
    out = {}
    for name, prop in backend_option_schema(backend_type)["properties"].items():
        prop = _resolve(prop, root)
        if name != "type" and "default" in prop:
            out[name] = prop["default"]
    return out


def hostlist_options(backend_type: str) -> List[str]:
    """Options of a backend that are hostlists (normalized at load time)."""
    props = backend_option_schema(backend_type)["properties"]
    return [n for n, p in props.items() if p.get("$ref") == "#/definitions/hostlist"]


class _Coercer:
    """Turns numeric and boolean strings into numbers and booleans, by the schema."""

    def __init__(self, root: Dict[str, Any]):
        self.root = root
        self.problems: List[ConfigProblem] = []
        self.bad: Set[Parts] = set()

    def value(self, value: Any, schema: Dict[str, Any], parts: Parts) -> Any:
        schema = _resolve(schema, self.root)
        types = _types(schema)
        numeric = ("number" in types or "integer" in types) and "string" not in types
        if numeric and isinstance(value, str):
            return self.number(value, schema, parts)
        if numeric and isinstance(value, float) and not math.isfinite(value):
            return self.fail(parts, "%s must be a finite number, got %s"
                             % (format_path(parts), value), value)
        if "boolean" in types and isinstance(value, str):
            word = value.strip().lower()
            return word == "true" if word in ("true", "false") else value
        if isinstance(value, dict):
            return self.mapping(value, schema, parts)
        if isinstance(value, list) and "items" in schema:
            return [self.value(v, schema["items"], parts + (i,)) for i, v in enumerate(value)]
        return value

    def mapping(self, value: Dict[str, Any], schema: Dict[str, Any], parts: Parts) -> Dict[str, Any]:
        subs = [schema] + self.conditional(value, schema)
        out = {}
        for key, item in value.items():
            for sub in subs:
                prop = sub.get("properties", {}).get(key)
                if prop is not None:
                    item = self.value(item, prop, parts + (key,))
            out[key] = item
        return out

    def conditional(self, value: Dict[str, Any], schema: Dict[str, Any]) -> List[Dict[str, Any]]:
        """The ``then`` schemas of ``allOf: [{if, then}]`` whose ``if`` holds."""
        out = []
        for sub in schema.get("allOf", []):
            sub = _resolve(sub, self.root)
            if "if" in sub and "then" in sub and if_holds(sub["if"], value):
                out.append(_resolve(sub["then"], self.root))
        return out

    def number(self, text: str, schema: Dict[str, Any], parts: Parts) -> Any:
        stripped = text.strip()
        if _INT_RE.fullmatch(stripped):
            return int(stripped)
        if _FLOAT_RE.fullmatch(stripped) and math.isfinite(float(stripped)):
            return float(stripped)
        unit = schema.get("x-unit")
        wanted = "%s as a number or a numeric string" % unit if unit else "a number or a numeric string"
        return self.fail(parts, "%s wants %s, got %r" % (format_path(parts), wanted, text), text)

    def fail(self, parts: Parts, message: str, value: Any) -> Any:
        self.problems.append(problem(parts, message))
        self.bad.add(parts)
        return value


def if_holds(schema: Dict[str, Any], value: Dict[str, Any]) -> bool:
    """Whether the object ``value`` matches an ``if`` schema.

    The form our schemas use (``required`` keys, ``properties`` with a string
    ``const``) is decided here, so loading a config already known to be valid
    needs no jsonschema import; any other form goes to jsonschema.
    """
    props = schema.get("properties", {})
    if set(schema) <= {"required", "properties"} and all(
            set(p) == {"const"} and isinstance(p["const"], str) for p in props.values()):
        return (all(k in value for k in schema.get("required", ()))
                and all(k not in value or value[k] == p["const"] for k, p in props.items()))
    from jsonschema import Draft7Validator
    return Draft7Validator(schema).is_valid(value)


def _explain(err: Any, parts: Parts) -> List[ConfigProblem]:
    """One jsonschema ValidationError as our problems (one per unknown key)."""
    name = format_path(parts) or "the configuration"
    kind, want, got = err.validator, err.validator_value, err.instance
    if kind == "additionalProperties":
        known = sorted(err.schema.get("properties", {}))
        return [problem(parts + (key,), unknown_key_message(key, parts, known))
                for key in got if key not in known]
    if kind == "type":
        expected = err.schema.get("x-expected") or " or ".join(
            _TYPE_WORDS.get(t, t) for t in ([want] if isinstance(want, str) else want))
        text = "%s must be %s, got %s" % (name, expected, describe(got))
    elif kind == "exclusiveMinimum":
        text = "%s must be greater than %s, got %s" % (name, want, describe(got))
    elif kind == "minimum":
        text = "%s must be %s or more, got %s" % (name, want, describe(got))
    elif kind == "maximum":
        why = err.schema.get("x-maximum-why")
        text = "%s must be %s or less%s, got %s" % (name, want, " (%s)" % why if why else "",
                                                     describe(got))
    elif kind in ("minLength", "minItems"):
        text = "%s must not be empty" % name
    elif kind == "enum" and parts[:1] == ("power_backend",) and parts[-1:] == ("type",):
        text = backend_type_message(got, name, nested=len(parts) > 2)
    elif kind == "enum":
        text = "%s must be one of %s, got %s%s" % (
            name, ", ".join(repr(w) for w in want), describe(got), did_you_mean(got, want))
    elif kind == "pattern" and err.schema.get("x-expected"):
        text = "%s: %s is not %s" % (name, describe(got), err.schema["x-expected"])
    elif kind == "required":
        missing = [k for k in want if k not in got]
        text = "%s needs the key %s" % (name, ", ".join(repr(k) for k in missing))
    else:
        text = "%s: %s" % (name, err.message)
    return [problem(parts, text)]


def unknown_key_message(key: str, parent: Parts, known: Sequence[str]) -> str:
    """``unknown key 'x' [in parent] (did you mean 'y'?)``."""
    where = " in %s" % format_path(parent) if parent else ""
    hint = did_you_mean(key, known)
    if not hint and len(known) <= 8:
        hint = " (known keys: %s)" % ", ".join(known)
    return "unknown key %r%s%s" % (key, where, hint)


def backend_type_message(value: Any, name: str = "power_backend.type",
                         nested: bool = False) -> str:
    """Why a power backend type cannot be used, naming the available types.

    ``nested``: the type of a node group's backend, where ``groups`` cannot be named.
    """
    types = tuple(t for t in available_backends() if not (nested and t == "groups"))
    available = ", ".join(types)
    if nested and value == "groups":
        return "%s cannot be 'groups': node groups do not nest (available: %s)" % (
            name, available)
    if isinstance(value, str) and value in FUTURE_BACKENDS:
        return ("%s %r is not available in this version (available: %s)"
                % (name, value, available))
    if isinstance(value, str) and value in DEVICE_ONLY_BACKENDS:
        return ("%s %r names a device backend (power caps), not a power backend: configure "
                "it in job_policies.device_options (available here: %s)"
                % (name, value, available))
    hint = did_you_mean(value, types + FUTURE_BACKENDS)
    return ("%s %s is not a known backend type%s (available: %s)"
            % (name, describe(value), hint, available))


def check_document(data: Any, validate: bool = True
                   ) -> Tuple[Dict[str, Any], List[ConfigProblem]]:
    """Coerce numeric strings and validate against the schema.

    Returns the coerced copy of ``data`` and every problem found, each reported
    once (a coercion failure is not reported again as a type error). With
    ``validate`` false only the coercion runs (jsonschema is not imported).
    """
    if not isinstance(data, dict):
        return {}, [ConfigProblem("", "the configuration must be a JSON object ({...}), got %s"
                                  % describe(data))]
    root = load_schema()
    coercer = _Coercer(root)
    doc = coercer.value(data, root, ())
    problems = list(coercer.problems)
    if not validate:
        return doc, problems
    from jsonschema import Draft7Validator
    for err in Draft7Validator(root).iter_errors(doc):
        parts = tuple(err.absolute_path)
        if not any(parts[:len(b)] == b for b in coercer.bad):
            problems.extend(_explain(err, parts))
    return doc, problems


def file_mode_problems(path: str, name: str) -> List[str]:
    """Why a secrets file at ``path`` is unsafe to use: not a regular file, or open to group
    or others (what pbs_power refuses at use). A file not there, or not ours to stat, is
    left to that check: the validator may run as another user than the hooks."""
    import stat
    try:
        st = os.stat(path)
    except OSError:
        return []
    if not stat.S_ISREG(st.st_mode):
        return ["%s %s is not a regular file" % (name, path)]
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        return ["%s %s has mode %04o: group or others can read it, and pbs_power refuses it; "
                "run `chmod 600 %s`" % (name, path, mode, path)]
    return []


def host_template_problem(value: str) -> Optional[str]:
    """Why ``value`` is no URL template of one host (only ``{host}`` may stand in braces), or
    None; the Redfish backend applies the same rule when it starts."""
    import string
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
    except ValueError as exc:
        return "%s (%r)" % (exc, value)
    if any(f != "host" for f in fields):
        return "only {host} may be used in braces, not %r" % value
    return None


def is_host_name(text: str) -> bool:
    """A single plain host name (no range, list or group), which needs no hostlist parse."""
    return bool(_HOST_RE.fullmatch(text)) and not text.startswith(("-", "."))


def parse_hostlist(value: Any, parts: Parts, problems: List[ConfigProblem]) -> Optional[Any]:
    """A hostlist string (or list of them) as one ClusterShell NodeSet.

    Non-string list items are skipped: the schema check reports them.
    Node groups (``@name``) are not resolved: loading a config must not depend on
    /etc/clustershell. Returns None and appends to ``problems`` when invalid.
    """
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException
    from ClusterShell.RangeSet import RangeSetException
    items = [(parts, value)] if isinstance(value, str) else \
        [(parts + (i,), v) for i, v in enumerate(value) if isinstance(v, str)]
    union = NodeSet(resolver=RESOLVER_NOGROUP)
    start = len(problems)
    for where, expr in items:
        name = format_path(where)
        size = estimated_hosts(expr)
        if _NEGATIVE_RANGE.search(expr):
            problems.append(problem(where, "%s %r has a range that starts below 0 (a '-' right "
                                    "after '[' or ','): write the range as in n[1-3]"
                                    % (name, expr)))
            continue
        if size > MAX_HOSTS:
            problems.append(problem(where, "%s names about %d hosts (more than %d): is %r a typo?"
                                    % (name, size, MAX_HOSTS, expr)))
            continue
        try:
            nodes = NodeSet(expr, resolver=RESOLVER_NOGROUP)
        except (NodeSetException, RangeSetException) as exc:
            problems.append(problem(where, "%s is not a valid hostlist expression %r: %s"
                                    % (name, expr, exc)))
            continue
        odd = next((h for h in nodes if not _HOST_RE.fullmatch(h)), None)
        if odd is not None:
            problems.append(problem(where, "%s names %r, which is not a host name (use letters, "
                                    "digits, '.', '-', '_'; node groups such as @name are not "
                                    "supported)" % (name, odd)))
            continue
        union.update(nodes)
    return union if len(problems) == start else None


_SEPARATOR = re.compile(r"[,!&^\s]+(?![^\[]*\])")  # outside brackets
_RANGE = re.compile(r"\s*([0-9]+)\s*-\s*([0-9]+)\s*(?:/\s*([0-9]+))?\s*")


def estimated_hosts(expr: str) -> int:
    """An upper bound of the hosts ``expr`` names, read from its text without expanding it."""
    total = 0
    for term in _SEPARATOR.split(expr):
        size = 1
        for group in re.findall(r"\[([^\]]*)\]", term):
            count = 0
            for item in group.split(","):
                match = _RANGE.fullmatch(item)
                if match:
                    low, high, step = int(match.group(1)), int(match.group(2)), match.group(3)
                    count += max(0, (high - low) // max(int(step or 1), 1) + 1)
                else:
                    count += 1
            size *= max(count, 1)
        total += size
    return total
