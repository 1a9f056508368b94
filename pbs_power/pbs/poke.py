"""``python -m pbs_power.pbs.poke DELAY QMGR``: start a PBS scheduling cycle after DELAY seconds.

Started detached by the periodic hook (see `pbs_power.pbs.scheduler`): the
hook's vnode changes reach pbs_server only after the hook has exited, so the
cycle is asked for a little later, with ``qmgr -c "set server scheduling =
True"`` (the server's ``poke_scheduler`` action).
"""
from __future__ import annotations

import subprocess
import sys
import time
from typing import List, Optional

REQUEST = "set server scheduling = True"
TIMEOUT = 60.0


def main(argv: Optional[List[str]] = None) -> int:
    """Wait, then run qmgr once; its exit status (2 for bad arguments)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        return 2
    try:
        delay = max(0.0, min(float(args[0]), 300.0))
    except ValueError:
        return 2
    time.sleep(delay)
    try:
        return subprocess.run([args[1], "-c", REQUEST], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=TIMEOUT, check=False).returncode
    except (OSError, subprocess.TimeoutExpired):
        return 1


if __name__ == "__main__":
    sys.exit(main())
