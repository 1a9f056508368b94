# pbs_power provisioning hook: for an aoe named in the config's
# job_policies.eoe_policies, wakes the vnode's host if the power backend has
# it asleep or off, applies the mapped power policy, and exits 1, which PBS
# reads as "application provisioning succeeded, no reboot".
#
# Install (as root on the PBS server host, same config file as the others):
#   qmgr -c "create hook pbs_power_provision"
#   qmgr -c "import hook pbs_power_provision application/x-python default pbs_power_provision.py"
#   qmgr -c "import hook pbs_power_provision application/x-config default PBS_power.json"
#   qmgr -c "set hook pbs_power_provision event = provision, alarm = 1900"
#   qmgr -c "set hook pbs_power_provision enabled = true"
#   qmgr -c "set node n001 resources_available.aoe = 'power-low,power-high'"
#   qmgr -c "set node n001 provision_enable = true"
# The alarm is PBS's provision_timeout: keep it above the config's
# boot_timeout (default 1800 s), since a sleeping or off host is woken first.
#
# PBS runs ONE provisioning hook for every aoe. An aoe that is not ours is
# accepted without acting (exit 1: the vnode is left as it is). A site that
# has its own provisioning hook keeps it and calls
# pbs_power.pbs.jobs.on_provision(pbs, config_file) from it: that
# returns None for an aoe that is not ours. The hook runs in a child of
# pbs_server; -OO and __name__ == "builtins" hold as for the other hooks.
import json
import os
import sys

import pbs

_PBS_POWER_APP_PROV_SUCCESS = 1


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


def _pbs_power_main():
    event = pbs.event()
    config_file = _pbs_power_config_file()
    outcome = None
    try:
        _pbs_power_add_python_path(config_file)
        from pbs_power.pbs.jobs import on_provision
        outcome = on_provision(pbs, config_file)
    except SystemExit:
        raise
    except Exception as exc:
        import traceback
        pbs.logmsg(pbs.LOG_ERROR, "pbs_power: internal error, vnode left as it "
                   "is: %s: %s" % (type(exc).__name__, exc))
        for line in traceback.format_exc().splitlines():
            pbs.logmsg(getattr(pbs, "EVENT_DEBUG3", pbs.LOG_DEBUG), "pbs_power: " + line)
    if outcome is not None and not outcome.accept:
        event.reject(outcome.message)
    event.accept(outcome.code if outcome is not None else _PBS_POWER_APP_PROV_SUCCESS)


_pbs_power_main()
