"""Every planner rule, on small hand-built snapshots."""
from dataclasses import replace

import pytest

from pbs_power.config.hook_config import HookConfig, NodePower
from pbs_power.states.model import (Phase, QueuedJob, RampStep, Reservation, Snapshot,
                             Transition, TransitionKind as K, Vnode)
from pbs_power.states.planner import plan

NOW = 1_700_000_000.0
HOUR = 3600.0


def cfg(**kw):
    base = dict(power_on_off_enable=True, node_idle_limit=1800, min_node_down_delay=600,
                max_concurrent_nodes=100, node_boot_time=900, cycle_interval=300)
    base.update(kw)
    if "exclude" in base:
        base["excluded_hosts"] = frozenset(base.pop("exclude"))
    return HookConfig(**base)


def idle(name, idle_for=2 * HOUR, host=None, eligible=True, **kw):
    return Vnode(name, host or name, frozenset({"free"}), eligible,
                 last_used_time=NOW - idle_for, last_state_change_time=NOW - idle_for, **kw)


def asleep(name, host=None, since=3 * HOUR):
    return Vnode(name, host or name, frozenset({"sleep"}), True,
                 last_used_time=NOW - since - 10, last_state_change_time=NOW - since)


def busy(name, host=None):
    return Vnode(name, host or name, frozenset({"job-busy"}), True,
                 last_used_time=NOW, last_state_change_time=NOW - 50, jobs=("9.svr",))


def job(jid, start, *vnodes):
    return QueuedJob(jid, start, tuple(vnodes))


def kinds(p):
    return {a.host: a.kind for a in p.actions}


def test_idle_host_past_the_limit_goes_down_and_says_why():
    p = plan(Snapshot((idle("n1"), idle("n2", idle_for=600))), cfg(), NOW)
    assert kinds(p) == {"n1": K.POWER_OFF}
    assert "idle for 7200s (node_idle_limit 1800s)" in p.actions[0].reason


def test_every_vnode_of_a_host_must_be_free_and_idle():
    vnodes = (idle("n1[0]", host="n1"), busy("n1[1]", host="n1"),
              idle("n2[0]", host="n2"), idle("n2[1]", host="n2", idle_for=HOUR))
    assert kinds(plan(Snapshot(vnodes), cfg(), NOW)) == {"n2": K.POWER_OFF}


def test_host_is_idle_since_its_most_recently_used_vnode():
    vnodes = (idle("n1[0]", host="n1"), idle("n1[1]", host="n1", idle_for=100))
    assert plan(Snapshot(vnodes), cfg(), NOW).actions == ()


@pytest.mark.parametrize("state", [{"offline"}, {"down"}, {"free", "offline"},
                                   {"job-exclusive"}, {"resv-exclusive"}, {"provisioning"}])
def test_unavailable_or_busy_states_never_go_down(state):
    v = replace(idle("n1"), states=frozenset(state))
    assert plan(Snapshot((v,)), cfg(), NOW).actions == ()


def test_poweroff_eligible_false_on_any_vnode_keeps_the_host_up():
    vnodes = (idle("a[0]", host="a"), idle("a[1]", host="a", eligible=False),
              idle("b", eligible=False))
    assert plan(Snapshot(vnodes), cfg(), NOW).actions == ()


def test_excluded_hosts_stay_up():
    p = plan(Snapshot((idle("login1"), idle("n1"))), cfg(exclude={"login1"}), NOW)
    assert kinds(p) == {"n1": K.POWER_OFF}


def test_host_in_an_active_reservation_stays_up():
    v = replace(idle("n1"), resvs=("R5.svr",))
    assert plan(Snapshot((v,)), cfg(), NOW).actions == ()


def test_host_that_just_came_back_up_is_idle_only_since_then():
    woke = Vnode("n1", "n1", frozenset({"free"}), True,
                 last_used_time=NOW - 10 * HOUR, last_state_change_time=NOW - 600)
    assert plan(Snapshot((woke,)), cfg(), NOW).actions == ()


def test_host_without_any_time_is_left_alone_with_a_note():
    v = Vnode("n1", "n1", frozenset({"free"}), True)
    p = plan(Snapshot((v,)), cfg(), NOW)
    assert p.actions == () and any("no last_used_time" in n for n in p.notes)


def test_never_power_off_a_host_a_queued_job_needs_within_boot_plus_down_delay():
    c = cfg(node_boot_time=900, min_node_down_delay=600, cycle_interval=300)
    soon = NOW + 900 + 600 + 300 - 1          # could not rest and boot in time
    later = NOW + 900 + 600 + 300 + 60
    p = plan(Snapshot((idle("n1"), idle("n2")),
                      queued_jobs=(job("1.s", soon, "n1"), job("2.s", later, "n2"))), c, NOW)
    assert kinds(p) == {"n2": K.POWER_OFF}


def test_never_power_off_a_host_a_reservation_needs_soon():
    resv = Reservation("R1.s", NOW + 1200, NOW + 5000, ("n1",))
    p = plan(Snapshot((idle("n1"), idle("n2")), reservations=(resv,)), cfg(), NOW)
    assert kinds(p) == {"n2": K.POWER_OFF}


def test_job_without_estimated_start_counts_as_needing_its_hosts_now():
    p = plan(Snapshot((idle("n1"),), queued_jobs=(job("1.s", None, "n1"),)), cfg(), NOW)
    assert p.actions == ()


def test_sleeping_host_wakes_when_the_next_cycle_would_be_too_late():
    # The lead is the boot plus one cycle: the run after the boot hands the host back.
    c = cfg(node_boot_time=900, cycle_interval=300)
    in_time = NOW + 900 + 300 + 300 - 1    # waiting a cycle would be late
    early = NOW + 900 + 300 + 300 + 1      # next cycle is still in time
    p = plan(Snapshot((asleep("n1"), asleep("n2")),
                      queued_jobs=(job("1.s", in_time, "n1"), job("2.s", early, "n2"))), c, NOW)
    assert kinds(p) == {"n1": K.POWER_ON}
    assert "job 1.s needs it at" in p.actions[0].reason and "~900s" in p.actions[0].reason


def test_overdue_job_wakes_its_host():
    p = plan(Snapshot((asleep("n1"),), queued_jobs=(job("1.s", NOW - 60, "n1"),)), cfg(), NOW)
    assert kinds(p) == {"n1": K.POWER_ON}


def test_reservation_wakes_its_hosts_ahead_of_start():
    resv = Reservation("R2.s", NOW + 1000, NOW + 9000, ("n1",))
    p = plan(Snapshot((asleep("n1"),), reservations=(resv,)), cfg(), NOW)
    assert kinds(p) == {"n1": K.POWER_ON} and "reservation R2.s" in p.actions[0].reason


def test_measured_boot_time_replaces_the_default():
    start = NOW + 1000                      # default 900 + 300 cycle would wake now
    snap = Snapshot((asleep("n1"), asleep("n2")),
                    queued_jobs=(job("1.s", start, "n1", "n2"),),
                    boot_times={"n1": {"power_on": 200.0}})
    p = plan(snap, cfg(), NOW)
    assert kinds(p) == {"n2": K.POWER_ON}    # n1 boots in 200 s: next cycle is fine


def test_fleet_estimate_used_for_hosts_never_measured():
    snap = Snapshot((asleep("n1"),), queued_jobs=(job("1.s", NOW + 1000, "n1"),),
                    boot_times={"*": {"power_on": 120.0}})
    assert plan(snap, cfg(), NOW).actions == ()
    slow = replace(snap, boot_times={"*": {"power_on": 1500.0}})
    assert kinds(plan(slow, cfg(), NOW)) == {"n1": K.POWER_ON}


def test_every_queued_job_is_analysed_not_the_first_hundred():
    jobs = tuple(job("%d.s" % i, NOW + 10 * HOUR, "busy%d" % i) for i in range(500))
    jobs += (job("999.s", NOW + 100, "n1"),)
    vnodes = tuple(busy("busy%d" % i) for i in range(500)) + (asleep("n1"),)
    assert kinds(plan(Snapshot(vnodes, queued_jobs=jobs), cfg(), NOW)) == {"n1": K.POWER_ON}


def test_earliest_needed_comes_up_first_under_max_concurrent_nodes():
    vnodes = tuple(asleep("n%d" % i) for i in range(4))
    jobs = tuple(job("%d.s" % i, NOW + 100 * (4 - i), "n%d" % i) for i in range(4))
    p = plan(Snapshot(vnodes, queued_jobs=jobs), cfg(max_concurrent_nodes=2), NOW)
    assert [a.host for a in p.actions] == ["n3", "n2"]
    assert {d.host for d in p.deferred} == {"n1", "n0"}
    assert all("max_concurrent_nodes=2" in d.reason for d in p.deferred)


def test_max_concurrent_nodes_counts_transitions_still_in_flight():
    flying = tuple(Transition("f%d" % i, K.POWER_ON, Phase.POWERING_UP, NOW - 100, NOW - 100)
                   for i in range(3))
    vnodes = tuple(idle("n%d" % i) for i in range(4))
    p = plan(Snapshot(vnodes, transitions=flying), cfg(max_concurrent_nodes=5), NOW)
    assert len(p.actions) == 2 and len(p.deferred) == 2


def test_hosts_already_on_and_waiting_for_the_scheduler_hold_no_slot():
    booting = tuple(Transition("f%d" % i, K.POWER_ON, Phase.BOOTING, NOW - 100, NOW - 50)
                    for i in range(3))
    vnodes = tuple(idle("n%d" % i) for i in range(4))
    p = plan(Snapshot(vnodes, transitions=booting), cfg(max_concurrent_nodes=5), NOW)
    assert len(p.actions) == 4 and p.deferred == ()


def test_hosts_in_flight_are_not_planned_again():
    t = Transition("n1", K.POWER_OFF, Phase.DRAINING, NOW - 300, NOW - 300)
    p = plan(Snapshot((asleep("n1"),), queued_jobs=(job("1.s", NOW, "n1"),), transitions=(t,)),
             cfg(), NOW)
    assert p.actions == ()


def test_bringing_up_goes_before_taking_down():
    vnodes = (idle("a"), idle("b"), asleep("c"))
    p = plan(Snapshot(vnodes, queued_jobs=(job("1.s", NOW, "c"),)),
             cfg(max_concurrent_nodes=1), NOW)
    assert kinds(p) == {"c": K.POWER_ON}


def test_longest_idle_goes_down_first():
    vnodes = (idle("a", idle_for=2 * HOUR), idle("b", idle_for=5 * HOUR),
              idle("c", idle_for=3 * HOUR))
    p = plan(Snapshot(vnodes), cfg(max_concurrent_nodes=2), NOW)
    assert [a.host for a in p.actions] == ["b", "c"]


def test_recently_downed_host_stays_down_for_the_warm_pool():
    snap = Snapshot((asleep("n1"),), down_since={"n1": NOW - 100})
    p = plan(snap, cfg(min_idle_nodes=1, min_node_down_delay=1800), NOW)
    assert p.actions == ()
    assert "min_node_down_delay" in p.deferred[0].reason


def test_recently_downed_host_wakes_when_a_job_would_otherwise_wait():
    snap = Snapshot((asleep("n1"),), down_since={"n1": NOW - 100},
                    queued_jobs=(job("1.s", NOW + 60, "n1"),))
    p = plan(snap, cfg(min_node_down_delay=3000), NOW)
    assert kinds(p) == {"n1": K.POWER_ON}


def test_down_delay_defers_a_reservation_wake_that_can_wait():
    # Rest ends in 200 s; booting after that still meets the reservation.
    resv = Reservation("R1.s", NOW + 1150, NOW + 5000, ("n1",))
    snap = Snapshot((asleep("n1"),), reservations=(resv,), down_since={"n1": NOW - 400})
    p = plan(snap, cfg(min_node_down_delay=600, node_boot_time=900), NOW)
    assert p.actions == () and "min_node_down_delay" in p.deferred[0].reason


def test_min_idle_nodes_keeps_a_warm_pool_up():
    vnodes = tuple(idle("n%d" % i, idle_for=(10 - i) * HOUR) for i in range(5))
    p = plan(Snapshot(vnodes), cfg(min_idle_nodes=2), NOW)
    assert [a.host for a in p.actions] == ["n0", "n1", "n2"]
    assert any("min_idle_nodes=2" in n for n in p.notes)


def test_min_idle_nodes_wakes_sleepers_when_the_pool_is_short():
    vnodes = (idle("a", idle_for=60), asleep("b"), asleep("c"), asleep("d"))
    p = plan(Snapshot(vnodes), cfg(min_idle_nodes=3), NOW)
    assert len(p.actions) == 2 and all(a.kind is K.POWER_ON for a in p.actions)
    assert "warm pool" in p.actions[0].reason


def test_hosts_earmarked_by_jobs_do_not_count_as_warm_pool():
    vnodes = (idle("a", idle_for=60), asleep("b"))
    snap = Snapshot(vnodes, queued_jobs=(job("1.s", NOW + 2500, "a"),))
    assert kinds(plan(snap, cfg(min_idle_nodes=1), NOW)) == {"b": K.POWER_ON}


def test_ramp_limit_spreads_power_ons_over_cycles():
    power = NodePower(busy_watts=800, idle_watts=300, sleep_watts=100, off_watts=0)
    vnodes = tuple(asleep("n%d" % i) for i in range(5))
    jobs = (job("1.s", NOW, *["n%d" % i for i in range(5)]),)
    c = cfg(max_ramp_watts_per_minute=1000, node_power=power)
    p = plan(Snapshot(vnodes, queued_jobs=jobs), c, NOW)
    assert len(p.actions) == 3 and sum(a.watts for a in p.actions) == 900
    assert all("max_ramp_watts_per_minute=1000" in d.reason for d in p.deferred)


def test_ramp_limit_counts_steps_already_taken_this_minute():
    power = NodePower(idle_watts=300, off_watts=0)
    steps = (RampStep(NOW - 30, "x", 800.0),)
    snap = Snapshot((asleep("n1"),), queued_jobs=(job("1.s", NOW, "n1"),), recent_steps=steps)
    c = cfg(max_ramp_watts_per_minute=1000, node_power=power)
    assert plan(snap, c, NOW).actions == ()
    old = replace(snap, recent_steps=(RampStep(NOW - 61, "x", 800.0),))
    assert kinds(plan(old, c, NOW)) == {"n1": K.POWER_ON}


def test_ramp_limit_applies_to_power_downs_separately():
    power = NodePower(idle_watts=300, off_watts=0)
    vnodes = tuple(idle("n%d" % i) for i in range(4)) + (asleep("s"),)
    snap = Snapshot(vnodes, queued_jobs=(job("1.s", NOW, "s"),))
    p = plan(snap, cfg(max_ramp_watts_per_minute=600, node_power=power), NOW)
    ups = [a for a in p.actions if a.kind is K.POWER_ON]
    downs = [a for a in p.actions if a.kind is K.POWER_OFF]
    assert len(ups) == 1 and len(downs) == 2


def test_disabled_takes_nothing_down_but_still_wakes_for_work():
    c = cfg(power_on_off_enable=False)
    snap = Snapshot((idle("a"), asleep("b")), queued_jobs=(job("1.s", NOW, "b"),))
    p = plan(snap, c, NOW)
    assert kinds(p) == {"b": K.POWER_ON}
    assert any("disabled" in n for n in p.notes)


def test_ramp_rate_mode_sleeps_and_wakes_with_wake_time():
    c = cfg(power_on_off_enable=False, power_ramp_rate_enable=True, node_wake_time=60)
    snap = Snapshot((idle("a"), asleep("b"), asleep("c")),
                    queued_jobs=(job("1.s", NOW + 200, "b"), job("2.s", NOW + 900, "c")))
    assert kinds(plan(snap, c, NOW)) == {"a": K.SLEEP, "b": K.WAKE}


def test_both_enables_power_on_off_wins():
    c = cfg(power_on_off_enable=True, power_ramp_rate_enable=True)
    assert kinds(plan(Snapshot((idle("a"),)), c, NOW)) == {"a": K.POWER_OFF}


def test_plan_is_deterministic_and_pure():
    vnodes = tuple(idle("n%d" % i, idle_for=HOUR + i) for i in range(20))
    snap = Snapshot(vnodes)
    assert plan(snap, cfg(max_concurrent_nodes=7), NOW) == plan(snap, cfg(max_concurrent_nodes=7), NOW)
