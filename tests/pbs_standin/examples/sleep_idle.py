"""Example periodic hook, used only by the stand-in's own tests: puts idle,
poweroff-eligible free vnodes to sleep and wakes sleeping vnodes that a
queued job is estimated to need soon.  One qstat call per cycle.
Not the product hook (that one lives in hooks/ and uses pbs_power)."""

import json
import os
import subprocess
import time

import pbs

QSTAT_TIME_FMT = "%a %b %d %H:%M:%S %Y"


def load_config():
    path = pbs.hook_config_filename
    if not path:
        return {}
    with open(path) as f:
        return json.load(f)


def needed_soon(pbs_exec, now, horizon):
    """Vnodes of queued jobs estimated to start within `horizon` seconds."""
    proc = subprocess.run([os.path.join(pbs_exec, "bin", "qstat"), "-f",
                           "-F", "json"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)
    if proc.returncode != 0:
        pbs.logmsg(pbs.LOG_WARNING, "qstat failed: %s" % proc.stderr.strip())
        return set()
    needed = set()
    for job in json.loads(proc.stdout).get("Jobs", {}).values():
        est = job.get("estimated") or {}
        if job.get("job_state") != "Q" or "exec_vnode" not in est \
                or "start_time" not in est:
            continue
        start = time.mktime(time.strptime(est["start_time"], QSTAT_TIME_FMT))
        if start - now <= horizon:
            for chunk in est["exec_vnode"].split("+"):
                needed.add(chunk.strip("()").split(":")[0])
    return needed


def main(ev):
    cfg = load_config()
    now = time.time()
    needed = needed_soon(pbs.get_pbs_conf()["PBS_EXEC"], now,
                         cfg.get("wake_horizon", 900))
    for name, vn in sorted(ev.vnode_list.items()):
        if vn.state & pbs.ND_SLEEP:
            if name in needed:
                vn.state = vn.state & ~pbs.ND_SLEEP
                vn.comment = None
                pbs.logmsg(pbs.EVENT_DEBUG, "waking %s" % name)
            continue
        if vn.state != pbs.ND_FREE or not vn.poweroff_eligible \
                or name in needed:
            continue
        idle_since = vn.last_used_time or 0
        if now - idle_since > cfg.get("node_idle_limit", 1800):
            vn.state = pbs.ND_SLEEP
            vn.comment = "sleep_idle: idle since %d" % idle_since
            pbs.logmsg(pbs.LOG_DEBUG, "sleeping %s" % name)


event = pbs.event()
try:
    main(event)
except Exception as exc:  # never crash the server: log, change nothing
    pbs.logmsg(pbs.LOG_ERROR, "sleep_idle failed: %r" % (exc,))
    event.reject("sleep_idle failed: %r" % (exc,))
event.accept()
