"""What the server lets clients hold: connections, bytes buffered, idle time.

Past ``max_connections`` a new connection is closed at once with code 1013
(try again later); one log line says when refusing starts and one when it
ends, with the count, however many sockets were refused. Bytes a connection
has sent but the server has not taken as a message count against
``max_buffered_bytes`` over all connections; a connection that would pass it
is closed with 1013. A connection holding more unread bytes than one message may have is closed
with 1009. The event loop's own "out of file descriptors" reports
are logged once per burst too. After a burst of connections ends, freed heap
goes back to the system (`release_memory`).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import resource
import time
from typing import Any, Dict, Optional

log = logging.getLogger("pbs_power.allocator")

TRY_AGAIN_LATER = 1013
MESSAGE_TOO_BIG = 1009
#: Unread bytes a connection may hold beyond one largest message (frame headers, a ping).
HEADROOM_BYTES = 64 * 1024
#: File descriptors kept for the server's own use beyond its connections.
SPARE_FDS = 64


def raise_fd_limit(max_connections: int) -> int:
    """Raise the soft open-files limit toward the hard one; the connections that fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max_connections + SPARE_FDS
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft - SPARE_FDS))


class Burst:
    """Counts refusals of one kind; logs the first of a burst and, later, its end."""

    def __init__(self, what: str, done: str = "refused", quiet_seconds: float = 5.0):
        self.what = what
        self.done = done
        self.quiet_seconds = quiet_seconds
        self.count = 0
        self.total = 0
        self._last = 0.0

    def hit(self, detail: str) -> None:
        now = time.monotonic()
        if self.count == 0:
            log.warning("%s: %s (one line per burst; the count follows when it ends)",
                        self.what, detail)
        self.count += 1
        self.total += 1
        self._last = now

    def settle(self, force: bool = False) -> None:
        """Log the end of a burst once none came for ``quiet_seconds`` (or now, ``force``)."""
        if self.count and (force or time.monotonic() - self._last >= self.quiet_seconds):
            log.warning("%s: burst over, %d %s", self.what, self.count, self.done)
            self.count = 0


class Limits:
    """The server's counters: open connections, buffered bytes, refusal bursts."""

    def __init__(self, max_connections: int, max_buffered_bytes: int,
                 max_message_bytes: int, idle_timeout: float):
        self.max_connections = max_connections
        self.max_buffered_bytes = max_buffered_bytes
        self.max_message_bytes = max_message_bytes
        self.idle_timeout = idle_timeout
        self.open = 0           # connections being served
        self.sockets = 0        # every socket, handshaking and closing ones too
        self.buffered = 0
        self.peak_open = 0
        self.admitted = 0
        self.refused = Burst("too many connections, refusing new ones with code 1013")
        self.overfull = Burst("too many bytes buffered, closing connections with code 1013",
                              "closed")
        self.no_fds = Burst("out of file descriptors, accepting paused", "accepts failed")

    def admit(self) -> bool:
        """Count a new connection; False (and counted as refused) past the maximum."""
        if self.open >= self.max_connections:
            self.refused.hit("%d open, max_connections %d" % (self.open, self.max_connections))
            return False
        self.open += 1
        self.admitted += 1
        self.peak_open = max(self.peak_open, self.open)
        return True

    def leave(self) -> None:
        self.open -= 1

    def stats(self) -> Dict[str, Any]:
        return {"open": self.open, "sockets": self.sockets, "peak_open": self.peak_open,
                "admitted": self.admitted,
                "buffered_bytes": self.buffered,
                "refused": self.refused.total, "closed_overfull": self.overfull.total}

    def loop_exception_handler(self, loop: Any, context: Dict[str, Any]) -> None:
        """The event loop's error reports, "Too many open files" once per burst."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in (23, 24):   # ENFILE, EMFILE
            self.no_fds.hit(str(exc))
            return
        loop.default_exception_handler(context)


def connection_class(limits: Limits) -> Any:
    """A websockets ServerConnection that counts bytes buffered against ``limits``."""
    from websockets.asyncio.server import ServerConnection

    class CountedConnection(ServerConnection):  # type: ignore[misc]
        """Counts bytes received and not yet taken as a message; closes past the total."""

        pending = 0
        overfull = False

        def data_received(self, data: bytes) -> None:
            if self.overfull:
                return
            if self.pending + len(data) > limits.max_message_bytes + HEADROOM_BYTES:
                self.overfull = True
                self.loop.create_task(self.close(MESSAGE_TOO_BIG, "more unread bytes than "
                                                 "max_message_bytes"))
                return
            if limits.buffered + len(data) > limits.max_buffered_bytes:
                self.overfull = True
                limits.overfull.hit("%d bytes buffered, max_buffered_bytes %d"
                                    % (limits.buffered, limits.max_buffered_bytes))
                self.loop.create_task(self.close(TRY_AGAIN_LATER, "server buffers full"))
                return
            self.pending += len(data)
            limits.buffered += len(data)
            super().data_received(data)

        def taken(self) -> None:
            """A message was taken: its bytes no longer count."""
            limits.buffered -= self.pending
            self.pending = 0

        def connection_made(self, transport: Any) -> None:
            limits.sockets += 1
            super().connection_made(transport)

        def connection_lost(self, exc: Optional[Exception]) -> None:
            limits.sockets -= 1
            self.taken()
            super().connection_lost(exc)

    return CountedConnection


def release_memory() -> None:
    """Give freed heap back to the system (glibc keeps it otherwise)."""
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    except OSError:
        return
    if trim is not None:
        trim(0)
