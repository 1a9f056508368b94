"""Allocator pieces without the network: live state, the policies, registry, filters, checks."""
import os
import time

import pytest

from allocator_helpers import make_cluster, write_policy
from pbs_power.allocator.config import ClusterSource, parse_allocator_config, AllocatorConfigError
from pbs_power.allocator.filters import FilterError, matches
from pbs_power.allocator.gather import LocalCluster
from pbs_power.allocator.policies.first_fit import FirstFitPolicy
from pbs_power.allocator.policies.power_aware import PowerAwarePolicy
from pbs_power.allocator.registry import PolicyRegistry, check_uri
from pbs_power.allocator.results import check_result
from pbs_power.allocator.schema import AllocatorError
from pbs_power.states.model import Phase, Transition, TransitionKind
from pbs_power.groups.service import ResourceGroupService
from pbs_power.states.store import Store


def view(state_dir, **kw):
    cluster = LocalCluster(ClusterSource(state_dir, **kw), refresh_seconds=0)
    v = cluster.view()
    return {cluster.cluster_id: {"data": v.data, "cluster_metrics": v.metrics}}


def run(policy, clusters, inputs, **parameters):
    return policy("p", {}, {}).eval(parameters, {"cluster_data": clusters, "inputs": inputs},
                                    {})["allocations"]


def test_live_state_comes_from_the_hook_store_groups_and_devices(tmp_path):
    state = make_cluster(str(tmp_path))
    now = time.time()
    with Store.open(state) as store:
        store.set_down_since("a1", now - 900)
        store.record_duration("a1", TransitionKind.POWER_ON, now - 5000, 120.0)
        store.put_transition(Transition("a2", TransitionKind.POWER_ON, Phase.POWERING_UP,
                                        now - 5, now - 5))
        store.mark_failed("a3", "did not boot", now)
    svc = ResourceGroupService(state, {"simulated": {"latency_ms": 0}})
    assert svc.create("rg_9", 9, "High").status.ok and svc.add_resources("rg_9", ["b2"]).status.ok
    assert svc.activate("rg_9").status.ok
    svc.close()
    metrics = view(state)["box-cluster"]["cluster_metrics"]
    nodes = metrics["nodes"]
    # no hook config: no backend to ask, so no state is guessed
    assert {n: nodes[n]["power_state"] for n in nodes} == {
        "a1": "down", "a2": "waking", "a3": "failed", "b1": "unknown", "b2": "unknown",
        "b3": "unknown"}
    assert metrics["power_state_source"] == "no hook config: power states unknown"
    assert "no hook config: power states unknown" in metrics["notes"]
    # a1's boot time as the store learned it; a2 waking: the default 900 s boot, 5 s gone
    assert nodes["a1"]["ready_seconds"] == 120.0
    assert 890 <= nodes["a2"]["ready_seconds"] <= 895.5
    assert nodes["b1"]["ready_seconds"] is None
    assert nodes["b2"]["resource_group"] == "rg_9" and nodes["b2"]["allocated_watts"] == 1000
    assert nodes["b1"]["policy"] == "Low" and nodes["b1"]["allocated_watts"] == 500
    assert nodes["b1"]["gpus"]["2"] == {"cap_watts": 150.0}
    assert metrics["domains"]["rack-b"] == {"budget_watts": 10000, "allocated_watts": 2000,
                                            "headroom_watts": 8000,
                                            "headroom_source": "allocated caps"}


def test_power_aware_skips_failed_and_busy_nodes_and_ranks_waking_before_down(tmp_path):
    state = make_cluster(str(tmp_path))
    now = time.time()
    with Store.open(state) as store:
        for host in ("b1", "b2", "b3"):
            store.mark_failed(host, "dead", now)
        store.set_down_since("a1", now)
        store.put_transition(Transition("a3", TransitionKind.WAKE, Phase.POWERING_UP, now, now))
    svc = ResourceGroupService(state, {"simulated": {"latency_ms": 0}})
    assert svc.create("rg_1", 1).status.ok and svc.add_resources("rg_1", ["a2"]).status.ok
    svc.close()
    clusters = view(state)
    allocs = run(PowerAwarePolicy, clusters, {"requests": [{}, {}, {}]})
    assert [a.get("node_id") for a in allocs] == ["a3", "a1", None]
    assert "3 failed" in allocs[2]["error"] and "1 in a resource group" in allocs[2]["error"]
    # a2's state is unknown (no hook config): it comes after waking a3 and down a1
    busy = run(PowerAwarePolicy, clusters, {"requests": [{}, {}, {}]}, allow_busy_nodes=True)
    assert [a["node_id"] for a in busy] == ["a3", "a1", "a2"]
    awake_only = run(PowerAwarePolicy, clusters, {"gpus": 1}, allow_asleep_nodes=False)
    assert "not awake (allow_asleep_nodes is false)" in awake_only[0]["error"]
    assert run(FirstFitPolicy, clusters, {"gpus": 5})[0]["error"].startswith(
        "no node for inputs (5 GPUs): 6 fewer than 5 GPUs")


def node(domain, state="on", gpus=None):
    return ({"device_spec": "x", "gpu_count": 2, "domains": [domain, "top"],
             "topology_watts": 500},
            {"power_state": state, "allocated_watts": 500,
             "gpus": {str(i): {"power_watts": w} for i, w in enumerate(gpus or [])}})


def cluster(budgets, **nodes):
    return {"c": {"data": {"policies": ["High"], "device_specs": {"x": {"policy_watts": {"High": 1000}}},
                           "power_domains": {d: {"budget_watts": b} for d, (b, _) in budgets.items()},
                           "nodes": {n: i for n, (i, _) in nodes.items()}},
                  "cluster_metrics": {"domains": {d: {"allocated_watts": u}
                                                  for d, (_, u) in budgets.items()},
                                      "nodes": {n: m for n, (_, m) in nodes.items()}}}}


def test_power_aware_counts_each_placement_against_the_budget():
    clusters = cluster({"x": (2000, 1400), "y": (2000, 1500), "top": (None, 0)},
                       n1=node("x"), n2=node("x"), n3=node("y"))
    allocs = run(PowerAwarePolicy, clusters, {"requests": [{"power_policy": "High"}] * 3})
    # x keeps 600 - 500 = 100 W, then y 500 - 500 = 0 W, then x again: 100 - 500 < 0
    assert [a["node_id"] for a in allocs] == ["n1", "n3", "n2"]
    assert [a["headroom_watts"] for a in allocs] == [100, 0, -400]
    assert "400 W over its budget at High" in allocs[2]["reason"]
    unknown = run(PowerAwarePolicy, clusters, {"power_policy": "Turbo"})
    assert "3 in a cluster without power policy Turbo" in unknown[0]["error"]


def test_power_aware_ranks_by_the_cost_of_using_the_node_now():
    def at(domain, state, ready):
        info, live = node(domain, state)
        live["ready_seconds"] = ready
        return info, live
    # y has far more headroom, yet a node there that must boot (300 s) comes after one that
    # wakes (30 s), which comes after one waking, which comes after one awake
    clusters = cluster({"x": (2000, 1500), "y": (90000, 0), "top": (None, 0)},
                       off=at("y", "off", 300.0), slow=at("y", "asleep", 45.0),
                       asleep=at("x", "asleep", 30.0), waking=at("y", "waking", 50.0),
                       awake=at("x", "on", 0.0), lost=at("y", "unknown", None))
    allocs = run(PowerAwarePolicy, clusters, {"requests": [{}] * 6})
    assert [a["node_id"] for a in allocs] == ["awake", "waking", "asleep", "slow", "off", "lost"]
    assert [a["ready_seconds"] for a in allocs] == [0.0, 50.0, 30.0, 45.0, 300.0, None]
    assert allocs[2]["reason"].startswith("asleep: asleep, ready in about 30 s")
    assert "sooner ready than 1 other asleep node(s)" in allocs[2]["reason"]
    assert allocs[0]["headroom_source"] == "allocated caps"
    assert allocs[4]["reason"].startswith("off: off, ready in about 300 s")
    # a domain's drawn watts (from the metrics service) and leases count against its budget
    drawn = cluster({"x": (2000, 0), "y": (2000, 0)}, n1=node("x"), n2=node("y"))
    drawn["c"]["cluster_metrics"]["domains"]["x"]["drawn_watts"] = 1900
    drawn["c"]["cluster_metrics"]["domains"]["y"]["leased_watts"] = 1000
    [a] = run(PowerAwarePolicy, drawn, {"power_policy": "High"})
    assert (a["node_id"], a["headroom_watts"]) == ("n2", 500)
    assert a["headroom_source"] == "allocated caps + leases"
    drawn["c"]["cluster_metrics"]["domains"]["y"]["leased_watts"] = 1950
    [c] = run(PowerAwarePolicy, drawn, {"power_policy": "High"})
    assert (c["node_id"], c["headroom_watts"]) == ("n1", -400)
    assert c["headroom_source"] == "drawn watts (metrics service)"


def test_leased_nodes_are_not_offered_again():
    clusters = cluster({"x": (9000, 0)}, n1=node("x"), n2=node("x"))
    clusters["c"]["cluster_metrics"]["nodes"]["n1"]["lease"] = {"gpus": [], "exclusive": True}
    for policy in (PowerAwarePolicy, FirstFitPolicy):
        allocs = run(policy, clusters, {"requests": [{}, {}]})
        assert allocs[0]["node_id"] == "n2"
        assert "1 leased to a job not started yet" in allocs[1]["error"]


@pytest.mark.parametrize("uri,ok", [
    ("power-aware", True), ("site.v2_rule", True), ("", True),
    ("../secret", False), ("a/b", False), ("/abs/path.py", False), ("~root", False),
    ("http://127.0.0.1/p", False), ("file:policy", False), ("a..b", False), ("x" * 129, False),
    ("-dash", False)])
def test_policy_names_never_reach_paths_or_urls(uri, ok):
    if ok:
        assert check_uri(uri, "power-aware") == (uri or "power-aware")
    else:
        with pytest.raises(AllocatorError) as err:
            check_uri(uri, "power-aware")
        assert err.value.code == "invalid_request"


def test_registry_loads_admin_files_safely_and_reloads_changes(tmp_path):
    d = str(tmp_path)
    write_policy(d, "mine", "POLICY_CLASS = None\nclass A:\n    def eval(self, p, i, c):\n"
                            "        return {}\nclass B(A):\n    pass\nPOLICY_CLASS = B\n",
                 defaults={"parameters": {"k": 1}, "settings": {"s": "x"}})
    registry = PolicyRegistry(d)
    entry = registry.resolve("mine")
    assert entry.cls.__name__ == "B" and entry.parameters == {"k": 1} and entry.origin.endswith("mine.py")
    assert registry.names() == ["first-fit", "mine", "power-aware"]
    path = write_policy(d, "mine", "class C:\n    def eval(self, p, i, c):\n        return {}\n\n")
    assert registry.resolve("mine").cls.__name__ == "C"
    os.chmod(path, 0o666)
    with pytest.raises(AllocatorError, match="writable by group or others"):
        registry.resolve("mine")
    write_policy(d, "two", "class A:\n    def eval(self): pass\nclass B:\n    def eval(self): pass\n")
    with pytest.raises(AllocatorError, match="2 classes with an eval method"):
        registry.resolve("two")
    write_policy(d, "syntax", "def (:\n")
    with pytest.raises(AllocatorError, match="loading .*syntax.py failed: SyntaxError"):
        registry.resolve("syntax")
    with pytest.raises(AllocatorError, match="no policy 'nope' in the registry"):
        registry.resolve("nope")
    assert registry.context("mine") is registry.context("mine")


def test_filters():
    data = {"labels": {"site": "east", "tags": ["gpu", "ib"]}, "gpu_count": 32, "flag": True}
    assert matches(data, {"labels.site": "east", "gpu_count": {"$gte": 32, "$lt": 33}})
    assert matches(data, {"labels.tags": "ib", "labels.site": {"$in": ["east", "west"]}})
    assert matches(data, {"$or": [{"gpu_count": 1}, {"labels.tags": {"$contains": "gpu"}}]})
    assert matches(data, {"$not": {"labels.site": "west"}, "zone": {"$exists": False}})
    assert not matches(data, {"flag": 1}) and not matches(data, {"gpu_count": {"$gt": "a"}})
    assert not matches(data, {"labels.site": {"$nin": ["east"]}})
    for bad in ({"gpu_count": {"$near": 1}}, {"$xor": []}, {"$or": []},
                {"gpu_count": {"$in": 3}}, {"gpu_count": {"$gt": None}}):
        with pytest.raises(FilterError):
            matches(data, bad)


def test_policy_results_are_checked_against_the_candidate_clusters():
    clusters = {"c": {"data": {"nodes": {"n1": {"gpu_count": 2}}}}}
    assert check_result("p", {"cluster_id": "c", "node_id": "n1", "gpus": [1, "0"]}, clusters) \
        == [{"cluster_id": "c", "node_id": "n1", "gpus": ["1", "0"]}]
    assert check_result("p", {"allocations": [{"error": "full"}]}, clusters) == [{"error": "full"}]
    for bad, words in (({"allocations": [{"cluster_id": "c", "x": float("nan")}]}, "plain JSON"),
                       ({"allocations": [{"cluster_id": "c", "node_id": "n1", "gpus": ["2"]}]},
                        "GPUs 0-1, not 2"),
                       ({"allocations": [{"cluster_id": "c", "node_id": "n1", "gpus": [True]}]},
                        "neither a string"),
                       (None, "expected")):
        with pytest.raises(AllocatorError, match=words) as err:
            check_result("p", bad, clusters)
        assert err.value.code == "bad_policy_result"


def test_config_file_problems_name_the_key(tmp_path):
    cfg = parse_allocator_config({"clusters": [{"state_dir": "s", "id": "a"}], "max_workers": 2,
                                  "policy_dir": "pol"}, "f.json", str(tmp_path))
    assert cfg.clusters[0].state_dir == str(tmp_path / "s") and cfg.policy_dir == str(tmp_path / "pol")
    with pytest.raises(AllocatorConfigError, match=r"f.json: max_workers: 0 is less than"):
        parse_allocator_config({"max_workers": 0}, "f.json")
    with pytest.raises(AllocatorConfigError, match="metrics_url"):
        parse_allocator_config({"metrics_url": "ftp://x"}, "f.json")
    with pytest.raises(AllocatorConfigError, match="ids must be unique"):
        parse_allocator_config({"clusters": [{"state_dir": "a", "id": "x"},
                                             {"state_dir": "b", "id": "x"}]}, "f.json")


@pytest.mark.parametrize("policy", [PowerAwarePolicy, FirstFitPolicy])
def test_shipped_policies_keep_their_promise_not_to_change_input_data(tmp_path, policy):
    import copy
    assert policy.READS_INPUT_ONLY
    clusters = view(make_cluster(str(tmp_path)))
    before = copy.deepcopy(clusters)
    allocs = run(policy, clusters, {"requests": [{"gpus": 2, "power_policy": "High"}] * 7})
    assert clusters == before and len(allocs) == 7 and "error" in allocs[6]


def test_the_default_policy_is_checked_when_the_server_starts(tmp_path):
    from pbs_power.allocator.config import AllocatorConfig
    from pbs_power.allocator.service import AllocatorService
    state = make_cluster(str(tmp_path / "s"))
    for bad, words in (("../evil", "a path is not accepted"), ("nope", "no policy 'nope'")):
        with pytest.raises(AllocatorConfigError, match=words):
            AllocatorService(AllocatorConfig(clusters=(ClusterSource(state),), default_policy=bad))
    good = AllocatorService(AllocatorConfig(clusters=(ClusterSource(state),),
                                            default_policy="first-fit"))
    answer = good.handle({"adhoc": True, "policy_rule_uri": "", "inputs": {"gpus": 1}})
    assert answer["policy_rule_uri"] == "first-fit" and answer["allocations"][0]["node_id"] == "a1"
