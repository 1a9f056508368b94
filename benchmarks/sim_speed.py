"""Simulator speed: replay the largest trace under all four power managers.

Prints one JSON object: the trace, jobs replayed, wall seconds in all, jobs
per second per manager (jobs x managers / seconds) and each manager's own
seconds. Run by hand: ``.venv/bin/python benchmarks/sim_speed.py [TRACE] [--limit N]
[--managers pbs-power,slurm] [--cycle S]``.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from pbs_power.sim.managers import MANAGERS as ALL_MANAGERS  # noqa: E402
from pbs_power.sim.nodes import NODE_MODELS  # noqa: E402
from pbs_power.sim.simulate import default_config, simulate  # noqa: E402
from pbs_power.sim.swf import read_swf  # noqa: E402

#: The four managers compared in the docs (the forecast what-if left out).
MANAGERS = ALL_MANAGERS[:4]
TRACES = os.path.join(os.path.dirname(HERE), "..", "shared", "traces")


def largest_trace() -> str:
    """The SWF trace with the most bytes in ../shared/traces."""
    paths = glob.glob(os.path.join(TRACES, "*.swf.gz"))
    if not paths:
        raise SystemExit("no .swf.gz traces in %s" % TRACES)
    return max(paths, key=os.path.getsize)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", help="SWF trace (default: the largest in shared/traces)")
    parser.add_argument("--limit", type=int, help="replay only the first N jobs")
    parser.add_argument("--managers", default=",".join(MANAGERS),
                        help="comma-separated managers to time (default: all four; "
                             "always-on always runs, as the others are measured against it)")
    parser.add_argument("--cycle", type=int,
                        help="seconds between the periodic managers' runs (default: the "
                             "shipped cycle_interval)")
    args = parser.parse_args()
    managers = ["always-on"] + [m for m in args.managers.split(",") if m and m != "always-on"]
    unknown = sorted(set(managers) - set(ALL_MANAGERS))
    if unknown:
        parser.error("unknown manager(s): %s (known: %s)" % (", ".join(unknown),
                                                            ", ".join(ALL_MANAGERS)))
    path = args.trace or largest_trace()
    trace = read_swf(path, limit=args.limit)
    header = trace.header
    per_node = -(-header.max_procs // header.max_nodes) if header.max_procs else 1
    jobs = trace.sim_jobs(cores_per_node=per_node)
    began = time.perf_counter()
    config = default_config()
    result = simulate(jobs, header.max_nodes, NODE_MODELS["cpu"], config, managers,
                      cycle=args.cycle or config.cycle_interval)
    seconds = time.perf_counter() - began
    print(json.dumps({
        "trace": os.path.basename(path), "jobs": len(jobs), "nodes": header.max_nodes,
        "cycle": args.cycle or config.cycle_interval,
        "managers": len(managers), "seconds": round(seconds, 2),
        "jobs_per_second": round(len(jobs) * len(managers) / seconds, 1),
        "per_manager_seconds": {m.manager: round(m.seconds, 2) for m in result.metrics},
        "per_manager_jobs_per_second": {m.manager: round(len(jobs) / m.seconds, 1)
                                        for m in result.metrics},
    }))


if __name__ == "__main__":
    main()
