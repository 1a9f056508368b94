"""The allocator's wire format: requests checked with JSON Schema, answers, errors.

A request is the seed's JSON object (``adhoc``, ``policy_rule_uri``,
``clusters``, ``inputs``, ``filter``, ``search``, ``parameters``,
``settings``, plus an optional ``request_id`` echoed back). Every problem
becomes an `AllocatorError` with a code a client can act on; the server
sends it as ``{"ok": false, "error": {"code", "message", "details"}}``.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from pbs_power.config.checks import format_path, load_packaged_schema

REQUEST_SCHEMA = "allocator_request.schema.json"

# Error codes (the ``error.code`` of an answer).
BAD_JSON = "bad_json"
INVALID_REQUEST = "invalid_request"
UNKNOWN_POLICY = "unknown_policy"
UNKNOWN_CLUSTER = "unknown_cluster"
NOT_SUPPORTED = "not_supported"
INVALID_INPUTS = "invalid_inputs"
POLICY_ERROR = "policy_error"
BAD_POLICY_RESULT = "bad_policy_result"
TIMEOUT = "timeout"
DATA_UNAVAILABLE = "data_unavailable"
INTERNAL = "internal_error"
FORBIDDEN = "forbidden"
#: Deepest nesting of objects and lists a message may have.
MAX_DEPTH = 64


class AllocatorError(Exception):
    """A request the allocator cannot answer with allocations: code, message, details."""

    def __init__(self, code: str, message: str, details: Sequence[str] = ()):
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = list(details)

    def to_dict(self) -> Dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


@dataclass(frozen=True)
class AllocationRequest:
    """A validated request (the seed's fields; absent optional ones are empty)."""

    policy_rule_uri: str
    inputs: Mapping[str, Any]
    clusters: Tuple[str, ...] = ()
    filter: Mapping[str, Any] = field(default_factory=dict)
    search: Mapping[str, Any] = field(default_factory=dict)
    parameters: Mapping[str, Any] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)
    request_id: Optional[str] = None


@functools.lru_cache(maxsize=1)
def _validator() -> Any:
    from jsonschema import Draft7Validator
    return Draft7Validator(load_packaged_schema(REQUEST_SCHEMA))


def decode_message(message: Any) -> Any:
    """A WebSocket message (text or bytes) as JSON; AllocatorError(bad_json) if it is not."""
    if isinstance(message, (bytes, bytearray, memoryview)):
        try:
            message = bytes(message).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise AllocatorError(BAD_JSON, "message is not UTF-8 text (bad byte at offset %d)"
                                 % exc.start) from None
    try:
        doc = json.loads(message, parse_constant=_no_constant)
    except RecursionError:
        raise AllocatorError(INVALID_REQUEST, "message nested too deeply (at most %d levels "
                             "of objects and lists)" % MAX_DEPTH) from None
    except ValueError as exc:
        where = ""
        if isinstance(exc, json.JSONDecodeError):
            where = " at line %d, column %d" % (exc.lineno, exc.colno)
            exc = exc.msg  # type: ignore[assignment]
        raise AllocatorError(BAD_JSON, "message is not valid JSON%s: %s" % (where, exc)) from None
    if depth_over(doc, MAX_DEPTH):
        raise AllocatorError(INVALID_REQUEST, "message nested too deeply (at most %d levels "
                             "of objects and lists)" % MAX_DEPTH)
    return doc


def depth_over(value: Any, limit: int) -> bool:
    """True when ``value`` nests objects and lists deeper than ``limit`` (no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def _no_constant(name: str) -> Any:
    raise ValueError("%s is not a JSON number" % name)


def parse_request(doc: Any) -> AllocationRequest:
    """A decoded message as an AllocationRequest; AllocatorError lists every problem."""
    if not isinstance(doc, dict):
        raise AllocatorError(INVALID_REQUEST, "the request must be a JSON object, got %s"
                             % _json_type(doc))
    problems = sorted(_schema_problem(e) for e in _validator().iter_errors(doc))
    if problems:
        noun = "problem" if len(problems) == 1 else "problems"
        raise AllocatorError(INVALID_REQUEST, "invalid request (%d %s): %s"
                             % (len(problems), noun, problems[0]), problems)
    return AllocationRequest(
        policy_rule_uri=doc["policy_rule_uri"], inputs=doc["inputs"],
        clusters=tuple(doc.get("clusters") or ()), filter=doc.get("filter") or {},
        search=doc.get("search") or {}, parameters=doc.get("parameters") or {},
        settings=doc.get("settings") or {}, request_id=doc.get("request_id"))


def _schema_problem(error: Any) -> str:
    """One schema error as ``path: message`` in the request's own words."""
    path = format_path(error.absolute_path) or "request"
    if error.validator == "additionalProperties":
        known = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(known))
        return "%s: unknown field(s) %s (known: %s)" % (path, ", ".join(map(repr, extra)),
                                                      ", ".join(known))
    if error.validator == "required":
        return "%s: %s" % (path, error.message.replace("property", "field"))
    if error.validator == "const":
        return "%s: must be %s, got %s" % (path, json.dumps(error.validator_value),
                                          json.dumps(error.instance))
    if error.validator == "type":
        return "%s: must be %s, got %s" % (path, _type_words(error.validator_value),
                                          _json_type(error.instance))
    return "%s: %s" % (path, error.message)


def _type_words(types: Any) -> str:
    names = [types] if isinstance(types, str) else list(types)
    words = {"object": "an object", "array": "a list", "string": "a string",
             "boolean": "true or false", "integer": "an integer", "number": "a number",
             "null": "null"}
    return " or ".join(words.get(n, n) for n in names)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean (%s)" % json.dumps(value)
    if isinstance(value, (int, float)):
        return "a number (%s)" % json.dumps(value)
    if isinstance(value, str):
        return "a string (%s)" % json.dumps(value[:40])
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def success(request: AllocationRequest, policy: str, clusters: Sequence[str],
            allocations: List[Dict[str, Any]], elapsed_ms: float,
            notes: Sequence[str] = ()) -> Dict[str, Any]:
    """The answer to a request the policy answered (``notes``: data that was missing)."""
    out: Dict[str, Any] = {"ok": True, "policy_rule_uri": policy, "clusters": list(clusters),
                           "allocations": allocations, "elapsed_ms": round(elapsed_ms, 3)}
    if notes:
        out["notes"] = list(notes)
    if request.request_id is not None:
        out["request_id"] = request.request_id
    return out


def failure(error: AllocatorError, request_id: Optional[str] = None) -> Dict[str, Any]:
    """The answer to a request that failed."""
    out: Dict[str, Any] = {"ok": False, "error": error.to_dict()}
    if request_id is not None:
        out["request_id"] = request_id
    return out


def request_id_of(doc: Any) -> Optional[str]:
    """The request_id of a (possibly invalid) request, when it is a usable string."""
    if isinstance(doc, dict):
        rid = doc.get("request_id")
        if isinstance(rid, str) and len(rid) <= 200:
            return rid
    return None


def encode(answer: Mapping[str, Any]) -> str:
    """An answer as JSON text (never NaN or Infinity)."""
    return json.dumps(answer, allow_nan=False, separators=(",", ":"))


def is_finite_json(value: Any, depth: int = 0) -> bool:
    """True when ``value`` is plain JSON data (dict/list/str/number/bool/null, finite)."""
    if depth > 64:
        return False
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(is_finite_json(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_finite_json(v, depth + 1)
                   for k, v in value.items())
    return False
