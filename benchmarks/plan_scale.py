"""How long one planning pass takes on a large cluster with a deep queue.

Builds a snapshot of --hosts hosts (a mix of busy, idle and sleeping) and
--jobs queued jobs, each with an estimated start spread over --spread-hours
and 1-64 estimated exec vnodes, then times `pbs_power.states.planner.plan` over
--runs runs and prints JSON. ``--spread-hours 0`` puts every job's start
inside the planning horizon, the worst case: every exec vnode is examined.

    python benchmarks/plan_scale.py [--hosts 10000] [--jobs 100000] [--runs 7]
"""
import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pbs_power.config.hook_config import HookConfig  # noqa: E402
from pbs_power.states.model import QueuedJob, Snapshot, Vnode  # noqa: E402
from pbs_power.states.planner import plan  # noqa: E402


def build_snapshot(hosts: int, jobs: int, spread_hours: float, now: float,
                   rng: random.Random) -> Snapshot:
    """A cluster that is ~60% busy, ~25% idle, ~15% asleep, and its queue."""
    vnodes = []
    for i in range(hosts):
        name = "n%05d" % i
        roll = rng.random()
        if roll < 0.60:
            states, jobs_on, used = frozenset({"job-busy"}), ("%d.svr" % i,), now
        elif roll < 0.85:
            states, jobs_on, used = frozenset({"free"}), (), now - rng.uniform(0, 7200)
        else:
            states, jobs_on, used = frozenset({"sleep"}), (), now - rng.uniform(3600, 86400)
        vnodes.append(Vnode(name, name, states, True, used, used, jobs_on))
    names = [v.name for v in vnodes]
    queued = []
    for j in range(jobs):
        start = now + (rng.uniform(0, spread_hours * 3600) if spread_hours else rng.uniform(0, 600))
        queued.append(QueuedJob("%d.svr" % (100000 + j), start,
                                tuple(rng.sample(names, rng.randint(1, 64)))))
    return Snapshot(tuple(vnodes), queued_jobs=tuple(queued))


def main() -> None:
    ap = argparse.ArgumentParser(description="Time one planning pass on a large snapshot.")
    ap.add_argument("--hosts", type=int, default=10000)
    ap.add_argument("--jobs", type=int, default=100000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--spread-hours", type=float, default=168.0,
                    help="estimated starts spread over this many hours (0: all imminent)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    now = 1_800_000_000.0
    snap = build_snapshot(args.hosts, args.jobs, args.spread_hours, now,
                          random.Random(args.seed))
    config = HookConfig(power_on_off_enable=True, max_concurrent_nodes=50, min_idle_nodes=20)
    times = []
    result = None
    for _ in range(args.runs):
        t0 = time.perf_counter()
        result = plan(snap, config, now)
        times.append(time.perf_counter() - t0)
    print(json.dumps({
        "hosts": args.hosts,
        "queued_jobs": args.jobs,
        "exec_vnodes_total": sum(len(j.vnodes) for j in snap.queued_jobs),
        "spread_hours": args.spread_hours,
        "plan_seconds_median": round(statistics.median(times), 4),
        "plan_seconds_min": round(min(times), 4),
        "plan_seconds_max": round(max(times), 4),
        "runs": args.runs,
        "actions": len(result.actions),
        "deferred": len(result.deferred),
        "python": platform.python_version(),
    }))


if __name__ == "__main__":
    main()
