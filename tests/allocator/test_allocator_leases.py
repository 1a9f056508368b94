"""Leases over a real WebSocket: what one answer hands out, the next request does not get."""
import asyncio
import json
import os
import time

import pytest
import websockets

from allocator_helpers import (TOPOLOGY, ask, config, hook_config, make_cluster, request,
                               running, serving, write_policy)
from pbs_power.allocator.config import ClusterSource
from pbs_power.allocator.server import AllocatorServer
from pbs_power.allocator.service import AllocatorService
from pbs_power.groups.service import ResourceGroupService

# 120 nodes of 4 GPUs in 4 racks with room for all of them at High
BIG = dict(TOPOLOGY, name="big", power_domains=[
    {"name": "feed", "budget_watts": 1e6, "children": [
        {"name": "rack-%d" % r, "budget_watts": 40000} for r in range(4)]}],
    entities=[{"names": "n[%03d-%03d]" % (r * 30, r * 30 + 29), "device": "box",
               "domain": "rack-%d" % r} for r in range(4)])
TOKEN = "s3cret-admin-token-0123456789"


@pytest.fixture
def big(tmp_path):
    state = make_cluster(str(tmp_path / "state"), BIG)
    hook = hook_config(str(tmp_path / "hook.json"), str(tmp_path / "hook"))
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    os.chmod(token, 0o600)
    return state, hook, str(token)


def one_job(i):
    return request(inputs={"id": "job-%d" % i, "gpus": 1 + i % 4,
                           "power_policy": "High" if i % 2 else "Low"}, request_id="r%d" % i)


def start_group(state, i, node):
    """What the job's hooks do once it starts: a resource group holding its node, active."""
    svc = ResourceGroupService(state, {"simulated": {"latency_ms": 0}})
    try:
        assert svc.create("rg_%d" % i, i, "Low").status.ok
        assert svc.add_resources("rg_%d" % i, [node]).status.ok
        assert svc.activate("rg_%d" % i).status.ok
    finally:
        svc.close()


async def stats(url):
    async with websockets.connect(url) as ws:
        await ws.send(json.dumps({"op": "stats", "token": TOKEN}))
        return json.loads(await ws.recv())


@pytest.mark.parametrize("groups,refresh", [(False, 5.0), (True, 5.0), (True, 0.0)])
def test_sequential_one_job_requests_never_share_a_node_or_gpu(big, groups, refresh):
    state, hook, token = big
    cfg = config([ClusterSource(state, hook_config=hook)], refresh_seconds=refresh,
                 admin_token_file=token)
    taken, nodes = set(), []
    with running(cfg) as url:
        for i in range(100):
            [answer] = ask(url, one_job(i))       # a connection per job, as a scheduler does
            [alloc] = answer["allocations"]
            assert answer["ok"] and alloc["node_id"] and alloc["lease_id"], answer
            pairs = {(alloc["node_id"], g) for g in alloc["gpus"]} | {(alloc["node_id"], "*")}
            assert not pairs & taken, (i, alloc)
            taken |= pairs
            nodes.append(alloc["node_id"])
            if groups:
                start_group(state, i, alloc["node_id"])
        after = asyncio.run(stats(url))
    assert len(set(nodes)) == 100
    if groups and refresh == 0:
        # each request read the cluster afresh, saw the last job's group and ended its lease
        assert after["lease_ends"]["taken_over"] == 99 and after["leases"] == 1
    else:
        assert after["leases"] == 100


def test_a_lease_ends_when_released_or_when_its_time_is_up(big):
    state, hook, _ = big
    cfg = config([ClusterSource(state, hook_config=hook)], lease_seconds=1.0)
    first = request(policy_rule_uri="first-fit", inputs={"gpus": 1})
    with running(cfg) as url:
        a, b = ask(url, first, first)
        assert (a["allocations"][0]["node_id"], b["allocations"][0]["node_id"]) == \
            ("n000", "n001")
        [released] = ask(url, {"op": "release", "lease_ids": [a["allocations"][0]["lease_id"],
                                                               "no-such-lease"]})
        assert released == {"ok": True, "released": [a["allocations"][0]["lease_id"]],
                            "unknown": ["no-such-lease"]}
        [c] = ask(url, first)
        assert c["allocations"][0]["node_id"] == "n000"      # released: offered again
        time.sleep(1.2)
        [d] = ask(url, first)
        assert d["allocations"][0]["node_id"] == "n000"      # every lease has run out


def test_a_lease_holds_the_watts_its_policy_needs(tmp_path):
    # one rack of 3 nodes at Low (500 W) under 2000 W: 500 W left, one High job fits
    doc = dict(TOPOLOGY, entities=[{"names": "a[1-3]", "device": "box", "domain": "rack-a"}])
    state = make_cluster(str(tmp_path / "s"), doc)
    hook = hook_config(str(tmp_path / "hook.json"), str(tmp_path / "hook"))
    with running(config([ClusterSource(state, hook_config=hook)])) as url:
        one, two = ask(url, request(inputs={"power_policy": "High"}),
                       request(inputs={"power_policy": "High"}))
    assert one["allocations"][0]["headroom_watts"] == 0
    # the first lease holds its 500 W: the second job would take rack-a over budget
    assert two["allocations"][0]["headroom_watts"] == -500
    assert "allocated caps + leases" in two["allocations"][0]["headroom_source"]


STUCK = """
import time
class Stuck:
    def __init__(self, rule_id, settings, parameters):
        self.settings = settings
    def eval(self, parameters, input_data, context):
        if self.settings.get("spin"):
            while True:
                pass
        time.sleep(3600)
"""


def test_stuck_policies_are_stopped_and_other_requests_still_answered(big, tmp_path):
    state, hook, token = big
    policies = str(tmp_path / "policies")
    write_policy(policies, "stuck", STUCK)
    cfg = config([ClusterSource(state, hook_config=hook)], policy_dir=policies,
                 admin_token_file=token, max_workers=2)
    server = AllocatorServer(AllocatorService(cfg), "127.0.0.1", 0, eval_timeout=3.0)

    async def main(url):
        async def one(message):
            async with websockets.connect(url) as ws:
                await ws.send(json.dumps(message))
                started = time.monotonic()
                return json.loads(await asyncio.wait_for(ws.recv(), 60)), \
                    time.monotonic() - started
        stuck = [request(policy_rule_uri="stuck", settings={"spin": i % 2 == 0})
                 for i in range(6)]
        fine = [request(policy_rule_uri="first-fit", inputs={"gpus": 2}) for _ in range(4)]
        answers = await asyncio.gather(*(one(m) for m in stuck + fine))
        return answers, await stats(url)

    with serving(server) as url:
        started = time.monotonic()
        answers, after = asyncio.run(main(url))
        elapsed = time.monotonic() - started
        [later] = ask(url, request(policy_rule_uri="first-fit"))
    for answer, _ in answers[:6]:
        message = answer["error"]["message"]
        assert answer["error"]["code"] == "timeout", answer
        assert "the policy was stopped" in message or "stayed busy" in message
    for answer, seconds in answers[6:]:
        assert answer["ok"] and answer["allocations"][0]["gpus"] == ["0", "1"], answer
    # one stuck run held a worker (the other stayed free for first-fit) and was killed
    assert after["workers_killed"] >= 1 and after["workers"] <= 2
    assert later["ok"] and later["allocations"][0]["node_id"]
    assert elapsed < 30


def test_a_disconnected_clients_run_is_cancelled(big, tmp_path):
    state, hook, token = big
    policies = str(tmp_path / "policies")
    write_policy(policies, "stuck", STUCK)
    cfg = config([ClusterSource(state, hook_config=hook)], policy_dir=policies,
                 admin_token_file=token, max_workers=1)
    with running(cfg, eval_timeout=600) as url:
        async def main():
            async with websockets.connect(url) as ws:
                await ws.send(json.dumps(request(policy_rule_uri="stuck")))
                await asyncio.sleep(0.5)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                now = await stats(url)
                if now["cancelled"]:
                    return now
                await asyncio.sleep(0.1)
            return now
        after = asyncio.run(main())
        [fine] = ask(url, request(policy_rule_uri="first-fit"))   # the one worker is free
    assert after["cancelled"] == 1 and after["workers_killed"] == 1
    assert fine["ok"] and fine["allocations"][0]["node_id"] == "n000"


def test_management_is_for_the_admin_socket_or_token(big, tmp_path):
    state, hook, token = big
    sock = str(tmp_path / "admin.sock")
    cfg = config([ClusterSource(state, hook_config=hook)], admin_token_file=token,
                 admin_socket=sock)
    message = {"op": "management", "policy_rule_uri": "first-fit",
               "action": "get_parameters", "data": {}}
    with running(cfg) as url:
        assert os.stat(sock).st_mode & 0o777 == 0o600

        async def over_socket():
            async with websockets.unix_connect(sock) as ws:
                await ws.send(json.dumps(message))
                return json.loads(await ws.recv())
        by_socket = asyncio.run(over_socket())
        refused, by_token, wrong = ask(url, message, dict(message, token=TOKEN),
                                       dict(message, token="guess"))
    want = {"status": "ok", "parameters": {"power_policy": None, "allow_busy_nodes": False}}
    assert by_socket["ok"] and by_socket["result"] == want
    assert by_token["ok"] and by_token["result"] == want
    assert refused["error"]["code"] == wrong["error"]["code"] == "forbidden"


def test_the_seeds_service_urls_come_from_the_environment():
    from pbs_power.allocator.config import (AllocatorConfig, AllocatorConfigError,
                                            from_environment)
    env = {"CLUSTER_SERVICE_URL": "http://127.0.0.1:3000",
           "GLOBAL_CLUSTER_METRICS_URL": "http://127.0.0.1:8888/"}
    got = from_environment(AllocatorConfig(), env)
    assert (got.cluster_registry_url, got.metrics_url) == ("http://127.0.0.1:3000",
                                                           "http://127.0.0.1:8888/")
    mine = from_environment(AllocatorConfig(metrics_url="http://127.0.0.1:9"), env)
    assert mine.metrics_url == "http://127.0.0.1:9"               # config and options win
    with pytest.raises(AllocatorConfigError, match="CLUSTER_SERVICE_URL"):
        from_environment(AllocatorConfig(), {"CLUSTER_SERVICE_URL": "ftp://x"})


def test_a_colliding_allocation_gets_its_first_free_alternative():
    from pbs_power.allocator.leases import LeaseBook
    data = {"c": {"data": {"nodes": {n: {"gpu_count": 2, "domains": []}
                                     for n in ("n1", "n2", "n3")}}, "cluster_metrics": {}}}
    book = LeaseBook(60)
    first = [{"cluster_id": "c", "node_id": "n1", "gpus": ["0"]}]
    assert book.reserve(first, data) == [] and first[0]["lease_id"]
    # n1's GPU 0 is leased: the first alternative, n2's GPU 0, is handed out instead;
    # the request's second allocation takes n2's other GPU
    later = [{"request_id": "j2", "cluster_id": "c", "node_id": "n1", "gpus": ["0"],
              "alternatives": [{"cluster_id": "c", "node_id": "n2", "gpus": ["0"]},
                               {"cluster_id": "c", "node_id": "n3", "gpus": ["0"]}]},
             {"cluster_id": "c", "node_id": "n2", "gpus": ["1"]}]
    assert book.reserve(later, data) == []
    assert [(a.get("request_id"), a["node_id"], a["gpus"]) for a in later] == [
        ("j2", "n2", ["0"]), (None, "n2", ["1"])]
    assert "alternatives" not in later[0] and all(a["lease_id"] for a in later)
    # a second request for n2's GPU 1 collides, its alternative too: refused
    again = [{"cluster_id": "c", "node_id": "n2", "gpus": ["1"],
              "alternatives": [{"cluster_id": "c", "node_id": "n1", "gpus": ["0"]}]}]
    assert book.reserve(again, data) == [0] and "lease_id" not in again[0]
    # GPU 1 of n1 is free: a GPU-level lease leaves the node's other GPUs
    other = [{"cluster_id": "c", "node_id": "n1", "gpus": ["1"]}]
    assert book.reserve(other, data) == [] and other[0]["node_id"] == "n1"
    # nothing free: refused, and with all_or_none nothing of the request is leased
    full = [{"cluster_id": "c", "node_id": "n3", "gpus": []},
            {"cluster_id": "c", "node_id": "n1", "gpus": []}]
    assert book.reserve(full, data) == [1] and "lease_id" not in full[0]
    assert len(book) == 4
