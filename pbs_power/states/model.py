"""Plain data shared by the planner, the adapters and the store.

Everything here is immutable and free of I/O: a scheduler adapter builds a
`Snapshot`, the planner turns it into a `Plan`, the cycle carries the plan out.
Vnode states use PBS's state names (``free``, ``job-busy``, ``sleep`` ...);
the Slurm adapter maps its own states onto them.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Mapping, Optional, Sequence, Tuple
from pbs_power._records import evolve  # noqa: F401  (part of the model's API)

# Vnode state names as PBS prints them (pbsnodes, qstat).
FREE = "free"
SLEEP = "sleep"
OFFLINE = "offline"
DOWN = "down"
BUSY_STATES = frozenset({"job-busy", "job-exclusive", "resv-exclusive", "busy"})
_FREE_ONLY = frozenset({FREE})
#: What pbs_server shows on a vnode whose MoM it cannot reach (its host off or
#: booting): ``down``, and ``state-unknown`` after a server restart until the
#: MoM registers, which clears them and the sleep mark alike.
MOM_GONE_STATES = frozenset({DOWN, "state-unknown"})
#: States in which a vnode cannot take work for reasons other than power.
UNAVAILABLE_STATES = frozenset({
    DOWN, OFFLINE, "stale", "state-unknown", "unresolvable", "maintenance",
    "provisioning", "wait-provisioning", "initializing", "deleted",
})


class TransitionKind(str, enum.Enum):
    """A power change of a whole host."""

    POWER_OFF = "power_off"
    POWER_ON = "power_on"
    SLEEP = "sleep"      # ramp-rate mode: step into a low-power sleep state
    WAKE = "wake"        # ramp-rate mode: step back to full readiness

    @property
    def is_down(self) -> bool:
        return self in (TransitionKind.POWER_OFF, TransitionKind.SLEEP)

    @property
    def reverse(self) -> "TransitionKind":
        return _REVERSE[self]


_REVERSE = {
    TransitionKind.POWER_OFF: TransitionKind.POWER_ON,
    TransitionKind.POWER_ON: TransitionKind.POWER_OFF,
    TransitionKind.SLEEP: TransitionKind.WAKE,
    TransitionKind.WAKE: TransitionKind.SLEEP,
}


class Phase(str, enum.Enum):
    """Where a transition is.

    Going down: DRAINING (the scheduler has been told the host sleeps, no
    command sent yet, so a job placed in the meantime is never cut off) then
    POWERING_DOWN (backend command sent, waiting for it to take effect).
    Coming up: POWERING_UP (backend command sent) then BOOTING (the backend
    says the host is on; waiting for the scheduler to see it usable).
    """

    DRAINING = "draining"
    POWERING_DOWN = "powering_down"
    POWERING_UP = "powering_up"
    BOOTING = "booting"


class PowerState(str, enum.Enum):
    """What a power backend reports for a host."""

    ON = "on"
    OFF = "off"
    ASLEEP = "asleep"
    TRANSITIONING = "transitioning"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Vnode:
    """One schedulable vnode as the scheduler sees it."""

    name: str
    host: str
    states: FrozenSet[str] = frozenset({FREE})
    poweroff_eligible: bool = False
    last_used_time: Optional[float] = None
    last_state_change_time: Optional[float] = None
    jobs: Tuple[str, ...] = ()
    resvs: Tuple[str, ...] = ()

    @property
    def asleep(self) -> bool:
        return SLEEP in self.states

    @property
    def idle(self) -> bool:
        """Free with nothing on it: the only state from which we power down."""
        return self.states == _FREE_ONLY and not self.jobs

    @property
    def mom_gone(self) -> bool:
        """The server cannot reach its MoM (the host is off or booting)."""
        return bool(self.states & MOM_GONE_STATES)

    @property
    def usable(self) -> bool:
        """Up and reachable: free or busy, neither asleep nor unavailable."""
        return not self.asleep and not (self.states & UNAVAILABLE_STATES)


@dataclass(frozen=True)
class QueuedJob:
    """A queued job with the scheduler's estimate of when and where it runs."""

    id: str
    estimated_start: Optional[float]
    vnodes: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Reservation:
    """An advance or standing reservation occurrence and its vnodes."""

    id: str
    start: float
    end: float
    vnodes: Tuple[str, ...] = ()


@dataclass(frozen=True)
class Transition:
    """A power change in flight, persisted across cycles by the store."""

    host: str
    kind: TransitionKind
    phase: Phase
    started: float
    phase_since: float
    reason: str = ""

    def advanced(self, phase: Phase, now: float) -> "Transition":
        return Transition(self.host, self.kind, phase, self.started, now,
                          self.reason)


@dataclass(frozen=True)
class RampStep:
    """A step in cluster power caused by one of our commands (for ramp limits)."""

    time: float
    host: str
    watts: float            # positive: power goes up; negative: down


class BootTimes(dict):
    """``Snapshot.boot_times`` that also knows its longest seconds.

    The planner asks for the longest boot every cycle; on a fleet of
    thousands of hosts finding it anew each time costs more than the rest
    of a quiet cycle. Built by `cycle.boot_times`; read it, do not change it.
    """

    #: The longest seconds of any host and kind here; None when there are none.
    longest: Optional[float] = None


@dataclass(frozen=True)
class Snapshot:
    """Everything the planner may know about the cluster at one instant."""

    vnodes: Tuple[Vnode, ...]
    queued_jobs: Tuple[QueuedJob, ...] = ()
    reservations: Tuple[Reservation, ...] = ()
    transitions: Tuple[Transition, ...] = ()
    #: Learned seconds to come up, per host and transition kind
    #: (``{"n01": {"power_on": 412.0}}``); hosts not listed use the config.
    boot_times: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: When each host went down, as recorded by the store.
    down_since: Mapping[str, float] = field(default_factory=dict)
    #: Our recent power steps, for the ramp-rate window.
    recent_steps: Tuple[RampStep, ...] = ()


@dataclass(frozen=True)
class Action:
    """Start one transition on one host; ``reason`` says why, for the log."""

    host: str
    kind: TransitionKind
    reason: str
    need_by: Optional[float] = None
    watts: float = 0.0


@dataclass(frozen=True)
class Deferral:
    """A transition the planner wanted but held back, and what held it."""

    host: str
    kind: TransitionKind
    reason: str


@dataclass(frozen=True)
class Plan:
    """The planner's output: what to start now and what waits."""

    actions: Tuple[Action, ...] = ()
    deferred: Tuple[Deferral, ...] = ()
    notes: Tuple[str, ...] = ()

    def hosts(self, kind: TransitionKind) -> Tuple[str, ...]:
        return tuple(a.host for a in self.actions if a.kind is kind)


def hosts_of(vnodes: Sequence[Vnode]) -> Dict[str, Tuple[Vnode, ...]]:
    """Group vnodes by host, keeping the scheduler's order."""
    grouped: Dict[str, list] = {}
    for vnode in vnodes:
        grouped.setdefault(vnode.host, []).append(vnode)
    return {host: tuple(vs) for host, vs in grouped.items()}
