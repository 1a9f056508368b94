"""Logging from a hook through PBS's own log (``pbs.logmsg``)."""
from __future__ import annotations

from typing import Callable

LogFn = Callable[[str, str], None]


def pbs_logger(pbs, level: str = "info") -> LogFn:
    """``log(level, msg)`` over ``pbs.logmsg``; info is visible at default log_events.

    PBS tags every hook log line with the hook's name, so no prefix is added.
    """
    order = ("debug", "info", "warning", "error")
    floor = order.index(level) if level in order else 1
    levels = {"debug": pbs.LOG_DEBUG if floor == 0 else getattr(pbs, "EVENT_DEBUG3", pbs.LOG_DEBUG),
              "info": pbs.LOG_DEBUG, "warning": pbs.LOG_WARNING, "error": pbs.LOG_ERROR}

    def log(lvl: str, message: str) -> None:
        if order.index(lvl) >= floor:
            pbs.logmsg(levels[lvl], message)
    return log
