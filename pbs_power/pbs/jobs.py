"""PBS job hooks: each job's resource group from runjob to jobobit, and provisioning.

``runjob`` (in pbs_server, before the job goes to its MoMs) creates group
``rg_<jobid>`` (external id: the job id's leading integer; array subjob
``123[4].svr`` gets ``rg_123_4_.svr``, brackets being invalid in group
names), adds the job's hosts and activates it with the job's policy: its
``power_policy`` resource, else its ``eoe`` through ``eoe_policies`` (or as
is if it names a policy), else its queue's default, else the topology's. A
failed activation rejects the run request (the job stays queued; the
scheduler's comment quotes our reason) unless ``fail_open``.

``jobobit`` (in pbs_server, when the job ends or is requeued) deletes the
group, restoring topology policies. Not ``execjob_end``: that runs on the
mother superior's MoM, which cannot reach the state database in
``state_dir`` on the server host without shared storage; jobobit runs in
pbs_server, on that host. Groups whose jobobit was missed (server down) are
deleted by the periodic hook (``cleanup_leaked``).

``provision`` (a child of pbs_server) handles an aoe named in
``eoe_policies``: wakes the vnode's host if the power backend has it asleep
or off, applies the mapped policy (``apply_host_policy``) and exits 1,
PBS's "application provisioning succeeded, no reboot" (``APP_PROV_SUCCESS``,
``svr_func.c``; 0 makes PBS wait for the MoM to return from a reboot). PBS
runs ONE provisioning hook (``find_hookbyevent``), so another aoe is
accepted without acting, also with 1; a site's own provisioning hook can
call ``on_provision`` first instead (None: not ours).
"""
from __future__ import annotations

import contextlib
import re
import time
from dataclasses import replace
from typing import Any, Iterable, List, Optional, Sequence, Tuple

from pbs_power.groups.jobs import (  # noqa: F401  (the job hooks' names, used by tests)
    GROUP_PREFIX, LogFn, Outcome, end_job_group, external_id, group_name, open_service,
    start_job_group,
)
from .attributes import parse_exec_vnode
from .log import pbs_logger

#: Exit status PBS treats as "application provisioning succeeded, no reboot".
APP_PROV_SUCCESS = 1
WAKE_POLL_SECONDS = 2.0
#: Most seconds one device request may take in runjob (inside pbs_server): a dead BMC
#: fails the activation (fallback, strict or fail_open as configured) instead of
#: stalling the server for the default 30 s, or past the hook's 60 s alarm.
RUNJOB_DEVICE_TIMEOUT_S = 5.0
#: Least seconds a job refused at runjob waits before the scheduler may try it again.
RETRY_FLOOR_S = 60
SUBJOB_REFUSAL = ("array subjob started without its policy (refusing a subjob makes the "
                  "scheduler retry its array in a tight loop)")
_SUBJOB_KEY = re.compile(r"(\d+)_\d+_$")
_EOE_IN_SELECT = re.compile(r"(?:^|:)eoe=([^:+]+)")


# -- names and choices (pure) ---------------------------------------------------
def _short(name: str) -> str:
    """A group or job key without prefix and server: ``rg_12_3_.svr`` -> ``12_3_``."""
    name = name[len(GROUP_PREFIX):] if name.startswith(GROUP_PREFIX) else name
    return name.replace("[", "_").replace("]", "_").split(".", 1)[0]


def choose_policy(power_policy: Optional[str], eoe: Optional[str], queue: Optional[str],
                  job_policies, known: Iterable[str]) -> Tuple[Optional[str], str]:
    """(policy name or None, why) in the documented order; None = topology default."""
    if power_policy:
        return power_policy, "%s requested by Resource_List.power_policy" % power_policy
    notes = []
    if eoe:
        if eoe in job_policies.eoe_policies:
            return job_policies.eoe_policies[eoe], "eoe %s mapped by eoe_policies" % eoe
        if eoe in set(known):
            return eoe, "eoe %s names a topology policy" % eoe
        notes.append("eoe %s is neither in eoe_policies nor a policy" % eoe)
    if queue and queue in job_policies.queue_defaults:
        notes.append("queue %s default" % queue)
        return job_policies.queue_defaults[queue], "; ".join(notes)
    notes.append("no policy requested: topology default")
    return None, "; ".join(notes)


# -- reading PBS objects --------------------------------------------------------
def _resource(resources: Any, name: str) -> Optional[str]:
    try:
        value = resources[name]
    except Exception:  # an undefined custom resource may raise in real PBS
        return None
    return None if value is None or str(value) == "" else str(value)


def requested_eoe(job: Any) -> Optional[str]:
    """The job's eoe: ``Resource_List.eoe``, else the first ``eoe=`` of its select."""
    texts = (_resource(job.Resource_List, "select"), getattr(job, "schedselect", None))
    found = [m.group(1) for m in (_EOE_IN_SELECT.search(str(t or "")) for t in texts) if m]
    return _resource(job.Resource_List, "eoe") or (found[0] if found else None)


def vnode_host(pbs, vnode: str) -> str:
    """The host of a vnode (``resources_available.host``), else its name less ``[N]``."""
    try:
        host = pbs.server().vnode(vnode).resources_available["host"]
    except Exception:
        host = None
    return str(host) if host else re.sub(r"\[.*\]$", "", vnode)


def job_hosts(pbs, exec_vnode: Any) -> List[str]:
    """The distinct hosts of an exec_vnode string, in order."""
    vnodes = parse_exec_vnode(str(exec_vnode or ""))
    return list(dict.fromkeys(vnode_host(pbs, v) for v in vnodes))


# -- shared setup -----------------------------------------------------------------
def _setup(pbs, config_file: Optional[str]):
    """(config, log) for a hook run; config is None when unusable (logged)."""
    from pbs_power.config.hook_config import ConfigError, load_config
    log = pbs_logger(pbs)
    if not config_file:
        log("error", "no hook config (PBS_HOOK_CONFIG_FILE unset); nothing done")
        return None, log
    try:
        config = load_config(config_file)
    except ConfigError as exc:
        log("error", "hook config rejected, nothing done: %s" % str(exc).replace("\n", "; "))
        return None, log
    return config, pbs_logger(pbs, config.log_level)


@contextlib.contextmanager
def _hook_service(pbs, config_file: Optional[str], device_cap: Optional[float] = None):
    """(config, log, service) for one hook run; service is None when nothing can be done.

    ``device_cap`` bounds each device request (seconds) below the configured
    ``timeout_seconds``: runjob runs inside pbs_server, which answers nobody
    while it waits, and the hook's alarm (60 s) must not fire.
    """
    config, log = _setup(pbs, config_file)
    if config is not None and device_cap is not None:
        config = with_device_cap(config, device_cap)
    service = open_service(config, log) if config is not None else None
    try:
        yield config, log, service
    finally:
        if service is not None:
            service.close()


def with_device_cap(config, cap: float):
    """``config`` whose device requests time out after at most ``cap`` seconds."""
    options = dict(config.job_policies.device_options)
    given = options.get("timeout_seconds")
    options["timeout_seconds"] = min(float(given), cap) if given is not None else cap
    return replace(config, job_policies=replace(config.job_policies, device_options=options))


# -- runjob -----------------------------------------------------------------------
def on_runjob(pbs, config_file: Optional[str]) -> Outcome:
    """Give the starting job its resource group; see the module docstring.

    A refusal sets the job's ``Execution_Time`` one cycle ahead (runjob may
    set it when rejecting): the job waits (state W) and is tried again then.
    An array subjob is never refused: the scheduler retries a refused
    subjob's array at once, in a tight loop, and one in state W loops it
    for good (both seen on OpenPBS 23.06); it starts without its policy.
    """
    with _hook_service(pbs, config_file, RUNJOB_DEVICE_TIMEOUT_S) as (config, log, service):
        if service is None:
            return Outcome(True)
        job = pbs.event().job
        outcome = _start(pbs, service, job, config.job_policies, log)
        if not outcome.accept and "[" in str(job.id):
            return Outcome(True)        # said by _start: SUBJOB_REFUSAL
        if not outcome.accept:
            retry = time.time() + max(RETRY_FLOOR_S, config.cycle_interval)
            job.Execution_Time = int(retry)
            _job_log(pbs, str(job.id), log)("info", "held until %s, then tried again"
                                            % time.strftime("%H:%M:%S", time.localtime(retry)))
        return outcome


def _job_log(pbs, job_id: str, log: LogFn) -> LogFn:
    """Job decisions go to the job's log (tracejob); debug lines to the hook's."""
    def job_log(level: str, message: str) -> None:
        if level == "debug":
            log(level, "%s: %s" % (job_id, message))
        else:
            pbs.logjobmsg(job_id, "pbs_power: " + message)
    return job_log


def _start(pbs, service, job, job_policies, log: LogFn) -> Outcome:
    job_id = str(job.id)
    say = _job_log(pbs, job_id, log)
    topo, _active = service.topology()
    hosts = job_hosts(pbs, job.exec_vnode)
    managed = [h for h in hosts if h in topo.entities]
    skipped = [h for h in hosts if h not in topo.entities]
    if skipped:
        say("info", "hosts not in topology %s, no policy for them: %s"
            % (topo.name, ",".join(skipped)))
    if not managed:
        say("info", "no managed host in exec_vnode %r: nothing to do"
            % str(job.exec_vnode or ""))
        return Outcome(True)
    free_hosts_of_ended_jobs(pbs, service, managed, group_name(job_id), say)
    policy, why = choose_policy(_resource(job.Resource_List, "power_policy"), requested_eoe(job),
                                str(job.queue) if job.queue is not None else None,
                                job_policies, topo.policies)
    shared = shared_hosts(pbs, service, job, managed)
    own = [h for h in managed if h not in shared]
    if shared:
        say("info", "shares %s with other jobs: runs there under the host's current policy "
            "(%s)%s" % (",".join(sorted(shared)), ", ".join(
                "%s: %s" % (h, shared[h]) for h in sorted(shared)),
                "; %s applies only to hosts it holds alone" % policy if policy else ""))
    if not own:
        return Outcome(True)
    return start_job_group(service, job_id, own, policy, why, job_policies, say,
                           SUBJOB_REFUSAL if "[" in job_id else "run request rejected")


def shared_hosts(pbs, service, job, hosts: Sequence[str]) -> dict:
    """Of ``hosts``, those the job does not hold alone -> who holds them.

    A host is shared when another job's resource group has it, or when
    another job runs on one of this job's vnodes there. A shared host keeps
    the policy it has (the group that got it first, else its topology
    policy); PBS packs jobs onto hosts by default, so this is normal use,
    never a reason to refuse the job.
    """
    own = group_name(str(job.id))
    out = {h: g for h, g in service.store.member_groups(list(hosts)).items() if g != own}
    wanted = set(hosts)
    for vnode in parse_exec_vnode(str(job.exec_vnode or "")):
        try:
            running = pbs.server().vnode(vnode).jobs
        except Exception:  # cannot tell: treat as not shared
            continue
        others = {item.strip().split("/")[0] for item in str(running or "").split(",")}
        others -= {"", str(job.id)}
        host = vnode_host(pbs, vnode)
        if others and host in wanted and host not in out:
            out[host] = "topology policy, job %s runs there" % sorted(others)[0]
    return out


def free_hosts_of_ended_jobs(pbs, service, hosts: Sequence[str], own: str,
                             say: LogFn) -> List[str]:
    """Delete groups of jobs that have ended but still hold ``hosts`` (a missed jobobit).

    Without this a new job on those hosts would fail to activate until the
    periodic hook's cleanup. Only a group whose job pbs_server no longer
    knows, or knows as finished, is deleted; array subjob groups (whose
    names cannot be mapped back to a job id) are left to the periodic hook.
    """
    ended_states = {getattr(pbs, "JOB_STATE_FINISHED", 9), getattr(pbs, "JOB_STATE_EXPIRED", 6)}
    deleted = []
    for group in sorted(set(service.store.member_groups(list(hosts)).values()) - {own}):
        job_id = group[3:] if group.startswith("rg_") and "_" not in group[3:] else None
        if not job_id:
            continue
        try:
            other = pbs.server().job(job_id)
        except Exception:  # cannot tell: leave it
            continue
        state = None if other is None else getattr(other, "job_state", None)
        if other is not None and state not in ended_states:
            continue
        if service.delete(group).status.ok:
            deleted.append(group)
            say("info", "deleted %s: job %s has ended but its group still held %s"
                % (group, job_id, ",".join(sorted(hosts))))
    return deleted


# -- jobobit ----------------------------------------------------------------------
def on_jobobit(pbs, config_file: Optional[str]) -> Outcome:
    """Delete the ended job's group (topology policies return); never rejects."""
    with _hook_service(pbs, config_file) as (_config, log, service):
        if service is not None:
            job_id = str(pbs.event().job.id)
            end_job_group(service, job_id, _job_log(pbs, job_id, log))
    return Outcome(True)


# -- leaked groups ----------------------------------------------------------------
def cleanup_leaked(service, live_job_ids: Iterable[str], log: LogFn,
                   before: Optional[float] = None) -> List[str]:
    """Delete ``rg_`` groups whose job PBS no longer has; returns the deleted names.

    A group is live when its name, or its external id and job key, match a
    live job; a subjob's group is live while its array (``123[].svr``, as
    ``qstat -f`` lists arrays) is. Groups created at or after ``before``
    (when the job list was read) are spared: their job may be newer.
    """
    live = list(live_job_ids)
    names = {group_name(j) for j in live}
    keys = {(external_id(j), _short(j)) for j in live}
    arrays = {external_id(j) for j in live if "[]" in j}
    deleted = []
    for row in service.store.groups():
        key = _short(row.name)
        subjob = _SUBJOB_KEY.match(key)
        if (not row.name.startswith(GROUP_PREFIX) or row.name in names
                or (row.external_id, key) in keys
                or (subjob and int(subjob.group(1)) in arrays)
                or (before is not None and row.created is not None and row.created >= before)):
            continue
        resp = service.delete(row.name)
        if resp.status.ok:
            deleted.append(row.name)
            log("info", "%s: its job is gone (missed jobobit): deleted" % row.name)
        elif resp.status.code != "not_found":
            log("warning", "%s: its job is gone but delete failed: %s"
                % (row.name, resp.status.diag_msg))
    return deleted


def cleanup_after_qstat(config, live_job_ids: Iterable[str], before: float, log: LogFn) -> None:
    """The periodic hook's cleanup, where resource groups are set up: groups left midway by
    a killed process are repaired, groups of jobs PBS no longer has deleted; errors only
    logged."""
    try:
        service = open_service(config, log, quiet=True)
        if service is not None:
            try:
                from pbs_power.groups.collect import collect
                for done in collect(service):
                    log("warning", "%s: %s (%s)" % (done.group, done.action, done.why))
                cleanup_leaked(service, live_job_ids, log, before=before)
            finally:
                service.close()
    except Exception as exc:
        log("error", "leaked resource groups not cleaned: %s: %s" % (type(exc).__name__, exc))


# -- provision --------------------------------------------------------------------
class ProvisionError(Exception):
    """Our aoe could not be provisioned; the message says why."""


def on_provision(pbs, config_file: Optional[str]) -> Optional[Outcome]:
    """Provision an aoe of ours; None if the aoe is not ours (nothing done)."""
    config, log = _setup(pbs, config_file)
    event = pbs.event()
    vnode, aoe = str(event.vnode), str(event.aoe)
    if config is None:
        return None
    policy = config.job_policies.eoe_policies.get(aoe)
    if policy is None:
        log("info", "%s: aoe %s is not a pbs_power eoe policy; left alone (not "
                    "provisioned by pbs_power)" % (vnode, aoe))
        return None
    host = vnode_host(pbs, vnode)
    try:
        wake_host(config, host, log)
        service = open_service(config, log)
        if service is not None:
            try:
                done = apply_host_policy(service, host, policy)
            finally:
                service.close()
            log("info", "%s: aoe %s: %s" % (vnode, aoe, done))
    except ProvisionError as exc:
        reason = " ".join(("pbs_power: %s: aoe %s (policy %s) failed: %s"
                           % (vnode, aoe, policy, exc)).split())
        if config.job_policies.fail_open:
            log("error", reason + "; fail_open: accepted")
            return Outcome(True, code=APP_PROV_SUCCESS)
        log("error", reason)
        return Outcome(False, reason)
    return Outcome(True, code=APP_PROV_SUCCESS)


def wake_host(config, host: str, log: LogFn, clock=time.time, sleep=time.sleep) -> None:
    """Power the host on (off) or wake it (asleep), then wait until it is on."""
    from pbs_power.devices import BackendError, get_backend
    from pbs_power.states.model import PowerState, TransitionKind
    try:
        backend = get_backend(config.power_backend, config.state_dir)
    except BackendError as exc:
        raise ProvisionError("power backend: %s" % exc)
    with backend:
        state = backend.status([host], clock())[host].state
        kind = {PowerState.ASLEEP: TransitionKind.WAKE,
                PowerState.OFF: TransitionKind.POWER_ON}.get(state)
        if state is not PowerState.TRANSITIONING and kind is None:
            return
        if kind is not None:
            result = backend.request(kind, [host], clock())[host]
            if not result.ok:
                raise ProvisionError("%s of %s failed: %s" % (kind.value, host, result.diag))
            log("info", "%s: was %s: %s sent" % (host, state.value, kind.value))
        deadline = time.monotonic() + config.boot_timeout
        while backend.status([host], clock())[host].state is not PowerState.ON:
            if time.monotonic() >= deadline:
                raise ProvisionError("%s not on within boot_timeout=%ds"
                                     % (host, config.boot_timeout))
            sleep(WAKE_POLL_SECONDS)
        log("info", "%s: on" % host)


def apply_host_policy(service, host: str, policy_name: str) -> str:
    """Apply a policy to one host; returns what was done.

    In an active group (normally the job's, made by runjob before PBS
    provisions): an entity policy of that group, budget-checked, undone with
    the group. Otherwise a ``resource_group_update`` device request, only if
    it does not raise the host above its topology policy (no budget is held
    for more); it lasts until the host's next group or topology change.
    """
    topo, _active = service.topology()
    if policy_name not in topo.policies:
        raise ProvisionError("eoe_policies names %s, not a policy of topology %s"
                             % (policy_name, topo.name))
    if host not in topo.entities:
        return "%s is not in topology %s: no policy applied" % (host, topo.name)
    group = service.store.member_groups([host]).get(host)
    row = service.store.group(group) if group else None
    if row is not None and row.status == "active":
        resp = service.update_resources(group, {host: policy_name})
        if not resp.status.ok:
            raise ProvisionError(resp.status.diag_msg)
        return "policy %s set in resource group %s" % (policy_name, group)
    policy = topo.policies[policy_name]
    if topo.node_watts(host, policy) > topo.node_watts(host, topo.topology_policy(host)):
        raise ProvisionError("%s is in no active resource group and %s is above its topology "
                             "policy (no budget reserved)" % (host, policy_name))
    request = service._request(topo, host, "resource_group_update", {
        "resource_group": None, "gpu_policies": None,
        "policy": {"policy_action": "set", "policy": policy.to_dict()}})
    answer = service.controller.send([request])[host]
    if not answer.success:
        raise ProvisionError("device %s: %s" % (host, answer.error))
    return "policy %s set on the device (no resource group)" % policy_name
