"""The simulated PBS scheduler and vnodes that are not up, as a real OpenPBS treats them.

A vnode marked asleep, or down while it boots, is neither free nor busy to
the scheduler (src/scheduler/node_info.cpp set_node_info_state), so a top
job that needs one gets no start estimate and holds nothing: later jobs
pass it (seen on a real server: "Can't find start time estimate", then the
next job "Job run"). With power_provisioning, which only a hook named
PBS_power turns on, the calendar has sleeping vnodes up at now + 600 s
(src/scheduler/simulate.cpp create_events), so the top job holds the free
vnodes against jobs that would still run then.

Node model: boots take exactly 300 s, shutdowns 60 s (`sim_helpers.MODEL`).
"""
from __future__ import annotations

from typing import Optional

from pbs_power.sim.manager import Manager

from sim_helpers import run, starts, job


class WakeAt(Manager):
    """Puts every node but the first to sleep at 0 and wakes them at ``wake``."""

    name = "wake-at"

    def __init__(self, wake: float, calendar_sleep: Optional[float] = None):
        self.wake = wake
        self.calendar_sleep = calendar_sleep

    def attach(self, engine) -> None:
        super().attach(engine)
        for node in engine.nodes[1:]:
            engine.mark(node, True)
            engine.power_down(node, 0.0)
        engine.timer(self.wake, None)

    def on_timer(self, now: float, arg) -> None:
        for node in self.engine.nodes[1:]:
            self.engine.power_up(node, now)

    def on_up(self, node, now: float) -> None:
        self.engine.mark(node, False)


def _jobs():
    # W needs all 3 nodes; L (1 node, 5000 s) and Q (1 node, asks 500 s)
    # arrive while n00002..3 sleep. The wake at 1000 has them up at 1300.
    return [job("W", 100, 3, 100), job("L", 200, 1, 5000), job("Q", 250, 1, 400, 500)]


def test_a_top_job_that_needs_sleeping_vnodes_holds_nothing_without_provisioning():
    # W gets no estimate (it could never fit in the up vnodes): L takes the
    # free n00001 at 200. Q finds no free vnode and becomes the top job,
    # estimated at L's end, 5200. At 1300 the woken vnodes are free but W
    # does not fit (L holds n00001); W becomes the top job at 5200 and Q,
    # ending by 1800, backfills at 1300. W starts at 5200.
    e = run(_jobs(), 3, WakeAt(1000.0))
    assert starts(e) == {"W": 5200.0, "L": 200.0, "Q": 1300.0}


def test_with_provisioning_the_top_job_holds_free_vnodes_from_long_jobs_only():
    # W is calendared at now + 600 (700 at 100, 800 at 200, 850 at 250): L
    # would run past that on W's free n00001, so it waits; Q ends by
    # 250 + 500 = 750 <= 850 and backfills at 250. At 1300 the woken nodes
    # come up, Q ended at 650: W starts, and L after it at 1400.
    e = run(_jobs(), 3, WakeAt(1000.0, calendar_sleep=600.0))
    assert starts(e) == {"W": 1300.0, "L": 1400.0, "Q": 250.0}


def test_the_moving_estimate_lets_a_job_pass_that_an_earlier_pass_refused():
    # Q2 asks 575 s at 250: 250 + 575 = 825 > 800, the estimate of the pass
    # at 200, but <= 850, the estimate a pass at 250 gives: it backfills.
    jobs = [job("W", 100, 3, 100), job("L", 200, 1, 5000), job("Q2", 250, 1, 500, 575)]
    e = run(jobs, 3, WakeAt(1000.0, calendar_sleep=600.0))
    assert starts(e)["Q2"] == 250.0


def test_a_woken_vnode_s_mom_registering_clears_its_sleep_mark():
    # OpenPBS's hook every 400 s: n00001 goes off at the 800 run (idle since
    # A ended at 100), B arrives at 5000, the 5200 run wakes it, its boot
    # ends at 5500. pbs_server clears
    # the sleep mark when the MoM registers (the real server did at once on a
    # MoM start), so B starts at 5500, not at the hook's next run at 5600.
    from pbs_power.sim.managers import OpenPBSPower
    from pbs_power.sim.simulate import default_config
    config = default_config(node_idle_limit=600, min_node_down_delay=0)
    e = run([job("A", 0, 1, 100), job("B", 5000, 1, 10)], 1, OpenPBSPower(config, freq=400.0))
    assert [x[:2] for x in e.log if x[1] in ("down", "up")] == [(800.0, "down"), (5200.0, "up")]
    assert starts(e)["B"] == 5500.0


class _FullPasses:
    """An engine that never takes the moving reservation's shortcut."""

    def _moved_alike(self, t):
        return False


def test_the_moving_reservation_s_shortcut_gives_the_full_passes_run():
    # Random small workloads under both PBS managers: the shortcut that tries
    # only new jobs while the top job's reservation just moves with the clock
    # must start every job when full scheduling passes would.
    import random
    from pbs_power.sim.engine import Engine
    from pbs_power.sim.managers import OpenPBSPower, PbsPower
    from pbs_power.sim.nodes import make_nodes
    from pbs_power.sim.simulate import default_config
    from sim_helpers import MODEL
    Full = type("Full", (_FullPasses, Engine), {})
    config = default_config(node_idle_limit=300, min_node_down_delay=0, cycle_interval=60)
    for seed in range(30):
        rng = random.Random(seed)
        jobs, t = [], 0.0
        for i in range(60):
            t += rng.expovariate(1 / 120.0)
            run_s = rng.choice((60, 200, 300, 500, 900, 3000))
            jobs.append(job("j%d" % i, t, rng.choice((1, 1, 2, 3, 4, 6, 8)), run_s,
                            run_s * rng.choice((1, 1.5, 2, 4))))
        for manager in (lambda: OpenPBSPower(config, freq=120.0), lambda: PbsPower(config, 60)):
            # openpbs may livelock: both give up at the same time then
            runs = [cls(jobs, make_nodes(8, MODEL, seed=3), MODEL, manager()).run(
                give_up=t + 86400.0) for cls in (Engine, Full)]
            assert runs[0].start == runs[1].start, seed
            assert runs[0].energy_j == runs[1].energy_j, seed
