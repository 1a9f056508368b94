"""Load on the resource allocator server: N concurrent clients x M requests each.

Builds a --nodes-node topology (8 GPUs a node, 32 nodes a rack, 8 racks a
row) on SIMULATED devices, puts --asleep-percent of the nodes to sleep in the
simulated power fleet, gives --busy-percent to resource groups (running
jobs), starts ``pbs-power allocator serve`` in its own process on a free
local port and runs one of two modes. Live cluster state is reused for
--refresh seconds (the server's default, 5). Prints JSON.

``--mode load`` (default): --clients WebSocket clients each send --requests
requests in turn (one ask of 1-8 GPUs at a random policy, ``power-aware`` by
default), releasing each answer's lease; requests/s and latency
percentiles (ms, as the client sees it).

``--mode per-job``: what a scheduler does, one job at a time: --jobs jobs,
each on a new connection, one ask each; with --start-groups (default) each
job's node then goes into an active resource group, as the job's hooks do.
Counts any node or GPU handed out twice (no job ends here, so every repeat
is a duplicate) and the latency percentiles, connection set-up included.

    python benchmarks/allocator_load.py [--nodes 1024] [--clients 16] [--requests 50]
    python benchmarks/allocator_load.py --mode per-job [--jobs 500] [--no-start-groups]
"""
import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import websockets  # noqa: E402

from pbs_power.devices.simulated import SimulatedBackend  # noqa: E402
from pbs_power.states.model import TransitionKind  # noqa: E402
from pbs_power.groups.service import ResourceGroupService  # noqa: E402
from pbs_power.groups.topology import parse_topology  # noqa: E402

POLICIES = (("Node-High", 10200), ("Node-Med", 8000), ("Node-Low", 6000))


def topology(nodes: int) -> dict:
    racks = (nodes + 31) // 32
    rows = (racks + 7) // 8
    return {
        "name": "bench",
        "device_specs": {"hgx": {
            "node": {"min_watts": 3000, "idle_watts": 3500, "max_watts": 10200},
            "gpu": {"count": 8, "min_watts": 200, "max_watts": 700, "default_watts": 700}}},
        "power_domains": [{"name": "feed", "budget_watts": 8500.0 * nodes, "children": [
            {"name": "row-%02d" % w, "budget_watts": 8 * 32 * 8600.0, "children": [
                {"name": "rack-%03d" % r, "budget_watts": 32 * 8700.0}
                for r in range(w * 8, min(racks, w * 8 + 8))]} for w in range(rows)]}],
        "policies": [{"name": n, "limits": [{"element_type": "NODE", "power_limit": {"watts": w}}]}
                     for n, w in POLICIES],
        "default_policy": "Node-Med",
        "entities": [{"names": "g%05d" % i, "device": "hgx", "domain": "rack-%03d" % (i // 32)}
                     for i in range(nodes)],
    }


def prepare(root: str, args: argparse.Namespace) -> str:
    """State, hook config, telemetry and allocator config under ``root``; the config path."""
    rng = random.Random(args.seed)
    state, hook = os.path.join(root, "state"), os.path.join(root, "hook")
    svc = ResourceGroupService(state, {"simulated": {"latency_ms": 0}, "max_workers": 64})
    svc.import_topology(parse_topology(topology(args.nodes)))
    svc.set_topology_active(True)
    names = ["g%05d" % i for i in range(args.nodes)]
    busy = rng.sample(names, args.nodes * args.busy_percent // 100)
    for i in range(0, len(busy), 4):
        svc.create("rg_%d" % i, i, rng.choice(POLICIES)[0])
        svc.add_resources("rg_%d" % i, busy[i:i + 4])
        svc.activate("rg_%d" % i)
    svc.close()
    asleep = rng.sample(names, args.nodes * args.asleep_percent // 100)
    with SimulatedBackend({}, hook) as backend:
        backend.request(TransitionKind.SLEEP, asleep, time.time() - 600)
    hook_config = os.path.join(root, "hook.json")
    with open(hook_config, "w") as f:
        json.dump({"state_dir": hook, "power_backend": {"type": "simulated"}}, f)
    config = os.path.join(root, "allocator.json")
    with open(config, "w") as f:
        json.dump({"clusters": [{"id": "bench", "state_dir": state, "hook_config": hook_config}],
                   "refresh_seconds": args.refresh, "max_workers": args.workers,
                   "eval_timeout_seconds": 120}, f)
    return config


def start_server(config: str) -> "tuple[subprocess.Popen, str]":
    argv = [sys.executable, "-m", "pbs_power.cli.main", "allocator", "serve", "--port", "0",
            "--config", config, "--log-level", "error"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise SystemExit("server did not start: %r" % line)
    return proc, line.split()[4]


async def client(url: str, n: int, args: argparse.Namespace, latencies: list, errors: list):
    rng = random.Random(args.seed * 1000 + n)
    async with websockets.connect(url, open_timeout=60, max_size=None) as ws:
        for i in range(args.requests):
            asks = [{"id": "c%d-%d-%d" % (n, i, k), "gpus": rng.randint(1, 8),
                     "power_policy": rng.choice(POLICIES)[0]} for k in range(args.asks)]
            message = json.dumps({"adhoc": True, "policy_rule_uri": args.policy,
                                  "inputs": {"requests": asks}})
            started = time.perf_counter()
            await ws.send(message)
            answer = json.loads(await ws.recv())
            latencies.append((time.perf_counter() - started) * 1000.0)
            if not answer.get("ok") or any("error" in a for a in answer["allocations"]):
                errors.append(answer)
                continue
            leases = [a["lease_id"] for a in answer["allocations"] if "lease_id" in a]
            await ws.send(json.dumps({"op": "release", "lease_ids": leases}))
            await ws.recv()


async def load(url: str, args: argparse.Namespace) -> dict:
    latencies: list = []
    errors: list = []
    # warm up at full concurrency: the server starts its policy workers as runs overlap
    warm = argparse.Namespace(**dict(vars(args), requests=2))
    await asyncio.gather(*(client(url, -1 - n, warm, [], []) for n in range(args.clients)))
    started = time.perf_counter()
    await asyncio.gather(*(client(url, n, args, latencies, errors) for n in range(args.clients)))
    seconds = time.perf_counter() - started
    ordered = sorted(latencies)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p / 100.0 * len(ordered)))], 2)

    return {"nodes": args.nodes, "gpus": args.nodes * 8, "policy": args.policy,
            "clients": args.clients, "requests_per_client": args.requests,
            "asks_per_request": args.asks, "requests": len(latencies), "errors": len(errors),
            "seconds": round(seconds, 3), "requests_per_s": round(len(latencies) / seconds, 1),
            "latency_ms": {"p50": pct(50), "p99": pct(99), "max": round(ordered[-1], 2),
                           "mean": round(statistics.mean(ordered), 2)},
            "server": {"workers": args.workers, "refresh_seconds": args.refresh,
                       "asleep_percent": args.asleep_percent, "busy_percent": args.busy_percent},
            "first_error": errors[0] if errors else None}


def start_group(state: str, i: int, node: str, policy: str) -> None:
    """What a job's hooks do when it starts: its node in an active resource group."""
    svc = ResourceGroupService(state, {"simulated": {"latency_ms": 0}})
    try:
        svc.create("job_%d" % i, 100000 + i, policy)
        svc.add_resources("job_%d" % i, [node])
        svc.activate("job_%d" % i)
    finally:
        svc.close()


async def per_job(url: str, args: argparse.Namespace, state: str) -> dict:
    """--jobs one-job requests in sequence, a connection each; duplicates and latency."""
    rng = random.Random(args.seed)
    latencies: list = []
    errors: list = []
    nodes: dict = {}
    gpus: set = set()
    duplicate_nodes = duplicate_gpus = 0
    for i in range(args.jobs):
        policy = rng.choice(POLICIES)[0]
        message = json.dumps({"adhoc": True, "policy_rule_uri": args.policy,
                              "inputs": {"id": "job-%d" % i, "gpus": rng.randint(1, 8),
                                         "power_policy": policy}})
        started = time.perf_counter()
        async with websockets.connect(url, open_timeout=60, max_size=None) as ws:
            await ws.send(message)
            answer = json.loads(await ws.recv())
        latencies.append((time.perf_counter() - started) * 1000.0)
        alloc = (answer.get("allocations") or [{}])[0]
        if not answer.get("ok") or "node_id" not in alloc:
            errors.append(answer)
            continue
        node = alloc["node_id"]
        if node in nodes:
            duplicate_nodes += 1
        nodes[node] = i
        for gpu in alloc.get("gpus", []):
            duplicate_gpus += (node, gpu) in gpus
            gpus.add((node, gpu))
        if args.start_groups:
            start_group(state, i, node, policy)
    ordered = sorted(latencies)

    def pct(p: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(p / 100.0 * len(ordered)))], 2)
    return {"mode": "per-job", "nodes": args.nodes, "policy": args.policy, "jobs": args.jobs,
            "groups_started": args.start_groups, "placed": len(nodes) + duplicate_nodes,
            "distinct_nodes": len(nodes), "duplicate_nodes": duplicate_nodes,
            "duplicate_gpus": duplicate_gpus, "errors": len(errors),
            "latency_ms": {"p50": pct(50), "p99": pct(99), "max": round(ordered[-1], 2),
                           "mean": round(statistics.mean(ordered), 2)},
            "server": {"refresh_seconds": args.refresh, "asleep_percent": args.asleep_percent,
                       "busy_percent": args.busy_percent},
            "first_error": errors[0] if errors else None}


def main() -> None:
    ap = argparse.ArgumentParser(description="Load the allocator server; print JSON.")
    ap.add_argument("--mode", choices=("load", "per-job"), default="load")
    ap.add_argument("--jobs", type=int, default=500, help="per-job mode: jobs in sequence")
    ap.add_argument("--no-start-groups", dest="start_groups", action="store_false",
                    help="per-job mode: leave each job's node out of resource groups")
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=50, help="requests per client")
    ap.add_argument("--asks", type=int, default=1, help="allocation requests per message")
    ap.add_argument("--policy", default="power-aware")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--refresh", type=float, default=5.0)
    ap.add_argument("--asleep-percent", type=int, default=25)
    ap.add_argument("--busy-percent", type=int, default=25)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as root:
        config = prepare(root, args)
        proc, url = start_server(config)
        try:
            if args.mode == "per-job":
                result = asyncio.run(per_job(url, args, os.path.join(root, "state")))
            else:
                result = asyncio.run(load(url, args))
        finally:
            proc.terminate()
            proc.wait(30)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
