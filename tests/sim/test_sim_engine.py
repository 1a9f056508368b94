"""The SIMULATED cluster engine: FCFS + EASY backfilling, energy, and the Slurm
and OpenPBS power managers, on tiny hand-made workloads.

Every expected time and energy below is worked out by hand from the rules in
`pbs_power/sim/engine.py` and `managers.py` (the arithmetic is in the
comments); the node model has no boot-time spread or noise, so every boot
takes exactly 300 s and every shutdown 30 s.
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
    jobs = [job("J1", 0, 2, 1800), job("J2", 600, 1, 3000)]
    e = run(jobs, 3, AlwaysOn())
    joules = ((2 * 450 + 250) * 600          # 0..600: two busy, one idle
              + 3 * 450 * 1200               # 600..1800: all busy
              + (450 + 2 * 250) * 1800)      # 1800..3600: one busy
    assert joules == 4020000
    assert e.energy_kwh() == pytest.approx(kwh(joules), rel=1e-12)
    later = joules + 3 * 250 * 1800          # idle until 5400
    assert e.energy_kwh(until=5400.0) == pytest.approx(kwh(later), rel=1e-12)
    assert e.now == 3600.0 and e.power() == 750.0
    with pytest.raises(ValueError):           # an earlier end needs the cut set first
        e.energy_kwh(until=3000.0)
    cut = Recorder(jobs, make_nodes(3, MODEL), MODEL, AlwaysOn())
    cut.cut = 3000.0
    cut.run()
    assert cut.energy_kwh(until=3000.0) == pytest.approx(
        kwh(joules - (450 + 2 * 250) * 600), rel=1e-12)


# -- Slurm power save ----------------------------------------------------------

def test_slurm_suspends_after_suspend_time_and_a_job_waits_exactly_one_boot():
    # A uses both nodes 0..100; SuspendTime 600: last_busy 100 < now - 600
    # first holds at the 10 s pass at 710, which suspends both (10 tokens
    # there). SuspendTimeout = shutdown 30 s: down at 740. B at 2000 is
    # allocated both powered-down nodes; the pass at 2000 resumes them.
    config = default_config(node_idle_limit=600)
    e = run([job("A", 0, 2, 100), job("B", 2000, 2, 100)], 2, SlurmPowerSave(config))
    assert e.log == [(710.0, "down", "n00001"), (710.0, "down", "n00002"),
                     (2000.0, "up", "n00001"), (2000.0, "up", "n00002")]
    assert starts(e) == {"A": 0.0, "B": 2300.0}
    assert waits(e) == {"A": 0.0, "B": 300.0}
    assert e.ramp_down == {710 // 60: 2 * STEP} and e.ramp_up == {2000 // 60: 2 * STEP}
    joules = (2 * 450 * 100 + 2 * 250 * 610 + 2 * 250 * 30 + 2 * 10 * (2000 - 740)
              + 2 * 300 * 300 + 2 * 450 * 100)
    assert e.energy_kwh() == pytest.approx(kwh(joules), rel=1e-12)


def test_slurm_suspend_rate_is_a_bucket_of_ten_refilled_one_a_second():
    # SuspendRate 60: one token a second, at most 60 x 10 / 60 = 10 kept
    # (power_save_rl_setup): 20 nodes idle at once go down 10 at the 710
    # pass and 10 at the 720 pass, not 20 in one burst.
    config = default_config(node_idle_limit=600)
    e = run([job("A", 0, 20, 100), job("Z", 5000, 1, 10)], 20, SlurmPowerSave(config))
    downs = [t for t, what, _ in e.log if what == "down"]
    assert downs == [710.0] * 10 + [720.0] * 10


def test_slurm_tokens_refill_per_period_not_a_minute_after_use():
    # Rates 1 per minute: a token every whole minute of the clock, at most 1
    # kept. n00001 goes at 710 (minute 11 began at 660); the next token is
    # at 720 (minute 12), so n00002 goes at the 720 pass. B's resumes: one
    # token at 2000, the next at 2040 (minute 34): B starts at 2340.
    config = default_config(node_idle_limit=600)
    manager = SlurmPowerSave(config, suspend_rate=1, resume_rate=1)
    e = run([job("A", 0, 2, 100), job("B", 2000, 2, 100)], 2, manager)
    assert e.log == [(710.0, "down", "n00001"), (720.0, "down", "n00002"),
                     (2000.0, "up", "n00001"), (2040.0, "up", "n00002")]
    assert [n.down_since for n in e.nodes] == [None, None]        # both came back
    assert starts(e)["B"] == 2340.0 and waits(e)["B"] == 340.0


def test_slurm_rate_limit_at_a_fractional_time_does_not_spin():
    """A ends at a fractional time; passes stay on the 10 s ticks and the
    engine finishes (a retry timer at a rounding-unlucky time once spun)."""
    runtime = 422.1069999614152

    def spinning(_fraction):
        raise AssertionError("engine still running after 16384 loops: it spins")

    config = default_config(node_idle_limit=600)
    e = Recorder([job("A", 0, 2, runtime), job("B", 5000, 2, 10)], make_nodes(2, MODEL),
                 MODEL, SlurmPowerSave(config, suspend_rate=1))
    e.run(progress=spinning)
    # eligible after 1022.1: the 1030 pass (minute 17 has a token); the next
    # token comes with minute 18, at the 1080 pass.
    assert e.log[:2] == [(1030.0, "down", "n00001"), (1080.0, "down", "n00002")]


def test_slurm_never_suspends_suspend_exc_nodes():
    config = default_config(node_idle_limit=600, exclude_nodes="n00001",
                            excluded_hosts=frozenset({"n00001"}))
    e = run([job("A", 0, 2, 100), job("B", 5000, 1, 100)], 2, SlurmPowerSave(config))
    assert e.log == [(710.0, "down", "n00002")]
    assert [n.downs for n in e.nodes] == [0, 1]
    assert e.nodes[1].state == DOWN and e.nodes[1].down_since == 740.0
    assert starts(e)["B"] == 5000.0 and waits(e)["B"] == 0.0    # on the kept node
    joules = (900 * 100 + 500 * 610 + 500 * 30 + (250 + 10) * (5000 - 740)
              + (450 + 10) * 100)
    assert e.energy_kwh() == pytest.approx(kwh(joules), rel=1e-12)


def test_slurm_warm_pool_keeps_the_first_idle_node_up():
    # min_idle_nodes 1 -> SuspendExcNodes=ALL:1: with nothing allocated the
    # first idle node is spared (_pick_exc_nodes), so only n00002 goes.
    config = default_config(node_idle_limit=600, min_idle_nodes=1)
    e = run([job("A", 0, 2, 100), job("B", 5000, 1, 100)], 2, SlurmPowerSave(config))
    assert [x for x in e.log if x[1] == "down"] == [(710.0, "down", "n00002")]
    assert starts(e)["B"] == 5000.0


def test_slurm_job_on_a_mix_of_up_and_down_nodes_holds_the_up_one():
    # n00001 is suspended at 710; B (2 nodes) at 2000 gets the idle n00002
    # (held) and the down n00001, and starts when that one is up.
    config = default_config(node_idle_limit=600)
    e = run([job("A", 0, 1, 100), job("K", 0, 1, 1900), job("B", 2000, 2, 100)], 2,
            SlurmPowerSave(config))
    assert e.log == [(710.0, "down", "n00001"), (2000.0, "up", "n00001")]
    assert starts(e)["B"] == 2300.0 and waits(e)["B"] == 300.0


def test_slurm_wide_job_keeps_its_reservation_behind_powering_down_nodes():
    # n00001..2 go down at 710 (down at 740); K holds n00003..4 until 720.
    # W (4 nodes, at 715) counts the powering-down nodes from 740, when
    # SuspendTimeout makes them allocatable: its reservation is at 740, so
    # L (1 node, 5000 s, at 725) may not take a free node. W is allocated
    # at 740, resumes n00001..2 (up at 1040) and runs 1040..1140; L after.
    config = default_config(node_idle_limit=600)
    jobs = [job("A", 0, 2, 100), job("K", 0, 2, 720), job("W", 715, 4, 100),
            job("L", 725, 1, 5000)]
    e = run(jobs, 4, SlurmPowerSave(config))
    assert starts(e) == {"A": 0.0, "K": 0.0, "W": 1040.0, "L": 1140.0}


def test_slurm_resume_timeout_downs_the_node_and_requeues_the_job():
    # ResumeTimeout 200 s, n00001 boots in 300 s: at 2200 it is set DOWN and
    # B goes back to the queue; it gets n00002 (boots in 100 s) at the 2200
    # pass and starts at 2300.
    config = default_config(node_idle_limit=600)
    e = Recorder([job("A", 0, 2, 100), job("B", 2000, 1, 100)], make_nodes(2, MODEL, seed=3),
                 MODEL, SlurmPowerSave(config, resume_timeout=200))
    e.nodes[1].boot_s = 100.0
    e.run()
    assert [x for x in e.log if x[1] == "up"] == [(2000.0, "up", "n00001"),
                                                   (2200.0, "up", "n00002")]
    assert e.failed == 1 and e.nodes[0].failed
    assert starts(e)["B"] == 2300.0


# -- OpenPBS PBS_power ----------------------------------------------------------

def test_openpbs_powers_off_five_idle_nodes_per_run_as_shipped():
    # Runs every 300 s (freq) from 0; nodes idle since 100 exceed 600 s at
    # 900: 5 go then (max_concurrent_nodes 5), the other 2 at 1200.
    config = default_config(node_idle_limit=600)
    e = run([job("A", 0, 7, 100), job("Z", 9000, 1, 10)], 7, OpenPBSPower(config))
    downs = [x[0] for x in e.log if x[1] == "down"]
    assert downs == [900.0] * 5 + [1200.0] * 2
    assert e.ramp_down == {15: 5 * STEP, 20: 2 * STEP}


def test_openpbs_counts_power_offs_and_wakes_apart_and_ignores_the_queue():
    # n00001..5 go off at 900. n00006..10 are idle from 1900. B (10 nodes,
    # at 2000) is the top job, estimated now on the free n00006..10 and the
    # sleeping n00001..5. At the 2700 run the hook wakes those 5 (down for
    # min_node_down_delay) and, counted apart, powers off 5 more: the idle
    # n00006..10 that B's estimate names (power-offs never look at jobs).
    config = default_config(node_idle_limit=600)
    jobs = [job("A", 0, 5, 100), job("K", 0, 5, 1900), job("B", 2000, 10, 100)]
    e = Recorder(jobs, make_nodes(10, MODEL, seed=3), MODEL, OpenPBSPower(config))
    e.run(give_up=2800.0)
    at = sorted((what, name) for t, what, name in e.log if t == 2700.0 and what in ("up", "down"))
    assert at == sorted([("up", "n%05d" % i) for i in range(1, 6)]
                        + [("down", "n%05d" % i) for i in range(6, 11)])
    assert e.unstarted == 1


def test_openpbs_wakes_only_jobs_starting_within_its_900s_assumption():
    # 3 nodes off at 900. B (1 node) at 5000 is woken at the 5100 run, starts
    # at 5400 and holds n00001 until 15400. C (3 nodes) at 5500 is estimated
    # to start at 15400: its sleeping nodes are woken only at the first run
    # with 15400 < now + 900, i.e. 14700, so C starts at 15400 with no delay.
    config = default_config(node_idle_limit=600)
    e = run([job("A", 0, 3, 100), job("B", 5000, 1, 10000), job("C", 5500, 3, 100)], 3,
            OpenPBSPower(config))
    ups = [x for x in e.log if x[1] == "up"]
    assert ups == [(5100.0, "up", "n00001"), (14700.0, "up", "n00002"),
                   (14700.0, "up", "n00003")]
    assert starts(e) == {"A": 0.0, "B": 5400.0, "C": 15400.0}
    assert waits(e)["C"] == 0.0               # B's wait: see the next test
    assert e.ramp_up == {5100 // 60: STEP, 14700 // 60: 2 * STEP}


def test_power_wait_counts_from_submission_when_every_node_is_asleep():
    """B (1 node) arrives at 5000 with every node off and starts at 5400
    only because n00001 had to boot: 400 s of power wait."""
    config = default_config(node_idle_limit=600)
    e = run([job("A", 0, 3, 100), job("B", 5000, 1, 10000)], 3, OpenPBSPower(config))
    assert starts(e)["B"] == 5400.0
    assert waits(e)["B"] == 400.0


def test_openpbs_sees_only_the_top_job_s_estimate():
    # L holds 2 of 3 nodes until 20000; n00003 goes off at 900. q (2 nodes)
    # is the top job, estimated at 20000 on L's nodes; S (1 node) behind it
    # gets no estimate (backfill_depth 1), so n00003 is never woken: S runs
    # after q, on a node that is up.
    config = default_config(node_idle_limit=600, min_node_down_delay=0)
    jobs = [job("L", 0, 2, 20000), job("q", 1000, 2, 10), job("S", 1100, 1, 10)]
    e = run(jobs, 3, OpenPBSPower(config))
    assert [x for x in e.log if x[1] == "up"] == []
    assert starts(e)["S"] == 20010.0


def test_openpbs_respects_exclude_nodes():
    config = default_config(node_idle_limit=600, exclude_nodes="n00002",
                            excluded_hosts=frozenset({"n00002"}))
    e = run([job("A", 0, 2, 100), job("Z", 3000, 1, 10)], 2, OpenPBSPower(config))
    assert [x for x in e.log if x[1] == "down"] == [(900.0, "down", "n00001")]
    assert starts(e)["Z"] == 3000.0               # on the excluded, always-up node


# -- the engine's calendar ------------------------------------------------------

def _calendar(jobs, nodes, running, queued, t, down=(), fit=False):
    """Start ``running`` by hand, put ``down`` nodes down, queue ``queued``, read the calendar."""
    e = Engine(jobs, make_nodes(nodes, MODEL), MODEL, AlwaysOn())
    e.manager.attach(e)
    for j in running:
        e.queue = [j]
        e._allocate(j, 0.0)
    for idx in down:
        e._set(e.nodes[idx], DOWN)
    e.queue = list(queued)
    return [(e.job_ids[j], at, [n.name for n in ns]) for j, at, ns in e.estimates(t, fit)]


def test_estimates_give_only_the_top_job_its_shadow_time_and_freed_nodes():
    # A holds n00001..2 until walltime 1000, n00003 is free, B needs 3
    # nodes, C 1. B, the top job: A's 2 nodes at 1000 plus n00003. C gets
    # no estimate (backfill_depth 1), and the hook's fit finds no node left.
    jobs = [job("A", 0, 2, 900, 1000), job("B", 10, 3, 10), job("C", 20, 1, 10)]
    assert _calendar(jobs, 3, [0], [1, 2], 30.0) == [
        ("B", 1000.0, ["n00001", "n00002", "n00003"])]
    assert _calendar(jobs, 3, [0], [1, 2], 30.0, fit=True) == [
        ("B", 1000.0, ["n00001", "n00002", "n00003"])]


def test_estimates_count_sleeping_nodes_now_and_the_hook_fit_adds_later_jobs():
    # A holds n00001; n00002 is free, n00003..4 are down. T (2 nodes), the
    # top job, fits now: free n00002 first, then the sleeping n00003. The
    # hook's own fit places D (1 node) on n00004, which is not up, so D is
    # listed; E (1 node) finds nothing left and takes nothing.
    jobs = [job("A", 0, 1, 900, 1000), job("T", 10, 2, 10), job("D", 20, 1, 5000),
            job("E", 30, 1, 10)]
    assert _calendar(jobs, 4, [0], [1, 2, 3], 30.0, down=(2, 3)) == [
        ("T", 30.0, ["n00002", "n00003"])]
    assert _calendar(jobs, 4, [0], [1, 2, 3], 30.0, down=(2, 3), fit=True) == [
        ("T", 30.0, ["n00002", "n00003"]), ("D", 30.0, ["n00004"])]


def test_forecast_calendar_gives_later_jobs_easy_starts():
    # The pbs-power-forecast what-if: every queued job's EASY start. A holds
    # n00001 until 1000; n00002..4 are free. B (2 nodes) fits now: n00002..3.
    # C (2) is blocked: A's node at 1000 plus n00004, held. D (1 node,
    # 5000 s) would run past 1000 and no node is left that C does not hold.
    # E (1 node, 10 s) ends long before 1000: it may use n00004 now.
    jobs = [job("A", 0, 1, 900, 1000), job("B", 10, 2, 10), job("C", 20, 2, 10),
            job("D", 25, 1, 5000), job("E", 26, 1, 10)]
    assert _calendar(jobs, 4, [0], [1, 2, 3, 4], 30.0, fit="calendar") == [
        ("B", 30.0, ["n00002", "n00003"]), ("C", 1000.0, ["n00001", "n00004"]),
        ("E", 30.0, ["n00004"])]
    # A long job that runs past the shadow takes what the top job leaves, from the back.
    jobs = [job("A", 0, 2, 900, 1000), job("T", 10, 5, 10), job("L", 20, 1, 5000),
            job("S", 30, 1, 10)]
    assert _calendar(jobs, 6, [0], [1, 2, 3], 30.0, fit="calendar") == [
        ("T", 1000.0, ["n00001", "n00002", "n00003", "n00004", "n00005"]),
        ("L", 30.0, ["n00006"]), ("S", 30.0, ["n00003"])]


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
