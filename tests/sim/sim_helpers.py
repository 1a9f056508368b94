"""Shared pieces of the simulator tests: an exact node model, a recording engine."""
from __future__ import annotations

from pbs_power.sim.engine import Engine
from pbs_power.sim.nodes import DOWN, NodeModel, make_nodes
from pbs_power.sim.workload import SimJob

#: busy 450 W, idle 250 W, off 10 W, booting 300 W; boots 300 s, shutdowns 60 s.
MODEL = NodeModel(boot_spread=0.0, boot_noise=0.0)
STEP = MODEL.idle_watts - MODEL.off_watts        # 240 W per node powered on or off


def job(jid: str, submit: float, nodes: int, runtime: float, walltime: float = 0.0) -> SimJob:
    return SimJob(jid, submit, nodes, runtime, walltime or runtime)


class Recorder(Engine):
    """An engine that logs every power command and sleep-mark change with its time."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.log = []

    def power_down(self, node, t):
        ok = super().power_down(node, t)
        if ok:
            self.log.append((t, "down", node.name))
        return ok

    def power_up(self, node, t):
        was = node.state
        ok = super().power_up(node, t)
        if ok:
            self.log.append((t, "up" if was == DOWN else "up-after-shutdown", node.name))
        return ok

    def mark(self, node, asleep):
        if node.marked != asleep:
            self.log.append((self.now, "sleep" if asleep else "wake", node.name))
        super().mark(node, asleep)


def run(jobs, count, manager):
    return Recorder(jobs, make_nodes(count, MODEL, seed=3), MODEL, manager).run()


def starts(engine):
    return dict(zip(engine.job_ids, engine.start))


def waits(engine):
    return dict(zip(engine.job_ids, engine.power_wait))
