"""How long activating a resource group over thousands of devices takes.

Builds a topology of --nodes nodes (64 per rack) on SIMULATED devices with
--latency-ms +- --jitter-ms per request, creates a group, adds every node
and activates it synchronously; then times the per-job cost a prolog and
epilog pay: create + add + activate + delete of a 1-node group (median of
--lifecycles runs). Prints JSON.

    python benchmarks/activation_fanout.py [--nodes 4096] [--latency-ms 50] [--max-workers 512]
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pbs_power.groups.service import ResourceGroupService  # noqa: E402
from pbs_power.groups.topology import parse_topology  # noqa: E402


def topology(nodes: int) -> dict:
    racks = (nodes + 63) // 64
    return {
        "name": "bench",
        "device_specs": {"box": {"node": {"min_watts": 300, "idle_watts": 400,
                                          "max_watts": 1200}}},
        "power_domains": [{"name": "room", "budget_watts": 1300.0 * nodes, "children": [
            {"name": "rack-%03d" % r, "budget_watts": 64 * 1300.0} for r in range(racks)]}],
        "policies": [{"name": "High", "limits": [{"element_type": "NODE",
                                                  "power_limit": {"watts": 1200}}]},
                     {"name": "Low", "limits": [{"element_type": "NODE",
                                                 "power_limit": {"watts": 600}}]}],
        "default_policy": "Low",
        "entities": [{"names": "n%05d" % i, "device": "box", "domain": "rack-%03d" % (i // 64)}
                     for i in range(nodes)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description="Time resource-group activation fan-out.")
    ap.add_argument("--nodes", type=int, default=4096)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--jitter-ms", type=float, default=10.0)
    ap.add_argument("--max-workers", type=int, default=512)
    ap.add_argument("--lifecycles", type=int, default=21)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as state_dir:
        quick = ResourceGroupService(state_dir, {"simulated": {"latency_ms": 0},
                                                 "max_workers": args.max_workers})
        quick.import_topology(parse_topology(topology(args.nodes)))
        quick.set_topology_active(True)
        quick.close()
        svc = ResourceGroupService(state_dir, {
            "simulated": {"latency_ms": args.latency_ms, "jitter_ms": args.jitter_ms},
            "max_workers": args.max_workers})
        names = ["n%05d" % i for i in range(args.nodes)]
        svc.topology()                                   # parse once, as a warm service does
        t0 = time.perf_counter()
        svc.create("rg_big", 1, "High")
        svc.add_resources("rg_big", names)
        t1 = time.perf_counter()
        answer = svc.activate("rg_big")
        t2 = time.perf_counter()
        ok_hosts = sum(1 for o in answer.node_statuses.values() if o.ok)
        svc.delete("rg_big")
        lifecycle = []
        for i in range(args.lifecycles):
            s = time.perf_counter()
            svc.create("rg_%d" % i, i, "High")
            svc.add_resources("rg_%d" % i, [names[i % len(names)]])
            svc.activate("rg_%d" % i)
            svc.delete("rg_%d" % i)
            lifecycle.append(time.perf_counter() - s)
        svc.close()

    sequential = args.nodes * args.latency_ms / 1000.0
    print(json.dumps({
        "nodes": args.nodes, "device_latency_ms": args.latency_ms,
        "device_jitter_ms": args.jitter_ms, "max_workers": args.max_workers,
        "activate_ok": answer.status.ok, "hosts_ok": ok_hosts,
        "create_add_seconds": round(t1 - t0, 3),
        "activate_seconds": round(t2 - t1, 3),
        "sequential_seconds_estimate": round(sequential, 1),
        "speedup": round(sequential / (t2 - t1), 1),
        "one_node_lifecycle_seconds_median": round(statistics.median(lifecycle), 4),
        "one_node_lifecycle_runs": args.lifecycles,
        "one_node_lifecycle_note": "create+add+activate+delete in one warm process, device "
                                   "latency included (activate and delete each wait one "
                                   "device round trip)",
    }))


if __name__ == "__main__":
    main()
