# pbs_power server periodic hook: puts idle hosts to sleep or powers them
# off, and brings them back ahead of queued jobs and reservations.
#
# Install (as root on the PBS server host):
#   python3 -m pip install --target /opt/pbs_power/lib pbs-power
#   qmgr -c "create hook pbs_power"
#   qmgr -c "import hook pbs_power application/x-python default PBS_power.py"
#   qmgr -c "import hook pbs_power application/x-config default PBS_power.json"
#   qmgr -c "set hook pbs_power event = periodic, freq = 30, alarm = 240"
#   qmgr -c "set hook pbs_power enabled = true"
# The config's "python_path" must list /opt/pbs_power/lib (PBS runs hooks in
# an isolated interpreter that sees no site-packages). Check the config first
# with: pbs-power config validate PBS_power.json
#
# All logic lives in the pbs_power library. This file only finds it, calls it
# and accepts the event: whatever goes wrong, it logs and leaves nodes as
# they are, never failing the server. PBS runs hooks with -OO and
# __name__ == "builtins", so there is no docstring, assert or main guard here.
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


def _pbs_power_main():
    config_file = _pbs_power_config_file()
    try:
        _pbs_power_add_python_path(config_file)
        from pbs_power.pbs.hook import run_periodic
        run_periodic(pbs, config_file)
    except SystemExit:
        raise
    except Exception as exc:
        import traceback
        pbs.logmsg(pbs.LOG_ERROR, "pbs_power: internal error, nodes left as they are: "
                   "%s: %s" % (type(exc).__name__, exc))
        for line in traceback.format_exc().splitlines():
            pbs.logmsg(getattr(pbs, "EVENT_DEBUG3", pbs.LOG_DEBUG), "pbs_power: " + line)
    pbs.event().accept()


_pbs_power_main()
