"""The WebSocket server: one JSON message in, one JSON answer out, in order, per connection.

Reading a cluster's state runs in threads; the policy runs in a worker
process under the ``eval_timeout`` deadline (`workers`): past it the client
gets a ``timeout`` error and the worker is killed, so a stuck policy never
keeps one. A client that disconnects while its request runs has the run
cancelled. Connections, buffered bytes and idle time are bounded (`limits`).
Besides allocation requests a connection may send ``{"op": "release",
"lease_ids": [...]}``; ``{"op": "management", ...}`` and ``{"op": "stats"}``
are for admins only: over the admin Unix socket, or with the admin token.
A bad message gets an error answer and the connection stays open.
"""
from __future__ import annotations

import asyncio
import gc
import hmac
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional

from .limits import TRY_AGAIN_LATER, Limits, connection_class, raise_fd_limit, release_memory
from .schema import (FORBIDDEN, INTERNAL, INVALID_REQUEST, TIMEOUT, AllocatorError,
                     decode_message, encode, failure, request_id_of)
from .service import ATTEMPTS, AllocatorService
from .workers import PolicyPool

log = logging.getLogger("pbs_power.allocator")
CONTROL_OPS = ("release", "management", "stats")
#: Connections the kernel may queue before the server accepts them.
BACKLOG = 1024
#: Memory goes back to the system once this many connections came and at most
#: TRIM_BELOW sockets are left.
TRIM_AFTER = 50
TRIM_BELOW = 4
#: Seconds a closing client gets to answer the close frame.
CLOSE_TIMEOUT = 2.0


class AllocatorServer:
    """Serves an AllocatorService over WebSocket (PyPI ``websockets``)."""

    def __init__(self, service: AllocatorService, host: str = "127.0.0.1", port: int = 8765,
                 eval_timeout: Optional[float] = None, max_workers: Optional[int] = None,
                 max_message_bytes: Optional[int] = None):
        config = service.config
        self.service = service
        self.host = host
        self.port = port
        self.eval_timeout = eval_timeout or config.eval_timeout_seconds
        workers = max_workers or config.max_workers
        fits = raise_fd_limit(config.max_connections)
        if fits < config.max_connections:
            log.warning("max_connections %d does not fit the open-files limit: %d instead",
                        config.max_connections, fits)
        self.limits = Limits(fits, config.max_buffered_bytes,
                             max_message_bytes or config.max_message_bytes,
                             config.idle_timeout_seconds)
        self.pool = PolicyPool(workers, config.policy_dir, config.default_policy)
        self.io = ThreadPoolExecutor(workers, thread_name_prefix="allocator-gather")
        self.admin_token = _read_token(config.admin_token_file)
        self.admin_socket = config.admin_socket
        self.cancelled = 0
        self._servers: List[Any] = []
        self._tasks: List["asyncio.Task[Any]"] = []

    async def start(self) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        from websockets.asyncio.server import serve, unix_serve
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self.limits.loop_exception_handler)
        # No per-message deflate: allocation messages are small, and each compressed
        # connection would hold zlib state for its lifetime.
        options = dict(max_size=self.limits.max_message_bytes, max_queue=4, compression=None,
                       close_timeout=CLOSE_TIMEOUT,
                       open_timeout=min(10.0, self.limits.idle_timeout),
                       create_connection=connection_class(self.limits))
        server = await serve(self._connection, self.host, self.port, backlog=BACKLOG, **options)
        self._servers.append(server)
        self.port = server.sockets[0].getsockname()[1]
        if self.admin_socket:
            if os.path.exists(self.admin_socket):
                os.unlink(self.admin_socket)
            old = os.umask(0o177)
            try:
                self._servers.append(await unix_serve(self._admin_connection,
                                                      self.admin_socket, **options))
            finally:
                os.umask(old)
        self._tasks.append(loop.create_task(self._housekeeping()))
        self._tasks.append(loop.create_task(self.pool.warm()))
        return self.port

    async def stop(self) -> None:
        """Close every connection, stop listening and stop the workers."""
        for task in self._tasks:
            task.cancel()
        for server in self._servers:
            server.close()
            await server.wait_closed()
        self._servers = []
        self.pool.close()
        self.io.shutdown(wait=False)
        if self.admin_socket and os.path.exists(self.admin_socket):
            os.unlink(self.admin_socket)

    async def _housekeeping(self) -> None:
        """Once a second: end refusal bursts in the log; return memory once a burst is over."""
        trimmed_at = 0
        while True:
            await asyncio.sleep(1.0)
            for burst in (self.limits.refused, self.limits.overfull, self.limits.no_fds):
                burst.settle()
            seen = self.limits.admitted + self.limits.refused.total
            if seen - trimmed_at >= TRIM_AFTER and self.limits.sockets <= TRIM_BELOW:
                gc.collect()
                release_memory()
                trimmed_at = seen

    # -- connections ---------------------------------------------------------------
    async def _admin_connection(self, websocket: Any) -> None:
        await self._connection(websocket, admin=True)

    async def _connection(self, websocket: Any, admin: bool = False) -> None:
        from websockets.exceptions import ConnectionClosed
        if not self.limits.admit():
            await websocket.close(TRY_AGAIN_LATER, "server busy: too many connections")
            return
        peer = "admin-socket" if admin else _peer(websocket)
        idle = self.limits.idle_timeout
        try:
            while True:
                try:
                    message = await asyncio.wait_for(websocket.recv(), idle)
                except asyncio.TimeoutError:
                    await websocket.close(1000, "idle for %g s" % idle)
                    return
                websocket.taken()
                answer = await self._answer_unless_gone(websocket, message, peer, admin)
                if answer is None:
                    return
                try:
                    await asyncio.wait_for(websocket.send(self._encoded(answer)), idle)
                except (asyncio.TimeoutError, ConnectionClosed):
                    # the client does not read its answers, or is gone: the leases it
                    # never learned of are of no use to anyone
                    self.service.leases.release([a["lease_id"] for a in
                                                 answer.get("allocations", ())
                                                 if "lease_id" in a])
                    websocket.transport.abort()
                    return
        except ConnectionClosed:
            pass
        finally:
            self.limits.leave()

    async def _answer_unless_gone(self, websocket: Any, message: Any, peer: str,
                                  admin: bool) -> Optional[Dict[str, Any]]:
        """The answer, or None when the client went away first (its run is cancelled)."""
        work = asyncio.ensure_future(self.answer(message, peer, admin))
        gone = asyncio.ensure_future(websocket.wait_closed())
        done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if work in done:
            gone.cancel()
            return work.result()
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        self.cancelled += 1
        log.info("%s: client gone, its request was cancelled", peer)
        return None

    # -- answers -------------------------------------------------------------------
    async def answer(self, message: Any, peer: str = "-", admin: bool = False
                     ) -> Dict[str, Any]:
        """The answer to one raw message (never raises, unless cancelled)."""
        started = time.monotonic()
        rid: Optional[str] = None
        try:
            doc = decode_message(message)
            rid = request_id_of(doc)
            if isinstance(doc, dict) and "op" in doc:
                answer = await self._control(doc, admin)
            else:
                answer = await self._allocate(doc, started)
        except AllocatorError as exc:
            answer = failure(exc, rid)
        except Exception as exc:  # a bug of ours: the client gets told, the server goes on
            log.exception("%s: internal error", peer)
            answer = failure(AllocatorError(INTERNAL, "internal error: %s: %s"
                                            % (type(exc).__name__, exc)), rid)
        _log_answer(peer, answer, (time.monotonic() - started) * 1000.0)
        return answer

    async def _allocate(self, doc: Any, started: float) -> Dict[str, Any]:
        deadline = started + self.eval_timeout
        loop = asyncio.get_running_loop()
        try:
            prepared = await asyncio.wait_for(
                loop.run_in_executor(self.io, self.service.prepare, doc), self.eval_timeout)
        except asyncio.TimeoutError:
            raise AllocatorError(TIMEOUT, "no answer within %g s: reading the clusters' state "
                                 "took too long" % self.eval_timeout) from None
        # Concurrent runs may pick the same node; each round one of them wins it, so as
        # many rounds as runs can be in flight settle them all.
        attempts = max(ATTEMPTS, self.pool.size + 2)
        for attempt in range(attempts):
            sent: List[Dict[str, Any]] = []

            def build(views: Dict[str, int]) -> Dict[str, Any]:
                sent.append(self.service.task(prepared, views))
                return sent[-1]
            reply = await self.pool.run(prepared.policy, build,
                                        max(0.001, deadline - time.monotonic()))
            answer = self.service.finish(prepared, sent[-1], reply, attempt == attempts - 1)
            if answer is not None:
                return answer
        raise AllocatorError(INTERNAL, "no answer after %d runs" % attempts)

    async def _control(self, doc: Dict[str, Any], admin: bool) -> Dict[str, Any]:
        """``release`` for anyone holding lease ids; ``management`` and ``stats`` for admins."""
        op = doc.get("op")
        if op not in CONTROL_OPS:
            raise AllocatorError(INVALID_REQUEST, "op %r: expected one of %s"
                                 % (op, ", ".join(CONTROL_OPS)))
        if op == "release":
            ids = doc.get("lease_ids")
            if set(doc) - {"op", "lease_ids", "request_id"} or not isinstance(ids, list) or \
                    not all(isinstance(i, str) for i in ids) or len(ids) > 10000:
                raise AllocatorError(INVALID_REQUEST, "release takes {\"op\": \"release\", "
                                     "\"lease_ids\": [ID, ...]} (10000 at most)")
            released, unknown = self.service.leases.release(ids)
            return {"ok": True, "released": released, "unknown": unknown}
        if not admin and not self._token_ok(doc.get("token")):
            raise AllocatorError(FORBIDDEN, "%s is for admins: use the admin socket or send "
                                 "the admin token" % op)
        if op == "stats":
            return {"ok": True, "connections": self.limits.stats(),
                    "leases": len(self.service.leases), "lease_ends": self.service.leases.ended,
                    "workers": self.pool.workers(), "workers_killed": self.pool.killed,
                    "cancelled": self.cancelled}
        return await self._management(doc)

    async def _management(self, doc: Dict[str, Any]) -> Dict[str, Any]:
        from .registry import check_uri
        allowed = {"op", "token", "policy_rule_uri", "action", "data", "request_id"}
        action, data = doc.get("action"), doc.get("data", {})
        if set(doc) - allowed or not isinstance(action, str) or not isinstance(data, dict):
            raise AllocatorError(INVALID_REQUEST, "management takes {\"op\": \"management\", "
                                 "\"policy_rule_uri\": NAME, \"action\": STRING, \"data\": "
                                 "{...}}")
        name = check_uri(str(doc.get("policy_rule_uri", "")), self.service.registry.default)
        task = {"kind": "management", "policy": name, "action": action, "data": data,
                "context": {}, "candidates": [], "local": {}, "remote": {}, "leases": {}}
        reply = await self.pool.run(name, lambda views: task, self.eval_timeout)
        if not reply.get("ok"):
            raise AllocatorError(reply["code"], reply["message"])
        return {"ok": True, "policy_rule_uri": name, "action": action,
                "result": reply["result"]}

    def _token_ok(self, token: Any) -> bool:
        return bool(self.admin_token) and isinstance(token, str) and \
            hmac.compare_digest(token.encode(), self.admin_token.encode())

    @staticmethod
    def _encoded(answer: Dict[str, Any]) -> str:
        try:
            return encode(answer)
        except (TypeError, ValueError) as exc:
            return encode(failure(AllocatorError(INTERNAL, "answer not encodable: %s" % exc),
                                  answer.get("request_id")))


def _read_token(path: Optional[str]) -> Optional[str]:
    """The admin token from its file (first line); the file must not be readable by others."""
    if not path:
        return None
    from .config import AllocatorConfigError
    try:
        st = os.stat(path)
        with open(path, "r", encoding="utf-8") as f:
            token = f.readline().strip()
    except OSError as exc:
        raise AllocatorConfigError("admin_token_file %s: %s" % (path, exc.strerror)) from None
    if st.st_mode & 0o077:
        raise AllocatorConfigError("admin_token_file %s is readable by group or others; "
                                   "chmod 600 it" % path)
    if len(token) < 16:
        raise AllocatorConfigError("admin_token_file %s: the token must have 16 characters "
                                   "at least" % path)
    return token


def _peer(websocket: Any) -> str:
    address = getattr(websocket, "remote_address", None)
    if isinstance(address, tuple) and len(address) >= 2:
        return "%s:%s" % (address[0], address[1])
    return "-"


def _log_answer(peer: str, answer: Dict[str, Any], ms: float) -> None:
    if answer.get("ok") and "allocations" in answer:
        placed = sum(1 for a in answer["allocations"] if "cluster_id" in a)
        log.info("%s: %s placed %d of %d request(s) in %.1f ms", peer,
                 answer["policy_rule_uri"], placed, len(answer["allocations"]), ms)
    elif not answer.get("ok"):
        error = answer["error"]
        log.warning("%s: %s: %s (%.1f ms)", peer, error["code"], error["message"], ms)
    else:
        log.info("%s: control message answered in %.1f ms", peer, ms)


async def serve(server: AllocatorServer, announce: Any = None) -> None:
    """Run until SIGINT or SIGTERM; ``announce(port)`` once listening."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    port = await server.start()
    if announce is not None:
        announce(port)
    try:
        await stop.wait()
    finally:
        await server.stop()


class ServerThread:
    """An AllocatorServer on its own event loop in a background thread (tests, benchmarks)."""

    def __init__(self, server: AllocatorServer):
        self.server = server
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="allocator-server",
                                        daemon=True)

    def start(self, timeout: float = 30.0) -> int:
        self._thread.start()
        return asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(timeout)

    def stop(self, timeout: float = 30.0) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(timeout)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout)
            if not self._thread.is_alive():
                self.loop.close()


def setup_logging(level: str = "info") -> None:
    """One line per request on stderr."""
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if level != "debug":  # its per-connection lines would drown ours
        logging.getLogger("websockets").setLevel(logging.WARNING)

