"""The WebSocket server: one JSON request in, one JSON answer out, per message.

Each message is answered on its connection in the order received. The work
(data gathering and the policy) runs in a pool of worker threads, so a slow
policy never holds up other connections; an answer that takes longer than
``eval_timeout`` seconds becomes a ``timeout`` error (the worker finishes in
the background and its result is dropped). A bad message gets an error
answer and the connection stays open; nothing a client sends stops the
server.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, Optional

from .schema import (INTERNAL, TIMEOUT, AllocatorError, decode_message, encode, failure,
                     request_id_of)
from .service import AllocatorService

log = logging.getLogger("pbs_power.allocator")


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
        self.max_message_bytes = max_message_bytes or config.max_message_bytes
        self.executor = ThreadPoolExecutor(max_workers or config.max_workers,
                                           thread_name_prefix="allocator")
        self._server: Any = None

    async def start(self) -> int:
        """Listen; returns the bound port (useful with port 0)."""
        import websockets
        self._server = await websockets.serve(self._connection, self.host, self.port,
                                              max_size=self.max_message_bytes)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        """Close every connection and stop listening; running workers are not waited for."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        self.executor.shutdown(wait=False)

    async def _connection(self, websocket: Any, path: Optional[str] = None) -> None:
        from websockets.exceptions import ConnectionClosed
        peer = _peer(websocket)
        try:
            async for message in websocket:
                await websocket.send(self._encoded(await self.answer(message, peer)))
        except ConnectionClosed:
            pass

    async def answer(self, message: Any, peer: str = "-") -> Dict[str, Any]:
        """The answer to one raw message (never raises)."""
        started = time.monotonic()
        rid: Optional[str] = None
        try:
            doc = decode_message(message)
            rid = request_id_of(doc)
            loop = asyncio.get_running_loop()
            work = loop.run_in_executor(self.executor, self.service.handle, doc)
            try:
                answer = await asyncio.wait_for(work, self.eval_timeout)
            except asyncio.TimeoutError:
                raise AllocatorError(TIMEOUT, "no answer within %g s: the policy (or the data "
                                     "it needs) is too slow; its result will be dropped"
                                     % self.eval_timeout) from None
        except AllocatorError as exc:
            answer = failure(exc, rid)
        except Exception as exc:  # a bug of ours: the client gets told, the server goes on
            log.exception("%s: internal error", peer)
            answer = failure(AllocatorError(INTERNAL, "internal error: %s: %s"
                                            % (type(exc).__name__, exc)), rid)
        _log_answer(peer, answer, (time.monotonic() - started) * 1000.0)
        return answer

    @staticmethod
    def _encoded(answer: Dict[str, Any]) -> str:
        try:
            return encode(answer)
        except (TypeError, ValueError) as exc:
            return encode(failure(AllocatorError(INTERNAL, "answer not encodable: %s" % exc),
                                  answer.get("request_id")))


def _peer(websocket: Any) -> str:
    address = getattr(websocket, "remote_address", None)
    if isinstance(address, tuple) and len(address) >= 2:
        return "%s:%s" % (address[0], address[1])
    return "-"


def _log_answer(peer: str, answer: Dict[str, Any], ms: float) -> None:
    if answer.get("ok"):
        placed = sum(1 for a in answer["allocations"] if "cluster_id" in a)
        log.info("%s: %s placed %d of %d request(s) in %.1f ms", peer,
                 answer["policy_rule_uri"], placed, len(answer["allocations"]), ms)
    else:
        error = answer["error"]
        log.warning("%s: %s: %s (%.1f ms)", peer, error["code"], error["message"], ms)


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
