"""Queued jobs' needs from qstat and the vnodes' room: the fit first, PBS's estimate where it counts."""
import importlib.util
import time

import pytest

from pbs_power.pbs import scheduler
from pbs_power.pbs.attributes import QSTAT_TIME_FORMAT, parse_exec_vnode, parse_qstat_time
from pbs_power.pbs.demand import (PROVISION_WINDOW, checked_resources, job_request, queued_demand,
                                  scheduler_order, vnode_space, waiting)
from pbs_power.pbs.placement import DEFAULT_CHECKED
from pbs_standin import cluster as c

NOW = 1_800_000_000


def ctime(epoch):
    return time.strftime(QSTAT_TIME_FORMAT, time.localtime(epoch))


def spaces():
    return [vnode_space("n1", "n1", False, {"ncpus": 4, "mem": "8gb"}, {"ncpus": 4}, True, 1),
            vnode_space("n2", "n2", True, {"ncpus": 4, "mem": "8gb"}, {}, False, 1),
            vnode_space("n3", "n3", True, {"ncpus": 4, "mem": "8gb"}, {}, False, 1)]


def demand(doc, logs=None):
    return {j.id: (j.estimated_start, j.vnodes) for j in queued_demand(
        doc, spaces(), NOW, 60, DEFAULT_CHECKED, {"high": 10}, parse_qstat_time,
        parse_exec_vnode, lambda level, msg: (logs if logs is not None else []).append(msg))}


def qjob(select, qtime=NOW - 100, queue="workq", **attrs):
    rec = {"job_state": "Q", "queue": queue, "qtime": ctime(qtime), "schedselect": select,
           "Resource_List": {"select": select}}
    rec.update(attrs)
    return rec


def test_sched_config_resources_line():
    assert checked_resources(None) == DEFAULT_CHECKED
    text = 'resources: "ncpus, mem"\n#resources: "x"\nresources: "ncpus, mem, ngpus, model"\n'
    assert checked_resources(text) == {"ncpus", "mem", "ngpus", "model"}


def test_room_subtracts_what_is_assigned_and_names_sharing():
    v = vnode_space("a", "a", False, {"ncpus": 8, "mem": "8gb", "arch": "linux"},
                    {"ncpus": 3, "mem": "2gb"}, True, 4)
    assert v.free["ncpus"] == 5 and v.free["mem"] == 6 * 2 ** 30 and v.free["arch"] == "linux"
    assert v.sharing == "force_excl" and v.occupied


def test_waiting_instances():
    assert waiting({"job_state": "Q"}) == 1 and waiting({"job_state": "R"}) == 0
    assert waiting({"job_state": "B", "array": "True", "array_indices_remaining": "2-5"}) == 4
    assert waiting({"job_state": "H"}) == 0


def test_job_request_from_qstat():
    req = job_request("1.s", qjob("2:ncpus=2", Resource_List={"place": "scatter:excl"}))
    assert (req.arrangement, req.sharing, req.chunks[0].count) == ("scatter", "excl", 2)
    old = job_request("2.s", {"job_state": "Q", "Resource_List": {"ncpus": 3}})
    assert old.chunks[0].resources == (("ncpus", "3"),)


def test_order_is_queue_priority_then_submission():
    doc = {"Jobs": {"9.s": qjob("1:ncpus=1", qtime=NOW - 50),
                    "3.s": qjob("1:ncpus=1", qtime=NOW - 10),
                    "7.s": qjob("1:ncpus=1", qtime=NOW - 5, queue="high"),
                    "8.s": qjob("1:ncpus=1", job_state="R")}}
    assert [j for j, _ in scheduler_order(doc, {"high": 10}, parse_qstat_time)] == [
        "7.s", "9.s", "3.s"]


def test_fit_wakes_now_and_unreadable_select_is_reported():
    logs = []
    doc = {"Jobs": {"1.s": qjob("2:ncpus=4", Resource_List={"place": "scatter"}),
                    "2.s": qjob("1:ncpus")}}
    out = demand(doc, logs)
    assert out["1.s"] == (None, ("n2", "n3"))
    assert out["2.s"] == (None, ()) and "2.s" in logs[0]


def test_estimate_on_sleeping_vnodes_is_followed_and_within_the_window_is_now():
    inside = qjob("1:ncpus=4", estimated={"start_time": ctime(NOW + PROVISION_WINDOW),
                                          "exec_vnode": "(n3:ncpus=4)"})
    later = qjob("1:ncpus=4", estimated={"start_time": ctime(NOW + 5000),
                                         "exec_vnode": "(n3:ncpus=4)"})
    out = demand({"Jobs": {"1.s": inside}})
    assert out["1.s"] == (None, ("n3",))            # PBS's choice (n3), not the fit's (n2)
    out = demand({"Jobs": {"2.s": later}})
    assert out["2.s"] == (NOW + 5000, ("n3",))


def test_estimate_on_busy_vnodes_loses_to_a_fit_that_runs_it_now():
    busy = qjob("1:ncpus=4", estimated={"start_time": ctime(NOW + 3000),
                                        "exec_vnode": "(n1:ncpus=4)"})
    assert demand({"Jobs": {"1.s": busy}})["1.s"] == (None, ("n2",))


@pytest.fixture
def pbs():
    spec = importlib.util.spec_from_file_location("pbs_copy", str(c.STANDIN_DIR / "pbs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_resource_values_skip_what_pbs_refuses(pbs):
    res = pbs.pbs_resource("resources_available", {"ncpus": 4, "mem": "8gb", "flag": True,
                                                   "unset": None})
    assert scheduler.resource_values(res) == {"ncpus": 4, "mem": "8gb", "flag": "True"}
    assert scheduler.resource_values(object()) == {}
    with pytest.raises(AttributeError):
        res["ngpus"]                                # not defined on this server


def test_no_cycle_is_asked_for_while_scheduling_is_off(pbs, tmp_path):
    server = pbs._server("svr", lambda kind, key: [], scheduling=False)
    pbs._install(None, server, {}, "svr")
    logs = []
    assert not scheduler.start_cycle_soon(pbs, str(tmp_path), [], lambda l, m: logs.append(m))
    assert "scheduling is off" in logs[0]
