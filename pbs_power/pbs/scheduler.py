"""What the PBS scheduler works from, read inside a hook, and how to start its cycle.

Facts from a real OpenPBS 23.06 (paths in openpbs/openpbs):

* Vnode resources: ``resources_available``/``resources_assigned`` list only
  what is set (``keys()``); reading a resource the server does not define
  raises AttributeError; sizes are ``pbs.size`` (``str()`` gives ``8gb``).
* The scheduler compares only sched_config's ``resources:`` line
  (``PBS_HOME/sched_priv/sched_config``), jobs are taken by queue priority
  and then submission order (``by_queue``, no ``job_sort_key`` by default).
* A server periodic hook runs in a fork()ed child (src/server/hook_func.c
  ``run_periodic_hook``): ``pbs.server().scheduler_restart_cycle()`` there
  sets a flag the server never reads, and the hook's vnode changes reach
  the server only after the hook has exited. ``qmgr -c "set server
  scheduling = True"`` starts a cycle at once (src/server/sched_func.c
  ``poke_scheduler``), so it is sent a few seconds after the hook ends, by
  a detached process, and only while scheduling is on.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any, Dict, FrozenSet, List, Mapping, Optional

from pbs_power.states.model import MOM_GONE_STATES, UNAVAILABLE_STATES
from .demand import checked_resources, vnode_space
from .log import LogFn
from .placement import VnodeSpace

#: Seconds the detached poke waits: the server applies the hook's vnode changes after it exits.
POKE_DELAY = 5.0
POKE_MODULE = "pbs_power.pbs.poke"


def resource_values(resources: Any) -> Dict[str, Any]:
    """A ``pbs_resource`` as a plain dict of what is set (numbers stay numbers)."""
    out: Dict[str, Any] = {}
    try:
        names = list(resources.keys())
    except Exception:  # not a pbs_resource (or PBS refuses): nothing known
        return out
    for name in names:
        try:
            value = resources[name]
        except Exception:
            continue
        if value is None:
            continue
        out[str(name)] = value if isinstance(value, (int, float)) and \
            not isinstance(value, bool) else str(value)
    return out


def vnode_spaces(pbs, vnode_list: Mapping[str, Any], state_names, host_of) -> List[VnodeSpace]:
    """Room on every vnode that is up or asleep (offline, down ... are left out), in list order.

    A vnode asleep is also ``down`` once its host is off: pbs_server marks a
    MoM it cannot reach down, sleep mark or not (``down,sleep`` on OpenPBS
    23.06 once its MoM was killed; ``state-unknown,down`` after a server
    restart, until the MoM registers), so those count against it only when
    it is awake.
    """
    spaces = []
    for name, v in vnode_list.items():
        states = state_names(pbs, v.state)
        if "sleep" in states:
            if (states - MOM_GONE_STATES) & UNAVAILABLE_STATES:
                continue
        elif states & UNAVAILABLE_STATES:
            continue
        spaces.append(vnode_space(
            str(name), host_of(v, name), "sleep" in states,
            resource_values(v.resources_available), resource_values(v.resources_assigned),
            bool(v.jobs), _attr(v, "sharing")))
    return spaces


def queue_priorities(pbs) -> Dict[str, int]:
    """Queue name -> priority (unset reads as 0, as the scheduler counts it)."""
    out: Dict[str, int] = {}
    try:
        queues = list(pbs.server().queues())
    except Exception:
        return out
    for queue in queues:
        try:
            out[str(queue.name)] = int(queue.priority or 0)
        except Exception:  # unset priority raises AttributeError in real PBS
            out[str(getattr(queue, "name", ""))] = 0
    return out


def sched_checked(pbs_home: Optional[str]) -> FrozenSet[str]:
    """The scheduler's checked resources from its sched_config (the default if unreadable)."""
    text = None
    if pbs_home:
        try:
            with open(os.path.join(pbs_home, "sched_priv", "sched_config"),
                      encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            text = None
    return checked_resources(text)


def start_cycle_soon(pbs, pbs_exec: str, python_path: List[str], log: LogFn,
                     delay: float = POKE_DELAY) -> bool:
    """Have the scheduler run a cycle once this hook's changes are in; True if sent.

    Calls ``scheduler_restart_cycle()`` (enough where a hook runs inside the
    server) and starts the detached poke (see the module docstring). Nothing
    is sent while the server's ``scheduling`` is off: an admin stopped it.
    """
    server = pbs.server()
    try:
        server.scheduler_restart_cycle()
    except Exception as exc:  # not available in every event
        log("debug", "scheduler_restart_cycle(): %s" % exc)
    try:
        scheduling = server.scheduling
    except Exception:
        scheduling = None
    if scheduling is not None and not bool(int(scheduling)):
        log("info", "server scheduling is off: no scheduling cycle requested")
        return False
    qmgr = os.path.join(pbs_exec, "bin", "qmgr")
    env = {"PATH": "/bin:/usr/bin", "PYTHONPATH": os.pathsep.join(python_path)}
    for key in ("PBS_CONF_FILE",):
        if os.environ.get(key):
            env[key] = os.environ[key]
    try:
        subprocess.Popen([sys.executable, "-m", POKE_MODULE, "%g" % delay, qmgr],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, env=env,
                         close_fds=True)
    except OSError as exc:
        log("warning", "cannot start the scheduling-cycle request: %s" % exc)
        return False
    return True


def _attr(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name)
    except Exception:
        return None


def host_name(v: Any, name: str) -> str:
    """A vnode's host: ``resources_available.host``, else its name less ``[N]``."""
    try:
        host = v.resources_available["host"]
    except Exception:
        host = None
    return str(host) if host else re.sub(r"\[.*\]$", "", str(name))
