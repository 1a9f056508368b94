"""The allocator's work for one request, without the network: validate, resolve, gather, lease.

`AllocatorService.prepare` checks a decoded request and gathers its
clusters (it blocks: SQLite, HTTP; the server calls it in a thread); the
policy then runs elsewhere (`policy_run`, in a worker process) on the task
`task` builds; `finish` checks the result and leases what it hands out.
`handle` does all three in the caller's thread (tests, scripts).
"""
from __future__ import annotations

import logging
import pickle
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .clients import HttpClusterClient, HttpMetricsClient, registry_ids
from .config import AllocatorConfig, AllocatorConfigError
from .filters import FilterError, matches
from .gather import ClusterView, DataUnavailable, LocalCluster
from .leases import LeaseBook
from .policy_run import ViewCache, merge_context, run_task
from .registry import PolicyRegistry, check_uri
from .results import check_result
from .schema import (DATA_UNAVAILABLE, INVALID_REQUEST, NOT_SUPPORTED, UNKNOWN_CLUSTER,
                     AllocationRequest, AllocatorError, parse_request, success)

log = logging.getLogger("pbs_power.allocator")
#: Runs of the policy when its allocations collide with a concurrent request's leases.
ATTEMPTS = 3


@dataclass
class Prepared:
    """A checked request and the clusters its policy will see."""

    request: AllocationRequest
    policy: str
    candidates: List[str]
    notes: List[str]
    views: Dict[str, ClusterView] = field(default_factory=dict)     # every local cluster
    remote: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    started: float = 0.0

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
                cluster = LocalCluster(source, config.refresh_seconds, self.remote_metrics)
            except DataUnavailable as exc:
                raise AllocatorConfigError(str(exc)) from None
            if cluster.cluster_id in self.clusters:
                raise AllocatorConfigError("two clusters are named %s: give them distinct ids"
                                           % cluster.cluster_id)
            self.clusters[cluster.cluster_id] = cluster
        self.leases = LeaseBook(config.lease_seconds)
        self._inline_registry = PolicyRegistry(config.policy_dir, config.default_policy)
        self._inline_cache = ViewCache()

    def prepare(self, doc: Any) -> Prepared:
        """Check a decoded request and read its clusters; AllocatorError for every failure."""
        started = time.monotonic()
        request = parse_request(doc)
        name = check_uri(request.policy_rule_uri, self.registry.default)
        ids, notes = self.resolve_clusters(request)
        prepared = Prepared(request, name, ids, notes, started=started)
        for cid, cluster in self.clusters.items():
            view = self._view(cluster)
            self.leases.settle(cid, view.metrics, view.started)
            prepared.views[cid] = view
            if cid in ids:
                notes.extend("%s: %s" % (cid, n) for n in view.metrics.get("notes", ()))
        for cid in ids:
            if cid not in self.clusters:
                prepared.remote[cid] = self._remote(cid, notes)
                self.leases.settle(cid, prepared.remote[cid]["cluster_metrics"], started)
        return prepared

    def task(self, prepared: Prepared, worker_views: Mapping[str, int]) -> Dict[str, Any]:
        """The policy run of ``prepared`` for a worker holding ``worker_views``."""
        request = prepared.request
        local = {cid: {"stamp": v.stamp,
                       "frozen": None if worker_views.get(cid) == v.stamp else v.frozen()}
                 for cid, v in prepared.views.items()}
        return {"kind": "eval", "policy": prepared.policy, "inputs": dict(request.inputs),
                "parameters": dict(request.parameters), "settings": dict(request.settings),
                "context": dict(self.registry.context(prepared.policy)),
                "candidates": prepared.candidates, "local": local, "remote": prepared.remote,
                "leases": self.leases.current(list(prepared.views) + list(prepared.remote)),
                "registry_url": self.config.cluster_registry_url,
                "metrics_url": self.config.metrics_url,
                "http_timeout": self.config.http_timeout_seconds}

    def finish(self, prepared: Prepared, task: Mapping[str, Any], reply: Mapping[str, Any],
               last: bool) -> Optional[Dict[str, Any]]:
        """The answer to a run's reply, its allocations leased; None: run it again.

        Allocations that collide with leases made since the run began make it
        run again; on the ``last`` attempt they become errors instead.
        """
        if not reply.get("ok"):
            raise AllocatorError(reply["code"], reply["message"])
        merge_context(self.registry.context(prepared.policy), task["context"],
                      reply.get("context") or {})
        data = self._checked_data(prepared)
        allocations = check_result(prepared.policy, reply["result"], data)
        bad = self.leases.reserve(allocations, data, prepared.request.request_id,
                                  all_or_none=not last)
        if bad and not last:
            return None
        for i in bad:
            alloc = allocations[i]
            allocations[i] = {k: alloc[k] for k in ("request_id",) if k in alloc}
            allocations[i]["error"] = ("node %s was handed out to a concurrent request while "
                                       "this one ran; ask again" % alloc.get("node_id"))
        answer = success(prepared.request, prepared.policy, prepared.candidates, allocations,
                         (time.monotonic() - prepared.started) * 1000.0, prepared.notes)
        answer["lease_seconds"] = self.leases.seconds
        return answer

    def handle(self, doc: Any) -> Dict[str, Any]:
        """The answer to one decoded request, the policy run in this thread."""
        prepared = self.prepare(doc)
        for attempt in range(ATTEMPTS):
            task = self.task(prepared, self._inline_cache_views())
            reply = pickle.loads(pickle.dumps(run_task(pickle.loads(pickle.dumps(task)),
                                                       self._inline_registry,
                                                       self._inline_cache)))
            answer = self.finish(prepared, task, reply, attempt == ATTEMPTS - 1)
            if answer is not None:
                return answer
        raise AllocatorError(INVALID_REQUEST, "unreachable")  # finish answers on the last

    def _inline_cache_views(self) -> Dict[str, int]:
        return {cid: stamp for cid in self.clusters
                for stamp in [self._inline_cache.stamp(cid)] if stamp is not None}

    def _checked_data(self, prepared: Prepared) -> Dict[str, Dict[str, Any]]:
        """Candidates' data and unleased metrics, as results are checked and leases priced."""
        out: Dict[str, Dict[str, Any]] = {}
        for cid in prepared.candidates:
            view = prepared.views.get(cid)
            out[cid] = {"data": view.data, "cluster_metrics": view.metrics} if view is not None \
                else prepared.remote.get(cid, {})
        return out

    # -- candidate clusters ------------------------------------------------------
    def resolve_clusters(self, request: AllocationRequest) -> Tuple[List[str], List[str]]:
        """(candidate cluster ids, notes): named ones, else the filter's, else all local."""
        notes: List[str] = []
        if request.search:
            beside = " beside clusters" if request.clusters else \
                " beside a filter" if request.filter else ""
            raise AllocatorError(NOT_SUPPORTED, "search is not supported%s: this server has no "
                                 "search backend, and answering without it would ignore what "
                                 "the search asks; send clusters or a filter without search"
                                 % beside)
        if request.clusters:
            unknown = [c for c in request.clusters if c not in self.clusters]
            if unknown and self.remote_registry is None:
                raise AllocatorError(UNKNOWN_CLUSTER, "unknown cluster(s) %s (known: %s)"
                                     % (", ".join(unknown), ", ".join(sorted(self.clusters))))
            return list(request.clusters), notes
        if request.filter:
            return self._filtered(request.filter, notes), notes
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
