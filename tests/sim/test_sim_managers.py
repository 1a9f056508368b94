"""The pbs-power manager in the SIMULATED cluster, the comparison metrics, the
report and the ``pbs-power simulate`` command.

The pbs-power manager runs the real `Cycle` (reconcile, planner, marks) over
an in-memory store; expected times are worked out by hand from the planner's
rules (comments give the arithmetic). Boots take exactly 300 s, shutdowns 30 s.
"""
from __future__ import annotations

import gzip
import json
import random

import pytest

from pbs_power.cli.main import main
from pbs_power.config.hook_config import NodePower
from pbs_power.states.model import FREE, Phase, QueuedJob, Reservation, Snapshot, Transition, \
    TransitionKind, Vnode
from pbs_power.states.planner import plan
from pbs_power.sim import report
from pbs_power.sim.engine import Engine
from pbs_power.sim.managers import PbsPower
from pbs_power.sim.nodes import DOWN, make_nodes
from pbs_power.sim.managers import AlwaysOn
from pbs_power.sim.simulate import _metrics, default_config, simulate
from pbs_power.sim.swf import read_sample

from sim_helpers import MODEL, STEP, job, run, starts


# -- pbs-power in the simulator ----------------------------------------------------

def test_pbs_power_drains_in_one_cycle_and_powers_off_in_the_next():
    # Idle since 100: 800 s >= node_idle_limit 600 at the 900 cycle: marked
    # asleep; the 1200 cycle sees them asleep and empty and powers them off.
    # Z at 10000 needs one node: woken at the 10200 cycle, back at 10500,
    # where the cycle clears its mark and Z starts.
    manager = PbsPower(default_config(node_idle_limit=600), 300)
    e = run([job("A", 0, 2, 100), job("Z", 10000, 1, 10)], 2, manager)
    assert e.log == [(900.0, "sleep", "n00001"), (900.0, "sleep", "n00002"),
                     (1200.0, "down", "n00001"), (1200.0, "down", "n00002"),
                     (10200.0, "up", "n00001"), (10500.0, "wake", "n00001")]
    assert starts(e) == {"A": 0.0, "Z": 10500.0}
    assert manager.store.durations("n00001", "power_off") == (300.0,)   # 1200 -> 1500 cycle


def test_a_host_its_bmc_reports_on_frees_its_slot_before_its_system_is_up():
    # max_concurrent_nodes=2, all four nodes off by 900. Z (4 nodes) arrives
    # at 10000: the 10020 run powers on n00001-2. Their BMCs report them on at
    # 10030 (power_on_seconds 10), so at the 10080 run they are booting (they
    # hold no slot; shown down, they keep their sleep mark) and it powers on
    # n00003-4, 240 s before the first pair is up. Each sleep mark goes when
    # the node's MoM registers at its boot's end (10320, 10380: the "wake"
    # entries), and Z starts at 10380; a BMC that reported "on" only once the
    # system was up would have held the slots until 10320 and started Z at
    # 10620.
    config = default_config(node_idle_limit=600, max_concurrent_nodes=2,
                            min_node_down_delay=0, cycle_interval=60)
    e = run([job("A", 0, 4, 100), job("Z", 10000, 4, 10)], 4, PbsPower(config, 60))
    assert MODEL.power_on_seconds == 10.0 and MODEL.boot_seconds == 300.0
    assert [entry for entry in e.log if entry[0] >= 10000] == [
        (10020.0, "up", "n00001"), (10020.0, "up", "n00002"),
        (10080.0, "up", "n00003"), (10080.0, "up", "n00004"),
        (10320.0, "wake", "n00001"), (10320.0, "wake", "n00002"),
        (10380.0, "wake", "n00003"), (10380.0, "wake", "n00004")]
    assert starts(e)["Z"] == 10380.0


def _blocked_pair(boot_guess: int):
    """L1 holds n00001 until 3100; n00002 is idle from 0, drained at 600 and
    off at 900. B1 (2 nodes, at 1000) is estimated to start at 3100."""
    config = default_config(node_idle_limit=600, node_boot_time=boot_guess,
                            min_node_down_delay=0, cycle_interval=300)
    return config, [job("L1", 0, 1, 3100), job("B1", 1000, 2, 1000)]


def test_pbs_power_wakes_ahead_of_the_estimated_start_when_boot_time_is_known():
    # Boot time 300 known: the wake is due once 3100 - 300 (boot) - 300 (the
    # run that hands the host back) = 2500 <= now + 300: at the 2400 cycle
    # (2100 + 300 < 2500); up at 2700 and handed back by the 2700 cycle, so B1
    # starts at 3100 with no power delay.
    config, jobs = _blocked_pair(300)
    e = run(jobs, 2, PbsPower(config, 300))
    assert [x for x in e.log if x[1] in ("down", "up")] == \
        [(900.0, "down", "n00002"), (2400.0, "up", "n00002")]
    assert starts(e) == {"L1": 0.0, "B1": 3100.0}
    assert list(e.power_wait) == [0.0, 0.0]


def test_pbs_power_learns_a_node_s_boot_time_and_then_wakes_it_in_time():
    # Cycles of 60 s. n00002 is drained at 600 and off at 660. node_boot_time
    # 60 is too optimistic: B1 is estimated at 3100, the wake is due once
    # 3100 - 60 (boot) - 60 (the run that hands it back) <= now + 60, at the
    # 2940 cycle; up at 3240, B1 waits 140 s for power. The boot is measured
    # (2940 -> 3240: 300 s). B1 ends at 4240, n00002 is drained at 4860 (idle
    # 620 s) and off at 4920; B2 is estimated at 12400 (L2's end) and, with
    # the learned 300 s, woken at 12000 (12400 - 300 - 60 <= 12000 + 60 but
    # > 11940 + 60): up at 12300, no delay this time.
    config = default_config(node_idle_limit=600, node_boot_time=60,
                            min_node_down_delay=0, cycle_interval=60)
    jobs = [job("L1", 0, 1, 3100), job("B1", 1000, 2, 1000), job("L2", 4400, 1, 8000),
            job("B2", 6000, 2, 100)]
    manager = PbsPower(config, 60)
    e = run(jobs, 2, manager)
    assert [x for x in e.log if x[1] in ("down", "up")] == \
        [(660.0, "down", "n00002"), (2940.0, "up", "n00002"),
         (4920.0, "down", "n00002"), (12000.0, "up", "n00002")]
    assert starts(e) == {"L1": 0.0, "B1": 3240.0, "L2": 4400.0, "B2": 12400.0}
    assert dict(zip(e.job_ids, e.power_wait)) == {"L1": 0.0, "B1": 140.0, "L2": 0.0,
                                                 "B2": 0.0}
    assert manager.store.duration_estimates("power_on") == {"n00002": {"power_on": 300.0}}


def test_pbs_power_min_idle_nodes_keeps_a_spare_up_and_refills_it():
    # 3 idle nodes, min_idle_nodes 1: two are drained (longest idle, then by
    # name), n00003 stays up. Z takes n00003 at 5000 with no wait; the 5100
    # cycle finds no spare and wakes the node down longest (n00001).
    manager = PbsPower(default_config(node_idle_limit=600, min_idle_nodes=1), 300)
    e = run([job("A", 0, 3, 100), job("Z", 5000, 1, 3000)], 3, manager)
    assert e.log == [(900.0, "sleep", "n00001"), (900.0, "sleep", "n00002"),
                     (1200.0, "down", "n00001"), (1200.0, "down", "n00002"),
                     (5100.0, "up", "n00001"), (5400.0, "wake", "n00001")]
    assert starts(e)["Z"] == 5000.0 and e.power_wait[1] == 0.0
    assert [n.downs for n in e.nodes] == [1, 1, 0]


def _random_world(rng: random.Random, now: float):
    """Vnodes (busy, idle, asleep), transitions, queued jobs and a reservation."""
    hosts = ["h%02d" % i for i in range(14)]
    vnodes, busy = [], set()
    down_since, boot_times = {}, {}
    for h in hosts:
        what = rng.choice(("busy", "busy", "idle", "idle", "asleep"))
        if what == "busy":
            busy.add(h)
            vnodes.append(Vnode(h, h, frozenset({"job-exclusive"}), True,
                                now - rng.uniform(0, 5000), now - rng.uniform(0, 5000),
                                jobs=("r.%s" % h,)))
        elif what == "idle":
            used = now - rng.uniform(0, 3000)
            vnodes.append(Vnode(h, h, frozenset({FREE}), rng.random() < 0.9,
                                used, used - rng.uniform(0, 200)))
        else:
            vnodes.append(Vnode(h, h, frozenset({"sleep"}), True, now - 5000, now - 4000))
            if rng.random() < 0.7:
                down_since[h] = now - rng.uniform(0, 2500)
        if rng.random() < 0.3:
            boot_times[h] = {"power_on": float(rng.randrange(100, 1500))}
    transitions = []
    for h in rng.sample(hosts, 3):
        if h in busy:      # came up for a job: still BOOTING, and busy
            transitions.append(Transition(h, TransitionKind.POWER_ON, Phase.BOOTING,
                                          now - 400, now - 100))
        else:
            transitions.append(Transition(h, TransitionKind.POWER_ON, Phase.POWERING_UP,
                                          now - 200, now - 200))
    jobs = tuple(QueuedJob("q%d" % i, rng.choice([None, now, now + rng.uniform(0, 4000)]),
                           tuple(rng.sample(hosts, rng.randint(1, 5))))
                 for i in range(rng.randint(0, 6)))
    resv = (Reservation("R1", now + rng.uniform(0, 3000), now + 9000,
                        tuple(rng.sample(hosts, 2))),) if rng.random() < 0.5 else ()
    full = Snapshot(tuple(vnodes), jobs, resv, tuple(transitions), boot_times, down_since)
    in_flight = {t.host for t in transitions}
    reduced = Snapshot(tuple(v for v in vnodes if v.host not in busy or v.host in in_flight),
                       jobs, resv, tuple(transitions), boot_times, down_since)
    return full, reduced


def test_leaving_busy_hosts_out_of_the_snapshot_does_not_change_the_plan():
    """What `PbsPower.snapshot` does to save time must not change any decision."""
    rng = random.Random(2024)
    now = 1.7e9
    kinds = {"up": 0, "down": 0, "cut": 0}
    for _ in range(300):
        config = default_config(
            node_idle_limit=600, min_idle_nodes=rng.choice((0, 1, 3)),
            max_concurrent_nodes=rng.choice((2, 6)), min_node_down_delay=rng.choice((0, 1800)),
            max_ramp_watts_per_minute=rng.choice((None, 600.0)), node_power=NodePower())
        full, reduced = _random_world(rng, now)
        kinds["cut"] += len(reduced.vnodes) < len(full.vnodes)
        got, want = plan(reduced, config, now), plan(full, config, now)
        assert got.actions == want.actions
        assert got.deferred == want.deferred and got.notes == want.notes
        for a in want.actions:
            kinds["down" if a.kind.is_down else "up"] += 1
    # the worlds do leave hosts out, and exercise both rules
    assert kinds["cut"] > 200 and kinds["up"] > 50 and kinds["down"] > 50


def test_pbs_power_snapshot_lists_only_hosts_it_may_act_on():
    manager = PbsPower(default_config(node_idle_limit=600), 300, prune=False)
    e = Engine([job("A", 0, 1, 100), job("B", 0, 2, 50)], make_nodes(2, MODEL), MODEL, manager)
    manager.attach(e)
    e.queue = [0, 1]
    e._schedule(0.0)                              # A starts on n00001; B waits
    snap = manager.snapshot(0.0)
    assert [v.name for v in snap.vnodes] == ["n00002"]    # busy n00001 is left out
    assert snap.queued_jobs == (QueuedJob("B", 100.0, ("n00001", "n00002")),)
    manager.prune = True                          # idle 0 s of node_idle_limit 600: out too
    assert [v.name for v in manager.snapshot(0.0).vnodes] == []
    assert [v.name for v in manager.snapshot(600.0).vnodes] == ["n00002"]


def test_pbs_power_snapshot_leaves_out_powered_down_hosts_no_job_names():
    manager = PbsPower(default_config(node_idle_limit=600), 300)
    e = Engine([job("A", 0, 2, 100)], make_nodes(3, MODEL), MODEL, manager)
    manager.attach(e)
    for node in e.nodes[1:]:
        e._set(node, DOWN)
    assert [v.name for v in manager.snapshot(0.0).vnodes] == []
    e.queue = [0]                 # A's estimate: free n00001, then powered-down n00002
    e.version += 1                # (an arrival, as the engine counts it)
    assert [n.name for _j, _t, nodes in e.estimates(0.0) for n in nodes] == ["n00001", "n00002"]
    assert [v.name for v in manager.snapshot(0.0).vnodes] == ["n00002"]
    manager.cfg = default_config(node_idle_limit=600, min_idle_nodes=1)
    assert len(manager.snapshot(0.0).vnodes) == 3     # a warm pool counts every host


# -- the comparison ---------------------------------------------------------------

#: 8 nodes busy 0..100, all idle until B needs all 8 at 20000.
EIGHT = [job("A", 0, 8, 100), job("B", 20000, 8, 100)]
RAMP = dict(node_idle_limit=600, max_ramp_watts_per_minute=500.0, node_power=NodePower(),
            max_concurrent_nodes=5)


def _by_name(result):
    return {m.manager: m for m in result.metrics}


def test_simulate_metrics_against_always_on_by_hand():
    result = simulate(EIGHT, 8, MODEL, default_config(**RAMP), ["openpbs", "slurm"], cycle=300)
    m = _by_name(result)
    assert [x.manager for x in result.metrics] == ["always-on", "openpbs", "slurm"]
    # Every manager's energy over the same interval: the first submission to
    # the last submission plus its walltime (B: 20000 + 100), not to the
    # latest end among the managers.
    assert (result.jobs, result.nodes, result.span_s) == (2, 8, 20100.0)
    base = 3600 * 100 + 2000 * 19900 + 3600 * 100
    on = m["always-on"]
    assert on.energy_kwh == pytest.approx(base / 3.6e6, rel=1e-12)
    assert (on.saved_pct, on.added_wait_mean_s, on.added_wait_p95_s, on.added_wait_max_s,
            on.start_change_mean_s, on.wait_mean_s, on.jobs_delayed_pct,
            on.power_cycles_per_node_day, on.peak_ramp_w_per_min,
            on.minutes_over_ramp_limit) == (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
    # openpbs (freq 300, 5 per run): 5 off at 900, 3 at 1200 (30 s each); B
    # queued at 20000, 5 woken at 20100, 3 at 20400, all up at 20700: B
    # starts 700 s late. Energy stops at 20100 for every manager.
    op = m["openpbs"]
    joules = (3600 * 100 + 2000 * 800 + 2000 * 30 + (5 * 10 + 3 * 250) * 270
              + (5 * 10 + 3 * 250) * 30 + 8 * 10 * (20100 - 1230))
    assert op.energy_kwh == pytest.approx(joules / 3.6e6, rel=1e-12)
    assert op.saved_pct == pytest.approx(100.0 * (base - joules) / base, rel=1e-12)
    assert (op.added_wait_mean_s, op.added_wait_p95_s, op.added_wait_max_s) == (350.0, 700.0, 700.0)
    assert op.start_change_mean_s == 350.0 and op.wait_mean_s == 350.0
    assert op.jobs_delayed_pct == 50.0
    assert op.power_cycles_per_node_day == pytest.approx(8 / (8 * 20100 / 86400.0))
    assert (on.power_cycles_max_per_node, op.power_cycles_max_per_node) == (0, 1)
    # ramp: 1200 W (5 nodes) and 720 W in each direction, all over the 500 W limit.
    assert (op.peak_ramp_w_per_min, op.minutes_over_ramp_limit) == (5 * STEP, 4)
    # slurm: all 8 suspended at the 710 pass (10 tokens), down at 740,
    # resumed at 20000 on allocation, B starts at 20300.
    sl = m["slurm"]
    joules = (3600 * 100 + 2000 * 610 + 2000 * 30 + 80 * (20000 - 740) + 2400 * 100)
    assert sl.energy_kwh == pytest.approx(joules / 3.6e6, rel=1e-12)
    assert (sl.added_wait_mean_s, sl.added_wait_p95_s, sl.added_wait_max_s) == (150.0, 300.0, 300.0)
    assert (sl.jobs_delayed_pct, sl.start_change_mean_s) == (50.0, 150.0)
    assert (sl.peak_ramp_w_per_min, sl.minutes_over_ramp_limit) == (8 * STEP, 2)
    assert set(result.samples) == {"always-on", "openpbs", "slurm"}


def test_unclipped_mean_lets_earlier_starts_offset_later_ones():
    # One job 300 s later, one 100 s earlier, one on time than under
    # always-on: added wait clips the earlier one to 0, the plain mean does
    # not; only the later one counts as delayed.
    jobs = [job("A", 0, 1, 100), job("B", 10, 1, 100), job("C", 20, 1, 100)]
    base = run(jobs, 3, AlwaysOn())
    other = run(jobs, 3, AlwaysOn())
    other.start = [base.start[0] + 300.0, base.start[1] - 100.0, base.start[2]]
    other.nodes[1].downs, other.nodes[2].downs = 3, 1
    m = _metrics("x", other, base, 1.0, 120.0, 3, None, 0.0, 120.0)
    assert m.power_cycles_max_per_node == 3           # the most cycled node's count
    assert m.added_wait_mean_s == 100.0 and m.added_wait_max_s == 300.0
    assert m.start_change_mean_s == pytest.approx(200.0 / 3)
    assert m.jobs_delayed_pct == pytest.approx(100.0 / 3)


def test_pbs_power_keeps_to_the_ramp_limit():
    # 500 W/min allows two 240 W steps per minute: two nodes drained per
    # cycle, sent the next, so 8 nodes go down in 4 rounds; B's 8 nodes are
    # woken two per cycle from 20100, the last two at 21000, up at 21300.
    result = simulate(EIGHT, 8, MODEL, default_config(**RAMP), ["pbs-power"], cycle=300)
    pp = _by_name(result)["pbs-power"]
    assert (pp.minutes_over_ramp_limit, pp.peak_ramp_w_per_min) == (0, 2 * STEP)
    assert pp.added_wait_max_s == 1300.0 and pp.saved_pct > 80.0
    assert pp.power_cycles_per_node_day == pytest.approx(8 / (8 * 20100 / 86400.0))
    without = simulate(EIGHT, 8, MODEL, default_config(node_idle_limit=600, max_concurrent_nodes=5),
                       ["pbs-power"])
    assert _by_name(without)["pbs-power"].peak_ramp_w_per_min == 5 * STEP   # max_concurrent_nodes


def test_simulate_refuses_an_empty_workload():
    with pytest.raises(ValueError, match="no jobs"):
        simulate([], 2, MODEL, default_config(), ["slurm"])


def test_report_table_and_json():
    result = simulate(EIGHT, 8, MODEL, default_config(**RAMP), ["openpbs"], cycle=300)
    lines = report.table(result).splitlines()
    assert lines[0].split("  ")[0] == "manager" and "delayed %" in lines[0]
    assert "start change mean s" in lines[0]
    assert set(lines[1]) == {"-"} and len(lines[1]) == len(lines[0])
    assert lines[3].split() == ["openpbs", "1", "90.7", "350", "700", "700", "350", "50.0",
                                "4.30", "1,200", "4"]
    doc = json.loads(json.dumps(report.as_json(result, trace="t")))
    assert (doc["trace"], doc["jobs"], doc["nodes"], doc["days"]) == ("t", 2, 8, 0.23)
    assert doc["managers"]["openpbs"]["saved_pct"] == 90.697
    assert doc["managers"]["always-on"]["minutes_over_ramp_limit"] == 0


# -- pbs-power simulate -----------------------------------------------------------

def swf_line(job_id, submit, run, procs, req_time=-1):
    fields = [job_id, submit, 0, run, procs, -1, -1, procs, req_time, -1, 1, 1, 1, -1, 1, 1,
              -1, -1]
    return " ".join(str(f) for f in fields) + "\n"


HEADER = "; Computer: test\n; MaxNodes: 2\n; MaxProcs: 2\n"


def test_cli_bundled_sample_json(capsys):
    assert main(["simulate", "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert set(doc["managers"]) == {"always-on", "pbs-power", "slurm", "openpbs"}
    assert doc["managers"]["always-on"]["saved_pct"] == 0.0
    assert doc["managers"]["always-on"]["added_wait_max_s"] == 0.0
    assert doc["managers"]["pbs-power"]["saved_pct"] > 0.0
    assert doc["jobs"] == read_sample().report.jobs and doc["nodes"] == 100
    assert "kth-sp2-window.swf.gz" in err


@pytest.mark.parametrize("argv, message", [
    (["--managers", "always-on,bogus"],
     "unknown manager(s): bogus (known: always-on, pbs-power, slurm, openpbs, "
     "pbs-power-forecast)"),
    (["--window", "0:1d"], "--window needs --trace"),
])
def test_cli_usage_errors(capsys, argv, message):
    assert main(["simulate"] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("pbs-power simulate: ") and message in err


def test_cli_trace_with_malformed_line_and_exact_energy(tmp_path, capsys):
    # J1 (1 node) 0..3600 and J2 (2 nodes) 3600..5400 with node_power idle
    # 200 W, busy 400 W: (400 + 200) * 3600 + 800 * 1800 J = 1.0 kWh.
    trace = tmp_path / "t.swf"
    trace.write_text(HEADER + swf_line(1, 0, 3600, 1) + "1 2 3\n" + swf_line(2, 0, 1800, 2))
    config = tmp_path / "hook.json"
    config.write_text(json.dumps({"power_on_off_enable": True,
                                  "node_power": {"busy_watts": 400, "idle_watts": 200}}))
    assert main(["simulate", "--trace", str(trace), "--config", str(config),
                 "--managers", "always-on", "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert (doc["jobs"], doc["nodes"], list(doc["managers"])) == (2, 2, ["always-on"])
    assert doc["managers"]["always-on"]["energy_kwh"] == 1.0
    assert "t.swf: 2 jobs; skipped 1 malformed (line 5: 3 fields, need 18)" in err


def test_cli_node_power_overrides_the_assumed_watts(tmp_path, capsys):
    # The same two jobs with --node-power instead of the config: 1.0 kWh.
    trace = tmp_path / "t.swf"
    trace.write_text(HEADER + swf_line(1, 0, 3600, 1) + swf_line(2, 0, 1800, 2))
    assert main(["simulate", "--trace", str(trace), "--managers", "always-on", "--json",
                 "--node-power", "busy=400, idle=200"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["managers"]["always-on"]["energy_kwh"] == 1.0
    assert main(["simulate", "--trace", str(trace), "--node-power", "busy=lots"]) == 2
    assert "not a number of watts" in capsys.readouterr().err
    assert main(["simulate", "--trace", str(trace), "--node-power", "hot=1"]) == 2
    assert "is not STATE=WATTS" in capsys.readouterr().err


def test_cli_boot_seconds_set_the_simulated_boots(tmp_path, capsys):
    # Both nodes go down after J1; J2 (both nodes, at 7200) waits for their
    # boot: 100 s (every node the same, each boot within 5 %) plus at most a
    # 10 s Slurm pass, or 1000 s, which the Slurm model's ResumeTimeout (600 s
    # unless boots are longer) must not cut short.
    trace = tmp_path / "t.swf"
    trace.write_text(HEADER + swf_line(1, 0, 60, 2, 60) + swf_line(2, 7200, 60, 2, 60))
    for boot in (100, 1000):
        assert main(["simulate", "--trace", str(trace), "--managers", "slurm", "--json",
                     "--boot-seconds", str(boot), "--boot-spread", "0"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert (doc["boot_seconds"], doc["boot_spread"]) == (boot, 0.0)
        waited = doc["managers"]["slurm"]["added_wait_max_s"]
        assert 0.95 * boot <= waited <= 1.05 * boot + 10, waited
    for argv, message in ((["--boot-seconds", "0"], "must be seconds > 0"),
                          (["--boot-seconds", "soon"], "not a number"),
                          (["--boot-spread", "1"], "must be at least 0 and below 1")):
        assert main(["simulate", "--trace", str(trace)] + argv) == 2
        assert message in capsys.readouterr().err


def test_cli_truncated_gzip_trace_and_plot(tmp_path, capsys):
    rng = random.Random(1)
    text = HEADER + "".join(swf_line(i, 600 * i + rng.randrange(300), rng.randrange(60, 3000),
                                     rng.randrange(1, 3), 3600) for i in range(1, 41))
    data = gzip.compress(text.encode())
    trace = tmp_path / "t.swf.gz"
    trace.write_bytes(data[:len(data) * 2 // 3])
    png = tmp_path / "out.png"
    assert main(["simulate", "--trace", str(trace), "--plot", str(png), "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert 0 < doc["jobs"] < 40 and doc["nodes"] == 2
    assert "skipped 1 malformed (line " in err and "compressed data ends or breaks here" in err
    assert "plot written to %s" % png in err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10000


# -- skipping quiet cycles changes nothing ------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_pbs_power_skipping_quiet_cycles_gives_the_same_run(seed):
    # Random bursty workloads and configs: the run that skips provably quiet
    # cycles and leaves hosts that cannot change the plan out of its snapshots
    # must start every job, switch every node and use the energy of the run
    # that plans every cycle over every host, to the last joule; and it must skip.
    rng = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(120):
        t += rng.choice((30.0, 200.0, 900.0, 4000.0, 12000.0))
        runtime = rng.uniform(60.0, 6000.0)
        jobs.append(job("j%d" % i, t, rng.randint(1, 12), runtime,
                        runtime * rng.uniform(1.0, 4.0)))
    config = default_config(
        node_idle_limit=rng.choice((300, 1800)), min_node_down_delay=rng.choice((0, 1800)),
        min_idle_nodes=rng.choice((0, 2)), max_concurrent_nodes=rng.choice((3, 100)),
        node_boot_time=rng.choice((60, 900)), cycle_interval=60,
        max_ramp_watts_per_minute=rng.choice((None, 1000.0)), node_power=NodePower(),
        power_ramp_rate_enable=seed % 2 == 0, power_on_off_enable=seed % 2 == 1)
    runs = {}
    for skip in (False, True):
        manager = PbsPower(config, 60, skip_quiet=skip, prune=skip)
        e = run(jobs, 16, manager)
        runs[skip] = (e, manager)
    (full, m_full), (fast, m_fast) = runs[False], runs[True]
    assert fast.start == full.start and fast.log == full.log
    assert fast.energy_j == pytest.approx(full.energy_j, rel=1e-12)
    assert m_full.skipped == 0 and m_fast.runs < m_full.runs * 2 / 3


class _RunTimes(PbsPower):
    """pbs-power noting the time of every cycle it does not skip."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ran_at = []

    def on_cycle(self, now):
        before = self.runs
        super().on_cycle(now)
        if self.runs > before:
            self.ran_at.append(now)


def test_pbs_power_skips_the_cycles_of_a_boot_it_can_only_wait_for():
    # All four nodes are down by 480. B (4 nodes) arrives at 3000: that run
    # wakes all four. Its nodes' BMCs report them on at 3010 (the run at 3060
    # notes it), the boots end at 3300. The runs between only wait for nodes
    # already in flight, so they are skipped (they were run every 60 s).
    manager = _RunTimes(default_config(node_idle_limit=300, cycle_interval=60), 60)
    e = run([job("A", 0, 1, 60), job("B", 3000, 4, 100)], 4, manager)
    assert [t for t in manager.ran_at if t >= 3000] == [3000.0, 3060.0, 3300.0]
    assert starts(e)["B"] == 3300.0


def _forecast_cluster(*queued):
    """Six nodes, n00005-6 powered down; A (2 nodes, walltime 500) and B (1 node,
    900) running from 0; C (5 nodes) and ``queued`` waiting, in that order."""
    manager = PbsPower(default_config(node_idle_limit=600), 60)
    jobs = [job("A", 0, 2, 300, 500), job("B", 0, 1, 300, 900),
            job("C", 0, 5, 100, 100)] + list(queued)
    e = Engine(jobs, make_nodes(6, MODEL), MODEL, manager)
    manager.attach(e)
    for node in e.nodes[4:]:
        e._set(node, DOWN)
        e._from_pool(node)
    e.queue = [0, 1]
    e._schedule(0.0)                          # A on n00001-2, B on n00003
    e.queue = list(range(2, len(jobs)))
    e.version += 1
    return manager, e


def test_the_hook_s_forecast_is_what_the_hook_computes_at_each_run():
    # A (2 nodes) runs until its walltime ends at 500; C (5 nodes) waits for
    # it; D (200 s) ends before 500 when it starts by 300, so it backfills
    # on free n00004 then. At 350, with nothing else changed, it would run
    # past C's start: the forecast no longer starts it, and a quiet run's
    # skipping ends by 300.
    manager, e = _forecast_cluster(job("D", 0, 1, 50, 200))
    starts_at = lambda now: [(e.job_ids[j], start) for j, start, _n in manager.queued(now)]
    assert starts_at(100.0) == [("C", 500.0), ("D", 100.0)]
    assert manager.view.valid_until() == 300.0 and manager.quiet_until(100.0) <= 300.0
    assert starts_at(300.0) == [("C", 500.0), ("D", 300.0)]
    assert starts_at(350.0) == [("C", 500.0)]


def test_pbs_power_acts_on_the_hook_s_own_forecast_of_what_qstat_shows():
    # The simulated hook must see what the real one computes from qstat and
    # the vnodes: the same jobs, starts and vnodes as queued_demand gives for
    # the qstat document of this cluster (A, B running; C, D queued; n00005,
    # n00006 powered down).
    from pbs_power.pbs.attributes import parse_exec_vnode, parse_qstat_time
    from pbs_power.pbs.demand import queued_demand, vnode_space
    manager, e = _forecast_cluster(job("D", 0, 1, 50, 200), job("E", 0, 2, 50, 5000))
    now = 100.0
    doc = {"Jobs": {}}
    for j in (0, 1):
        doc["Jobs"][e.job_ids[j]] = {
            "job_state": "R", "stime": e.start[j], "Resource_List": {"walltime": e.wall[j]},
            "exec_vnode": "+".join("(%s:ncpus=1)" % e.nodes[i].name for i in e.alloc[j])}
    for j in e.queue:
        doc["Jobs"][e.job_ids[j]] = {
            "job_state": "Q", "queue": "workq", "qtime": e.submit[j] + j,
            "schedselect": "%d:ncpus=1" % e.width[j],
            "Resource_List": {"walltime": e.wall[j]}}
    spaces = [vnode_space(n.name, n.name, n.state == DOWN, {"ncpus": 1},
                          {"ncpus": 1} if n.job is not None else {}, n.job is not None, 1)
              for n in e.nodes]
    real = queued_demand(doc, spaces, now, 60, frozenset({"ncpus"}), {}, parse_qstat_time,
                         parse_exec_vnode, lambda level, msg: None)
    got = manager.snapshot(now).queued_jobs
    assert [(q.id, q.estimated_start or now, q.vnodes) for q in real if q.vnodes] == \
        [(q.id, q.estimated_start, q.vnodes) for q in got]
    # C (5 nodes) starts once A's walltime ends, on A's nodes, free n00004 and
    # both powered-down ones; D ends before then and backfills on n00004; E
    # would run past it on nodes C holds: no start.
    assert [(q.id, q.estimated_start, q.vnodes) for q in got] == [
        ("C", 500.0, ("n00001", "n00002", "n00004", "n00005", "n00006")),
        ("D", 100.0, ("n00004",))]

