# pbs_power job hook, registered for queuejob, modifyjob, runjob and jobobit:
# refuses an unknown power_policy at qsub/qalter (queuejob, modifyjob), gives
# each starting job its resource group and power policy (runjob) and deletes
# the group when the job ends or is requeued (jobobit), which restores
# topology policies.
#
# Install (as root on the PBS server host, pbs_power installed as for the
# periodic hook, same config file):
#   qmgr -c "create resource power_policy type=string"
#   qmgr -c "create hook pbs_power_job"
#   qmgr -c "import hook pbs_power_job application/x-python default pbs_power_job.py"
#   qmgr -c "import hook pbs_power_job application/x-config default PBS_power.json"
#   qmgr -c "set hook pbs_power_job event = 'queuejob,modifyjob,runjob,jobobit', alarm = 60"
#   qmgr -c "set hook pbs_power_job enabled = true"
#
# These events run inside pbs_server itself: sys.path changes persist, so the
# config's python_path is added only once. A rejected runjob holds the job
# until its Execution_Time (one cycle); the scheduler shows our reason in the
# job's comment. On any internal
# error this hook logs and accepts: jobs are never blocked by a pbs_power bug.
# PBS runs hooks with -OO and __name__ == "builtins": no docstring, assert or
# main guard here. All logic lives in pbs_power.pbs.jobs.
import json
import os
import sys

import pbs


def _pbs_power_config_file():
    return os.environ.get("PBS_HOOK_CONFIG_FILE") or getattr(pbs, "hook_config_filename", None)


def _pbs_power_add_python_path(config_file):
    # The config names where pbs_power is installed; add those directories
    # once (server events share one interpreter, so sys.path persists).
    if not config_file:
        return
    try:
        with open(config_file) as handle:
            doc = json.load(handle)
    except (OSError, ValueError) as exc:
        raise RuntimeError("hook config %s unreadable: %s" % (config_file, exc))
    paths = (doc.get("python_path") if isinstance(doc, dict) else None) or []
    if isinstance(paths, str):
        paths = [paths]
    for path in reversed(paths):
        if isinstance(path, str) and path not in sys.path:
            sys.path.insert(0, path)


def _pbs_power_handle(event, config_file):
    # The library's Outcome for this event, or None (accept).
    _pbs_power_add_python_path(config_file)
    from pbs_power.pbs import jobs as pbs_jobs
    if event.type in (pbs.QUEUEJOB, pbs.MODIFYJOB):
        from pbs_power.pbs import submit
        return submit.check_submission(pbs, config_file)
    if event.type == pbs.RUNJOB:
        return pbs_jobs.on_runjob(pbs, config_file)
    if event.type == getattr(pbs, "JOBOBIT", 0x800000):
        return pbs_jobs.on_jobobit(pbs, config_file)
    pbs.logmsg(pbs.LOG_WARNING, "pbs_power: event type %s not handled; accepted"
               % (event.type,))
    return None


def _pbs_power_main():
    event = pbs.event()
    outcome = None
    try:
        outcome = _pbs_power_handle(event, _pbs_power_config_file())
    except SystemExit:
        raise
    except Exception as exc:
        import traceback
        pbs.logmsg(pbs.LOG_ERROR, "pbs_power: internal error, event accepted: "
                   "%s: %s" % (type(exc).__name__, exc))
        for line in traceback.format_exc().splitlines():
            pbs.logmsg(getattr(pbs, "EVENT_DEBUG3", pbs.LOG_DEBUG), "pbs_power: " + line)
    if outcome is not None and not outcome.accept:
        event.reject(outcome.message)
    event.accept()


_pbs_power_main()
