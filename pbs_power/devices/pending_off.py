"""Hosts sent a soft (graceful) power off, and when: kept on disk between hook runs.

A soft off asks the OS to shut down; a host whose OS ignores it stays up.
The power backends (redfish, ipmi) remember each soft off here, and a later
status read that finds the host still up after the backend's timeout sends
the hard off. The file is small JSON, host -> time (the caller's clock),
replaced atomically, mode 0600.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from typing import Dict, Mapping, Sequence

LOG = logging.getLogger(__name__)


class PendingOffLog:
    """Hosts sent a soft off, and when (caller's clock): survives hook runs."""

    def __init__(self, path: str, who: str) -> None:
        self.path = path
        self.who = who
        self._lock = threading.Lock()

    def load(self) -> Dict[str, float]:
        try:
            with open(self.path) as f:
                doc = json.load(f)
            return {str(h): float(t) for h, t in doc.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            LOG.warning("%s: %s unreadable (%s); starting afresh", self.who, self.path, exc)
            return {}

    def update(self, add: Mapping[str, float], drop: Sequence[str]) -> None:
        if not add and not drop:
            return
        with self._lock:
            pending = self.load()
            pending.update(add)
            for host in drop:
                pending.pop(host, None)
            tmp = "%s.%d.tmp" % (self.path, os.getpid())
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as f:
                    json.dump(pending, f, sort_keys=True)
                os.replace(tmp, self.path)
            except OSError as exc:  # the soft offs stand; only the hard-off fallback is lost
                LOG.error("%s: cannot write %s (%s): hosts %s get no hard-off fallback",
                          self.who, self.path, exc, ", ".join(sorted(add)) or "-")
