"""Where queued PBS jobs would run if sleeping vnodes were up. Pure: no I/O.

The PBS scheduler never places a job on a ``sleep`` vnode, and with its
default sched_config it gives no start estimate either, so a job that needs
sleeping vnodes would wait forever. ``fit_jobs`` does the scheduler's fit
ahead of it: queued jobs in the order the scheduler considers them, each
``select`` chunk onto free vnodes first and sleeping vnodes after, with the
job's ``place`` (free, pack, scatter, vscatter; excl, exclhost, shared) and
each vnode's ``sharing``. What it returns is, per job, the sleeping vnodes
that would make it runnable now: the vnodes to wake.

Jobs that fit on awake vnodes use them up (the scheduler will start them),
so later jobs do not count on those resources. A chunk goes on one vnode.
Only the resources the scheduler checks (sched_config's ``resources:``
line) are compared: numbers and sizes are consumed, other values must match.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple

#: sched_config's ``resources:`` line as shipped (src/scheduler/sched_config).
DEFAULT_CHECKED = frozenset({"ncpus", "mem", "arch", "host", "vnode", "aoe", "eoe"})
#: Subjobs of one array tried per cycle; more cannot matter for a cluster's sleeping vnodes.
MAX_INSTANCES = 256
ARRANGEMENTS = ("free", "pack", "scatter", "vscatter")
SHARINGS = ("", "excl", "exclhost", "shared")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(b|w)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


class SelectError(ValueError):
    """A select or place statement this module cannot read."""


@dataclass(frozen=True)
class Chunk:
    """``count`` copies of one chunk's resource requests."""

    count: int
    resources: Tuple[Tuple[str, str], ...]


@dataclass(frozen=True)
class JobRequest:
    """A queued job as the fit sees it; ``instances`` > 1 for an array's queued subjobs."""

    id: str
    chunks: Tuple[Chunk, ...]
    arrangement: str = "free"
    sharing: str = ""
    instances: int = 1
    walltime: Optional[float] = None    # seconds requested; None: unknown (runs for ever)


@dataclass(frozen=True)
class VnodeSpace:
    """A vnode's room: ``free`` = available less assigned for numbers, the value otherwise."""

    name: str
    host: str
    asleep: bool
    free: Mapping[str, Any]
    occupied: bool = False          # jobs run on it
    sharing: str = "default_shared"


@dataclass(frozen=True)
class JobFit:
    """A job that runs now if ``wake`` (sleeping vnodes, in order) come up."""

    job_id: str
    wake: Tuple[str, ...]


# -- reading PBS's text ----------------------------------------------------------
def parse_select(text: str) -> Tuple[Chunk, ...]:
    """``2:ncpus=4:mem=2gb+ngpus=1`` -> chunks; SelectError when unreadable."""
    chunks = []
    for part in str(text or "").split("+"):
        part = part.strip()
        if not part:
            raise SelectError("empty chunk in select %r" % text)
        fields = part.split(":")
        count = 1
        if fields[0].isdigit():
            count = int(fields.pop(0))
        pairs = []
        for item in fields:
            name, eq, value = item.partition("=")
            if not eq or not name.strip():
                raise SelectError("%r in select %r is not name=value" % (item, text))
            pairs.append((name.strip(), value.strip()))
        if count < 1:
            raise SelectError("chunk count %d in select %r" % (count, text))
        chunks.append(Chunk(count, tuple(pairs)))
    return tuple(chunks)


def parse_place(text: Optional[str]) -> Tuple[str, str]:
    """``scatter:excl`` -> (arrangement, sharing); PBS's default arrangement is free."""
    arrangement, sharing = "free", ""
    for token in str(text or "").split(":"):
        token = token.strip().lower()
        if token in ARRANGEMENTS:
            arrangement = token
        elif token in SHARINGS[1:]:
            sharing = token
        elif token and not token.startswith("group="):
            raise SelectError("unknown place token %r" % token)
    return arrangement, sharing


def parse_amount(value: Any) -> Optional[float]:
    """A number or a PBS size (``8gb``, ``512mb``, ``4w``) as a float; None if neither.

    Sizes are in bytes (a word is 8 bytes; ``k`` is 1024, as PBS counts).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    match = _SIZE.match(str(value))
    if not match:
        return None
    number, unit, kind = match.groups()
    if not unit and not kind:
        return float(number)
    scale = _SIZE_UNITS[unit.lower()] * (8 if (kind or "b").lower() == "w" else 1)
    return float(number) * scale


def count_indices(text: Any) -> int:
    """How many indices an ``array_indices_remaining`` range names (``1-3,7``, ``1-9:2``)."""
    total = 0
    for part in str(text if text is not None else "").split(","):
        part = part.strip()
        if not part:
            continue
        span, _, step = part.partition(":")
        low, _, high = span.partition("-")
        try:
            lo, hi = int(low), int(high or low)
            total += max(0, (hi - lo) // max(1, int(step or 1)) + 1)
        except ValueError:
            continue
    return total


# -- the fit ----------------------------------------------------------------------
def fit_jobs(jobs: Sequence[JobRequest], vnodes: Sequence[VnodeSpace],
             checked: FrozenSet[str] = DEFAULT_CHECKED) -> Tuple[JobFit, ...]:
    """Per job (in the given order), the sleeping vnodes that make it runnable now.

    ``vnodes`` come in the scheduler's node order; jobs that cannot run even
    with every sleeping vnode up get nothing and take nothing.
    """
    room = Room(vnodes, checked)
    fits: List[JobFit] = []
    for job in jobs:
        if not room.sleeping_left():
            break
        wake: Dict[str, None] = {}
        for _ in range(max(1, min(job.instances, MAX_INSTANCES))):
            taken = room.place(job)
            if taken is None:
                break
            wake.update((name, None) for name in taken if room.asleep(name))
        if wake:
            fits.append(JobFit(job.id, tuple(wake)))
    return tuple(fits)


class Room:
    """Free resources per vnode while jobs are fitted one after the other.

    Values are parsed once (numbers to floats); vnodes that are full or
    taken whole leave ``live``, so a long queue on a busy cluster does not
    scan them again for every chunk. Awake vnodes come before sleeping ones
    (wake as few as possible). ``release`` gives a running job's resources
    back, for a forecast of later starts.
    """

    def __init__(self, vnodes: Sequence[VnodeSpace], checked: FrozenSet[str]):
        self.by_name = {v.name: v for v in vnodes}
        self.free: Dict[str, Dict[str, Any]] = {v.name: _parsed(v.free) for v in vnodes}
        self.used = {v.name for v in vnodes if v.occupied}      # something runs there
        self.whole: set = set()                                 # taken exclusively
        self.checked = checked
        self.awake = [v for v in vnodes if not v.asleep]
        self.dozing = [v for v in vnodes if v.asleep]
        self.freed: Dict[str, VnodeSpace] = {}          # released by running jobs, in order
        self._relive()

    def copy(self) -> "Room":
        """An independent room with the same free resources (for a look ahead)."""
        other = Room.__new__(Room)
        other.by_name = dict(self.by_name)
        other.free = {name: dict(free) for name, free in self.free.items()}
        other.used, other.whole = set(self.used), set(self.whole)
        other.checked, other.awake, other.dozing = self.checked, list(self.awake), self.dozing
        other.freed = dict(self.freed)
        other.live, other.sleeping = list(self.live), self.sleeping
        other._totals = {}
        return other

    def narrowed(self, other: "Room") -> "Room":
        """A room with, per vnode, the lesser amount of this one and ``other``'s."""
        out = self.copy()
        for name, free in out.free.items():
            theirs = other.free.get(name, {})
            for key, have in free.items():
                if isinstance(have, float):
                    there = theirs.get(key)
                    free[key] = min(have, there) if isinstance(there, float) else 0.0
        out.used |= other.used
        out.whole |= other.whole
        out._relive()
        return out

    def release(self, name: str, host: str, amounts: Mapping[str, float],
                vacated: bool) -> None:
        """A running job ends: ``amounts`` come back on ``name`` (awake, as it ran
        a job); ``vacated``: no other running job is left on it. Freed vnodes
        come first: they are up anyway, so counting on them keeps fewer idle
        vnodes up and wakes fewer."""
        space = self.by_name.get(name)
        if space is None:
            space = self.by_name[name] = VnodeSpace(name, host, False, {})
            self.free[name] = {}
        self.freed.setdefault(name, space)
        self._totals = {}
        free = self.free[name]
        for key, amount in amounts.items():
            have = free.get(key, 0.0)
            if isinstance(have, float):
                free[key] = have + float(amount)
        if vacated:
            self.used.discard(name)
            self.whole.discard(name)

    def _relive(self) -> None:
        self._totals: Dict[str, float] = {}
        freed = self.freed
        self.live = [v for v in freed.values() if not self._full(v.name)] + \
            [v for v in self.awake if v.name not in freed and not self._full(v.name)] + \
            [v for v in self.dozing if v.name not in freed and not self._full(v.name)]
        self.sleeping = sum(1 for v in self.live if v.asleep)

    def refresh(self) -> None:
        """Look at every vnode again (after releases)."""
        self._relive()

    def asleep(self, name: str) -> bool:
        return self.by_name[name].asleep

    def sleeping_left(self) -> bool:
        return self.sleeping > 0

    def _full(self, name: str) -> bool:
        if name in self.whole:
            return True
        cpus = self.free[name].get("ncpus")
        return "ncpus" in self.checked and isinstance(cpus, float) and cpus <= 0

    def total(self, key: str) -> float:
        """The sum of ``key`` over the live vnodes (an upper bound on what fits);
        kept until the room changes."""
        cached = self._totals.get(key)
        if cached is None:
            cached = self._totals[key] = sum(
                f for f in (self.free[v.name].get(key) for v in self.live)
                if isinstance(f, float) and f > 0)
        return cached

    def hosts(self) -> List[Tuple[str, List[VnodeSpace]]]:
        grouped: Dict[str, List[VnodeSpace]] = {}
        for v in self.live:
            grouped.setdefault(v.host, []).append(v)
        return list(grouped.items())

    def place(self, job: JobRequest) -> Optional[List[str]]:
        """Put one instance of ``job``; the vnodes used (committed), or None (nothing taken)."""
        plan = self.arrange(job)
        if plan is None:
            return None
        return self.commit(job, plan)

    def commit(self, job: JobRequest, plan: List[Tuple[str, "_Need"]]) -> List[str]:
        """Take what ``plan`` (from ``arrange``, of this room or another) uses."""
        totals = self._totals
        for name, need in plan:
            free = self.free[name]
            for key, amount, _text in need:     # what the live vnodes lose, at most
                have = free.get(key)
                if key in totals and amount is not None and isinstance(have, float):
                    totals[key] -= min(amount, max(have, 0.0))
            _consume(need, free)
        names = list(dict.fromkeys(name for name, _ in plan))
        sharing = self._sharing(job, names)
        self.used.update(names)
        if sharing == "excl":
            self.whole.update(names)
        elif sharing == "exclhost":
            hosts = {self.by_name[name].host for name in names}
            self.whole.update(v.name for v in self.live if v.host in hosts)
        if sharing != "shared" or any(self._full(name) for name in names):
            self.live = [v for v in self.live if not self._full(v.name)]   # only fewer
            self.sleeping = sum(1 for v in self.live if v.asleep)
        return names

    # -- arrangements -------------------------------------------------------
    def arrange(self, job: JobRequest) -> Optional[List[Tuple[str, "_Need"]]]:
        """Where one instance of ``job`` would go, nothing taken; None if it does not fit."""
        copies = [need for c in job.chunks for need in [_needs(c, self.checked)] * c.count]
        if job.arrangement == "pack":
            for _host, members in self.hosts():
                plan = self._fill(job, copies, members, distinct=None)
                if plan is not None:
                    return plan
            return None
        distinct = {"scatter": "host", "vscatter": "vnode"}.get(job.arrangement)
        return self._fill(job, copies, self.live, distinct)

    def _fill(self, job: JobRequest, copies: List["_Need"], members: Sequence[VnodeSpace],
              distinct: Optional[str]) -> Optional[List[Tuple[str, "_Need"]]]:
        trial: Dict[str, Dict[str, Any]] = {}
        seen: set = set()
        plan: List[Tuple[str, _Need]] = []
        # Room only shrinks during one fill, so a vnode that could not take a
        # chunk cannot take a copy of it: copies resume where the last went.
        resume: Dict[_Need, int] = {}
        for need in copies:
            for i in range(resume.get(need, 0), len(members)):
                v = members[i]
                key = v.host if distinct == "host" else v.name
                if distinct and key in seen:
                    continue
                room = trial.get(v.name)
                if room is None:
                    if not self._open(job, v):
                        continue
                    room = trial[v.name] = dict(self.free[v.name])
                if _fits(need, room):
                    _consume(need, room)
                    plan.append((v.name, need))
                    seen.add(key)
                    resume[need] = i
                    break
            else:
                return None
        return plan

    def _open(self, job: JobRequest, v: VnodeSpace) -> bool:
        """May this job put a chunk on ``v`` at all (exclusivity)?"""
        if v.name in self.whole:
            return False
        sharing = _effective_sharing(job.sharing, v.sharing)
        if sharing == "excl":
            return v.name not in self.used
        if sharing == "exclhost":
            return not any(o.name in self.used for o in self.live if o.host == v.host)
        return True

    def _sharing(self, job: JobRequest, names: Iterable[str]) -> str:
        kinds = {_effective_sharing(job.sharing, self.by_name[n].sharing) for n in names}
        return "exclhost" if "exclhost" in kinds else "excl" if "excl" in kinds else "shared"


#: One chunk's checked requests: (name, amount or None, text).
_Need = Tuple[Tuple[str, Optional[float], str], ...]


def _needs(chunk: Chunk, checked: FrozenSet[str]) -> _Need:
    return tuple((name, parse_amount(value), value) for name, value in chunk.resources
                 if name in checked)


def _parsed(free: Mapping[str, Any]) -> Dict[str, Any]:
    """Numbers and sizes as floats; other values as they are."""
    out: Dict[str, Any] = {}
    for name, value in free.items():
        amount = None if isinstance(value, bool) else parse_amount(value)
        out[name] = amount if amount is not None and not _is_text(value) else value
    return out


def _effective_sharing(requested: str, vnode_sharing: str) -> str:
    """What PBS applies: ``force_*`` and ``ignore_excl`` win, ``default_*`` fill a blank."""
    vs = (vnode_sharing or "default_shared").lower()
    if vs == "force_excl":
        return "excl"
    if vs == "force_exclhost":
        return "exclhost"
    if vs in ("ignore_excl", "force_shared"):
        return "shared"
    if requested:
        return requested
    return {"default_excl": "excl", "default_exclhost": "exclhost"}.get(vs, "shared")


def _fits(need: _Need, free: Mapping[str, Any]) -> bool:
    for name, amount, text in need:
        have = free.get(name)
        if amount is not None and not isinstance(have, str):
            if not isinstance(have, float) or have < amount:
                return False
        elif not _matches(have, text):
            return False
    return True


def _consume(need: _Need, free: Dict[str, Any]) -> None:
    for name, amount, _text in need:
        have = free.get(name)
        if amount is not None and isinstance(have, float):
            free[name] = have - amount


def _is_text(value: Any) -> bool:
    """A string resource value (``arch=linux``), not a number or size."""
    return isinstance(value, str) and parse_amount(value) is None


def _matches(have: Any, wanted: str) -> bool:
    """A string, string_array or boolean request against the vnode's value."""
    if have is None:
        return wanted.strip().lower() in ("false", "f", "0", "n", "no")
    bools = {"true": True, "t": True, "1": True, "y": True, "yes": True,
             "false": False, "f": False, "0": False, "n": False, "no": False}
    if isinstance(have, bool) or str(have).lower() in ("true", "false"):
        return bools.get(wanted.strip().lower()) == bools.get(str(have).lower(), bool(have))
    return wanted in [item.strip() for item in str(have).split(",")]


__all__ = ["Chunk", "JobRequest", "VnodeSpace", "JobFit", "Room", "SelectError", "parse_select",
           "parse_place", "parse_amount", "count_indices", "fit_jobs", "DEFAULT_CHECKED"]
