"""Counters and histograms kept in a SQLite file, for the metrics exporter.

The hooks and programs are short-lived processes, so what a long-running
server would hold in memory (how many transitions failed, how long boots
took) is added up here instead, inside the caller's transaction, and read
by ``pbs-power exporter``. A counter is one row per name and label set, a
histogram one row per bucket plus its sum and count: the size is bounded by
the label values, never by how often something happens.
"""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Dict, Iterable, List, Mapping, Sequence, Tuple

TABLE_SQL = ("CREATE TABLE IF NOT EXISTS tallies (name TEXT NOT NULL, labels TEXT NOT NULL,"
             " value REAL NOT NULL, PRIMARY KEY (name, labels))")
_ADD_SQL = ("INSERT INTO tallies (name, labels, value) VALUES (?, ?, ?) "
            "ON CONFLICT (name, labels) DO UPDATE SET value = value + excluded.value")
#: Marks the rows of a histogram: ``name`` + one of these.
BUCKET, SUM, COUNT = ":bucket", ":sum", ":count"
INF = float("inf")

Labels = Tuple[Tuple[str, str], ...]


def encode_labels(labels: Mapping[str, str]) -> str:
    """``{"kind": "wake"}`` -> ``"kind=wake"`` (sorted; ValueError for a ``,`` or ``=``)."""
    for key, value in labels.items():
        if "," in key or "=" in key or "," in str(value):
            raise ValueError("tally label %s=%r: names and values must not hold ','"
                             " (nor names '=')" % (key, value))
    return ",".join("%s=%s" % (k, labels[k]) for k in sorted(labels))


def decode_labels(text: str) -> Labels:
    """The inverse of `encode_labels`, as sorted (name, value) pairs."""
    if not text:
        return ()
    return tuple(tuple(item.split("=", 1)) for item in text.split(","))  # type: ignore


def ensure(conn: sqlite3.Connection) -> None:
    """Create the table if it is missing (cheap: a no-op once it exists)."""
    conn.execute(TABLE_SQL)


def add(conn: sqlite3.Connection, name: str, labels: Mapping[str, str],
        amount: float = 1.0) -> None:
    """Add ``amount`` to counter ``name`` with ``labels``."""
    conn.execute(_ADD_SQL, (name, encode_labels(labels), float(amount)))


def observe(conn: sqlite3.Connection, name: str, labels: Mapping[str, str], value: float,
            buckets: Sequence[float]) -> None:
    """Count ``value`` in histogram ``name`` (cumulative buckets, as Prometheus has them)."""
    value = float(value)
    rows = []
    for bound in list(buckets) + [INF]:
        if value <= bound:
            rows.append((name + BUCKET, encode_labels(dict(labels, le=le_text(bound))), 1.0))
    rows.append((name + SUM, encode_labels(labels), value))
    rows.append((name + COUNT, encode_labels(labels), 1.0))
    conn.executemany(_ADD_SQL, rows)


def le_text(bound: float) -> str:
    """A bucket bound as the ``le`` label shows it: ``10.0``, ``+Inf``."""
    return "+Inf" if bound == INF else repr(float(bound))


@dataclass(frozen=True)
class HistogramValue:
    """One label set of a histogram: cumulative bucket counts, sum and count."""

    labels: Labels
    buckets: Tuple[Tuple[str, float], ...]     # (le, cumulative count), ascending
    sum: float
    count: float


def read_all(conn: sqlite3.Connection) -> Dict[str, Dict[Labels, float]]:
    """Every row: ``{name: {labels: value}}`` (histogram rows under their marked names)."""
    out: Dict[str, Dict[Labels, float]] = {}
    try:
        rows = conn.execute("SELECT name, labels, value FROM tallies").fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return out
        raise
    for name, labels, value in rows:
        out.setdefault(name, {})[decode_labels(labels)] = value
    return out


def counter(rows: Mapping[str, Mapping[Labels, float]], name: str) -> Dict[Labels, float]:
    """A counter's values by label set (empty when it never moved)."""
    return dict(rows.get(name, {}))


def histogram(rows: Mapping[str, Mapping[Labels, float]], name: str,
              buckets: Sequence[float]) -> List[HistogramValue]:
    """A histogram's label sets, each with every bucket (missing ones as 0)."""
    sums = rows.get(name + SUM, {})
    counts = rows.get(name + COUNT, {})
    found = rows.get(name + BUCKET, {})
    out = []
    for labels in sorted(counts):
        with_le = []
        for bound in list(buckets) + [INF]:
            le = le_text(bound)
            key = tuple(sorted(labels + (("le", le),)))
            with_le.append((le, found.get(key, 0.0)))
        out.append(HistogramValue(labels, tuple(with_le), sums.get(labels, 0.0),
                                  counts[labels]))
    return out


def label_values(labels: Labels, names: Iterable[str]) -> List[str]:
    """The values of ``names`` in ``labels``, in that order ('' when absent)."""
    found = dict(labels)
    return [found.get(n, "") for n in names]
