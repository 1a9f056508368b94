"""``pbs-power devices check``: does every node's power and device backend answer?

Two kinds of rows per node:

* its **power backend** (host power, the hook config's ``power_backend``; for
  ``groups``, the backend of the node's group). A backend may offer the check
  protocol, ``check(host) -> dict`` with ``reachable`` (bool), ``power_state``
  (a `PowerState` value or None), ``power_cap_watts`` (number or None) and
  ``diag`` (one line); it is called for every host concurrently from daemon
  threads, so it must be thread-safe, bound its own time and not raise for a
  host's problem. A backend without it is asked ``status(hosts, now)`` once,
  in this thread: a host is reachable unless its state is UNKNOWN.
* its **device backend** (per-device power caps, when a topology is imported):
  a ``ping`` device request through the `DeviceController`, concurrent and
  under its timeouts, routed by the device spec's ``backend``; stored device
  states are read, never written.

Latency is the wall time of the host's check call (of the one ``status`` call
for backends without ``check``), or of its ping.
"""
from __future__ import annotations

import json
import math
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from pbs_power.states.model import PowerState
from .base import BackendError, PowerBackend

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_WORKERS = 32


class CheckError(Exception):
    """The check cannot run as asked (no nodes named, bad config)."""


@dataclass(frozen=True)
class CheckRow:
    """One backend's answer for one node."""

    node: str
    backend: str
    reachable: bool
    power_state: Optional[str] = None
    cap_watts: Optional[float] = None
    gpu_caps: Tuple[Optional[float], ...] = ()
    latency_ms: Optional[float] = None
    diag: str = ""
    kind: str = "power"  # "power" (power backend) or "device" (device backend ping)


@dataclass(frozen=True)
class CheckReport:
    """Every row, by node then backend."""

    rows: Tuple[CheckRow, ...]

    @property
    def ok(self) -> bool:
        return all(row.reachable for row in self.rows)

    @property
    def unreachable(self) -> int:
        return sum(1 for row in self.rows if not row.reachable)


# -- power backends -----------------------------------------------------------
def check_power(backend: PowerBackend, hosts: Sequence[str], timeout: float = DEFAULT_TIMEOUT_S,
                workers: int = DEFAULT_WORKERS) -> List[CheckRow]:
    """A row per host from ``backend`` (per group for a grouped backend)."""
    from .routing import GroupedBackend
    hosts = list(dict.fromkeys(hosts))
    if not isinstance(backend, GroupedBackend):
        return _check_one(backend, backend.name, hosts, timeout, workers)
    routed, lost = backend.route(hosts)
    rows = [CheckRow(h, "-", False, diag="in no power_backend group: no backend powers it")
            for h in lost]
    for index, members in routed:
        sub, label = backend.backend(index), backend.groups[index].type
        if isinstance(sub, str):
            rows += [CheckRow(h, label, False, diag=sub) for h in members]
        else:
            rows += _check_one(sub, label, members, timeout, workers)
    return rows


def _check_one(backend: PowerBackend, label: str, hosts: List[str], timeout: float,
               workers: int) -> List[CheckRow]:
    if not hosts:
        return []
    if callable(getattr(backend, "check", None)):
        rounds = math.ceil(len(hosts) / max(1, workers))
        answers = concurrently(backend.check, hosts, timeout * rounds + 1.0, workers)
        return [_row_of(host, label, answers.get(host), timeout) for host in hosts]
    begin = time.monotonic()
    try:
        states = backend.status(hosts, time.time())
    except BackendError as exc:
        return [CheckRow(h, label, False, diag=str(exc)) for h in hosts]
    ms = (time.monotonic() - begin) * 1000.0
    rows = []
    for host in hosts:
        power = states.get(host)
        state = power.state if power is not None else PowerState.UNKNOWN
        rows.append(CheckRow(host, label, state is not PowerState.UNKNOWN, state.value, None,
                             (), ms, "" if state is not PowerState.UNKNOWN
                             else "power state unknown"))
    return rows


def _row_of(host: str, label: str, got: Optional[Tuple[Any, float]], timeout: float) -> CheckRow:
    if got is None:
        return CheckRow(host, label, False, diag="no answer within %gs" % timeout)
    answer, elapsed = got
    ms = elapsed * 1000.0
    if isinstance(answer, Exception):
        return CheckRow(host, label, False, latency_ms=ms,
                        diag="check raised %s: %s" % (type(answer).__name__, answer))
    if not isinstance(answer, Mapping) or not isinstance(answer.get("reachable"), bool):
        return CheckRow(host, label, False, latency_ms=ms,
                        diag="check gave no 'reachable' answer: %r" % (answer,))
    cap = answer.get("power_cap_watts")
    cap_ok = isinstance(cap, (int, float)) and not isinstance(cap, bool)
    state = answer.get("power_state")
    return CheckRow(host, str(answer.get("backend") or label), answer["reachable"],
                    state if isinstance(state, str) else None,
                    float(cap) if cap_ok else None, (), ms, str(answer.get("diag") or ""))


def concurrently(call: Callable[[str], Any], hosts: Sequence[str], deadline_s: float,
                 workers: int) -> Dict[str, Tuple[Any, float]]:
    """host -> (``call(host)`` or the exception it raised, seconds), as answered by the deadline.

    Daemon threads: a call that never returns is left behind, not waited for.
    """
    jobs: "queue.SimpleQueue[str]" = queue.SimpleQueue()
    done: "queue.SimpleQueue[Tuple[str, Any, float]]" = queue.SimpleQueue()
    for host in hosts:
        jobs.put(host)

    def work() -> None:
        while True:
            try:
                host = jobs.get_nowait()
            except queue.Empty:
                return
            begin = time.monotonic()
            try:
                out: Any = call(host)
            except Exception as exc:  # reported in the host's row
                out = exc
            done.put((host, out, time.monotonic() - begin))

    for i in range(min(max(1, workers), len(hosts))):
        threading.Thread(target=work, name="pbs_power-check-%d" % i, daemon=True).start()
    end = time.monotonic() + deadline_s
    got: Dict[str, Tuple[Any, float]] = {}
    while len(got) < len(hosts):
        try:
            host, out, elapsed = done.get(timeout=max(0.0, end - time.monotonic()))
        except queue.Empty:
            break
        got[host] = (out, elapsed)
    return got


# -- device backends ------------------------------------------------------------
class ReadOnlyStates:
    """The service's stored device states, read for pings and never overwritten."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def get_device_state(self, device: str) -> Optional[str]:
        return self.store.get_device_state(device)

    def get_device_states(self, devices: Sequence[str]) -> Dict[str, str]:
        return self.store.get_device_states(devices)

    def put_device_states(self, states: Mapping[str, str]) -> None:
        """A check changes nothing."""


def check_devices(topo: Any, hosts: Sequence[str], device_options: Mapping[str, Any],
                  store: Any = None, timeout: float = DEFAULT_TIMEOUT_S) -> List[CheckRow]:
    """A ping row for every host that is a topology entity."""
    from .controller import DEFAULT_BACKEND, DeviceController, DeviceRequest
    from .selection import build_device_backends
    entities = [h for h in dict.fromkeys(hosts) if h in topo.entities]
    if not entities:
        return []
    models = {h: {k: v for k, v in topo.device_model(h).items() if k != "entity"}
              for h in entities}
    requests = [DeviceRequest(h, "ping", {"retry_count": 0}, json.dumps(models[h], sort_keys=True),
                              timeout_seconds=timeout) for h in entities]
    try:
        backends = build_device_backends(device_options)
    except BackendError as exc:
        raise CheckError("device options: %s" % exc) from None
    workers = device_options.get("max_workers", 256)
    state = ReadOnlyStates(store) if store is not None else None
    with DeviceController(backends, state=state, max_workers=int(workers),
                          default_timeout=timeout, log=lambda level, msg: None) as ctl:
        answers = ctl.send(requests)
    rows = []
    for host in entities:
        resp = answers[host]
        rows.append(CheckRow(
            host, str(models[host].get("backend") or DEFAULT_BACKEND), resp.success, None,
            resp.power_cap_watts, tuple(r.power_cap_watts for r in resp.gpu_results),
            resp.elapsed_seconds * 1000.0, resp.error or resp.ping_error, "device"))
    return rows


# -- the whole check ------------------------------------------------------------
def run_check(config: Any, nodes: Optional[Sequence[str]] = None,
              state_dir: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT_S,
              workers: int = DEFAULT_WORKERS) -> CheckReport:
    """Check ``nodes`` (default: every node the config or the topology names)."""
    from . import get_backend
    state_dir = state_dir or config.state_dir
    device_options = dict(config.job_policies.device_options)
    topo, store, service = None, None, None
    try:
        if os.path.exists(os.path.join(state_dir, "resource_groups.db")):
            from pbs_power.groups.service import ResourceGroupService
            service = ResourceGroupService(state_dir, device_options)
            topo, store = service.topology()[0], service.store
        hosts = list(nodes) if nodes else _default_nodes(config, topo)
        if not hosts:
            raise CheckError("no nodes to check: name them (NODES), or use a power_backend of "
                             "type groups or an imported topology")
        try:
            backend = get_backend(config.power_backend, state_dir)
        except BackendError as exc:
            raise CheckError("power_backend: %s" % exc) from None
        try:
            rows = check_power(backend, hosts, timeout, workers)
        finally:
            backend.close()
        if topo is not None:
            rows += check_devices(topo, hosts, device_options, store, timeout)
    finally:
        if service is not None:
            service.close()
    order = {h: i for i, h in enumerate(hosts)}
    rows.sort(key=lambda r: (order.get(r.node, len(order)), r.node, r.kind != "power"))
    return CheckReport(tuple(rows))


def _default_nodes(config: Any, topo: Any) -> List[str]:
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet
    nodes = NodeSet(resolver=RESOLVER_NOGROUP)
    if config.power_backend.type == "groups":
        for group in config.power_backend.options.get("groups", ()):
            nodes.update(NodeSet(group["nodes"], resolver=RESOLVER_NOGROUP))
    if topo is not None:
        nodes.update(NodeSet.fromlist(sorted(topo.entities), resolver=RESOLVER_NOGROUP))
    return list(nodes)
