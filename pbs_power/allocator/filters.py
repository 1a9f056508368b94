"""The ``filter`` of a request: which clusters' metadata match it. Pure.

A filter is an object of conditions, all of which must hold. A key is a
dotted path into the cluster's ``data`` (``labels.site``, ``gpu_count``,
``device_specs.hgx.gpu_count``); its value is either a plain value (equal,
or contained when the field is a list) or an object of operators: ``$eq``,
``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``, ``$in``, ``$nin``,
``$exists``, ``$contains``. ``$and`` / ``$or`` take lists of filters and
``$not`` one filter. Anything else is a `FilterError` naming it.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping

_MISSING = object()


class FilterError(ValueError):
    """A filter that cannot be evaluated; the message names the key."""


def matches(data: Any, query: Any) -> bool:
    """True when cluster ``data`` satisfies filter ``query``."""
    if not isinstance(query, Mapping):
        raise FilterError("a filter must be an object, got %s" % type(query).__name__)
    for key, condition in query.items():
        if key == "$and":
            if not all(matches(data, q) for q in _filters(key, condition)):
                return False
        elif key == "$or":
            if not any(matches(data, q) for q in _filters(key, condition)):
                return False
        elif key == "$not":
            if matches(data, condition):
                return False
        elif key.startswith("$"):
            raise FilterError("unknown operator %r at the top of a filter (known: $and, $or, $not)"
                              % key)
        elif not _holds(_lookup(data, key), condition, key):
            return False
    return True


def _filters(key: str, value: Any) -> list:
    if not isinstance(value, list) or not value:
        raise FilterError("%s takes a non-empty list of filters" % key)
    return value


def _lookup(data: Any, path: str) -> Any:
    at = data
    for part in path.split("."):
        if isinstance(at, Mapping) and part in at:
            at = at[part]
        elif isinstance(at, list) and part.isdigit() and int(part) < len(at):
            at = at[int(part)]
        else:
            return _MISSING
    return at


def _holds(value: Any, condition: Any, key: str) -> bool:
    if isinstance(condition, Mapping) and condition and all(str(k).startswith("$")
                                                             for k in condition):
        return all(_operator(op, key)(value, operand) for op, operand in condition.items())
    return _equal(value, condition)


def _equal(value: Any, wanted: Any) -> bool:
    if value is _MISSING:
        return False
    if isinstance(value, list) and not isinstance(wanted, list):
        return any(_same(v, wanted) for v in value)
    return _same(value, wanted)


def _same(a: Any, b: Any) -> bool:
    """JSON equality: true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def _contains(value: Any, operand: Any) -> bool:
    if isinstance(value, list):
        return any(_same(v, operand) for v in value)
    return isinstance(value, str) and isinstance(operand, str) and operand in value


def _ordered(test: Callable[[Any, Any], bool], name: str, key: str) -> Callable[[Any, Any], bool]:
    def check(value: Any, operand: Any) -> bool:
        if isinstance(operand, bool) or not isinstance(operand, (int, float, str)):
            raise FilterError("%s: %s takes a number or a string, got %r" % (key, name, operand))
        if value is _MISSING or isinstance(value, bool) or \
                isinstance(value, str) != isinstance(operand, str) or \
                not isinstance(value, (int, float, str)):
            return False
        return test(value, operand)
    return check


def _listed(name: str, key: str, inside: bool) -> Callable[[Any, Any], bool]:
    def check(value: Any, operand: Any) -> bool:
        if not isinstance(operand, list):
            raise FilterError("%s: %s takes a list, got %r" % (key, name, operand))
        found = any(_equal(value, o) for o in operand)
        return found if inside else not found
    return check


def _operator(op: str, key: str) -> Callable[[Any, Any], bool]:
    table: Dict[str, Callable[[Any, Any], bool]] = {
        "$eq": _equal,
        "$ne": lambda v, o: not _equal(v, o),
        "$gt": _ordered(lambda v, o: v > o, "$gt", key),
        "$gte": _ordered(lambda v, o: v >= o, "$gte", key),
        "$lt": _ordered(lambda v, o: v < o, "$lt", key),
        "$lte": _ordered(lambda v, o: v <= o, "$lte", key),
        "$in": _listed("$in", key, True),
        "$nin": _listed("$nin", key, False),
        "$exists": lambda v, o: (v is not _MISSING) == bool(o),
        "$contains": _contains,
    }
    try:
        return table[op]
    except KeyError:
        raise FilterError("%s: unknown operator %r (known: %s)"
                          % (key, op, ", ".join(sorted(table)))) from None
