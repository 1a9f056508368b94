"""PBS adapter: a server periodic hook's event in, vnode states out.

Only this module knows PBS's objects. It is handed the ``pbs`` module (the
one PBS builds into its hook interpreter), so importing it never needs PBS.
Queued jobs' estimates come from ONE ``qstat -f -F json`` per cycle; the
same answer names every live job, so resource groups of jobs that are gone
(a missed jobobit) are deleted (``pbs_jobs.cleanup_leaked``).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import replace
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Tuple

from pbs_power.states.model import QueuedJob, Reservation, Snapshot, Vnode
from .attributes import parse_exec_vnode, parse_qstat_time
from .log import LogFn, pbs_logger

#: The name `pbs-power pbs install` registers the periodic hook under (OpenPBS
#: keeps names starting with PBS for its own hooks).
HOOK_NAME = "pbs_power"
QSTAT_TIMEOUT = 60.0

#: pbs.ND_* constant -> the state name pbsnodes prints.
STATE_BITS = (
    ("ND_OFFLINE", "offline"), ("ND_DOWN", "down"), ("ND_DELETED", "deleted"),
    ("ND_UNRESOLVABLE", "unresolvable"), ("ND_JOBBUSY", "job-busy"),
    ("ND_STALE", "stale"), ("ND_JOB_EXCLUSIVE", "job-exclusive"), ("ND_BUSY", "busy"),
    ("ND_STATE_UNKNOWN", "state-unknown"), ("ND_INIT", "initializing"),
    ("ND_PROV", "provisioning"), ("ND_WAIT_PROV", "wait-provisioning"),
    ("ND_RESV_EXCLUSIVE", "resv-exclusive"), ("ND_OFFLINE_BY_MOM", "offline"),
    ("ND_MARKEDDOWN", "down"), ("ND_MAINTENANCE", "maintenance"), ("ND_SLEEP", "sleep"),
)


class QueryError(RuntimeError):
    """The queued jobs could not be read; the message says why."""


# -- PBS objects -> plain data ----------------------------------------------
def state_names(pbs, bits: int) -> FrozenSet[str]:
    """PBS state names for a vnode's ``state`` bitmask (``free`` when none)."""
    bits = int(bits or 0)
    names = {name for const, name in STATE_BITS
             if getattr(pbs, const, 0) and bits & getattr(pbs, const)}
    return frozenset(names or {"free"})


def vnodes_from(pbs, vnode_list: Dict[str, Any]) -> Tuple[Vnode, ...]:
    """Plain `Vnode`s from ``pbs.event().vnode_list``.

    An empty vnode with ``ncpus`` 0 (a multi-vnode MoM's natural vnode) can
    take no work: it is left out, so it never counts as a spare host for
    ``min_idle_nodes`` (its host's marks still reach it).
    """
    out = []
    for name, v in vnode_list.items():
        if _resource(v, "ncpus") == "0" and not v.jobs:
            continue
        host = _resource(v, "host") or re.sub(r"\[.*\]$", "", name)
        out.append(Vnode(
            name=name, host=str(host), states=state_names(pbs, v.state),
            poweroff_eligible=power_managed(v),
            last_used_time=_epoch(v.last_used_time),
            last_state_change_time=_epoch(v.last_state_change_time),
            jobs=_id_list(v.jobs), resvs=_id_list(v.resv)))
    return tuple(out)


def power_managed(vnode) -> bool:
    """Eligible for power-down: ``poweroff_eligible`` set and ``power_mgmt`` not false.

    ``poweroff_eligible`` is PBS's own attribute (unset counts as false, as in
    PBS); ``power_mgmt`` is an optional custom boolean resource
    (``resources_available.power_mgmt``) that lets admins exclude a node
    from power management without touching PBS's attribute.
    """
    if not bool(vnode.poweroff_eligible):
        return False
    flag = _resource(vnode, "power_mgmt")
    return flag is None or flag.strip().lower() not in ("false", "0", "no", "f", "n")


def reservations_from(resv_list: Dict[str, Any]) -> Tuple[Reservation, ...]:
    """Reservations that hold vnodes, from ``pbs.event().resv_list``."""
    out = []
    for rid, r in resv_list.items():
        vnodes = parse_exec_vnode(str(r.resv_nodes or ""))
        start, end = _epoch(r.reserve_start), _epoch(r.reserve_end)
        if vnodes and start is not None and end is not None:
            out.append(Reservation(str(rid), start, end, vnodes))
    return tuple(out)


def queued_jobs_from(doc: Dict[str, Any]) -> Tuple[QueuedJob, ...]:
    """Queued jobs and their estimates from ``qstat -f -F json`` output."""
    jobs = []
    for jid, attrs in (doc.get("Jobs") or {}).items():
        if attrs.get("job_state") != "Q":
            continue
        est = attrs.get("estimated") or {}
        jobs.append(QueuedJob(str(jid), parse_qstat_time(est.get("start_time")),
                              parse_exec_vnode(str(est.get("exec_vnode") or ""))))
    return tuple(jobs)


def query_queued_jobs(pbs_exec: str, timeout: float = QSTAT_TIMEOUT) -> Tuple[QueuedJob, ...]:
    """Run ``qstat -f -F json`` once and return the queued jobs."""
    return queued_jobs_from(query_jobs_json(pbs_exec, timeout))


def query_jobs_json(pbs_exec: str, timeout: float = QSTAT_TIMEOUT) -> Dict[str, Any]:
    """Run ``qstat -f -F json`` once and return its document; QueryError says why not."""
    qstat = os.path.join(pbs_exec, "bin", "qstat")
    try:
        proc = subprocess.run([qstat, "-f", "-F", "json"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise QueryError("cannot run %s: %s" % (qstat, exc))
    if proc.returncode != 0:
        raise QueryError("%s exited %d: %s" % (qstat, proc.returncode,
                                               proc.stderr.decode(errors="replace").strip()))
    try:
        doc = json.loads(proc.stdout.decode(errors="replace"), strict=False)
    except ValueError as exc:
        raise QueryError("%s printed invalid JSON: %s" % (qstat, exc))
    if not isinstance(doc, dict):
        raise QueryError("%s printed JSON that is not an object" % qstat)
    return doc


def live_job_ids_from(doc: Dict[str, Any]) -> FrozenSet[str]:
    """Every job qstat lists (queued, held, running, exiting ...; arrays as ``N[]``)."""
    return frozenset(str(jid) for jid in (doc.get("Jobs") or {}))


# -- plain data -> PBS objects ----------------------------------------------
def apply_marks(pbs, vnode_list: Dict[str, Any], marks: Iterable, log: LogFn) -> List[str]:
    """Set or clear sleep / offline and comments on every vnode of each marked host.

    Returns the hosts whose vnode states change. The server keeps a hook-set state as ``(old & ~(DOWN|OFFLINE|SLEEP)) |
    value`` and accepts only those bits, so the value is built from the
    offline/down bits to keep plus the one being set.
    """
    by_host: Dict[str, List[Any]] = {}
    for name, v in vnode_list.items():
        by_host.setdefault(str(_resource(v, "host") or re.sub(r"\[.*\]$", "", name)),
                           []).append(v)
    keep = pbs.ND_OFFLINE | pbs.ND_DOWN | getattr(pbs, "ND_OFFLINE_BY_MOM", 0)
    owned = keep | pbs.ND_SLEEP
    changed: Dict[str, None] = {}
    for mark in marks:
        for v in by_host.get(mark.host, ()):
            bits = int(v.state or 0) & keep
            if mark.sleep is True and not mark.offline:
                bits |= pbs.ND_SLEEP
            if mark.offline:
                bits |= pbs.ND_OFFLINE
            if bits != int(v.state or 0) & owned:
                changed[mark.host] = None
            v.state = bits
            if mark.comment:
                v.comment = mark.comment
        if mark.host not in by_host:
            log("warning", "%s: not in this event's vnode list; mark not applied" % mark.host)
    return list(changed)


# -- the hook body ----------------------------------------------------------
def run_periodic(pbs, config_file: Optional[str]) -> None:
    """Everything the PBS_power server periodic hook does, in one call.

    Marks reach the vnodes only at the very end, so an error anywhere
    before leaves every node as it was.
    """
    from pbs_power.config.hook_config import ConfigError, load_config
    from pbs_power.states.cycle import Cycle, boot_times, up_seconds
    from pbs_power.devices import get_backend
    from pbs_power.states.store import Store

    log = pbs_logger(pbs)
    if not config_file:
        log("error", "no hook config (PBS_HOOK_CONFIG_FILE unset); import one with "
                     "qmgr -c 'import hook %s application/x-config default FILE'" % HOOK_NAME)
        return
    try:
        config = load_config(config_file)
    except ConfigError as exc:
        log("error", "hook config rejected, nothing done: %s" % str(exc).replace("\n", "; "))
        return
    log = pbs_logger(pbs, config.log_level)
    for warning in config.warnings:
        log("warning", warning)
    event = pbs.event()
    now = time.time()
    began = time.monotonic()
    conf = _pbs_conf(pbs)
    live = None  # job ids for the leaked-group cleanup; None = unknown, no cleanup
    vnodes = vnodes_from(pbs, event.vnode_list)
    query_failed = False
    with Store.open(config.state_dir) as store, \
            get_backend(config.power_backend, config.state_dir) as backend:
        waking = [t.host for t in store.transitions() if not t.kind.is_down]
        measured = boot_times(store)
        try:
            doc = query_jobs_json(conf["PBS_EXEC"])
            jobs, live = demand_from(pbs, event.vnode_list, doc, config, conf, now, log,
                                     waking, up_seconds(measured, config)), \
                live_job_ids_from(doc)
        except (QueryError, KeyError) as exc:
            log("error", "queued jobs unknown (%s); no host is taken down this cycle" % exc)
            jobs, query_failed = (), True
            config = replace(config, power_on_off_enable=False, power_ramp_rate_enable=False)
        snapshot = Snapshot(vnodes, queued_jobs=jobs,
                            reservations=reservations_from(event.resv_list))
        report = Cycle(config, store, backend, log, check_down_hosts=True).run(
            snapshot, now, query_failed, measured)
    changed = apply_marks(pbs, event.vnode_list, report.marks, log)
    # A woken host's MoM registering clears its marks but starts no scheduling
    # cycle (seen on OpenPBS 23.06): ask for one when a boot is done too.
    up = [o.transition.host for o in report.completed if not o.transition.kind.is_down]
    if (changed or up) and "PBS_EXEC" in conf:
        from .scheduler import start_cycle_soon
        if start_cycle_soon(pbs, conf["PBS_EXEC"], list(config.python_path), log):
            log("info", "%s: scheduling cycle requested" % "; ".join(
                "%s (%s)" % (what, ", ".join(names[:10]) + (" ..." if len(names) > 10 else ""))
                for what, names in (("vnode marks changed", changed), ("hosts up", up))
                if names))
    if live is not None:
        from .jobs import cleanup_after_qstat
        cleanup_after_qstat(config, live, now, log)
    warn_if_slow(log, time.monotonic() - began, config.cycle_interval)


def warn_if_slow(log: LogFn, seconds: float, cycle_interval: float) -> None:
    """Say so when a run takes over half of ``cycle_interval``: the next run may
    find this one still going (it then does nothing) and wakes come late."""
    if seconds > cycle_interval / 2.0:
        log("warning", "this run took %.1fs, over half of cycle_interval=%ds: raise "
                       "cycle_interval and the hook's freq together (qmgr -c 'set hook %s "
                       "freq = N')" % (seconds, cycle_interval, HOOK_NAME))


def demand_from(pbs, vnode_list: Dict[str, Any], doc: Dict[str, Any], config,
                conf: Dict[str, str], now: float, log: LogFn,
                waking: Iterable[str] = (),
                boot_seconds: Optional[Mapping[str, float]] = None) -> Tuple[QueuedJob, ...]:
    """Queued jobs' needs: the forecast onto free, sleeping and freed vnodes, else
    PBS's estimates; ``waking``: hosts being brought up (counted on first), then
    the sleeping hosts that boot fastest by ``boot_seconds`` (measured)."""
    from .demand import queued_demand
    from .scheduler import host_name, queue_priorities, sched_checked, vnode_spaces
    spaces = vnode_spaces(pbs, vnode_list, state_names, host_name)
    return queued_demand(doc, spaces, now, config.cycle_interval,
                         sched_checked(conf.get("PBS_HOME")), queue_priorities(pbs),
                         parse_qstat_time, parse_exec_vnode, log, waking, boot_seconds)


def _pbs_conf(pbs) -> Dict[str, str]:
    try:
        return dict(pbs.get_pbs_conf())
    except Exception:
        return {}


# -- small helpers ----------------------------------------------------------
def _resource(vnode, name: str) -> Optional[str]:
    try:
        value = vnode.resources_available[name]
    except (KeyError, TypeError, AttributeError):
        return None
    return None if value is None else str(value)


def _epoch(value: Any) -> Optional[float]:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def _id_list(value: Any) -> Tuple[str, ...]:
    """``"1.svr/0, 1.svr/1, 2.svr/0"`` -> ``("1.svr", "2.svr")``."""
    if not value:
        return ()
    ids: Dict[str, None] = {}
    for item in str(value).split(","):
        item = item.strip().split("/")[0]
        if item:
            ids.setdefault(item, None)
    return tuple(ids)
