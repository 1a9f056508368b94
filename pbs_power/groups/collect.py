"""Collecting resource groups that nothing else will end.

A group whose activation or deletion was killed midway stays "activating" or
"deactivating"; a job's group whose epilog (or jobobit) never came stays
active. Neither is touched again unless a later job needs its hosts. `collect`
repairs the first kind (topology policies restored, within the budget) and
deletes the second kind when the scheduler says the job has ended; a job whose
state cannot be read keeps its group.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional

from .execute import process_alive
from .running import ENDING

#: job id -> True (still holds its nodes), False (ended or unknown to the
#: scheduler), None (no answer: keep its group).
JobAlive = Callable[[str], Optional[bool]]
#: group name -> the job id it belongs to, or None for a group of no job.
JobOf = Callable[[str], Optional[str]]


@dataclass(frozen=True)
class Collected:
    """What `collect` did (or, with ``dry_run``, would do) with one group."""

    group: str
    action: str          # "repaired", "deleted", "kept", "failed"
    why: str


def interrupted(row) -> bool:
    """Whether ``row``'s activation or deletion was left midway by a process now gone."""
    return row.status in ENDING and not (row.owner_pid and process_alive(row.owner_pid))


def collect(service, job_of: Optional[JobOf] = None, job_alive: Optional[JobAlive] = None,
            dry_run: bool = False, created_before: Optional[float] = None) -> List[Collected]:
    """Repair interrupted groups, then delete the groups of ended jobs; one entry per group
    acted on (or kept for lack of an answer). With ``created_before`` (when a job list
    behind ``job_alive`` was read), younger groups are left alone: their job may be newer."""
    out: List[Collected] = []
    for row in service.store.groups():
        if interrupted(row):
            why = "%s by pid %s was interrupted" % (row.status, row.owner_pid)
            if not dry_run:
                service.repair(row.name)
            out.append(Collected(row.name, "repaired", why + "; topology policies restored"))
        job = job_of(row.name) if job_of is not None else None
        if job is None or job_alive is None or (
                created_before is not None and (row.created is None
                                                or row.created >= created_before)):
            continue
        alive = job_alive(job)
        if alive is None:
            out.append(Collected(row.name, "kept", "the state of job %s cannot be read" % job))
        elif alive is False:
            out.append(_delete(service, row.name, job, dry_run))
    return out


def _delete(service, name: str, job: str, dry_run: bool) -> Collected:
    why = "job %s has ended" % job
    if dry_run:
        return Collected(name, "deleted", why)
    resp = service.delete(name)
    if resp.status.ok or resp.status.code == "not_found":
        return Collected(name, "deleted", why)
    return Collected(name, "failed", "%s, but delete failed: %s" % (why, resp.status.diag_msg))
