"""Replay one workload under several power managers and compare them.

Every manager runs on the same jobs, the same nodes (same per-node boot
times, same seed) and the same scheduler rules; ``always-on`` always runs,
as the others are measured against it. Everything here is SIMULATED.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable, Dict, List, Optional, Sequence

from pbs_power.config.hook_config import HookConfig
from .engine import Engine
from .managers import build
from .nodes import NodeModel, make_nodes
from .workload import SimJob

#: The hook config the simulator uses when none is given: our shipped defaults.
SIM_DEFAULTS = dict(power_on_off_enable=True)

Progress = Callable[[str, float], None]
#: A manager whose jobs have not all started this long after the energy
#: interval ends is stuck (its wakes and power-offs undo each other).
GIVE_UP_S = 30 * 86400.0


@dataclass
class ManagerMetrics:
    """How one manager did against always-on on the same jobs, defined alike for all.

    Energy is over the same fixed interval for every manager (`simulate`).
    Added wait clips each job's start change at 0; ``start_change_mean_s``
    is the plain mean, where jobs that start earlier offset later ones.
    ``jobs_delayed_pct``: jobs that start later than under always-on.
    """

    manager: str
    energy_kwh: float
    saved_pct: float
    added_wait_mean_s: float
    added_wait_p95_s: float
    added_wait_max_s: float
    start_change_mean_s: float
    wait_mean_s: float
    jobs_delayed_pct: float
    power_cycles_per_node_day: float
    #: power-downs of the most cycled node over the run (wear falls on it)
    power_cycles_max_per_node: int
    peak_ramp_w_per_min: float
    minutes_over_ramp_limit: int
    seconds: float
    #: jobs never started before the run was given up on (their starts count then)
    jobs_never_started: int = 0

    def as_dict(self) -> Dict[str, float]:
        return {k: (round(v, 3) if isinstance(v, float) else v)
                for k, v in asdict(self).items()}


@dataclass
class Comparison:
    """The metrics per manager plus what the plot needs."""

    jobs: int
    nodes: int
    span_s: float
    metrics: List[ManagerMetrics]
    samples: Dict[str, list]


def simulate(jobs: Sequence[SimJob], nodes: int, model: NodeModel,
             config: HookConfig, managers: Sequence[str], cycle: Optional[float] = None,
             seed: int = 1, progress: Optional[Progress] = None,
             sample_every: Optional[float] = None) -> Comparison:
    """Run ``managers`` (always-on added first) over ``jobs`` on ``nodes`` nodes.

    The periodic managers run every ``cycle`` seconds, by default the
    config's ``cycle_interval``; the planner is told the same period.
    Energy is integrated for every manager over the same interval, fixed by
    the workload and always-on alone: from the first submission to the later
    of the last submission plus its walltime and always-on's last job end.
    """
    if not jobs:
        raise ValueError("no jobs to simulate")
    if cycle is None:
        cycle = float(config.cycle_interval)
    elif cycle != config.cycle_interval:
        config = replace(config, cycle_interval=int(cycle))
    names = ["always-on"] + [m for m in managers if m != "always-on"]
    first = min(j.submit for j in jobs)
    end = max(j.submit + max(j.walltime, j.runtime) for j in jobs)
    every = sample_every or max(60.0, (end - first) / 1500.0)
    engines: Dict[str, Engine] = {}
    took: Dict[str, float] = {}
    for name in names:
        began = time.perf_counter()
        engine = Engine(jobs, make_nodes(nodes, model, seed), model,
                        build(name, config, cycle), sample_every=every, seed=seed)
        engine.cut = end
        engine.run(progress=(lambda f, n=name: progress(n, f)) if progress else None,
                   give_up=end + GIVE_UP_S)
        if name == "always-on":
            end = max(end, engine.now)      # the baseline's run, whatever the others do
        engines[name] = engine
        took[name] = time.perf_counter() - began
    base = engines["always-on"]
    base_kwh = base.energy_kwh(end)
    metrics = [_metrics(name, engines[name], base, base_kwh, end - first, nodes,
                        config.max_ramp_watts_per_minute, took[name], end)
               for name in names]
    return Comparison(len(jobs), nodes, end - first, metrics,
                      {name: e.samples for name, e in engines.items()})


def _metrics(name: str, e: Engine, base: Engine, base_kwh: float, span: float,
             nodes: int, ramp_limit: Optional[float], seconds: float,
             horizon: float) -> ManagerMetrics:
    kwh = e.energy_kwh(horizon)
    waits = [s - sub for s, sub in zip(e.start, e.submit)]
    change = [s - b for s, b in zip(e.start, base.start)]
    added = sorted(max(0.0, c) for c in change)
    count = len(added)
    steps = list(e.ramp_up.values()) + list(e.ramp_down.values())
    over = 0
    if ramp_limit is not None:
        over = len([m for m in set(e.ramp_up) | set(e.ramp_down)
                    if max(e.ramp_up.get(m, 0.0), e.ramp_down.get(m, 0.0)) > ramp_limit])
    node_days = nodes * max(span, 1.0) / 86400.0
    return ManagerMetrics(
        manager=name, energy_kwh=kwh,
        saved_pct=100.0 * (base_kwh - kwh) / base_kwh if base_kwh else 0.0,
        added_wait_mean_s=sum(added) / count,
        added_wait_p95_s=added[min(count - 1, int(math.ceil(0.95 * count)) - 1)],
        added_wait_max_s=added[-1],
        start_change_mean_s=sum(change) / count,
        wait_mean_s=sum(waits) / count,
        jobs_delayed_pct=100.0 * len([c for c in change if c > 0.0]) / count,
        power_cycles_per_node_day=e.node_cycles() / node_days,
        power_cycles_max_per_node=max((n.downs for n in e.nodes), default=0),
        peak_ramp_w_per_min=max(steps) if steps else 0.0,
        minutes_over_ramp_limit=over, seconds=seconds, jobs_never_started=e.unstarted)


def default_config(**overrides) -> HookConfig:
    """The hook config a simulation uses when the admin gives none."""
    return replace(HookConfig(), **dict(SIM_DEFAULTS, **overrides))
