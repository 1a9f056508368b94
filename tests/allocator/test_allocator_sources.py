"""Where the allocator's data comes from: HTTP registry and metrics services, and the CLI."""
import asyncio
import json
import os
import subprocess
import sys
import time

import pytest
import websockets

from allocator_helpers import (SEED_PAYLOAD, ask, config, http_service, make_cluster, request,
                               running)
from pbs_power.allocator.config import ClusterSource

REMOTE = {
    "cluster_id": "remote-1", "labels": {"room": "b12"}, "policies": ["High"],
    "power_domains": {"room": {"budget_watts": 5000}},
    "device_specs": {"x": {"policy_watts": {"High": 2000}}},
    "nodes": {"r1": {"device_spec": "x", "gpu_count": 2, "domains": ["room"],
                     "topology_watts": 1000},
              "r2": {"device_spec": "x", "gpu_count": 2, "domains": ["room"],
                     "topology_watts": 1000}}}
REMOTE_METRICS = {
    "nodes": {"r1": {"power_state": "asleep", "allocated_watts": 1000},
              "r2": {"power_state": "on", "allocated_watts": 1000,
                     "gpus": {"0": {"power_watts": 90}, "1": {"power_watts": 20}}}},
    "domains": {"room": {"allocated_watts": 2000}}}
# what the racks draw, as the metrics service reports it: rack-b is nearly full
LOCAL_DRAW = {"domains": {"rack-a": {"drawn_watts": 1000}, "rack-b": {"drawn_watts": 9900}}}


@pytest.fixture
def state(tmp_path):
    return make_cluster(str(tmp_path / "state"))


def test_registry_and_metrics_services_supply_remote_clusters(state):
    registry_routes = {("GET", "/clusters/remote-1"): (200, REMOTE),
                       ("POST", "/clusters/query"): (200, [{"cluster_id": "remote-1"}])}
    metrics_routes = {("GET", "/cluster/remote-1"): (200, {"success": True, "data": REMOTE_METRICS}),
                      ("GET", "/cluster/box-cluster"): (200, {"success": True, "data": LOCAL_DRAW})}
    with http_service(registry_routes) as (reg_url, reg_seen), \
            http_service(metrics_routes) as (met_url, _):
        cfg = config([ClusterSource(state, labels={"room": "b12"})],
                     cluster_registry_url=reg_url, metrics_url=met_url)
        with running(cfg) as url:
            remote, filtered, local, missing = ask(
                url, request(clusters=["remote-1"], inputs={"gpus": 1, "power_policy": "High"}),
                request(filter={"labels.room": "b12"}),
                request(clusters=["box-cluster"], inputs={"gpus": 2}),
                request(clusters=["remote-2"]))
    [alloc] = remote["allocations"]
    assert (alloc["cluster_id"], alloc["node_id"], alloc["gpus"]) == ("remote-1", "r2", ["0"])
    assert alloc["headroom_watts"] == 5000 - 2000 - 1000 and alloc["lease_id"]
    assert filtered["clusters"] == ["box-cluster", "remote-1"]
    assert ("POST", "/clusters/query", {"query": {"labels.room": "b12"}}) in reg_seen
    # r2 is leased; asleep r1 beats the local nodes, whose state is unknown (no hook config)
    assert filtered["allocations"][0]["node_id"] == "r1"
    # the metrics service's drawn watts: rack-a has 1000 W left, rack-b 100 W
    [near] = local["allocations"]
    assert (near["node_id"], near["gpus"], near["headroom_watts"]) == ("a1", ["0", "1"], 1000)
    assert near["headroom_source"] == "drawn watts (metrics service)"
    assert "no hook config: power states unknown" in " ".join(local["notes"])
    assert missing["error"]["code"] == "unknown_cluster" and "HTTP error" in missing["error"]["message"]


def test_a_failing_metrics_service_leaves_a_note_not_an_error(state):
    routes = {("GET", "/cluster/box-cluster"): (500, {"success": False, "error": "db down"})}
    with http_service(routes) as (met_url, seen):
        with running(config([ClusterSource(state)], metrics_url=met_url)) as url:
            [answer] = ask(url, SEED_PAYLOAD)
    assert answer["ok"] and answer["allocations"][0]["cluster_id"] == "box-cluster"
    assert any("metrics service" in n and "500" in n for n in answer["notes"]), answer
    assert seen and seen[0][:2] == ("GET", "/cluster/box-cluster")


def test_a_slow_metrics_service_delays_no_request(state):
    routes = {("GET", "/cluster/box-cluster"): (200, {"success": True, "data": LOCAL_DRAW})}
    with http_service(routes, delay=3.0) as (met_url, seen):
        with running(config([ClusterSource(state)], metrics_url=met_url)) as url:
            async def main():
                out = []
                async with websockets.connect(url) as ws:
                    for pause in (0, 0, 0, 3.5):
                        await asyncio.sleep(pause)
                        started = time.monotonic()
                        await ws.send(json.dumps(request(inputs={"gpus": 1})))
                        answer = json.loads(await ws.recv())
                        out.append((answer, time.monotonic() - started))
                return out
            answers = asyncio.run(main())
    for answer, seconds in answers[:3]:
        assert seconds < 2.0 and answer["ok"], (seconds, answer)
        assert any("no answer within 0.5 s yet" in n for n in answer["notes"]), answer
        assert answer["allocations"][0]["headroom_source"] == "allocated caps"
    last, seconds = answers[3]
    # the first fetch has answered meanwhile: its drawn watts are used, though a newer
    # fetch is still running
    assert seconds < 2.0 and last["allocations"][0]["headroom_source"] == \
        "drawn watts (metrics service)"
    assert any("metrics service slow" in n for n in last["notes"]), last
    assert len(seen) == 2


def test_unreachable_registry_is_reported_per_request(state):
    with http_service({}) as (dead_url, _):
        pass                                   # closed: connections are refused
    with running(config([ClusterSource(state)], cluster_registry_url=dead_url,
                        http_timeout_seconds=5)) as url:
        missing, fine = ask(url, request(clusters=["elsewhere"]), SEED_PAYLOAD)
    assert missing["error"]["code"] == "unknown_cluster" and "Error occurred" in \
        missing["error"]["message"]
    assert fine["ok"]


@pytest.fixture
def cli_server(state, tmp_path):
    """``pbs-power allocator serve`` as a subprocess on a free port; killed by PID after."""
    argv = [sys.executable, "-m", "pbs_power.cli.main", "allocator", "serve", "--port", "0",
            "--state-dir", state, "--refresh", "0", "--log-level", "warning"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "listening on ws://127.0.0.1:" in line, (line, proc.stderr.read())
        yield line.split()[4]
    finally:
        proc.kill()
        proc.wait(30)
        proc.stdout.close()
        proc.stderr.close()


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "pbs_power.cli.main", "allocator"] + list(args),
                          capture_output=True, text=True, timeout=120)


def test_cli_request_prints_the_answer(cli_server, tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(dict(SEED_PAYLOAD, inputs={"gpus": 4})))
    done = run_cli("request", str(good), "--url", cli_server)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["ok"] and len(answer["allocations"][0]["gpus"]) == 4
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(dict(SEED_PAYLOAD, policy_rule_uri="../x")))
    done = run_cli("request", str(bad), "--url", cli_server)
    assert done.returncode == 1 and "invalid_request" in done.stderr
    assert json.loads(done.stdout)["error"]["code"] == "invalid_request"


def test_cli_reports_bad_files_and_unreachable_servers(tmp_path, state):
    text = tmp_path / "t.json"
    text.write_text("{oops")
    done = run_cli("request", str(text))
    assert done.returncode == 2 and "not valid JSON" in done.stderr
    text.write_text(json.dumps(SEED_PAYLOAD))
    with http_service({}) as (dead, _):
        port = dead.rsplit(":", 1)[1]
    done = run_cli("request", str(text), "--url", "ws://127.0.0.1:%s" % port, "--timeout", "10")
    assert done.returncode == 1 and "ws://127.0.0.1:%s" % port in done.stderr
    done = run_cli("serve", "--state-dir", str(tmp_path / "nothing"), "--port", "0")
    assert done.returncode == 2 and "no topology in" in done.stderr
    assert not os.path.exists(tmp_path / "nothing")
