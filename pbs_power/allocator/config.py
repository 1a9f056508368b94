"""The allocator server's configuration: which clusters, where policies live, limits.

A JSON file (``pbs-power allocator serve --config FILE``) checked against
``schemas/allocator_config.schema.json``; every key is optional and command
line options override it. Without ``clusters`` the server serves one
cluster: the topology of ``--state-dir`` (``$PBS_POWER_STATE_DIR``, else
``/var/spool/pbs_power``).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from pbs_power.config.checks import format_path, load_packaged_schema

CONFIG_SCHEMA = "allocator_config.schema.json"
STATE_DIR_ENV = "PBS_POWER_STATE_DIR"
#: The seed's variables naming the cluster registry and metrics services.
REGISTRY_URL_ENV = "CLUSTER_SERVICE_URL"
METRICS_URL_ENV = "GLOBAL_CLUSTER_METRICS_URL"
DEFAULT_STATE_DIR = "/var/spool/pbs_power"
DEFAULT_POLICY = "power-aware"


class AllocatorConfigError(ValueError):
    """A config the server cannot start with; one line per problem."""


@dataclass(frozen=True)
class ClusterSource:
    """A cluster this server holds: a pbs_power state directory and its live state."""

    state_dir: str
    id: Optional[str] = None                 # None: the stored topology's name
    hook_config: Optional[str] = None        # power backend and hook state, for power states
    labels: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AllocatorConfig:
    """Effective server settings (file values over defaults, options over both)."""

    clusters: Tuple[ClusterSource, ...] = ()
    policy_dir: Optional[str] = None
    default_policy: str = DEFAULT_POLICY
    cluster_registry_url: Optional[str] = None
    metrics_url: Optional[str] = None
    http_timeout_seconds: float = 10.0
    eval_timeout_seconds: float = 30.0
    max_workers: int = 8
    refresh_seconds: float = 5.0
    max_message_bytes: int = 1 << 20
    lease_seconds: float = 120.0
    max_connections: int = 1000
    max_buffered_bytes: int = 64 << 20
    idle_timeout_seconds: float = 300.0
    admin_token_file: Optional[str] = None
    admin_socket: Optional[str] = None

    def with_overrides(self, **values: Any) -> "AllocatorConfig":
        """A copy with the given (non-None) values; clusters may be a list."""
        given = {k: v for k, v in values.items() if v is not None}
        if "clusters" in given:
            given["clusters"] = tuple(given["clusters"])
        return dataclasses.replace(self, **given)

    def cluster_sources(self) -> Tuple[ClusterSource, ...]:
        """The configured clusters, else the default state directory's."""
        if self.clusters:
            return self.clusters
        state_dir = os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
        return (ClusterSource(state_dir),)


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    from jsonschema import Draft7Validator
    return Draft7Validator(load_packaged_schema(CONFIG_SCHEMA))


def from_environment(config: AllocatorConfig, environ: Mapping[str, str] = os.environ
                     ) -> AllocatorConfig:
    """``config`` with the seed's service URLs from the environment where it names none."""
    values = {}
    for key, env in (("cluster_registry_url", REGISTRY_URL_ENV),
                     ("metrics_url", METRICS_URL_ENV)):
        url = environ.get(env, "").strip()
        if url and getattr(config, key) is None:
            if not url.startswith(("http://", "https://")):
                raise AllocatorConfigError("$%s: expected an http:// or https:// URL, got %r"
                                           % (env, url))
            values[key] = url
    return config.with_overrides(**values)


def load_allocator_config(path: str) -> AllocatorConfig:
    """Read and check a config file; AllocatorConfigError names the file and every problem."""
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read().decode("utf-8-sig"))
    except OSError as exc:
        raise AllocatorConfigError("%s: cannot read (%s)" % (path, exc.strerror or exc)) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise AllocatorConfigError("%s: not valid JSON (%s)" % (path, exc)) from None
    return parse_allocator_config(doc, path, os.path.dirname(os.path.abspath(path)))


def parse_allocator_config(doc: Any, source: str = "<allocator config>",
                           base_dir: str = ".") -> AllocatorConfig:
    """A decoded config as AllocatorConfig; relative paths are taken from ``base_dir``."""
    if not isinstance(doc, dict):
        raise AllocatorConfigError("%s: the config must be a JSON object" % source)
    problems = sorted("%s: %s: %s" % (source, format_path(e.absolute_path) or "config", e.message)
                      for e in _validator().iter_errors(doc))
    if problems:
        raise AllocatorConfigError("\n".join(problems))
    values: Dict[str, Any] = {k: v for k, v in doc.items() if k != "clusters"}
    for key in ("policy_dir", "admin_token_file", "admin_socket"):
        if values.get(key):
            values[key] = _path(values[key], base_dir)
    clusters: List[ClusterSource] = []
    for entry in doc.get("clusters", ()):
        paths = {k: _path(entry[k], base_dir) for k in ("state_dir", "hook_config",
                                                        ) if k in entry}
        clusters.append(ClusterSource(id=entry.get("id"), labels=dict(entry.get("labels", {})),
                                      **paths))
    ids = [c.id for c in clusters if c.id is not None]
    if len(ids) != len(set(ids)):
        raise AllocatorConfigError("%s: clusters: ids must be unique, got %s"
                                   % (source, ", ".join(ids)))
    return AllocatorConfig(clusters=tuple(clusters), **values)


def _path(value: str, base_dir: str) -> str:
    return os.path.normpath(os.path.join(base_dir, os.path.expanduser(value)))
