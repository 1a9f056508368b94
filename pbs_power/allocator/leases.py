"""Leases: what the allocator has handed out and no resource group holds yet.

An answer reserves each allocation's node (or its GPUs) and the watts its
power policy needs beyond the node's current allocation, so the next request
sees them at once. A lease ends when the job's resource group takes the node
over (a view read after the lease was made shows the node in a group), when
the client releases it, or when its time runs out. `overlay` shows leases to
policies as ``cluster_metrics``: ``nodes[N]["lease"]`` and, per power domain,
``leased_watts`` counted out of ``headroom_watts``.
"""
from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Lease:
    """One allocation held for a job that has not started yet."""

    id: str
    cluster_id: str
    node_id: str
    gpus: Tuple[str, ...]
    exclusive: bool              # no GPUs named: the whole node
    watts: float                 # beyond the node's allocation now
    domains: Tuple[str, ...]
    created: float               # time.monotonic()
    expires: float               # time.monotonic()
    request_id: Optional[str] = None

    def overlaps(self, gpus: Sequence[str], exclusive: bool) -> bool:
        """True when an allocation of ``gpus`` (or the whole node) would share with this."""
        return self.exclusive or exclusive or bool(set(self.gpus) & set(gpus))

    def public(self, now: float) -> Dict[str, Any]:
        """The lease as policies and clients see it (no id: ids release leases)."""
        return {"gpus": list(self.gpus), "exclusive": self.exclusive, "watts": self.watts,
                "domains": list(self.domains),
                "expires_in_s": round(max(0.0, self.expires - now), 3)}


def lease_watts(data: Mapping[str, Any], live: Mapping[str, Any], node: str,
                power_policy: Any) -> float:
    """Watts a node needs at ``power_policy`` beyond its allocation now (0 when unknown)."""
    info = (data.get("nodes") or {}).get(node) or {}
    spec = (data.get("device_specs") or {}).get(info.get("device_spec")) or {}
    need = (spec.get("policy_watts") or {}).get(power_policy) if isinstance(power_policy, str) \
        else None
    now = ((live.get("nodes") or {}).get(node) or {}).get("allocated_watts",
                                                          info.get("topology_watts"))
    if not _number(need) or not _number(now):
        return 0.0
    return max(0.0, float(need) - float(now))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class LeaseBook:
    """Every live lease, by id and by node; thread-safe, and every operation is quick."""

    def __init__(self, seconds: float = 120.0, clock: Any = time.monotonic):
        self.seconds = seconds
        self.clock = clock
        self._lock = threading.Lock()
        self._by_id: Dict[str, Lease] = {}
        self._by_node: Dict[Tuple[str, str], List[Lease]] = {}
        self.ended = {"taken_over": 0, "released": 0, "expired": 0}

    def __len__(self) -> int:
        return len(self._by_id)

    def _free(self, alloc: Mapping[str, Any],
              mine: Dict[Tuple[str, str], List[Tuple[Sequence[str], bool]]]) -> bool:
        """True when ``alloc`` shares nothing with live leases or this request's picks."""
        key, gpus, exclusive = _claim(alloc)
        if key is None:
            return True
        held = [(lease.gpus, lease.exclusive) for lease in self._by_node.get(key, ())]
        held += mine.get(key, [])
        return not any(ex or exclusive or set(g) & set(gpus) for g, ex in held)

    def reserve(self, allocations: List[Dict[str, Any]],
                data: Mapping[str, Mapping[str, Any]], request_id: Optional[str] = None,
                all_or_none: bool = True) -> List[int]:
        """Lease every allocation with a node; returns the indexes refused as conflicting.

        An allocation that collides with a live lease (or an earlier one of
        the same request) is replaced by its first free ``alternatives``
        entry. With ``all_or_none`` nothing is leased when one still
        collides (the caller runs the policy again); else the others are.
        Leased allocations get ``lease_id`` and ``lease_expires_in_s``;
        ``alternatives`` are dropped.
        """
        with self._lock:
            now = self.clock()
            self._expire(now)
            mine: Dict[Tuple[str, str], List[Tuple[Sequence[str], bool]]] = {}
            picks: List[Optional[Dict[str, Any]]] = []
            for alloc in allocations:
                choices = [alloc] + list(alloc.get("alternatives") or ())
                pick = next((c for c in choices if self._free(c, mine)), None)
                picks.append(pick)
                if pick is not None:
                    key, gpus, exclusive = _claim(pick)
                    if key is not None:
                        mine.setdefault(key, []).append((gpus, exclusive))
            bad = [i for i, pick in enumerate(picks) if pick is None]
            if bad and all_or_none:
                return bad
            for i, pick in enumerate(picks):
                allocations[i].pop("alternatives", None)
                if pick is None:
                    continue
                if pick is not allocations[i]:
                    pick = {**{k: v for k, v in allocations[i].items()
                               if k == "request_id"}, **pick}
                    pick.pop("alternatives", None)
                    allocations[i] = pick
                self._lease(pick, data, request_id, now)
            return bad

    def _lease(self, alloc: Dict[str, Any], data: Mapping[str, Mapping[str, Any]],
               request_id: Optional[str], now: float) -> None:
        key, gpus, exclusive = _claim(alloc)
        if key is None:
            return
        cluster = data.get(key[0]) or {}
        info = ((cluster.get("data") or {}).get("nodes") or {}).get(key[1]) or {}
        watts = lease_watts(cluster.get("data") or {}, cluster.get("cluster_metrics") or {},
                            key[1], alloc.get("power_policy"))
        lease = Lease(secrets.token_urlsafe(12), key[0], key[1], tuple(gpus), exclusive, watts,
                      tuple(info.get("domains") or ()), now, now + self.seconds, request_id)
        self._by_id[lease.id] = lease
        self._by_node.setdefault(key, []).append(lease)
        alloc["lease_id"] = lease.id
        alloc["lease_expires_in_s"] = self.seconds

    def release(self, ids: Sequence[str]) -> Tuple[List[str], List[str]]:
        """(released, unknown) lease ids."""
        done, unknown = [], []
        with self._lock:
            for lid in ids:
                if lid in self._by_id:
                    self._drop(self._by_id[lid], "released")
                    done.append(lid)
                else:
                    unknown.append(lid)
        return done, unknown

    def settle(self, cluster_id: str, metrics: Mapping[str, Any], read_at: float) -> None:
        """End leases whose node a view read at ``read_at`` (monotonic) shows in a group."""
        nodes = metrics.get("nodes") or {}
        with self._lock:
            self._expire(self.clock())
            for lease in [x for x in self._by_id.values() if x.cluster_id == cluster_id]:
                if lease.created < read_at and (nodes.get(lease.node_id) or {}).get(
                        "resource_group"):
                    self._drop(lease, "taken_over")

    def current(self, cluster_ids: Sequence[str]) -> Dict[str, List[Dict[str, Any]]]:
        """The live leases of these clusters as plain data, for `overlay`."""
        with self._lock:
            now = self.clock()
            self._expire(now)
            out: Dict[str, List[Dict[str, Any]]] = {cid: [] for cid in cluster_ids}
            for lease in self._by_id.values():
                if lease.cluster_id in out:
                    out[lease.cluster_id].append(dict(lease.public(now), node=lease.node_id))
            return out

    def _expire(self, now: float) -> None:
        for lease in [x for x in self._by_id.values() if x.expires <= now]:
            self._drop(lease, "expired")

    def _drop(self, lease: Lease, why: str) -> None:
        self._by_id.pop(lease.id, None)
        key = (lease.cluster_id, lease.node_id)
        left = [x for x in self._by_node.get(key, ()) if x.id != lease.id]
        if left:
            self._by_node[key] = left
        else:
            self._by_node.pop(key, None)
        self.ended[why] += 1


def _claim(alloc: Mapping[str, Any]) -> Tuple[Optional[Tuple[str, str]], List[str], bool]:
    """((cluster, node), GPUs, whole node?) an allocation takes; no node: (None, [], False)."""
    node = alloc.get("node_id")
    if "error" in alloc or not isinstance(node, str):
        return None, [], False
    gpus = [str(g) for g in alloc.get("gpus") or ()]
    return (str(alloc["cluster_id"]), node), gpus, not gpus


def overlay(metrics: Mapping[str, Any], leases: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """``cluster_metrics`` with leases shown; shallow copies, ``metrics`` itself unchanged."""
    out = dict(metrics)
    if not leases:
        return out
    nodes = dict(out.get("nodes") or {})
    domains = dict(out.get("domains") or {})
    for lease in leases:
        name = lease["node"]
        entry = dict(nodes.get(name) or {})
        held = entry.get("lease")
        gpus = sorted(set((held or {}).get("gpus", [])) | set(lease["gpus"]), key=_gpu_order)
        entry["lease"] = {"gpus": gpus,
                          "exclusive": bool((held or {}).get("exclusive")) or lease["exclusive"],
                          "watts": (held or {}).get("watts", 0.0) + lease["watts"],
                          "expires_in_s": max((held or {}).get("expires_in_s", 0.0),
                                              lease["expires_in_s"])}
        nodes[name] = entry
        for dom in lease["domains"]:
            if dom in domains and lease["watts"]:
                d = dict(domains[dom])
                d["leased_watts"] = d.get("leased_watts", 0.0) + lease["watts"]
                if _number(d.get("headroom_watts")):
                    d["headroom_watts"] = d["headroom_watts"] - lease["watts"]
                domains[dom] = d
    out["nodes"], out["domains"] = nodes, domains
    return out


def _gpu_order(gpu: str) -> Tuple[int, str]:
    return (int(gpu), "") if gpu.isdigit() else (1 << 30, gpu)
