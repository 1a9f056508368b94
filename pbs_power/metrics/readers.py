"""Read what the state stores hold, read-only, into one plain `Observed` record.

The exporter and ``pbs-power status`` never write: they open
``pbs_power.db`` and ``resource_groups.db`` with SQLite's read-only mode, so
a scrape can neither take the hooks' write lock nor create files. A store
that does not exist yet (no cycle ran, no group was ever made) reads as
empty, and says so in ``states_up`` / ``groups_up``.
"""
from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from pbs_power.states import journal, tally
from pbs_power.states.journal import CycleRecord

STATES_DB = "pbs_power.db"
GROUPS_DB = "resource_groups.db"
BUSY_MS = 2000


@dataclass(frozen=True)
class InFlight:
    """A host in transition, as the store keeps it."""

    host: str
    kind: str
    phase: str
    started: float
    phase_since: float
    reason: str


@dataclass(frozen=True)
class Domain:
    """A power domain: watts its members may draw now, against its budget."""

    name: str
    reserved_watts: float
    budget_watts: Optional[float]


@dataclass
class Observed:
    """Everything one scrape or one status screen shows, read at ``now``."""

    now: float
    states_up: bool = False
    groups_up: bool = False
    last_cycle: Optional[CycleRecord] = None
    #: The newest cycle that counted hosts: nodes by state, held back, eligible.
    census: Optional[CycleRecord] = None
    in_flight: List[InFlight] = field(default_factory=list)
    failed: Dict[str, Tuple[str, float]] = field(default_factory=dict)
    tallies: Dict[str, Dict[tally.Labels, float]] = field(default_factory=dict)
    open_saving_joules: float = 0.0
    watts_saved: float = 0.0
    group_tallies: Dict[str, Dict[tally.Labels, float]] = field(default_factory=dict)
    groups_by_status: Dict[str, int] = field(default_factory=dict)
    domains: List[Domain] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)

    @property
    def energy_saved_joules(self) -> float:
        """Counted since the journal began: closed intervals plus hosts down now."""
        closed = sum(tally.counter(self.tallies, "energy_saved_joules").values())
        return closed + self.open_saving_joules


def open_ro(path: str) -> sqlite3.Connection:
    """A read-only connection to ``path``; sqlite3.Error when it cannot be read."""
    if not os.path.exists(path):
        raise sqlite3.OperationalError("%s does not exist (nothing recorded yet)" % path)
    conn = sqlite3.connect("file:%s?mode=ro" % path, uri=True, timeout=BUSY_MS / 1000.0,
                           check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = %d" % BUSY_MS)
    return conn


class Reader:
    """Reads a state directory; keeps the parsed topology between reads (by its stamp)."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = os.path.abspath(state_dir)
        self._topology: Tuple[Optional[float], Any] = (None, None)
        self._lock = threading.Lock()

    def read(self, now: Optional[float] = None) -> Observed:
        """One consistent-enough look at both stores (each read in one transaction)."""
        seen = Observed(time.time() if now is None else now)
        with self._lock:
            self._read_states(seen)
            self._read_groups(seen)
        return seen

    # -- node power states ---------------------------------------------------
    def _read_states(self, seen: Observed) -> None:
        try:
            conn = open_ro(os.path.join(self.state_dir, STATES_DB))
        except sqlite3.Error as exc:
            seen.errors.append("states: %s" % exc)
            return
        try:
            conn.execute("BEGIN")
            cycles = journal.last_cycles(conn, 1)
            seen.last_cycle = cycles[0] if cycles else None
            seen.census = (seen.last_cycle if seen.last_cycle and seen.last_cycle.states
                           else journal.last_census(conn))
            seen.in_flight = [InFlight(*row) for row in _rows(
                conn, "SELECT host, kind, phase, started, phase_since, reason "
                      "FROM transitions ORDER BY started, host")]
            seen.failed = {h: (r, s) for h, r, s in _rows(
                conn, "SELECT host, reason, since FROM failed_hosts ORDER BY host")}
            seen.tallies = tally.read_all(conn)
            seen.open_saving_joules, seen.watts_saved = journal.open_saving(conn, seen.now)
            seen.states_up = True
        except sqlite3.Error as exc:
            seen.errors.append("states: %s" % exc)
        finally:
            conn.close()

    # -- resource groups -----------------------------------------------------
    def _read_groups(self, seen: Observed) -> None:
        try:
            conn = open_ro(os.path.join(self.state_dir, GROUPS_DB))
        except sqlite3.Error as exc:
            seen.errors.append("groups: %s" % exc)
            return
        try:
            conn.execute("BEGIN")
            seen.groups_by_status = dict(_rows(
                conn, "SELECT status, COUNT(*) FROM groups GROUP BY status"))
            seen.group_tallies = tally.read_all(conn)
            seen.domains = self._domains(conn)
            seen.groups_up = True
        except sqlite3.Error as exc:
            seen.errors.append("groups: %s" % exc)
        finally:
            conn.close()

    def _domains(self, conn: sqlite3.Connection) -> List[Domain]:
        budget = self._budget_of(conn)
        if budget is None:
            return []
        alloc = _rows(conn, "SELECT m.entity, m.applied_watts FROM members m JOIN groups g"
                            " ON g.name = m.group_name WHERE g.status IN ('active',"
                            " 'activating', 'deactivating') AND m.applied_watts IS NOT NULL")
        return [Domain(name, watts, limit) for name, watts, limit in budget.usage(alloc)]

    def _budget_of(self, conn: sqlite3.Connection) -> Optional["DomainBudget"]:
        """The stored topology's budget arithmetic, rebuilt only when the topology changed."""
        rows = _rows(conn, "SELECT changed FROM topology WHERE id = 1")
        if not rows:
            return None
        stamp = rows[0][0]
        cached_stamp, cached = self._topology
        if cached is not None and cached_stamp == stamp:
            return cached
        from pbs_power.groups.topology import parse_topology
        doc = json.loads(_rows(conn, "SELECT doc FROM topology WHERE id = 1")[0][0])
        budget = DomainBudget(parse_topology(doc, "stored topology", trusted=True))
        self._topology = (stamp, budget)
        return budget


class DomainBudget:
    """`pbs_power.groups.budget.usage` for one topology, its fixed part computed once.

    Every entity counts its topology policy's watts in each domain above it;
    an active group's member counts its applied watts instead. The fixed
    part (every entity at its topology policy) and each entity's chain are
    kept, so a scrape only walks the chains of the members of active groups.
    """

    def __init__(self, topology) -> None:
        names = sorted(topology.domains)
        index = {name: i for i, name in enumerate(names)}
        self.names = names
        self.limits = [topology.domains[n].budget_watts for n in names]
        self.chains: Dict[str, Tuple[int, ...]] = {}
        self.default: Dict[str, float] = {}
        self.base = [0.0] * len(names)
        for entity in topology.entities:
            chain = tuple(index[d] for d in topology.domain_chain(entity))
            watts = topology.node_watts(entity, topology.topology_policy(entity))
            self.chains[entity], self.default[entity] = chain, watts
            for i in chain:
                self.base[i] += watts

    def usage(self, allocations) -> List[Tuple[str, float, Optional[float]]]:
        """(domain, watts reserved, budget) per domain, given (entity, applied watts) rows."""
        used = list(self.base)
        chains, default = self.chains, self.default
        for entity, watts in allocations:
            chain = chains.get(entity)
            if chain is None:
                continue                     # no longer in the topology: counts nowhere
            delta = watts - default[entity]
            for i in chain:
                used[i] += delta
        return list(zip(self.names, used, self.limits))


def _rows(conn: sqlite3.Connection, sql: str, params=()) -> List[tuple]:
    """Rows of ``sql``; none when the table was never created."""
    try:
        return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise
