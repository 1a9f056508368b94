"""The resource allocator server: picks a cluster, node and GPUs for each allocation request.

A WebSocket server (``pbs-power allocator serve``) takes the seed's JSON
request, resolves the candidate clusters (named, filtered, never searched
yet), gathers each cluster's data and live metrics from the pbs_power state
it holds (`gather`) or the HTTP registry and metrics service (`clients`),
runs the named policy from the admin's registry (`registry`) and sends back,
per allocation request, ``{"cluster_id", "node_id", "gpus", ...}``.
Modules: `schema` (wire format, errors), `config`, `registry`, `gather`,
`clients`, `filters`, `results` (policy result checks), `service` (one
request, no network), `server` (WebSocket), `client`, `policies`.
"""
from __future__ import annotations

from .config import AllocatorConfig, AllocatorConfigError, ClusterSource, load_allocator_config
from .policy_base import InputError, PolicyRule
from .schema import AllocatorError

__all__ = ["AllocatorConfig", "AllocatorConfigError", "ClusterSource", "load_allocator_config",
           "InputError", "PolicyRule", "AllocatorError"]
