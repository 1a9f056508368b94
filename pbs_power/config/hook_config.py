"""The hook configuration: what the admin writes in JSON, with safe defaults.

A superset of OpenPBS's PBS_power.CF: every file that hook accepts loads here
(numbers may be numeric strings such as ``"1800"``).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple, Union

from pbs_power.config.checks import (
    ConfigError, ConfigProblem, backend_defaults, backend_type_message, check_document, describe, did_you_mean,
    format_path, hostlist_options, is_host_name, load_schema, parse_hostlist, problem,
    sort_problems,
)
from pbs_power.config.memo import ConfigMemo
from pbs_power.config.paths import absolute_path, state_dir_path, usable_files
from pbs_power.config.reading import read_json

MODE_POWER_ON_OFF = "power_on_off"
MODE_RAMP_RATE = "ramp_rate"
MODE_DISABLED = "disabled"


@dataclass(frozen=True)
class NodePower:
    """Watts a host draws in each power state (for ramp limits and energy)."""

    busy_watts: float = 450.0
    idle_watts: float = 250.0
    sleep_watts: float = 90.0
    off_watts: float = 10.0


@dataclass(frozen=True)
class BackendConfig:
    """Which power backend runs the commands, and its own options."""

    type: str = "simulated"
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JobPolicies:
    """How job hooks give each job its resource group and policy."""

    fail_open: bool = False
    strict: bool = False
    allow_reprovision: bool = False
    queue_defaults: Mapping[str, str] = field(default_factory=dict)
    #: Slurm partition -> policy for jobs that ask for none (PrologSlurmctld).
    partition_defaults: Mapping[str, str] = field(default_factory=dict)
    eoe_policies: Mapping[str, str] = field(default_factory=dict)
    device_options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HookConfig:
    """Effective hook configuration (file values over defaults)."""

    power_ramp_rate_enable: bool = False
    power_on_off_enable: bool = False
    node_idle_limit: int = 1800
    min_node_down_delay: int = 1800
    max_jobs_analyze_limit: Optional[int] = None
    max_concurrent_nodes: int = 300
    node_boot_time: int = 900
    node_wake_time: int = 60
    boot_timeout: int = 1800
    shutdown_timeout: int = 600
    cycle_interval: int = 30
    min_idle_nodes: int = 0
    exclude_nodes: str = ""
    max_ramp_watts_per_minute: Optional[float] = None
    node_power: Optional[NodePower] = None
    #: (hostlist expression, NodePower) pairs; the first match wins.
    node_power_overrides: Tuple[Tuple[str, NodePower], ...] = ()
    power_backend: BackendConfig = field(default_factory=BackendConfig)
    state_dir: str = "/var/spool/pbs_power"
    #: File the Slurm programs log to besides syslog (None: syslog only).
    slurm_log_file: Optional[str] = None
    python_path: Tuple[str, ...] = ()
    job_policies: JobPolicies = field(default_factory=JobPolicies)
    log_level: str = "info"
    #: Hosts named by ``exclude_nodes``, expanded once at load time.
    excluded_hosts: FrozenSet[str] = frozenset()
    #: Non-fatal findings of validation, for the caller to log.
    warnings: Tuple[str, ...] = ()

    @property
    def mode(self) -> str:
        """Power on/off wins when both are enabled, as in PBS."""
        if self.power_on_off_enable:
            return MODE_POWER_ON_OFF
        if self.power_ramp_rate_enable:
            return MODE_RAMP_RATE
        return MODE_DISABLED

    def power_of(self, host: str) -> Optional[NodePower]:
        """Watts model for ``host``: the first matching override, else the default."""
        for _expr, power, hosts in self._override_sets:
            if host in hosts:
                return power
        return self.node_power

    @property
    def _override_sets(self):
        cached = self.__dict__.get("_override_cache")
        if cached is None:
            from ClusterShell.NodeSet import NodeSet
            cached = tuple((expr, power, frozenset(NodeSet(expr)))
                           for expr, power in self.node_power_overrides)
            object.__setattr__(self, "_override_cache", cached)
        return cached


# --- loading and validation -------------------------------------------------

WARN_BOTH_ENABLED = "power_on_off_enable is over-riding power_ramp_rate_enable"
WARN_ANALYZE_LIMIT = ("max_jobs_analyze_limit is ignored: pbs_power analyses every "
                      "queued job with one query")

_INT_KEYS = ("node_idle_limit", "min_node_down_delay", "max_jobs_analyze_limit",
             "max_concurrent_nodes", "node_boot_time", "node_wake_time", "boot_timeout",
             "shutdown_timeout", "cycle_interval", "min_idle_nodes")
#: Adjacent power states, lower first: each must draw no more than the next.
_WATTS_ORDER = (("off_watts", "sleep_watts"), ("sleep_watts", "idle_watts"),
                ("idle_watts", "busy_watts"))


def load_config(path: Union[str, "os.PathLike[str]"]) -> HookConfig:
    """Read and validate a hook config JSON file; ConfigError names the file."""
    source = os.fspath(path)
    duplicates: List[str] = []
    raw, data = read_json(source, duplicates)
    memo = ConfigMemo.for_document(data, HookConfig.state_dir)
    schema = load_schema()
    checked = memo is not None and memo.holds(raw, schema)
    config = parse_config(data, source, schema_checked=checked)
    if memo is not None and not checked:
        memo.add(raw, schema)
    if duplicates:
        config = replace(config, warnings=tuple(duplicates) + config.warnings)
    return config


def parse_config(data: Any, source: str = "<config>", schema_checked: bool = False
                 ) -> HookConfig:
    """Validate a decoded config document and build the HookConfig.

    Pure: returns a new HookConfig or raises ConfigError listing every problem
    (sorted by key path); ``data`` is not modified. ``schema_checked`` skips
    the jsonschema pass for a document known to pass it (see config_memo).
    """
    doc, problems = check_document(data, validate=not schema_checked)
    if any(p.path == "" for p in problems):
        raise ConfigError(problems, source)
    values = _build(doc, _Flagged(problems), problems)
    if problems:
        raise ConfigError(sort_problems(problems), source)
    return HookConfig(**values)


class _Flagged:
    """Key paths that already have a problem: later checks skip them (one mistake, one message)."""

    def __init__(self, problems: Sequence[ConfigProblem]):
        self.paths = [p.path for p in problems]

    def __call__(self, *parts: Any) -> bool:
        prefix = format_path(parts)
        return any(p == prefix or p.startswith(prefix + ".") or p.startswith(prefix + "[")
                   for p in self.paths)


def _build(doc: Dict[str, Any], bad: _Flagged, problems: List[ConfigProblem]) -> Dict[str, Any]:
    """HookConfig keyword arguments from a schema-checked document; appends to ``problems``."""
    values: Dict[str, Any] = {}
    ok = {k: v for k, v in doc.items() if not bad(k) and k != "_comment"}
    for key in ("power_ramp_rate_enable", "power_on_off_enable", "log_level"):
        if key in ok:
            values[key] = ok[key]
    for key in _INT_KEYS:
        if ok.get(key) is not None:
            values[key] = int(ok[key])
    if ok.get("max_ramp_watts_per_minute") is not None:
        values["max_ramp_watts_per_minute"] = float(ok["max_ramp_watts_per_minute"])
    if "state_dir" in ok:
        values["state_dir"] = state_dir_path(ok["state_dir"], problems)
    if ok.get("slurm_log_file") is not None:
        values["slurm_log_file"] = absolute_path(ok["slurm_log_file"], ("slurm_log_file",), problems)
    paths = doc.get("python_path")
    if isinstance(paths, (str, list)):
        paths = [paths] if isinstance(paths, str) else paths
        values["python_path"] = tuple(absolute_path(p, ("python_path", i), problems)
                                      for i, p in enumerate(paths) if isinstance(p, str))
    if isinstance(doc.get("exclude_nodes"), (str, list)):
        nodes = parse_hostlist(doc["exclude_nodes"], ("exclude_nodes",), problems)
        if nodes is not None:
            values["exclude_nodes"] = str(nodes)
            values["excluded_hosts"] = frozenset(nodes)
    count = len(problems)
    if ok.get("node_power") is not None:
        values["node_power"] = _node_power(ok["node_power"], NodePower(), "the default",
                                           ("node_power",), problems)
    base_ok = not bad("node_power") and len(problems) == count
    if isinstance(doc.get("node_power_overrides"), list):
        values["node_power_overrides"] = _overrides(
            doc["node_power_overrides"], values.get("node_power"), base_ok, bad, problems)
    if isinstance(ok.get("job_policies"), dict):
        values["job_policies"] = JobPolicies(**ok["job_policies"])
    devices = doc.get("job_policies", {}).get("device_options") \
        if isinstance(doc.get("job_policies"), dict) else None
    if isinstance(devices, dict):
        _device_options(devices, bad, problems)
    if isinstance(doc.get("power_backend"), dict) and not bad("power_backend", "type"):
        values["power_backend"] = _backend(doc["power_backend"], bad, problems)
    _check_relations(doc, bad, problems)
    values["warnings"] = _warnings(values)
    return values


def _node_power(given: Mapping[str, Any], base: NodePower, base_label: str,
                parts: Tuple[Any, ...], problems: List[ConfigProblem]) -> NodePower:
    """``base`` with the watts in ``given``, checked off <= sleep <= idle <= busy."""
    watts = {k: float(v) for k, v in given.items() if k != "nodes"}
    power = replace(base, **watts)
    for low, high in _WATTS_ORDER:
        lo, hi = getattr(power, low), getattr(power, high)
        if lo > hi:
            where = parts + ((low,) if low in watts and high not in watts else (high,))
            problems.append(problem(where, "%s (%s) must not exceed %s (%s): watts must "
                                    "satisfy off <= sleep <= idle <= busy" % (
                                        format_path(parts + (low,)),
                                        _label(lo, low in watts, base_label),
                                        format_path(parts + (high,)),
                                        _label(hi, high in watts, base_label))))
    return power


def _label(watts: float, given: bool, base_label: str) -> str:
    return "%g" % watts if given else "%g, %s" % (watts, base_label)


def _overrides(items: List[Any], node_power: Optional[NodePower], base_ok: bool,
               bad: _Flagged, problems: List[ConfigProblem]) -> Tuple[Tuple[str, NodePower], ...]:
    """(normalized hostlist, NodePower) pairs; missing watts come from node_power.

    With a broken node_power (``base_ok`` false) the inherited watts are
    unknown, so only the hostlists are checked.
    """
    base = node_power or NodePower()
    label = "from node_power" if node_power else "the default"
    out = []
    for i, item in enumerate(items):
        parts = ("node_power_overrides", i)
        if not isinstance(item, dict):
            continue
        nodes = None
        if isinstance(item.get("nodes"), str) and not bad(*parts, "nodes"):
            nodes = item["nodes"] if is_host_name(item["nodes"]) else \
                parse_hostlist(item["nodes"], parts + ("nodes",), problems)
        if bad(*parts) or not base_ok:
            continue
        power = _node_power(item, base, label, parts, problems)
        if nodes is not None:
            out.append((str(nodes), power))
    return tuple(out)


def _backend(spec: Dict[str, Any], bad: _Flagged, problems: List[ConfigProblem],
             parts: Tuple[Any, ...] = ("power_backend",)) -> BackendConfig:
    """BackendConfig from a backend spec at ``parts``: every key but ``type`` is an option."""
    kind = spec.get("type", BackendConfig.type)
    if kind == "groups":
        return BackendConfig(type=kind, options={
            "groups": _backend_groups(spec, bad, problems, parts)})
    options = {k: v for k, v in spec.items() if k != "type"}
    usable_files(options, parts, problems)
    for name in hostlist_options(kind):
        if isinstance(options.get(name), (str, list)) and not bad(*parts, name):
            nodes = parse_hostlist(options[name], parts + (name,), problems)
            options[name] = str(nodes) if nodes is not None else options[name]
    if kind == "simulated" and not bad(*parts):
        effective = dict(backend_defaults(kind), **options)
        if effective["boot_jitter_seconds"] > effective["boot_seconds"]:
            jitter = format_path(parts + ("boot_jitter_seconds",))
            problems.append(ConfigProblem(jitter, "%s (%g) must not exceed %s (%g%s)" % (
                jitter, effective["boot_jitter_seconds"], format_path(parts + ("boot_seconds",)),
                effective["boot_seconds"], "" if "boot_seconds" in options else ", the default")))
    return BackendConfig(type=kind, options=options)


def _backend_groups(spec: Dict[str, Any], bad: _Flagged, problems: List[ConfigProblem],
                    parts: Tuple[Any, ...]) -> List[Dict[str, Any]]:
    """The node groups of a ``groups`` backend: hostlists normalized, overlaps refused."""
    from ClusterShell.NodeSet import NodeSet
    owner: Dict[str, int] = {}
    out = []
    items = spec.get("groups") if isinstance(spec.get("groups"), list) else []
    for i, item in enumerate(items):
        where = parts + ("groups", i)
        if not isinstance(item, dict):
            continue
        nodes = None
        if isinstance(item.get("nodes"), (str, list)) and not bad(*where, "nodes"):
            nodes = parse_hostlist(item["nodes"], where + ("nodes",), problems)
        if nodes is not None and not nodes:
            problems.append(problem(where + ("nodes",), "%s must name at least one node"
                                    % format_path(where + ("nodes",))))
            nodes = None
        if nodes is not None:
            clash = [h for h in nodes if h in owner]
            if clash:
                problems.append(problem(where + ("nodes",), (
                    "%s names %s, already in %s: a node may be in one group only" % (
                        format_path(where + ("nodes",)), NodeSet.fromlist(clash),
                        format_path(parts + ("groups", owner[clash[0]], "nodes"))))))
            owner.update((h, i) for h in nodes if h not in owner)
        sub = _group_backend(item.get("backend"), bad, problems, where + ("backend",))
        if nodes is not None and sub is not None:
            out.append({"nodes": str(nodes), "backend": dict(sub.options, type=sub.type)})
    return out


def _group_backend(spec: Any, bad: _Flagged, problems: List[ConfigProblem],
                   parts: Tuple[Any, ...]) -> Optional[BackendConfig]:
    """A node group's backend: its type is required and cannot be ``groups``."""
    if not isinstance(spec, dict) or bad(*parts, "type"):
        return None
    if "type" not in spec:
        problems.append(problem(parts, "%s needs the key 'type'" % format_path(parts)))
        return None
    if spec["type"] == "groups":
        problems.append(problem(parts + ("type",), backend_type_message(
            "groups", format_path(parts + ("type",)), nested=True)))
        return None
    return _backend(spec, bad, problems, parts)


def _device_options(options: Dict[str, Any], bad: _Flagged,
                    problems: List[ConfigProblem]) -> None:
    """Each device options key names a device backend type, or an instance with a type."""
    from .backends import DEVICE_BACKENDS
    parts = ("job_policies", "device_options")
    for key, entry in options.items():
        if key in ("max_workers", "timeout_seconds") or not isinstance(entry, dict) \
                or bad(*parts, key, "type"):
            continue
        kind = entry.get("type", key)
        where = parts + ((key, "type") if "type" in entry else (key,))
        if key in DEVICE_BACKENDS and kind != key:
            problems.append(problem(where, "%s must be %r: the key %r is a backend type (use "
                                    "another key to name an instance)" % (
                                        format_path(where), key, key)))
        elif kind in DEVICE_BACKENDS:
            usable_files(entry, parts + (key,), problems)
        if kind not in DEVICE_BACKENDS:
            what = "%s %s" % (format_path(where), describe(kind)) if "type" in entry else \
                "%s: %r" % (format_path(where), key)
            problems.append(problem(where, "%s is not a device backend type%s (known: %s; an "
                                    "instance needs a 'type')" % (
                                        what, did_you_mean(kind, list(DEVICE_BACKENDS)),
                                        ", ".join(sorted(DEVICE_BACKENDS)))))


def _check_relations(doc: Dict[str, Any], bad: _Flagged, problems: List[ConfigProblem]) -> None:
    """Checks across keys, with defaults for the keys not given."""
    if not (bad("boot_timeout") or bad("node_boot_time")):
        timeout = _given_or_default(doc, "boot_timeout")
        boot = _given_or_default(doc, "node_boot_time")
        if timeout[0] <= boot[0]:
            problems.append(ConfigProblem("boot_timeout", (
                "boot_timeout (%s) must be greater than node_boot_time (%s): a booting node "
                "is given boot_timeout seconds before it counts as failed"
                % (timeout[1], boot[1]))))
    if not (bad("max_ramp_watts_per_minute") or bad("node_power")):
        if doc.get("max_ramp_watts_per_minute") is not None and doc.get("node_power") is None:
            problems.append(ConfigProblem("max_ramp_watts_per_minute", (
                "max_ramp_watts_per_minute needs node watts: set node_power "
                "(a topology file will also provide them later)")))


def _given_or_default(doc: Dict[str, Any], key: str) -> Tuple[int, str]:
    """(value, how to quote it) for ``key``: the file's value or the default."""
    if key in doc:
        return int(doc[key]), str(int(doc[key]))
    default = getattr(HookConfig, key)
    return default, "%s, the default" % default


def _warnings(values: Dict[str, Any]) -> Tuple[str, ...]:
    out = []
    if values.get("power_on_off_enable") and values.get("power_ramp_rate_enable"):
        out.append(WARN_BOTH_ENABLED)
    if values.get("max_jobs_analyze_limit") is not None:
        out.append(WARN_ANALYZE_LIMIT)
    return tuple(out)


def config_to_dict(config: HookConfig) -> Dict[str, Any]:
    """The effective configuration as a JSON-ready dict, in the file's own keys.

    Backend options show their defaults; internal fields (excluded_hosts,
    warnings) are left out. ``parse_config`` accepts the result.
    """
    out: Dict[str, Any] = {}
    for name in HookConfig.__dataclass_fields__:
        if name in ("excluded_hosts", "warnings"):
            continue
        value = getattr(config, name)
        if name == "node_power":
            value = asdict(value) if value is not None else None
        elif name == "node_power_overrides":
            value = [dict(nodes=expr, **asdict(power)) for expr, power in value]
        elif name == "power_backend":
            value = _backend_dict(value.type, value.options)
        elif name == "python_path":
            value = list(value)
        elif name == "job_policies":
            value = {k: dict(v) if isinstance(v, Mapping) else v
                     for k, v in asdict(value).items()}
        out[name] = value
    return out


def _backend_dict(kind: str, options: Mapping[str, Any]) -> Dict[str, Any]:
    """A backend as the config writes it, defaults filled in (node groups' too)."""
    if kind == "groups":
        return {"type": kind, "groups": [
            {"nodes": g["nodes"], "backend": _backend_dict(
                g["backend"]["type"], {k: v for k, v in g["backend"].items() if k != "type"})}
            for g in options.get("groups", ())]}
    return dict(type=kind, **dict(backend_defaults(kind), **options))
