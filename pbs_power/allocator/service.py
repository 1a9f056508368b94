"""The allocator's work for one request, without the network: validate, resolve, gather, run.

`AllocatorService.handle` takes a decoded request and returns the answer
(or raises `AllocatorError`); it blocks (SQLite, HTTP, the policy's own
code), so the server runs it in a worker thread.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .clients import ClusterDirectory, HttpClusterClient, HttpMetricsClient, MetricsDirectory, \
    registry_ids
from .config import AllocatorConfig, AllocatorConfigError
from .filters import FilterError, matches
from .gather import DataUnavailable, LocalCluster, copy_json
from .policy_base import InputError
from .registry import PolicyEntry, PolicyRegistry
from .results import check_result
from .schema import (DATA_UNAVAILABLE, INVALID_INPUTS, INVALID_REQUEST, NOT_SUPPORTED,
                     POLICY_ERROR, UNKNOWN_CLUSTER, AllocationRequest, AllocatorError,
                     parse_request, success)

log = logging.getLogger("pbs_power.allocator")


class AllocatorService:
    """The clusters this server holds, its policy registry, and the request pipeline."""

    def __init__(self, config: AllocatorConfig, registry: Optional[PolicyRegistry] = None):
        self.config = config
        self.registry = registry or PolicyRegistry(config.policy_dir, config.default_policy)
        try:
            self.registry.resolve("")
        except AllocatorError as exc:
            raise AllocatorConfigError("default policy %r unusable: %s"
                                       % (self.registry.default, exc.message)) from None
        timeout = config.http_timeout_seconds
        self.remote_registry = (HttpClusterClient(config.cluster_registry_url, timeout)
                                if config.cluster_registry_url else None)
        self.remote_metrics = (HttpMetricsClient(config.metrics_url, timeout)
                               if config.metrics_url else None)
        self.clusters: Dict[str, LocalCluster] = {}
        for source in config.cluster_sources():
            try:
                cluster = LocalCluster(source, config.refresh_seconds,
                                       config.telemetry_max_age_seconds, self.remote_metrics)
            except DataUnavailable as exc:
                raise AllocatorConfigError(str(exc)) from None
            if cluster.cluster_id in self.clusters:
                raise AllocatorConfigError("two clusters are named %s: give them distinct ids"
                                           % cluster.cluster_id)
            self.clusters[cluster.cluster_id] = cluster
        self.cluster_client = ClusterDirectory(self._local_views, self.remote_registry)
        self.metrics_client = MetricsDirectory(self._local_views, self.remote_metrics)

    def handle(self, doc: Any) -> Dict[str, Any]:
        """The answer to one decoded request; AllocatorError for every failure."""
        started = time.monotonic()
        request = parse_request(doc)
        entry = self.registry.resolve(request.policy_rule_uri)
        ids, notes = self.resolve_clusters(request)
        cluster_data = self.gather(ids, notes, private=not getattr(entry.cls, "READS_INPUT_ONLY",
                                                                     False))
        result = self.evaluate(entry, request, cluster_data)
        allocations = check_result(entry.name, result, cluster_data)
        return success(request, entry.name, ids, allocations,
                       (time.monotonic() - started) * 1000.0, notes)

    # -- candidate clusters ------------------------------------------------------
    def resolve_clusters(self, request: AllocationRequest) -> Tuple[List[str], List[str]]:
        """(candidate cluster ids, notes): named ones, else the filter's, else all local."""
        notes: List[str] = []
        if request.clusters:
            unknown = [c for c in request.clusters if c not in self.clusters]
            if unknown and self.remote_registry is None:
                raise AllocatorError(UNKNOWN_CLUSTER, "unknown cluster(s) %s (known: %s)"
                                     % (", ".join(unknown), ", ".join(sorted(self.clusters))))
            return list(request.clusters), notes
        if request.filter:
            return self._filtered(request.filter, notes), notes
        if request.search:
            raise AllocatorError(NOT_SUPPORTED, "search is not supported: this server has no "
                                 "search backend; name the clusters or use a filter")
        return list(self.clusters), notes

    def _filtered(self, query: Mapping[str, Any], notes: List[str]) -> List[str]:
        try:
            ids = [cid for cid, c in self.clusters.items() if matches(self._view(c).data, query)]
        except FilterError as exc:
            raise AllocatorError(INVALID_REQUEST, "filter: %s" % exc) from None
        if self.remote_registry is not None:
            ok, found = self.remote_registry.execute_query(query)
            if ok:
                ids += [cid for cid in registry_ids(found) if cid not in ids]
            else:
                notes.append("cluster registry query failed: %s" % found)
        if not ids:
            raise AllocatorError(UNKNOWN_CLUSTER, "no cluster matches the filter")
        return ids

    # -- data --------------------------------------------------------------------
    def gather(self, ids: Sequence[str], notes: List[str],
               private: bool = True) -> Dict[str, Dict[str, Any]]:
        """``{id: {"data", "cluster_metrics"}}`` for the policy.

        Private copies, unless the policy declares it never changes its input
        data (``READS_INPUT_ONLY``): then the cached view itself, saving the copy.
        """
        out: Dict[str, Dict[str, Any]] = {}
        for cid in ids:
            if cid in self.clusters:
                view = self._view(self.clusters[cid])
                notes.extend("%s: %s" % (cid, n) for n in view.metrics.get("notes", ()))
                out[cid] = view.copy() if private else {"data": view.data,
                                                        "cluster_metrics": view.metrics}
            else:
                out[cid] = self._remote(cid, notes)
        return out

    def _view(self, cluster: LocalCluster) -> Any:
        try:
            return cluster.view()
        except DataUnavailable as exc:
            raise AllocatorError(DATA_UNAVAILABLE, str(exc)) from None

    def _remote(self, cid: str, notes: List[str]) -> Dict[str, Any]:
        """A cluster only the registry knows, with the metrics service's metrics."""
        if self.remote_registry is None:
            raise AllocatorError(UNKNOWN_CLUSTER, "cluster %s: not held here and no cluster "
                                 "registry is configured" % cid)
        ok, data = self.remote_registry.read_cluster(cid)
        if not ok or not isinstance(data, dict):
            raise AllocatorError(UNKNOWN_CLUSTER, "cluster %s: not held here and the cluster "
                                 "registry has no usable answer: %s" % (cid, data))
        metrics: Any = {}
        if self.remote_metrics is not None:
            try:
                metrics = self.remote_metrics.get_cluster(cid)
            except Exception as exc:  # any HTTP or decoding problem: decide without metrics
                notes.append("%s: metrics service: %s: %s" % (cid, type(exc).__name__, exc))
        return {"data": data, "cluster_metrics": metrics if isinstance(metrics, dict) else {}}

    def _local_views(self) -> Dict[str, Dict[str, Any]]:
        """Local clusters as the clients in a policy's settings see them (copies)."""
        out = {}
        for cid, cluster in self.clusters.items():
            out[cid] = self._view(cluster).copy()
        return out

    # -- the policy --------------------------------------------------------------
    def evaluate(self, entry: PolicyEntry, request: AllocationRequest,
                 cluster_data: Dict[str, Dict[str, Any]]) -> Any:
        """Build the policy as the seed does and run it; its failures become AllocatorErrors."""
        settings = dict(entry.settings)
        settings.update(copy_json(dict(request.settings)))
        settings.update({"cluster_client": self.cluster_client,
                         "cluster_metrics_client": self.metrics_client})
        parameters = dict(entry.parameters)
        parameters.update(copy_json(dict(request.parameters)))
        input_data = {"cluster_data": cluster_data, "inputs": copy_json(dict(request.inputs))}
        try:
            policy = entry.cls(entry.name, settings, dict(parameters))
            return policy.eval(parameters, input_data, self.registry.context(entry.name))
        except InputError as exc:
            raise AllocatorError(INVALID_INPUTS, "policy %s: %s" % (entry.name, exc)) from None
        except AllocatorError:
            raise
        except BaseException as exc:  # the policy's own bug, whatever it is, is its answer
            log.warning("policy %s raised %s: %s", entry.name, type(exc).__name__, exc,
                        exc_info=log.isEnabledFor(logging.DEBUG))
            raise AllocatorError(POLICY_ERROR, "policy %s raised %s: %s"
                                 % (entry.name, type(exc).__name__, exc)) from None
