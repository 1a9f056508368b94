"""The device controller: carries power-policy requests to devices, collects answers.

A `DeviceRequest` (device, kind, payload, the device's topology model JSON,
its last state JSON, request id, timeout) is handled by the `DeviceBackend`
the model names; the `DeviceResponse` carries the same request id, success
and diagnostic, and new state JSON to persist (``seeds/devicecontroller.proto.md``
semantics, not its wire format). Fan-out is concurrent, at most
``max_workers`` in flight controller-wide; a request that passes its timeout
fails and frees its slot at once, so one dead BMC stalls nobody, and its late
answer is ignored. Workers are daemon threads, as a hung backend call must not
keep a hook's Python from exiting (``ThreadPoolExecutor`` joins at exit).
Only a malformed batch raises (ValueError, before anything is sent).
"""
from __future__ import annotations

import abc
import heapq
import itertools
import json
import logging
import math
import os
import queue
import time
from collections import deque
from dataclasses import dataclass
from typing import (Any, Callable, Deque, Dict, Iterator, List, Mapping, Optional,
                    Sequence, Tuple, Union)

from pbs_power._records import evolve
from .dispatch import WAKE, EventLoop, Slots, Workers

KINDS = ("resource_group_activate", "resource_group_deactivate", "resource_group_update",
         "topology_activate", "topology_deactivate", "gpu_policies_update", "ping")

#: The backend of a device whose model JSON names none.
DEFAULT_BACKEND = "simulated"
#: stream() persists device states at least this often (responses), so a crash loses little.
FLUSH_EVERY = 100
#: ...and at most this often (seconds), so big fan-outs do not write all the time.
FLUSH_MIN_INTERVAL = 0.25
#: Batches up to this size wait in worker threads even when a backend offers
#: ``handle_async``; larger ones share the event loop (no thread per request).
THREADED_BATCH = 16

LogFn = Callable[[str, str], None]


@dataclass(frozen=True)
class DeviceRequest:
    """One operation for one device; the controller fills request_id, state and timeout."""

    device: str
    kind: str
    payload: Mapping[str, Any]
    device_model_json: str
    device_state_json: Optional[str] = None
    request_id: str = ""
    timeout_seconds: Optional[float] = None


@dataclass(frozen=True)
class GPUPolicyResult:
    """The outcome of applying a power cap to one GPU of a node."""

    gpu_id: int
    ok: bool
    power_cap_watts: Optional[float]
    diag_msg: str = ""


@dataclass(frozen=True)
class DeviceResponse:
    """A device's answer to the request with the same request_id."""

    device: str
    request_id: str
    success: bool
    error: str = ""
    device_state_json: Optional[str] = None
    power_cap_watts: Optional[float] = None
    policy: Optional[Mapping[str, Any]] = None
    gpu_results: Tuple[GPUPolicyResult, ...] = ()
    ping_time: Optional[float] = None
    ping_error: str = ""
    elapsed_seconds: float = 0.0


def failure(request: DeviceRequest, error: str, **fields: Any) -> DeviceResponse:
    """A failure response to ``request`` (ping requests also get ``ping_error``)."""
    if request.kind == "ping":
        fields.setdefault("ping_error", error)
    return DeviceResponse(request.device, request.request_id, False, error, **fields)


class DeviceBackend(abc.ABC):
    """Talks to one family of devices (simulated, redfish, nvml, ...)."""

    #: The ``backend`` name in a device model JSON that selects this backend.
    name: str = ""

    @abc.abstractmethod
    def handle(self, request: DeviceRequest) -> DeviceResponse:
        """Carry out ``request`` (blocking; called from worker threads, concurrently).

        Must answer with ``request.request_id`` and should give up by
        ``request.timeout_seconds``; a failure is a response, not an exception.
        """

    def close(self) -> None:
        """Release connections; the default has none."""


class DeviceStateStore(abc.ABC):
    """Persisted ``device_state_json`` per device.

    Only called from the thread that calls `DeviceController.send`/`stream`.
    """

    @abc.abstractmethod
    def get_device_state(self, device: str) -> Optional[str]:
        """The state JSON last stored for ``device``, or None."""

    @abc.abstractmethod
    def put_device_states(self, states: Mapping[str, str]) -> None:
        """Store device -> state JSON, all in one write."""


def _default_log(level: str, msg: str) -> None:
    level_no = getattr(logging, str(level).upper(), logging.INFO)
    logging.getLogger(__name__).log(level_no if isinstance(level_no, int) else logging.INFO, msg)


def _positive(name: str, value: Any) -> float:
    """A finite number > 0, or ValueError naming ``name``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value > 0):
        raise ValueError("%s must be a finite number of seconds > 0, not %r" % (name, value))
    return float(value)


@dataclass(frozen=True)
class _Flight:
    """A request being handled: its backend, when it started and when it times out."""

    request: DeviceRequest
    backend: str
    started: float
    deadline: float


class DeviceController:
    """Sends batches of device requests concurrently and collects the responses.

    ``backends`` maps a backend name to its backend; a request goes to the
    backend its model JSON names (``"backend"``, default ``"simulated"``).
    The controller owns the backends: `close` closes them.
    """

    def __init__(self, backends: Mapping[str, DeviceBackend],
                 state: Optional[DeviceStateStore] = None, max_workers: int = 256,
                 default_timeout: float = 30.0, log: Optional[LogFn] = None) -> None:
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError("max_workers must be an integer >= 1, not %r" % (max_workers,))
        self.default_timeout = _positive("default_timeout", default_timeout)
        self.max_workers = max_workers
        self._backends = dict(backends)
        self._state = state
        self._log: LogFn = log or _default_log
        self._slots = Slots(max_workers)
        self._workers = Workers()
        self._async: Optional[EventLoop] = None
        self._closed = False

    def _loop(self) -> "EventLoop":
        """The event loop that runs backends offering ``handle_async`` (started once)."""
        if self._async is None:
            self._async = EventLoop()
        return self._async

    # -- public ---------------------------------------------------------------
    def send(self, requests: Sequence[DeviceRequest]) -> Dict[str, DeviceResponse]:
        """Device -> response for every request, once all answered or timed out."""
        prepared = self._prepare(requests)
        got = {resp.device: resp for resp in _Batch(self, prepared, None).run()}
        return {req.device: got[req.device] for req in prepared}

    def stream(self, requests: Sequence[DeviceRequest]) -> Iterator[DeviceResponse]:
        """Responses in the order they complete (the batch is checked before this returns).

        Requests go out at the first ``next()``. Leaving the iteration early
        persists what was answered; requests still in flight are abandoned.
        """
        return _Batch(self, self._prepare(requests), FLUSH_EVERY).run()

    def close(self) -> None:
        """Stop the worker threads and close every backend (call when no batch runs)."""
        if self._closed:
            return
        self._closed = True
        self._workers.close()
        if self._async is not None:
            self._async.close()
        for name, backend in self._backends.items():
            try:
                backend.close()
            except Exception as exc:  # a backend's close must not hide the others'
                self._log("warning", "device backend %r: close failed: %s: %s"
                          % (name, type(exc).__name__, exc))

    def __enter__(self) -> "DeviceController":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- preparing a batch ----------------------------------------------------
    def _prepare(self, requests: Sequence[DeviceRequest]) -> List[DeviceRequest]:
        """Check the whole batch (ValueError), then fill ids, timeouts and states."""
        if self._closed:
            raise RuntimeError("the device controller is closed")
        batch = list(requests)
        seen: Dict[str, int] = {}
        for i, req in enumerate(batch):
            _check_request(i, req)
            if req.device in seen:
                raise ValueError("requests[%d]: device %r is already named by requests[%d]; "
                                 "send one request per device per batch"
                                 % (i, req.device, seen[req.device]))
            seen[req.device] = i
        stored = self._stored_states([r.device for r in batch if r.device_state_json is None])
        return [self._complete(req, stored) for req in batch]

    def _stored_states(self, devices: Sequence[str]) -> Dict[str, str]:
        """Stored states of ``devices``, in one query when the store offers one."""
        if not devices or self._state is None:
            return {}
        many = getattr(self._state, "get_device_states", None)
        if many is None:
            return {}
        try:
            return dict(many(devices))
        except Exception as exc:  # fall back to one read per device
            self._log("warning", "could not read stored device states in one query: %s: %s"
                      % (type(exc).__name__, exc))
            return {}

    def _complete(self, req: DeviceRequest, stored: Mapping[str, str]) -> DeviceRequest:
        """``req`` with its request id, timeout and (stored) state filled in."""
        timeout = self.default_timeout if req.timeout_seconds is None else req.timeout_seconds
        state = req.device_state_json
        if state is None and req.device in stored:
            state = stored[req.device]
        elif state is None and self._state is not None:
            try:
                state = self._state.get_device_state(req.device)
            except Exception as exc:  # the device then starts from no state
                self._log("warning", "device %s: %s: could not read its stored state: %s: %s"
                          % (req.device, req.kind, type(exc).__name__, exc))
        return DeviceRequest(req.device, req.kind, req.payload, req.device_model_json, state,
                             req.request_id or os.urandom(16).hex(), float(timeout))

    def _backend_of(self, req: DeviceRequest) -> Union[str, Tuple[str]]:
        """The backend name for ``req``, or a 1-tuple with why there is none (memoised)."""
        cache = self.__dict__.setdefault("_backend_cache", {})
        found = cache.get(req.device_model_json)
        if found is None:
            if len(cache) > 4096:
                cache.clear()
            found = cache[req.device_model_json] = self._parse_backend(req)
        return found

    def _parse_backend(self, req: DeviceRequest) -> Union[str, Tuple[str]]:
        try:
            model = json.loads(req.device_model_json)
        except (TypeError, ValueError) as exc:
            return ("device model JSON is not valid JSON: %s" % exc,)
        if not isinstance(model, dict):
            return ("device model JSON must be an object, not %s" % type(model).__name__,)
        name = model.get("backend")
        name = DEFAULT_BACKEND if name is None else name
        if not isinstance(name, str) or name not in self._backends:
            return ("no device backend %r (available: %s)"
                    % (name, ", ".join(sorted(self._backends)) or "none"),)
        return name

    def _persist(self, states: Mapping[str, str]) -> None:
        """One batch write of device states; a store failure is logged, not raised."""
        if not states or self._state is None:
            return
        try:
            self._state.put_device_states(dict(states))
        except Exception as exc:  # the responses stand; the next call sends older state
            self._log("error", "could not store the state of %d device(s) (%s): %s: %s"
                      % (len(states), ", ".join(sorted(states)[:5]), type(exc).__name__, exc))


def _check_request(index: int, req: Any) -> None:
    """ValueError naming ``requests[index]`` when it is not a well-formed request."""
    where = "requests[%d]" % index
    if not isinstance(req, DeviceRequest):
        raise ValueError("%s: must be a DeviceRequest, not %s" % (where, type(req).__name__))
    if not isinstance(req.device, str) or not req.device:
        raise ValueError("%s: device must be a non-empty string, not %r" % (where, req.device))
    if req.kind not in KINDS:
        raise ValueError("%s (device %s): kind %r is not one of %s"
                         % (where, req.device, req.kind, ", ".join(KINDS)))
    if req.timeout_seconds is not None:
        _positive("%s (device %s): timeout_seconds" % (where, req.device), req.timeout_seconds)


class _Batch:
    """One send/stream call: requests waiting for a slot, those in flight, deadlines."""

    def __init__(self, ctl: DeviceController, requests: List[DeviceRequest],
                 flush_every: Optional[int]) -> None:
        self.ctl = ctl
        self.pending: Deque[DeviceRequest] = deque(requests)
        self.flights: Dict[int, _Flight] = {}
        self.deadlines: List[Tuple[float, int]] = []
        self.events: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self.tokens = itertools.count()
        self.flush_every = flush_every
        self.unsaved: Dict[str, str] = {}
        self.since_flush = 0
        self.last_flush = time.monotonic()
        self.kinds = {req.device: req.kind for req in requests}
        self.notes: Dict[str, Tuple[str, str]] = {}  # device -> (level, log line) overrides

    def run(self) -> Iterator[DeviceResponse]:
        slots = self.ctl._slots
        slots.watch(self.events)
        try:
            while self.pending or self.flights:
                for resp in self._start_more():
                    yield self._finish(resp)
                if not self.pending:
                    slots.watch(self.events, False)
                if self.pending or self.flights:
                    for resp in self._wait():
                        yield self._finish(resp)
        finally:
            slots.watch(self.events, False)
            self._abandon()
            self.ctl._persist(self.unsaved)

    def _start_more(self) -> List[DeviceResponse]:
        """Start pending requests while slots are free; unroutable ones fail at once."""
        failed, started_async = [], []
        # a small batch waits in threads: no event loop (nor asyncio) for a prolog's few hosts
        use_loop = len(self.pending) + len(self.flights) > THREADED_BATCH
        while self.pending:
            req = self.pending[0]
            backend = self.ctl._backend_of(req)
            if isinstance(backend, tuple):
                self.pending.popleft()
                failed.append(failure(req, backend[0]))
                continue
            if not self.ctl._slots.try_acquire():
                break
            self.pending.popleft()
            self._start(req, backend, started_async if use_loop else None)
        if started_async:
            self.ctl._loop().submit_many(started_async)
        return failed

    def _start(self, req: DeviceRequest, backend_name: str,
               started_async: Optional[List[Any]]) -> None:
        """Start ``req``: on the event loop (appended to ``started_async``) when the backend
        offers ``handle_async`` and a list is given, else in a worker thread."""
        token = next(self.tokens)
        started = time.monotonic()
        flight = _Flight(req, backend_name, started, started + float(req.timeout_seconds))
        self.flights[token] = flight
        heapq.heappush(self.deadlines, (flight.deadline, token))
        backend, events = self.ctl._backends[backend_name], self.events
        if started_async is not None and callable(getattr(backend, "handle_async", None)):
            started_async.append((backend.handle_async, req, token, events))
            return

        def job() -> None:
            outcome: Any = None
            begin = time.monotonic()
            try:
                outcome = backend.handle(req)
            except Exception as exc:
                outcome = exc
            finally:
                events.put((token, outcome, time.monotonic() - begin))

        self.ctl._workers.submit(job)

    def _wait(self) -> List[DeviceResponse]:
        """Wait for the next completion, freed slot or deadline; the responses it brings."""
        timeout = None
        if self.deadlines:
            timeout = max(0.0, self.deadlines[0][0] - time.monotonic())
        items = []
        try:
            items.append(self.events.get(timeout=timeout))
            while True:
                items.append(self.events.get_nowait())
        except queue.Empty:
            pass
        out = []
        for item in items:
            flight = None if item is WAKE else self.flights.pop(item[0], None)
            if flight is not None:  # else a wake-up, or a late answer to a timed-out request
                self.ctl._slots.release()
                out.append(self._check(flight, item[1], item[2]))
        return out + self._expire()

    def _check(self, flight: _Flight, outcome: Any, elapsed: float) -> DeviceResponse:
        """The backend's response if it is one and matches; a failure naming why if not."""
        req = flight.request
        if isinstance(outcome, BaseException):
            error = "backend %r raised %s: %s" % (flight.backend, type(outcome).__name__, outcome)
            self.notes[req.device] = ("error", "failed: " + error)
            return failure(req, error, elapsed_seconds=elapsed)
        if not isinstance(outcome, DeviceResponse):
            return failure(req, "backend %r returned %s, not a DeviceResponse"
                           % (flight.backend, type(outcome).__name__), elapsed_seconds=elapsed)
        if outcome.request_id != req.request_id or outcome.device != req.device:
            what = "request_id" if outcome.request_id != req.request_id else "device"
            self.notes[req.device] = ("warning", "no matching response (%s mismatch): ignored "
                                      "the response for device %r, request_id %r (expected %r)"
                                      % (what, outcome.device, outcome.request_id,
                                         req.request_id))
            return failure(req, "no matching response (%s mismatch)" % what,
                           elapsed_seconds=elapsed)
        state = outcome.device_state_json
        if state is not None and not isinstance(state, str):
            return failure(req, "backend %r returned device_state_json of type %s, not JSON text"
                           % (flight.backend, type(state).__name__), elapsed_seconds=elapsed)
        if state is not None:
            self.unsaved[req.device] = state
        return evolve(outcome, elapsed_seconds=elapsed)

    def _expire(self) -> List[DeviceResponse]:
        """Failure responses for the requests whose deadline has passed; frees their slots."""
        now, out = time.monotonic(), []
        while self.deadlines and self.deadlines[0][0] <= now:
            _, token = heapq.heappop(self.deadlines)
            flight = self.flights.pop(token, None)
            if flight is None:
                continue  # answered in time
            self.ctl._slots.release()
            req = flight.request
            out.append(failure(req, "timed out after %gs" % req.timeout_seconds,
                               elapsed_seconds=now - flight.started))
        while self.deadlines and self.deadlines[0][1] not in self.flights:
            heapq.heappop(self.deadlines)  # drop answered ones so the next wait is right
        return out

    def _finish(self, resp: DeviceResponse) -> DeviceResponse:
        """Log the response, persist states every ``flush_every`` responses; pass it on."""
        kind = self.kinds.get(resp.device, "?")
        if resp.device in self.notes:
            level, line = self.notes.pop(resp.device)
        elif resp.success:
            level, line = "debug", "ok in %.3fs" % resp.elapsed_seconds
        else:
            level = "warning"
            line = "failed: %s" % (resp.error or resp.ping_error or "no diagnostic")
        self.ctl._log(level, "device %s: %s: %s" % (resp.device, kind, line))
        self.since_flush += 1
        if (self.flush_every and self.since_flush >= self.flush_every and self.unsaved
                and time.monotonic() - self.last_flush >= FLUSH_MIN_INTERVAL):
            self.last_flush = time.monotonic()
            self.ctl._persist(self.unsaved)
            self.unsaved, self.since_flush = {}, 0
        return resp

    def _abandon(self) -> None:
        """Free the slots of requests still in flight when the caller stopped listening."""
        for flight in self.flights.values():
            self.ctl._slots.release()
            self.ctl._log("warning", "device %s: %s: abandoned in flight (the caller stopped "
                          "reading responses); its result will be ignored"
                          % (flight.request.device, flight.request.kind))
        self.flights.clear()
