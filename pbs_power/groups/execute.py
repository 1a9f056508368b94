"""Carry a planned resource-group operation out on the devices.

An operation (activate, update, update_resources, deactivate) is first
planned and recorded in the store inside one transaction (watts reserved,
so concurrent activations see them); then its device requests are sent
here, progress is counted in the store as responses arrive, and the group
is settled in a last transaction. The same code runs in the calling process
(synchronous) or in a detached worker (`python -m pbs_power.groups.worker`)
that outlives a prolog which asked for asynchronous activation.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from pbs_power._records import evolve
from .store import GroupStore, MemberRow, OperationRow

#: Responses between two progress writes to the store, and at most this often (s).
PROGRESS_EVERY = 8
PROGRESS_MIN_INTERVAL = 0.05


@dataclass(frozen=True)
class HostOutcome:
    """One device's answer, as the service reports it per node."""

    ok: bool
    diag_msg: str = ""
    policy: Optional[str] = None
    power_cap_watts: Optional[float] = None

    def to_dict(self) -> Dict[str, Any]:
        return {"ok": self.ok, "diag_msg": self.diag_msg, "policy": self.policy,
                "power_cap_watts": self.power_cap_watts}


def required_successes(n: int, partial: Mapping[str, Any]) -> int:
    """Hosts that must succeed: all, or at least N / a fraction of them."""
    if partial.get("atleast_n_hosts") is not None:
        return min(n, int(partial["atleast_n_hosts"]))
    if partial.get("atleast_frac_hosts") is not None:
        frac = float(partial["atleast_frac_hosts"])
        return min(n, max(0, int(-(-frac * n // 1))))       # ceil
    return n


def spawn_worker(state_dir: str, op_id: str) -> int:
    """Start a detached process that finishes operation ``op_id``; its pid."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pbs_power.groups.worker", state_dir, op_id],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    return proc.pid


def run_requests(store: GroupStore, controller, op: OperationRow, requests: Sequence,
                 ) -> Dict[str, HostOutcome]:
    """Send ``requests`` through the controller, counting progress in the store."""
    outcomes: Dict[str, HostOutcome] = {}
    ok = bad = 0
    written = time.monotonic()
    for i, resp in enumerate(controller.stream(requests), 1):
        policy = (resp.policy or {}).get("name") if resp.success else None
        outcomes[resp.device] = HostOutcome(resp.success, resp.error, policy, resp.power_cap_watts)
        ok, bad = (ok + 1, bad) if resp.success else (ok, bad + 1)
        if i % PROGRESS_EVERY == 0 and time.monotonic() - written >= PROGRESS_MIN_INTERVAL:
            written = time.monotonic()
            with store.transaction():
                store.set_operation(op.id, n_success=ok, n_failed=bad)
    with store.transaction():
        store.set_operation(op.id, n_success=ok, n_failed=bad)
    if bad:
        from .records import count_device_errors
        count_device_errors(store, requests, outcomes)
    return outcomes


def settle_members(members: Sequence[MemberRow], outcomes: Mapping[str, HostOutcome],
                   planned: Mapping[str, Tuple[Optional[str], float]],
                   fallback: Mapping[str, Tuple[Optional[str], Optional[float]]]
                   ) -> List[MemberRow]:
    """Member rows after an operation: planned values where the device took them.

    A host whose device failed keeps ``fallback`` (what it had before), so
    its watts are never counted at a value the hardware does not hold.
    """
    out = []
    for m in members:
        if m.entity not in planned:
            out.append(m)
            continue
        result = outcomes.get(m.entity)
        if result is not None and result.ok:
            name, watts = planned[m.entity]
            out.append(evolve(m, applied_policy=name, applied_watts=watts, state="active",
                               diag=""))
        else:
            name, watts = fallback.get(m.entity, (None, None))
            diag = result.diag_msg if result is not None else "no answer"
            out.append(evolve(m, applied_policy=name, applied_watts=watts,
                               state="failed" if watts is None else m.state, diag=diag))
    return out


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (one we may not signal counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["HostOutcome", "required_successes", "spawn_worker", "run_requests",
           "settle_members", "process_alive"]
