"""The GPU power limits pbs_power replaced on this node, so they can be restored exactly.

Every agent run is a new process (a job's activation and its deactivation are
two), so the limit a GPU had before pbs_power first changed it is kept in
``<state_dir>/nvml_gpu_caps.json``, keyed by GPU UUID (indices can change
across reboots): ``{"version": 1, "gpus": {UUID: {"index": 0, "previous_mw":
700000, "set_mw": 300000, "changed": EPOCH}}}``. A restore sets
``previous_mw`` back and forgets the entry. Runs take an exclusive lock
(``nvml_gpu_caps.lock``) for the whole read-change-write, and the file is
replaced atomically, so concurrent runs and crashes never lose a saved limit.
A file that cannot be read is an error, never silently dropped: it holds the
only record of the original limits.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from typing import Any, Callable, Dict, Iterator

STATE_FILE = "nvml_gpu_caps.json"
LOCK_FILE = "nvml_gpu_caps.lock"
VERSION = 1


class CapStateError(Exception):
    """The saved-limits file cannot be read or written."""


class SavedLimits:
    """UUID -> saved entry, as read under the lock; written back when it changed."""

    def __init__(self, gpus: Dict[str, Dict[str, Any]],
                 writer: Callable[[Dict[str, Dict[str, Any]]], None]) -> None:
        self.gpus = gpus
        self.changed = False
        self._writer = writer

    def flush(self) -> None:
        """Write the entries now if they changed (before touching a GPU: write-ahead)."""
        if self.changed:
            self._writer(self.gpus)
            self.changed = False

    def get(self, uuid: str) -> Dict[str, Any]:
        return self.gpus.get(uuid, {})

    def remember(self, uuid: str, index: int, previous_mw: int, set_mw: int,
                 when: float) -> None:
        """Record a change; the first previous limit is kept across later changes."""
        entry = dict(self.gpus.get(uuid) or {"previous_mw": int(previous_mw)})
        entry.update(index=int(index), set_mw=int(set_mw), changed=float(when))
        self.gpus[uuid] = entry
        self.changed = True

    def forget(self, uuid: str) -> None:
        if self.gpus.pop(uuid, None) is not None:
            self.changed = True


class CapState:
    """The saved-limits file of one state directory."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = os.path.abspath(state_dir)
        self.path = os.path.join(self.state_dir, STATE_FILE)

    def read(self) -> Dict[str, Dict[str, Any]]:
        """The saved entries now (no lock: for display)."""
        return self._load()

    @contextlib.contextmanager
    def locked(self) -> Iterator[SavedLimits]:
        """The saved entries under an exclusive lock; written back on a clean exit."""
        try:
            os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
            lock = open(os.path.join(self.state_dir, LOCK_FILE), "a")
        except OSError as exc:
            raise CapStateError("cannot use state directory %s: %s"
                                % (self.state_dir, exc.strerror or exc)) from None
        with lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            saved = SavedLimits(self._load(), self._write)
            yield saved
            saved.flush()

    def _load(self) -> Dict[str, Dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise CapStateError("cannot read %s: %s" % (self.path, exc.strerror)) from None
        try:
            doc = json.loads(raw.decode("utf-8"))
            gpus = doc["gpus"]
            if doc.get("version") != VERSION or not isinstance(gpus, dict):
                raise ValueError("not a version %d file" % VERSION)
            for uuid, entry in gpus.items():
                int(entry["previous_mw"]), int(entry["index"])
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise CapStateError("%s is unreadable (%s: %s); it records the GPU limits to "
                                "restore: check them with nvidia-smi, then move it away"
                                % (self.path, type(exc).__name__, exc)) from None
        return gpus

    def _write(self, gpus: Dict[str, Dict[str, Any]]) -> None:
        doc = json.dumps({"version": VERSION, "gpus": gpus}, indent=1, sort_keys=True)
        try:
            fd, tmp = tempfile.mkstemp(prefix=".nvml_gpu_caps.", dir=self.state_dir)
            with os.fdopen(fd, "w") as f:
                f.write(doc + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            raise CapStateError("cannot write %s: %s" % (self.path, exc.strerror or exc)) \
                from None
