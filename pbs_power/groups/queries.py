"""Resource-group RPCs that read state or touch GPUs: list, async status, GPU policies.

A mixin of `ResourceGroupService`; it uses the service's store, topology,
controller and request builder.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from .execute import process_alive
from .store import MemberRow

if TYPE_CHECKING:
    from .gpu_policy import GPUPolicies


@dataclass
class ResourcePolicy:
    """One member: its policy and, when active, the policy actually applied."""

    resource_name: str
    policy_name: Optional[str]
    applied_policy_name: Optional[str]
    state: str = "inactive"
    applied_watts: Optional[float] = None


@dataclass
class GroupInfo:
    """A group as ResourceGroupList reports it."""

    group_name: str
    external_id: Optional[int]
    activation_status: str
    policy_name: Optional[str]
    resource_names: List[str]
    workload_profile_ids: List[int]
    resource_policies: List[ResourcePolicy]
    properties: Mapping[str, Any]
    prs_enabled: Optional[bool]
    dpm_enable: bool
    diag: str = ""


@dataclass
class GPUResult:
    """The outcome of setting one GPU's limit."""

    resource_name: str
    gpu_id: int
    ok: bool
    set_limit: Optional[float] = None
    diag_msg: str = ""


@dataclass
class AsyncStatus:
    """Progress of an asynchronous operation; forgotten once read as completed."""

    operation_id: str
    completed: bool
    n_hosts: int
    n_success: int
    n_failed: int
    n_in_progress: int
    operation_type: str = ""
    result: Optional[Mapping[str, Any]] = None


@dataclass
class QueryAnswer:
    """ok + diag_msg with a payload (groups, GPU results or an async status)."""

    ok: bool
    diag_msg: str = ""
    code: str = "ok"
    resource_groups: List[GroupInfo] = field(default_factory=list)
    results: List[GPUResult] = field(default_factory=list)
    operation: Optional[AsyncStatus] = None

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


class QueryMixin:
    """list, async_status and update_gpu_policies for ResourceGroupService."""

    def list(self, active_only: Optional[bool] = None) -> QueryAnswer:
        """Every group (or only active ones) with members and applied policies."""
        out = []
        for g in self.store.groups(active_only=bool(active_only)):
            members = self.store.members(g.name)
            out.append(GroupInfo(
                g.name, g.external_id, g.status, g.policy, [m.entity for m in members],
                list(g.workload_profile_ids),
                [ResourcePolicy(m.entity, m.policy or g.policy, m.applied_policy, m.state,
                                m.applied_watts) for m in members],
                dict(g.properties), g.prs_enabled, g.dpm_enable, g.diag))
        return QueryAnswer(True, "%d resource group(s)" % len(out), resource_groups=out)

    def async_status(self, operation_id: Optional[str] = None, group_name: Optional[str] = None,
                     operation_type: Optional[str] = None) -> QueryAnswer:
        """Progress of an operation, by id or by group + type ('activate', 'update')."""
        op = (self.store.operation(operation_id) if operation_id else
              self.store.latest_operation(group_name or "", operation_type or "activate"))
        if op is None:
            return QueryAnswer(False, "no such operation (already read as completed, or "
                                      "never started asynchronously)", "not_found")
        if not op.completed and op.worker_pid and not process_alive(op.worker_pid):
            self._repair(op.group_name)
            with self.store.transaction():
                self.store.set_operation(op.id, completed=1, result={"status": {
                    "ok": False, "diag_msg": "worker pid %d died before finishing"
                    % op.worker_pid, "code": "failed"}})
            op = self.store.operation(op.id)
        status = AsyncStatus(op.id, op.completed, op.n_hosts, op.n_success, op.n_failed,
                             max(0, op.n_hosts - op.n_success - op.n_failed), op.type, op.result)
        if op.completed:
            with self.store.transaction():
                self.store.delete_operation(op.id)
        return QueryAnswer(True, "completed" if op.completed else "in progress", operation=status)

    # -- GPU policies --------------------------------------------------------------
    def update_gpu_policies(self, node_gpu_policies: Mapping[str, GPUPolicies]) -> QueryAnswer:
        """Set per-GPU limits on nodes of active groups, with the node limit they need.

        Every GPU of a node must be named or that node fails; one call may
        touch several groups. A null limit means the node policy's GPU limit
        (else the GPU's default); a value outside the GPU's range is clamped
        and the result says so. The node limit becomes the larger of its
        policy's and what the GPUs need, reserved in the ledger like any
        other change, and sent to the device with the GPU limits.
        """
        from .apply import UPDATE, Change
        from .levels import level_of, plan_gpus
        topo, _active = self.topology()
        results: List[GPUResult] = []
        changes, clamped, input_errors = [], {}, 0
        with self.store.transaction():
            for node, policies in node_gpu_policies.items():
                member, err = self._gpu_target(topo, node, policies)
                if err:
                    results += _all_failed(node, policies, err)
                    input_errors += 1
                    continue
                group = self.store.group(member.group_name)
                name = member.policy or group.policy
                policy = topo.policies[name] if name else topo.topology_policy(node)
                planned, clamped[node] = plan_gpus(topo, node, policy, policies)
                level = level_of(topo, node, policy, planned)
                changes.append(Change(node, member.group_name, UPDATE, (level,), planned))
        applied = self._applier(topo, None).run(changes) if changes else None
        for change in changes:
            outcome = applied.outcomes.get(change.entity)
            ids = sorted(int(g) for g in change.gpus)
            if change.entity not in applied.levels:
                results += [GPUResult(change.entity, g, False, None, "%s: node limit must rise "
                                      "to %.0f W: %s" % (change.entity, change.ladder[0][1],
                                                         outcome.diag_msg)) for g in ids]
                continue
            results += _gpu_results(change.entity, outcome, ids, clamped[change.entity])
        self._flow_back()
        bad = [r for r in results if not r.ok]
        code = "ok" if not bad else ("invalid" if input_errors == len(node_gpu_policies)
                                     else "failed")
        return QueryAnswer(not bad, "%d GPU limit(s) set, %d failed" % (len(results) - len(bad),
                                                                         len(bad)),
                           code, results=results)

    def _gpu_target(self, topo, node: str, policies: GPUPolicies) -> Tuple[Optional[MemberRow], str]:
        if topo is None or node not in topo.entities:
            return None, "not in the topology"
        spec = topo.entities[node].device
        if spec.gpu is None:
            return None, "has no GPUs"
        named = {p.gpu_id for p in policies.policies}
        expected = set(range(spec.gpu.count))
        if named != expected:
            missing, extra = sorted(expected - named), sorted(named - expected)
            return None, "every GPU of %s must be named (GPUs 0-%d)%s%s" % (
                node, spec.gpu.count - 1, "; missing %s" % missing if missing else "",
                "; no such GPU %s" % extra if extra else "")
        group = self.store.member_groups([node]).get(node)
        row = self.store.group(group) if group else None
        if row is None or row.status != "active":
            return None, "not in an active resource group"
        member = next(m for m in self.store.members(group) if m.entity == node)
        if member.state != "active":
            return None, "its activation failed (%s)" % member.diag
        return member, ""


def _all_failed(node: str, policies: GPUPolicies, diag: str) -> List[GPUResult]:
    ids = [p.gpu_id for p in policies.policies] or [0]
    return [GPUResult(node, g, False, None, "%s: %s" % (node, diag)) for g in ids]


def _gpu_results(node: str, outcome, ids: List[int], clamped: Mapping[int, str]
                 ) -> List[GPUResult]:
    """Per-GPU results: the device's, with a note where the request was clamped; a device
    that failed as a whole fails every GPU it did not report."""
    reported = {r.gpu_id: r for r in outcome.gpus}
    out = []
    for g in ids:
        r = reported.get(g)
        if r is not None:
            note = "; ".join(x for x in (clamped.get(g, ""), r.diag_msg) if x)
            ok = r.ok and outcome.ok
            out.append(GPUResult(node, g, ok, r.power_cap_watts if ok else None,
                                 note if ok else (r.diag_msg or outcome.diag_msg)))
        else:
            out.append(GPUResult(node, g, False, None, outcome.diag_msg or "no answer"))
    return out
