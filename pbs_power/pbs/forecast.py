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
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from .placement import (DEFAULT_CHECKED, MAX_INSTANCES, JobRequest, Room, VnodeSpace,
                        parse_amount)

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
    if _unit_amount(jobs, vnodes, releases, checked) is not None:
        room = [v for v in vnodes if _not_full(v.free.get("ncpus"))]
        return _unit_starts(jobs, room, releases, now)
    return _general_starts(jobs, vnodes, releases, now, checked)


def forecast_whole_vnodes(jobs: Sequence[JobRequest], vnodes: Sequence[VnodeSpace],
                          releases: Sequence[Release], now: float) -> Tuple[Start, ...]:
    """`forecast_starts` for a caller that knows every vnode given has the same
    whole ncpus free (none is full), every release gives that back per vnode
    and every chunk asks for exactly that, nothing exclusive (a cluster of
    whole-node jobs, as the simulator's): the same answer, without checking
    that on every call."""
    return _unit_starts(jobs, vnodes, releases, now) if jobs else ()


def _general_starts(jobs: Sequence[JobRequest], vnodes: Sequence[VnodeSpace],
                    releases: Sequence[Release], now: float,
                    checked: FrozenSet[str]) -> Tuple[Start, ...]:
    """`forecast_starts` for any resources, sharing and arrangement."""
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


# -- whole identical vnodes --------------------------------------------------------
#: Vnode ``sharing`` values under which a job that asks for nothing exclusive shares.
_SHARED_VNODES = frozenset({"", "default_shared", "force_shared", "ignore_excl"})


def _unit_amount(jobs: Sequence[JobRequest], vnodes: Sequence[VnodeSpace],
                 releases: Sequence[Release], checked: FrozenSet[str]) -> Optional[float]:
    """The whole number of ncpus that every vnode not full has free, that
    every running job gives back on each of its vnodes and that every chunk
    asks for, when ncpus is all that the fit compares and nothing is
    exclusive (None otherwise). Then a chunk fills one vnode, and a job of N
    chunks takes the first N vnodes that the general fit would offer. A full
    vnode (0 free, a busy one) takes nothing until a running job frees it."""
    if "ncpus" not in checked:
        return None
    if not {v.sharing for v in vnodes} <= _SHARED_VNODES:
        return None
    # Each test runs over the distinct values only: (type, value), as a bool
    # must not pass for the number it equals.
    found = {(type(x), x) for x in [v.free.get("ncpus") for v in vnodes]}
    full = {key for key in found if _whole(key[1]) == 0}
    values = found - full
    room = [v.name for v in vnodes]
    freed = [n for rel in releases for n, _host, _amounts, _last in rel.vnodes]
    if len(set(room)) != len(room) or len(set(freed)) != len(freed):
        return None                           # a vnode twice: its resources add up
    if full:
        room = [v.name for v in vnodes if (type(v.free.get("ncpus")), v.free.get("ncpus"))
                not in full]
    if not set(freed).isdisjoint(room):
        return None                           # freed onto free room: more than one chunk
    for amounts in {a for rel in releases for _n, _host, a, _last in rel.vnodes}:
        if len(amounts) != 1 or amounts[0][0] != "ncpus":
            return None
        values.add((type(amounts[0][1]), amounts[0][1]))
    if {(j.arrangement, j.instances) for j in jobs} != {("free", 1)} \
            or not {j.sharing for j in jobs} <= {"", "shared"}:
        return None
    for resources in {c.resources for j in jobs for c in j.chunks}:
        asked = [item for item in resources if item[0] in checked]
        if len(asked) != 1 or asked[0][0] != "ncpus":
            return None
        values.add((type(asked[0][1]), asked[0][1]))
    units = {_whole(value) for _type, value in values}
    if len(units) != 1:
        return None
    unit = units.pop()
    return unit if unit is not None and unit > 0 else None


def _whole(value) -> Optional[float]:
    """A whole number of ncpus (sums of them are exact in floats), else None."""
    amount = None if isinstance(value, bool) else parse_amount(value)
    if amount is None or amount != int(amount) or amount > 2 ** 40:
        return None
    return amount


def _not_full(ncpus) -> bool:
    """A vnode `_unit_amount` let through has the unit free, or none (full)."""
    return _whole(ncpus) != 0 if isinstance(ncpus, str) else bool(ncpus)


class _Line:
    """Vnodes in the fit's order, taken from the front; ``held`` ones skipped on request."""

    def __init__(self, names: Sequence[str]):
        self.names = list(names)
        self.taken: set = set()
        self.left = len(self.names)
        self._head = 0

    def first(self, count: int, skip: FrozenSet[str] = frozenset()) -> Tuple[str, ...]:
        """The first ``count`` vnodes not taken and not in ``skip`` (fewer if short)."""
        out: List[str] = []
        names, taken = self.names, self.taken
        i = self._head
        while i < len(names) and taken and names[i] in taken:
            i += 1
        self._head = i
        while i < len(names) and len(out) < count:
            name = names[i]
            if name not in taken and name not in skip:
                out.append(name)
            i += 1
        return tuple(out)

    def take(self, names: Iterable[str]) -> None:
        for name in names:
            self.taken.add(name)
        self.left = len(self.names) - len(self.taken)


def _unit_starts(jobs: Sequence[JobRequest], room: Sequence[VnodeSpace],
                 releases: Sequence[Release], now: float) -> Tuple[Start, ...]:
    """`forecast_starts` when every chunk fills one vnode: the same answer,
    found by counting vnodes instead of fitting resources (``room``: the
    vnodes not full)."""
    line = _Line([v.name for v in room if not v.asleep] + [v.name for v in room if v.asleep])
    ordered = sorted(releases, key=lambda r: r.at)
    out: List[Start] = []
    shadow: Optional[float] = None
    held: FrozenSet[str] = frozenset()        # the top blocked job's vnodes free now
    held_left = 0                             # of those, how many no job took since
    for job in jobs:
        chunks = job.chunks
        width = chunks[0].count if len(chunks) == 1 else sum(c.count for c in chunks)
        if shadow is None:
            if width <= line.left:
                names = line.first(width)
                line.take(names)
                out.append(Start(job.id, None, names))
                continue
            found = _unit_shadow(line, ordered, width, now)
            if found is None:
                continue
            shadow, taken, held = found
            out.append(Start(job.id, shadow, taken))
            held_left = len(held)
            continue
        if not line.left:
            break
        if job.walltime is not None and now + job.walltime <= shadow:
            if width > line.left:
                continue
            names = line.first(width)          # ends before the top job starts
        else:
            if width > line.left - held_left:
                continue
            names = line.first(width, held)    # leaves the top job's vnodes alone
        held_left -= sum(1 for n in names if n in held)
        line.take(names)
        out.append(Start(job.id, None, names))
    return tuple(out)


def _unit_shadow(line: _Line, releases: Sequence[Release], width: int, now: float
                 ) -> Optional[Tuple[float, Tuple[str, ...], FrozenSet[str]]]:
    """The first release after which ``width`` vnodes are free; the vnodes the
    job would take then (released ones first, in release order) and those of
    them that are free now."""
    freed: List[str] = []
    for i, rel in enumerate(releases):
        freed.extend(name for name, _host, _amounts, _last in rel.vnodes)
        if i + 1 < len(releases) and releases[i + 1].at <= rel.at:
            continue
        if len(freed) + line.left >= width:
            now_free = line.first(width - min(width, len(freed)))
            return max(rel.at, now), tuple(freed[:width]) + now_free, frozenset(now_free)
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


__all__ = ["Release", "Start", "forecast_starts", "forecast_whole_vnodes"]
