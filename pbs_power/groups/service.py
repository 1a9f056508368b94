"""The resource-group service: a job's power policy, from creation to deletion.

Implements the resource-group API our seeds document (create, add/remove
resources, activate, deactivate, update, update resources, delete, list,
UpdateGPUPolicies, AsyncOperationStatus) over the topology and the device
controller. Effective policy = entity > group > topology. Activation checks
every power domain the group's nodes sit in; it falls back to lower topology
policies unless strict, and may lower other groups' policies when asked to
(``allow_reprovision``). Every answer carries a `Status`; nothing raises for
a bad request.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple

from .execute import (HostOutcome, process_alive, required_successes, run_requests,
                      settle_members, spawn_worker)
from .planning import Planner, PlanError
from .records import count_activation, count_device_errors, group_event
from .queries import QueryMixin
from .topology_rpc import TopologyMixin
from .types import (AsyncStrategy, PartialActivation, Response, Status, fail, failures,
                       outcomes_of, policy_dict)
from .store import GroupRow, GroupStore, MemberRow, OperationRow

GROUP_NAME = re.compile(r"[A-Za-z0-9_.:@+-]{1,128}")
POLL_SECONDS = 0.02


class ResourceGroupService(TopologyMixin, QueryMixin):
    """Every resource-group RPC, over one state directory."""

    def __init__(self, state_dir: str, device_options: Optional[Mapping[str, Any]] = None,
                 controller=None, log=None, clock=time.time):
        self.state_dir = os.path.abspath(state_dir)
        self.store = GroupStore(self.state_dir)
        self.device_options = dict(device_options or {})
        self._controller = controller
        self.log = log or (lambda level, msg: None)
        self.clock = clock
        self._topology_cache: Tuple[Optional[str], Any] = (None, None)

    @classmethod
    def from_operation(cls, state_dir: str, op_id: str) -> "ResourceGroupService":
        """The service as the process that planned ``op_id`` configured it."""
        probe = GroupStore(state_dir)
        op = probe.operation(op_id)
        probe.close()
        return cls(state_dir, (op.request if op else {}).get("device_options"))

    def close(self) -> None:
        if self._controller is not None:
            self._controller.close()
        self.store.close()

    @property
    def controller(self):
        if self._controller is None:
            from pbs_power.devices.controller import DeviceController
            from pbs_power.devices.selection import build_device_backends
            backends = build_device_backends(self.device_options)
            self._controller = DeviceController(
                backends, state=self.store,
                max_workers=int(self.device_options.get("max_workers", 256)),
                default_timeout=float(self.device_options.get("timeout_seconds", 30.0)),
                log=self.log)
        return self._controller

    # -- lifecycle -----------------------------------------------------------
    def create(self, group_name: str, external_id: Optional[int] = None,
               policy_name: Optional[str] = None, workload_profile_ids: Sequence[int] = (),
               prs_enabled: Optional[bool] = None, dpm_enable: bool = True,
               properties: Optional[Mapping[str, Any]] = None) -> Response:
        """A new, empty, inactive group; its name is unique."""
        bad = _check_name(group_name) or _check_external_id(external_id)
        if bad:
            return fail(bad, "invalid")
        with self.store.transaction():
            topo, active = self.topology()
            if topo is None or not active:
                return fail("no active topology: import and activate one first", "invalid")
            if policy_name is not None and policy_name not in topo.policies:
                return fail(_unknown_policy(topo, policy_name), "invalid")
            if self.store.group(group_name) is not None:
                return fail("resource group %s already exists" % group_name, "invalid")
            self.store.insert_group(GroupRow(
                group_name, external_id, policy_name, tuple(int(i) for i in workload_profile_ids),
                prs_enabled, bool(dpm_enable), dict(properties or {}), "inactive",
                self.clock(), None, None))
        return Response(Status(True, "resource group %s created" % group_name))

    def add_resources(self, group_name: str, resource_names: Sequence[str],
                      policy_name: Optional[str] = None) -> Response:
        """Put entities in an inactive group, all or none."""
        with self.store.transaction():
            topo, group, err = self._inactive_group(group_name)
            if err:
                return err
            names = list(dict.fromkeys(resource_names))
            problem = (_unknown_entities(topo, names) or
                       (_unknown_policy(topo, policy_name)
                        if policy_name is not None and policy_name not in topo.policies else ""))
            if not names:
                problem = "no resources named"
            taken = self.store.member_groups(names)
            if not problem and taken:
                problem = "; ".join("%s is already in resource group %s" % kv
                                    for kv in sorted(taken.items())[:10])
            if problem:
                return fail(problem, "invalid")
            self.store.add_members(group_name, names, policy_name)
        return Response(Status(True, "%d resource(s) added to %s" % (len(names), group_name)))

    def remove_resources(self, group_name: str, resource_names: Sequence[str]) -> Response:
        """Take entities out of an inactive group, all or none."""
        with self.store.transaction():
            topo, group, err = self._inactive_group(group_name)
            if err:
                return err
            names = list(dict.fromkeys(resource_names))
            members = {m.entity for m in self.store.members(group_name)}
            missing = [n for n in names if n not in members]
            if missing or not names:
                return fail("not in %s: %s" % (group_name, ", ".join(missing[:10]))
                             if missing else "no resources named", "invalid")
            self.store.remove_members(group_name, names)
        return Response(Status(True, "%d resource(s) removed from %s" % (len(names), group_name)))

    def activate(self, group_name: str, strict: bool = False,
                 async_strategy: Optional[AsyncStrategy] = None,
                 partial: Optional[PartialActivation] = None,
                 allow_reprovision: bool = False) -> Response:
        """Apply the group's policies within the power budget; see the module docstring."""
        self._repair(group_name)
        with self.store.transaction():
            topo, group, err = self._inactive_group(group_name)
            if err:
                return err
            members = self.store.members(group_name)
            if not members:
                return fail("resource group %s has no resources" % group_name, "invalid")
            try:
                plan = Planner(topo, self.store).activation(
                    group, members, strict or not group.dpm_enable, allow_reprovision)
            except PlanError as exc:
                return fail(str(exc))
            op = self._record(plan, "activate", group_name, partial,
                              async_strategy is not None, activating=True)
        return self._run(op, async_strategy)

    def deactivate(self, group_name: str) -> Response:
        """Return an active group's entities to their topology policies."""
        self._repair(group_name)
        with self.store.transaction():
            group = self.store.group(group_name)
            if group is None:
                return fail("no resource group %s" % group_name, "not_found")
            if group.status != "active":
                return fail("resource group %s is %s, not active" % (group_name, group.status),
                             "invalid")
            self.store.set_group(group_name, status="deactivating", owner_pid=os.getpid())
        return self._restore(group_name)

    def delete(self, group_name: str) -> Response:
        """Deactivate if active, then forget the group; topology policies return."""
        self._repair(group_name)
        group = self.store.group(group_name)
        if group is None:
            return fail("no resource group %s" % group_name, "not_found")
        note = ""
        if group.status == "active":
            result = self.deactivate(group_name)
            note = "" if result.status.ok else " (" + result.status.diag_msg + ")"
        with self.store.transaction():
            current = self.store.group(group_name)
            if current is not None and current.status in ("activating", "deactivating"):
                return fail("resource group %s is busy (%s by pid %s)"
                             % (group_name, current.status, current.owner_pid), "busy")
            self.store.delete_group(group_name)
        return Response(Status(True, "resource group %s deleted%s" % (group_name, note)))

    def update(self, group_name: str, policy_name: Optional[str], strict: bool = False,
               async_strategy: Optional[AsyncStrategy] = None,
               partial: Optional[PartialActivation] = None,
               workload_profile_ids: Optional[Sequence[int]] = None) -> Response:
        """Change (or with None remove) the group policy; applied at once if active."""
        self._repair(group_name)
        try:
            with self.store.transaction():
                op = self._plan_update(group_name, policy_name, strict, partial,
                                       workload_profile_ids, async_strategy is not None)
        except _Abort as abort:
            return abort.response
        if op is None:
            return Response(Status(True, "policy of %s %s" % (
                group_name, "set to %s" % policy_name if policy_name else "removed")))
        return self._run(op, async_strategy)

    def _plan_update(self, group_name, policy_name, strict, partial, workload_profile_ids,
                     is_async) -> Optional[OperationRow]:
        topo, _active = self.topology()
        group = self.store.group(group_name)
        if group is None:
            raise _Abort(fail("no resource group %s" % group_name, "not_found"))
        if policy_name is not None and (topo is None or policy_name not in topo.policies):
            raise _Abort(fail(_unknown_policy(topo, policy_name) if topo else
                               "no topology", "invalid"))
        extra = {} if workload_profile_ids is None else {
            "workload_profile_ids": tuple(workload_profile_ids)}
        self.store.set_group(group_name, policy=policy_name, **extra)
        if group.status != "active":
            return None
        group = self.store.group(group_name)
        try:
            plan = Planner(topo, self.store).change(group, self.store.members(group_name),
                                                    strict or not group.dpm_enable)
        except PlanError as exc:
            raise _Abort(fail(str(exc)))
        return self._record(plan, "update", group_name, partial, is_async)

    def update_resources(self, group_name: str, updates: Mapping[str, Optional[str]],
                         async_strategy: Optional[AsyncStrategy] = None,
                         partial: Optional[PartialActivation] = None) -> Response:
        """Set (or with None/'' remove) entity-level policies; partial updates allowed."""
        self._repair(group_name)
        with self.store.transaction():
            topo, _active = self.topology()
            group = self.store.group(group_name)
            if group is None:
                return fail("no resource group %s" % group_name, "not_found")
            members = {m.entity: m for m in self.store.members(group_name)}
            rejected: Dict[str, HostOutcome] = {}
            accepted: Dict[str, Optional[str]] = {}
            for entity, name in updates.items():
                name = name or None
                if entity not in members:
                    rejected[entity] = HostOutcome(False, "not in resource group %s" % group_name)
                elif name is not None and name not in topo.policies:
                    rejected[entity] = HostOutcome(False, _unknown_policy(topo, name))
                else:
                    accepted[entity] = name
            changed = [MemberRow(**dict(asdict(members[e]), policy=p)) for e, p in accepted.items()]
            self.store.put_members(changed)
            if group.status != "active" or not accepted:
                return Response(Status(not rejected, _summary(accepted, rejected),
                                       "invalid" if rejected else "ok"), rejected)
            plan = Planner(topo, self.store).change(
                group, self.store.members(group_name), strict=True, per_entity=True)
            op = self._record(plan, "update", group_name, partial, async_strategy is not None)
        response = self._run(op, async_strategy)
        response.node_statuses.update(plan.refused)
        if plan.refused or rejected:
            response.status = Status(False, _summary(accepted, {**rejected, **plan.refused}),
                                     "failed" if plan.refused else "invalid")
        return response

    # -- execution -----------------------------------------------------------
    def _record(self, plan, op_type: str, group_name: str, partial: Optional[PartialActivation],
                is_async: bool, activating: bool = False) -> OperationRow:
        """Write the plan (watts reserved) and its operation; inside a transaction."""
        self.store.put_members(plan.reserved)
        if activating:
            self.store.set_group(group_name, status="activating", owner_pid=os.getpid())
        for other in plan.lowered_groups:
            self.store.put_members(other)
        op = OperationRow(os.urandom(16).hex(), group_name, op_type, self.clock(),
                          len(plan.requests), 0, 0, False, os.getpid(), {
                              "requests": plan.requests, "fallback": plan.fallback,
                              "partial": asdict(partial) if partial else {},
                              "device_options": self.device_options,
                              "note": plan.note, "async": is_async}, None)
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
        need = (strategy.n_hosts if strategy.n_hosts is not None else
                -(-float(strategy.frac_hosts) * op.n_hosts // 1)
                if strategy.frac_hosts is not None else None)
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
        """Send an operation's device requests and settle the group (sync or worker)."""
        from .planning import build_requests
        op = self.store.operation(op_id)
        topo, _active = self.topology()
        partial = op.request.get("partial") or {}
        requests = build_requests(topo, op.request["requests"],
                                  partial.get("host_activation_timeout"), self._request)
        outcomes = run_requests(self.store, self.controller, op, requests)
        response = self._settle(op, outcomes, partial)
        with self.store.transaction():
            if op.request.get("async"):
                self.store.set_operation(op_id, completed=1, result=response.to_dict())
            else:
                self.store.delete_operation(op_id)
        return response

    def _settle(self, op: OperationRow, outcomes: Mapping[str, HostOutcome],
                partial: Mapping[str, Any]) -> Response:
        group_name = op.group_name
        planned = {e: (r["policy_name"], r["watts"]) for e, r in op.request["requests"].items()
                   if r["group"] == group_name}
        fallback = {e: tuple(v) for e, v in op.request["fallback"].items()}
        need = required_successes(len(planned), partial)
        ok = sum(1 for e in planned if outcomes.get(e) and outcomes[e].ok)
        with self.store.transaction():
            for name in {r["group"] for r in op.request["requests"].values()} - {group_name}:
                lowered = {e: (r["policy_name"], r["watts"])
                           for e, r in op.request["requests"].items() if r["group"] == name}
                self.store.put_members(settle_members(self.store.members(name), outcomes,
                                                      lowered, fallback))
            members = self.store.members(group_name)
            if op.type == "activate" and ok < need:
                self.store.put_members([MemberRow(m.entity, m.group_name, m.policy)
                                        for m in members])
                self.store.set_group(group_name, status="inactive", owner_pid=None)
            else:
                self.store.put_members(settle_members(members, outcomes, planned, fallback))
                if op.type == "activate":
                    self.store.set_group(group_name, status="active", owner_pid=None,
                                         activated=self.clock())
            if op.type == "activate":
                count_activation(self.store, None if op.created is None
                                 else self.clock() - op.created, ok >= need)
                row = self.store.group(group_name)
                group_event(self.store, self.clock(), group_name,
                            "activated" if ok >= need else "activation failed",
                            row.policy if row else None, [m.entity for m in members])
        if op.type == "activate" and ok < need:
            self._restore_hosts(group_name, [e for e in planned if outcomes.get(e, None)
                                             and outcomes[e].ok])
            return Response(Status(False, "only %d of %d hosts activated (need %d): %s"
                                   % (ok, len(planned), need, failures(outcomes))), outcomes)
        note = op.request.get("note") or ""
        failed = failures(outcomes)
        msg = "; ".join(x for x in (note, ("failed: " + failed) if failed else "") if x)
        return Response(Status(ok == len(planned) or op.type == "activate",
                               msg or "%d host(s) done" % ok), outcomes)

    def _restore(self, group_name: str) -> Response:
        members = self.store.members(group_name)
        outcomes = self._restore_hosts(group_name, [m.entity for m in members])
        with self.store.transaction():
            self.store.put_members([MemberRow(m.entity, m.group_name, m.policy) for m in members])
            self.store.set_group(group_name, status="inactive", owner_pid=None)
            group_event(self.store, self.clock(), group_name, "deactivated", None,
                        [m.entity for m in members])
        failed = failures(outcomes)
        return Response(Status(not failed, "resource group %s deactivated%s" % (
            group_name, "; devices failed: " + failed if failed else "")), outcomes)

    def _restore_hosts(self, group_name: str, entities: Sequence[str]) -> Dict[str, HostOutcome]:
        """Tell devices to go back to their topology policy (GPU policies reset)."""
        topo, _active = self.topology()
        requests = [self._request(topo, e, "resource_group_deactivate", {
            "resource_group": group_name,
            "policy": {"policy_action": "unset", "policy": policy_dict(topo.topology_policy(e))},
            "gpu_policies": {"gpu_policy_action": "reset", "gpu_policies": [],
                             "current_policy": policy_dict(topo.topology_policy(e))}})
            for e in entities if e in topo.entities]
        outcomes = outcomes_of(self.controller.send(requests)) if requests else {}
        count_device_errors(self.store, requests, outcomes)
        return outcomes

    def _request(self, topo, entity: str, kind: str, payload: Mapping[str, Any],
                 timeout: Optional[float] = None):
        from pbs_power.devices.controller import DeviceRequest
        return DeviceRequest(device=entity, kind=kind, payload=payload,
                             device_model_json=_model_json(topo, entity),
                             timeout_seconds=timeout)

    # -- helpers -------------------------------------------------------------
    def _inactive_group(self, name: str):
        topo, active = self.topology()
        if topo is None or not active:
            return None, None, fail("no active topology", "invalid")
        group = self.store.group(name)
        if group is None:
            return topo, None, fail("no resource group %s" % name, "not_found")
        if group.status != "inactive":
            return topo, group, fail("resource group %s is %s; it must be inactive"
                                      % (name, group.status), "invalid")
        return topo, group, None

    def _repair(self, group_name: str) -> None:
        """Undo an activation or deactivation whose process died midway."""
        group = self.store.group(group_name)
        if group is None or group.status not in ("activating", "deactivating"):
            return
        if group.owner_pid and process_alive(group.owner_pid):
            return
        self.log("warning", "%s: %s by pid %s was interrupted; restoring topology policies"
                 % (group_name, group.status, group.owner_pid))
        self._restore(group_name)
        with self.store.transaction():
            self.store.set_group(group_name, diag="%s by pid %s was interrupted"
                                 % (group.status, group.owner_pid))


class _Abort(Exception):
    """Leave a transaction (rolled back) with a ready answer."""

    def __init__(self, response: Response):
        super().__init__(response.status.diag_msg)
        self.response = response


# -- small pure helpers --------------------------------------------------------
def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not GROUP_NAME.fullmatch(name):
        return ("resource group name must be 1-128 characters of letters, digits and "
                "_ . : @ + -, got %r" % (name,))
    return ""


def _check_external_id(ext: Any) -> str:
    if ext is None:
        return ""
    if isinstance(ext, bool) or not isinstance(ext, int) or not -2 ** 63 <= ext < 2 ** 63:
        return "external id must be a 64-bit integer, got %r" % (ext,)
    return ""


def _unknown_policy(topo, name: str) -> str:
    import difflib
    close = difflib.get_close_matches(name, list(topo.policies), 1)
    return "no policy %r in topology %s%s" % (
        name, topo.name, " (did you mean %r?)" % close[0] if close else "")


def _unknown_entities(topo, names: Iterable[str]) -> str:
    missing = [n for n in names if n not in topo.entities]
    if not missing:
        return ""
    return "not in topology %s: %s%s" % (topo.name, ", ".join(missing[:10]),
                                         " and %d more" % (len(missing) - 10)
                                         if len(missing) > 10 else "")


def _summary(accepted: Mapping[str, Any], rejected: Mapping[str, HostOutcome]) -> str:
    parts = ["%d updated" % len(accepted)]
    if rejected:
        parts.append("%d refused: %s" % (len(rejected), failures(rejected)))
    return "; ".join(parts)


def _model_json(topo, entity: str) -> str:
    """The device model of the entity's spec as JSON text, encoded once per spec.

    Every entity of a spec shares it (the request's ``device`` names the
    entity), so devices and the controller parse each model once per batch.
    """
    model = topo.device_model(entity)
    cache = topo.__dict__.setdefault("_model_json_cache", {})
    text = cache.get(model["device_spec"])
    if text is None:
        text = cache[model["device_spec"]] = json.dumps(
            {k: v for k, v in model.items() if k != "entity"}, sort_keys=True)
    return text


__all__ = ["ResourceGroupService", "AsyncStrategy", "PartialActivation", "Status", "Response"]
