"""Slurm adapter: what slurmctld shows, as the planner's `Snapshot`, and node power requests.

Two clients behind one interface (`SlurmClient`): pyslurm's (used when
``import pyslurm`` works: pyslurm 25.11's ``Nodes.load()`` / ``Jobs.load()``)
and the command line's (``sinfo --json``, ``squeue --json``, ``scontrol``;
argv lists, never a shell), in `slurm_pyslurm` and `slurm_cli`. Both return
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

import abc
import time
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from ..model import QueuedJob, Reservation, Snapshot, Vnode

#: Base node states; every other word of a state string is a flag.
BASE_STATES = frozenset({"IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN"})
POWER_DOWN_FLAGS = frozenset({"POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN"})
COMING_UP_FLAGS = frozenset({"POWERING_UP", "REBOOT_REQUESTED", "REBOOT_ISSUED", "POWER_UP"})
DRAIN_FLAGS = frozenset({"DRAIN", "DRAINED", "DRAINING", "FAIL"})
DOWN_FLAGS = frozenset({"NOT_RESPONDING", "INVALID_REG"})
#: Jobs occupying their nodes.
ACTIVE_JOB_STATES = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED",
                               "STAGE_OUT", "SIGNALING", "RESIZING"})
#: Pending reasons that mean the job cannot start whatever nodes are up.
HELD_REASONS = frozenset({
    "JobHeldUser", "JobHeldAdmin", "Dependency", "DependencyNeverSatisfied", "BeginTime",
    "PartitionDown", "PartitionInactive", "InvalidAccount", "InvalidQOS", "BadConstraints",
    "JobLaunchFailure", "SystemFailure", "AccountNotAllowed", "QOSNotAllowed",
})


class SlurmError(RuntimeError):
    """Slurm could not be read or told something; the message says why (one line)."""


@dataclass(frozen=True)
class SlurmNode:
    """A node as slurmctld reports it."""

    name: str
    state: str = "IDLE"                       # base state, upper case
    flags: FrozenSet[str] = frozenset()       # POWERED_DOWN, DRAIN, ...
    last_busy: Optional[float] = None
    slurmd_start_time: Optional[float] = None
    reason: str = ""
    partitions: Tuple[str, ...] = ()

    @property
    def state_string(self) -> str:
        """``IDLE+POWERED_DOWN``, as scontrol prints it."""
        return "+".join([self.state] + sorted(self.flags))


@dataclass(frozen=True)
class SlurmJob:
    """A job with the nodes it holds, is scheduled on or requires, and its start."""

    id: str
    state: str                                # PENDING, RUNNING, CONFIGURING ...
    nodes: Tuple[str, ...] = ()               # allocated
    scheduled_nodes: Tuple[str, ...] = ()     # the backfill scheduler's plan
    required_nodes: Tuple[str, ...] = ()      # --nodelist
    start_time: Optional[float] = None        # actual, or estimated when pending
    reason: str = ""
    partition: str = ""
    comment: str = ""


@dataclass(frozen=True)
class SlurmReservation:
    """An advance reservation and its nodes."""

    name: str
    start: float
    end: float
    nodes: Tuple[str, ...] = ()


@dataclass(frozen=True)
class SlurmPowerConfig:
    """The power-saving settings of slurm.conf that matter to the planner."""

    suspend_exc_nodes: FrozenSet[str] = frozenset()
    suspend_exc_parts: FrozenSet[str] = frozenset()
    resume_timeout: Optional[int] = None
    suspend_timeout: Optional[int] = None


class SlurmClient(abc.ABC):
    """Reads slurmctld's view and asks it to change node power states."""

    #: ``cli`` or ``pyslurm``, for the log.
    name = ""

    @abc.abstractmethod
    def nodes(self) -> List[SlurmNode]:
        """Every node."""

    @abc.abstractmethod
    def jobs(self) -> List[SlurmJob]:
        """Every job slurmctld still knows (pending, running, recently ended)."""

    @abc.abstractmethod
    def reservations(self) -> List[SlurmReservation]:
        """Every advance reservation."""

    @abc.abstractmethod
    def power_config(self) -> SlurmPowerConfig:
        """SuspendExcNodes/Parts and the timeouts from the running slurmctld."""

    @abc.abstractmethod
    def update_nodes(self, nodes: Sequence[str], state: str, reason: str = "") -> None:
        """``scontrol update nodename=NODES state=STATE [reason=...]``; SlurmError if refused."""


def get_client(prefer: str = "auto", **options) -> SlurmClient:
    """pyslurm's client when importable (or ``prefer='pyslurm'``), else the CLI's."""
    if prefer not in ("auto", "cli", "pyslurm"):
        raise ValueError("prefer must be auto, cli or pyslurm, not %r" % prefer)
    if prefer != "cli":
        try:
            import pyslurm  # noqa: F401  (optional: no release builds against Slurm 22.05)
        except ImportError:
            if prefer == "pyslurm":
                raise SlurmError("pyslurm is not importable; install the pbs-power[slurm] "
                                 "extra built against your Slurm, or use the CLI")
        else:
            from .slurm_pyslurm import PyslurmClient
            return PyslurmClient(pyslurm)
    from .slurm_cli import CliClient
    return CliClient(**options)


# -- parsing helpers shared by both clients ------------------------------------
def split_state(words: Iterable[str]) -> Tuple[str, FrozenSet[str]]:
    """(base state, flags) from state words such as ``["IDLE", "POWERED_DOWN"]``."""
    words = [w.strip().upper().rstrip("*~#%!$@^-") for w in words if w and w.strip()]
    base = next((w for w in words if w in BASE_STATES), "UNKNOWN")
    return base, frozenset(w for w in words if w != base)


def state_words(text: str) -> List[str]:
    """``IDLE+POWERED_DOWN`` -> ``["IDLE", "POWERED_DOWN"]``."""
    return [w for w in (text or "").split("+") if w]


def epoch(value) -> Optional[float]:
    """A positive epoch from an int/float/str; 0, negative or junk -> None."""
    if isinstance(value, dict):        # newer Slurm JSON: {"set": true, "number": N}
        value = value.get("number") if value.get("set", True) else None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def local_time(text: str) -> Optional[float]:
    """scontrol's ``2026-11-22T18:16:01`` (local time) -> epoch; Unknown/None/N/A -> None."""
    text = (text or "").strip()
    if not text or text[0].isalpha():
        return None
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def expand(hostlist) -> Tuple[str, ...]:
    """Host names of a Slurm hostlist (``node[1-3],gpu01``); a list is expanded item by item."""
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError
    if not hostlist:
        return ()
    if isinstance(hostlist, (list, tuple)):
        hostlist = ",".join(str(h) for h in hostlist if h)
    text = str(hostlist).strip()
    if text in ("", "(null)", "None", "N/A"):
        return ()
    try:
        return tuple(NodeSet(text))
    except NodeSetParseError as exc:
        raise SlurmError("bad hostlist %r: %s" % (text, exc)) from None


def fold(hosts: Iterable[str]) -> str:
    """``["node1", "node2"]`` -> ``node[1-2]``."""
    from ClusterShell.NodeSet import NodeSet
    return str(NodeSet.fromlist(list(hosts)))


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
    jobs = client.jobs()
    resvs = client.reservations() if with_reservations else []
    return SlurmView(tuple(nodes), tuple(jobs), tuple(resvs), client.power_config())


def usable(node: Optional[SlurmNode]) -> bool:
    """Up and accepting work (what a resumed node must reach to count as booted)."""
    return node is not None and Vnode(node.name, node.name, vnode_states(node)).usable


def powered_down(node: Optional[SlurmNode]) -> bool:
    """Slurm counts the node powered down (or going down)."""
    return node is not None and bool(node.flags & POWER_DOWN_FLAGS)

