"""What the allocator knows about a cluster it holds: ``data`` and ``cluster_metrics``.

A cluster is a pbs_power state directory: its topology (nodes, device
specs, power domains and budgets, policies) gives ``data``; live state gives
``cluster_metrics``: each node's power state (the hook's power backend, the
hook store's transitions in flight, failed and down hosts), the resource
group it is in and the watts its applied policy allows, each power domain's
allocated watts and headroom under its budget (the budget arithmetic of
`pbs_power.groups.budget`), and per GPU the cap the device controller last set and
the recent draw from the GPU telemetry file or the metrics service.

Reads are cached for ``refresh_seconds``; each read opens and closes its own
database connections, so any worker thread may refresh.
"""
from __future__ import annotations

import json
import marshal
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .config import ClusterSource

RG_DB = "resource_groups.db"


class DataUnavailable(Exception):
    """A cluster's state cannot be read; the message names the directory and a fix."""


@dataclass
class ClusterView:
    """One cluster's data and metrics as of ``taken`` (shared: copy before handing out)."""

    cluster_id: str
    data: Dict[str, Any]
    metrics: Dict[str, Any]
    taken: float = 0.0
    _frozen: bytes = b""

    def copy(self) -> Dict[str, Any]:
        """``{"data", "cluster_metrics"}`` as a private copy (decoded from a frozen form)."""
        if not self._frozen:
            self._frozen = marshal.dumps({"data": self.data, "cluster_metrics": self.metrics})
        return marshal.loads(self._frozen)


@dataclass
class _Topo:
    stamp: Any = None
    topology: Any = None
    data: Dict[str, Any] = field(default_factory=dict)


class LocalCluster:
    """A configured cluster; `view()` reads it again once ``refresh_seconds`` have passed."""

    def __init__(self, source: ClusterSource, refresh_seconds: float = 5.0,
                 telemetry_max_age: float = 300.0, metrics_client: Any = None,
                 clock: Any = time.time):
        self.source = source
        self.refresh_seconds = refresh_seconds
        self.telemetry_max_age = telemetry_max_age
        self.metrics_client = metrics_client
        self.clock = clock
        self._lock = threading.Lock()
        self._topo = _Topo()
        self._view: Optional[ClusterView] = None
        self.cluster_id = source.id or self._read_topology()[1].name

    def view(self) -> ClusterView:
        """The current view, read again when older than ``refresh_seconds``."""
        with self._lock:
            view = self._view
            if view is None or time.monotonic() - view.taken >= self.refresh_seconds:
                view = self._view = self._read()
            return view

    # -- reading ---------------------------------------------------------------
    def _group_store(self):
        from pbs_power.groups.store import GroupStore
        from pbs_power.states.store import StoreError
        state_dir = self.source.state_dir
        if not os.path.exists(os.path.join(state_dir, RG_DB)):
            raise DataUnavailable("cluster %s: no topology in %s (run pbs-power topology import "
                                  "--state-dir %s)" % (self.source.id or "?", state_dir, state_dir))
        try:
            return GroupStore(state_dir)
        except StoreError as exc:
            raise DataUnavailable("cluster %s: %s" % (self.source.id or "?", exc)) from None

    def _read_topology(self, store: Any = None) -> Tuple[bool, Any]:
        """(active, Topology), parsed again only when the stored one changed."""
        from pbs_power.groups.topology import parse_topology
        own = store is None
        store = store or self._group_store()
        try:
            stamp, active = store.topology_stamp()
            if stamp is None:
                raise DataUnavailable("cluster %s: no topology in %s (run pbs-power topology "
                                      "import)" % (self.source.id or "?", self.source.state_dir))
            if stamp != self._topo.stamp:
                doc, _ = store.topology_doc()
                topo = parse_topology(doc, "stored topology", trusted=True)
                self._topo = _Topo(stamp, topo, {})
            return active, self._topo.topology
        finally:
            if own:
                store.close()

    def _read(self) -> ClusterView:
        now = self.clock()
        store = self._group_store()
        try:
            active, topo = self._read_topology(store)
            groups = {m.entity: g.name for g in store.groups() for m in store.members(g.name)}
            allocations = store.allocations()
            device_states = store.get_device_states(list(topo.entities))
        finally:
            store.close()
        if not self._topo.data:
            self._topo.data = cluster_data(self.cluster_id, topo, self.source.labels)
        notes: List[str] = []
        states = host_power_states(self.source, list(topo.entities), now, notes)
        draws = read_telemetry(self.source.gpu_telemetry_file, now, self.telemetry_max_age, notes)
        metrics = cluster_metrics(topo, active, groups, allocations, device_states, states,
                                  draws, now)
        if self.metrics_client is not None:
            merge_remote_metrics(metrics, self.metrics_client, self.cluster_id, notes)
        metrics["notes"] = notes
        view = ClusterView(self.cluster_id, self._topo.data, metrics, time.monotonic())
        view.copy()  # freeze it now, under the lock
        return view


# -- pure builders -----------------------------------------------------------------
def cluster_data(cluster_id: str, topo: Any, labels: Mapping[str, Any]) -> Dict[str, Any]:
    """Static metadata of a topology: device specs, power domains, policies, nodes."""
    specs: Dict[str, Dict[str, Any]] = {}
    first: Dict[str, str] = {}
    for entity in topo.entities.values():
        first.setdefault(entity.device.name, entity.name)
    for name, entity in first.items():
        spec = topo.entities[entity].device
        specs[name] = {"model": spec.model, "type": spec.type, "gpu_count": spec.gpu_count,
                       "node_min_watts": spec.node.min_watts, "node_max_watts": spec.node.max_watts,
                       "gpu_max_watts": spec.gpu.max_watts if spec.gpu else None,
                       "policy_watts": {p: topo.node_watts(entity, policy)
                                        for p, policy in topo.policies.items()}}
    nodes = {}
    for entity in topo.entities.values():
        topo_policy = topo.topology_policy(entity.name)
        nodes[entity.name] = {
            "device_spec": entity.device.name, "gpu_count": entity.device.gpu_count,
            "domains": list(topo.domain_chain(entity.name)),
            "topology_policy": topo_policy.name if topo_policy is not None else None,
            "topology_watts": topo.node_watts(entity.name, topo_policy)}
    return {
        "cluster_id": cluster_id, "source": "local", "topology": topo.name,
        "labels": dict(labels), "node_count": len(nodes),
        "gpu_count": sum(n["gpu_count"] for n in nodes.values()),
        "device_specs": specs,
        "power_domains": {d.name: {"kind": d.kind, "budget_watts": d.budget_watts,
                                   "parent": d.parent} for d in topo.domains.values()},
        "policies": sorted(topo.policies), "default_policy": topo.default_policy,
        "nodes": nodes}


def cluster_metrics(topo: Any, active: bool, groups: Mapping[str, str],
                    allocations: Mapping[str, Any], device_states: Mapping[str, str],
                    states: Mapping[str, str], draws: Mapping[str, Mapping[str, float]],
                    now: float) -> Dict[str, Any]:
    """Live state per node and per power domain (see the module docstring)."""
    from pbs_power.groups import budget
    watts = {e: m.applied_watts for e, m in allocations.items()}
    usage = budget.usage(topo, watts)
    nodes = {}
    for entity in topo.entities.values():
        name = entity.name
        member = allocations.get(name)
        topo_policy = topo.topology_policy(name)
        policy = member.applied_policy if member is not None else (
            topo_policy.name if topo_policy is not None else None)
        allocated = watts.get(name)
        if allocated is None:
            allocated = topo.node_watts(name, topo_policy)
        state = states.get(name, "unknown")
        caps = gpu_caps(device_states.get(name))
        drawn = draws.get(name, {})
        nodes[name] = {
            "power_state": state, "awake": state == "on", "resource_group": groups.get(name),
            "policy": policy, "allocated_watts": allocated,
            "gpus": {str(i): {"cap_watts": caps.get(str(i)), "power_watts": drawn.get(str(i))}
                     for i in range(entity.device.gpu_count)}}
    domains = {}
    for dom in topo.domains.values():
        used = usage.get(dom.name, 0.0)
        domains[dom.name] = {"budget_watts": dom.budget_watts, "allocated_watts": used,
                             "headroom_watts": None if dom.budget_watts is None
                             else dom.budget_watts - used}
    return {"time": now, "topology_active": active, "nodes": nodes, "domains": domains}


def gpu_caps(state_json: Optional[str]) -> Dict[str, float]:
    """GPU caps from a device's state JSON (``gpu_caps``), when it has them."""
    if not state_json:
        return {}
    try:
        caps = json.loads(state_json).get("gpu_caps", {})
        return {str(k): float(v) for k, v in caps.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def power_state(backend_state: Optional[str], transition: Any, failed: bool, down: bool) -> str:
    """A host's state for allocation: failed, waking, going_down, or what the backend says.

    Without a backend answer a host recorded down is ``down``, else ``on``.
    """
    if failed:
        return "failed"
    if transition is not None:
        return "going_down" if transition.kind.is_down else "waking"
    if backend_state is not None:
        return backend_state
    return "down" if down else "on"


def host_power_states(source: ClusterSource, hosts: List[str], now: float,
                      notes: List[str]) -> Dict[str, str]:
    """Each host's power state from the hook's store and, when configured, power backend."""
    hook_dir, backend_states = source.state_dir, {}
    if source.hook_config:
        hook_dir, backend_states = _backend_states(source.hook_config, hosts, now, notes)
    transitions, failed, down = {}, set(), set()
    from pbs_power.states.store import DB_NAME, Store, StoreError
    if os.path.exists(os.path.join(hook_dir, DB_NAME)):
        try:
            with Store.open(hook_dir) as store:
                transitions = {t.host: t for t in store.transitions()}
                failed = set(store.failed())
                down = set(store.down_since())
        except StoreError as exc:
            notes.append("hook state unreadable, power states from the backend only: %s" % exc)
    return {h: power_state(backend_states.get(h), transitions.get(h), h in failed, h in down)
            for h in hosts}


def _backend_states(hook_config: str, hosts: List[str], now: float,
                    notes: List[str]) -> Tuple[str, Dict[str, str]]:
    """(hook state_dir, host -> backend power state) from the hook config's power backend."""
    from pbs_power.config.hook_config import ConfigError, load_config
    from ..devices import BackendError, get_backend
    try:
        config = load_config(hook_config)
    except ConfigError as exc:
        notes.append("hook config unusable, power states unknown: %s" % str(exc).splitlines()[0])
        return "", {}
    try:
        with get_backend(config.power_backend, config.state_dir) as backend:
            found = backend.status(hosts, now)
        return config.state_dir, {h: p.state.value for h, p in found.items()}
    except (BackendError, OSError) as exc:
        notes.append("power backend %s: status failed: %s" % (config.power_backend.type, exc))
        return config.state_dir, {}


def read_telemetry(path: Optional[str], now: float, max_age: float,
                   notes: List[str]) -> Dict[str, Dict[str, float]]:
    """Recent GPU draw per node: ``{"nodes": {NODE: {"time": EPOCH, "gpus": {"0": W}}}}``.

    Entries older than ``max_age`` seconds are left out (their draw is unknown).
    """
    if not path:
        return {}
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
        nodes = doc["nodes"]
        if not isinstance(nodes, dict):
            raise TypeError("nodes is not an object")
    except FileNotFoundError:
        notes.append("GPU telemetry file %s not found: GPU draw unknown" % path)
        return {}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        notes.append("GPU telemetry file %s unusable (%s): GPU draw unknown" % (path, exc))
        return {}
    out, stale = {}, 0
    for node, entry in nodes.items():
        try:
            if now - float(entry["time"]) > max_age:
                stale += 1
                continue
            out[node] = {str(g): float(w) for g, w in entry["gpus"].items()}
        except (KeyError, TypeError, ValueError, AttributeError):
            notes.append("GPU telemetry file %s: entry of %s malformed, skipped" % (path, node))
    if stale:
        notes.append("GPU telemetry file %s: %d node(s) older than %g s, draw unknown"
                     % (path, stale, max_age))
    return out


def merge_remote_metrics(metrics: Dict[str, Any], client: Any, cluster_id: str,
                         notes: List[str]) -> None:
    """Overlay what the metrics service reports for this cluster (its values win)."""
    try:
        remote = client.get_cluster(cluster_id)
    except Exception as exc:  # HTTP errors, APIError, bad JSON: the local view still serves
        notes.append("metrics service: %s: %s" % (type(exc).__name__, exc))
        return
    if isinstance(remote, dict):
        deep_merge(metrics, remote)


def deep_merge(into: Dict[str, Any], other: Mapping[str, Any]) -> None:
    """Merge ``other`` into ``into``: objects recursively, anything else replaced."""
    for key, value in other.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            deep_merge(into[key], value)
        else:
            into[key] = copy_json(value)


def copy_json(value: Any) -> Any:
    """A private copy of JSON-shaped data (dicts and lists copied, leaves shared)."""
    if isinstance(value, dict):
        return {k: copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_json(v) for v in value]
    return value
