"""Persistent state of the resource-group service (``<state_dir>/resource_groups.db``).

Many prologs and epilogs run at once, each its own process, so every
read-modify-write happens in one ``BEGIN IMMEDIATE`` transaction. The
schema itself carries the invariants: an entity is the primary key of the
members table (never in two groups) and of the power ledger, the one place
the watts an entity counts against the budget are kept.
"""
from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from pbs_power.states.sqlite import BUSY_TIMEOUT_S, StoreError, check_writable_dir, connect

DB_NAME = "resource_groups.db"
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS topology (id INTEGER PRIMARY KEY CHECK (id = 1), "
    "doc TEXT NOT NULL, active INTEGER NOT NULL DEFAULT 0, changed REAL)",
    "CREATE TABLE IF NOT EXISTS groups (name TEXT PRIMARY KEY, external_id INTEGER, "
    "policy TEXT, workload_profile_ids TEXT NOT NULL DEFAULT '[]', prs_enabled INTEGER, "
    "dpm_enable INTEGER NOT NULL DEFAULT 1, properties TEXT NOT NULL DEFAULT '{}', "
    "status TEXT NOT NULL DEFAULT 'inactive', created REAL, activated REAL, "
    "owner_pid INTEGER, diag TEXT NOT NULL DEFAULT '')",
    "CREATE TABLE IF NOT EXISTS members (entity TEXT PRIMARY KEY, "
    "group_name TEXT NOT NULL REFERENCES groups(name) ON DELETE CASCADE, "
    "policy TEXT, applied_policy TEXT, applied_watts REAL, "
    "state TEXT NOT NULL DEFAULT 'inactive', diag TEXT NOT NULL DEFAULT '', gpu_policies TEXT)",
    "CREATE INDEX IF NOT EXISTS members_group ON members(group_name)",
    "CREATE TABLE IF NOT EXISTS operations (id TEXT PRIMARY KEY, group_name TEXT NOT NULL, "
    "type TEXT NOT NULL, created REAL, n_hosts INTEGER NOT NULL, "
    "n_success INTEGER NOT NULL DEFAULT 0, n_failed INTEGER NOT NULL DEFAULT 0, "
    "completed INTEGER NOT NULL DEFAULT 0, worker_pid INTEGER, request TEXT, result TEXT)",
    "CREATE TABLE IF NOT EXISTS device_state (device TEXT PRIMARY KEY, state TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS power_ledger (entity TEXT PRIMARY KEY, watts REAL NOT NULL, "
    "policy TEXT, told REAL, sender INTEGER)",
)
#: A database from before the ledger: what active groups applied is what their nodes count.
SEED_LEDGER = ("INSERT OR IGNORE INTO power_ledger (entity, watts, policy) "
               "SELECT m.entity, m.applied_watts, m.applied_policy FROM members m "
               "JOIN groups g ON g.name = m.group_name "
               "WHERE g.status != 'inactive' AND m.applied_watts IS NOT NULL")


@dataclass(frozen=True)
class GroupRow:
    """A resource group as stored."""

    name: str
    external_id: Optional[int]
    policy: Optional[str]
    workload_profile_ids: Tuple[int, ...]
    prs_enabled: Optional[bool]
    dpm_enable: bool
    properties: Mapping[str, Any]
    status: str                       # inactive | activating | active | deactivating
    created: Optional[float]
    activated: Optional[float]
    owner_pid: Optional[int]
    diag: str = ""

    @property
    def priority(self) -> int:
        try:
            return int(self.properties.get("priority", 0))
        except (TypeError, ValueError):
            return 0


@dataclass(frozen=True)
class MemberRow:
    """An entity in a group: its own policy, and what is applied to it."""

    entity: str
    group_name: str
    policy: Optional[str] = None
    applied_policy: Optional[str] = None
    applied_watts: Optional[float] = None
    state: str = "inactive"           # inactive | active | failed
    diag: str = ""
    gpu_policies: Optional[str] = None


@dataclass(frozen=True)
class OperationRow:
    """An asynchronous operation and its progress."""

    id: str
    group_name: str
    type: str
    created: float
    n_hosts: int
    n_success: int
    n_failed: int
    completed: bool
    worker_pid: Optional[int]
    request: Mapping[str, Any]
    result: Optional[Mapping[str, Any]]


class GroupStore:
    """Rows of the service, read and written in short transactions."""

    def __init__(self, state_dir: str, timeout: float = BUSY_TIMEOUT_S):
        state_dir = os.path.abspath(state_dir)
        if not os.path.isdir(state_dir):
            try:
                os.makedirs(state_dir, mode=0o700, exist_ok=True)
            except OSError as exc:
                raise StoreError("cannot create state directory %s (%s)"
                                 % (state_dir, exc.strerror)) from None
        check_writable_dir(state_dir)
        self.path = os.path.join(state_dir, DB_NAME)
        self._depth = 0
        try:
            self._conn = connect(self.path, timeout)
            self._conn.execute("PRAGMA foreign_keys = ON")
            with self.transaction():
                had_ledger = self._rows("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                                        "AND name = 'power_ledger'")
                for statement in SCHEMA:
                    self._conn.execute(statement)
                if not had_ledger:
                    self._conn.execute(SEED_LEDGER)
        except sqlite3.Error as exc:
            raise StoreError("resource-group database %s: %s" % (self.path, exc)) from None

    @contextlib.contextmanager
    def transaction(self) -> Iterator["GroupStore"]:
        """BEGIN IMMEDIATE (outermost) or a savepoint (nested); rolled back on error."""
        conn, depth = self._conn, self._depth
        conn.execute("BEGIN IMMEDIATE" if depth == 0 else "SAVEPOINT sp%d" % depth)
        self._depth += 1
        try:
            yield self
        except BaseException:
            self._depth -= 1
            if depth == 0:
                conn.execute("ROLLBACK")
            else:
                conn.execute("ROLLBACK TO sp%d" % depth)
                conn.execute("RELEASE sp%d" % depth)
            raise
        self._depth -= 1
        conn.execute("COMMIT" if depth == 0 else "RELEASE sp%d" % depth)

    @property
    def connection(self) -> sqlite3.Connection:
        """The open connection, for tables kept beside the service's (`records`)."""
        return self._conn

    def close(self) -> None:
        self._conn.close()

    def _rows(self, sql: str, params: Sequence = ()) -> List[tuple]:
        return self._conn.execute(sql, params).fetchall()

    def _run(self, sql: str, params: Sequence = ()) -> int:
        return self._conn.execute(sql, params).rowcount

    # -- topology ------------------------------------------------------------
    def topology_doc(self) -> Tuple[Optional[Dict[str, Any]], bool]:
        rows = self._rows("SELECT doc, active FROM topology WHERE id = 1")
        return (json.loads(rows[0][0]), bool(rows[0][1])) if rows else (None, False)

    def topology_stamp(self) -> Tuple[Optional[float], bool]:
        """(change stamp, active) of the stored topology, without reading it."""
        rows = self._rows("SELECT changed, active FROM topology WHERE id = 1")
        return (rows[0][0], bool(rows[0][1])) if rows else (None, False)

    def put_topology(self, doc: Mapping[str, Any], active: bool, when: float) -> None:
        """Store the topology; its change stamp always moves forward."""
        previous, _ = self.topology_stamp()
        stamp = when if previous is None else max(when, previous + 1e-6)
        self._run("INSERT OR REPLACE INTO topology (id, doc, active, changed) VALUES (1, ?, ?, ?)",
                  (json.dumps(doc), int(active), stamp))

    # -- groups --------------------------------------------------------------
    def group(self, name: str) -> Optional[GroupRow]:
        rows = self._rows("SELECT * FROM groups WHERE name = ?", (name,))
        return _group(rows[0]) if rows else None

    def groups(self, active_only: bool = False) -> List[GroupRow]:
        sql = "SELECT * FROM groups" + (" WHERE status = 'active'" if active_only else "")
        return [_group(r) for r in self._rows(sql + " ORDER BY created, name")]

    def insert_group(self, g: GroupRow) -> None:
        self._run("INSERT INTO groups VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                  (g.name, g.external_id, g.policy, json.dumps(list(g.workload_profile_ids)),
                   None if g.prs_enabled is None else int(g.prs_enabled), int(g.dpm_enable),
                   json.dumps(dict(g.properties)), g.status, g.created, g.activated,
                   g.owner_pid, g.diag))

    def set_group(self, name: str, **fields: Any) -> None:
        """Update some columns of a group (status, policy, activated, owner_pid, diag, ...)."""
        if "workload_profile_ids" in fields:
            fields["workload_profile_ids"] = json.dumps(list(fields["workload_profile_ids"]))
        cols = ", ".join("%s = ?" % k for k in fields)
        self._run("UPDATE groups SET %s WHERE name = ?" % cols, list(fields.values()) + [name])

    def delete_group(self, name: str) -> None:
        self._run("DELETE FROM members WHERE group_name = ?", (name,))
        self._run("DELETE FROM groups WHERE name = ?", (name,))

    # -- members -------------------------------------------------------------
    def members(self, group: str) -> List[MemberRow]:
        return [MemberRow(*r) for r in self._rows(
            "SELECT * FROM members WHERE group_name = ? ORDER BY entity", (group,))]

    def member_groups(self, entities: Sequence[str]) -> Dict[str, str]:
        """entity -> group for those of ``entities`` already in a group."""
        return self._pairs_in("SELECT entity, group_name FROM members WHERE entity IN (%s)",
                              entities)

    def _pairs_in(self, sql: str, keys: Sequence[str]) -> Dict[str, Any]:
        """Two-column rows of ``sql`` whose ``IN (%s)`` takes ``keys``, 500 at a time."""
        out: Dict[str, Any] = {}
        for i in range(0, len(keys), 500):
            chunk = list(keys[i:i + 500])
            out.update(self._rows(sql % ",".join("?" * len(chunk)), chunk))
        return out

    def add_members(self, group: str, entities: Sequence[str], policy: Optional[str]) -> None:
        self._conn.executemany("INSERT INTO members (entity, group_name, policy) VALUES (?,?,?)",
                               [(e, group, policy) for e in entities])

    def remove_members(self, group: str, entities: Sequence[str]) -> None:
        self._conn.executemany("DELETE FROM members WHERE group_name = ? AND entity = ?",
                               [(group, e) for e in entities])

    def put_members(self, rows: Sequence[MemberRow]) -> None:
        self._conn.executemany(
            "UPDATE members SET policy = ?, applied_policy = ?, applied_watts = ?, state = ?, "
            "diag = ?, gpu_policies = ? WHERE entity = ? AND group_name = ?",
            [(m.policy, m.applied_policy, m.applied_watts, m.state, m.diag, m.gpu_policies,
              m.entity, m.group_name) for m in rows])

    def allocations(self) -> Dict[str, MemberRow]:
        """Members of groups active or changing, with what is applied to them (for
        display; the budget reads the power ledger)."""
        rows = self._rows("SELECT m.* FROM members m JOIN groups g ON g.name = m.group_name "
                          "WHERE g.status IN ('active', 'activating', 'deactivating') "
                          "AND m.applied_watts IS NOT NULL")
        return {r[0]: MemberRow(*r) for r in rows}

    # -- the power ledger (see ledger.py) -------------------------------------
    def ledger_rows(self) -> List[tuple]:
        """(entity, watts, policy, told, sender) of each entity not plainly at its topology policy."""
        return self._rows("SELECT entity, watts, policy, told, sender FROM power_ledger")

    def put_ledger(self, rows: Sequence[tuple]) -> None:
        self._conn.executemany("INSERT OR REPLACE INTO power_ledger VALUES (?, ?, ?, ?, ?)", rows)

    def drop_ledger(self, entities: Sequence[str]) -> None:
        self._conn.executemany("DELETE FROM power_ledger WHERE entity = ?",
                               [(e,) for e in entities])

    # -- operations ----------------------------------------------------------
    def insert_operation(self, op: OperationRow) -> None:
        self._run("INSERT INTO operations VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                  (op.id, op.group_name, op.type, op.created, op.n_hosts, op.n_success,
                   op.n_failed, int(op.completed), op.worker_pid, json.dumps(dict(op.request)),
                   None if op.result is None else json.dumps(op.result)))

    def operation(self, op_id: str) -> Optional[OperationRow]:
        rows = self._rows("SELECT * FROM operations WHERE id = ?", (op_id,))
        return _operation(rows[0]) if rows else None

    def latest_operation(self, group: str, op_type: str) -> Optional[OperationRow]:
        rows = self._rows("SELECT * FROM operations WHERE group_name = ? AND type = ? "
                          "ORDER BY created DESC LIMIT 1", (group, op_type))
        return _operation(rows[0]) if rows else None

    def set_operation(self, op_id: str, **fields: Any) -> None:
        if "result" in fields and fields["result"] is not None:
            fields["result"] = json.dumps(fields["result"])
        cols = ", ".join("%s = ?" % k for k in fields)
        self._run("UPDATE operations SET %s WHERE id = ?" % cols, list(fields.values()) + [op_id])

    def delete_operation(self, op_id: str) -> None:
        self._run("DELETE FROM operations WHERE id = ?", (op_id,))

    # -- device state (the controller's DeviceStateStore) --------------------
    def get_device_state(self, device: str) -> Optional[str]:
        rows = self._rows("SELECT state FROM device_state WHERE device = ?", (device,))
        return rows[0][0] if rows else None

    def get_device_states(self, devices: Sequence[str]) -> Dict[str, str]:
        """Stored states of ``devices`` (those that have one), in few queries."""
        return self._pairs_in("SELECT device, state FROM device_state WHERE device IN (%s)",
                              devices)

    def put_device_states(self, states: Mapping[str, str]) -> None:
        with self.transaction():
            self._conn.executemany("INSERT OR REPLACE INTO device_state VALUES (?, ?)",
                                   list(states.items()))


def _group(row: tuple) -> GroupRow:
    (name, ext, policy, wp, prs, dpm, props, status, created, activated, pid, diag) = row
    return GroupRow(name, ext, policy, tuple(json.loads(wp)), None if prs is None else bool(prs),
                    bool(dpm), json.loads(props), status, created, activated, pid, diag)


def _operation(row: tuple) -> OperationRow:
    (oid, group, kind, created, n, ok, bad, done, pid, request, result) = row
    return OperationRow(oid, group, kind, created, n, ok, bad, bool(done), pid,
                        json.loads(request or "{}"), None if result is None else json.loads(result))


__all__ = ["GroupStore", "GroupRow", "MemberRow", "OperationRow", "replace"]
