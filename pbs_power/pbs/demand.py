"""What queued PBS jobs need: qstat's jobs and the vnodes' room in, `QueuedJob`s out.

Two sources: the forecast (``forecast.forecast_starts``) gives, in the
scheduler's job order, the jobs that start now on free and sleeping vnodes
and the top blocked job's start once running jobs' walltimes run out, with
the vnodes each takes; PBS's own estimate
(``estimated.start_time``/``exec_vnode``, given only with strict_ordering or
backfill) wins when it names sleeping vnodes (only with the server's
``power_provisioning`` on does the scheduler count them). An estimate
that puts a job on sleeping vnodes within the scheduler's provisioning
window (it calendars a sleeping vnode at now + 600 s, recomputed every
cycle: src/scheduler/simulate.cpp, config.h PROVISION_DURATION) means the
job waits only for them: it is needed now.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..states.model import QueuedJob
from .forecast import Release, Start, forecast_starts
from .placement import (DEFAULT_CHECKED, JobRequest, SelectError, VnodeSpace, count_indices,
                        parse_amount, parse_place, parse_select)

#: Seconds after "now" at which the scheduler calendars a sleeping vnode up.
PROVISION_WINDOW = 600.0
#: Queued jobs looked at per cycle (in scheduler order); later ones wait for the next cycles.
MAX_JOBS = 5000
#: A vnode's ``sharing`` as hooks see it (an int) -> its name (src/include/libutil.h,
#: enum vnode_sharing: VNS_UNSET, DFLT_SHARED, DFLT_EXCL, IGNORE_EXCL, FORCE_EXCL,
#: DFLT_EXCLHOST, FORCE_EXCLHOST, FORCE_SHARED).
SHARING_NAMES = {0: "default_shared", 1: "default_shared", 2: "default_excl",
                 3: "ignore_excl", 4: "force_excl", 5: "default_exclhost",
                 6: "force_exclhost", 7: "force_shared"}
_RESOURCES_LINE = re.compile(r'^\s*resources\s*:\s*"([^"]*)"', re.MULTILINE)

LogFn = Callable[[str, str], None]
ParseTime = Callable[[Any], Optional[float]]
ParseVnodes = Callable[[str], Tuple[str, ...]]


def checked_resources(sched_config_text: Optional[str]) -> FrozenSet[str]:
    """The scheduler's ``resources:`` line (last one wins), else the shipped default."""
    found = _RESOURCES_LINE.findall(sched_config_text or "")
    if not found:
        return DEFAULT_CHECKED
    return frozenset(name.strip() for name in found[-1].split(",") if name.strip())


def waiting(attrs: Mapping[str, Any]) -> int:
    """How many instances of a qstat job wait to run: 1 queued, an array's queued subjobs."""
    state = attrs.get("job_state")
    if str(attrs.get("array", "")).lower() == "true":
        return count_indices(attrs.get("array_indices_remaining")) if state in ("Q", "B") else 0
    return 1 if state == "Q" else 0


def job_request(job_id: str, attrs: Mapping[str, Any]) -> JobRequest:
    """A `JobRequest` from qstat's attributes; SelectError if select/place are unreadable."""
    res = attrs.get("Resource_List") or {}
    select = attrs.get("schedselect") or res.get("select")
    if not select:
        parts = ["%s=%s" % (name, res[name]) for name in ("ncpus", "mem") if name in res]
        select = "1:" + ":".join(parts) if parts else "1:ncpus=1"
    arrangement, sharing = parse_place(res.get("place"))
    return JobRequest(str(job_id), parse_select(str(select)), arrangement, sharing,
                      waiting(attrs), parse_duration(res.get("walltime")))


def parse_duration(value: Any) -> Optional[float]:
    """A walltime (``[[HH:]MM:]SS``, or seconds) in seconds; None if unset or unreadable."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    total = 0.0
    parts = str(value).strip().split(":")
    if len(parts) > 3:
        return None
    for part in parts:
        try:
            total = total * 60 + float(part)
        except ValueError:
            return None
    return total


def exec_amounts(text: str) -> Tuple[Tuple[str, Tuple[Tuple[str, float], ...]], ...]:
    """``(n1:ncpus=2:mem=1gb)+(n2:ncpus=2)`` -> each vnode once, with the amounts it holds."""
    out: Dict[str, Dict[str, float]] = {}
    for piece in str(text or "").replace("(", "+").replace(")", "+").split("+"):
        fields = piece.strip().split(":")
        if not fields[0]:
            continue
        held = out.setdefault(fields[0], {})
        for item in fields[1:]:
            name, _eq, value = item.partition("=")
            amount = parse_amount(value)
            if amount is not None:
                held[name] = held.get(name, 0.0) + amount
    return tuple((name, tuple(held.items())) for name, held in out.items())


def running_releases(doc: Mapping[str, Any], now: float, parse_time: ParseTime,
                     host_of: Mapping[str, str]) -> Tuple[Release, ...]:
    """When each running job's walltime runs out and what it frees (now for a job
    past it or exiting), in that order; jobs without a walltime or start free nothing."""
    timed = []
    seen: set = set()                         # vnodes a later-ending job still holds
    for jid, attrs in (doc.get("Jobs") or {}).items():
        if not isinstance(attrs, dict) or attrs.get("job_state") not in ("R", "E"):
            continue
        wall = parse_duration((attrs.get("Resource_List") or {}).get("walltime"))
        started = parse_time(attrs.get("stime"))
        held = exec_amounts(str(attrs.get("exec_vnode") or ""))
        if attrs.get("job_state") == "E":
            end = now
        elif wall is None or started is None:
            seen.update(name for name, _ in held)      # held for as long as we can tell
            continue
        else:
            end = max(now, started + wall)
        if held:
            timed.append((end, str(jid), held))
    timed.sort(key=lambda item: item[0])
    out = []
    for end, jid, held in reversed(timed):
        freed = tuple((name, host_of.get(name) or re.sub(r"\[.*\]$", "", name), amounts,
                       name not in seen) for name, amounts in held)
        seen.update(name for name, _ in held)
        out.append(Release(end, jid, freed))
    return tuple(reversed(out))


def waking_first(spaces: Sequence[VnodeSpace], waking: Iterable[str],
                 boot_seconds: Optional[Mapping[str, float]] = None) -> List[VnodeSpace]:
    """Sleeping vnodes whose host is already being woken go before the others,
    so the forecast counts on them before it asks for more wakes; with
    ``boot_seconds`` (host -> its measured boot), the other sleeping ones go
    fastest boot first, so a job woken for waits for the quickest hosts.
    A host never measured counts as the median measured one (`typical_boot`)."""
    up = set(waking)
    first = [s for s in spaces if not s.asleep or s.host in up]
    rest = [s for s in spaces if s.asleep and s.host not in up]
    if boot_seconds and len(rest) > 1:
        get, typical = boot_seconds.get, typical_boot(boot_seconds)
        rest.sort(key=lambda s: get(s.host, typical))        # stable: ties keep their order
    return first + rest


def typical_boot(boot_seconds: Mapping[str, float]) -> float:
    """The median (low) of the measured boots; kept on a mapping that keeps it
    (``up_seconds`` gives one), worked out otherwise."""
    typical = getattr(boot_seconds, "typical", None)
    if typical is None:
        values = sorted(boot_seconds.values())
        typical = values[(len(values) - 1) // 2]
    return typical


def scheduler_order(doc: Mapping[str, Any], queue_priority: Mapping[str, int],
                    parse_time: ParseTime) -> List[Tuple[str, Mapping[str, Any]]]:
    """Waiting jobs as the default scheduler sorts them: queue priority, then submission."""
    rows = []
    for jid, attrs in (doc.get("Jobs") or {}).items():
        if not isinstance(attrs, dict) or not waiting(attrs):
            continue
        number = re.match(r"\d+", str(jid))
        rows.append((-int(queue_priority.get(str(attrs.get("queue")), 0)),
                     parse_time(attrs.get("qtime")) or 0.0,
                     int(number.group(0)) if number else 0, str(jid), attrs))
    rows.sort(key=lambda r: r[:4])
    return [(r[3], r[4]) for r in rows[:MAX_JOBS]]


def vnode_space(name: str, host: str, asleep: bool, available: Mapping[str, Any],
                assigned: Mapping[str, Any], occupied: bool, sharing: Any) -> VnodeSpace:
    """A vnode's room: numbers and sizes less what is assigned, other values as they are."""
    free: Dict[str, Any] = {}
    for key, value in available.items():
        have = parse_amount(value)
        if have is None or (isinstance(value, str) and not value[:1].isdigit()):
            free[key] = value
            continue
        free[key] = have - (parse_amount(assigned.get(key)) or 0.0)
    share = SHARING_NAMES.get(sharing, sharing) if isinstance(sharing, int) else sharing
    return VnodeSpace(name, host, asleep, free, occupied, str(share or "default_shared"))


def queued_demand(doc: Mapping[str, Any], spaces: Sequence[VnodeSpace], now: float,
                  cycle_interval: float, checked: FrozenSet[str],
                  queue_priority: Mapping[str, int], parse_time: ParseTime,
                  parse_vnodes: ParseVnodes, log: LogFn,
                  waking: Iterable[str] = (),
                  boot_seconds: Optional[Mapping[str, float]] = None) -> Tuple[QueuedJob, ...]:
    """Every waiting job's need.

    PBS's estimate when it names sleeping vnodes (the scheduler counted them:
    its plan is the one it will follow), else the forecast's start and
    vnodes, else the estimate as it is. ``waking``: hosts being brought up;
    ``boot_seconds``: measured boots, the fastest sleeping hosts woken first.
    """
    ordered = scheduler_order(doc, queue_priority, parse_time)
    requests, unreadable = [], []
    for jid, attrs in ordered:
        try:
            requests.append(job_request(jid, attrs))
        except SelectError as exc:
            unreadable.append("%s (%s)" % (jid, exc))
    if unreadable:
        log("warning", "not fitted (select/place unreadable): %s" % "; ".join(unreadable[:5]))
    hosts = {s.name: s.host for s in spaces}
    forecast: Dict[str, List[Start]] = {}
    for f in forecast_starts(requests, waking_first(spaces, waking, boot_seconds),
                             running_releases(doc, now, parse_time, hosts), now, checked):
        forecast.setdefault(f.job_id, []).append(f)      # an array: now, and later
    asleep = {s.name for s in spaces if s.asleep}
    out = []
    for jid, attrs in ordered:
        est = attrs.get("estimated") or {}
        vnodes = parse_vnodes(str(est.get("exec_vnode") or ""))
        start = parse_time(est.get("start_time"))
        on_sleeping = bool(asleep.intersection(vnodes))
        if jid in forecast and not on_sleeping:
            out.extend(as_queued(f) for f in forecast[jid])
            continue
        if on_sleeping and start is not None \
                and start <= now + PROVISION_WINDOW + cycle_interval:
            start = None            # waits only for the sleeping vnodes: needed now
        out.append(QueuedJob(jid, start, vnodes))
    return tuple(out)


def as_queued(start: Start) -> QueuedJob:
    """A forecast as the planner reads it (no start: needed now)."""
    return QueuedJob(start.job_id, start.start, start.vnodes)
