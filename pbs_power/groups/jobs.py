"""A job's resource group, whatever the scheduler: its name, starting it, ending it.

PBS's runjob/jobobit hooks and Slurm's PrologSlurmctld/EpilogSlurmctld both
give job ``J`` the group ``rg_<J>`` (external id: J's leading integer) and
call these; what differs is only how the scheduler reports a refusal.
"""
from __future__ import annotations

import contextlib
import os
import re
from typing import Callable, NamedTuple, Optional, Sequence

GROUP_PREFIX = "rg_"
_LEADING_INT = re.compile(r"\d+")
_NOTED = set()  # reasons already logged at warning level in this interpreter

LogFn = Callable[[str, str], None]


class Outcome(NamedTuple):
    """What the hook does with its event: accept(code), or reject(message)."""

    accept: bool
    message: str = ""
    code: int = 0


def group_name(job_id: str) -> str:
    """``rg_<jobid>``; array brackets become ``_`` (``123[4].s`` -> ``rg_123_4_.s``)."""
    return GROUP_PREFIX + str(job_id).replace("[", "_").replace("]", "_")


def external_id(job_id: str) -> Optional[int]:
    """The leading integer of a job id (``123[4].svr`` -> 123), or None."""
    match = _LEADING_INT.match(str(job_id))
    return int(match.group(0)) if match else None


def _note_once(log: LogFn, key: str, message: str) -> None:
    """Warn once per interpreter (pbs_server keeps it), then only at debug level."""
    log("debug" if key in _NOTED else "warning", message)
    _NOTED.add(key)


def open_service(config, log: LogFn, quiet: bool = False):
    """The resource-group service, or None (logged unless quiet) when it is not set up.

    Never creates the state database: power management that is not set up
    must neither block nor slow down jobs.
    """
    from pbs_power.groups.service import ResourceGroupService
    from pbs_power.groups.store import DB_NAME
    note = (lambda key, msg: None) if quiet else (lambda key, msg: _note_once(log, key, msg))
    if not os.path.exists(os.path.join(config.state_dir, DB_NAME)):
        note("nodb", "no resource-group state in %s: job power policies are off until a "
                     "topology is imported and activated" % config.state_dir)
        return None
    service = ResourceGroupService(config.state_dir, config.job_policies.device_options, log=log)
    topo, active = service.topology()
    if topo is None or not active:
        service.close()
        note("notopo", "no active topology in %s: job power policies are off" % config.state_dir)
        return None
    return service


def start_job_group(service, job_id: str, hosts: Sequence[str], policy: Optional[str], why: str,
                    job_policies, say: LogFn, refusal: str = "run request rejected") -> Outcome:
    """Delete a stale ``rg_<jobid>``, then create, fill and activate it; all or nothing.

    ``refusal`` ends the log line of a refused activation: what the scheduler
    does with the job (PBS keeps it queued, Slurm requeues or cancels it).
    """
    name = group_name(job_id)
    resp = service.delete(name)
    if resp.status.ok:
        say("info", "deleted stale resource group %s (job requeued)" % name)
    try:
        if resp.status.ok or resp.status.code == "not_found":
            resp = service.create(name, external_id(job_id), policy)
        if resp.status.ok:
            resp = service.add_resources(name, list(hosts))
        if resp.status.ok:
            resp = service.activate(name, strict=job_policies.strict,
                                    allow_reprovision=job_policies.allow_reprovision)
    except Exception:
        with contextlib.suppress(Exception):
            service.delete(name)
        raise
    if resp.status.ok:
        note = resp.status.diag_msg
        say("info", "%s active on %s: %s (%s)%s" % (
            name, ",".join(hosts), _applied(service, name), why,
            "" if note.endswith("host(s) done") else "; " + note))
        return Outcome(True)
    with contextlib.suppress(Exception):
        service.delete(name)
    reason = " ".join(("job %s cannot get policy %s on %s: %s" % (
        job_id, policy or "(topology default)", ",".join(hosts), resp.status.diag_msg)).split())
    if job_policies.fail_open:
        say("warning", "%s (%s); fail_open: started without a resource group" % (reason, why))
        return Outcome(True)
    say("warning", "%s (%s); %s" % (reason, why, refusal))
    return Outcome(False, "pbs_power: " + reason)


def _applied(service, name: str) -> str:
    """``policy X`` (or ``policies a:X,b:Y``) as applied to the group's members."""
    for group in service.list().resource_groups:
        if group.group_name == name:
            applied = {p.resource_name: p.applied_policy_name or "uncapped"
                       for p in group.resource_policies}
            if len(set(applied.values())) == 1:
                return "policy %s" % next(iter(applied.values()))
            return "policies " + ",".join("%s:%s" % kv for kv in sorted(applied.items()))
    return "policy unknown"


def end_job_group(service, job_id: str, log: LogFn) -> bool:
    """Delete ``rg_<jobid>``; True if it existed and is gone."""
    name = group_name(job_id)
    resp = service.delete(name)
    if resp.status.ok:
        log("info", "job ended: %s; topology policies restored" % resp.status.diag_msg)
    elif resp.status.code == "not_found":
        log("debug", "job ended: no resource group %s" % name)
    else:
        log("warning", "job ended but %s not deleted (%s); the periodic hook retries"
            % (name, resp.status.diag_msg))
    return resp.status.ok
