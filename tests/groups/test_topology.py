"""Tests of the topology: the sample, lookups, policies by watts, round trip, and bad input."""
from __future__ import annotations

import copy
import json
import math
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from pbs_power.groups.policy import PolicyElementType, PolicyLimit, PolicyObject, PowerLimit, parse_policy
from pbs_power.groups.topology import (
    DeviceSpec, GPUSpec, NodeSpec, PowerDomain, RangeSpec, Topology, TopologyError,
    load_topology, parse_topology,
)

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "config" / "topology.json"

BASE = {
    "name": "gpu-cluster-a",
    "device_specs": {
        "dgx-h100": {
            "type": "ComputerSystem", "model": "DGX H100",
            "node": {"min_watts": 3000, "idle_watts": 3500, "max_watts": 10200},
            "gpu": {"count": 8, "min_watts": 200, "max_watts": 700, "default_watts": 700},
            "cpu": {"min_watts": 100, "max_watts": 700},
            "memory": {"min_watts": 50, "max_watts": 300},
            "backend": "simulated",
        },
        "cpu-node": {"node": {"min_watts": 200, "idle_watts": 250, "max_watts": 1000}},
    },
    "power_domains": [
        {"name": "feed-a", "kind": "feed", "budget_watts": 600000, "children": [
            {"name": "row-1", "kind": "row", "budget_watts": 320000, "children": [
                {"name": "rack-01", "kind": "rack", "budget_watts": 120000},
                {"name": "rack-02", "kind": "rack", "budget_watts": None},
            ]},
            {"name": "row-2", "children": [
                {"name": "rack-03", "kind": "rack", "budget_watts": 50000},
            ]},
        ]},
    ],
    "policies": [
        {"name": "Node-High", "limits": [{"element_type": "NODE", "power_limit": {"watts": 10200}}]},
        {"name": "Node-Med", "limits": [{"element_type": "NODE",
                                         "power_limit": {"percentage": 80}}]},
        {"name": "Node-Low", "limits": [
            {"element_type": "NODE", "power_limit": {"watts": 6000}},
            {"element_type": "GPU", "power_limit": {"percentage": 60}}]},
    ],
    "default_policy": "Node-Med",
    "entities": [
        {"names": "gpu[001-016]", "device": "dgx-h100", "domain": "rack-01", "policy": "Node-Low"},
        {"names": "gpu[017-020]", "device": "dgx-h100", "domain": "rack-02"},
        {"names": "cpu[1-2]", "device": "cpu-node", "domain": "rack-03"},
    ],
}


def base():
    return copy.deepcopy(BASE)


@pytest.fixture(scope="module")
def topo():
    return parse_topology(base())


@pytest.fixture(scope="module")
def sample():
    return load_topology(SAMPLE)


def node_policy(name, watts=None, percentage=None):
    return PolicyObject(name, (PolicyLimit(PolicyElementType.NODE,
                                           PowerLimit(watts=watts, percentage=percentage)),))


def problems_of(doc, source="t.json"):
    with pytest.raises(TopologyError) as info:
        parse_topology(doc, source)
    return info.value


# --- the sample ---------------------------------------------------------------

def test_sample_loads_with_its_numbers(sample):
    assert sample.name == "gpu-cluster-a"
    assert len(sample.entities) == 68
    assert list(sample.entities)[:2] == ["gpu001", "gpu002"]
    assert list(sample.entities)[-4:] == ["cpu01", "cpu02", "cpu03", "cpu04"]
    gpu = sample.device_specs["hgx-h100-8gpu"]
    assert (gpu.gpu_count, gpu.node.max_watts, gpu.gpu.max_watts) == (8, 10200, 700)
    assert sample.device_specs["cpu-2s"].gpu is None
    assert [len(sample.entities_under("rack-%02d" % i)) for i in range(1, 6)] == [16] * 4 + [4]
    assert sample.warnings == ()
    assert sample.default_policy == "Node-Med"
    watts = {p.name: sample.node_watts("gpu001", p) for p in sample.policies.values()}
    assert watts == {"Node-High": 10200, "Node-Med": 8000, "Node-Low": 6000, "Node-Min": 4000,
                     "CPU-Capped": 3000}
    assert all(p.limit(PolicyElementType.GPU) or p.limit(PolicyElementType.CPU)
               for p in sample.policies.values())


def test_sample_at_its_topology_policies_fits_every_budget_but_not_uncapped(sample):
    for name, dom in sample.domains.items():
        under = sample.entities_under(name)
        at_policy = sum(sample.node_watts(e, sample.topology_policy(e)) for e in under)
        assert dom.budget_watts is not None and at_policy <= dom.budget_watts, name
    rack = sample.entities_under("rack-01")
    assert sum(sample.node_watts(e, None) for e in rack) > sample.domains["rack-01"].budget_watts


def test_sample_policy_of_cpu_nodes_is_their_own(sample):
    assert sample.topology_policy("cpu01").name == "CPU-Capped"
    assert sample.topology_policy("gpu064").name == "Node-Med"
    assert sample.node_watts("cpu01", sample.topology_policy("cpu01")) == 900


# --- structure and lookups ----------------------------------------------------

def test_domains_form_the_tree_in_file_order(topo):
    assert list(topo.domains) == ["feed-a", "row-1", "rack-01", "rack-02", "row-2", "rack-03"]
    assert topo.domains["row-1"] == PowerDomain("row-1", "row", 320000.0, "feed-a",
                                                ("rack-01", "rack-02"))
    assert topo.domains["feed-a"].parent is None
    assert topo.domains["row-2"].kind == "domain" and topo.domains["row-2"].budget_watts is None
    assert topo.domains["rack-02"].budget_watts is None


def test_domain_chain_goes_up_to_the_root(topo):
    assert topo.domain_chain("gpu001") == ("rack-01", "row-1", "feed-a")
    assert topo.domain_chain("cpu2") == ("rack-03", "row-2", "feed-a")
    with pytest.raises(KeyError, match="gpu999"):
        topo.domain_chain("gpu999")


def test_entities_under_a_domain_and_its_descendants(topo):
    assert topo.entities_under("rack-01") == tuple("gpu%03d" % i for i in range(1, 17))
    assert topo.entities_under("row-1") == tuple("gpu%03d" % i for i in range(1, 21))
    assert topo.entities_under("feed-a") == tuple(topo.entities)
    assert topo.entities_under("row-2") == ("cpu1", "cpu2")
    with pytest.raises(KeyError, match="rack-99"):
        topo.entities_under("rack-99")


def test_device_spec_defaults_and_derived_numbers(topo):
    cpu = topo.device_specs["cpu-node"]
    assert (cpu.type, cpu.model, cpu.backend, cpu.gpu, cpu.cpu) == (
        "ComputerSystem", "cpu-node", "simulated", None, None)
    assert cpu.gpu_count == 0 and cpu.non_gpu_max_watts == 1000
    dgx = topo.device_specs["dgx-h100"]
    assert dgx.gpu == GPUSpec(8, 200.0, 700.0, 700.0)
    assert dgx.cpu == RangeSpec(100.0, 700.0) and dgx.node == NodeSpec(3000.0, 3500.0, 10200.0)
    assert dgx.non_gpu_max_watts == 10200 - 8 * 700
    doc = base()
    del doc["device_specs"]["dgx-h100"]["gpu"]["default_watts"]
    assert parse_topology(doc).device_specs["dgx-h100"].gpu.default_watts == 700
    small = DeviceSpec("x", "t", "m", NodeSpec(1, 1, 100), GPUSpec(2, 1, 80, 80), None, None, "s")
    assert small.non_gpu_max_watts == 0


def test_topology_policy_is_own_then_default_then_none(topo):
    assert topo.topology_policy("gpu001").name == "Node-Low"
    assert topo.topology_policy("gpu017").name == "Node-Med"
    doc = base()
    doc["default_policy"] = None
    assert parse_topology(doc).topology_policy("gpu017") is None
    del doc["default_policy"]
    assert parse_topology(doc).topology_policy("cpu1") is None


def test_node_watts_in_watts_percentage_clamped_and_uncapped(topo):
    p = topo.policies
    assert topo.node_watts("gpu001", p["Node-Low"]) == 6000
    assert topo.node_watts("gpu001", p["Node-Med"]) == pytest.approx(8160)
    assert topo.node_watts("cpu1", p["Node-Med"]) == pytest.approx(800)
    assert topo.node_watts("gpu001", node_policy("tiny", watts=100)) == 3000
    assert topo.node_watts("gpu001", node_policy("huge", watts=20000)) == 10200
    assert topo.node_watts("cpu1", p["Node-Low"]) == 1000
    assert topo.node_watts("gpu001", None) == 10200
    gpu_only = PolicyObject("g", (PolicyLimit(PolicyElementType.GPU, PowerLimit(watts=300)),))
    assert topo.node_watts("gpu001", gpu_only) == 10200


def test_policies_by_node_watts_highest_first_ties_by_name(topo):
    assert [p.name for p in topo.policies_by_node_watts("gpu001")] == [
        "Node-High", "Node-Med", "Node-Low"]
    # on a 1000 W node Node-High and Node-Low both clamp to 1000 W
    assert [p.name for p in topo.policies_by_node_watts("cpu1")] == [
        "Node-High", "Node-Low", "Node-Med"]


def test_lower_policy_steps_strictly_down(topo):
    p = topo.policies
    assert topo.lower_policy("gpu001", None) is p["Node-Med"]
    assert topo.lower_policy("gpu001", p["Node-High"]) is p["Node-Med"]
    assert topo.lower_policy("gpu001", p["Node-Med"]) is p["Node-Low"]
    assert topo.lower_policy("gpu001", p["Node-Low"]) is None
    assert topo.lower_policy("cpu1", p["Node-High"]) is p["Node-Med"]
    assert topo.lower_policy("cpu1", p["Node-Med"]) is None
    assert topo.lower_policy("gpu001", node_policy("x", watts=7000)) is p["Node-Low"]


def test_device_model_is_json_ready(topo):
    model = topo.device_model("gpu003")
    assert json.loads(json.dumps(model)) == model
    assert set(model) == {"entity", "device_spec", "type", "model", "backend", "node", "gpu",
                          "cpu", "memory"}
    assert model["entity"] == "gpu003" and model["device_spec"] == "dgx-h100"
    assert model["gpu"] == {"count": 8, "min_watts": 200, "max_watts": 700, "default_watts": 700}
    assert model["node"]["max_watts"] == 10200
    cpu = topo.device_model("cpu1")
    assert cpu["gpu"] is None and cpu["memory"] is None
    json.dumps(cpu)


# --- round trip and copies ----------------------------------------------------

@pytest.mark.parametrize("which", ["base", "sample"])
def test_round_trip_gives_an_equal_topology(which, topo, sample):
    original = topo if which == "base" else sample
    doc = json.loads(json.dumps(original.to_dict()))
    again = parse_topology(doc)
    assert again == original
    assert list(again.entities) == list(original.entities)
    assert list(again.domains) == list(original.domains)
    assert list(again.policies) == list(original.policies)
    assert parse_topology(again.to_dict()).to_dict() == doc


def test_round_trip_compresses_alike_entities_and_keeps_order():
    doc = base()
    doc["entities"] = [
        {"names": "gpu[005-006]", "device": "dgx-h100", "domain": "rack-01"},
        {"names": "gpu[001-002]", "device": "dgx-h100", "domain": "rack-01"},
        {"names": "gpu[003-004]", "device": "dgx-h100", "domain": "rack-01"},
        {"names": "cpu1", "device": "cpu-node", "domain": "rack-03", "policy": "Node-Low"},
    ]
    topo = parse_topology(doc)
    assert list(topo.entities) == ["gpu005", "gpu006", "gpu001", "gpu002", "gpu003", "gpu004",
                                   "cpu1"]
    out = topo.to_dict()
    assert [e["names"] for e in out["entities"]] == ["gpu[005-006]", "gpu[001-004]", "cpu1"]
    again = parse_topology(out)
    assert again == topo and list(again.entities) == list(topo.entities)


def test_sample_writes_back_one_entry_per_rack(sample):
    assert [e["names"] for e in sample.to_dict()["entities"]] == [
        "gpu[001-016]", "gpu[017-032]", "gpu[033-048]", "gpu[049-064]", "cpu[01-04]"]


def test_with_policy_adds_one_and_leaves_the_original(topo):
    eco = parse_policy({"name": "Node-Eco",
                        "limits": [{"element_type": "NODE", "power_limit": {"watts": 5000}}]})
    more = topo.with_policy(eco)
    assert list(more.policies) == ["Node-High", "Node-Med", "Node-Low", "Node-Eco"]
    assert "Node-Eco" not in topo.policies
    assert more.lower_policy("gpu001", topo.policies["Node-Low"]) is eco
    assert topo.lower_policy("gpu001", topo.policies["Node-Low"]) is None
    assert parse_topology(more.to_dict()) == more


def test_with_policy_refuses_a_taken_name_or_an_invalid_policy(topo):
    with pytest.raises(TopologyError, match="already has a policy named 'Node-Med'"):
        topo.with_policy(node_policy("Node-Med", watts=100))
    gpu_only = PolicyObject("g", (PolicyLimit(PolicyElementType.GPU, PowerLimit(watts=300)),))
    with pytest.raises(TopologyError, match="must include a NODE limit"):
        topo.with_policy(gpu_only)
    with pytest.raises(TopologyError, match="watts: must be greater than 0"):
        topo.with_policy(node_policy("neg", watts=-5))


# --- warnings -----------------------------------------------------------------

def test_child_budget_above_parent_warns_but_loads():
    doc = base()
    doc["power_domains"][0]["children"][0]["children"][0]["budget_watts"] = 400000
    topo = parse_topology(doc)
    assert len(topo.warnings) == 1
    warning = topo.warnings[0]
    assert warning.startswith("power_domains[0].children[0].children[0].budget_watts:")
    assert "'rack-01'" in warning and "its parent 'row-1'" in warning and "400000" in warning


def test_budget_above_a_budgeted_ancestor_through_an_unlimited_parent_warns():
    doc = base()
    doc["power_domains"][0]["children"][1]["children"][0]["budget_watts"] = 700000
    (warning,) = parse_topology(doc).warnings
    assert "its ancestor 'feed-a'" in warning and "'rack-03'" in warning


def test_the_base_has_no_warnings(topo):
    assert topo.warnings == ()


# --- bad topologies -----------------------------------------------------------

def _set(path, value):
    def change(doc):
        *head, last = path
        node = doc
        for key in head:
            node = node[key]
        node[last] = value
    return change


def _delete(path):
    def change(doc):
        *head, last = path
        node = doc
        for key in head:
            node = node[key]
        del node[last]
    return change


def _append(path, value):
    def change(doc):
        node = doc
        for key in path:
            node = node[key]
        node.append(value)
    return change


DGX = ("device_specs", "dgx-h100")
RACK01 = ("power_domains", 0, "children", 0, "children", 0)
BAD = [
    ("duplicate-entity", _append(("entities",), {"names": "gpu[010-018]", "device": "dgx-h100",
                                                 "domain": "rack-02"}),
     "entities[3].names: gpu[010-016] already named by entities[0].names"),
    ("unknown-device", _set(("entities", 1, "device"), "dgx-h10"),
     "entities[1].device: no device spec named 'dgx-h10' (did you mean 'dgx-h100'?)"),
    ("unknown-domain", _set(("entities", 0, "domain"), "rack-1"),
     "entities[0].domain: no power domain named 'rack-1' (did you mean 'rack-01'?)"),
    ("unknown-policy", _set(("entities", 0, "policy"), "Node-Lwo"),
     "entities[0].policy: no policy named 'Node-Lwo' (did you mean 'Node-Low'?)"),
    ("unknown-default-policy", _set(("default_policy",), "Eco"),
     "default_policy: no policy named 'Eco' (known: 'Node-High', 'Node-Med', 'Node-Low')"),
    ("duplicate-domain", _set(("power_domains", 0, "children", 1, "children", 0, "name"),
                              "rack-01"),
     "power_domains[0].children[1].children[0].name: 'rack-01' is already the name of "
     "power_domains[0].children[0].children[0]"),
    ("negative-budget", _set(RACK01 + ("budget_watts",), -5),
     "power_domains[0].children[0].children[0].budget_watts: must be greater than 0, got -5"),
    ("zero-budget", _set(("power_domains", 0, "budget_watts"), 0),
     "power_domains[0].budget_watts: must be greater than 0, got 0"),
    ("string-budget", _set(RACK01 + ("budget_watts",), "lots"),
     "budget_watts: must be a number or null, got 'lots'"),
    ("infinite-budget", _set(("power_domains", 0, "budget_watts"), math.inf),
     "power_domains[0].budget_watts: must be a finite number, got inf"),
    ("node-min-above-max", _set(DGX + ("node", "min_watts"), 20000),
     "device_specs.dgx-h100.node: needs min_watts <= idle_watts <= max_watts, "
     "got 20000 <= 3500 <= 10200"),
    ("node-idle-above-max", _set(DGX + ("node", "idle_watts"), 12000),
     "device_specs.dgx-h100.node: needs min_watts <= idle_watts <= max_watts"),
    ("node-nan", _set(DGX + ("node", "max_watts"), math.nan),
     "device_specs.dgx-h100.node.max_watts: must be a finite number, got nan"),
    ("gpu-default-out-of-range", _set(DGX + ("gpu", "default_watts"), 800),
     "device_specs.dgx-h100.gpu: needs min_watts <= default_watts <= max_watts, "
     "got 200 <= 800 <= 700"),
    ("gpu-min-total-above-node-max", _set(DGX + ("gpu", "count"), 60),
     "device_specs.dgx-h100.gpu.min_watts: 60 GPUs at min_watts 200 W draw 12000 W, "
     "more than node.max_watts 10200 W"),
    ("gpu-count-zero", _set(DGX + ("gpu", "count"), 0),
     "device_specs.dgx-h100.gpu.count: must be 1 or more, got 0"),
    ("gpu-count-fraction", _set(DGX + ("gpu", "count"), 2.5),
     "device_specs.dgx-h100.gpu.count: must be an integer, got 2.5"),
    ("gpu-max-above-node-max", _set(DGX + ("gpu", "max_watts"), 11000),
     "device_specs.dgx-h100.gpu.max_watts: 11000 W is more than node.max_watts 10200 W"),
    ("cpu-min-above-max", _set(DGX + ("cpu", "min_watts"), 800),
     "device_specs.dgx-h100.cpu: needs min_watts <= max_watts, got 800 > 700"),
    ("missing-node-spec", _delete(DGX + ("node",)),
     "device_specs.dgx-h100: needs the key 'node'"),
    ("bad-hostlist", _set(("entities", 0, "names"), "gpu[001-016"),
     "entities[0].names: is not a valid hostlist expression 'gpu[001-016'"),
    ("node-group", _set(("entities", 1, "names"), "@gpus"),
     "entities[1].names: names '@gpus', which is not a host name"),
    ("node-group-in-a-list", _set(("entities", 1, "names"), "gpu[017-020],@gpus"),
     "node groups such as @name are not supported"),
    ("huge-hostlist", _set(("entities", 1, "names"), "n[1-100000000]"),
     "entities[1].names: names about 100000000 hosts (more than 100000)"),
    ("blank-hostlist", _set(("entities", 1, "names"), "  "),
     "entities[1].names: names no host: '  '"),
    ("empty-hostlist", _set(("entities", 1, "names"), ""),
     "entities[1].names: must not be empty"),
    ("unknown-top-level-key", _set(("polices",), []),
     "unknown key 'polices' (did you mean 'policies'?)"),
    ("unknown-gpu-key", _set(DGX + ("gpu", "cnt"), 8),
     "device_specs.dgx-h100.gpu: unknown key 'cnt' (did you mean 'count'?)"),
    ("unknown-domain-key", _set(("power_domains", 0, "budget"), 5),
     "power_domains[0]: unknown key 'budget' (did you mean 'budget_watts'?)"),
    ("unknown-entity-key", _set(("entities", 2, "polcy"), "Node-Low"),
     "entities[2]: unknown key 'polcy' (did you mean 'policy'?)"),
    ("comment-only-at-top-level", _set(("power_domains", 0, "_comment"), "x"),
     "power_domains[0]: unknown key '_comment'"),
    ("policy-without-node-limit", _set(("policies", 2, "limits"),
                                       [{"element_type": "GPU", "power_limit": {"watts": 300}}]),
     "policies[2].limits: must include a NODE limit"),
    ("policy-watts-and-percentage", _set(("policies", 0, "limits", 0, "power_limit"),
                                         {"watts": 100, "percentage": 50}),
     "policies[0].limits[0].power_limit: give watts or percentage, not both"),
    ("policy-percentage-over-100", _set(("policies", 1, "limits", 0, "power_limit"),
                                        {"percentage": 150}),
     "policies[1].limits[0].power_limit.percentage: must be 100 or less, got 150"),
    ("policy-element-type", _set(("policies", 0, "limits", 0, "element_type"), "DISK"),
     "policies[0].limits[0].element_type: must be one of NODE, GPU, CPU, MEMORY"),
    ("policy-unknown-key", _set(("policies", 0, "limit"), []),
     "policies[0]: unknown key 'limit' (did you mean 'limits'?)"),
    ("policy-blank-name", _set(("policies", 0, "name"), "  "),
     "policies[0].name: must be a non-empty string"),
    ("duplicate-policy-names", _set(("policies", 1, "name"), "Node-High"),
     "policies[1].name: 'Node-High' is already the name of policies[0]"),
    ("name-wrong-type", _set(("name",), 5), "name: must be a string, got 5"),
    ("entities-wrong-type", _set(("entities",), {"names": "gpu1"}),
     "entities: must be a list, got an object"),
    ("device-specs-wrong-type", _set(("device_specs",), []),
     "device_specs: must be an object, got a list"),
    ("device-wrong-type", _set(("entities", 0, "device"), 3),
     "entities[0].device: must be a string, got 3"),
    ("watts-as-bool", _set(DGX + ("node", "max_watts"), True),
     "device_specs.dgx-h100.node.max_watts: must be a number, got true"),
    ("missing-entities", _delete(("entities",)), "the topology: needs the key 'entities'"),
]


@pytest.mark.parametrize("change,expected", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_topology_names_the_path_and_the_gist(change, expected):
    doc = base()
    change(doc)
    before = copy.deepcopy(doc)
    err = problems_of(doc)
    assert any(expected in p for p in err.problems), err.problems
    assert all(line.startswith("t.json: ") for line in str(err).splitlines())
    assert len(str(err).splitlines()) == len(err.problems)
    if "nan" not in expected:
        assert doc == before  # the document is not modified


def test_at_least_twenty_distinct_bad_topologies():
    assert len({b[0] for b in BAD}) == len(BAD) >= 20


def test_every_problem_is_reported_not_only_the_first():
    doc = base()
    for _name, change, _expected in BAD[:6]:
        change(doc)
    err = problems_of(doc)
    for _name, _change, expected in BAD[:6]:
        assert any(expected in p for p in err.problems), (expected, err.problems)


@pytest.mark.parametrize("doc", [[], "topology", None, 3])
def test_top_level_must_be_an_object(doc):
    err = problems_of(doc)
    assert err.problems == ["the topology must be a JSON object ({...}), got %s"
                            % {list: "a list", str: "'topology'", type(None): "null",
                               int: "3"}[type(doc)]]


def test_error_pickles_and_reads_one_problem_per_line():
    err = TopologyError(["a: one", "b: two"], "x.json")
    assert str(err) == "x.json: a: one\nx.json: b: two"
    again = pickle.loads(pickle.dumps(err))
    assert again.problems == err.problems and str(again) == str(err)
    assert isinstance(err, ValueError)


# --- files --------------------------------------------------------------------

def test_bad_json_file_names_line_and_column(tmp_path):
    path = tmp_path / "topo.json"
    path.write_text('{\n  "name": "x",\n  "entities": [,]\n}\n')
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    assert str(info.value).startswith(str(path) + ": invalid JSON at line 3, column 16")


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(TopologyError, match="nope.json: file not found"):
        load_topology(tmp_path / "nope.json")
    with pytest.raises(TopologyError, match="is a directory"):
        load_topology(tmp_path)


def test_non_object_file_and_duplicate_keys(tmp_path):
    path = tmp_path / "list.json"
    path.write_text("[]")
    with pytest.raises(TopologyError, match="must be a JSON object"):
        load_topology(path)
    doc = json.dumps(base())
    path.write_text(doc.replace('"device_specs": {', '"device_specs": {"cpu-node": {}, ', 1))
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    assert info.value.problems == ["duplicate key 'cpu-node' in one object: JSON would keep "
                                   "only its last value"]


def test_load_file_equals_parse(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(base()))
    assert load_topology(path) == parse_topology(base())


def test_works_under_python_OO():
    code = ("import sys; from pbs_power.groups.topology import load_topology, parse_topology, "
            "TopologyError\nt = load_topology(sys.argv[1])\n"
            "try:\n    parse_topology({'name': 1})\nexcept TopologyError as e:\n"
            "    print(len(t.entities), len(e.problems))\n")
    out = subprocess.run([sys.executable, "-OO", "-c", code, str(SAMPLE)], check=True,
                         capture_output=True, text=True).stdout.split()
    assert out[0] == "68" and int(out[1]) == 2


# --- size ---------------------------------------------------------------------

@pytest.mark.parametrize("one_entry", [True, False])
def test_a_4096_entity_topology_parses(one_entry):
    doc = base()
    if one_entry:
        doc["entities"] = [{"names": "n[0001-4096]", "device": "dgx-h100", "domain": "rack-02"}]
    else:
        doc["entities"] = [{"names": "n%04d" % i, "device": "cpu-node",
                            "domain": ("rack-01", "rack-02", "rack-03")[i % 3]}
                           for i in range(1, 4097)]
    topo = parse_topology(doc)
    assert len(topo.entities) == 4096
    assert len(topo.entities_under("feed-a")) == 4096
    assert topo.domain_chain("n4096")[-1] == "feed-a"
    assert parse_topology(topo.to_dict()) == topo


def test_direct_construction_precomputes_lookups():
    spec = DeviceSpec("s", "ComputerSystem", "m", NodeSpec(1, 2, 100), None, None, None,
                      "simulated")
    from pbs_power.groups.topology import Entity
    topo = Topology("t", {"s": spec},
                    {"r": PowerDomain("r", "row", None, None, ("k",)),
                     "k": PowerDomain("k", "rack", 50.0, "r", ())},
                    {"a": Entity("a", spec, "k", None)}, {})
    assert topo.domain_chain("a") == ("k", "r") and topo.entities_under("r") == ("a",)
    assert topo.policies_by_node_watts("a") == () and topo.lower_policy("a", None) is None
