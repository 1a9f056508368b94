"""The Slurm client interface and the plain records both clients return.

`pbs_power.slurm.commands` (Slurm's commands) and `pbs_power.slurm.pyslurm_client`
implement `SlurmClient`; the parsing helpers here are shared by both.
"""
from __future__ import annotations

import abc
import time
from dataclasses import dataclass
from typing import FrozenSet, Iterable, List, Optional, Sequence, Tuple

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


class Unsupported(SlurmError):
    """This client cannot serve the request (its library lacks it); another client may."""


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
