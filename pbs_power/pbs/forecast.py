"""When each queued PBS job will start, and on which vnodes. Pure: no I/O.

A stock PBS scheduler estimates only its top job, and counts no sleeping
vnode unless the server provisions power; so a power hook that waits for
the scheduler learns what a job needs only when it could run now, and the
job then waits for its nodes to boot. ``forecast_starts`` computes the
scheduler's plan ahead of it, EASY-style, from what qstat and the vnodes
show: running jobs free their resources when their walltime runs out
(``stime`` + ``Resource_List.walltime``); queued jobs, in the scheduler's
order, start now where they fit on free or sleeping vnodes; the first that
does not gets the earliest time at which the released resources let it
fit (its shadow time) and those vnodes held for it; later jobs start now
only if they end by then or leave its vnodes alone. Sleeping vnodes count
as available at every time: they are what the hook may wake.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

from .placement import DEFAULT_CHECKED, MAX_INSTANCES, JobRequest, VnodeSpace, Room

#: One vnode a running job frees: (vnode, host, ((resource, amount), ...), last),
#: ``last`` when no running job holds the vnode after this one ends.
Freed = Tuple[str, str, Tuple[Tuple[str, float], ...], bool]


@dataclass(frozen=True)
class Release:
    """What a running job gives back when its walltime runs out, at ``at``."""

    at: float
    job_id: str
    vnodes: Tuple[Freed, ...]


@dataclass(frozen=True)
class Start:
    """A queued job's forecast: ``start`` None means now; the vnodes it takes."""

    job_id: str
    start: Optional[float]
    vnodes: Tuple[str, ...]


def forecast_starts(jobs: Sequence[JobRequest], vnodes: Sequence[VnodeSpace],
                    releases: Sequence[Release], now: float,
                    checked: FrozenSet[str] = DEFAULT_CHECKED) -> Tuple[Start, ...]:
    """Each queued job (in the scheduler's order) that starts now or is the top
    blocked job, with its start and vnodes; jobs the plan cannot place yet are
    left out (the next cycles place them)."""
    if not jobs:
        return ()
    room = Room(vnodes, checked)
    ordered = sorted(releases, key=lambda r: r.at)
    out: List[Start] = []
    shadow: Optional[float] = None
    both: Optional[Room] = None              # room now that is still free at the shadow
    for job in jobs:
        if shadow is None:
            names, blocked = _place_now(room, job, None, False)
            if names:
                out.append(Start(job.id, None, names))
            if not blocked:
                continue
            found = _shadow(room, ordered, job, now)
            if found is None:
                continue                      # never fits: no estimate, as PBS gives none
            shadow, later, taken = found
            out.append(Start(job.id, shadow, taken))
            both = room.narrowed(later)
            continue
        if not room.live:
            break
        ends_first = job.walltime is not None and now + job.walltime <= shadow
        names, _blocked = _place_now(room, job, both, not ends_first)
        if names:
            out.append(Start(job.id, None, names))
    return tuple(out)


def _place_now(room: Room, job: JobRequest, both: Optional[Room], past: bool
               ) -> Tuple[Tuple[str, ...], bool]:
    """Start the job's instances now, in ``room``; one running ``past`` the
    shadow time only where ``both`` (room that stays free then) allows. The
    vnodes, and whether an instance is left waiting."""
    names: Dict[str, None] = {}
    target = both if past and both is not None else room
    cpus = _ncpus(job) if "ncpus" in room.checked else 0.0
    for _ in range(max(1, min(job.instances, MAX_INSTANCES))):
        if cpus and target.total("ncpus") < cpus:
            return tuple(names), True         # not enough ncpus left anywhere
        plan = target.arrange(job)
        if plan is None:
            return tuple(names), True
        names.update((n, None) for n in room.commit(job, plan))
        if both is not None:
            both.commit(job, plan)
    return tuple(names), False


def _shadow(room: Room, releases: Sequence[Release], job: JobRequest, now: float
            ) -> Optional[Tuple[float, Room, Tuple[str, ...]]]:
    """The first release after which one instance of ``job`` fits: that time,
    the room then (the job's share taken) and its vnodes; None if never."""
    later = room.copy()
    counted = "ncpus" in room.checked
    cpus = _ncpus(job) if counted else 0.0
    have = later.total("ncpus") if counted else 0.0
    for i, rel in enumerate(releases):
        for name, host, amounts, last in rel.vnodes:
            later.release(name, host, dict(amounts), vacated=last)
            if counted:
                have += dict(amounts).get("ncpus", 0.0)
        if i + 1 < len(releases) and releases[i + 1].at <= rel.at:
            continue                          # the same moment: free them all first
        if cpus and have < cpus:
            continue                          # not enough ncpus anywhere yet
        later.refresh()
        plan = later.arrange(job)
        if plan is not None:
            return max(rel.at, now), later, tuple(later.commit(job, plan))
    return None


def _ncpus(job: JobRequest) -> float:
    """The ncpus one instance asks for (0 when a chunk names none or an odd value)."""
    total = 0.0
    for chunk in job.chunks:
        for name, value in chunk.resources:
            if name == "ncpus":
                try:
                    total += chunk.count * float(value)
                except ValueError:
                    return 0.0
    return total


__all__ = ["Release", "Start", "forecast_starts"]
