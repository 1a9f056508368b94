"""hooks/PBS_power.py end to end, run the way pbs_server runs it.

Each cycle runs the real hook file in a fresh ``python -I -OO`` under the
stand-in ``pbs`` module (tests/pbs_standin), against a real SQLite store and
the simulated power backend. Between cycles the test plays pbs_server and
the MoMs: a host whose sleep mark is cleared shows ``down`` until the
simulated fleet reports it on, then ``free``.
"""
import pytest

from pbs_power.devices.simulated import SimulatedBackend
from pbs_power.states.store import Store
from pbs_standin import cluster as c

HOOK = c.REPO_ROOT / "hooks" / "PBS_power.py"
T0 = 1_800_000_000
CYCLE = 300
HOSTS = ["n1", "n2", "n3", "n4", "n5", "n6"]
BACKEND = {"type": "simulated", "boot_seconds": 200, "shutdown_seconds": 30,
           "fail_nodes": "n6"}


def config(tmp_path, **kw):
    doc = {"power_on_off_enable": True, "node_idle_limit": "1800",
           "min_node_down_delay": "0", "max_concurrent_nodes": "2",
           "node_boot_time": 300, "boot_timeout": 900, "cycle_interval": CYCLE,
           "power_backend": BACKEND, "state_dir": str(tmp_path / "state"),
           "python_path": c.hook_python_path()}
    doc.update(kw)
    return c.write_hook_config(tmp_path / "PBS_power.json", doc)


@pytest.fixture
def pbs_cluster(tmp_path):
    """A stand-in PBS server with six eligible hosts idle for two hours."""
    vnodes = {h: {"poweroff_eligible": True, "last_used_time": T0 - 7200 - i,
                  "last_state_change_time": T0 - 7200 - i} for i, h in enumerate(HOSTS)}
    return c.new_state(tmp_path, config(tmp_path), vnodes=vnodes, hook_freq=CYCLE)


def play_server(state_path, tmp_path, now):
    """What pbs_server and the MoMs do between hook runs."""
    fleet = SimulatedBackend({k: v for k, v in BACKEND.items() if k != "type"},
                             str(tmp_path / "state"))
    power = fleet.status(HOSTS, now)
    fleet.close()
    state = c.load_state(state_path)
    for name, v in state["vnodes"].items():
        if "sleep" in v["state"] or "offline" in v["state"] or name not in power:
            continue
        want = ["free"] if power[name].state.value == "on" else ["down"]
        if v["state"] != want and "job-busy" not in v["state"]:
            v["state"], v["last_state_change_time"] = want, now
    c.save_state(state_path, state)


def cycle(state_path, tmp_path, now):
    play_server(state_path, tmp_path, now)
    record = c.run_hook(HOOK, state_path, now=now)
    assert record["accepted"], record
    assert record["exception"] is None
    return record


def states(state_path):
    return {n: v["state"] for n, v in c.load_state(state_path)["vnodes"].items()}


def in_transition(tmp_path):
    with Store.open(str(tmp_path / "state")) as store:
        return {t.host for t in store.transitions()}


def test_idle_hosts_go_to_sleep_within_max_concurrent_nodes(pbs_cluster, tmp_path):
    first = cycle(pbs_cluster, tmp_path, T0)
    assert sorted(h for h, s in states(pbs_cluster).items() if s == ["sleep"]) == ["n5", "n6"]
    assert any("n6: draining for power_off: idle for" in line for line in first["log"])
    assert first["qstat_calls"] == 1
    busiest = 0
    for i in range(1, 12):
        cycle(pbs_cluster, tmp_path, T0 + i * CYCLE)
        busiest = max(busiest, len(in_transition(tmp_path)))
    assert busiest <= 2
    assert all(s == ["sleep"] for s in states(pbs_cluster).values())


def test_queued_job_wakes_its_hosts_before_its_estimated_start(pbs_cluster, tmp_path):
    for i in range(12):
        cycle(pbs_cluster, tmp_path, T0 + i * CYCLE)
    now = T0 + 12 * CYCLE
    start = now + 3 * CYCLE + 100          # needs n1, n2; boot takes ~300 s
    state = c.load_state(pbs_cluster)
    state["jobs"]["42.pbssvr"] = c.make_job(start_time=start,
                                            exec_vnode="(n1:ncpus=1)+(n2:ncpus=1)")
    c.save_state(pbs_cluster, state)
    woke_at = None
    while now < start:
        record = cycle(pbs_cluster, tmp_path, now)
        if woke_at is None and any("n1: power_on sent: job 42.pbssvr" in l
                                   for l in record["log"]):
            woke_at = now
        now += CYCLE
    play_server(pbs_cluster, tmp_path, start)
    assert woke_at is not None and woke_at < start
    assert states(pbs_cluster)["n1"] == ["free"] and states(pbs_cluster)["n2"] == ["free"]
    assert states(pbs_cluster)["n3"] == ["sleep"]


def test_host_that_never_boots_ends_offline_with_a_comment(pbs_cluster, tmp_path):
    for i in range(12):
        cycle(pbs_cluster, tmp_path, T0 + i * CYCLE)
    now = T0 + 12 * CYCLE
    state = c.load_state(pbs_cluster)
    state["jobs"]["7.pbssvr"] = c.make_job(start_time=now, exec_vnode="(n6:ncpus=1)")
    c.save_state(pbs_cluster, state)
    logs = []
    for i in range(6):
        logs += cycle(pbs_cluster, tmp_path, now + i * CYCLE)["log"]
    n6 = c.load_state(pbs_cluster)["vnodes"]["n6"]
    assert n6["state"] == ["offline"]
    assert "did not power on within boot_timeout=900s" in n6["comment"]
    assert any("n6: power_on failed" in l and "marked offline" in l for l in logs)
    # Never retried: later cycles leave it alone.
    later = cycle(pbs_cluster, tmp_path, now + 10 * CYCLE)
    assert not any("n6: power_on" in l for l in later["log"])


def test_bad_config_is_logged_and_nothing_changes(pbs_cluster, tmp_path):
    config(tmp_path, node_idle_limit="30m")
    record = cycle(pbs_cluster, tmp_path, T0)
    assert all(s == ["free"] for s in states(pbs_cluster).values())
    assert any("hook config rejected" in l and "node_idle_limit" in l for l in record["log"])


def test_missing_library_is_logged_and_the_event_accepted(pbs_cluster, tmp_path):
    config(tmp_path, python_path=[str(tmp_path / "nowhere")])
    record = cycle(pbs_cluster, tmp_path, T0)
    assert all(s == ["free"] for s in states(pbs_cluster).values())
    assert any("internal error, nodes left as they are" in l for l in record["log"])


def test_failed_qstat_takes_no_host_down(pbs_cluster, tmp_path):
    qstat = tmp_path / "pbs_exec" / "bin" / "qstat"
    qstat.write_text("#!/bin/sh\necho 'qstat: cannot connect to server' >&2\nexit 15010\n")
    record = cycle(pbs_cluster, tmp_path, T0)
    assert all(s == ["free"] for s in states(pbs_cluster).values())
    assert any("queued jobs unknown" in l for l in record["log"])


def test_disabled_config_changes_nothing(pbs_cluster, tmp_path):
    config(tmp_path, power_on_off_enable=False)
    cycle(pbs_cluster, tmp_path, T0)
    assert all(s == ["free"] for s in states(pbs_cluster).values())


@pytest.mark.parametrize("text,says", [
    ('{"power_on_off_enable": true,', "unreadable: Expecting property name"),
    ('{"node_idle_limit": "soon", "python_path": %s}', "node_idle_limit wants seconds"),
])
def test_a_bad_config_is_one_clear_line_per_cycle(pbs_cluster, tmp_path, text, says):
    import json
    (tmp_path / "PBS_power.json").write_text(
        text % json.dumps(c.hook_python_path()) if "%s" in text else text)
    record = cycle(pbs_cluster, tmp_path, T0)
    shown = [l for l in record["log"] if not l.startswith("EVENT_DEBUG3;")]
    assert len(shown) == 1 and says in shown[0] and "pbs_power: " in shown[0], shown
    assert all(s == ["free"] for s in states(pbs_cluster).values())


def test_the_journal_records_what_the_hook_did(pbs_cluster, tmp_path):
    """What the exporter and `pbs-power status` read: cycles, events, waits, failures."""
    from pbs_power.states import journal, tally
    for i in range(12):
        cycle(pbs_cluster, tmp_path, T0 + i * CYCLE)
    now = T0 + 12 * CYCLE
    state = c.load_state(pbs_cluster)          # due now: n1 boots late, n6 never
    state["jobs"]["8.pbssvr"] = c.make_job(start_time=now, exec_vnode="(n1:ncpus=1)+(n6:ncpus=1)")
    c.save_state(pbs_cluster, state)
    for i in range(6):
        cycle(pbs_cluster, tmp_path, now + i * CYCLE)
    qstat = tmp_path / "pbs_exec" / "bin" / "qstat"
    qstat.write_text("#!/bin/sh\necho 'qstat: cannot connect to server' >&2\nexit 15010\n")
    cycle(pbs_cluster, tmp_path, now + 6 * CYCLE)
    with Store.open(str(tmp_path / "state")) as store:
        last = journal.last_cycles(store, 1)[0]
        rows = journal.tallies(store)
        n1, n6 = journal.events(store, "n1"), journal.events(store, "n6")
    assert last.outcome == "query_failed" and last.started == now + 6 * CYCLE
    assert last.states["failed"] == 1 and last.hosts == 6 and last.eligible == 6
    assert tally.counter(rows, "cycles") == {(("outcome", "ran"),): 18.0,
                                             (("outcome", "query_failed"),): 1.0}
    assert [(e.kind, e.event) for e in n6][-2:] == [("power_on", "started"),
                                                    ("power_on", "failed")]
    assert tally.counter(rows, "transitions_failed") == {(("kind", "power_on"),): 1.0}
    assert [(e.kind, e.event) for e in n1][-2:] == [("power_on", "started"),
                                                    ("power_on", "completed")]
    # n1 was wanted at `now` and usable one boot later: the job waited that long
    (wait,) = tally.histogram(rows, "wake_wait_seconds", journal.WAIT_BUCKETS)
    assert wait.count == 1 and wait.sum == n1[-1].seconds > 0
    assert tally.counter(rows, "jobs_waited_for_wake") == {(): 1.0}


def test_a_job_blocked_by_a_running_job_gets_its_hosts_woken_before_the_walltime_ends(
        pbs_cluster, tmp_path):
    # All six managed hosts are asleep; n7 (not power managed) runs 40 until its
    # walltime ends at now + 1100. 41 needs seven hosts and has no PBS
    # estimate: the hook's own forecast starts it then, on n7 and the six
    # sleeping hosts, and wakes them one boot (300 s) plus one cycle ahead:
    # due once now + 1100 - 300 - 300 <= t + 300, so not at now, from now + 300.
    for i in range(12):
        cycle(pbs_cluster, tmp_path, T0 + i * CYCLE)
    now = T0 + 12 * CYCLE
    state = c.load_state(pbs_cluster)
    state["vnodes"]["n7"] = c.make_vnode("n7", state="job-busy", jobs="40.pbssvr/0",
                                         resources_assigned={"ncpus": 1})
    state["jobs"]["40.pbssvr"] = c.make_job(
        job_state="R", stime=now - 100,
        Resource_List={"walltime": "00:20:00", "select": "1:ncpus=1"})
    state["jobs"]["40.pbssvr"]["exec_vnode"] = "(n7:ncpus=1)"     # (make_job's is estimated)
    state["jobs"]["41.pbssvr"] = c.make_job(
        qtime=now - 50, schedselect="7:ncpus=1",
        Resource_List={"walltime": "01:00:00", "select": "7:ncpus=1"})
    c.save_state(pbs_cluster, state)
    woken = {}
    for k in range(4):
        record = cycle(pbs_cluster, tmp_path, now + k * CYCLE)
        for line in record["log"]:
            if "power_on sent: job 41.pbssvr" in line:
                woken.setdefault(k, []).append(line.split("pbs_power: ")[1].split(":")[0])
    assert min(woken) == 1
    assert sorted(h for hosts in woken.values() for h in hosts) == [
        "n1", "n2", "n3", "n4", "n5", "n6"]


def test_a_run_over_half_the_cycle_interval_says_so_and_how_to_fix_it():
    from pbs_power.pbs.hook import warn_if_slow
    said = []
    warn_if_slow(lambda level, msg: said.append((level, msg)), 14.9, 30)
    assert said == []
    warn_if_slow(lambda level, msg: said.append((level, msg)), 16.0, 30)
    assert said == [("warning", "this run took 16.0s, over half of cycle_interval=30s: "
                                "raise cycle_interval and the hook's freq together "
                                "(qmgr -c 'set hook pbs_power freq = N')")]
