"""PBS attribute values as plain data: exec_vnode lists and qstat's times."""
from __future__ import annotations

import re
import time
from typing import Any, Dict, Optional, Tuple

#: How qstat prints times in its JSON output (C locale, local time).
QSTAT_TIME_FORMAT = "%a %b %d %H:%M:%S %Y"
_CHUNK_VNODE = re.compile(r"(?:^|[(+])\s*([^:()+\s]+)")


def parse_exec_vnode(text: str) -> Tuple[str, ...]:
    """Vnode names of an exec_vnode / resv_nodes string, in order, once each.

    ``(n1:ncpus=2)+(n2:ncpus=2+n3:ncpus=1)`` -> ``("n1", "n2", "n3")``.
    """
    seen: Dict[str, None] = {}
    for match in _CHUNK_VNODE.finditer(text or ""):
        seen.setdefault(match.group(1), None)
    return tuple(seen)


def parse_qstat_time(value: Any) -> Optional[float]:
    """qstat's ``Thu Nov 22 10:00:00 2026`` (local time) or an epoch -> epoch."""
    if value is None or value == "":
        return None
    if isinstance(value, (int, float)) or str(value).strip().isdigit():
        return float(value)
    try:
        return time.mktime(time.strptime(str(value).strip(), QSTAT_TIME_FORMAT))
    except ValueError:
        return None
