"""How long the PBS hook's fit of a deep queue onto free plus sleeping vnodes takes.

Builds --vnodes vnodes (a third asleep with 32 cpus, the rest awake and
mostly full) and --jobs queued jobs (1-16 chunks of 1-32 cpus, half
``scatter``), then times `pbs_power.pbs.placement.fit_jobs` over --runs runs
and prints JSON: the cost the periodic hook pays each cycle before planning.

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

from pbs_power.pbs.placement import (DEFAULT_CHECKED, Chunk, JobRequest,  # noqa: E402
                                     VnodeSpace, fit_jobs)


def build(vnodes: int, jobs: int, rng: random.Random):
    """The vnodes (scheduler order) and the queue (scheduler order)."""
    spaces = []
    for i in range(vnodes):
        asleep = i % 3 == 0
        cpus = 32.0 if asleep else float(rng.choice([0, 0, 4, 8]))
        spaces.append(VnodeSpace("n%05d" % i, "n%05d" % i, asleep,
                                 {"ncpus": cpus, "mem": float(2 ** 37)}, not asleep))
    queue = [JobRequest(str(i), (Chunk(rng.choice([1, 2, 4, 16]),
                                       (("ncpus", str(rng.choice([1, 8, 32]))),)),),
                        "scatter" if i % 2 else "free")
             for i in range(jobs)]
    return spaces, queue


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vnodes", type=int, default=10000)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    spaces, queue = build(args.vnodes, args.jobs, random.Random(args.seed))
    times, fits = [], 0
    for _ in range(args.runs):
        started = time.perf_counter()
        fits = len(fit_jobs(queue, spaces, DEFAULT_CHECKED))
        times.append(time.perf_counter() - started)
    print(json.dumps({"benchmark": "pbs_fit", "vnodes": args.vnodes, "jobs": args.jobs,
                      "jobs_woken_for": fits, "runs": args.runs,
                      "median_s": round(statistics.median(times), 3),
                      "max_s": round(max(times), 3), "python": platform.python_version()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
