"""Send a resource-group operation's device requests, counting progress per host.

An operation (activate, update, update_resources, deactivate) is planned
and recorded in the store; its changes are carried out by `apply.Applier`,
whose device requests go out here: progress is written to the store as
answers arrive (at once when a waiting caller's threshold is reached), and
a cancellation (a delete during an asynchronous activation) stops the
sending. The same code runs in the calling process (synchronous) or in a
detached worker (`python -m pbs_power.groups.worker`) that outlives a
prolog which asked for asynchronous activation.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from .store import GroupStore

#: Progress is written at least this often (s) while answers arrive.
PROGRESS_MIN_INTERVAL = 0.05


@dataclass(frozen=True)
class HostOutcome:
    """One device's answer, as the service reports it per node."""

    ok: bool
    diag_msg: str = ""
    policy: Optional[str] = None
    power_cap_watts: Optional[float] = None
    #: the device's per-GPU results (GPU limit changes), not part of the answer's dict
    gpus: Tuple[Any, ...] = ()

    def to_dict(self) -> Dict[str, Any]:
        return {"ok": self.ok, "diag_msg": self.diag_msg, "policy": self.policy,
                "power_cap_watts": self.power_cap_watts}


def required_successes(n: int, partial: Mapping[str, Any]) -> int:
    """Hosts that must succeed: all, or at least N / a fraction of them (never 0 of n > 0)."""
    if partial.get("atleast_n_hosts") is not None:
        need = int(partial["atleast_n_hosts"])
    elif partial.get("atleast_frac_hosts") is not None:
        need = int(-(-float(partial["atleast_frac_hosts"]) * n // 1))       # ceil
    else:
        need = n
    return min(n, max(1, need))


def spawn_worker(state_dir: str, op_id: str) -> int:
    """Start a detached process that finishes operation ``op_id``; its pid."""
    import subprocess  # only async activations start a worker
    proc = subprocess.Popen(
        [sys.executable, "-m", "pbs_power.groups.worker", state_dir, op_id],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    return proc.pid


def run_requests(store: GroupStore, controller, op_id: Optional[str], requests: Sequence,
                 wait_for: Optional[int] = None,
                 cancelled: Callable[[], bool] = lambda: False) -> Dict[str, HostOutcome]:
    """Send ``requests``; add each answer to the operation's progress in the store.

    Progress is written when ``wait_for`` hosts are done (a caller waits for
    that), and otherwise at most every PROGRESS_MIN_INTERVAL. When
    ``cancelled()`` turns true the rest is abandoned: those hosts fail with
    "cancelled", and the ledger keeps counting them at their higher value.
    """
    outcomes: Dict[str, HostOutcome] = {}
    op = store.operation(op_id) if op_id else None
    ok, bad = (op.n_success, op.n_failed) if op else (0, 0)
    written = checked = time.monotonic()
    stream = controller.stream(requests)
    try:
        for resp in stream:
            policy = (resp.policy or {}).get("name") if resp.success else None
            outcomes[resp.device] = HostOutcome(resp.success, resp.error, policy,
                                                resp.power_cap_watts, tuple(resp.gpu_results))
            ok, bad = (ok + 1, bad) if resp.success else (ok, bad + 1)
            now = time.monotonic()
            if op is not None and (ok + bad == wait_for or now - written >= PROGRESS_MIN_INTERVAL):
                written = now
                with store.transaction():
                    store.set_operation(op.id, n_success=ok, n_failed=bad)
            if now - checked >= PROGRESS_MIN_INTERVAL:
                checked = now
                if cancelled():
                    break
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    for req in requests:
        if req.device not in outcomes:
            outcomes[req.device] = HostOutcome(False, "cancelled before the device answered")
            bad += 1
    if op is not None:
        with store.transaction():
            store.set_operation(op.id, n_success=ok, n_failed=bad)
    if bad:
        from .records import count_device_errors
        count_device_errors(store, requests, outcomes)
    return outcomes


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (one we may not signal counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["HostOutcome", "required_successes", "spawn_worker", "run_requests", "process_alive"]
