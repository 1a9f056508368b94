"""What the power cycle did, kept for people and for the metrics exporter.

Beside the state the next cycle needs (`store`), each transition's start,
end and outcome is written here as a per-host event, each cycle as one row
(duration, outcome, hosts by power state, hosts held back and why), and the
time each host spent down with the watts that saved. Counters and duration
histograms go to `tally`. Everything is bounded: events per host, cycle
rows, and saving intervals by age, so a years-old store is no bigger than a
week-old one. The tables live in the state database, created when first
written, and every write joins the caller's transaction.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

from . import tally
from .model import Transition, TransitionKind

#: Events kept per host (a host changes power a few times a day at most).
EVENTS_PER_HOST = 200
#: Cycle rows kept (a cycle a minute: about a day of them).
CYCLES_KEPT = 1500
#: Closed saving intervals are kept this long (status shows "this week").
SAVINGS_RETENTION_S = 8 * 86400.0

BOOT_BUCKETS = (10.0, 30.0, 60.0, 120.0, 180.0, 300.0, 450.0, 600.0, 900.0, 1800.0, 3600.0)
SHUTDOWN_BUCKETS = (5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0)
CYCLE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
WAIT_BUCKETS = (0.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 3600.0)

#: Event names of a transition's life.
STARTED, COMPLETED, FAILED, ENDED = "started", "completed", "failed", "ended"
#: Why hosts were held back, as labels (a deferral's text is matched to one).
HOLD_REASONS = ("ramp", "max_concurrent_nodes", "delay", "other")
#: Power states a host is counted in.
NODE_STATES = ("on", "asleep", "off", "powering_up", "powering_down", "failed")
#: Cycle outcomes.
CYCLE_OUTCOMES = ("ran", "skipped", "query_failed")

_TABLES = (
    "CREATE TABLE IF NOT EXISTS power_events (id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " time REAL NOT NULL, host TEXT NOT NULL, kind TEXT NOT NULL, event TEXT NOT NULL,"
    " seconds REAL, reason TEXT NOT NULL DEFAULT '')",
    "CREATE INDEX IF NOT EXISTS power_events_host ON power_events (host, id)",
    "CREATE TABLE IF NOT EXISTS cycles (id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " started REAL NOT NULL, seconds REAL NOT NULL, outcome TEXT NOT NULL,"
    " states TEXT NOT NULL DEFAULT '{}', eligible INTEGER NOT NULL DEFAULT 0,"
    " held TEXT NOT NULL DEFAULT '{}')",
    "CREATE TABLE IF NOT EXISTS saving_now (host TEXT PRIMARY KEY, kind TEXT NOT NULL,"
    " since REAL NOT NULL, watts REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS savings (id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " host TEXT NOT NULL, start REAL NOT NULL, end REAL NOT NULL, watts REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS savings_end ON savings (end)",
    "CREATE TABLE IF NOT EXISTS wake_needs (host TEXT PRIMARY KEY, need_by REAL NOT NULL)",
    tally.TABLE_SQL,
)


@dataclass(frozen=True)
class PowerEvent:
    """One step in a host's power history."""

    time: float
    host: str
    kind: str
    event: str                  # started | completed | failed | ended
    seconds: Optional[float]    # measured duration, for completed
    reason: str


@dataclass(frozen=True)
class CycleRecord:
    """One periodic pass: when, how long, outcome, and the cluster it left behind."""

    started: float
    seconds: float
    outcome: str                                  # one of CYCLE_OUTCOMES
    states: Mapping[str, int] = field(default_factory=dict)
    eligible: int = 0
    held: Mapping[str, int] = field(default_factory=dict)

    @property
    def hosts(self) -> int:
        return sum(self.states.values())


def conn_of(store):
    """The store's connection, with this module's tables created (once per store).

    A bare connection (the exporter's read-only one) is used as it is.
    """
    if isinstance(store, sqlite3.Connection):
        return store
    conn = store.connection
    if not store.__dict__.get("_journal_ready"):
        with store.transaction():
            for sql in _TABLES:
                conn.execute(sql)
        store.__dict__["_journal_ready"] = True
    return conn


def hold_reason(text: str) -> str:
    """The label for a deferral's reason text."""
    if "max_ramp_watts" in text:
        return "ramp"
    if "max_concurrent_nodes" in text:
        return "max_concurrent_nodes"
    if "min_node_down_delay" in text:
        return "delay"
    return "other"


def saved_watts(power, kind: TransitionKind) -> float:
    """Watts a host saves once ``kind`` (a down kind) is done; 0 without a watts model."""
    if power is None:
        return 0.0
    low = power.sleep_watts if kind is TransitionKind.SLEEP else power.off_watts
    return max(0.0, float(power.idle_watts) - float(low))


def census(hosts: Mapping[str, bool], transitions, failed_hosts, saving: Mapping[str, Tuple],
           down: Mapping[str, float]) -> Tuple[Dict[str, int], int]:
    """(hosts per power state, hosts eligible to power down) for ``hosts``: {host: eligible}.

    A failed host counts as failed, one in flight by direction, one the
    journal knows down by how it went down, one only `store` knows down as off.
    """
    phases = {t.host: t.phase.value for t in transitions}
    counts = dict.fromkeys(NODE_STATES, 0)
    for host in hosts:
        phase = phases.get(host)
        if host in failed_hosts:
            state = "failed"
        elif phase is not None:
            state = "powering_down" if phase in ("draining", "powering_down") else "powering_up"
        elif host in saving:
            state = "asleep" if saving[host][0] == TransitionKind.SLEEP.value else "off"
        elif host in down:
            state = "off"
        else:
            state = "on"
        counts[state] += 1
    return counts, sum(1 for eligible in hosts.values() if eligible)


def record_pass(store, vnodes, deferred, now: float, seconds: float, outcome: str) -> None:
    """Record a cycle that ran over ``vnodes``, with the plan's ``deferred`` hosts."""
    hosts: Dict[str, bool] = {}
    awake, unusable = set(), set()
    for v in vnodes:
        hosts[v.host] = hosts.get(v.host, False) or v.poweroff_eligible
        if not v.asleep:
            awake.add(v.host)
        if not v.usable:
            unusable.add(v.host)
    transitions, saving = store.transitions(), saving_now(store)
    # Up and usable without a wake of ours (an admin powered it on): it saves no more.
    back = set(saving) - unusable - {t.host for t in transitions}
    if back:
        conn = conn_of(store)
        with store.transaction():
            for host in sorted(back):
                _close_saving(conn, host, now)
                saving.pop(host)
    # Shown asleep with no record of ours (Slurm powered it down itself): off.
    down = dict.fromkeys(set(hosts) - awake, 0.0)
    down.update(store.down_since())
    states, eligible = census(hosts, transitions, store.failed(), saving, down)
    held: Dict[str, int] = {}
    for d in deferred:
        reason = hold_reason(d.reason)
        held[reason] = held.get(reason, 0) + 1
    record_cycle(store, CycleRecord(now, seconds, outcome, states, eligible, held))


# -- writing ------------------------------------------------------------------------
def _event(conn, host: str, kind: str, event: str, when: float,
           seconds: Optional[float] = None, reason: str = "") -> None:
    conn.execute("INSERT INTO power_events (time, host, kind, event, seconds, reason)"
                 " VALUES (?, ?, ?, ?, ?, ?)", (float(when), host, kind, event, seconds, reason))
    conn.execute("DELETE FROM power_events WHERE host = ? AND id <= (SELECT id FROM "
                 "power_events WHERE host = ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                 (host, host, EVENTS_PER_HOST))


def started(store, t: Transition, need_by: Optional[float] = None) -> None:
    """A transition began; an up transition ends the host's saving interval."""
    conn = conn_of(store)
    kind = TransitionKind(t.kind)
    with store.transaction():
        _event(conn, t.host, kind.value, STARTED, t.started, reason=t.reason)
        tally.add(conn, "transitions_started", {"kind": kind.value})
        if not kind.is_down:
            _close_saving(conn, t.host, t.started)
            if need_by is not None:
                conn.execute("INSERT OR REPLACE INTO wake_needs VALUES (?, ?)",
                             (t.host, float(need_by)))


def completed(store, t: Transition, seconds: float, now: float, watts: float = 0.0) -> None:
    """A transition finished in ``seconds``; a down one starts saving ``watts``."""
    conn = conn_of(store)
    kind = TransitionKind(t.kind)
    with store.transaction():
        _event(conn, t.host, kind.value, COMPLETED, now, float(seconds), "done")
        tally.add(conn, "transitions_completed", {"kind": kind.value})
        tally.observe(conn, "shutdown_seconds" if kind.is_down else "boot_seconds",
                      {"kind": kind.value}, seconds,
                      SHUTDOWN_BUCKETS if kind.is_down else BOOT_BUCKETS)
        if kind.is_down:
            _close_saving(conn, t.host, now)       # a counter never goes back
            conn.execute("INSERT OR REPLACE INTO saving_now VALUES (?, ?, ?, ?)",
                         (t.host, kind.value, float(now), float(watts)))
        else:
            _settle_wait(conn, t.host, t.started + float(seconds))


def failed(store, t: Transition, reason: str, now: float) -> None:
    """A transition failed (timed out, or the host never came back)."""
    conn = conn_of(store)
    with store.transaction():
        _event(conn, t.host, TransitionKind(t.kind).value, FAILED, now, reason=reason)
        tally.add(conn, "transitions_failed", {"kind": TransitionKind(t.kind).value})
        conn.execute("DELETE FROM wake_needs WHERE host = ?", (t.host,))


def ended(store, t: Transition, reason: str, now: float) -> None:
    """A transition was given up without failing (drain cancelled, handed back)."""
    conn = conn_of(store)
    with store.transaction():
        _event(conn, t.host, TransitionKind(t.kind).value, ENDED, now, reason=reason)
        conn.execute("DELETE FROM wake_needs WHERE host = ?", (t.host,))


def _close_saving(conn, host: str, when: float) -> None:
    row = conn.execute("SELECT since, watts FROM saving_now WHERE host = ?",
                       (host,)).fetchone()
    if row is None:
        return
    since, watts = row
    end = max(float(when), since)
    conn.execute("DELETE FROM saving_now WHERE host = ?", (host,))
    conn.execute("INSERT INTO savings (host, start, end, watts) VALUES (?, ?, ?, ?)",
                 (host, since, end, watts))
    conn.execute("DELETE FROM savings WHERE end < ?", (end - SAVINGS_RETENTION_S,))
    tally.add(conn, "energy_saved_joules", {}, (end - since) * watts)


def _settle_wait(conn, host: str, ready_at: float) -> None:
    """A wake a job was waiting for is done: count how long past its need it came."""
    row = conn.execute("SELECT need_by FROM wake_needs WHERE host = ?", (host,)).fetchone()
    if row is None:
        return
    conn.execute("DELETE FROM wake_needs WHERE host = ?", (host,))
    wait = max(0.0, ready_at - row[0])
    tally.observe(conn, "wake_wait_seconds", {}, wait, WAIT_BUCKETS)
    if wait > 0:
        tally.add(conn, "jobs_waited_for_wake", {})


def record_cycle(store, record: CycleRecord) -> None:
    """Keep one cycle's row (the newest CYCLES_KEPT) and count its outcome."""
    conn = conn_of(store)
    with store.transaction():
        conn.execute("INSERT INTO cycles (started, seconds, outcome, states, eligible, held)"
                     " VALUES (?, ?, ?, ?, ?, ?)",
                     (record.started, record.seconds, record.outcome,
                      json.dumps(dict(record.states), sort_keys=True), record.eligible,
                      json.dumps(dict(record.held), sort_keys=True)))
        conn.execute("DELETE FROM cycles WHERE id <= (SELECT MAX(id) FROM cycles) - ?",
                     (CYCLES_KEPT,))
        tally.add(conn, "cycles", {"outcome": record.outcome})
        if record.outcome != "skipped":
            tally.observe(conn, "cycle_seconds", {}, record.seconds, CYCLE_BUCKETS)


# -- reading: from a Store or a (read-only) connection ------------------------------
def _select(source, sql: str, params=()) -> List[tuple]:
    """Rows of ``sql``; none when the journal was never written (no such table)."""
    try:
        return conn_of(source).execute(sql, params).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise


def events(store, host: str, since: Optional[float] = None) -> List[PowerEvent]:
    """``host``'s power events, oldest first (from ``since`` when given)."""
    rows = _select(store, "SELECT time, host, kind, event, seconds, reason FROM power_events"
                   " WHERE host = ? AND time >= ? ORDER BY id",
                   (host, float(since) if since is not None else float("-inf")))
    return [PowerEvent(*row) for row in rows]


def last_cycles(store, limit: int = 1) -> List[CycleRecord]:
    """The newest ``limit`` cycle records, newest first."""
    rows = _select(store, "SELECT started, seconds, outcome, states, eligible, held FROM cycles"
                   " ORDER BY id DESC LIMIT ?", (int(limit),))
    return [CycleRecord(s, d, o, json.loads(st), e, json.loads(h))
            for s, d, o, st, e, h in rows]


def last_census(store) -> Optional[CycleRecord]:
    """The newest cycle that counted hosts (a skipped or failed pass counts none)."""
    rows = _select(store, "SELECT started, seconds, outcome, states, eligible, held FROM cycles"
                   " WHERE states != '{}' ORDER BY id DESC LIMIT 1")
    return CycleRecord(rows[0][0], rows[0][1], rows[0][2], json.loads(rows[0][3]), rows[0][4],
                       json.loads(rows[0][5])) if rows else None


def saving_now(store) -> Dict[str, Tuple[str, float, float]]:
    """Hosts saving power now: ``{host: (kind, since, watts)}``."""
    return {h: (k, s, w) for h, k, s, w in
            _select(store, "SELECT host, kind, since, watts FROM saving_now")}


def energy_saved(store, since: float, now: Optional[float] = None) -> float:
    """Joules saved from ``since`` to ``now``: kept intervals and open ones, clipped."""
    now = time.time() if now is None else now
    closed = _select(store, "SELECT COALESCE(SUM((MIN(end, ?) - MAX(start, ?)) * watts), 0)"
                     " FROM savings WHERE end > ? AND start < ?", (now, since, since, now))
    open_ = _select(store, "SELECT COALESCE(SUM((? - MAX(since, ?)) * watts), 0) "
                    "FROM saving_now WHERE since < ?", (now, since, now))
    return (float(closed[0][0]) if closed else 0.0) + (float(open_[0][0]) if open_ else 0.0)


def open_saving(store, now: float) -> Tuple[float, float]:
    """(joules saved so far by hosts still down, watts they save now)."""
    rows = _select(store, "SELECT COALESCE(SUM((? - since) * watts), 0), "
                   "COALESCE(SUM(watts), 0) FROM saving_now WHERE since < ?", (now, now))
    if not rows:
        return 0.0, 0.0
    return float(max(0.0, rows[0][0])), float(rows[0][1])


def tallies(store) -> Dict[str, Dict[tally.Labels, float]]:
    """Every counter and histogram row of the state database."""
    return tally.read_all(conn_of(store))
