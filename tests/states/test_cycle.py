"""The periodic cycle over several runs: real SQLite store, simulated backend."""
from dataclasses import replace

import pytest

from pbs_power.config.hook_config import BackendConfig, HookConfig, NodePower
from pbs_power.states.cycle import Cycle
from pbs_power.devices import get_backend
from pbs_power.states.model import Phase, TransitionKind as K
from pbs_power.sim.cluster import SimCluster
from pbs_power.sim.workload import SimJob
from pbs_power.states.store import Store

T0 = 1_800_000_000.0


@pytest.fixture
def rig(tmp_path):
    """A 4-host simulated cluster idle for two hours, with store and backend."""
    def make(**kw):
        opts = {"boot_seconds": 200, "shutdown_seconds": 30}
        opts.update(kw.pop("backend", {}))
        cfg = HookConfig(**dict(dict(
            power_on_off_enable=True, node_idle_limit=1800, min_node_down_delay=0,
            max_concurrent_nodes=10, node_boot_time=900, boot_timeout=1200,
            cycle_interval=300, power_backend=BackendConfig("simulated", opts),
            state_dir=str(tmp_path)), **kw))
        backend = get_backend(cfg.power_backend, cfg.state_dir)
        store = Store.open(cfg.state_dir)
        logs = []
        cycle = Cycle(cfg, store, backend, lambda lvl, msg: logs.append((lvl, msg)))
        cluster = SimCluster(["n1", "n2", "n3", "n4"], NodePower(), backend, T0 - 7200)
        return cfg, cycle, cluster, store, logs
    return make


def run(cycle, cluster, now, arrivals=()):
    cluster.step(now, list(arrivals))
    report = cycle.run(cluster.snapshot(now), now)
    cluster.apply(report.marks, now)
    cluster.step(now, [])
    return report


def test_idle_hosts_drain_then_power_off_then_record_down(rig):
    cfg, cycle, cluster, store, logs = rig()
    first = run(cycle, cluster, T0)
    assert sorted(first.marked(True)) == ["n1", "n2", "n3", "n4"]
    assert {t.phase for t in store.transitions()} == {Phase.DRAINING}
    run(cycle, cluster, T0 + 300)
    assert {t.phase for t in store.transitions()} == {Phase.POWERING_DOWN}
    assert any("power_off sent" in m for _, m in logs)
    third = run(cycle, cluster, T0 + 600)
    assert store.transitions() == () and len(third.completed) == 4
    assert set(store.down_since()) == {"n1", "n2", "n3", "n4"}
    assert store.durations("n1", K.POWER_OFF) == (30.0,)


def test_job_placed_during_drain_is_never_cut_off(rig):
    cfg, cycle, cluster, store, logs = rig()
    run(cycle, cluster, T0)
    # The scheduler started a job on n1 before it saw the sleep mark.
    cluster.sleep_marked.discard("n1")
    job = SimJob("7.sim", T0 + 10, 1, 5000, 6000)
    cluster.step(T0 + 10, [job])
    cluster.sleep_marked.add("n1")
    report = cycle.run(cluster.snapshot(T0 + 300), T0 + 300)
    assert "n1" in report.marked(False)
    assert any("drain cancelled: job 7.sim landed" in m for _, m in logs)
    assert "n1" not in {t.host for t in store.transitions()}


def test_sleeping_host_wakes_for_a_queued_job_and_its_boot_time_is_learned(rig):
    cfg, cycle, cluster, store, logs = rig()
    for i in range(3):
        run(cycle, cluster, T0 + 300 * i)
    assert len(cluster.sleep_marked) == 4
    job = SimJob("9.sim", T0 + 1000, 2, 600, 1200)
    now = T0 + 900
    report = run(cycle, cluster, now, [job])
    assert sorted(t.host for t in report.started if t.kind is K.POWER_ON) == ["n1", "n2"]
    while job.start is None and now < T0 + 3000:
        now += 60
        cluster.step(now, [])
        if (now - T0) % 300 == 0:
            run(cycle, cluster, now)
    assert job.start is not None and job.start <= now
    run(cycle, cluster, now + 300)              # the cycle that sees it usable
    learned = store.duration_estimates()
    assert 200 <= learned["n1"]["power_on"] <= 500


def test_host_that_never_boots_ends_offline_with_a_comment(rig):
    cfg, cycle, cluster, store, logs = rig(backend={"fail_nodes": "n2"})
    for i in range(3):
        run(cycle, cluster, T0 + 300 * i)
    job = SimJob("5.sim", T0 + 900, 2, 600, 1200)
    now = T0 + 900
    run(cycle, cluster, now, [job])
    failed = None
    while now < T0 + 900 + cfg.boot_timeout + 600:
        now += 300
        report = run(cycle, cluster, now)
        failed = failed or (report.failed and report)
    assert failed and [o.transition.host for o in failed.failed] == ["n2"]
    assert "n2" in cluster.offline
    assert "did not power on within boot_timeout=1200s" in cluster.comments["n2"]
    assert "n2" in store.failed()
    # Offline hosts are not retried: no new power_on for n2 afterwards.
    later = run(cycle, cluster, now + 300)
    assert "n2" not in {t.host for t in later.started}


def test_overlapping_run_does_nothing(rig):
    cfg, cycle, cluster, store, logs = rig()
    with store.cycle_lock() as held:
        assert held
        other = Store.open(cfg.state_dir)
        try:
            report = Cycle(cfg, other, cycle.backend, lambda *a: logs.append(a)).run(
                cluster.snapshot(T0), T0)
        finally:
            other.close()
    assert not report.ran and report.marks == []
    assert ("warning", "previous cycle still running; this run does nothing") in logs


def test_max_concurrent_nodes_holds_across_cycles(rig):
    cfg, cycle, cluster, store, logs = rig(max_concurrent_nodes=2)
    seen = []
    for i in range(8):
        run(cycle, cluster, T0 + 300 * i)
        seen.append(len(store.transitions()))
    assert max(seen) == 2 and len(cluster.sleep_marked) == 4


def test_ramp_steps_are_recorded_when_commands_are_sent(rig):
    power = NodePower(idle_watts=300, off_watts=20)
    cfg, cycle, cluster, store, logs = rig(node_power=power, max_ramp_watts_per_minute=600)
    run(cycle, cluster, T0)
    assert len(cluster.sleep_marked) == 2          # 2 x 280 W fits, a third does not
    run(cycle, cluster, T0 + 300)
    assert [s.watts for s in store.recent_steps(T0)] == [-280.0, -280.0]


def test_snapshot_from_scheduler_without_the_host_forgets_its_transition(rig):
    cfg, cycle, cluster, store, logs = rig()
    run(cycle, cluster, T0)
    snap = cluster.snapshot(T0 + 300)
    smaller = replace(snap, vnodes=tuple(v for v in snap.vnodes if v.name != "n4"))
    cycle.run(smaller, T0 + 300)
    assert "n4" not in {t.host for t in store.transitions()}


def test_host_comes_back_with_the_command_its_power_state_needs(rig):
    cfg, cycle, cluster, store, logs = rig()
    for i in range(3):
        run(cycle, cluster, T0 + 300 * i)                 # powered off
    ramp = replace(cfg, power_on_off_enable=False, power_ramp_rate_enable=True)
    switched = Cycle(ramp, store, cycle.backend, lambda lvl, msg: logs.append((lvl, msg)))
    report = run(switched, cluster, T0 + 900, [SimJob("3.sim", T0 + 900, 1, 600, 900)])
    assert [t.kind for t in report.started] == [K.POWER_ON]


def test_failed_host_is_forgotten_once_an_admin_clears_offline(rig):
    cfg, cycle, cluster, store, logs = rig()
    store.mark_failed("n3", "did not power on", T0 - 100)
    run(cycle, cluster, T0)
    assert "n3" not in store.failed()
    assert ("info", "n3: back in service (offline cleared)") in logs


def test_drained_host_a_job_now_needs_is_handed_back_not_powered_off(rig):
    cfg, cycle, cluster, store, logs = rig()
    run(cycle, cluster, T0)                       # all four drained (sleep mark)
    # A 4-host job arrives: the calendar puts it on the drained hosts, now.
    job = SimJob("8.sim", T0 + 100, 4, 600, 900)
    cluster.step(T0 + 100, [job])
    report = cycle.run(cluster.snapshot(T0 + 300), T0 + 300)
    assert sorted(report.marked(False)) == ["n1", "n2", "n3", "n4"]
    assert store.transitions() == ()
    assert not any("power_off sent" in m for _, m in logs)
    assert any(m.startswith("n1: drain cancelled: job 8.sim needs it at ") for _, m in logs)


def test_drained_host_needed_only_later_still_goes_down(rig):
    # The job needs the hosts in 3 hours: later than a power-off, the rest
    # and a 900 s boot, so the drain goes on.
    cfg, cycle, cluster, store, logs = rig()
    run(cycle, cluster, T0)
    snap = cluster.snapshot(T0 + 300)
    from pbs_power.states.model import QueuedJob
    later = replace(snap, queued_jobs=(QueuedJob("9.sim", T0 + 300 + 3 * 3600,
                                                 ("n1", "n2")),))
    cycle.run(later, T0 + 300)
    assert {t.phase for t in store.transitions()} == {Phase.POWERING_DOWN}
