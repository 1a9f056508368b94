"""SQLite as every pbs_power database uses it: WAL connections, whole-or-nothing creation,
and errors that name the file and what to do."""
from __future__ import annotations

import os
import sqlite3
import time

#: Seconds a connection waits for another process's lock before it gives up.
BUSY_TIMEOUT_S = 10.0


class StoreError(Exception):
    """The state database cannot be used; the message names the file and a fix."""


def check_writable_dir(path: str) -> None:
    """Raise StoreError unless ``path`` is a directory we can create files in.

    A real file is created and removed: ``os.access`` is fooled by root,
    read-only mounts and ACLs.
    """
    if not os.path.isdir(path):
        raise StoreError(f"state directory {path} does not exist or is not "
                         f"a directory; create it or set state_dir")
    try:
        probe = os.path.join(path, ".pbs_power-probe-%d-%s" % (os.getpid(), os.urandom(6).hex()))
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise StoreError(f"state directory {path} is not writable "
                         f"({exc.strerror}); make it writable by the user "
                         f"the hook runs as or set state_dir") from None
    os.close(fd)
    os.unlink(probe)


SQLITE_HEADER = b"SQLite format 3\x00"


def check_database_file(path: str) -> None:
    """StoreError if ``path`` exists but is empty: a truncated database.

    pbs_power only ever puts a fully formed database at its path (see `connect`),
    so an empty file is damage: starting afresh over it would forget the topology,
    the active groups and the hosts in transition without a word. Only stat() is
    used: opening and closing the file would drop the POSIX locks SQLite holds on
    it in this process (a file that is not SQLite is caught by `connect`).
    """
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"state database {path} cannot be read ({exc.strerror}); "
                         f"fix its owner/permissions") from None
    if size == 0:
        raise StoreError(f"state database {path} is empty (0 bytes): it was truncated or "
                         f"damaged; restore it from a backup, or move it aside (with its "
                         f"-wal and -shm files) to start with no state")


def database_error(path: str, exc: BaseException) -> StoreError:
    """An sqlite3 error on ``path`` as one line that says what happened and what to do."""
    text = str(exc)
    if "not a database" in text or "malformed" in text:
        return StoreError(f"state database {path} is damaged, corrupt ({text}); restore it "
                          f"from a backup, or stop the hooks and move the file aside (with its "
                          f"-wal and -shm files) to start with no state")
    if "full" in text or "disk I/O" in text:
        try:
            st = os.statvfs(os.path.dirname(path) or ".")
            free = st.f_bavail * st.f_frsize
        except OSError:
            free = None
        if free is not None and free < 1024 * 1024:
            return StoreError(f"state database {path}: the disk holding it is full "
                              f"({free} bytes free); free space there")
    return StoreError(f"state database {path}: {text}")


def connect(path: str, timeout: float = BUSY_TIMEOUT_S) -> sqlite3.Connection:
    """An autocommit SQLite connection in WAL mode, waiting ``timeout`` on locks.

    Shared by every pbs_power database. A new database is made under a temporary
    name and linked into place once it has its header, so no process ever sees
    an empty file at ``path`` (which `check_database_file` refuses as damaged).
    """
    check_database_file(path)
    if not os.path.exists(path):
        _create(path, timeout)
    conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        deadline = time.monotonic() + timeout
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL").fetchone()
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        conn.execute("PRAGMA synchronous = NORMAL")
    except sqlite3.DatabaseError as exc:
        conn.close()
        if "not a database" in str(exc):
            raise StoreError(f"state database {path} is corrupt: not an SQLite database "
                             f"(overwritten or damaged); restore it from a backup, or move the "
                             f"file aside (with its -wal and -shm files) to start with no "
                             f"state") from None
        raise
    except BaseException:
        conn.close()
        raise
    return conn


def _create(path: str, timeout: float) -> None:
    """An empty WAL database at ``path``, unless another process made one first."""
    import tempfile  # only the first run creates the database
    fd, temp = tempfile.mkstemp(prefix=".new-", suffix=".db", dir=os.path.dirname(path) or ".")
    os.close(fd)
    try:
        os.unlink(temp)
        conn = sqlite3.connect(temp, timeout=timeout, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode = WAL").fetchone()
        finally:
            conn.close()
        try:
            os.link(temp, path)
        except FileExistsError:
            pass
    finally:
        for leftover in (temp, temp + "-wal", temp + "-shm"):
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass
