"""What the allocator knows about a cluster it holds: ``data`` and ``cluster_metrics``.

A cluster is a pbs_power state directory: its topology (nodes, device
specs, power domains and budgets, policies) gives ``data``; live state gives
``cluster_metrics``: each node's power state (the hook's power backend, the
hook store's transitions in flight, failed and down hosts) and the seconds
until it could run work (wake or boot time, learned per host by the hook's
store), the resource group it is in and the watts its applied policy allows,
each power domain's allocated watts and headroom under its budget (the
budget arithmetic of `pbs_power.groups.budget`), and per GPU the cap the
device controller last set. ``power_state_source`` says where states came
from; without a hook config they are ``unknown``, never guessed.

Reads are reused for ``refresh_seconds``. One caller at a time refreshes,
holding no lock while it reads (SQLite, the power backend); the others keep
using the previous view meanwhile. The metrics service is asked in the
background (`remote_metrics`), so a slow one delays no request by more
than half a second.
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
from .remote_metrics import RemoteMetrics

RG_DB = "resource_groups.db"
NO_HOOK_CONFIG = "no hook config: power states unknown"


class DataUnavailable(Exception):
    """A cluster's state cannot be read; the message names the directory and a fix."""


@dataclass
class ClusterView:
    """One cluster's data and metrics, read from ``started`` (shared: copy before handing out)."""

    cluster_id: str
    data: Dict[str, Any]
    metrics: Dict[str, Any]
    taken: float = 0.0           # time.monotonic() when the read ended
    started: float = 0.0         # time.monotonic() when it began
    stamp: int = 0               # distinct per view of a cluster
    _frozen: bytes = b""

    def frozen(self) -> bytes:
        """``{"data", "cluster_metrics"}`` in marshal form, for copies and worker processes."""
        if not self._frozen:
            self._frozen = marshal.dumps({"data": self.data, "cluster_metrics": self.metrics})
        return self._frozen

    def copy(self) -> Dict[str, Any]:
        """``{"data", "cluster_metrics"}`` as a private copy (decoded from the frozen form)."""
        return marshal.loads(self.frozen())


@dataclass
class _Topo:
    stamp: Any = None
    topology: Any = None
    data: Dict[str, Any] = field(default_factory=dict)


class LocalCluster:
    """A configured cluster; `view()` reads it again once ``refresh_seconds`` have passed."""

    def __init__(self, source: ClusterSource, refresh_seconds: float = 5.0,
                 metrics_client: Any = None, clock: Any = time.time,
                 first_read_timeout: float = 60.0):
        self.source = source
        self.refresh_seconds = refresh_seconds
        self.remote = RemoteMetrics(metrics_client, source.id or "?", refresh_seconds) \
            if metrics_client is not None else None
        self.clock = clock
        self.first_read_timeout = first_read_timeout
        self._cond = threading.Condition()
        self._refreshing = False
        self._stamps = 0
        self._topo = _Topo()
        self._view: Optional[ClusterView] = None
        self.cluster_id = source.id or self._read_topology()[1].name
        if self.remote is not None:
            self.remote.cluster_id = self.cluster_id

    def view(self) -> ClusterView:
        """The current view; read again when older than ``refresh_seconds``.

        Only the first caller to find it stale reads; the others get the
        previous view (or, before the first read, wait for it).
        """
        with self._cond:
            view = self._view
            fresh = view is not None and time.monotonic() - view.taken < self.refresh_seconds
            if fresh or self._refreshing:
                if view is not None:
                    return view
                if not self._cond.wait_for(lambda: self._view is not None or not self._refreshing,
                                           self.first_read_timeout) or self._view is None:
                    raise DataUnavailable("cluster %s: no view yet (its first read is still "
                                          "running or failed)" % self.cluster_id)
                return self._view
            self._refreshing = True
            self._stamps += 1
            stamp = self._stamps
        try:
            view = self._read(stamp)
        finally:
            with self._cond:
                self._refreshing = False
                self._cond.notify_all()
        with self._cond:
            if self._view is None or self._view.stamp < view.stamp:
                self._view = view
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

    def _read(self, stamp: int) -> ClusterView:
        started = time.monotonic()
        now = self.clock()
        store = self._group_store()
        try:
            active, topo = self._read_topology(store)
            groups = {m.entity: g.name for g in store.groups() for m in store.members(g.name)}
            allocations = store.allocations()
            device_states = store.get_device_states(list(topo.entities))
        finally:
            store.close()
        topo_state = self._topo
        if not topo_state.data:
            topo_state.data = cluster_data(self.cluster_id, topo, self.source.labels)
        notes: List[str] = []
        power = host_power_states(self.source, list(topo.entities), now, notes)
        metrics = cluster_metrics(topo, active, groups, allocations, device_states, power, now)
        if self.remote is not None:
            remote, remote_notes = self.remote.latest()
            notes.extend(remote_notes)
            if isinstance(remote, dict):
                deep_merge(metrics, remote)
        domain_headroom(metrics)
        metrics["notes"] = notes
        view = ClusterView(self.cluster_id, topo_state.data, metrics, time.monotonic(), started,
                           stamp)
        view.frozen()
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


@dataclass
class PowerStates:
    """Each host's power state, seconds until it could run work, and where that came from."""

    states: Dict[str, str]
    ready_seconds: Dict[str, Optional[float]]
    source: str


def cluster_metrics(topo: Any, active: bool, groups: Mapping[str, str],
                    allocations: Mapping[str, Any], device_states: Mapping[str, str],
                    power: PowerStates, now: float) -> Dict[str, Any]:
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
        state = power.states.get(name, "unknown")
        caps = gpu_caps(device_states.get(name))
        nodes[name] = {
            "power_state": state, "awake": state == "on",
            "ready_seconds": power.ready_seconds.get(name),
            "resource_group": groups.get(name), "policy": policy, "allocated_watts": allocated,
            "gpus": {str(i): {"cap_watts": caps.get(str(i))}
                     for i in range(entity.device.gpu_count)}}
    domains = {}
    for dom in topo.domains.values():
        domains[dom.name] = {"budget_watts": dom.budget_watts,
                             "allocated_watts": usage.get(dom.name, 0.0)}
    return {"time": now, "topology_active": active, "power_state_source": power.source,
            "nodes": nodes, "domains": domains}


def domain_headroom(metrics: Dict[str, Any]) -> None:
    """Each domain's ``headroom_watts`` and its ``headroom_source``.

    What the domain draws when the metrics service reports it
    (``drawn_watts``), else the caps allocated to its nodes.
    """
    for dom in (metrics.get("domains") or {}).values():
        if not isinstance(dom, dict):
            continue
        drawn = dom.get("drawn_watts")
        if isinstance(drawn, (int, float)) and not isinstance(drawn, bool):
            used, source = float(drawn), "drawn watts (metrics service)"
        else:
            used, source = float(dom.get("allocated_watts") or 0.0), "allocated caps"
        budget = dom.get("budget_watts")
        dom["headroom_watts"] = None if budget is None else budget - used
        dom["headroom_source"] = source


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

    Without a backend answer a host recorded down is ``down``, else ``unknown``.
    """
    if failed:
        return "failed"
    if transition is not None:
        return "going_down" if transition.kind.is_down else "waking"
    if backend_state is not None:
        return backend_state
    return "down" if down else "unknown"


def ready_seconds(state: str, host: str, transition: Any, estimates: Mapping[str, Any],
                  defaults: Mapping[str, float], now: float) -> Optional[float]:
    """Seconds until ``host`` could run work: 0 awake, else the wake or boot still to wait."""
    def lead(kind: str) -> float:
        for key in (host, "*"):
            found = (estimates.get(key) or {}).get(kind)
            if found is not None:
                return float(found)
        return float(defaults.get(kind, 0.0))
    if state == "on":
        return 0.0
    if state == "waking" and transition is not None:
        return max(0.0, lead(transition.kind.value) - max(0.0, now - transition.started))
    if state == "asleep":
        return lead("wake")
    if state in ("off", "down", "going_down"):
        return lead("power_on")
    return None


def host_power_states(source: ClusterSource, hosts: List[str], now: float,
                      notes: List[str]) -> PowerStates:
    """Each host's power state from the hook's store and, when configured, power backend."""
    from pbs_power.config.hook_config import HookConfig
    hook_dir, backend_states, config = source.state_dir, {}, None
    if source.hook_config:
        hook_dir, backend_states, config, where = _backend_states(source.hook_config, hosts, now,
                                                                  notes)
    else:
        where = NO_HOOK_CONFIG
        notes.append(NO_HOOK_CONFIG)
    config = config or HookConfig()
    defaults = {"power_on": float(config.node_boot_time), "wake": float(config.node_wake_time)}
    transitions: Dict[str, Any] = {}
    failed: Any = set()
    down: Any = set()
    estimates: Dict[str, Any] = {}
    from pbs_power.states.model import TransitionKind
    from pbs_power.states.store import DB_NAME, Store, StoreError
    if hook_dir and os.path.exists(os.path.join(hook_dir, DB_NAME)):
        try:
            with Store.open(hook_dir) as store:
                transitions = {t.host: t for t in store.transitions()}
                failed = set(store.failed())
                down = set(store.down_since())
                estimates = dict(store.duration_estimates())
                estimates["*"] = {k.value: v for k in TransitionKind
                                  for v in [store.fleet_duration_estimate(k)] if v is not None}
        except StoreError as exc:
            notes.append("hook state unreadable, power states from the backend only: %s" % exc)
    states = {h: power_state(backend_states.get(h), transitions.get(h), h in failed, h in down)
              for h in hosts}
    ready = {h: ready_seconds(states[h], h, transitions.get(h), estimates, defaults, now)
             for h in hosts}
    return PowerStates(states, ready, where)


def _backend_states(hook_config: str, hosts: List[str], now: float, notes: List[str]
                    ) -> Tuple[str, Dict[str, str], Any, str]:
    """(hook state_dir, host -> backend state, HookConfig or None, source words)."""
    from pbs_power.config.hook_config import ConfigError, load_config
    from ..devices import BackendError, get_backend
    try:
        config = load_config(hook_config)
    except ConfigError as exc:
        where = "hook config unusable, power states unknown: %s" % str(exc).splitlines()[0]
        notes.append(where)
        return "", {}, None, where
    try:
        with get_backend(config.power_backend, config.state_dir) as backend:
            found = backend.status(hosts, now)
        return (config.state_dir, {h: p.state.value for h, p in found.items()}, config,
                "power backend %s of %s" % (config.power_backend.type, hook_config))
    except (BackendError, OSError) as exc:
        where = "power backend %s: status failed, power states unknown: %s" % (
            config.power_backend.type, exc)
        notes.append(where)
        return config.state_dir, {}, config, where


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
