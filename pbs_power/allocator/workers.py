"""Worker processes that run policies, each run under a deadline it cannot overstay.

A policy is the admin's code: it may loop, block or crash. Each run goes to
an idle worker process (started on demand, at most ``size``); when the run
passes its deadline or its client goes away, the worker is killed and a new
one takes its place later, so no stuck policy keeps a worker. One policy
never holds every worker: with two or more, one is always left for the
others, so a policy that hangs slows only its own requests. Workers keep
the latest view of each cluster, so a view crosses to a worker once.
"""
from __future__ import annotations

import asyncio
import logging
import os
import pickle
import socket
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any, Callable, Dict, List, Optional

from .schema import INTERNAL, TIMEOUT, AllocatorError

log = logging.getLogger("pbs_power.allocator")
#: The directory holding the pbs_power package, for the workers' import path.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Worker:
    """One worker process, the parent's end of its pipe, and the views it holds."""

    def __init__(self, process: Any, conn: Any):
        self.process = process
        self.conn = conn
        self.views: Dict[str, int] = {}
        self.pending: Optional[Future] = None     # the thread reading its pipe


class PolicyPool:
    """Runs tasks in worker processes; `run` is a coroutine."""

    def __init__(self, size: int, policy_dir: Optional[str], default: str):
        self.size = size
        self.policy_dir = policy_dir
        self.default = default
        self._idle: List[_Worker] = []
        self._all: List[_Worker] = []
        self._slots: Optional[asyncio.Semaphore] = None
        self._per_policy: Dict[str, asyncio.Semaphore] = {}
        self._io = ThreadPoolExecutor(2 * size + 2, thread_name_prefix="allocator-pipe")
        self.killed = 0

    async def run(self, policy: str, build: Callable[[Dict[str, int]], Dict[str, Any]],
                  timeout: float) -> Dict[str, Any]:
        """The reply to ``build(views the worker holds)``; AllocatorError(timeout) past it.

        Cancelling the coroutine (a client gone) kills the worker running it.
        """
        deadline = time.monotonic() + timeout
        mine = self._per_policy.get(policy)
        if mine is None:
            mine = self._per_policy[policy] = asyncio.Semaphore(max(1, self.size - 1))
        try:
            await asyncio.wait_for(mine.acquire(), timeout)
        except asyncio.TimeoutError:
            raise _late(timeout, "every worker policy %s may use stayed busy" % policy) \
                from None
        try:
            return await self._run(build, deadline, timeout)
        finally:
            mine.release()

    async def _run(self, build: Callable[[Dict[str, int]], Dict[str, Any]], deadline: float,
                   timeout: float) -> Dict[str, Any]:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.size)
        try:
            await asyncio.wait_for(self._slots.acquire(), max(0.001, deadline - time.monotonic()))
        except asyncio.TimeoutError:
            raise _late(timeout, "every worker stayed busy") from None
        worker: Optional[_Worker] = None
        try:
            worker = self._idle.pop() if self._idle else await self._start()
            task = build(worker.views)
            payload = pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL)
            left = max(0.001, deadline - time.monotonic())
            try:
                reply = await asyncio.wait_for(self._roundtrip(worker, payload), left)
            except asyncio.TimeoutError:
                self._kill(worker)
                worker = None
                raise _late(timeout, "the policy was stopped") from None
            except (EOFError, OSError) as exc:
                self._kill(worker)
                worker = None
                raise AllocatorError(INTERNAL, "the policy's worker process ended: %s"
                                     % (exc or type(exc).__name__)) from None
            for cid, ref in task.get("local", {}).items():
                worker.views[cid] = ref["stamp"]
            self._idle.append(worker)
            worker = None
            return reply
        finally:
            if worker is not None:      # cancelled, or a bug of ours: never reuse it
                self._kill(worker)
            self._slots.release()

    async def warm(self) -> None:
        """Start one worker ahead of the first request (it waits idle)."""
        if not self._all:
            self._idle.append(await self._start())

    async def _start(self) -> _Worker:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._io, self._spawn)

    def _spawn(self) -> _Worker:
        """A fresh interpreter running `policy_run`, talking over a socket pair.

        Not a fork of this process (its threads and sockets stay here), and
        not `multiprocessing` (which would import the caller's main module).
        """
        mine, theirs = socket.socketpair()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT] + [p for p in env.get(
            "PYTHONPATH", "").split(os.pathsep) if p])
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "pbs_power.allocator.policy_run", str(theirs.fileno()),
                 self.policy_dir or "", self.default],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env)
        finally:
            theirs.close()
        worker = _Worker(process, Connection(mine.detach()))
        self._all.append(worker)
        return worker

    async def _roundtrip(self, worker: _Worker, payload: bytes) -> Dict[str, Any]:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._io, worker.conn.send_bytes, payload)
        worker.pending = self._io.submit(worker.conn.recv_bytes)
        data = await asyncio.wrap_future(worker.pending, loop=loop)
        worker.pending = None
        return pickle.loads(data)

    def _kill(self, worker: _Worker) -> None:
        """Kill the process; its pipe closes once no thread reads it any more."""
        self.killed += 1
        if worker in self._all:
            self._all.remove(worker)
        try:
            worker.process.kill()
        except OSError:
            pass
        pending = worker.pending

        def reap(_: Any = None) -> None:
            worker.conn.close()
            try:
                worker.process.wait(5)
            except subprocess.TimeoutExpired:
                log.warning("policy worker %d did not end after SIGKILL", worker.process.pid)
        if pending is not None:
            pending.add_done_callback(reap)     # runs once the reading thread saw EOF
        else:
            self._io.submit(reap)

    def workers(self) -> int:
        """Worker processes alive now."""
        return len(self._all)

    def close(self) -> None:
        """Stop every worker (their runs are abandoned)."""
        for worker in list(self._all):
            self._kill(worker)
        self._idle.clear()
        self._io.shutdown(wait=False)


def _late(timeout: float, what: str) -> AllocatorError:
    return AllocatorError(TIMEOUT, "no answer within %g s: %s; run the request again or ask "
                          "the admin about the policy" % (timeout, what))
