"""Counts the resource-group service keeps for the metrics exporter.

How long activations took and which device requests failed, by backend and
by a small set of reasons (the error text itself is unbounded, a label must
not be). Written in ``resource_groups.db`` through `pbs_power.states.tally`,
inside the service's own transactions.
"""
from __future__ import annotations

import json
import sqlite3
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from pbs_power.states import tally

ACTIVATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: Labels of device request errors, matched from the error text in this order.
ERROR_REASONS = (
    ("timeout", ("timed out", "timeout")),
    ("no_backend", ("no device backend", "device model json")),
    ("auth", ("unauthorized", "authentication", "401", "403", "credential", "password")),
    ("connection", ("connect", "unreachable", "refused", "no route", "resolve", "reset by")),
    ("invalid", ("invalid", "out of range", "not supported", "unsupported", "bad request")),
)
UNKNOWN_BACKEND = "unknown"
#: Group events kept (activations and deactivations), for ``pbs-power history``.
GROUP_EVENTS_KEPT = 5000
_EVENTS_SQL = ("CREATE TABLE IF NOT EXISTS group_events (id INTEGER PRIMARY KEY AUTOINCREMENT,"
               " time REAL NOT NULL, group_name TEXT NOT NULL, event TEXT NOT NULL,"
               " policy TEXT, entities TEXT NOT NULL)")


def error_reason(text: str) -> str:
    """The label for a device error's text: one of ERROR_REASONS' names, else 'other'."""
    low = (text or "").lower()
    for name, words in ERROR_REASONS:
        if any(w in low for w in words):
            return name
    return "other"


def backend_of(model_json: Optional[str], default: str = "simulated") -> str:
    """The backend a device model JSON names (the controller's default when none)."""
    try:
        model = json.loads(model_json or "{}")
    except (TypeError, ValueError):
        return UNKNOWN_BACKEND
    name = model.get("backend", default) if isinstance(model, dict) else None
    return name if isinstance(name, str) and name.isidentifier() else UNKNOWN_BACKEND


def _conn(store):
    conn = store.connection
    if not store.__dict__.get("_tally_ready"):
        with store.transaction():
            tally.ensure(conn)
            conn.execute(_EVENTS_SQL)
        store.__dict__["_tally_ready"] = True
    return conn


def count_device_errors(store, requests: Sequence, outcomes: Mapping[str, object]) -> None:
    """Count each failed outcome by its request's backend and the error's reason."""
    if all(getattr(o, "ok", True) for o in outcomes.values()):
        return
    models = {r.device: r.device_model_json for r in requests}
    conn = _conn(store)
    with store.transaction():
        for device, outcome in outcomes.items():
            if getattr(outcome, "ok", True):
                continue
            tally.add(conn, "device_request_errors",
                      {"backend": backend_of(models.get(device)),
                       "reason": error_reason(getattr(outcome, "diag_msg", ""))})


def count_activation(store, seconds: Optional[float], ok: bool) -> None:
    """One activation ended: its outcome, and how long it took when it succeeded."""
    conn = _conn(store)
    with store.transaction():
        tally.add(conn, "group_activations", {"outcome": "active" if ok else "failed"})
        if ok and seconds is not None:
            tally.observe(conn, "group_activation_seconds", {}, max(0.0, seconds),
                          ACTIVATION_BUCKETS)


def group_event(store, when: float, group: str, event: str, policy: Optional[str],
                entities: Sequence[str]) -> None:
    """Remember that ``group`` (with ``entities``) was activated, deactivated, ..."""
    conn = _conn(store)
    with store.transaction():
        conn.execute("INSERT INTO group_events (time, group_name, event, policy, entities)"
                     " VALUES (?, ?, ?, ?, ?)",
                     (float(when), group, event, policy, "," + ",".join(entities) + ","))
        conn.execute("DELETE FROM group_events WHERE id <= (SELECT MAX(id) FROM group_events)"
                     " - ?", (GROUP_EVENTS_KEPT,))


def entity_group_events(conn, entity: str, since: float = float("-inf")
                        ) -> List[Tuple[float, str, str, Optional[str]]]:
    """(time, group, event, policy) of the groups ``entity`` was in, oldest first."""
    try:
        return conn.execute("SELECT time, group_name, event, policy FROM group_events WHERE"
                            " instr(entities, ',' || ? || ',') > 0 AND time >= ? ORDER BY id",
                            (entity, since)).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise


def tallies(store) -> Dict[str, Dict[tally.Labels, float]]:
    """Every counter and histogram row of the resource-group database."""
    return tally.read_all(store.connection)
