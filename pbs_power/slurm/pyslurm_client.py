"""Slurm through pyslurm (25.11's API): ``Nodes.load()``, ``Jobs.load()``, ``Node.modify``.

Used when a child process could import pyslurm (`selection`), for what
this pyslurm release has: a missing class, no nodes or empty power settings
raise `Unsupported` and the commands serve that instead. pyslurm builds
only against the Slurm release it was made for (25.11 needs Slurm 25.11),
so this client is checked against pyslurm's documented object shapes; the
CLI client is the one the real-cluster tests run.

Shapes read: ``Nodes.load()`` and ``Jobs.load()`` return collections whose
``values()`` are `Node` / `Job` objects (older releases: a list or a dict);
a Node has ``name``, ``state`` (``"IDLE+POWERED_DOWN"``), ``last_busy_time``,
``slurmd_start_time``, ``reason``, ``partitions``; a Job has ``id``,
``state``, ``allocated_nodes``, ``scheduled_nodes``, ``required_nodes``
(hostlist strings), ``start_time``, ``state_reason``, ``partition``,
``comment``. Times are epochs or None. Errors are ``pyslurm.RPCError``.
"""
from __future__ import annotations

from typing import Any, Iterable, List, Sequence

from .client import (SlurmClient, SlurmError, SlurmJob, SlurmNode, SlurmPowerConfig,
                    SlurmReservation, Unsupported, epoch, expand, fold, split_state,
                    state_words)


class PyslurmClient(SlurmClient):
    """`SlurmClient` over the pyslurm module handed in."""

    name = "pyslurm"

    def __init__(self, pyslurm: Any):
        self.pyslurm = pyslurm

    def _call(self, what: str, fn, *args):
        try:
            return fn(*args)
        except Exception as exc:  # pyslurm.RPCError and friends: one line for the log
            raise SlurmError("pyslurm %s failed: %s" % (what, exc)) from None

    def nodes(self) -> List[SlurmNode]:
        loaded = self._call("Nodes.load()", self.pyslurm.Nodes.load)
        nodes = [node_from(n) for n in _objects(loaded)]
        if not nodes:
            raise Unsupported("Nodes.load() returned no nodes")
        return nodes

    def jobs(self) -> List[SlurmJob]:
        loaded = self._call("Jobs.load()", self.pyslurm.Jobs.load)
        return [job_from(j) for j in _objects(loaded)]

    def reservations(self) -> List[SlurmReservation]:
        kind = getattr(self.pyslurm, "Reservations", None)
        if kind is None:
            raise Unsupported("no Reservations in this pyslurm")
        loaded = self._call("Reservations.load()", kind.load)
        out = []
        for r in _objects(loaded):
            start, end = epoch(getattr(r, "start_time", None)), epoch(getattr(r, "end_time", None))
            if start is not None and end is not None:
                out.append(SlurmReservation(str(r.name), start, end,
                                            expand(getattr(r, "nodes", "") or "")))
        return out

    def power_config(self) -> SlurmPowerConfig:
        holder = getattr(self.pyslurm, "slurmctld", None)
        config_type = getattr(holder, "Config", None)
        if config_type is None:
            raise Unsupported("no slurmctld.Config in this pyslurm")
        conf = self._call("slurmctld.Config.load()", config_type.load)
        if getattr(conf, "resume_timeout", None) is None:
            raise Unsupported("its slurmctld.Config has no resume_timeout")
        parts = getattr(conf, "suspend_exclude_partitions", None) or ()
        if isinstance(parts, str):
            parts = [p for p in parts.split(",") if p]
        return SlurmPowerConfig(
            suspend_exc_nodes=frozenset(expand(getattr(conf, "suspend_exclude_nodes", "") or "")),
            suspend_exc_parts=frozenset(parts),
            resume_timeout=_int(getattr(conf, "resume_timeout", None)),
            suspend_timeout=_int(getattr(conf, "suspend_timeout", None)))

    def update_nodes(self, nodes: Sequence[str], state: str, reason: str = "") -> None:
        changes = {"state": state.upper()}
        if reason:
            changes["reason"] = reason
        change = self._call("Node(%s)" % changes, lambda: self.pyslurm.Node(**changes))
        target = self.pyslurm.Node(fold(nodes))
        self._call("update of %s to state=%s" % (fold(nodes), state), target.modify, change)


def node_from(n: Any) -> SlurmNode:
    """A pyslurm Node as our record."""
    base, flags = split_state(state_words(str(getattr(n, "state", "") or "")))
    parts = getattr(n, "partitions", None) or ()
    if isinstance(parts, str):
        parts = [p for p in parts.split(",") if p]
    return SlurmNode(str(n.name), base, flags, epoch(getattr(n, "last_busy_time", None)),
                     epoch(getattr(n, "slurmd_start_time", None)),
                     str(getattr(n, "reason", "") or ""), tuple(parts))


def job_from(j: Any) -> SlurmJob:
    """A pyslurm Job as our record."""
    state = str(getattr(j, "state", "") or "").upper()
    return SlurmJob(
        id=str(j.id), state=state,
        nodes=expand(getattr(j, "allocated_nodes", None)) if state != "PENDING" else (),
        scheduled_nodes=expand(getattr(j, "scheduled_nodes", None)),
        required_nodes=expand(getattr(j, "required_nodes", None)),
        start_time=epoch(getattr(j, "start_time", None)),
        reason=str(getattr(j, "state_reason", "") or ""),
        partition=str(getattr(j, "partition", "") or ""),
        comment=str(getattr(j, "comment", "") or ""))


def _objects(collection: Any) -> Iterable[Any]:
    """The objects of a pyslurm collection: MultiClusterMap/dict values, or a list."""
    values = getattr(collection, "values", None)
    return list(values()) if callable(values) else list(collection)


def _int(value: Any):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
