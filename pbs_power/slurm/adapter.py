"""Slurm adapter: what slurmctld shows, as the planner's `Snapshot`, and node power requests.

Two clients behind one interface (`SlurmClient`): pyslurm's (used when a
child process could import it, for what that release has: `selection`) and
the command line's (``scontrol --json``, ``sinfo --json``, ``squeue --json``;
argv lists, never a shell), in `pyslurm_client` and `commands`; the interface
and the records are in `client`. Both return
the plain records below; this module turns them into `Vnode`s, `QueuedJob`s
and `Reservation`s with PBS's state names (see `model`), so the same planner
runs over either scheduler.

Node states (base state plus flags, as ``scontrol`` prints ``IDLE+POWERED_DOWN``)
map as follows: POWERED_DOWN, POWERING_DOWN or POWER_DOWN -> ``sleep``;
DOWN -> ``down`` (a node both down and powered down is only ``down``: it is
never woken); DRAIN/FAIL -> ``offline``; POWERING_UP or a reboot in progress
-> ``provisioning`` (not usable yet, though NOT_RESPONDING until slurmd
registers); NOT_RESPONDING otherwise -> ``down``; MAINTENANCE ->
``maintenance``; ALLOCATED/MIXED -> ``job-busy``; COMPLETING -> ``busy``;
IDLE -> ``free``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from pbs_power.states.model import QueuedJob, Reservation, Snapshot, Vnode
from .client import (  # noqa: F401  (re-exported: the adapter's public names)
    ACTIVE_JOB_STATES, BASE_STATES, COMING_UP_FLAGS, DOWN_FLAGS, DRAIN_FLAGS, HELD_REASONS,
    POWER_DOWN_FLAGS, SlurmClient, SlurmError, SlurmJob, SlurmNode, SlurmPowerConfig,
    SlurmReservation, epoch, expand, fold, local_time, split_state, state_words,
)

def get_client(prefer: str = "auto", log=None, **options) -> SlurmClient:
    """pyslurm's client where a child process could import it, else the commands'.

    See `pbs_power.slurm.selection`: ``prefer`` is auto, cli or pyslurm;
    ``options`` (bin_dir, timeout, env) go to the command-line client.
    """
    from .selection import choose_client
    return choose_client(prefer, log, **options)


# -- Slurm records -> the planner's types ---------------------------------------
def vnode_states(node: SlurmNode) -> FrozenSet[str]:
    """PBS state names for a Slurm node; see the module docstring."""
    flags, base = node.flags, node.state
    if base in ("DOWN", "ERROR"):
        states = {"down"}
    elif flags & DRAIN_FLAGS:
        states = {"offline"}
    elif "MAINTENANCE" in flags:
        states = {"maintenance"}
    elif flags & COMING_UP_FLAGS:       # a resuming node is NOT_RESPONDING until slurmd registers
        states = {"provisioning"}
    elif flags & DOWN_FLAGS:
        states = {"down"}
    elif flags & POWER_DOWN_FLAGS:
        states = {"sleep"}
        if base in ("ALLOCATED", "MIXED"):
            states.add("job-busy")
    elif base in ("ALLOCATED", "MIXED"):
        states = {"job-busy"}
    elif "COMPLETING" in flags:
        states = {"busy"}
    elif base == "IDLE":
        states = {"free"}
    else:
        states = {"state-unknown"}
    return frozenset(states)


def power_eligible(node: SlurmNode, power: SlurmPowerConfig) -> bool:
    """False for nodes slurm.conf keeps out of power saving (SuspendExcNodes/Parts)."""
    if node.name in power.suspend_exc_nodes:
        return False
    return not (set(node.partitions) & power.suspend_exc_parts)


def jobs_per_node(jobs: Iterable[SlurmJob]) -> Dict[str, Tuple[str, ...]]:
    """node -> ids of the jobs occupying it."""
    out: Dict[str, List[str]] = {}
    for job in jobs:
        if job.state in ACTIVE_JOB_STATES:
            for node in job.nodes:
                out.setdefault(node, []).append(job.id)
    return {node: tuple(ids) for node, ids in out.items()}


def vnodes_from(nodes: Sequence[SlurmNode], jobs: Sequence[SlurmJob],
                power: SlurmPowerConfig = SlurmPowerConfig(),
                reservations: Sequence[SlurmReservation] = (),
                now: Optional[float] = None) -> Tuple[Vnode, ...]:
    """One `Vnode` per Slurm node (host = node name)."""
    now = time.time() if now is None else now
    running = jobs_per_node(jobs)
    in_resv: Dict[str, List[str]] = {}
    for r in reservations:
        if r.start <= now < r.end:
            for node in r.nodes:
                in_resv.setdefault(node, []).append(r.name)
    out = []
    for n in nodes:
        resvs = tuple(in_resv.get(n.name, ()))
        if not resvs and "RESERVED" in n.flags:
            resvs = ("reservation",)
        out.append(Vnode(name=n.name, host=n.name, states=vnode_states(n),
                         poweroff_eligible=power_eligible(n, power),
                         last_used_time=n.last_busy,
                         last_state_change_time=n.slurmd_start_time,
                         jobs=running.get(n.name, ()), resvs=resvs))
    return tuple(out)


def queued_jobs_from(jobs: Iterable[SlurmJob]) -> Tuple[QueuedJob, ...]:
    """Pending jobs that could start once nodes are up, with their start estimate.

    Nodes: the backfill scheduler's plan when it has one, else the nodes
    the job requires (``--nodelist``); a job with neither wakes nothing.
    """
    out = []
    for job in jobs:
        if job.state != "PENDING" or job.reason in HELD_REASONS:
            continue
        nodes = job.scheduled_nodes or job.required_nodes
        out.append(QueuedJob(job.id, job.start_time, tuple(nodes)))
    return tuple(out)


def reservations_from(reservations: Iterable[SlurmReservation]) -> Tuple[Reservation, ...]:
    """Reservations holding nodes, as the planner's type."""
    return tuple(Reservation(r.name, r.start, r.end, r.nodes) for r in reservations if r.nodes)


@dataclass(frozen=True)
class SlurmView:
    """One consistent read of slurmctld, kept raw for the power programs' checks."""

    nodes: Tuple[SlurmNode, ...]
    jobs: Tuple[SlurmJob, ...]
    reservations: Tuple[SlurmReservation, ...] = ()
    power: SlurmPowerConfig = SlurmPowerConfig()

    def node(self, name: str) -> Optional[SlurmNode]:
        return next((n for n in self.nodes if n.name == name), None)

    def snapshot(self, now: Optional[float] = None) -> Snapshot:
        """The planner's input (transitions and history are added by the caller)."""
        return Snapshot(vnodes_from(self.nodes, self.jobs, self.power, self.reservations, now),
                        queued_jobs=queued_jobs_from(self.jobs),
                        reservations=reservations_from(self.reservations))


def read_view(client: SlurmClient, with_reservations: bool = True) -> SlurmView:
    """Nodes, jobs, reservations and power settings in one go; SlurmError on failure."""
    nodes = client.nodes()
    if not nodes:     # a cluster has nodes: an empty list is a reading that went wrong
        raise SlurmError("Slurm (through %s) reported no nodes at all; nothing is planned "
                         "from an empty cluster" % (client.name or "its client"))
    jobs = client.jobs()
    resvs = client.reservations() if with_reservations else []
    return SlurmView(tuple(nodes), tuple(jobs), tuple(resvs), client.power_config())


def usable(node: Optional[SlurmNode]) -> bool:
    """Up and accepting work (what a resumed node must reach to count as booted)."""
    return node is not None and Vnode(node.name, node.name, vnode_states(node)).usable


def powered_down(node: Optional[SlurmNode]) -> bool:
    """Slurm counts the node powered down (or going down)."""
    return node is not None and bool(node.flags & POWER_DOWN_FLAGS)

