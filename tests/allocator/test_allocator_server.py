"""The allocator server over a real WebSocket on a free local port: answers and bad input."""
import asyncio
import json
import os
import time

import pytest
import websockets

from allocator_helpers import (SEED_PAYLOAD, ask, config, hook_config, make_cluster,
                               put_to_sleep, request, running, write_policy)
from pbs_power.allocator.config import ClusterSource

RAISES = """
class Broken:
    def __init__(self, rule_id, settings, parameters):
        pass
    def eval(self, parameters, input_data, context):
        raise RuntimeError("division by budget")
"""

MALFORMED = """
class Malformed:
    def __init__(self, rule_id, settings, parameters):
        self.parameters = parameters
    def eval(self, parameters, input_data, context):
        return parameters["answer"]
"""

# Waits (polling, up to 60 s) until the file named by its settings exists.
WAITS = """
import os, time
class Waits:
    def __init__(self, rule_id, settings, parameters):
        self.settings = settings
    def eval(self, parameters, input_data, context):
        deadline = time.monotonic() + 60
        while not os.path.exists(self.settings["release"]) and time.monotonic() < deadline:
            time.sleep(0.02)
        cid = sorted(input_data["cluster_data"])[0]
        return {"cluster_id": cid}
"""

COUNTS = """
class AIOSv1PolicyRule:
    def __init__(self, rule_id, settings, parameters):
        self.rule_id = rule_id
    def eval(self, parameters, input_data, context):
        context["runs"] = context.get("runs", 0) + 1
        cid = sorted(input_data["cluster_data"])[0]
        return {"allocations": [{"cluster_id": cid, "runs": context["runs"],
                                 "rule": self.rule_id}]}
"""

# Uses the clients the server puts in settings, as the seed's policies do.
CLIENTS = """
class UsesClients:
    def __init__(self, rule_id, settings, parameters):
        self.settings = settings
    def eval(self, parameters, input_data, context):
        ok, data = self.settings["cluster_client"].read_cluster("box-cluster")
        metrics = self.settings["cluster_metrics_client"].get_cluster("box-cluster")
        ok2, ids = self.settings["cluster_client"].execute_query({"labels.room": "b12"})
        node = sorted(n for n, m in metrics["nodes"].items() if m["power_state"] == "asleep")[0]
        return {"cluster_id": data["cluster_id"], "node_id": node, "gpus": [3],
                "found": ids, "site": self.settings["site"], "ok": ok and ok2}
"""


@pytest.fixture
def cluster(tmp_path):
    """box-cluster with a1 and b1 asleep (simulated power backend)."""
    state = make_cluster(str(tmp_path / "state"))
    hook_dir = str(tmp_path / "hook")
    put_to_sleep(hook_dir, ["a1", "b1"])
    policies = str(tmp_path / "policies")
    for name, code in (("broken", RAISES), ("malformed", MALFORMED), ("waits", WAITS),
                       ("counts", COUNTS), ("clients", CLIENTS)):
        write_policy(policies, name, code)
    source = ClusterSource(state, hook_config=hook_config(str(tmp_path / "hook.json"), hook_dir),
                           labels={"room": "b12"})
    return config([source], policy_dir=policies)


@pytest.fixture
def url(cluster):
    with running(cluster) as u:
        yield u


def test_the_seeds_example_payload_gets_an_allocation(url):
    [answer] = ask(url, SEED_PAYLOAD)
    assert answer["ok"], answer
    assert answer["policy_rule_uri"] == "power-aware" and answer["clusters"] == ["box-cluster"]
    [alloc] = answer["allocations"]
    assert alloc["cluster_id"] == "box-cluster" and alloc["power_state"] == "on"
    assert alloc["node_id"] in {"a2", "a3", "b2", "b3"} and alloc["gpus"] == []
    assert alloc["reason"].startswith(alloc["node_id"] + ": awake")


def test_several_allocation_requests_get_distinct_nodes_in_order(url):
    asks = [{"id": "job-%d" % i, "gpus": g} for i, g in enumerate([2, 4, 1, 0])]
    [answer] = ask(url, request(inputs={"requests": asks}, request_id="r-7"))
    assert answer["ok"] and answer["request_id"] == "r-7"
    allocs = answer["allocations"]
    assert [a["request_id"] for a in allocs] == ["job-0", "job-1", "job-2", "job-3"]
    assert len({a["node_id"] for a in allocs}) == 4
    assert [len(a["gpus"]) for a in allocs] == [2, 4, 1, 0]
    # the four awake nodes go first, those of the roomiest rack before the others
    assert [a["node_id"] for a in allocs] == ["b2", "b3", "a2", "a3"]
    assert allocs[0]["gpus"] == ["0", "1"] and allocs[1]["gpus"] == ["0", "1", "2", "3"]
    assert all(a["lease_id"] and a["lease_expires_in_s"] == 120 for a in allocs)


def test_power_aware_chooses_differently_from_first_fit(url):
    job = {"requests": [{"id": "j", "gpus": 2, "power_policy": "High"}]}
    [aware, first] = ask(url, request(policy_rule_uri="power-aware", inputs=job),
                         request(policy_rule_uri="first-fit", inputs=job))
    [a], [f] = aware["allocations"], first["allocations"]
    # first-fit: a1, although it is asleep and rack-a has no room for High
    assert (f["node_id"], f["gpus"]) == ("a1", ["0", "1"])
    # power-aware: awake, and rack-b keeps 10000 - 1500 - 500 W
    assert (a["node_id"], a["gpus"], a["power_state"]) == ("b2", ["0", "1"], "on")
    assert a["headroom_watts"] == 8000 and a["power_policy"] == "High"
    assert "rack-b keeps 8000 W under its budget at High (from allocated caps)" in a["reason"]
    assert a["headroom_source"] == "allocated caps"


BAD = [
    ("{not json", "bad_json"),
    (b"\xff\xfe binary", "bad_json"),
    ("[1, 2]", "invalid_request"),
    (json.dumps(dict(SEED_PAYLOAD, adhoc="yes")), "invalid_request"),
    (json.dumps(dict(SEED_PAYLOAD, adhoc=False)), "invalid_request"),
    (json.dumps(dict(SEED_PAYLOAD, clusters="box-cluster")), "invalid_request"),
    (json.dumps(dict(SEED_PAYLOAD, inputs=[])), "invalid_request"),
    (json.dumps({"adhoc": True, "inputs": {}}), "invalid_request"),
    (json.dumps(dict(SEED_PAYLOAD, priority=3)), "invalid_request"),
    (json.dumps(dict(SEED_PAYLOAD, policy_rule_uri="no-such-policy")), "unknown_policy"),
    (json.dumps(dict(SEED_PAYLOAD, policy_rule_uri="../policies/broken")), "invalid_request"),
    (json.dumps(dict(SEED_PAYLOAD, policy_rule_uri="/etc/passwd")), "invalid_request"),
    (json.dumps(dict(SEED_PAYLOAD, policy_rule_uri="http://127.0.0.1/p.py")), "invalid_request"),
    (json.dumps(dict(SEED_PAYLOAD, policy_rule_uri="broken")), "policy_error"),
    (json.dumps(dict(SEED_PAYLOAD, inputs={"gpus": -1})), "invalid_inputs"),
    (json.dumps(dict(SEED_PAYLOAD, parameters={"speed": 1})), "invalid_inputs"),
    (json.dumps(dict(SEED_PAYLOAD, clusters=["nowhere"])), "unknown_cluster"),
    (json.dumps(dict(SEED_PAYLOAD, search={"text": "big gpus"})), "not_supported"),
    (json.dumps(dict(SEED_PAYLOAD, filter={"labels.room": {"$near": 1}})), "invalid_request"),
    (json.dumps(dict(SEED_PAYLOAD, filter={"labels.room": "attic"})), "unknown_cluster"),
    (json.dumps(dict(SEED_PAYLOAD, filter={"labels.room": "b12"}, search={"q": "x"})),
     "not_supported"),
    ("[" * 100000 + "]" * 100000, "invalid_request"),
    (json.dumps(dict(SEED_PAYLOAD, inputs={"deep": json.loads("[" * 70 + "]" * 70)})),
     "invalid_request"),
    (json.dumps(dict(SEED_PAYLOAD, filter={"$not": json.loads("{\"$not\": " * 100 + "{}"
                                                              + "}" * 100)})),
     "invalid_request"),
    (json.dumps({"op": "management", "policy_rule_uri": "counts", "action": "x", "data": {}}),
     "forbidden"),
    (json.dumps({"op": "reboot"}), "invalid_request"),
]
MALFORMED_RESULTS = [
    [1, 2],
    {"allocations": "a1"},
    {"allocations": [{"node_id": "a1"}]},
    {"allocations": [{"cluster_id": "elsewhere"}]},
    {"allocations": [{"cluster_id": "box-cluster", "node_id": "z9"}]},
    {"allocations": [{"cluster_id": "box-cluster", "node_id": "a1", "gpus": ["7"]}]},
    {"allocations": [{"cluster_id": "box-cluster", "node_id": "a1", "gpus": [0, "0"]}]},
    {"allocations": [{"cluster_id": "box-cluster", "gpus": ["0"]}]},
]


def test_every_bad_payload_gets_an_error_and_the_connection_stays_up(url):
    messages, expected = [], []
    for message, code in BAD:
        messages += [message, SEED_PAYLOAD]
        expected += [code, None]
    for result in MALFORMED_RESULTS:
        messages += [request(policy_rule_uri="malformed", parameters={"answer": result}),
                     SEED_PAYLOAD]
        expected += ["bad_policy_result", None]
    answers = ask(url, *messages)   # all on one connection
    for message, want, answer in zip(messages, expected, answers):
        if want is None:
            assert answer["ok"], (message, answer)
        else:
            assert not answer["ok"] and answer["error"]["code"] == want, (message, answer)
            assert answer["error"]["message"]
    assert len(answers) == len(messages)
    by_code = {a["error"]["code"]: a["error"] for a in answers if not a["ok"]}
    assert "division by budget" in by_code["policy_error"]["message"]
    assert "unknown field(s) 'priority'" in answers[16]["error"]["message"]
    assert "beside a filter" in answers[40]["error"]["message"]
    assert "nested too deeply" in answers[42]["error"]["message"]
    assert ask(url, SEED_PAYLOAD)[0]["ok"]     # and the server takes new connections


def test_concurrent_clients_all_get_their_own_answers(url):
    # 5 clients, each releasing its lease before asking again: never more than 5 of the
    # 6 nodes held, so every request is placed, and no node is held twice at once
    held = {}
    clashes = []

    async def client(n):
        async with websockets.connect(url, open_timeout=30) as ws:
            out = []
            for i in range(8):
                rid = "c%d-%d" % (n, i)
                await ws.send(json.dumps(request(inputs={"gpus": 1 + (n + i) % 4},
                                                 request_id=rid)))
                answer = json.loads(await asyncio.wait_for(ws.recv(), 60))
                out.append((rid, answer))
                alloc = answer["allocations"][0]
                if held.get(alloc.get("node_id")) is not None:
                    clashes.append((rid, alloc["node_id"], held[alloc["node_id"]]))
                held[alloc.get("node_id")] = rid
                await asyncio.sleep(0.01)
                held[alloc.get("node_id")] = None
                await ws.send(json.dumps({"op": "release", "lease_ids": [alloc["lease_id"]]}))
                released = json.loads(await asyncio.wait_for(ws.recv(), 60))
                assert released == {"ok": True, "released": [alloc["lease_id"]], "unknown": []}
            return out

    async def main():
        return await asyncio.gather(*(client(n) for n in range(5)))

    results = [pair for batch in asyncio.run(main()) for pair in batch]
    assert len(results) == 40 and not clashes
    for rid, answer in results:
        assert answer["ok"] and answer["request_id"] == rid, answer
        assert len(answer["allocations"][0]["gpus"]) >= 1


def test_a_slow_policy_does_not_hold_up_other_connections(url, tmp_path):
    release = str(tmp_path / "release")

    async def main():
        async with websockets.connect(url, open_timeout=30) as slow, \
                websockets.connect(url, open_timeout=30) as fast:
            await slow.send(json.dumps(request(policy_rule_uri="waits",
                                               settings={"release": release})))
            pending = asyncio.ensure_future(slow.recv())
            await fast.send(json.dumps(SEED_PAYLOAD))
            quick = json.loads(await asyncio.wait_for(fast.recv(), 60))
            still_waiting = not pending.done()
            open(release, "w").close()
            late = json.loads(await asyncio.wait_for(pending, 60))
            return quick, still_waiting, late

    quick, still_waiting, late = asyncio.run(main())
    assert quick["ok"] and still_waiting
    assert late["ok"] and late["allocations"] == [{"cluster_id": "box-cluster"}]


def test_an_evaluation_past_its_timeout_gets_a_timeout_error_in_time(cluster, tmp_path):
    release = str(tmp_path / "release")
    with running(cluster, eval_timeout=1.0) as url:
        try:
            started = time.monotonic()
            answers = ask(url, request(policy_rule_uri="waits", settings={"release": release}),
                          SEED_PAYLOAD)
            elapsed = time.monotonic() - started
        finally:
            open(release, "w").close()   # let the abandoned worker finish
    assert answers[0]["error"]["code"] == "timeout" and answers[1]["ok"]
    assert elapsed < 1.0 + 20.0    # the timeout plus a generous margin for a loaded machine


def test_context_persists_across_runs_of_a_rule(url):
    answers = ask(url, request(policy_rule_uri="counts"), request(policy_rule_uri="counts"))
    assert [a["allocations"][0]["runs"] for a in answers] == [1, 2]
    assert answers[0]["allocations"][0]["rule"] == "counts"


def test_policies_get_the_cluster_and_metrics_clients_in_settings(url):
    [answer] = ask(url, request(policy_rule_uri="clients", settings={"site": "kth"}))
    [alloc] = answer["allocations"]
    assert alloc.pop("lease_id") and alloc.pop("lease_expires_in_s") == 120
    assert alloc == {"cluster_id": "box-cluster", "node_id": "a1", "gpus": ["3"],
                     "found": ["box-cluster"], "site": "kth", "ok": True}


def test_a_filter_picks_clusters_by_metadata(tmp_path):
    one = make_cluster(str(tmp_path / "one"))
    two = make_cluster(str(tmp_path / "two"))
    cfg = config([ClusterSource(one, id="east", labels={"site": "east", "gpus": "h100"}),
                  ClusterSource(two, id="west", labels={"site": "west", "gpus": "a100"})])
    with running(cfg) as url:
        answers = ask(url, request(filter={"labels.site": "west"}, inputs={"gpus": 4}),
                      request(filter={"$or": [{"labels.gpus": "h100"}, {"node_count": {"$gt": 99}}]}),
                      request(clusters=["west", "east"], policy_rule_uri="first-fit"),
                      SEED_PAYLOAD)
    assert answers[0]["clusters"] == ["west"] and answers[0]["allocations"][0]["cluster_id"] == "west"
    assert answers[1]["clusters"] == ["east"]
    assert answers[2]["allocations"][0]["cluster_id"] == "west"   # the order named
    assert answers[3]["clusters"] == ["east", "west"]


def test_an_uninitialised_state_dir_fails_at_start_naming_it(tmp_path):
    from pbs_power.allocator.config import AllocatorConfigError
    from pbs_power.allocator.service import AllocatorService
    with pytest.raises(AllocatorConfigError, match="no topology in .*empty"):
        AllocatorService(config([ClusterSource(str(tmp_path / "empty"))]))
    assert not os.path.exists(tmp_path / "empty")
