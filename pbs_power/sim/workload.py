"""Jobs for the simulator: the record type and a synthetic day of work.

The synthetic stream is SIMULATED (seeded, reproducible): arrivals follow a
working-day pattern (busy from 08:00 to 18:00, quiet at night), sizes are
mostly small with a few wide jobs, run times are log-normal, and requested
walltimes overestimate run times as users do.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import List, Optional, Tuple

#: Relative arrival rate per hour of the day (00..23).
DAY_SHAPE = (0.2, 0.15, 0.1, 0.1, 0.1, 0.15, 0.3, 0.6, 1.0, 1.3, 1.4, 1.4,
             1.2, 1.3, 1.4, 1.3, 1.2, 1.0, 0.7, 0.5, 0.4, 0.35, 0.3, 0.25)
SIZES = (1, 1, 1, 1, 2, 2, 2, 4, 4, 8, 8, 16, 32)


@dataclass
class SimJob:
    """One job: what the user asked for, and what the simulation did with it."""

    id: str
    submit: float
    nodes: int
    runtime: float
    walltime: float
    start: Optional[float] = None
    hosts: Tuple[str, ...] = ()

    @property
    def end(self) -> Optional[float]:
        return None if self.start is None else self.start + self.runtime

    @property
    def wait(self) -> Optional[float]:
        return None if self.start is None else self.start - self.submit


def synthetic_day(hosts: int, seed: int = 1, hours: float = 24.0,
                  start: float = 0.0, jobs_per_day: Optional[int] = None) -> List[SimJob]:
    """A SIMULATED job stream sized to keep ``hosts`` busy by day and mostly idle at night."""
    rng = random.Random(seed)
    per_day = jobs_per_day or max(10, int(hosts * 2.0))
    mean_rate = per_day / 86400.0
    shape_mean = sum(DAY_SHAPE) / len(DAY_SHAPE)
    jobs: List[SimJob] = []
    t = 0.0
    while True:
        hour = int((t / 3600.0) % 24)
        rate = mean_rate * DAY_SHAPE[hour] / shape_mean
        t += rng.expovariate(rate)
        if t >= hours * 3600.0:
            return jobs
        nodes = min(hosts, rng.choice(SIZES))
        runtime = min(8 * 3600.0, max(120.0, rng.lognormvariate(math.log(2400), 1.0)))
        walltime = math.ceil(runtime * rng.uniform(1.2, 3.0) / 900.0) * 900.0
        jobs.append(SimJob("%d.sim" % (len(jobs) + 1), start + t, nodes, runtime, walltime))
