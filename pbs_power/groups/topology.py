"""The topology: entities (nodes) with device specs, a tree of power domains with budgets,
and the topology's policies.

A topology file is checked against ``schemas/topology.schema.json``, then for the
relations between keys (both in :mod:`pbs_power.groups.topology_checks`); every problem names
its key path. Whether a topology is active is the service's business, not this module's.
"""
from __future__ import annotations

import json
import os
from typing import Any, Union

from pbs_power.config.checks import (
    ConfigProblem, describe, did_you_mean, format_path, parse_hostlist, sort_problems,
)
from pbs_power.groups.policy import (
    PolicyElementType, PolicyError, PolicyObject, parse_policies, parse_policy,
)
from pbs_power.groups.topology_checks import (
    DEFAULT_BACKEND, DEFAULT_DEVICE_TYPE, DEFAULT_DOMAIN_KIND, SCHEMA_FILE, SCHEMA_NAME,
    check_topology, decode_json, load_schema,
)
from pbs_power.groups.topology_model import (
    DeviceSpec, Entity, GPUSpec, NodeSpec, PowerDomain, RangeSpec, Topology, TopologyError,
)


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
    try:
        data, duplicates = decode_json(text)
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


def parse_topology(doc: Any, source: str = "<topology>", trusted: bool = False) -> Topology:
    """Validate a decoded topology document and build the Topology; ``doc`` is not modified.

    TopologyError lists every problem found, each naming its key path.
    ``trusted`` skips the JSON Schema pass, for a document written by
    `Topology.to_dict` of a topology that was validated (the service's own
    stored copy): it saves every prolog the schema work.
    """
    if not isinstance(doc, dict):
        raise TopologyError("the topology must be a JSON object ({...}), got %s"
                            % describe(doc), source)
    try:
        topology, problems = check_topology(doc, schema=not trusted)
    except RecursionError:
        raise TopologyError("the topology is nested too deeply", source) from None
    if problems:
        raise TopologyError([p.message for p in sort_problems(problems)], source)
    return topology


# The public API: the model's names and the checks' names, with the loaders.
__all__ = [
    "TopologyError", "GPUSpec", "RangeSpec", "NodeSpec", "DeviceSpec", "PowerDomain", "Entity",
    "Topology", "load_topology", "parse_topology", "load_schema", "SCHEMA_NAME", "SCHEMA_FILE",
    "DEFAULT_BACKEND", "DEFAULT_DEVICE_TYPE", "DEFAULT_DOMAIN_KIND",
    "ConfigProblem", "describe", "did_you_mean", "format_path", "parse_hostlist", "sort_problems",
    "PolicyElementType", "PolicyError", "PolicyObject", "parse_policies", "parse_policy",
]
