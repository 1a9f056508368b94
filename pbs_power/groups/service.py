"""The resource-group service: a job's power policy, from creation to deletion.

Implements the resource-group API our seeds document (create, add/remove
resources, activate, deactivate, update, update resources, delete, list,
UpdateGPUPolicies, AsyncOperationStatus) over the topology and the device
controller. Effective policy = entity > group > topology. Every change of a
device's limit is reserved in the power ledger first (see `ledger`), so per
power domain the watts counted never exceed the budget, whatever the order
of events and whichever devices fail: activation falls back to lower
policies in the domains that are short unless strict, and may lower groups
of no higher priority when asked to (``allow_reprovision``); ending a group
sends its nodes back toward their topology policy as far as the budget
allows; freed watts then flow back to groups running below their request.
Every answer carries a `Status`; nothing raises for a bad request.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from .execute import HostOutcome
from .naming import (GROUP_NAME, check_external_id, check_name, check_partial, summary,
                     unknown_entities, unknown_policy)
from .planning import Planner, PlanError
from .queries import QueryMixin
from .running import OperationMixin
from .store import GroupRow, GroupStore, MemberRow
from .topology_rpc import TopologyMixin
from .types import AsyncStrategy, PartialActivation, Response, Status, fail, failures


class ResourceGroupService(TopologyMixin, QueryMixin, OperationMixin):
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
                default_timeout=self._device_timeout(), log=self.log)
        return self._controller

    def _device_timeout(self) -> float:
        return float(self.device_options.get("timeout_seconds", 30.0))

    # -- lifecycle -----------------------------------------------------------
    def create(self, group_name: str, external_id: Optional[int] = None,
               policy_name: Optional[str] = None, workload_profile_ids: Sequence[int] = (),
               prs_enabled: Optional[bool] = None, dpm_enable: bool = True,
               properties: Optional[Mapping[str, Any]] = None) -> Response:
        """A new, empty, inactive group; its name is unique."""
        bad = check_name(group_name) or check_external_id(external_id)
        if bad:
            return fail(bad, "invalid")
        with self.store.transaction():
            topo, active = self.topology()
            if topo is None or not active:
                return fail("no active topology: import and activate one first", "invalid")
            if policy_name is not None and policy_name not in topo.policies:
                return fail(unknown_policy(topo, policy_name), "invalid")
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
            problem = (unknown_entities(topo, names) or
                       (unknown_policy(topo, policy_name)
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
        bad = check_partial(partial)
        if bad:
            return fail(bad, "invalid")
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
            op = self._record(plan, "activate", group_name, partial, async_strategy,
                              activating=True)
        return self._run(op, async_strategy)

    def deactivate(self, group_name: str) -> Response:
        """Send an active group's entities back toward their topology policies."""
        self._repair(group_name)
        with self.store.transaction():
            group = self.store.group(group_name)
            if group is None:
                return fail("no resource group %s" % group_name, "not_found")
            if group.status != "active":
                return fail("resource group %s is %s, not active" % (group_name, group.status),
                             "invalid")
            self.store.set_group(group_name, status="deactivating", owner_pid=os.getpid())
        applied = self._end_group(group_name)
        failed = failures(applied.outcomes)
        parts = ["resource group %s deactivated" % group_name] + applied.notes
        if failed:
            parts.append("devices failed: %s (counted at their higher limit until they "
                         "confirm)" % failed)
        response = Response(Status(not failed, "; ".join(parts)), applied.outcomes)
        self._flow_back(response)
        waiting = self._waiting(list(applied.levels))
        if waiting:
            response.status.diag_msg += "; " + waiting
        return response

    def delete(self, group_name: str) -> Response:
        """Deactivate if active (cancelling a running activation), then forget the group."""
        self._repair(group_name)
        group = self.store.group(group_name)
        if group is None:
            return fail("no resource group %s" % group_name, "not_found")
        if group.status == "activating":
            self._cancel_activation(group_name, 2 * self._device_timeout() + 5.0)
            group = self.store.group(group_name) or group
        note = ""
        if group.status == "active":
            result = self.deactivate(group_name)
            note = result.status.diag_msg.partition(" deactivated")[2]
        with self.store.transaction():
            current = self.store.group(group_name)
            if current is not None and current.status != "inactive":
                return fail("resource group %s is busy (%s by pid %s)"
                             % (group_name, current.status, current.owner_pid), "busy")
            self.store.delete_group(group_name)
        return Response(Status(True, "resource group %s deleted%s" % (group_name, note)))

    def update(self, group_name: str, policy_name: Optional[str], strict: bool = False,
               async_strategy: Optional[AsyncStrategy] = None,
               partial: Optional[PartialActivation] = None,
               workload_profile_ids: Optional[Sequence[int]] = None) -> Response:
        """Change (or with None remove) the group policy; applied at once if active."""
        bad = check_partial(partial)
        if bad:
            return fail(bad, "invalid")
        self._repair(group_name)
        with self.store.transaction():
            topo, _active = self.topology()
            group = self.store.group(group_name)
            if group is None:
                return fail("no resource group %s" % group_name, "not_found")
            if policy_name is not None and (topo is None or policy_name not in topo.policies):
                return fail(unknown_policy(topo, policy_name) if topo else "no topology",
                            "invalid")
            extra = {} if workload_profile_ids is None else {
                "workload_profile_ids": tuple(workload_profile_ids)}
            if group.status != "active":
                self.store.set_group(group_name, policy=policy_name, **extra)
                return Response(Status(True, "policy of %s %s" % (
                    group_name, "set to %s" % policy_name if policy_name else "removed")))
            group = GroupRow(**dict(asdict(group), policy=policy_name))
            try:
                plan = Planner(topo, self.store).change(group, self.store.members(group_name),
                                                        strict or not group.dpm_enable)
            except PlanError as exc:
                return fail(str(exc))
            self.store.set_group(group_name, policy=policy_name, **extra)
            op = self._record(plan, "update", group_name, partial, async_strategy)
        return self._run(op, async_strategy)

    def update_resources(self, group_name: str, updates: Mapping[str, Optional[str]],
                         async_strategy: Optional[AsyncStrategy] = None,
                         partial: Optional[PartialActivation] = None) -> Response:
        """Set (or with None/'' remove) entity-level policies; partial updates allowed."""
        bad = check_partial(partial)
        if bad:
            return fail(bad, "invalid")
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
                    rejected[entity] = HostOutcome(False, unknown_policy(topo, name))
                else:
                    accepted[entity] = name
            changed = [MemberRow(**dict(asdict(members[e]), policy=p)) for e, p in accepted.items()]
            self.store.put_members(changed)
            if group.status != "active" or not accepted:
                return Response(Status(not rejected, summary(accepted, rejected),
                                       "invalid" if rejected else "ok"), rejected)
            plan = Planner(topo, self.store).change(
                group, [m for m in self.store.members(group_name) if m.entity in accepted],
                strict=True, per_entity=True)
            op = self._record(plan, "update", group_name, partial, async_strategy)
        response = self._run(op, async_strategy)
        response.node_statuses.update(plan.refused)
        if plan.refused or rejected:
            response.status = Status(False, summary(accepted, {**rejected, **plan.refused}),
                                     "failed" if plan.refused else "invalid")
        return response

    # -- helpers -------------------------------------------------------------
    def _request(self, topo, entity: str, kind: str, payload: Mapping[str, Any],
                 timeout: Optional[float] = None):
        from pbs_power.devices.controller import DeviceRequest
        return DeviceRequest(device=entity, kind=kind, payload=payload,
                             device_model_json=_model_json(topo, entity),
                             timeout_seconds=timeout)

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


def _model_json(topo, entity: str) -> str:
    """The device model of the entity's spec as JSON text, encoded once per spec.

    Every entity of a spec shares it (the request's ``device`` names the
    entity), so devices and the controller parse each model once per batch.
    """
    import json
    model = topo.device_model(entity)
    cache = topo.__dict__.setdefault("_model_json_cache", {})
    text = cache.get(model["device_spec"])
    if text is None:
        text = cache[model["device_spec"]] = json.dumps(
            {k: v for k, v in model.items() if k != "entity"}, sort_keys=True)
    return text


__all__ = ["ResourceGroupService", "AsyncStrategy", "PartialActivation", "Status", "Response",
           "GROUP_NAME"]
