"""The SIMULATED cluster engine: FCFS + EASY backfilling, energy, and the Slurm
and OpenPBS power managers, on tiny hand-made workloads.

Every expected time and energy below is worked out by hand from the rules in
`pbs_power/sim/engine.py` and `managers.py` (the arithmetic is in the
comments); the node model has no boot-time spread or noise, so every boot
takes exactly 300 s and every shutdown 60 s.
"""
from __future__ import annotations

import random

import pytest

from pbs_power.states.model import TransitionKind
from pbs_power.sim.engine import Engine
from pbs_power.sim.managers import AlwaysOn, OpenPBSPower, SlurmPowerSave
from pbs_power.sim.memstore import MemoryStore
from pbs_power.sim.nodes import (BOOTING, BUSY, DOWN, HELD, IDLE, SHUTTING, NodeModel,
                                 make_nodes, watts_by_state)
from pbs_power.sim.simulate import default_config
from pbs_power.states.store import Store

from sim_helpers import MODEL, STEP, Recorder, job, run, starts, waits


def kwh(joules: float) -> float:
    return joules / 3.6e6


# -- nodes -------------------------------------------------------------------

def test_make_nodes_names_and_exact_boot_times_without_spread():
    nodes = make_nodes(3, MODEL, seed=7)
    assert [n.name for n in nodes] == ["n00001", "n00002", "n00003"]
    assert [n.boot_s for n in nodes] == [300.0, 300.0, 300.0]
    assert all(n.state == IDLE and n.job is None and not n.marked for n in nodes)


def test_make_nodes_spread_is_seeded_and_bounded():
    spread = NodeModel(boot_seconds=400.0, boot_spread=0.5)
    a = [n.boot_s for n in make_nodes(50, spread, seed=11)]
    assert a == [n.boot_s for n in make_nodes(50, spread, seed=11)]
    assert a != [n.boot_s for n in make_nodes(50, spread, seed=12)]
    assert all(200.0 <= s <= 600.0 for s in a) and len(set(a)) == 50
    assert make_nodes(100000, MODEL)[-1].name == "n100000"


def test_watts_by_state_and_model_overrides():
    w = watts_by_state(MODEL, sleep_mode=False)
    assert (w[IDLE], w[BUSY], w[SHUTTING], w[DOWN], w[BOOTING], w[HELD]) == \
        (250.0, 450.0, 250.0, 10.0, 300.0, 250.0)
    assert watts_by_state(MODEL, sleep_mode=True)[DOWN] == 90.0
    assert MODEL.with_overrides({"idle_watts": "200"}).idle_watts == 200.0
    with pytest.raises(ValueError, match="unknown node model field.*idle_wats"):
        MODEL.with_overrides({"idle_wats": 1})


# -- the scheduler, always-on --------------------------------------------------

def test_fcfs_a_later_job_never_overtakes_an_earlier_one_of_equal_width():
    # A fills the 4 nodes until 100; at 100 B (3 nodes) starts, C (3 nodes)
    # cannot and waits for B's end at 150 (run time, not walltime).
    e = run([job("A", 0, 4, 100), job("B", 10, 3, 50, 500), job("C", 20, 3, 50)],
            4, AlwaysOn())
    assert starts(e) == {"A": 0.0, "B": 100.0, "C": 150.0}
    assert [n.downs for n in e.nodes] == [0, 0, 0, 0] and e.log == []


def test_jobs_wider_than_the_cluster_are_capped_to_it():
    e = run([job("W", 0, 99, 10), job("X", 5, 1, 10)], 2, AlwaysOn())
    assert starts(e) == {"W": 0.0, "X": 10.0}


def test_easy_backfill_short_job_starts_before_the_blocked_wide_job():
    # A holds 3 of 4 nodes until its walltime 1000: B (4 nodes) is the top
    # job, shadow 1000, no spare node. C needs 1 node and ends by 20 + 900
    # = 920 <= 1000: it backfills at once. B still starts at 1000.
    e = run([job("A", 0, 3, 1000), job("B", 10, 4, 100), job("C", 20, 1, 500, 900)],
            4, AlwaysOn())
    assert starts(e) == {"A": 0.0, "B": 1000.0, "C": 20.0}


def test_easy_backfill_refuses_a_job_that_would_delay_the_top_job():
    # Same, but C asks for 2000 s: 20 + 2000 > 1000 and there is no spare
    # node, so C waits behind B (1000..1100) although it would only run 100 s.
    e = run([job("A", 0, 3, 1000), job("B", 10, 4, 100), job("C", 20, 1, 100, 2000)],
            4, AlwaysOn())
    assert starts(e) == {"A": 0.0, "B": 1000.0, "C": 1100.0}


def test_easy_backfill_long_job_fits_in_the_spare_nodes_only():
    # 6 nodes; A takes 4 until 1000; B needs 5: shadow 1000, then 2 + 4 = 6
    # nodes free, 1 spare. C (1 node, long) takes the spare at 20. D (1 node,
    # long) would delay B: it waits. E (1 node, ends by 540 <= 1000) backfills.
    # At 1000 B takes the 5 free nodes (A's 4 + E's); D starts when B ends.
    e = run([job("A", 0, 4, 1000), job("B", 10, 5, 100), job("C", 20, 1, 5000),
             job("D", 30, 1, 100, 5000), job("E", 40, 1, 500)], 6, AlwaysOn())
    assert starts(e) == {"A": 0.0, "B": 1000.0, "C": 20.0, "D": 1100.0, "E": 40.0}


def test_easy_backfill_in_one_full_pass_when_all_jobs_are_queued_together():
    # The same jobs all submitted at 0 go through one full scheduling pass
    # (not the incremental one): the same rules give the same choices.
    e = run([job("A", 0, 4, 1000), job("B", 0, 5, 100), job("C", 0, 1, 5000),
             job("D", 0, 1, 100, 5000), job("E", 0, 1, 500)], 6, AlwaysOn())
    assert starts(e) == {"A": 0.0, "B": 1000.0, "C": 0.0, "D": 1100.0, "E": 0.0}


def test_energy_is_integrated_exactly_and_extended_to_a_later_horizon():
    # 3 nodes: J1 (2 nodes) 0..1800, J2 (1 node) 600..3600.
    e = run([job("J1", 0, 2, 1800), job("J2", 600, 1, 3000)], 3, AlwaysOn())
    joules = ((2 * 450 + 250) * 600          # 0..600: two busy, one idle
              + 3 * 450 * 1200               # 600..1800: all busy
              + (450 + 2 * 250) * 1800)      # 1800..3600: one busy
    assert joules == 4020000
    assert e.energy_kwh() == pytest.approx(kwh(joules), rel=1e-12)
    assert e.energy_kwh(until=3000.0) == pytest.approx(kwh(joules), rel=1e-12)
    later = joules + 3 * 250 * 1800          # idle until 5400
    assert e.energy_kwh(until=5400.0) == pytest.approx(kwh(later), rel=1e-12)
    assert e.now == 3600.0 and e.power() == 750.0


# -- Slurm power save ----------------------------------------------------------

def test_slurm_suspends_after_suspend_time_and_a_job_waits_exactly_one_boot():
    # A uses both nodes 0..100; SuspendTime 600 suspends both at 700 (the
    # first timers, set at 0, find them used since). B at 2000 is allocated
    # both powered-down nodes, resumes them, and starts when they are up.
    config = default_config(node_idle_limit=600)
    e = run([job("A", 0, 2, 100), job("B", 2000, 2, 100)], 2, SlurmPowerSave(config))
    assert e.log == [(700.0, "down", "n00001"), (700.0, "down", "n00002"),
                     (2000.0, "up", "n00001"), (2000.0, "up", "n00002")]
    assert starts(e) == {"A": 0.0, "B": 2300.0}
    assert waits(e) == {"A": 0.0, "B": 300.0}
    assert e.ramp_down == {700 // 60: 2 * STEP} and e.ramp_up == {2000 // 60: 2 * STEP}
    joules = (2 * 450 * 100 + 2 * 250 * 600 + 2 * 250 * 60 + 2 * 10 * (2000 - 760)
              + 2 * 300 * 300 + 2 * 450 * 100)
    assert e.energy_kwh() == pytest.approx(kwh(joules), rel=1e-12)


def test_slurm_suspend_and_resume_rates_space_nodes_one_minute_apart():
    config = default_config(node_idle_limit=600)
    manager = SlurmPowerSave(config, suspend_rate=1, resume_rate=1)
    e = run([job("A", 0, 2, 100), job("B", 2000, 2, 100)], 2, manager)
    assert e.log == [(700.0, "down", "n00001"), (760.0, "down", "n00002"),
                     (2000.0, "up", "n00001"), (2060.0, "up", "n00002")]
    assert [n.down_since for n in e.nodes] == [None, None]        # both came back
    assert starts(e)["B"] == 2360.0 and waits(e)["B"] == 360.0
    assert e.ramp_down == {11: STEP, 12: STEP} and e.ramp_up == {33: STEP, 34: STEP}


def test_slurm_rate_limit_at_a_fractional_time_does_not_spin():
    """BUG (managers.py, _RateLimit.room): the retry timer is set for
    ``times[0] + 60.0`` but room() tests ``times[0] <= now - 60.0``; for some
    fractional times (t + 60) - 60 rounds below t, the slot never frees and
    the timer re-arms at the same instant forever: the simulation hangs.
    Here A ends at a fractional time, so the first suspend is at such a time.
    """
    runtime = 422.1069999614152
    first = runtime + 600.0
    assert not first <= (first + 60.0) - 60.0      # the rounding that triggers it

    def spinning(_fraction):
        raise AssertionError("engine still running after 16384 loops: it spins")

    config = default_config(node_idle_limit=600)
    e = Recorder([job("A", 0, 2, runtime), job("B", 5000, 2, 10)], make_nodes(2, MODEL),
                 MODEL, SlurmPowerSave(config, suspend_rate=1))
    e.run(progress=spinning)
    assert e.log[:2] == [(first, "down", "n00001"), (first + 60.0, "down", "n00002")]


def test_slurm_never_suspends_suspend_exc_nodes():
    config = default_config(node_idle_limit=600, exclude_nodes="n00001",
                            excluded_hosts=frozenset({"n00001"}))
    e = run([job("A", 0, 2, 100), job("B", 5000, 1, 100)], 2, SlurmPowerSave(config))
    assert e.log == [(700.0, "down", "n00002")]
    assert [n.downs for n in e.nodes] == [0, 1]
    assert e.nodes[1].state == DOWN and e.nodes[1].down_since == 760.0
    assert starts(e)["B"] == 5000.0 and waits(e)["B"] == 0.0    # on the kept node
    joules = (900 * 100 + 500 * 600 + 500 * 60 + (250 + 10) * (5000 - 760)
              + (450 + 10) * 100)
    assert e.energy_kwh() == pytest.approx(kwh(joules), rel=1e-12)


def test_slurm_job_on_a_mix_of_up_and_down_nodes_holds_the_up_one():
    # n00002 is suspended at 700; B (2 nodes) at 2000 gets the idle n00001
    # (held) and the down n00002, and starts when that one is up.
    config = default_config(node_idle_limit=600)
    e = run([job("A", 0, 1, 100), job("K", 0, 1, 1900), job("B", 2000, 2, 100)], 2,
            SlurmPowerSave(config))
    # A on n00001 ends at 100 (suspended 700); K on n00002 ends at 1900.
    assert e.log == [(700.0, "down", "n00001"), (2000.0, "up", "n00001")]
    assert starts(e)["B"] == 2300.0 and waits(e)["B"] == 300.0


# -- OpenPBS PBS_power ----------------------------------------------------------

def test_openpbs_powers_off_idle_nodes_at_most_max_concurrent_per_run():
    # Runs every 300 s from 0; nodes idle since 100 exceed 600 s at 900.
    config = default_config(node_idle_limit=600, max_concurrent_nodes=2)
    e = run([job("A", 0, 4, 100), job("Z", 3000, 4, 10)], 4, OpenPBSPower(config, 300))
    downs = [x for x in e.log if x[1] == "down"]
    assert downs == [(900.0, "down", "n00001"), (900.0, "down", "n00002"),
                     (1200.0, "down", "n00003"), (1200.0, "down", "n00004")]
    assert e.ramp_down == {15: 2 * STEP, 20: 2 * STEP}


def test_openpbs_wakes_only_jobs_starting_within_its_900s_assumption():
    # 3 nodes off at 900. B (1 node) at 5000 is woken at the 5100 run, starts
    # at 5400 and holds n00001 until 15400. C (3 nodes) at 5500 is estimated
    # to start at 15400: its sleeping nodes are woken only at the first run
    # with 15400 <= now + 900, i.e. 14700, so C starts at 15400 with no delay.
    config = default_config(node_idle_limit=600)
    e = run([job("A", 0, 3, 100), job("B", 5000, 1, 10000), job("C", 5500, 3, 100)], 3,
            OpenPBSPower(config, 300))
    ups = [x for x in e.log if x[1] == "up"]
    assert ups == [(5100.0, "up", "n00001"), (14700.0, "up", "n00002"),
                   (14700.0, "up", "n00003")]
    assert starts(e) == {"A": 0.0, "B": 5400.0, "C": 15400.0}
    assert waits(e)["C"] == 0.0               # B's wait: see the next test
    assert e.ramp_up == {5100 // 60: STEP, 14700 // 60: 2 * STEP}


def test_power_wait_counts_from_submission_when_every_node_is_asleep():
    """A job submitted while no node can start still becomes the top job at
    once, so its power wait counts from submission: B (1 node) arrives at
    5000 with every node off and starts at 5400 only because n00001 had to
    boot: 400 s of power wait."""
    config = default_config(node_idle_limit=600)
    e = run([job("A", 0, 3, 100), job("B", 5000, 1, 10000)], 3, OpenPBSPower(config, 300))
    assert starts(e)["B"] == 5400.0
    assert waits(e)["B"] == 400.0


def _hundred_queue(blockers: int):
    """L holds 2 of 3 nodes until 20000; n00003 goes off at 900. Then
    ``blockers`` 2-node jobs queue behind L, and last a 1-node job, S, that
    only the sleeping n00003 could run."""
    jobs = [job("L", 0, 2, 20000)]
    jobs += [job("q%03d" % i, 1000 + i, 2, 10) for i in range(blockers)]
    jobs.append(job("S", 1100 + blockers, 1, 10))
    return jobs


def test_openpbs_wakes_the_100th_queued_job_s_node():
    config = default_config(node_idle_limit=600, min_node_down_delay=0)
    e = run(_hundred_queue(99), 3, OpenPBSPower(config, 300))
    # n00003 is idle from 0: at the 600 run it has been idle exactly
    # node_idle_limit, not longer, so it goes off at the 900 run.
    assert e.log[:2] == [(900.0, "sleep", "n00003"), (900.0, "down", "n00003")]
    assert [x for x in e.log if x[1] == "up"][0] == (1200.0, "up", "n00003")
    assert starts(e)["S"] == 1500.0               # backfilled: ends long before 20000


def test_openpbs_ignores_the_101st_queued_job():
    # Only the first 100 queued jobs are looked at: S is 101st, so n00003
    # stays off until L ends at 20000 and the queue drains: q000 starts at
    # 20000, q001 at 20010, ... At the 20100 run q010 has started and S is
    # within the first 100 again.
    config = default_config(node_idle_limit=600, min_node_down_delay=0)
    e = run(_hundred_queue(100), 3, OpenPBSPower(config, 300))
    assert [x for x in e.log if x[1] == "up"][0] == (20100.0, "up", "n00003")
    assert starts(e)["S"] == 20400.0
    assert e.estimates(0.0) == []                 # nothing left queued


def test_openpbs_respects_exclude_nodes():
    config = default_config(node_idle_limit=600, exclude_nodes="n00002",
                            excluded_hosts=frozenset({"n00002"}))
    e = run([job("A", 0, 2, 100), job("Z", 3000, 1, 10)], 2, OpenPBSPower(config, 300))
    assert [x for x in e.log if x[1] == "down"] == [(900.0, "down", "n00001")]
    assert starts(e)["Z"] == 3000.0               # on the excluded, always-up node


# -- the engine's calendar ------------------------------------------------------

def test_estimates_top_job_gets_shadow_time_and_freed_nodes():
    # Stop a run half-way by hand: A holds n00001..2 until walltime 1000,
    # n00003 is free, B needs 3 nodes, C needs 1.
    e = Engine([job("A", 0, 2, 900, 1000), job("B", 10, 3, 10), job("C", 20, 1, 10)],
               make_nodes(3, MODEL), MODEL, AlwaysOn())
    e.manager.attach(e)
    e.queue = [0]
    e._allocate(0, 0.0)
    e.queue = [1, 2]
    got = [(e.job_ids[j], at, [n.name for n in nodes]) for j, at, nodes in e.estimates(30.0)]
    # B: A's 2 nodes at 1000 plus the free n00003. C (10 s) ends long
    # before 1000, so EASY lets it use n00003 now.
    assert got == [("B", 1000.0, ["n00001", "n00002", "n00003"]),
                   ("C", 30.0, ["n00003"])]
    assert e.estimates(30.0, limit=0) == []


def _calendar(jobs, nodes, running, queued, t):
    """Start ``running`` by hand, queue ``queued``, and read the calendar at ``t``."""
    e = Engine(jobs, make_nodes(nodes, MODEL), MODEL, AlwaysOn())
    e.manager.attach(e)
    for j in running:
        e.queue = [j]
        e._allocate(j, 0.0)
    e.queue = list(queued)
    return [(e.job_ids[j], at, [n.name for n in ns]) for j, at, ns in e.estimates(t)]


def test_estimates_backfill_ends_before_the_shadow_or_uses_what_the_top_job_leaves():
    # A holds n00001 until 1000; n00002..4 are free. B (2 nodes) fits now:
    # n00002..3. C (2) is the top job: A's node at 1000 plus n00004, held.
    # D (1 node, 5000 s) would run past 1000 and no node is left that C does
    # not hold. E (1 node, 10 s) ends long before 1000: it may use n00004 now.
    got = _calendar([job("A", 0, 1, 900, 1000), job("B", 10, 2, 10), job("C", 20, 2, 10),
                     job("D", 25, 1, 5000), job("E", 26, 1, 10)], 4, [0], [1, 2, 3, 4], 30.0)
    assert got == [("B", 30.0, ["n00002", "n00003"]),
                   ("C", 1000.0, ["n00001", "n00004"]),
                   ("E", 30.0, ["n00004"])]


def test_estimates_long_backfill_takes_the_nodes_the_top_job_leaves_from_the_back():
    # A holds n00001..2 until 1000; n00003..6 are free. T (5 nodes) is the
    # top job: A's two at 1000 plus n00003..5. L (1 node, 5000 s) runs past
    # 1000: it gets the one node T leaves, n00006. S (1 node, 10 s) ends
    # before 1000: it may use T's n00003 now.
    got = _calendar([job("A", 0, 2, 900, 1000), job("T", 10, 5, 10), job("L", 20, 1, 5000),
                     job("S", 30, 1, 10)], 6, [0], [1, 2, 3], 30.0)
    assert got == [("T", 1000.0, ["n00001", "n00002", "n00003", "n00004", "n00005"]),
                   ("L", 30.0, ["n00006"]),
                   ("S", 30.0, ["n00003"])]


# -- the in-memory store ---------------------------------------------------------

def test_memory_store_estimates_match_the_sqlite_store(tmp_path):
    rng = random.Random(5)
    mem, disk = MemoryStore(), Store.open(str(tmp_path / "state"))
    try:
        t = 0.0
        for _ in range(400):
            t += rng.uniform(1, 100)
            host = "h%d" % rng.randrange(4)
            kind = rng.choice([TransitionKind.POWER_ON, TransitionKind.POWER_OFF,
                               "wake"])
            secs = float(rng.randrange(30, 600))
            mem.record_duration(host, kind, t, secs)
            disk.record_duration(host, kind, t, secs)
        for host in ("h0", "h1", "h2", "h3"):
            for kind in TransitionKind:
                assert mem.durations(host, kind) == disk.durations(host, kind)
        assert max(len(mem.durations("h0", k)) for k in TransitionKind) == 20
        assert mem.duration_estimates() == disk.duration_estimates()
        assert mem.duration_estimates("wake") == disk.duration_estimates("wake")
        for kind in TransitionKind:
            assert mem.fleet_duration_estimate(kind) == disk.fleet_duration_estimate(kind)
        mem.record_duration("h9", "power_on", t + 1, 5000.0)   # the fleet view is refreshed
        disk.record_duration("h9", "power_on", t + 1, 5000.0)
        assert mem.fleet_duration_estimate("power_on") == \
            disk.fleet_duration_estimate("power_on")
        for store in (mem, disk):
            store.set_down_since("h1", 50.0)
            store.set_down_since("h2", 60.0)
            store.set_down_since("h2", None)
            store.mark_failed("h3", "boot timed out", 70.0)
        assert mem.down_since() == disk.down_since() == {"h1": 50.0}
        assert mem.failed() == disk.failed() == {"h3": ("boot timed out", 70.0)}
        with mem.cycle_lock() as acquired:
            assert acquired is True
    finally:
        disk.close()
