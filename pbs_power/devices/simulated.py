"""SIMULATED power backend: a pretend fleet that touches no hardware.

The default backend, for demos, tests and the trace-driven simulator. It
keeps, per host, the last transition it was asked for (from, to, started,
duration) in SQLite at ``<state_dir>/simulated_fleet.db``, because every hook
run is a new process, and computes each host's state at the caller's ``now``
(never the wall clock, so a simulated clock can drive it). A host it has
never been asked about is ON, since before anything it knows (``since=None``).

Options (``power_backend.options``, all optional): ``boot_seconds`` (300),
``boot_jitter_seconds`` (0: each host gets a fixed boot time in
[boot - jitter, boot + jitter] from a hash of its name and ``seed``),
``wake_seconds`` (30), ``shutdown_seconds`` (60), ``sleep_seconds`` (10),
``seed`` (0) and ``fail_nodes`` (hostlist expression: those hosts accept
power_on and wake but never reach ON; they stay TRANSITIONING).
"""
from __future__ import annotations

import hashlib
import math
import os
import sqlite3
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from pbs_power.states.model import PowerState, TransitionKind
from pbs_power.states.sqlite import StoreError, connect
from .base import BackendError, HostPower, PowerBackend, Result

FLEET_DB = "simulated_fleet.db"
_FLEET_SCHEMA = 1
_BUSY_TIMEOUT_S = 10.0
_CHUNK = 500  # stay below SQLite's oldest host-parameter limit (999)

ON, OFF = PowerState.ON, PowerState.OFF
ASLEEP, TRANSITIONING = PowerState.ASLEEP, PowerState.TRANSITIONING

#: kind -> (state it starts from, state it leads to)
MOVES: Dict[TransitionKind, Tuple[PowerState, PowerState]] = {
    TransitionKind.POWER_ON: (OFF, ON),
    TransitionKind.POWER_OFF: (ON, OFF),
    TransitionKind.SLEEP: (ON, ASLEEP),
    TransitionKind.WAKE: (ASLEEP, ON),
}


@dataclass(frozen=True)
class SimOptions:
    """Timing model of the simulated fleet (seconds)."""

    boot_seconds: float = 300.0
    boot_jitter_seconds: float = 0.0
    wake_seconds: float = 30.0
    shutdown_seconds: float = 60.0
    sleep_seconds: float = 10.0
    seed: str = "0"
    fail_nodes: FrozenSet[str] = frozenset()

    @classmethod
    def parse(cls, options: Optional[Mapping[str, Any]]) -> "SimOptions":
        """Validate ``power_backend.options``; BackendError names a bad one."""
        options = dict(options or {})
        known = ("boot_seconds", "boot_jitter_seconds", "wake_seconds",
                 "shutdown_seconds", "sleep_seconds", "seed", "fail_nodes")
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise BackendError(f"power backend 'simulated': unknown option(s) "
                               f"{', '.join(map(repr, unknown))} (known: "
                               f"{', '.join(known)})")
        values: Dict[str, Any] = {name: _seconds(name, options[name])
                                  for name in known[:5] if name in options}
        if "seed" in options:
            values["seed"] = str(options["seed"])
        if "fail_nodes" in options:
            values["fail_nodes"] = _hostlist("fail_nodes", options["fail_nodes"])
        parsed = cls(**values)
        if parsed.boot_jitter_seconds > parsed.boot_seconds:
            raise BackendError("power backend 'simulated': option "
                               "boot_jitter_seconds must not exceed "
                               "boot_seconds")
        return parsed

    def boot_seconds_of(self, host: str) -> float:
        """This host's fixed boot time: boot +/- jitter, from hash(seed, host)."""
        if not self.boot_jitter_seconds:
            return self.boot_seconds
        digest = hashlib.sha256(f"{self.seed}\0{host}".encode()).digest()
        fraction = int.from_bytes(digest[:8], "big") / 2.0 ** 64  # [0, 1)
        return self.boot_seconds + self.boot_jitter_seconds * (2 * fraction - 1)

    def duration(self, kind: TransitionKind, host: str) -> Optional[float]:
        """Seconds ``kind`` takes on ``host``; None if it never completes."""
        if MOVES[kind][1] is ON and host in self.fail_nodes:
            return None
        if kind is TransitionKind.POWER_ON:
            return self.boot_seconds_of(host)
        if kind is TransitionKind.POWER_OFF:
            return self.shutdown_seconds
        if kind is TransitionKind.SLEEP:
            return self.sleep_seconds
        return self.wake_seconds


def _seconds(name: str, value: Any) -> float:
    """A finite number >= 0 (numeric strings allowed, as in the hook config)."""
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not (math.isfinite(number) and number >= 0):
        raise BackendError(f"power backend 'simulated': option {name} must be "
                           f"a finite number of seconds >= 0, not {value!r}")
    return number


def _hostlist(name: str, value: Any) -> FrozenSet[str]:
    """Expand a hostlist expression (or a list of them) with ClusterShell."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        value = ",".join(value)
    if not isinstance(value, str):
        raise BackendError(f"power backend 'simulated': option {name} must be "
                           f"a hostlist expression, not {value!r}")
    if not value.strip():
        return frozenset()
    from ClusterShell.NodeSet import NodeSet, NodeSetException
    try:
        return frozenset(NodeSet(value))
    except NodeSetException as exc:
        raise BackendError(f"power backend 'simulated': option {name}: bad "
                           f"hostlist {value!r} ({exc})") from None


@dataclass(frozen=True)
class HostRecord:
    """The last transition a host was asked for; its state follows from ``now``."""

    origin: PowerState
    target: PowerState
    started: float
    duration: Optional[float]  # None: never completes (fail_nodes)

    def at(self, now: float) -> HostPower:
        if self.duration is not None and now >= self.started + self.duration:
            return HostPower(self.target, self.started + self.duration)
        return HostPower(TRANSITIONING, self.started)


class SimulatedFleet:
    """The persisted state of every simulated host (SIMULATED, no hardware)."""

    def __init__(self, path: str, options: SimOptions) -> None:
        self.path = os.path.abspath(path)
        self.options = options
        try:
            self._conn = connect(self.path, _BUSY_TIMEOUT_S)
        except (sqlite3.Error, StoreError) as exc:
            raise self._error(exc) from None
        try:
            self._setup()
        except BaseException:
            self._conn.close()
            raise

    def _error(self, exc: BaseException) -> BackendError:
        return BackendError(f"simulated fleet database {self.path}: {exc}; "
                            f"if it is corrupt, delete it (the simulated "
                            f"fleet restarts with every host on)")

    def _setup(self) -> None:
        try:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                conn.execute("CREATE TABLE hosts (host TEXT PRIMARY KEY, "
                             "origin TEXT NOT NULL, target TEXT NOT NULL, "
                             "started REAL NOT NULL, duration REAL)")
                conn.execute(f"PRAGMA user_version = {_FLEET_SCHEMA}")
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._error(exc) from None
        if version > _FLEET_SCHEMA:
            raise BackendError(f"simulated fleet database {self.path} was "
                               f"written by a newer pbs_power (schema "
                               f"{version}); delete it or upgrade")

    def _records(self, hosts: Sequence[str]) -> Dict[str, HostRecord]:
        rows: List[tuple] = []
        unique = sorted({h for h in hosts if isinstance(h, str)})
        for i in range(0, len(unique), _CHUNK):
            chunk = unique[i:i + _CHUNK]
            rows += self._conn.execute(
                "SELECT host, origin, target, started, duration FROM hosts "
                f"WHERE host IN ({','.join('?' * len(chunk))})", chunk).fetchall()
        return {row[0]: _record(row) for row in rows}

    def status(self, hosts: Sequence[str], now: float) -> Dict[str, HostPower]:
        """State of each host at ``now`` (never-seen hosts are ON)."""
        try:
            records = self._records(hosts)
        except (sqlite3.Error, ValueError) as exc:
            raise self._error(exc) from None
        return {host: records[host].at(now) if host in records
                else HostPower(ON, None) for host in hosts}

    def snapshot(self, now: float) -> Dict[str, HostPower]:
        """State at ``now`` of every host the fleet has been asked about."""
        try:
            rows = self._conn.execute("SELECT host, origin, target, started, "
                                      "duration FROM hosts ORDER BY host").fetchall()
            records = [(row[0], _record(row)) for row in rows]
        except (sqlite3.Error, ValueError) as exc:
            raise self._error(exc) from None
        return {host: record.at(now) for host, record in records}

    def request(self, kind: TransitionKind, hosts: Sequence[str],
                now: float) -> Dict[str, Result]:
        """Start ``kind`` on each host at ``now``, atomically for the batch."""
        kind = TransitionKind(kind)
        now = float(now)
        results: Dict[str, Result] = {}
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                records = self._records(hosts)
                for host in hosts:
                    if host not in results:
                        results[host] = self._start(kind, host, records.get(host), now)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        except (sqlite3.Error, ValueError) as exc:
            raise self._error(exc) from None
        return results

    def _start(self, kind: TransitionKind, host: str,
               record: Optional[HostRecord], now: float) -> Result:
        """Decide and store one host's request; the Result explains it."""
        if not isinstance(host, str) or not host:
            return Result(False, f"invalid host name {host!r}")
        origin, target = MOVES[kind]
        current = record.at(now) if record else HostPower(ON, None)
        if current.state is target:
            return Result(True, f"already {target.value}")
        heading = record.target if record and current.state is TRANSITIONING else None
        if heading is target:
            return Result(True, f"already transitioning to {target.value} "
                                f"(since {record.started})")
        if current.state is origin:
            diag = f"{kind.value} started"
        elif kind is TransitionKind.POWER_OFF and heading is ON:
            diag = "hard power off: aborted the transition to on"
        else:
            where = f" to {heading.value}" if heading else ""
            return Result(False, f"cannot {kind.value}: host is "
                                 f"{current.state.value}{where}")
        duration = self.options.duration(kind, host)
        self._conn.execute("INSERT OR REPLACE INTO hosts VALUES (?, ?, ?, ?, ?)",
                           (host, current.state.value, target.value, now, duration))
        return Result(True, diag)

    def close(self) -> None:
        self._conn.close()


def _record(row: tuple) -> HostRecord:
    _host, origin, target, started, duration = row
    return HostRecord(PowerState(origin), PowerState(target), started, duration)


class SimulatedBackend(PowerBackend):
    """SIMULATED backend (``power_backend.type = "simulated"``): no hardware."""

    name = "simulated"

    def __init__(self, options: Optional[Mapping[str, Any]], state_dir: str) -> None:
        self.options = SimOptions.parse(options)
        try:
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise BackendError(f"power backend 'simulated': cannot create "
                               f"state directory {state_dir} "
                               f"({exc.strerror})") from None
        self.fleet = SimulatedFleet(os.path.join(state_dir, FLEET_DB), self.options)

    def request(self, kind: TransitionKind, hosts: Sequence[str],
                now: float) -> Dict[str, Result]:
        return self.fleet.request(kind, hosts, now)

    def status(self, hosts: Sequence[str], now: float) -> Dict[str, HostPower]:
        return self.fleet.status(hosts, now)

    def close(self) -> None:
        self.fleet.close()
