"""Logging from a hook through PBS's own log (``pbs.logmsg``)."""
from __future__ import annotations

from typing import Callable

LogFn = Callable[[str, str], None]
#: Starts every line we log: pbs_server tags a server hook's lines with the daemon
#: (``;Hook;Server@host;``), not the hook's name (seen on OpenPBS 23.06).
PREFIX = "pbs_power: "


def pbs_logger(pbs, level: str = "info") -> LogFn:
    """``log(level, msg)`` over ``pbs.logmsg``; info is visible at default log_events.

    Every line starts with `PREFIX`, so ``grep pbs_power server_logs`` finds it.
    """
    order = ("debug", "info", "warning", "error")
    floor = order.index(level) if level in order else 1
    levels = {"debug": pbs.LOG_DEBUG if floor == 0 else getattr(pbs, "EVENT_DEBUG3", pbs.LOG_DEBUG),
              "info": pbs.LOG_DEBUG, "warning": pbs.LOG_WARNING, "error": pbs.LOG_ERROR}

    def log(lvl: str, message: str) -> None:
        if order.index(lvl) >= floor:
            pbs.logmsg(levels[lvl], message if message.startswith(PREFIX)
                       else PREFIX + message)
    return log
