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
import multiprocessing
import pickle
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional

from .policy_run import worker_main
from .schema import INTERNAL, TIMEOUT, AllocatorError

log = logging.getLogger("pbs_power.allocator")


class _Worker:
    """One worker process, the parent's end of its pipe, and the views it holds."""

    def __init__(self, process: Any, conn: Any):
        self.process = process
        self.conn = conn
        self.views: Dict[str, int] = {}
        self.pending: Optional[Future] = None     # the thread reading its pipe


class PolicyPool:
    """Runs tasks in worker processes; `run` is a coroutine."""

    def __init__(self, size: int, policy_dir: Optional[str], default: str,
                 start_method: str = "forkserver"):
        self.size = size
        self.policy_dir = policy_dir
        self.default = default
        self._ctx = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(["pbs_power.allocator.policy_run"])
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

    async def _start(self) -> _Worker:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._io, self._spawn)

    def _spawn(self) -> _Worker:
        mine, theirs = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=worker_main, name="allocator-policy",
                                    args=(theirs, self.policy_dir, self.default), daemon=True)
        process.start()
        theirs.close()
        worker = _Worker(process, mine)
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
        except (OSError, ValueError):
            pass
        pending = worker.pending

        def reap(_: Any = None) -> None:
            worker.conn.close()
            worker.process.join(5)
            worker.process.close()
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
