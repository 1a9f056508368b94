"""How the device controller runs requests: slots, worker threads, an event loop.

`Slots` bound how many requests are in flight across every batch;
`Workers` are daemon threads for blocking backends (a hung BMC call never
keeps the process from exiting); `EventLoop` runs backends that offer
``handle_async`` so thousands of requests wait without a thread each.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

IDLE_EXIT_S = 60.0   # an idle worker thread retires after this long
WAKE = object()      # posted to a waiting batch when another batch frees a slot


class Slots:
    """The controller-wide count of requests in flight, at most ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._used = 0
        self._lock = threading.Lock()
        self._watchers: Dict[int, "queue.SimpleQueue[Any]"] = {}

    def try_acquire(self) -> bool:
        with self._lock:
            if self._used >= self.limit:
                return False
            self._used += 1
            return True

    def release(self) -> None:
        """Free a slot and wake every batch that waits for one."""
        with self._lock:
            self._used -= 1
            watchers = list(self._watchers.values())
        for events in watchers:
            events.put(WAKE)

    def watch(self, events: "queue.SimpleQueue[Any]", on: bool = True) -> None:
        """Have ``release`` wake ``events`` (or, with ``on`` False, no longer)."""
        with self._lock:
            self._watchers.pop(id(events), None)
            if on:
                self._watchers[id(events)] = events


class Workers:
    """Daemon worker threads, started on demand and retired after a minute idle.

    An idle-token semaphore says whether a waiting worker will take a new job
    (the technique of ``ThreadPoolExecutor``); a worker stuck in a hung backend
    call simply stops counting, and a new one is started in its place.
    """

    def __init__(self) -> None:
        self._jobs: "queue.SimpleQueue[Optional[Callable[[], None]]]" = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._alive = 0
        self._serial = itertools.count(1)

    def submit(self, job: Callable[[], None]) -> None:
        if not self._idle.acquire(blocking=False):
            with self._lock:
                self._alive += 1
            name = "pbs_power-device-%d" % next(self._serial)
            threading.Thread(target=self._loop, name=name, daemon=True).start()
        self._jobs.put(job)

    def _loop(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                if self._idle.acquire(blocking=False):
                    break  # nobody counts on this worker: retire
                continue   # a job was promised to some idle worker: stay
            if job is None:
                break
            try:
                job()
            except BaseException:  # noqa: B902 - jobs report their own errors
                pass
            self._idle.release()
        with self._lock:
            self._alive -= 1

    def close(self) -> None:
        """Ask every worker to exit once it is done (does not wait for hung ones)."""
        with self._lock:
            alive = self._alive
        for _ in range(alive):
            self._jobs.put(None)


class EventLoop:
    """One daemon thread running an asyncio loop for asynchronous backends.

    Thousands of requests then wait on their devices without a thread each;
    the slots and deadlines of `_Batch` still bound and time them.
    """

    def __init__(self) -> None:
        import asyncio  # only backends with handle_async need it (a prolog does not)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever,
                                       name="pbs_power-device-loop", daemon=True)
        self.thread.start()

    def submit_many(self, items: List[Tuple[Any, Any, int, Any]]) -> None:
        """Start ``(handler, request, token, events)`` items with one loop wake-up."""
        async def run(handler: Any, req: Any, token: int, events: Any) -> None:
            begin = time.monotonic()
            try:
                outcome: Any = await handler(req)
            except Exception as exc:
                outcome = exc
            events.put((token, outcome, time.monotonic() - begin))

        def spawn() -> None:
            for item in items:
                self.loop.create_task(run(*item))
        self.loop.call_soon_threadsafe(spawn)

    def close(self) -> None:
        """Stop the loop and release its sockets: hooks run inside pbs_server,
        which must not collect a thread and a socket pair per job."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=1.0)
        if not self.loop.is_running():
            import asyncio
            for task in asyncio.all_tasks(self.loop):
                task.cancel()
            self.loop.close()
