"""Cluster registry and cluster metrics clients, as the seed gives them to policies.

Every policy finds two clients in its settings, ``cluster_client``
(``read_cluster(id) -> (ok, data or message)``, ``execute_query(query) ->
(ok, result or message)``) and ``cluster_metrics_client`` (``get_cluster(id)``
and ``query_clusters(params)``, returning the data or raising). The ones
given here answer for the clusters this server holds from its own gathered
data, and ask the HTTP cluster registry / metrics service (seed API, through
``requests``) for the others when their URLs are configured.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from .filters import FilterError, matches


class APIError(Exception):
    """The metrics service answered, but not with ``success: true``."""

    def __init__(self, message: str, status_code: Optional[int] = None):
        super().__init__(message)
        self.status_code = status_code


class HttpClusterClient:
    """The seed's cluster registry client: ``GET /clusters/ID``, ``POST /clusters/query``."""

    def __init__(self, base_url: str, timeout: float = 10.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def read_cluster(self, cluster_id: str) -> Tuple[bool, Any]:
        return self._call("get", "/clusters/%s" % _quote(cluster_id))

    def execute_query(self, query: Any) -> Tuple[bool, Any]:
        return self._call("post", "/clusters/query", json={"query": query})

    def _call(self, method: str, path: str, **kwargs: Any) -> Tuple[bool, Any]:
        import requests
        try:
            response = requests.request(method, self.base_url + path, timeout=self.timeout,
                                        **kwargs)
            response.raise_for_status()
            return True, response.json()
        except requests.exceptions.HTTPError as exc:
            return False, "HTTP error occurred: %s" % exc
        except Exception as exc:  # connection refused, bad JSON, ...: the seed's contract
            return False, "Error occurred: %s" % exc


class HttpMetricsClient:
    """The seed's global cluster metrics client: ``GET /cluster/ID``, ``/cluster/query``."""

    def __init__(self, base_url: str, timeout: float = 10.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def get_cluster(self, cluster_id: str) -> Any:
        return self._get("/cluster/%s" % _quote(cluster_id))

    def query_clusters(self, query_params: Optional[Mapping[str, Any]] = None) -> Any:
        return self._get("/cluster/query", params=query_params)

    def _get(self, path: str, **kwargs: Any) -> Any:
        import requests
        response = requests.get(self.base_url + path, timeout=self.timeout, **kwargs)
        response.raise_for_status()
        doc = response.json()
        if not isinstance(doc, dict) or not doc.get("success", False):
            message = doc.get("error", "Unknown error") if isinstance(doc, dict) else "not JSON"
            raise APIError(str(message), response.status_code)
        return doc.get("data")


class ClusterDirectory:
    """``cluster_client`` for policies: local clusters first, then the HTTP registry."""

    def __init__(self, local: Callable[[], Mapping[str, Dict[str, Any]]],
                 remote: Optional[HttpClusterClient] = None):
        self._local = local
        self.remote = remote

    def read_cluster(self, cluster_id: str) -> Tuple[bool, Any]:
        found = self._local().get(cluster_id)
        if found is not None:
            return True, found["data"]
        if self.remote is not None:
            return self.remote.read_cluster(cluster_id)
        return False, "no cluster %r (no cluster registry configured)" % cluster_id

    def execute_query(self, query: Any) -> Tuple[bool, Any]:
        """Ids of clusters whose data matches ``query`` (a filter); the registry's added."""
        try:
            ids: List[Any] = [cid for cid, c in self._local().items() if matches(c["data"], query)]
        except FilterError as exc:
            return False, "bad query: %s" % exc
        if self.remote is not None:
            ok, found = self.remote.execute_query(query)
            if not ok:
                return ok, found
            ids += [cid for cid in registry_ids(found) if cid not in ids]
        return True, ids


class MetricsDirectory:
    """``cluster_metrics_client`` for policies: local metrics, then the HTTP service."""

    def __init__(self, local: Callable[[], Mapping[str, Dict[str, Any]]],
                 remote: Optional[HttpMetricsClient] = None):
        self._local = local
        self.remote = remote

    def get_cluster(self, cluster_id: str) -> Any:
        found = self._local().get(cluster_id)
        if found is not None:
            return found["cluster_metrics"]
        if self.remote is not None:
            return self.remote.get_cluster(cluster_id)
        raise APIError("no cluster %r (no metrics service configured)" % cluster_id, 404)

    def query_clusters(self, query_params: Optional[Mapping[str, Any]] = None) -> Any:
        local = {cid: c["cluster_metrics"] for cid, c in self._local().items()}
        if self.remote is None:
            return local
        remote = self.remote.query_clusters(query_params)
        return {**remote, **local} if isinstance(remote, dict) else remote


def registry_ids(found: Any) -> List[str]:
    """Cluster ids from a registry query answer: ids, cluster documents, or {"clusters": [...]}."""
    if isinstance(found, dict):
        found = found.get("clusters", found.get("data", []))
    out: List[str] = []
    for item in found if isinstance(found, list) else []:
        cid = item if isinstance(item, str) else (
            item.get("cluster_id", item.get("id")) if isinstance(item, dict) else None)
        if isinstance(cid, str) and cid not in out:
            out.append(cid)
    return out


def _quote(text: str) -> str:
    from urllib.parse import quote
    return quote(text, safe="")
