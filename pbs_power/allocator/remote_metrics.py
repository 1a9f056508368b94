"""A held cluster's metrics from the HTTP metrics service, fetched in the background.

A slow or hanging metrics service must not hold up requests: a view read
starts a fetch when the last one is older than ``refresh_seconds`` and
waits at most ``wait_seconds`` for it; past that it goes on with the
metrics of the previous fetch (or none) and a note says so.
"""
from __future__ import annotations

import threading
import time
from typing import Any, List, Optional, Tuple


class RemoteMetrics:
    """The latest answer of ``client.get_cluster(cluster_id)``; thread-safe."""

    def __init__(self, client: Any, cluster_id: str, refresh_seconds: float,
                 wait_seconds: float = 0.5):
        self.client = client
        self.cluster_id = cluster_id
        self.refresh_seconds = refresh_seconds
        self.wait_seconds = wait_seconds
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._value: Optional[Any] = None
        self._error: Optional[str] = None
        self._fetched: Optional[float] = None     # time.monotonic() of the last answer
        self._running = False

    def latest(self) -> Tuple[Optional[Any], List[str]]:
        """(the latest metrics or None, notes); starts a fetch when due, waits briefly."""
        with self._lock:
            now = time.monotonic()
            due = self._fetched is None or now - self._fetched >= self.refresh_seconds
            if due and not self._running:
                self._running = True
                self._done = threading.Event()
                threading.Thread(target=self._fetch, name="allocator-metrics",
                                 daemon=True).start()
            done = self._done
        done.wait(self.wait_seconds)
        with self._lock:
            notes: List[str] = []
            if self._error is not None:
                notes.append("metrics service: %s" % self._error)
            if self._running:
                if self._fetched is None:
                    notes.append("metrics service: no answer within %g s yet, deciding "
                                 "without its metrics" % self.wait_seconds)
                else:
                    notes.append("metrics service slow: using its metrics of %.0f s ago"
                                 % (time.monotonic() - self._fetched))
            return self._value, notes

    def _fetch(self) -> None:
        try:
            value, error = self.client.get_cluster(self.cluster_id), None
        except Exception as exc:  # HTTP errors, APIError, bad JSON: the local view still serves
            value, error = None, "%s: %s" % (type(exc).__name__, exc)
        with self._lock:
            if error is None:
                self._value = value
            self._error = error
            self._fetched = time.monotonic()
            self._running = False
            self._done.set()
