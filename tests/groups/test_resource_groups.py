"""The resource-group service: lifecycle, budget, fallback, reprovision, partial, async, GPUs."""
import json
import subprocess
import time

import pytest

from pbs_power.groups.gpu_policy import GPUPolicies, GPUPolicy
from pbs_power.groups.policy import PowerLimit
from pbs_power.groups.service import (AsyncStrategy, PartialActivation,
                                       ResourceGroupService)
from pbs_power.groups.topology import parse_topology

POLICIES = [("High", 1000), ("Med", 700), ("Low", 500), ("Min", 300)]
TOPOLOGY = {
    "name": "test",
    "device_specs": {"box": {"node": {"min_watts": 200, "idle_watts": 300, "max_watts": 1000},
                             "gpu": {"count": 2, "min_watts": 100, "max_watts": 400,
                                     "default_watts": 400}}},
    "power_domains": [{"name": "feed", "budget_watts": 10000, "children": [
        {"name": "rack-a", "budget_watts": 3000}, {"name": "rack-b", "budget_watts": 3000}]}],
    "policies": [{"name": n, "limits": [{"element_type": "NODE", "power_limit": {"watts": w}}]}
                 for n, w in POLICIES],
    "default_policy": "Low",
    "entities": [{"names": "a[1-4]", "device": "box", "domain": "rack-a"},
                 {"names": "b[1-4]", "device": "box", "domain": "rack-b"}],
}


def service(tmp_path, **sim):
    """A service on an active test topology, its devices simulated with ``sim``."""
    setup = ResourceGroupService(str(tmp_path), {"simulated": {"latency_ms": 0}})
    assert setup.import_topology(parse_topology(TOPOLOGY)).ok
    assert setup.set_topology_active(True).status.ok
    setup.close()
    return ResourceGroupService(str(tmp_path), {"simulated": dict({"latency_ms": 0}, **sim)})


@pytest.fixture
def svc(tmp_path):
    s = service(tmp_path)
    yield s
    s.close()


def group(svc, name, entities, policy=None, **kw):
    assert svc.create(name, 1, policy, **kw).status.ok
    assert svc.add_resources(name, entities).status.ok


def applied(svc, name):
    info = {g.group_name: g for g in svc.list().resource_groups}[name]
    return {rp.resource_name: rp.applied_policy_name for rp in info.resource_policies}


def device_cap(svc, entity):
    return json.loads(svc.store.get_device_state(entity))["node_cap_watts"]


def test_whole_lifecycle_restores_topology_policy(svc):
    group(svc, "rg_1", ["a1", "a2"], "High")
    r = svc.activate("rg_1")
    assert r.status.ok and r.node_statuses["a1"].policy == "High"
    assert device_cap(svc, "a1") == 1000
    assert svc.list(active_only=True).resource_groups[0].activation_status == "active"
    assert svc.update("rg_1", "Med").status.ok and applied(svc, "rg_1") == {"a1": "Med", "a2": "Med"}
    assert svc.update_resources("rg_1", {"a2": "Min"}).status.ok
    assert applied(svc, "rg_1") == {"a1": "Med", "a2": "Min"}
    assert svc.update("rg_1", None).status.ok           # no group policy: topology's
    assert applied(svc, "rg_1") == {"a1": "Low", "a2": "Min"}
    assert svc.delete("rg_1").status.ok
    assert svc.list().resource_groups == [] and device_cap(svc, "a1") == 500


def test_fallback_to_the_next_lower_policy_reports_what_was_applied(svc):
    group(svc, "rg_1", ["a1", "a2", "a3", "a4"], "High")
    r = svc.activate("rg_1")
    assert r.status.ok and "requested High does not fit" in r.status.diag_msg
    assert "rack-a needs 4000 W of its 3000 W budget" in r.status.diag_msg
    assert set(applied(svc, "rg_1").values()) == {"Med"}


def test_strict_fails_naming_the_domain_and_changes_nothing(svc):
    group(svc, "rg_1", ["a1", "a2", "a3", "a4"], "High")
    r = svc.activate("rg_1", strict=True)
    assert not r.status.ok and "(strict)" in r.status.diag_msg and "rack-a" in r.status.diag_msg
    info = svc.list().resource_groups[0]
    assert info.activation_status == "inactive"
    assert all(rp.applied_policy_name is None for rp in info.resource_policies)
    assert svc.store.allocations() == {}


def test_dpm_disabled_group_is_strict(svc):
    group(svc, "rg_1", ["a1", "a2", "a3", "a4"], "High", dpm_enable=False)
    assert not svc.activate("rg_1").status.ok


def test_reprovision_lowers_other_groups_to_make_room(svc):
    group(svc, "rg_a", ["a1", "a2"], "High")
    assert svc.activate("rg_a").status.ok
    group(svc, "rg_b", ["a3", "a4"], "High")
    r = svc.activate("rg_b", allow_reprovision=True)
    assert r.status.ok and "lowered rg_a to Low" in r.status.diag_msg
    assert set(applied(svc, "rg_b").values()) == {"High"}
    assert set(applied(svc, "rg_a").values()) == {"Low"} and device_cap(svc, "a1") == 500


def test_reprovision_takes_lowest_priority_first_and_respects_floors(svc):
    group(svc, "rg_keep", ["a1"], "High", properties={"priority": 5})
    group(svc, "rg_cheap", ["a2"], "High", properties={"priority": 1, "min_policy": "Low"})
    for name in ("rg_keep", "rg_cheap"):
        assert svc.activate(name).status.ok
    group(svc, "rg_new", ["a3", "a4"], "High", properties={"priority": 5})   # never above its own
    assert svc.activate("rg_new", allow_reprovision=True).status.ok
    assert applied(svc, "rg_cheap") == {"a2": "Low"}       # lowered first, stopped at its floor
    assert applied(svc, "rg_keep") == {"a1": "Low"}        # then the higher priority one


def test_reprovision_lowers_others_only_as_far_as_needed(svc):
    group(svc, "rg_a", ["a1", "a2"], "Med")
    assert svc.activate("rg_a").status.ok                  # rack-a 2 x 700 + 2 x 500 = 2400
    group(svc, "rg_b", ["a3", "a4", "b1"], "High")         # High: 1400 + 2000 = 3400 > 3000
    r = svc.activate("rg_b", allow_reprovision=True)
    assert r.status.ok and set(applied(svc, "rg_b").values()) == {"High"}
    assert applied(svc, "rg_a") == {"a1": "Low", "a2": "Low"}   # 1000 + 2000 = 3000: enough


def test_reprovision_does_not_lower_others_for_a_level_it_cannot_reach(svc):
    group(svc, "rg_a", ["b1", "b2"], "Med")
    assert svc.activate("rg_a").status.ok
    group(svc, "rg_b", ["a1", "a2", "a3", "a4"], "High")   # rack-a alone: 4000 > 3000
    r = svc.activate("rg_b", allow_reprovision=True)
    assert r.status.ok and "lowered" not in r.status.diag_msg
    assert applied(svc, "rg_a") == {"b1": "Med", "b2": "Med"}    # untouched: cannot help
    assert set(applied(svc, "rg_b").values()) == {"Med"}


def test_groups_without_dpm_are_never_lowered(svc):
    group(svc, "rg_fixed", ["a1", "a2"], "High", dpm_enable=False)
    assert svc.activate("rg_fixed").status.ok
    group(svc, "rg_new", ["a3", "a4"], "High")
    r = svc.activate("rg_new", allow_reprovision=True)
    assert applied(svc, "rg_fixed") == {"a1": "High", "a2": "High"}
    assert r.status.ok and set(applied(svc, "rg_new").values()) == {"Low"}   # 2000 + 2 x 500


def test_budget_counts_other_active_groups(svc):
    group(svc, "rg_1", ["a1", "a2"], "High")
    assert svc.activate("rg_1").status.ok
    group(svc, "rg_2", ["a3"], "High")
    r = svc.activate("rg_2", strict=True)
    assert not r.status.ok and "rack-a needs 3500 W" in r.status.diag_msg


def test_partial_activation_tolerates_failing_devices(tmp_path):
    svc = service(tmp_path, fail_devices="b[1-2]")
    group(svc, "rg_ok", ["b1", "b2", "b3", "b4"], "Med")
    r = svc.activate("rg_ok", partial=PartialActivation(atleast_n_hosts=2))
    assert r.status.ok and not r.node_statuses["b1"].ok and r.node_statuses["b3"].ok
    states = {rp.resource_name: rp.state for rp in svc.list().resource_groups[0].resource_policies}
    assert states == {"b1": "failed", "b2": "failed", "b3": "active", "b4": "active"}
    assert svc.delete("rg_ok").status.ok
    group(svc, "rg_no", ["b1", "b2", "b3", "b4"], "Med")
    r = svc.activate("rg_no", partial=PartialActivation(atleast_frac_hosts=0.75))
    assert not r.status.ok and "only 2 of 4 hosts activated (need 3)" in r.status.diag_msg
    assert svc.list().resource_groups[0].activation_status == "inactive"
    assert device_cap(svc, "b3") == 500                      # the successes were restored
    svc.close()


def test_async_activation_status_lifecycle(tmp_path):
    svc = service(tmp_path, latency_ms=30)
    group(svc, "rg_1", ["a1", "a2", "b1", "b2"], "Med")
    r = svc.activate("rg_1", async_strategy=AsyncStrategy(n_hosts=1))
    assert r.status.ok and r.operation_id
    deadline = time.time() + 20
    while True:
        st = svc.async_status(r.operation_id)
        assert st.ok
        if st.operation.completed:
            break
        assert st.operation.n_in_progress + st.operation.n_success + st.operation.n_failed == 4
        assert time.time() < deadline
        time.sleep(0.05)
    assert st.operation.n_success == 4 and st.operation.result["status"]["ok"]
    assert svc.async_status(r.operation_id).code == "not_found"     # forgotten once read
    assert svc.list().resource_groups[0].activation_status == "active"
    svc.close()


def test_async_status_by_group_and_type(tmp_path):
    svc = service(tmp_path)
    group(svc, "rg_1", ["a1"], "Med")
    svc.activate("rg_1", async_strategy=AsyncStrategy(wait_seconds=0))
    deadline = time.time() + 20
    while not svc.async_status(group_name="rg_1", operation_type="activate").operation.completed:
        assert time.time() < deadline
        time.sleep(0.05)
    svc.close()


def dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_interrupted_activation_is_repaired_by_the_next_call(svc):
    group(svc, "rg_1", ["a1", "a2"], "High")
    with svc.store.transaction():
        svc.store.set_group("rg_1", status="activating", owner_pid=dead_pid())
        svc.store.put_members([m.__class__(m.entity, m.group_name, m.policy, "High", 1000.0)
                               for m in svc.store.members("rg_1")])
    assert set(svc.store.allocations()) == {"a1", "a2"}       # reserved, counted once
    r = svc.activate("rg_1")
    assert r.status.ok
    assert "interrupted" in svc.list().resource_groups[0].diag


def test_dead_async_worker_is_reported(svc):
    from pbs_power.groups.store import OperationRow
    group(svc, "rg_1", ["a1"], "Med")
    with svc.store.transaction():
        svc.store.insert_operation(OperationRow("op1", "rg_1", "activate", time.time(), 1, 0, 0,
                                                False, dead_pid(), {}, None))
    st = svc.async_status("op1")
    assert st.operation.completed and "died" in st.operation.result["status"]["diag_msg"]


def gpus(*watts):
    return GPUPolicies(tuple(GPUPolicy(i, None if w is None else PowerLimit(watts=w))
                             for i, w in enumerate(watts)))


def test_gpu_policies_raise_the_node_limit_across_groups(svc):
    group(svc, "rg_1", ["a1"], "Min")          # node 300 W: non-GPU 200 + GPUs
    group(svc, "rg_2", ["b1"], "Med")
    assert svc.activate("rg_1").status.ok and svc.activate("rg_2").status.ok
    r = svc.update_gpu_policies({"a1": gpus(150, 150), "b1": gpus(250, None)})
    assert r.ok, r
    caps = {(x.resource_name, x.gpu_id): x.set_limit for x in r.results}
    assert caps == {("a1", 0): 150, ("a1", 1): 150, ("b1", 0): 250, ("b1", 1): 400}
    a1 = {m.entity: m for m in svc.store.members("rg_1")}["a1"]
    assert a1.applied_watts == 500                      # 200 + 150 + 150 > Min's 300


def test_gpu_policies_must_name_every_gpu_and_need_an_active_group(svc):
    group(svc, "rg_1", ["a1"], "Med")
    assert svc.activate("rg_1").status.ok
    r = svc.update_gpu_policies({"a1": gpus(150), "a2": gpus(100, 100)})
    bad = {x.resource_name: x.diag_msg for x in r.results if not x.ok}
    assert "every GPU of a1 must be named" in bad["a1"] and "missing [1]" in bad["a1"]
    assert "not in an active resource group" in bad["a2"]


def test_gpu_policies_cannot_raise_a_node_past_the_budget(svc):
    group(svc, "rg_1", ["a1", "a2", "a3", "a4"], "Med")
    assert svc.activate("rg_1").status.ok            # 4 x 700 = 2800 of 3000
    r = svc.update_gpu_policies({"a1": gpus(400, 400)})   # needs 1000 W
    assert not r.ok and "rack-a needs 3100 W" in r.results[0].diag_msg


@pytest.mark.parametrize("call,message", [
    (lambda s: s.create("bad name", 1), "resource group name must be"),
    (lambda s: s.create("rg_x", "12"), "external id must be a 64-bit integer"),
    (lambda s: s.create("rg_x", 1, "Hihg"), "did you mean 'High'"),
    (lambda s: s.create("rg_1", 1), "already exists"),
    (lambda s: s.add_resources("rg_1", ["zz9"]), "not in topology test: zz9"),
    (lambda s: s.add_resources("rg_1", []), "no resources named"),
    (lambda s: s.add_resources("rg_2", ["a1"]), "a1 is already in resource group rg_1"),
    (lambda s: s.add_resources("nope", ["a1"]), "no resource group nope"),
    (lambda s: s.remove_resources("rg_1", ["b4"]), "not in rg_1: b4"),
    (lambda s: s.activate("rg_2"), "has no resources"),
    (lambda s: s.activate("nope"), "no resource group nope"),
    (lambda s: s.deactivate("rg_1"), "is inactive, not active"),
    (lambda s: s.update("rg_1", "Nope"), "no policy 'Nope'"),
    (lambda s: s.delete("nope"), "no resource group nope"),
])
def test_bad_requests_get_a_clear_answer_and_change_nothing(svc, call, message):
    group(svc, "rg_1", ["a1"])
    assert svc.create("rg_2", 2).status.ok
    before = svc.list()
    answer = call(svc)
    status = getattr(answer, "status", answer)
    assert not status.ok and message in status.diag_msg
    assert svc.list() == before


def test_create_needs_an_active_topology(tmp_path):
    svc = ResourceGroupService(str(tmp_path))
    r = svc.create("rg_1", 1)
    assert not r.status.ok and "no active topology" in r.status.diag_msg
    svc.close()


def test_a_closed_service_leaves_no_thread_or_socket_behind(tmp_path):
    """Job hooks run inside pbs_server: each job's service must clean up fully."""
    import os
    import threading
    service(tmp_path).close()
    fds, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
    for i in range(10):
        svc = ResourceGroupService(str(tmp_path), {"simulated": {"latency_ms": 0}})
        group(svc, "rg_%d" % i, ["a1"], "Med")
        assert svc.activate("rg_%d" % i).status.ok and svc.delete("rg_%d" % i).status.ok
        svc.close()
    assert len(os.listdir("/proc/self/fd")) <= fds
    assert threading.active_count() <= threads
