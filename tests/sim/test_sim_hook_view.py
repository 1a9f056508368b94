"""The simulated PBS hook's view of the cluster: which vnodes its forecast reaches,
in the order the real hook takes them (hosts being woken, then the fastest to
boot), and that the shortcuts it takes give the real hook's answer."""
from __future__ import annotations

import random

from pbs_power.sim.engine import Engine
from pbs_power.sim.managers import AlwaysOn, PbsPower
from pbs_power.sim.nodes import BUSY, DOWN, IDLE, make_nodes
from pbs_power.sim.simulate import default_config

from sim_helpers import MODEL, job, run


def test_the_simulated_hook_wakes_the_hosts_measured_to_boot_fastest():
    # Four nodes: A runs on n00001, n00002-4 are powered down, with boots
    # measured at 300, 120 and 200 s. X (2 nodes) waits: the hook's forecast,
    # fed the store's measurements as the real hook is, puts it on n00003
    # and n00004, the two quickest to come up.
    manager = PbsPower(default_config(node_idle_limit=600), 60)
    e = Engine([job("A", 0, 1, 900, 900), job("X", 0, 2, 100, 100)], make_nodes(4, MODEL),
               MODEL, manager)
    manager.attach(e)
    for node in e.nodes[1:]:
        e._set(node, DOWN)
        e._from_pool(node)
    e.queue = [0]
    e._schedule(0.0)
    e.queue = [1]
    e.version += 1
    for name, seconds in (("n00002", 300.0), ("n00003", 120.0), ("n00004", 200.0)):
        manager.store.record_duration(name, "power_on", -1000.0, seconds)
    got = manager.snapshot(100.0).queued_jobs
    assert [(q.id, q.estimated_start, q.vnodes) for q in got] == [
        ("X", 100.0, ("n00003", "n00004"))]


def test_the_hook_view_s_inputs_are_always_whole_vnodes(monkeypatch):
    # The simulated hook skips forecast_starts' check that every vnode,
    # release and chunk is one whole ncpus; on a random bursty workload every
    # forecast must pass that check and give forecast_starts' very answer.
    from pbs_power.pbs import forecast
    from pbs_power.sim import hook_view
    calls = []

    def checked(jobs, vnodes, releases, now):
        got = forecast.forecast_whole_vnodes(jobs, vnodes, releases, now)
        assert forecast._unit_amount(jobs, vnodes, releases, frozenset({"ncpus"})) == 1.0
        assert got == forecast.forecast_starts(jobs, vnodes, releases, now,
                                               frozenset({"ncpus"}))
        calls.append(any(s.start is not None for s in got))
        return got
    monkeypatch.setattr(hook_view, "forecast_whole_vnodes", checked)
    rng = random.Random(3)
    jobs, t = [], 0.0
    for i in range(150):
        t += rng.choice((30.0, 200.0, 900.0, 4000.0))
        runtime = rng.uniform(60.0, 6000.0)
        jobs.append(job("j%d" % i, t, rng.randint(1, 12), runtime,
                        runtime * rng.uniform(1.0, 4.0)))
    run(jobs, 16, PbsPower(default_config(node_idle_limit=600, min_node_down_delay=0), 60))
    assert len(calls) > 100 and sum(calls) > 20     # blocked jobs' shadows were forecast


def test_the_hook_view_picks_the_vnodes_waking_first_orders():
    # The hook view picks the free and sleeping vnodes a forecast can reach
    # from the engine's state index instead of walking every node; on random
    # clusters (states, marks, failures, hosts being woken, measured boots or
    # none) it must give what waking_first gives over every node in order.
    from pbs_power.pbs.demand import waking_first
    from pbs_power.sim.hook_view import HookView
    from pbs_power.sim.nodes import BOOTING, SHUTTING
    from pbs_power.states.cycle import MeasuredBoots
    rng = random.Random(7)
    for _ in range(300):
        e = Engine([job("A", 0, 1, 10, 10)], make_nodes(40, MODEL), MODEL, AlwaysOn())
        for node in e.nodes:
            state = rng.choice((IDLE, IDLE, DOWN, BOOTING, SHUTTING, BUSY))
            if state != IDLE:
                e._set(node, state)
                e._from_pool(node)
            node.marked = state != BUSY and rng.random() < 0.3
            if state == BUSY:
                node.job = 0
            if rng.random() < 0.05:
                e.fail(node, 0.0)
        view = HookView(e)
        waking = frozenset(n.name for n in e.nodes if rng.random() < 0.2)
        boots = MeasuredBoots((n.name, rng.choice((100.0, 150.0, 200.0)))
                              for n in e.nodes if rng.random() < rng.choice((0.0, 0.5, 1.0)))
        room = [view._space(n.idx, n.marked or n.state != IDLE) for n in e.nodes
                if not n.failed and n.job is None and n.state in (IDLE, DOWN, BOOTING, SHUTTING)]
        most = rng.randint(1, 40)
        want_awake = [v for v in room if not v.asleep][:most]
        want_asleep = waking_first([v for v in room if v.asleep], waking, boots)[:most]
        assert view._awake(most) == want_awake
        assert view._asleep(waking, boots, most) == want_asleep
