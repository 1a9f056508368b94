"""The journal and tallies the hooks write for the exporter: values, and bounded size."""
import pytest

from pbs_power.config.hook_config import NodePower
from pbs_power.groups import records
from pbs_power.states import journal, tally
from pbs_power.states.model import Phase, Transition, TransitionKind as K
from pbs_power.states.store import Store


@pytest.fixture
def store(tmp_path):
    with Store.open(str(tmp_path)) as s:
        yield s


def down(host, started=0.0):
    return Transition(host, K.POWER_OFF, Phase.POWERING_DOWN, started, started, "idle")


def up(host, started):
    return Transition(host, K.POWER_ON, Phase.POWERING_UP, started, started, "job 1 needs it")


def test_histogram_buckets_are_cumulative_with_sum_and_count(store):
    conn = journal.conn_of(store)
    with store.transaction():
        for value in (5, 50, 500):
            tally.observe(conn, "h", {"kind": "x"}, value, (10.0, 100.0))
    (h,) = tally.histogram(tally.read_all(conn), "h", (10.0, 100.0))
    assert h.labels == (("kind", "x"),)
    assert h.buckets == (("10.0", 1.0), ("100.0", 2.0), ("+Inf", 3.0))
    assert (h.sum, h.count) == (555.0, 3.0)


def test_a_transitions_life_is_counted_and_kept_per_host(store):
    journal.started(store, down("n1", 100.0))
    journal.completed(store, down("n1", 100.0), 30.0, 130.0, watts=240.0)
    journal.started(store, up("n1", 1000.0), need_by=1100.0)
    journal.failed(store, up("n1", 1000.0), "did not power on", 1700.0)
    events = journal.events(store, "n1")
    assert [(e.kind, e.event) for e in events] == [
        ("power_off", "started"), ("power_off", "completed"), ("power_on", "started"),
        ("power_on", "failed")]
    assert events[1].seconds == 30.0 and events[3].reason == "did not power on"
    assert [e.event for e in journal.events(store, "n1", since=1000.0)] == ["started", "failed"]
    rows = journal.tallies(store)
    assert tally.counter(rows, "transitions_started") == {
        (("kind", "power_off"),): 1.0, (("kind", "power_on"),): 1.0}
    assert tally.counter(rows, "transitions_failed") == {(("kind", "power_on"),): 1.0}
    # the failed wake counts no wait
    assert tally.histogram(rows, "wake_wait_seconds", journal.WAIT_BUCKETS) == []


def test_events_per_host_are_bounded(store, monkeypatch):
    monkeypatch.setattr(journal, "EVENTS_PER_HOST", 5)
    for i in range(12):
        journal.ended(store, down("n1", float(i)), "drain cancelled %d" % i, float(i))
    journal.ended(store, down("n2"), "other host", 0.0)
    kept = journal.events(store, "n1")
    assert [e.reason for e in kept] == ["drain cancelled %d" % i for i in range(7, 12)]
    assert len(journal.events(store, "n2")) == 1


def test_cycles_are_bounded_and_counted_by_outcome(store, monkeypatch):
    monkeypatch.setattr(journal, "CYCLES_KEPT", 3)
    for i in range(7):
        journal.record_cycle(store, journal.CycleRecord(
            float(i), 0.5, "skipped" if i == 2 else "ran", {"on": 4, "off": i}, 4,
            {"ramp": i}))
    newest = journal.last_cycles(store, 10)
    assert [c.started for c in newest] == [6.0, 5.0, 4.0]
    assert newest[0].states == {"on": 4, "off": 6} and newest[0].hosts == 10
    assert newest[0].held == {"ramp": 6}
    rows = journal.tallies(store)
    assert tally.counter(rows, "cycles") == {(("outcome", "ran"),): 6.0,
                                             (("outcome", "skipped"),): 1.0}
    (h,) = tally.histogram(rows, "cycle_seconds", journal.CYCLE_BUCKETS)
    assert h.count == 6.0 and h.sum == 3.0          # skipped passes are not timed


def test_hosts_are_counted_by_the_last_cycle_that_ran(store):
    assert journal.last_census(store) is None
    journal.record_cycle(store, journal.CycleRecord(1.0, 0.1, "ran", {"on": 3, "off": 1}, 4))
    journal.record_cycle(store, journal.CycleRecord(2.0, 0.0, "skipped"))
    journal.record_cycle(store, journal.CycleRecord(3.0, 0.2, "query_failed"))
    assert journal.last_cycles(store, 1)[0].outcome == "query_failed"
    census = journal.last_census(store)
    assert (census.started, census.states) == (1.0, {"on": 3, "off": 1})


def test_energy_counts_time_down_at_the_saved_watts(store):
    journal.completed(store, down("n1"), 30.0, 100.0, watts=200.0)
    assert journal.open_saving(store, 160.0) == (12000.0, 200.0)
    journal.started(store, up("n1", 200.0))            # the wake ends the interval
    assert journal.open_saving(store, 300.0) == (0.0, 0.0)
    closed = tally.counter(journal.tallies(store), "energy_saved_joules")
    assert closed == {(): 20000.0}
    journal.completed(store, down("n2"), 30.0, 250.0, watts=100.0)
    # from 150 to 300: n1 from 150 to 200 (50 s x 200 W), n2 from 250 (50 s x 100 W)
    assert journal.energy_saved(store, 150.0, 300.0) == 15000.0


def test_energy_never_goes_back_and_stops_for_a_host_back_in_service(store):
    from pbs_power.states.model import Vnode
    journal.completed(store, down("n1"), 30.0, 100.0, watts=200.0)
    journal.completed(store, down("n1"), 30.0, 150.0, watts=200.0)   # down again, no wake
    assert tally.counter(journal.tallies(store), "energy_saved_joules") == {(): 10000.0}
    assert journal.open_saving(store, 200.0) == (10000.0, 200.0)
    # an admin powered n1 on by hand: the scheduler shows it free at the next cycle
    journal.record_pass(store, (Vnode("n1", "n1"),), (), 250.0, 0.1, "ran")
    assert journal.saving_now(store) == {}
    assert tally.counter(journal.tallies(store), "energy_saved_joules") == {(): 30000.0}
    assert journal.last_cycles(store, 1)[0].states["on"] == 1


def test_a_wake_a_job_waited_for_is_counted_with_its_wait(store):
    journal.started(store, up("n1", 900.0), need_by=1000.0)
    journal.completed(store, up("n1", 900.0), 200.0, 1100.0)       # usable at 1100
    journal.started(store, up("n2", 500.0), need_by=1000.0)
    journal.completed(store, up("n2", 500.0), 200.0, 700.0)        # in time
    journal.started(store, up("n3", 500.0))                        # warm pool: no job
    journal.completed(store, up("n3", 500.0), 200.0, 700.0)
    rows = journal.tallies(store)
    assert tally.counter(rows, "jobs_waited_for_wake") == {(): 1.0}
    (h,) = tally.histogram(rows, "wake_wait_seconds", journal.WAIT_BUCKETS)
    assert (h.count, h.sum) == (2.0, 100.0)
    assert dict(h.buckets)["0.0"] == 1.0


def test_census_sorts_hosts_by_power_state():
    flights = (Transition("n2", K.POWER_OFF, Phase.DRAINING, 0, 0),
               Transition("n3", K.WAKE, Phase.BOOTING, 0, 0))
    counts, eligible = journal.census(
        {"n1": True, "n2": True, "n3": False, "n4": True, "n5": False, "n6": True},
        flights, {"n6": ("boot timeout", 0.0)}, {"n4": ("sleep", 0.0, 160.0)}, {"n5": 0.0})
    assert counts == {"on": 1, "powering_down": 1, "powering_up": 1, "asleep": 1, "off": 1,
                      "failed": 1}
    assert eligible == 4


def test_hold_reasons_and_saved_watts():
    assert journal.hold_reason("max_ramp_watts_per_minute=500 would be exceeded") == "ramp"
    assert journal.hold_reason("max_concurrent_nodes=4 hosts already in transition") == \
        "max_concurrent_nodes"
    assert journal.hold_reason("down since 10:00; min_node_down_delay keeps it down") == "delay"
    assert journal.hold_reason("something new") == "other"
    power = NodePower(idle_watts=250.0, sleep_watts=90.0, off_watts=10.0)
    assert journal.saved_watts(power, K.SLEEP) == 160.0
    assert journal.saved_watts(power, K.POWER_OFF) == 240.0
    assert journal.saved_watts(None, K.POWER_OFF) == 0.0


def test_device_errors_are_labelled_by_backend_and_a_bounded_reason():
    assert records.error_reason("timed out after 5s") == "timeout"
    assert records.error_reason("Connection refused") == "connection"
    assert records.error_reason("HTTP 401 Unauthorized") == "auth"
    assert records.error_reason("no device backend 'x' (available: simulated)") == "no_backend"
    assert records.error_reason("the GPU caught fire") == "other"
    assert records.backend_of('{"backend": "redfish"}') == "redfish"
    assert records.backend_of("{}") == "simulated"
    assert records.backend_of("not json") == records.UNKNOWN_BACKEND
    assert records.backend_of('{"backend": "a b=c,d"}') == records.UNKNOWN_BACKEND
