"""How long one Prometheus scrape of ``pbs-power exporter`` takes on a large store.

Fills a state directory as a big cluster's hooks would leave it: --hosts
hosts (a cycle row, a third of them off or asleep, some in flight, some
failed, a few events each) and --groups active resource groups of
hosts/groups members each over a topology of those hosts (64 per rack, one
power domain per rack under a room), then scrapes /metrics over HTTP: the
first scrape (which parses the stored topology) and the median and p90 of
--scrapes more. Prints JSON; the target is under 50 ms.

    python benchmarks/exporter_scrape.py [--hosts 10000] [--groups 1000] [--scrapes 30]
"""
import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pbs_power.groups.store import GroupRow, GroupStore, MemberRow  # noqa: E402
from pbs_power.groups.topology import parse_topology  # noqa: E402
from pbs_power.metrics.exporter import address, make_exporter, serve_in_thread  # noqa: E402
from pbs_power.states import journal  # noqa: E402
from pbs_power.states.model import Phase, Transition, TransitionKind  # noqa: E402
from pbs_power.states.store import Store  # noqa: E402
from activation_fanout import topology  # noqa: E402  (the same synthetic cluster)

NOW = time.time()


def fill_states(state_dir: str, hosts: int) -> None:
    names = ["n%05d" % i for i in range(hosts)]
    with Store.open(state_dir) as store:
        with store.transaction():
            for i, host in enumerate(names):
                kind = TransitionKind.POWER_OFF if i % 2 else TransitionKind.SLEEP
                t = Transition(host, kind, Phase.POWERING_DOWN, NOW - 7200, NOW - 7100, "idle")
                if i % 3 == 0:                                   # a third saving power now
                    journal.started(store, t)
                    journal.completed(store, t, 60.0, NOW - 7000, 240.0)
                elif i % 50 == 1:                                # some in flight
                    store.put_transition(t)
                elif i % 500 == 2:                               # a few failed
                    store.mark_failed(host, "did not power on within boot_timeout", NOW - 600)
        states, eligible = journal.census(
            {h: True for h in names}, store.transitions(), store.failed(),
            journal.saving_now(store), store.down_since())
        for c in range(journal.CYCLES_KEPT):
            journal.record_cycle(store, journal.CycleRecord(
                NOW - 60.0 * (journal.CYCLES_KEPT - c), 0.8, "ran", states, eligible,
                {"max_concurrent_nodes": 40}))


def fill_groups(state_dir: str, hosts: int, groups: int) -> None:
    topo = parse_topology(topology(hosts))
    store = GroupStore(state_dir)
    per = max(1, hosts // groups)
    with store.transaction():
        store.put_topology(topo.to_dict(), True, NOW - 86400)
        for g in range(groups):
            name = "rg_%d" % g
            store.insert_group(GroupRow(name, g, "High", (), None, True, {}, "active",
                                        NOW - 3600, NOW - 3590, None))
            members = ["n%05d" % i for i in range(g * per, min(hosts, (g + 1) * per))]
            store.add_members(name, members, None)
            rows = store.members(name)
            store.put_members([MemberRow(m.entity, m.group_name, m.policy, "High", 1200.0,
                                         "active") for m in rows])
    store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, default=10000)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--scrapes", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as state_dir:
        t = time.perf_counter()
        fill_states(state_dir, args.hosts)
        fill_groups(state_dir, args.hosts, args.groups)
        filled = time.perf_counter() - t
        server = make_exporter(state_dir, "127.0.0.1:0")
        serve_in_thread(server)
        url = address(server)
        times, size = [], 0
        try:
            for _ in range(args.scrapes + 1):
                t = time.perf_counter()
                with urllib.request.urlopen(url, timeout=30) as answer:
                    size = len(answer.read())
                times.append(time.perf_counter() - t)
        finally:
            server.shutdown()
            server.server_close()
    steady = sorted(times[1:])
    print(json.dumps({
        "hosts": args.hosts, "groups": args.groups, "scrapes": args.scrapes,
        "fill_seconds": round(filled, 2), "response_bytes": size,
        "first_scrape_ms": round(times[0] * 1000, 1),
        "scrape_median_ms": round(statistics.median(steady) * 1000, 1),
        "scrape_p90_ms": round(steady[int(0.9 * (len(steady) - 1))] * 1000, 1),
        "target_ms": 50,
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
