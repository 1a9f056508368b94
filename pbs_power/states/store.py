"""Persistent state in SQLite: what must survive from one hook run to the next.

Every periodic hook run (and every Slurm Suspend/ResumeProgram) is a fresh
process, two runs may overlap and any of them may be killed at any point, so
the store uses WAL mode, a busy timeout and explicit ``BEGIN IMMEDIATE``
transactions: a read-modify-write done inside ``store.transaction()`` is
atomic across processes, and a killed process leaves the previous committed
state behind.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import sqlite3
import time
from typing import (Dict, Iterable, Iterator, List, Optional, Sequence,
                    Tuple, Union)

from .model import Phase, RampStep, Transition, TransitionKind
from .sqlite import (  # noqa: F401  (StoreError and the rest are this store's API too)
    BUSY_TIMEOUT_S, StoreError, check_writable_dir, connect, database_error,
)

DB_NAME = "pbs_power.db"
#: The schema this code reads and writes; see ``_MIGRATIONS``.
SCHEMA_VERSION = 1
#: Measurements kept per host and kind, and how many of them the estimate uses.
DURATION_HISTORY = 20
ESTIMATE_WINDOW = 10
ESTIMATE_PERCENT = 90
#: Hosts with a measurement needed before a fleet-wide estimate is given.
FLEET_MIN_HOSTS = 3
#: Ramp steps older than this (relative to the newest one written) are pruned.
STEP_RETENTION_S = 3600.0

_LOCK_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")

# Each entry moves the schema from version N-1 to N; append, never edit.
_MIGRATIONS: Tuple[Tuple[int, Tuple[str, ...]], ...] = (
    (1, (
        "CREATE TABLE transitions (host TEXT PRIMARY KEY, kind TEXT NOT NULL,"
        " phase TEXT NOT NULL, started REAL NOT NULL,"
        " phase_since REAL NOT NULL, reason TEXT NOT NULL DEFAULT '')",
        "CREATE TABLE durations (id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " host TEXT NOT NULL, kind TEXT NOT NULL, started REAL NOT NULL,"
        " seconds REAL NOT NULL)",
        "CREATE INDEX durations_host_kind ON durations (host, kind, started)",
        "CREATE TABLE down_since (host TEXT PRIMARY KEY, since REAL NOT NULL)",
        "CREATE TABLE ramp_steps (id INTEGER PRIMARY KEY AUTOINCREMENT,"
        " time REAL NOT NULL, host TEXT NOT NULL, watts REAL NOT NULL)",
        "CREATE INDEX ramp_steps_time ON ramp_steps (time)",
        "CREATE TABLE failed_hosts (host TEXT PRIMARY KEY,"
        " reason TEXT NOT NULL, since REAL NOT NULL)",
    )),
)

KindLike = Union[TransitionKind, str]


def nearest_rank(values: Sequence[float], percent: int) -> float:
    """The ``percent``-th percentile of ``values`` by the nearest-rank method."""
    if not values:
        raise ValueError("nearest_rank() needs at least one value")
    ordered = sorted(values)
    return ordered[nearest_rank_index(len(ordered), percent)]


def nearest_rank_index(count: int, percent: int) -> int:
    """Where the ``percent``-th percentile sits in ``count`` sorted values."""
    return max(1, (percent * count + 99) // 100) - 1  # ceil without floats


class Store:
    """The hook's state database (``<state_dir>/pbs_power.db``)."""

    def __init__(self, path: str, timeout: float = BUSY_TIMEOUT_S) -> None:
        self.path = os.path.abspath(path)
        self.state_dir = os.path.dirname(self.path)
        self.timeout = timeout
        self._depth = 0
        check_writable_dir(self.state_dir)
        if os.path.exists(self.path) and not os.access(self.path, os.W_OK):
            raise StoreError(f"state database {self.path} is not writable; "
                             f"fix its owner/permissions")
        try:
            self._conn = connect(self.path, timeout)
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        try:
            self._migrate()
        except BaseException:
            self._conn.close()
            raise

    @classmethod
    def open(cls, state_dir: str, timeout: float = BUSY_TIMEOUT_S) -> "Store":
        """Open (creating if needed, mode 0700) ``state_dir`` and its database."""
        state_dir = os.path.abspath(state_dir)
        if not os.path.isdir(state_dir):
            try:
                os.makedirs(state_dir, mode=0o700, exist_ok=True)
                os.chmod(state_dir, 0o700)  # makedirs' mode is masked by umask
            except OSError as exc:
                raise StoreError(f"cannot create state directory {state_dir} "
                                 f"({exc.strerror}); create it or set "
                                 f"state_dir") from None
        return cls(os.path.join(state_dir, DB_NAME), timeout=timeout)

    # -- plumbing ---------------------------------------------------------

    def _error(self, exc: BaseException) -> StoreError:
        """Turn an sqlite3 error into a StoreError that says what to do."""
        text = str(exc)
        if isinstance(exc, sqlite3.OperationalError) and (
                "locked" in text or "busy" in text):
            return StoreError(f"state database {self.path} stayed locked by "
                              f"another process for more than "
                              f"{self.timeout:g} s ({text}); check for hung "
                              f"pbs_power processes")
        return database_error(self.path, exc)

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise self._error(exc) from None


    def _read_version(self) -> int:
        """Schema version of the file; 0 for a new, empty database."""
        if not self._conn.execute("SELECT 1 FROM sqlite_master WHERE "
                                  "name = 'schema_version'").fetchone():
            return 0
        row = self._conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        return row[0] or 0

    def _check_version(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"state database {self.path} has schema version {version}, "
                f"written by a newer pbs_power; this one understands up to "
                f"{SCHEMA_VERSION}: upgrade pbs_power or point state_dir "
                f"elsewhere")

    def _migrate(self) -> None:
        """Apply missing migrations in order; refuse a newer schema."""
        with self._guard():
            version = self._read_version()
        self._check_version(version)
        if version == SCHEMA_VERSION:
            return  # the common case takes no write lock
        with self.transaction():
            self._conn.execute("CREATE TABLE IF NOT EXISTS schema_version ("
                               "version INTEGER PRIMARY KEY, "
                               "applied REAL NOT NULL)")
            version = self._read_version()  # another process may have won
            self._check_version(version)
            for target, statements in _MIGRATIONS:
                if target > version:
                    for sql in statements:
                        self._conn.execute(sql)
                    self._conn.execute("INSERT INTO schema_version VALUES (?, ?)",
                                       (target, time.time()))

    @contextlib.contextmanager
    def transaction(self) -> Iterator["Store"]:
        """Atomic block (``BEGIN IMMEDIATE``); nested blocks are savepoints.

        Everything the store writes inside the block commits together or not
        at all; other processes wait (up to the busy timeout) to write.
        """
        depth = self._depth
        with self._guard():
            self._conn.execute("BEGIN IMMEDIATE" if depth == 0
                               else f"SAVEPOINT sp{depth}")
        self._depth = depth + 1
        try:
            with self._guard():
                yield self
            self._depth = depth
            with self._guard():
                self._conn.execute("COMMIT" if depth == 0
                                   else f"RELEASE sp{depth}")
        except BaseException:
            self._depth = depth
            self._undo(depth)
            raise

    def _undo(self, depth: int) -> None:
        """Roll back the block at ``depth``; never masks the original error."""
        if not self._conn.in_transaction:
            return
        try:
            if depth == 0:
                self._conn.execute("ROLLBACK")
            else:
                self._conn.execute(f"ROLLBACK TO sp{depth}")
                self._conn.execute(f"RELEASE sp{depth}")
        except sqlite3.Error:
            pass

    def _rows(self, sql: str, params: Sequence = ()) -> List[tuple]:
        with self._guard():
            return self._conn.execute(sql, params).fetchall()

    def _write(self, sql: str, params: Sequence = ()) -> None:
        with self.transaction():
            self._conn.execute(sql, params)

    @contextlib.contextmanager
    def cycle_lock(self, name: str = "cycle") -> Iterator[bool]:
        """Non-blocking exclusive lock on ``<state_dir>/<name>.lock``.

        Yields True when acquired, False when another process holds it (an
        overlapping hook run then does nothing). The kernel drops the lock if
        the holder dies.
        """
        if not _LOCK_NAME.match(name):
            raise ValueError(f"invalid lock name {name!r}: use letters, "
                             f"digits, '_', '-' and '.'")
        lock_path = os.path.join(self.state_dir, name + ".lock")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot open lock file {lock_path} "
                             f"({exc.strerror})") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
                yield False
                return
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            try:
                yield True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    @property
    def connection(self) -> sqlite3.Connection:
        """The open connection, for modules that keep tables of their own in this
        file (`journal`); write through it only inside ``transaction()``."""
        return self._conn

    def close(self) -> None:
        """Close the connection (an open transaction is rolled back)."""
        self._conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- transitions ------------------------------------------------------

    def transitions(self) -> Tuple[Transition, ...]:
        """Every power transition in flight, by host name."""
        rows = self._rows("SELECT host, kind, phase, started, phase_since, "
                          "reason FROM transitions ORDER BY host")
        return tuple(self._transition(row) for row in rows)

    def _transition(self, row: tuple) -> Transition:
        host, kind, phase, started, phase_since, reason = row
        try:
            return Transition(host, TransitionKind(kind), Phase(phase),
                              started, phase_since, reason)
        except ValueError as exc:
            raise StoreError(f"state database {self.path}: bad transition "
                             f"row for host {host!r} ({exc})") from None

    def put_transition(self, t: Transition) -> None:
        """Insert or replace the transition of ``t.host``."""
        self._write("INSERT OR REPLACE INTO transitions VALUES (?, ?, ?, ?, ?, ?)",
                    (t.host, TransitionKind(t.kind).value, Phase(t.phase).value,
                     float(t.started), float(t.phase_since), t.reason))

    def drop_transition(self, host: str) -> None:
        """Forget the transition of ``host`` (no error if there is none)."""
        self._write("DELETE FROM transitions WHERE host = ?", (host,))

    # -- measured durations -----------------------------------------------

    def record_duration(self, host: str, kind: KindLike, started: float,
                        seconds: float) -> None:
        """Remember how long a transition took; keeps the newest 20 per kind."""
        kind_value = TransitionKind(kind).value
        seconds = float(seconds)
        if not (0.0 <= seconds < float("inf")):
            raise ValueError(f"duration of {kind_value} on {host} must be a "
                             f"finite number of seconds >= 0, not {seconds!r}")
        with self.transaction():
            self._conn.execute("INSERT INTO durations (host, kind, started, "
                               "seconds) VALUES (?, ?, ?, ?)",
                               (host, kind_value, float(started), seconds))
            self._conn.execute(
                "DELETE FROM durations WHERE host = ? AND kind = ? AND id NOT IN "
                "(SELECT id FROM durations WHERE host = ? AND kind = ? "
                "ORDER BY started DESC, id DESC LIMIT ?)",
                (host, kind_value, host, kind_value, DURATION_HISTORY))

    def durations(self, host: str, kind: KindLike) -> Tuple[float, ...]:
        """Recorded durations of ``host`` for ``kind``, newest first."""
        rows = self._rows("SELECT seconds FROM durations WHERE host = ? AND "
                          "kind = ? ORDER BY started DESC, id DESC",
                          (host, TransitionKind(kind).value))
        return tuple(row[0] for row in rows)

    def _history(self, kind: Optional[KindLike]) -> Dict[Tuple[str, str], List[float]]:
        """Durations per (host, kind), newest first."""
        sql = "SELECT host, kind, seconds FROM durations"
        params: Tuple = ()
        if kind is not None:
            sql += " WHERE kind = ?"
            params = (TransitionKind(kind).value,)
        history: Dict[Tuple[str, str], List[float]] = {}
        for host, kind_value, seconds in self._rows(
                sql + " ORDER BY host, kind, started DESC, id DESC", params):
            history.setdefault((host, kind_value), []).append(seconds)
        return history

    def duration_estimates(self, kind: Optional[KindLike] = None
                           ) -> Dict[str, Dict[str, float]]:
        """Conservative durations: p90 (nearest rank) of each host's last 10.

        Shaped like ``Snapshot.boot_times``: ``{host: {kind value: seconds}}``.
        """
        estimates: Dict[str, Dict[str, float]] = {}
        for (host, kind_value), values in self._history(kind).items():
            estimates.setdefault(host, {})[kind_value] = nearest_rank(
                values[:ESTIMATE_WINDOW], ESTIMATE_PERCENT)
        return estimates

    def fleet_duration_estimate(self, kind: KindLike) -> Optional[float]:
        """p90 over every host's latest ``kind`` duration; None under 3 hosts."""
        latest = [values[0] for values in self._history(kind).values()]
        if len(latest) < FLEET_MIN_HOSTS:
            return None
        return nearest_rank(latest, ESTIMATE_PERCENT)

    # -- host power record ------------------------------------------------

    def set_down_since(self, host: str, since: Optional[float]) -> None:
        """Record when ``host`` went down; None clears the record."""
        if since is None:
            self._write("DELETE FROM down_since WHERE host = ?", (host,))
        else:
            self._write("INSERT OR REPLACE INTO down_since VALUES (?, ?)",
                        (host, float(since)))

    def down_since(self) -> Dict[str, float]:
        """When each host recorded as down went down."""
        return dict(self._rows("SELECT host, since FROM down_since ORDER BY host"))

    # -- ramp steps -------------------------------------------------------

    def record_steps(self, steps: Iterable[RampStep]) -> None:
        """Append power steps; prune those an hour older than the newest."""
        rows = [(float(s.time), s.host, float(s.watts)) for s in steps]
        if not rows:
            return
        newest = max(row[0] for row in rows)
        with self.transaction():
            self._conn.executemany("INSERT INTO ramp_steps (time, host, watts) "
                                   "VALUES (?, ?, ?)", rows)
            self._conn.execute("DELETE FROM ramp_steps WHERE time < ?",
                               (newest - STEP_RETENTION_S,))

    def recent_steps(self, since: float) -> Tuple[RampStep, ...]:
        """Steps at or after ``since``, oldest first."""
        rows = self._rows("SELECT time, host, watts FROM ramp_steps WHERE "
                          "time >= ? ORDER BY time, id", (float(since),))
        return tuple(RampStep(*row) for row in rows)

    # -- failed hosts -----------------------------------------------------

    def mark_failed(self, host: str, reason: str, when: float) -> None:
        """Record that ``host`` failed a transition, so it is not retried."""
        self._write("INSERT OR REPLACE INTO failed_hosts VALUES (?, ?, ?)",
                    (host, reason, float(when)))

    def failed(self) -> Dict[str, Tuple[str, float]]:
        """Failed hosts: ``{host: (reason, when)}``."""
        rows = self._rows("SELECT host, reason, since FROM failed_hosts ORDER BY host")
        return {host: (reason, since) for host, reason, since in rows}

    def clear_failed(self, host: str) -> None:
        """Forget that ``host`` failed (an admin fixed it, or it came back)."""
        self._write("DELETE FROM failed_hosts WHERE host = ?", (host,))
