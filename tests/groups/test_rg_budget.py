"""The power budget holds in every order of events, and freed watts flow back.

Plain scenarios: a group ending below its topology policy, a reprovision
whose lowering fails, a restore that fails, a lowered group raised back,
priorities, per-domain step-down, GPU limits on the devices, asynchronous
progress per host and a delete during an asynchronous activation.
"""
import json
import time

import pytest

from pbs_power.groups.ledger import Book
from pbs_power.groups.gpu_policy import GPUPolicies, GPUPolicy
from pbs_power.groups.policy import PowerLimit
from pbs_power.groups.service import AsyncStrategy, PartialActivation, ResourceGroupService
from pbs_power.groups.topology import parse_topology
from rg_invariants import violations

TOPOLOGY = {
    "name": "halls",
    "device_specs": {"big": {"node": {"min_watts": 2000, "idle_watts": 2500, "max_watts": 10000},
                             "gpu": {"count": 4, "min_watts": 200, "max_watts": 1000,
                                     "default_watts": 700}}},
    "power_domains": [{"name": "hall", "budget_watts": 100000, "children": [
        {"name": "rack-a", "budget_watts": 40000}, {"name": "rack-b", "budget_watts": 50000}]}],
    "policies": [{"name": n, "limits": [{"element_type": "NODE", "power_limit": {"watts": w}}]}
                 for n, w in (("High", 10000), ("Med", 8000), ("Low", 6000), ("Min", 4000))] + [
        {"name": "Low-Gpu", "limits": [{"element_type": "NODE", "power_limit": {"watts": 6000}},
                                      {"element_type": "GPU", "power_limit": {"watts": 500}}]}],
    "default_policy": "Low",
    "entities": [{"names": "n[1-6]", "device": "big", "domain": "rack-a"},
                 {"names": "n[7-12]", "device": "big", "domain": "rack-b"}],
}


def open_service(path, **sim):
    return ResourceGroupService(str(path), {"simulated": dict({"latency_ms": 0}, **sim),
                                            "timeout_seconds": 2})


@pytest.fixture
def svc(tmp_path):
    s = open_service(tmp_path)
    assert s.import_topology(parse_topology(TOPOLOGY)).ok
    assert s.set_topology_active(True).status.ok
    yield s
    s.close()


def group(svc, name, nodes, policy, priority=0):
    assert svc.create(name, 1, policy, properties={"priority": priority}).status.ok
    assert svc.add_resources(name, nodes).status.ok


def applied(svc, name):
    return {m.entity: m.applied_policy for m in svc.store.members(name)}


def counted(svc, domain):
    topo, _ = svc.topology()
    with svc.store.transaction():
        return Book(topo, svc.store).usage[domain]


def device(svc, node):
    return json.loads(svc.store.get_device_state(node))


def on_devices(svc, domain):
    topo, _ = svc.topology()
    return sum(device(svc, e)["node_cap_watts"] for e in topo.entities_under(domain))


def test_ending_a_group_below_its_topology_policy_never_overruns(svc):
    group(svc, "eco", ["n1", "n2", "n3"], "Min")
    assert svc.activate("eco").status.ok
    group(svc, "big", ["n4", "n5", "n6"], "High")
    r = svc.activate("big")                          # High: 3 x 4 kW + 3 x 10 kW = 42 kW
    assert r.status.ok and "applied Med" in r.status.diag_msg
    d = svc.delete("eco")                            # Low again: 3 x 6 kW more
    assert d.status.ok, d.status
    assert on_devices(svc, "rack-a") <= 40000 and counted(svc, "rack-a") <= 40000
    assert violations(svc) == []
    assert "raised big to High on 2 host(s)" in r.status.diag_msg   # the 4 kW left
    assert applied(svc, "big") == {"n4": "High", "n5": "High", "n6": "Med"}
    assert "n1, n2, n3 wait at Min, below their topology policy" in d.status.diag_msg
    assert counted(svc, "rack-a") == 40000 and on_devices(svc, "rack-a") == 40000
    assert svc.delete("big").status.ok               # room again: the idle nodes go back up
    assert {device(svc, n)["policy"] for n in ("n1", "n2", "n3")} == {"Low"}
    assert counted(svc, "rack-a") == 36000 and violations(svc) == []


def test_reprovision_counts_only_the_room_it_really_freed(svc, tmp_path):
    group(svc, "low", ["n7", "n8", "n9"], "High")
    assert svc.activate("low").status.ok                    # 30 kW + 3 x 6 kW = 48 kW
    failing = open_service(tmp_path, fail_devices="n[7-9]")
    group(failing, "new", ["n10", "n11", "n12"], "High")
    r = failing.activate("new", allow_reprovision=True)
    assert r.status.ok, r.status
    assert on_devices(failing, "rack-b") <= 50000 and counted(failing, "rack-b") <= 50000
    assert "High" not in applied(failing, "new").values()   # the room never came free
    assert violations(failing) == []
    failing.close()


def test_a_failed_restore_stays_counted_until_the_device_confirms(svc, tmp_path):
    group(svc, "g", ["n1"], "High")
    assert svc.activate("g").status.ok                       # 10 kW + 5 x 6 kW = 40 kW
    failing = open_service(tmp_path, fail_devices="n1")
    r = failing.delete("g")
    assert r.status.ok and "devices failed: n1" in r.status.diag_msg
    assert device(failing, "n1")["node_cap_watts"] == 10000
    assert counted(failing, "rack-a") == 40000             # n1 still counts its 10 kW
    failing.close()
    group(svc, "h", ["n2"], "High")
    r = svc.activate("h", strict=True)
    assert not r.status.ok and "rack-a needs 44000 W" in r.status.diag_msg
    assert on_devices(svc, "rack-a") <= 40000 and violations(svc) == []


def test_a_lowered_group_is_raised_back_when_the_other_ends(svc):
    group(svc, "first", ["n7", "n8", "n9"], "High")
    assert svc.activate("first").status.ok
    group(svc, "second", ["n10", "n11", "n12"], "High")
    r = svc.activate("second", allow_reprovision=True)
    assert r.status.ok and "lowered first to Low" in r.status.diag_msg
    assert set(applied(svc, "second").values()) == {"High"}
    r = svc.delete("second")
    assert r.status.ok and "raised first to High on 3 host(s)" in r.status.diag_msg
    assert set(applied(svc, "first").values()) == {"High"}
    assert {device(svc, n)["node_cap_watts"] for n in ("n7", "n8", "n9")} == {10000}
    assert violations(svc) == []


def test_reprovision_never_lowers_a_group_of_higher_priority(svc):
    group(svc, "vip", ["n7", "n8", "n9"], "High", priority=10)
    assert svc.activate("vip").status.ok
    group(svc, "cheap", ["n10", "n11", "n12"], "High", priority=1)
    r = svc.activate("cheap", allow_reprovision=True)
    assert r.status.ok and "lowered" not in r.status.diag_msg
    assert set(applied(svc, "vip").values()) == {"High"}
    assert "High" not in applied(svc, "cheap").values() and counted(svc, "rack-b") <= 50000
    assert violations(svc) == []


def test_step_down_lowers_only_nodes_in_short_domains(svc):
    group(svc, "hog", ["n2", "n3"], "High")
    assert svc.activate("hog").status.ok                     # rack-a is full now
    group(svc, "wide", ["n1", "n7"], "High")
    r = svc.activate("wide")
    assert r.status.ok and applied(svc, "wide") == {"n1": "Low", "n7": "High"}
    assert violations(svc) == []


def gpus(*watts):
    return GPUPolicies(tuple(GPUPolicy(i, None if w is None else PowerLimit(watts=w))
                             for i, w in enumerate(watts)))


def test_gpu_limits_reach_the_device_and_outlive_an_update(svc):
    group(svc, "g", ["n7"], "Min")
    assert svc.activate("g").status.ok
    r = svc.update_gpu_policies({"n7": gpus(700, 700, 700, 700)})
    assert r.ok, r
    assert device(svc, "n7")["node_cap_watts"] == 8800       # 6 kW rest of node + 4 x 700
    assert svc.update("g", "Low").status.ok
    state = device(svc, "n7")
    assert state["node_cap_watts"] == 8800 and set(state["gpu_caps"].values()) == {700}
    assert svc.update_gpu_policies({"n7": gpus(200, 200, 200, 200)}).ok
    assert device(svc, "n7")["node_cap_watts"] == 6800       # 6 kW + 4 x 200, above Low's
    assert violations(svc) == []


def test_a_null_gpu_limit_takes_the_node_policy_and_clamping_is_reported(svc):
    group(svc, "g", ["n7"], "Low-Gpu")
    assert svc.activate("g").status.ok
    r = svc.update_gpu_policies({"n7": gpus(None, 300, 300, 1200)})
    assert r.ok, r
    by_gpu = {x.gpu_id: x for x in r.results}
    assert by_gpu[0].set_limit == 500 and by_gpu[3].set_limit == 1000
    assert "clamped to 1000 W" in by_gpu[3].diag_msg and by_gpu[1].diag_msg == ""
    assert violations(svc) == []


def test_async_activation_reports_progress_per_host(tmp_path, svc):
    slow = ResourceGroupService(str(tmp_path), {"simulated": {"latency_ms": 150},
                                                "max_workers": 1})
    group(slow, "g", ["n7", "n8", "n9", "n10", "n11", "n12"], "Med")
    r = slow.activate("g", async_strategy=AsyncStrategy(n_hosts=1))
    assert r.status.ok and r.operation_id
    st = slow.async_status(r.operation_id).operation
    assert not st.completed and 1 <= st.n_success < 6
    deadline = time.time() + 30
    while not slow.async_status(r.operation_id).operation.completed:
        assert time.time() < deadline
        time.sleep(0.05)
    slow.close()


def test_delete_during_an_async_activation_cancels_it_and_releases_its_watts(tmp_path, svc):
    slow = ResourceGroupService(str(tmp_path), {"simulated": {"latency_ms": 200},
                                                "max_workers": 1})
    group(slow, "g", ["n7", "n8", "n9", "n10", "n11", "n12"], "High")
    r = slow.activate("g", async_strategy=AsyncStrategy(wait_seconds=0.3))
    assert r.status.ok
    d = slow.delete("g")
    assert d.status.ok, d.status
    assert slow.store.group("g") is None
    assert counted(slow, "rack-b") == 36000 and on_devices(slow, "rack-b") == 36000
    assert violations(slow) == []
    slow.close()


def test_at_least_zero_hosts_is_refused(svc):
    group(svc, "g", ["n1"], "Med")
    r = svc.activate("g", partial=PartialActivation(atleast_n_hosts=0))
    assert not r.status.ok and r.status.code == "invalid" and "at least" in r.status.diag_msg


def test_partial_threshold_holds_on_update(svc, tmp_path):
    group(svc, "g", ["n7", "n8", "n9"], "Low")
    assert svc.activate("g").status.ok
    failing = open_service(tmp_path, fail_devices="n7")
    r = failing.update("g", "Med", partial=PartialActivation(atleast_n_hosts=2))
    assert r.status.ok and "failed: n7" in r.status.diag_msg
    r = failing.update("g", "High", partial=PartialActivation(atleast_n_hosts=3))
    assert not r.status.ok
    assert violations(failing) == []
    failing.close()


def test_a_database_from_before_the_ledger_counts_what_active_groups_applied(svc, tmp_path):
    group(svc, "g", ["n7", "n8"], "High")
    assert svc.activate("g").status.ok
    with svc.store.transaction():
        svc.store._run("DROP TABLE power_ledger")
    svc.close()
    reopened = open_service(tmp_path)
    assert counted(reopened, "rack-b") == 44000             # 2 x 10 kW + 4 x 6 kW
    assert violations(reopened) == []
    reopened.close()
