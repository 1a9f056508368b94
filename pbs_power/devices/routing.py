"""Per node group power backends: ``power_backend.type = "groups"``.

A cluster often mixes hardware: Redfish BMCs in one rack, IPMI in another, a
site script for the rest. ``{"type": "groups", "groups": [{"nodes": "n[001-032]",
"backend": {"type": "redfish", ...}}, ...]}`` names a backend (with its own
options) per ClusterShell hostlist; `GroupedBackend` splits every call by
group and merges the answers. A node is in at most one group (overlaps are
refused); a node in none gets a failed Result and an UNKNOWN state, never a
guess. Each group's backend is built on first use, so a group whose backend
cannot start (bad options, missing module) fails only its own nodes. Groups
are called one after the other: a backend keeps its own connections (SQLite
ones are tied to their thread) and bounds its own time with its timeouts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from pbs_power.states.model import PowerState, TransitionKind
from .base import BackendError, HostPower, PowerBackend, Result

GROUPS_TYPE = "groups"


@dataclass(frozen=True)
class BackendGroup:
    """One node group: its hostlist, backend type and the backend's options."""

    nodes: str
    type: str
    options: Mapping[str, Any]

    @property
    def label(self) -> str:
        return "%s (%s)" % (self.type, self.nodes)


def parse_groups(options: Optional[Mapping[str, Any]]) -> Tuple[Tuple[BackendGroup, ...],
                                                                Dict[str, int]]:
    """The groups and host -> group index; BackendError names a bad or overlapping group."""
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException
    from ClusterShell.RangeSet import RangeSetException
    options = dict(options or {})
    unknown = sorted(set(options) - {"groups", "type"}, key=str)
    if unknown:
        raise BackendError("power backend 'groups': unknown option(s) %s (known: groups)"
                           % ", ".join(map(repr, unknown)))
    items = options.get("groups")
    if not isinstance(items, (list, tuple)) or not items:
        raise BackendError("power backend 'groups': option groups must be a non-empty list")
    groups: List[BackendGroup] = []
    owner: Dict[str, int] = {}
    for i, item in enumerate(items):
        where = "power backend 'groups': groups[%d]" % i
        if not isinstance(item, Mapping) or not isinstance(item.get("backend"), Mapping):
            raise BackendError("%s must be an object with nodes and backend" % where)
        spec = dict(item["backend"])
        kind = spec.pop("type", None)
        if not isinstance(kind, str) or kind == GROUPS_TYPE:
            raise BackendError("%s.backend.type must name a backend other than 'groups', "
                               "not %r" % (where, kind))
        try:
            nodes = NodeSet(item.get("nodes"), resolver=RESOLVER_NOGROUP)
        except (NodeSetException, RangeSetException, TypeError) as exc:
            raise BackendError("%s.nodes: bad hostlist %r (%s)"
                               % (where, item.get("nodes"), exc)) from None
        clash = [h for h in nodes if h in owner]
        if clash:
            raise BackendError("%s.nodes names %s, already in groups[%d]: a node may be in "
                               "one group only" % (where, NodeSet.fromlist(clash),
                                                   owner[clash[0]]))
        owner.update((host, i) for host in nodes)
        groups.append(BackendGroup(str(nodes), kind, spec))
    return tuple(groups), owner


class GroupedBackend(PowerBackend):
    """Routes each host to the backend of its node group and merges the answers."""

    name = GROUPS_TYPE

    def __init__(self, options: Optional[Mapping[str, Any]], state_dir: str) -> None:
        self.groups, self.owner = parse_groups(options)
        self.state_dir = state_dir
        self._built: Dict[int, Union[PowerBackend, str]] = {}

    def backend(self, index: int) -> Union[PowerBackend, str]:
        """Group ``index``'s backend, built on first use, or why it cannot be built."""
        if index not in self._built:
            from pbs_power.config.hook_config import BackendConfig
            from . import get_backend
            group = self.groups[index]
            try:
                self._built[index] = get_backend(BackendConfig(group.type, group.options),
                                                 self.state_dir)
            except BackendError as exc:
                self._built[index] = "node group %s: %s" % (group.nodes, exc)
        return self._built[index]

    def route(self, hosts: Sequence[str]) -> Tuple[List[Tuple[int, List[str]]], List[str]]:
        """([(group index, its hosts)] in group order, hosts in no group)."""
        by_group: Dict[int, List[str]] = {}
        lost: List[str] = []
        for host in dict.fromkeys(hosts):
            index = self.owner.get(host)
            if index is None:
                lost.append(host)
            else:
                by_group.setdefault(index, []).append(host)
        return sorted(by_group.items()), lost

    def request(self, kind: TransitionKind, hosts: Sequence[str],
                now: float) -> Dict[str, Result]:
        routed, lost = self.route(hosts)
        out = {host: Result(False, "in no power_backend group: no backend powers it")
               for host in lost}
        for index, members in routed:
            backend = self.backend(index)
            if isinstance(backend, str):
                out.update((host, Result(False, backend)) for host in members)
                continue
            answers = _guarded(lambda: backend.request(kind, members, now), self.groups[index])
            for host in members:
                got = answers.get(host) if isinstance(answers, dict) else None
                out[host] = got if isinstance(got, Result) else Result(
                    False, answers if isinstance(answers, str) else
                    "%s gave no answer for this host" % self.groups[index].label)
        return out

    def status(self, hosts: Sequence[str], now: float) -> Dict[str, HostPower]:
        unknown = HostPower(PowerState.UNKNOWN, None)
        routed, lost = self.route(hosts)
        out = {host: unknown for host in lost}
        for index, members in routed:
            backend = self.backend(index)
            answers = {} if isinstance(backend, str) else _guarded(
                lambda: backend.status(members, now), self.groups[index])
            for host in members:
                got = answers.get(host) if isinstance(answers, dict) else None
                out[host] = got if isinstance(got, HostPower) else unknown
        return out

    def close(self) -> None:
        for backend in self._built.values():
            if isinstance(backend, PowerBackend):
                backend.close()


def _guarded(call: Any, group: BackendGroup) -> Union[Dict[str, Any], str]:
    """``call()``; a BackendError becomes the diagnostic of every host of the group."""
    try:
        return call()
    except BackendError as exc:
        return "%s: %s" % (group.label, exc)
