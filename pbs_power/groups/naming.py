"""Checks of resource-group requests, each giving a one-line reason or ''.

Group names, external ids, partial-activation thresholds, policy and entity
names: a bad request is answered with the reason, never an exception.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

GROUP_NAME = re.compile(r"[A-Za-z0-9_.:@+-]{1,128}")


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not GROUP_NAME.fullmatch(name):
        return ("resource group name must be 1-128 characters of letters, digits and "
                "_ . : @ + -, got %r" % (name,))
    return ""


def check_external_id(ext: Any) -> str:
    if ext is None:
        return ""
    if isinstance(ext, bool) or not isinstance(ext, int) or not -2 ** 63 <= ext < 2 ** 63:
        return "external id must be a 64-bit integer, got %r" % (ext,)
    return ""


def check_partial(partial: Any) -> str:
    """A partial activation needs at least one host, or a fraction above 0."""
    if partial is None:
        return ""
    n = partial.atleast_n_hosts
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        return "at least n hosts must be an integer >= 1, got %r" % (n,)
    frac = partial.atleast_frac_hosts
    if frac is not None and not (isinstance(frac, (int, float)) and 0 < frac <= 1):
        return "at least a fraction of hosts must be in (0, 1], got %r" % (frac,)
    return ""


def unknown_policy(topo, name: str) -> str:
    import difflib  # only for an unknown name
    close = difflib.get_close_matches(name, list(topo.policies), 1)
    return "no policy %r in topology %s%s" % (
        name, topo.name, " (did you mean %r?)" % close[0] if close else "")


def unknown_entities(topo, names: Iterable[str]) -> str:
    missing = [n for n in names if n not in topo.entities]
    if not missing:
        return ""
    return "not in topology %s: %s%s" % (topo.name, ", ".join(missing[:10]),
                                         " and %d more" % (len(missing) - 10)
                                         if len(missing) > 10 else "")


def summary(accepted: Mapping[str, Any], rejected: Mapping[str, Any]) -> str:
    """``2 updated; 1 refused: n3: ...`` for update-resources."""
    parts = ["%d updated" % len(accepted)]
    if rejected:
        bad = sorted((e, o.diag_msg) for e, o in rejected.items())
        shown = ", ".join("%s: %s" % item for item in bad[:5])
        parts.append("%d refused: %s%s" % (len(rejected), shown, " and %d more" % (
            len(bad) - 5) if len(bad) > 5 else ""))
    return "; ".join(parts)


__all__ = ["GROUP_NAME", "check_name", "check_external_id", "check_partial",
           "unknown_policy", "unknown_entities", "summary"]
