"""How the resource-group service carries its operations out.

A mixin of `ResourceGroupService`: record a plan as an operation, run it
(here, or in a detached worker for an asynchronous request), settle the
group, end a group (its nodes back toward their topology policy, within the
budget), let freed watts flow back, and repair what a dead process left.
Every device change goes through `apply.Applier`, so through the ledger.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .apply import Applied, Applier, Change, payload
from .ledger import Book
from .records import count_activation, group_event
from .execute import (HostOutcome, process_alive, required_successes, run_requests,
                      spawn_worker)
from .planning import Planner
from .rebalance import raises
from .store import MemberRow, OperationRow
from .types import AsyncStrategy, PartialActivation, Response, Status, failures

POLL_SECONDS = 0.02
ENDING = ("activating", "deactivating", "cancelling")


class OperationMixin:
    """Recording, running, settling, ending and repairing for ResourceGroupService."""

    def _record(self, plan, op_type: str, group_name: str, partial: Optional[PartialActivation],
                strategy: Optional[AsyncStrategy], activating: bool = False) -> OperationRow:
        """Write the plan and its operation (inside the caller's transaction)."""
        if activating:
            self.store.set_group(group_name, status="activating", owner_pid=os.getpid())
        n = len(plan.changes)
        op = OperationRow(os.urandom(16).hex(), group_name, op_type, self.clock(), n, 0, 0, False,
                          os.getpid(), {
                              "changes": [c.to_json() for c in plan.changes],
                              "partial": asdict(partial) if partial else {},
                              "device_options": self.device_options, "note": plan.note,
                              "async": strategy is not None,
                              "wait_for": _wait_for(strategy, n)}, None)
        self.store.insert_operation(op)
        return op

    def _run(self, op: OperationRow, strategy: Optional[AsyncStrategy]) -> Response:
        if strategy is None:
            return self.finish_operation(op.id)
        pid = spawn_worker(self.state_dir, op.id)
        with self.store.transaction():
            self.store.set_operation(op.id, worker_pid=pid)
            if op.type == "activate":
                self.store.set_group(op.group_name, owner_pid=pid)
        self._wait(op, strategy)
        return Response(Status(True, "async"), operation_id=op.id)

    def _wait(self, op: OperationRow, strategy: AsyncStrategy) -> None:
        """Block until the strategy's condition holds (or the operation completes)."""
        deadline = time.monotonic() + (strategy.wait_seconds or 0.0)
        need = op.request.get("wait_for")
        while True:
            row = self.store.operation(op.id)
            if row is None or row.completed:
                return
            if need is not None and row.n_success + row.n_failed >= need:
                return
            if need is None and time.monotonic() >= deadline:
                return
            time.sleep(POLL_SECONDS)

    def finish_operation(self, op_id: str) -> Response:
        """Carry an operation's changes out and settle the group (sync or worker)."""
        op = self.store.operation(op_id)
        topo, _active = self.topology()
        changes = [Change.from_json(c) for c in op.request.get("changes", [])]
        partial = op.request.get("partial") or {}
        applied = self._applier(topo, op).run(changes)
        response = self._settle(op, changes, applied, partial)
        self._flow_back(response)
        with self.store.transaction():
            if op.request.get("async"):
                self.store.set_operation(op_id, completed=1, result=response.to_dict())
            else:
                self.store.delete_operation(op_id)
        return response

    def _settle(self, op: OperationRow, changes: Sequence[Change], applied: Applied,
                partial: Mapping[str, Any]) -> Response:
        own = [c.entity for c in changes if c.group == op.group_name]
        outcomes = applied.outcomes
        ok = sum(1 for e in own if outcomes.get(e) and outcomes[e].ok)
        need = required_successes(len(own), partial)
        note = "; ".join(x for x in [op.request.get("note") or ""] + applied.notes if x)
        if op.type == "activate":
            with self.store.transaction():
                group = self.store.group(op.group_name)
                cancelled = group is None or group.status == "cancelling"
                if not cancelled and ok >= need:
                    self.store.set_group(op.group_name, status="active", owner_pid=None,
                                         activated=self.clock())
            succeeded = not cancelled and ok >= need
            count_activation(self.store, None if op.created is None
                             else self.clock() - op.created, succeeded)
            group_event(self.store, self.clock(), op.group_name,
                        "activated" if succeeded else "activation failed",
                        group.policy if group else None, own)
            if cancelled or ok < need:
                self._end_group(op.group_name)
                why = ("cancelled: the group is being deleted" if cancelled else
                       "only %d of %d hosts activated (need %d): %s"
                       % (ok, len(own), need, failures({e: outcomes[e] for e in own
                                                         if e in outcomes})))
                return Response(Status(False, why), outcomes)
        failed = failures(outcomes)
        msg = "; ".join(x for x in (note, ("failed: " + failed) if failed else "") if x)
        return Response(Status(ok >= need, msg or "%d host(s) done" % ok), outcomes)

    def _end_group(self, group_name: str) -> Applied:
        """Send the group's nodes back toward their topology policy; the group is inactive."""
        topo, _active = self.topology()
        members = self.store.members(group_name)
        changes = Planner(topo, self.store).restore(group_name, [m.entity for m in members])
        applied = self._applier(topo, None).run(changes)
        with self.store.transaction():
            self.store.put_members([MemberRow(m.entity, m.group_name, m.policy)
                                    for m in members])
            self.store.set_group(group_name, status="inactive", owner_pid=None)
        group_event(self.store, self.clock(), group_name, "deactivated", None,
                    [m.entity for m in members])
        return applied

    def _flow_back(self, response: Optional[Response] = None) -> None:
        """Raise what runs below its request where the budget has room (see rebalance)."""
        topo, active = self.topology()
        if topo is None or not active:
            return
        with self.store.transaction():
            changes = raises(topo, self.store)
        if not changes:
            return
        applied = self._applier(topo, None).run(changes, two_rounds=False, quiet=True)
        raised: Dict[Tuple[str, str], List[str]] = {}
        for change in changes:
            level = applied.levels.get(change.entity)
            if level is not None and applied.outcomes[change.entity].ok and change.group:
                key = (change.group, level[0] or "uncapped")
                raised.setdefault(key, []).append(change.entity)
        if raised and response is not None:
            text = ", ".join("%s to %s on %d host(s)" % (g, p, len(es))
                             for (g, p), es in sorted(raised.items()))
            response.status.diag_msg = "; ".join(
                x for x in (response.status.diag_msg, "raised " + text + " as the budget "
                            "allows") if x)

    def _waiting(self, entities: Sequence[str]) -> str:
        """``n1, n2 wait at Min ...``: idle entities still below their topology policy."""
        topo, _active = self.topology()
        with self.store.transaction():
            book = Book(topo, self.store)
            members = self.store.member_groups(list(entities))
            busy = {e for e, g in members.items()
                    if getattr(self.store.group(g), "status", "inactive") != "inactive"}
            below: Dict[str, List[str]] = {}
            for e in entities:
                held = book.holding(e)
                top = topo.node_watts(e, topo.topology_policy(e))
                if e not in busy and held.watts < top - 1e-6:
                    below.setdefault(held.policy or "uncapped", []).append(e)
        return "; ".join("%s wait at %s, below their topology policy, until the budget has "
                         "room" % (_names(es), p) for p, es in sorted(below.items()))

    def _applier(self, topo, op: Optional[OperationRow]) -> Applier:
        timeout = None
        wait_for = None
        if op is not None:
            timeout = (op.request.get("partial") or {}).get("host_activation_timeout")
            wait_for = op.request.get("wait_for")
        group = op.group_name if op is not None and op.type == "activate" else None
        cancelled = self._cancel_check(group)

        def send(pairs: Sequence[Tuple[Change, Any]]) -> Dict[str, HostOutcome]:
            if cancelled():
                return {c.entity: HostOutcome(False, "cancelled before it was sent")
                        for c, _level in pairs}
            requests = [self._request(topo, c.entity, c.kind, payload(topo, c, level), timeout)
                        for c, level in pairs]
            return run_requests(self.store, self.controller, op.id if op else None, requests,
                                wait_for, cancelled)
        return Applier(topo, self.store, send, patience=self._device_timeout() + 1.0)

    def _cancel_check(self, group_name: Optional[str]) -> Callable[[], bool]:
        """Whether a delete asked to cancel the activation of ``group_name``."""
        if group_name is None:
            return lambda: False

        def cancelled() -> bool:
            group = self.store.group(group_name)
            return group is None or group.status == "cancelling"
        return cancelled

    def _cancel_activation(self, group_name: str, deadline_s: float) -> bool:
        """Ask a running activation to stop; wait until it has. False when it did not."""
        with self.store.transaction():
            group = self.store.group(group_name)
            if group is None or group.status != "activating":
                return True
            if group.owner_pid == os.getpid():
                return False
            self.store.set_group(group_name, status="cancelling")
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            group = self.store.group(group_name)
            if group is None or group.status not in ENDING:
                return True
            if group.owner_pid and not process_alive(group.owner_pid):
                self._repair(group_name)
                return True
            time.sleep(POLL_SECONDS * 5)
        return False

    def repair(self, group_name: str) -> None:
        """End an activation or deactivation whose process died midway (within budget);
        nothing for a group that is not in one, or whose process still runs."""
        self._repair(group_name)

    def _repair(self, group_name: str) -> None:
        """End an activation or deactivation whose process died midway (within budget)."""
        with self.store.transaction():
            group = self.store.group(group_name)
            if group is None or group.status not in ENDING:
                return
            if group.owner_pid and process_alive(group.owner_pid):
                return
            self.store.set_group(group_name, status="deactivating", owner_pid=os.getpid())
        self.log("warning", "%s: %s by pid %s was interrupted; restoring topology policies"
                 % (group_name, group.status, group.owner_pid))
        self._end_group(group_name)
        with self.store.transaction():
            self.store.set_group(group_name, diag="%s by pid %s was interrupted"
                                 % (group.status, group.owner_pid))
        self._flow_back()


def _names(entities: Sequence[str]) -> str:
    shown = ", ".join(entities[:10])
    return shown + (" and %d more" % (len(entities) - 10) if len(entities) > 10 else "")


def _wait_for(strategy: Optional[AsyncStrategy], n_hosts: int) -> Optional[int]:
    """Hosts an asynchronous caller waits for (None: it waits for a time)."""
    if strategy is None:
        return None
    if strategy.n_hosts is not None:
        return min(n_hosts, strategy.n_hosts)
    if strategy.frac_hosts is not None:
        return int(-(-float(strategy.frac_hosts) * n_hosts // 1))
    return None


__all__ = ["OperationMixin", "ENDING"]
