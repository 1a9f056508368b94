"""How long the PBS hook's forecast of a deep queue onto free, sleeping and freed vnodes takes.

Builds --vnodes vnodes (a third asleep with 32 cpus, the rest awake and
mostly full, each busy one freed by its job within the next day) and --jobs
queued jobs (1-16 chunks of 1-32 cpus, half ``scatter``, walltimes of 10
minutes to a day), then times `pbs_power.pbs.forecast.forecast_starts` over
--runs runs and prints JSON: the cost the periodic hook pays each cycle
before planning.

    python benchmarks/pbs_fit.py [--vnodes 10000] [--jobs 5000] [--runs 3]
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

from pbs_power.pbs.forecast import Release, forecast_starts  # noqa: E402
from pbs_power.pbs.placement import (DEFAULT_CHECKED, Chunk, JobRequest,  # noqa: E402
                                     VnodeSpace)


def build(vnodes: int, jobs: int, rng: random.Random):
    """The vnodes (scheduler order), the running jobs' releases and the queue
    (scheduler order)."""
    spaces, releases = [], []
    for i in range(vnodes):
        asleep = i % 3 == 0
        cpus = 32.0 if asleep else float(rng.choice([0, 0, 4, 8]))
        name = "n%05d" % i
        spaces.append(VnodeSpace(name, name, asleep,
                                 {"ncpus": cpus, "mem": float(2 ** 37)}, not asleep))
        if not asleep:
            releases.append(Release(rng.uniform(0.0, 86400.0), "r%d" % i,
                                    ((name, name, (("ncpus", 32.0 - cpus),), True),)))
    queue = [JobRequest(str(i), (Chunk(rng.choice([1, 2, 4, 16]),
                                       (("ncpus", str(rng.choice([1, 8, 32]))),)),),
                        "scatter" if i % 2 else "free",
                        walltime=rng.choice([600.0, 3600.0, 4 * 3600.0, 86400.0]))
             for i in range(jobs)]
    return spaces, releases, queue


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vnodes", type=int, default=10000)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    spaces, releases, queue = build(args.vnodes, args.jobs, random.Random(args.seed))
    times, placed = [], 0
    for _ in range(args.runs):
        started = time.perf_counter()
        placed = len(forecast_starts(queue, spaces, releases, 0.0, DEFAULT_CHECKED))
        times.append(time.perf_counter() - started)
    print(json.dumps({"benchmark": "pbs_fit", "vnodes": args.vnodes, "jobs": args.jobs,
                      "jobs_placed": placed, "runs": args.runs,
                      "median_s": round(statistics.median(times), 3),
                      "max_s": round(max(times), 3), "python": platform.python_version()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
