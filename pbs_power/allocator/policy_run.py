"""One policy run, as the seed builds it: in a worker process, or in the caller's.

A task (a dict, pickled between processes) names the policy, carries the
request's ``inputs``, ``parameters`` and ``settings``, the rule's
``context``, the leases to show, and each cluster: a local cluster as a view
stamp, with the view's frozen form only when the worker lacks it (workers
keep the latest view of each cluster), a remote one as its data. The reply
is ``{"ok": True, "result", "context"}`` or ``{"ok": False, "code",
"message"}``. `worker_main` is a worker process's loop; run as a program
(``python -m pbs_power.allocator.policy_run FD POLICY_DIR DEFAULT``) it serves
the socket inherited as FD.
"""
from __future__ import annotations

import logging
import marshal
import pickle
import signal
import sys
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from .clients import ClusterDirectory, HttpClusterClient, HttpMetricsClient, MetricsDirectory
from .leases import overlay
from .policy_base import InputError
from .registry import PolicyRegistry
from .schema import INTERNAL, INVALID_INPUTS, POLICY_ERROR, AllocatorError

log = logging.getLogger("pbs_power.allocator")


class ViewCache:
    """The latest view of each local cluster: stamp, frozen form, decoded form (shared)."""

    def __init__(self) -> None:
        self._views: Dict[str, Tuple[int, bytes, Dict[str, Any]]] = {}

    def stamp(self, cluster_id: str) -> Optional[int]:
        found = self._views.get(cluster_id)
        return found[0] if found else None

    def put(self, cluster_id: str, stamp: int, frozen: bytes) -> None:
        self._views[cluster_id] = (stamp, frozen, marshal.loads(frozen))

    def get(self, cluster_id: str, stamp: int, private: bool) -> Dict[str, Any]:
        found = self._views.get(cluster_id)
        if found is None or found[0] != stamp:
            raise AllocatorError(INTERNAL, "worker lacks view %d of cluster %s"
                                 % (stamp, cluster_id))
        return marshal.loads(found[1]) if private else found[2]


def cluster_input(task: Mapping[str, Any], cache: ViewCache, private: bool,
                  only: Optional[Any] = None) -> Dict[str, Dict[str, Any]]:
    """``{id: {"data", "cluster_metrics"}}`` for the task's clusters, leases shown."""
    out: Dict[str, Dict[str, Any]] = {}
    ids = task["candidates"] if only is None else only
    for cid in ids:
        if cid in task["local"]:
            ref = task["local"][cid]
            if ref.get("frozen") is not None:
                cache.put(cid, ref["stamp"], ref["frozen"])
            view = cache.get(cid, ref["stamp"], private)
            out[cid] = {"data": view["data"],
                        "cluster_metrics": overlay(view["cluster_metrics"],
                                                   task["leases"].get(cid, ()))}
        elif cid in task["remote"]:
            remote = task["remote"][cid]
            out[cid] = {"data": remote.get("data"),
                        "cluster_metrics": overlay(remote.get("cluster_metrics") or {},
                                                   task["leases"].get(cid, ()))}
    return out


def _clients(task: Mapping[str, Any], cache: ViewCache) -> Tuple[Any, Any]:
    """The seed's ``cluster_client`` and ``cluster_metrics_client`` for this run."""
    def local() -> Dict[str, Dict[str, Any]]:
        return cluster_input(task, cache, True, only=list(task["local"]))
    timeout = task.get("http_timeout", 10.0)
    registry = HttpClusterClient(task["registry_url"], timeout) if task.get("registry_url") \
        else None
    metrics = HttpMetricsClient(task["metrics_url"], timeout) if task.get("metrics_url") \
        else None
    return ClusterDirectory(local, registry), MetricsDirectory(local, metrics)


def _policy(task: Mapping[str, Any], registry: PolicyRegistry,
            cache: ViewCache) -> Tuple[Any, Any, Dict[str, Any]]:
    """(policy instance, its class's entry, parameters) built as the seed does."""
    entry = registry.resolve(task["policy"])
    settings = dict(entry.settings)
    settings.update(task.get("settings") or {})
    settings["cluster_client"], settings["cluster_metrics_client"] = _clients(task, cache)
    parameters = dict(entry.parameters)
    parameters.update(task.get("parameters") or {})
    return entry.cls(entry.name, settings, dict(parameters)), entry, parameters


def run_task(task: Mapping[str, Any], registry: PolicyRegistry,
             cache: ViewCache) -> Dict[str, Any]:
    """The reply to one task (never raises)."""
    context = task.get("context") or {}
    try:
        if task.get("kind") == "management":
            policy, entry, _ = _policy(task, registry, cache)
            if not callable(getattr(policy, "management", None)):
                raise AllocatorError(POLICY_ERROR, "policy %s has no management method"
                                     % entry.name)
            return {"ok": True, "result": policy.management(task["action"], task["data"]),
                    "context": context}
        policy, entry, parameters = _policy(task, registry, cache)
        private = not getattr(entry.cls, "READS_INPUT_ONLY", False)
        input_data = {"cluster_data": cluster_input(task, cache, private),
                      "inputs": task["inputs"]}
        result = policy.eval(parameters, input_data, context)
        return {"ok": True, "result": result, "context": context}
    except InputError as exc:
        return _error(INVALID_INPUTS, "policy %s: %s" % (task["policy"], exc))
    except AllocatorError as exc:
        return _error(exc.code, exc.message)
    except BaseException as exc:  # the policy's own bug, whatever it is, is its answer
        log.warning("policy %s raised %s: %s", task["policy"], type(exc).__name__, exc)
        return _error(POLICY_ERROR, "policy %s raised %s: %s"
                      % (task["policy"], type(exc).__name__, exc))


def _error(code: str, message: str) -> Dict[str, Any]:
    return {"ok": False, "code": code, "message": message}


def encode_reply(reply: Dict[str, Any]) -> bytes:
    """A reply as bytes; one whose result or context cannot be pickled becomes an error."""
    try:
        return pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # a policy's object in its result or context
        return pickle.dumps(_error(POLICY_ERROR, "policy result or context cannot be sent "
                                   "back: %s: %s" % (type(exc).__name__, exc)))


def merge_context(into: Dict[str, Any], sent: Mapping[str, Any],
                  returned: Mapping[str, Any]) -> None:
    """Apply what a run changed in its copy of the context (``sent`` -> ``returned``)."""
    for key, value in returned.items():
        if key not in sent or sent[key] != value:
            into[key] = value
    for key in sent:
        if key not in returned:
            into.pop(key, None)


def worker_main(conn: Any, policy_dir: Optional[str], default: str) -> None:
    """A worker process: run each task received on ``conn`` until the other end closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # the server stops its workers itself
    registry = PolicyRegistry(policy_dir, default)
    cache = ViewCache()
    receive: Callable[[], bytes] = conn.recv_bytes
    while True:
        try:
            task = pickle.loads(receive())
        except (EOFError, OSError):
            return
        conn.send_bytes(encode_reply(run_task(task, registry, cache)))


def main(argv: Any) -> None:
    """A worker process started by the server: ``FD POLICY_DIR DEFAULT``."""
    from multiprocessing.connection import Connection
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s allocator-policy %(levelname)s %(message)s")
    worker_main(Connection(int(argv[1])), argv[2] or None, argv[3])


if __name__ == "__main__":
    main(sys.argv)
