"""Every validation rule of the policy API, each with the field it names."""
import math

import pytest

from pbs_power.groups.gpu_policy import parse_gpu_policies
from pbs_power.groups.limits_policy import parse_limits_policy
from pbs_power.groups.policy import (PolicyElementType, PolicyError, PowerLimit, parse_policies,
                                     parse_policy)


def node(watts=None, pct=None, element="NODE"):
    limit = {"watts": watts} if watts is not None else {"percentage": pct}
    return {"element_type": element, "power_limit": limit}


def test_a_valid_policy_parses_and_resolves():
    p = parse_policy({"name": "Node-High", "limits": [node(8000), node(pct=90, element="GPU")],
                      "properties": {"tier": "gold"}})
    assert p.node_watts(10200) == 8000
    assert p.limit(PolicyElementType.GPU).resolve(700) == pytest.approx(630)
    assert parse_policy(p.to_dict()) == p


def test_percentage_node_limit_resolves_against_the_device_max():
    assert parse_policy({"name": "half", "limits": [node(pct=50)]}).node_watts(1000) == 500


def test_element_types_accept_proto_names_and_numbers():
    p = parse_policy({"name": "x", "limits": [node(1), {"element_type": "POLICY_ELEMENT_TYPE_CPU",
                                                        "power_limit": {"watts": 2}},
                                              {"element_type": 3, "power_limit": {"watts": 3}}]})
    assert [l.element_type for l in p.limits] == [PolicyElementType.NODE, PolicyElementType.CPU,
                                                  PolicyElementType.MEMORY]


@pytest.mark.parametrize("doc,message", [
    ({"name": "", "limits": [node(1)]}, "policy.name: must be a non-empty string"),
    ({"limits": [node(1)]}, "policy.name: must be a non-empty string"),
    ({"name": "x", "limits": []}, "policy.limits: must be a non-empty list"),
    ({"name": "x"}, "policy.limits: must be a non-empty list"),
    ({"name": "x", "limits": [node(100, element="GPU")]}, "policy.limits: must include a NODE limit"),
    ({"name": "x", "limits": [node(0)]}, "policy.limits[0].power_limit.watts: must be greater than 0"),
    ({"name": "x", "limits": [node(-5)]}, "must be greater than 0, got -5"),
    ({"name": "x", "limits": [node(math.inf)]}, "power_limit.watts: must be finite"),
    ({"name": "x", "limits": [node(math.nan)]}, "power_limit.watts: must be finite"),
    ({"name": "x", "limits": [node(pct=0)]}, "percentage: must be greater than 0 and at most 100"),
    ({"name": "x", "limits": [node(pct=100.5)]}, "percentage: must be greater than 0 and at most 100"),
    ({"name": "x", "limits": [node(pct=math.inf)]}, "percentage: must be finite"),
    ({"name": "x", "limits": [{"element_type": "NODE",
                               "power_limit": {"watts": 1, "percentage": 5}}]},
     "give watts or percentage, not both"),
    ({"name": "x", "limits": [{"element_type": "NODE", "power_limit": {}}]},
     "needs one of watts or percentage"),
    ({"name": "x", "limits": [{"element_type": "NODE"}]}, "power_limit: is required"),
    ({"name": "x", "limits": [node(1, element="DISK")]}, "must be one of NODE, GPU, CPU, MEMORY"),
    ({"name": "x", "limits": [node(1, element=True)]}, "must be one of NODE, GPU, CPU, MEMORY"),
    ({"name": "x", "limits": [{"element_type": "NODE", "power_limit": {"watts": "100"}}]},
     "watts: must be a number, got '100'"),
    ({"name": "x", "limits": [node(1)], "properties": []}, "policy.properties: must be an object"),
    ({"name": "x", "limits": [node(1)], "limit": 3}, "unknown field 'limit'"),
    ("Node-High", "policy: must be an object"),
])
def test_bad_policies_name_the_field(doc, message):
    with pytest.raises(PolicyError) as err:
        parse_policy(doc)
    assert message in str(err.value)


def test_policy_names_are_unique_within_a_list():
    with pytest.raises(PolicyError) as err:
        parse_policies([{"name": "a", "limits": [node(1)]}, {"name": "a", "limits": [node(2)]}])
    assert "policies[1].name: 'a' is already the name of policies[0]" in str(err.value)


def test_every_problem_is_reported_at_once():
    with pytest.raises(PolicyError) as err:
        parse_policy({"name": "", "limits": [node(-1), node(pct=200)]})
    assert len(err.value.problems) == 3


SPEC_OK = {"operating_range_watts": {"ceiling": 900, "target": 700, "floor": 300},
           "gpu_target_percent": 80}


def limits_policy(spec=None, scope=None):
    return {"type": "ComputerSystemLimits.v1", "scope": scope or {"entities": ["n1"]},
            "spec": SPEC_OK if spec is None else spec}


def test_computer_system_limits_policy_parses():
    p = parse_limits_policy(limits_policy())
    assert p.spec.operating_range_watts.target == 700 and p.scope.entities == ("n1",)


@pytest.mark.parametrize("doc,message", [
    (limits_policy({"operating_range_watts": {"ceiling": 9, "target": 7, "floor": -1}}),
     "operating_range_watts.floor: must be >= 0"),
    (limits_policy({"operating_range_watts": {"ceiling": math.inf, "target": 7, "floor": 1}}),
     "ceiling: must be finite"),
    (limits_policy({"operating_range_watts": {"ceiling": 5, "target": 7, "floor": 1}}),
     "needs floor <= target <= ceiling"),
    (limits_policy({"operating_range_watts": {"ceiling": 5, "floor": 1}}), "target: is required"),
    (limits_policy({"operating_range_percent": {"ceiling": 120, "target": 7, "floor": 1}}),
     "operating_range_percent.ceiling: must be <= 100"),
    (limits_policy({"cpu_target_percent": 101}), "cpu_target_percent: must be between 0 and 100"),
    (limits_policy({"memory_target_percent": -1}), "memory_target_percent: must be between 0"),
    (limits_policy({"gpu_target_percent": math.nan}), "gpu_target_percent: must be finite"),
    (limits_policy({"operating_range_watts": SPEC_OK["operating_range_watts"],
                    "operating_range_percent": {"ceiling": 9, "target": 7, "floor": 1}}),
     "not both"),
    (limits_policy(scope={"entities": []}), "scope.entities: must contain at least one item"),
    (limits_policy(scope={"entities": [""]}), "scope.entities[0]: must be a non-empty string"),
    (limits_policy(scope={"devices": [{}]}), "scope.devices[0]: needs type or model"),
    (limits_policy(scope={"resource_groups": [""]}), "resource_groups[0]: must be a non-empty"),
    (limits_policy(scope={"entities": ["a"], "expr": "x"}), "needs exactly one of entities"),
    (dict(limits_policy(), type=""), "policy.type: must be a non-empty string"),
])
def test_bad_limits_policies_name_the_field(doc, message):
    with pytest.raises(PolicyError) as err:
        parse_limits_policy(doc)
    assert message in str(err.value)


def test_gpu_policies_need_distinct_ids_and_allow_null_limits():
    gp = parse_gpu_policies([{"gpu_id": 0, "power_limit": {"watts": 300}},
                             {"gpu_id": 1, "power_limit": None}])
    assert gp.policies[1].power_limit is None
    with pytest.raises(PolicyError, match=r"gpu_policies\[1\].gpu_id: GPU 0 is named twice"):
        parse_gpu_policies([{"gpu_id": 0}, {"gpu_id": 0}])
    with pytest.raises(PolicyError, match="must be an integer >= 0"):
        parse_gpu_policies([{"gpu_id": -1}])


def test_power_limit_resolve():
    assert PowerLimit(watts=250).resolve(700) == 250
    assert PowerLimit(percentage=25).resolve(700) == 175
