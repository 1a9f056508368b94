"""Reading Slurm: the CLI client's parsers on outputs recorded from Slurm 22.05.8
(tests/slurm/data), newer JSON shapes, the pyslurm client against pyslurm 25.11's
documented object shapes (pytest-mock), and the records -> planner conversion."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pbs_power.config.hook_config import parse_config
from pbs_power.states.model import TransitionKind
from pbs_power.states.planner import plan
from pbs_power.slurm import commands as cli
from pbs_power.slurm.adapter import (SlurmError, SlurmView, get_client, jobs_per_node,
                                        queued_jobs_from, vnode_states)
from pbs_power.slurm.commands import CliClient
from pbs_power.slurm.pyslurm_client import PyslurmClient

DATA = Path(__file__).parent / "data"
JOB2_START = 1795372416.0          # squeue_mixed.json: backfill's estimate for job 2


def load(name: str):
    text = (DATA / name).read_text()
    return json.loads(text) if name.endswith(".json") else text


@pytest.fixture
def utc(monkeypatch):
    """scontrol prints local times; the files were recorded in UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def by_name(nodes):
    return {n.name: n for n in nodes}


def test_sinfo_powered_down_nodes():
    nodes = by_name(cli.nodes_from_sinfo(load("sinfo_powered_down.json")))
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]
    assert nodes["node1"].state == "IDLE" and nodes["node1"].flags == frozenset()
    assert nodes["node2"].flags == {"POWERED_DOWN"} and nodes["node2"].last_busy is None
    assert nodes["node1"].last_busy > 1.7e9 and nodes["node1"].partitions == ("debug",)
    assert vnode_states(nodes["node1"]) == {"free"}
    assert vnode_states(nodes["node2"]) == {"sleep"}


def test_sinfo_resuming_node_is_provisioning_not_down():
    nodes = by_name(cli.nodes_from_sinfo(load("sinfo_powering_up.json")))
    assert nodes["node3"].state == "ALLOCATED"
    assert nodes["node3"].flags == {"NOT_RESPONDING", "POWERING_UP"}
    assert vnode_states(nodes["node3"]) == {"provisioning"}
    assert vnode_states(nodes["node2"]) == {"sleep"}        # POWERED_DOWN+PLANNED
    assert vnode_states(nodes["node1"]) == {"job-busy"}


def test_sinfo_down_and_drained_nodes_are_never_asleep():
    nodes = by_name(cli.nodes_from_sinfo(load("sinfo_drain_down.json")))
    assert vnode_states(nodes["node2"]) == {"down"}          # DOWN+POWERED_DOWN
    assert vnode_states(nodes["node4"]) == {"offline"}       # IDLE+DRAIN+POWERED_DOWN
    assert nodes["node4"].reason == "pbs_power: power_on failed"


@pytest.mark.parametrize("sinfo,scontrol", [
    ("sinfo_powering_up.json", "scontrol_show_node_powering_up.txt"),
    ("sinfo_drain_down.json", "scontrol_show_node_drain_down.txt")])
def test_scontrol_show_node_agrees_with_sinfo(utc, sinfo, scontrol):
    a = by_name(cli.nodes_from_sinfo(load(sinfo)))
    b = by_name(cli.nodes_from_scontrol(load(scontrol)))
    assert sorted(a) == sorted(b)
    for name in a:
        assert (a[name].state, a[name].flags, a[name].reason, a[name].partitions) == \
            (b[name].state, b[name].flags, b[name].reason, b[name].partitions), name
        assert a[name].slurmd_start_time == b[name].slurmd_start_time
        assert a[name].last_busy == b[name].last_busy


def test_squeue_jobs_with_schednodes():
    planned = cli.scheduled_from_text(load("squeue_schednodes.txt"))
    assert planned == {"2": ("node1", "node2")}
    jobs = {j.id: j for j in cli.jobs_from_squeue(load("squeue_mixed.json"), planned)}
    assert (jobs["1"].state, jobs["1"].nodes) == ("RUNNING", ("node1",))
    assert (jobs["4"].state, jobs["4"].nodes) == ("CONFIGURING", ("node3",))
    two = jobs["2"]
    assert (two.state, two.reason, two.start_time) == ("PENDING", "Resources", JOB2_START)
    assert two.scheduled_nodes == ("node1", "node2") and two.nodes == ()
    assert two.required_nodes == ("node1", "node2") and two.comment == "power_policy=Node-Low"
    assert (jobs["3"].reason, jobs["3"].start_time) == ("JobHeldUser", None)
    queued = queued_jobs_from(jobs.values())
    assert [(q.id, q.estimated_start, q.vnodes) for q in queued] == \
        [("2", JOB2_START, ("node1", "node2"))]       # the held job wakes nothing
    assert jobs_per_node(jobs.values()) == {"node1": ("1",), "node3": ("4",)}


def test_reservations_and_power_config(utc):
    (resv,) = cli.reservations_from_scontrol(load("scontrol_show_reservation.txt"))
    assert (resv.name, resv.nodes, resv.end - resv.start) == ("maint", ("node3", "node4"), 3600)
    assert cli.reservations_from_scontrol("No reservations in the system\n") == []
    power = cli.power_config_from_scontrol(load("scontrol_show_config.txt"))
    assert power.suspend_exc_nodes == {"node1"} and power.suspend_exc_parts == frozenset()
    assert (power.resume_timeout, power.suspend_timeout) == (60, 5)


def test_newer_slurm_json_shapes():
    doc = {"nodes": [{"name": "n1", "state": ["IDLE", "POWERED_DOWN"], "partitions": ["a"],
                      "last_busy": {"set": True, "infinite": False, "number": 1700000000}}]}
    (node,) = cli.nodes_from_sinfo(doc)
    assert node.flags == {"POWERED_DOWN"} and node.last_busy == 1700000000
    jobs = {"jobs": [{"job_id": 7, "job_state": ["PENDING"], "scheduled_nodes": "n[1-2]",
                      "start_time": {"set": True, "number": 1700000100},
                      "required_nodes": "", "state_reason": "Priority"}]}
    (job,) = cli.jobs_from_squeue(jobs)
    assert (job.state, job.scheduled_nodes, job.start_time) == \
        ("PENDING", ("n1", "n2"), 1700000100)


def test_recorded_view_plans_a_wake_for_the_pending_job():
    view = SlurmView(tuple(cli.nodes_from_sinfo(load("sinfo_powering_up.json"))),
                     tuple(cli.jobs_from_squeue(load("squeue_mixed.json"),
                                                cli.scheduled_from_text(load(
                                                    "squeue_schednodes.txt")))),
                     power=cli.power_config_from_scontrol(load("scontrol_show_config.txt")))
    config = parse_config({"power_on_off_enable": True, "node_boot_time": 60,
                           "cycle_interval": 120})
    snap = view.snapshot(now=JOB2_START - 100)
    assert {v.name: v.poweroff_eligible for v in snap.vnodes}["node1"] is False
    the_plan = plan(snap, config, JOB2_START - 100)
    assert [(a.host, a.kind) for a in the_plan.actions] == [("node2", TransitionKind.POWER_ON)]
    assert the_plan.actions[0].reason.startswith("job 2 needs it at")
    early = plan(snap, config, JOB2_START - 1000)     # a cycle later is still early enough
    assert early.actions == ()


# -- the CLI client's command handling, with stand-in programs ---------------------------
def fake_program(directory: Path, name: str, body: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def test_cli_errors_name_the_command(tmp_path):
    fake_program(tmp_path, "sinfo", "echo 'sinfo: error: slurm_load_node: Unable to contact "
                                    "slurm controller' >&2\nexit 1\n")
    fake_program(tmp_path, "scontrol", 'case "$1" in --version) echo "slurm 22.05.8" ;; '
                                       '*) exit 1 ;; esac\n')
    client = CliClient(bin_dir=str(tmp_path))
    with pytest.raises(SlurmError, match=r"sinfo --json exited 1: sinfo: error: "
                                         r"slurm_load_node: Unable to contact"):
        client.nodes()
    with pytest.raises(SlurmError, match="squeue not found in"):
        client.jobs()
    fake_program(tmp_path, "squeue", "sleep 30\n")
    with pytest.raises(SlurmError, match=r"squeue --json: no answer within 0.5s"):
        CliClient(bin_dir=str(tmp_path), timeout=0.5).jobs()


def test_cli_update_passes_one_argv_per_field(tmp_path):
    record = tmp_path / "argv"
    fake_program(tmp_path, "scontrol", 'for a in "$@"; do echo "$a"; done > %s\n' % record)
    CliClient(bin_dir=str(tmp_path)).update_nodes(["n2", "n1", "n3"], "DRAIN",
                                                  "pbs_power: power_on failed; x")
    assert record.read_text().splitlines() == [
        "update", "nodename=n[1-3]", "state=DRAIN", "reason=pbs_power: power_on failed; x"]


# -- the pyslurm client (pyslurm 25.11's documented shapes, mocked) ----------------------
class Collection:
    """Like pyslurm's MultiClusterMap: iterating gives keys, values() the objects."""

    def __init__(self, objects):
        self._objects = {getattr(o, "name", getattr(o, "id", None)): o for o in objects}

    def __iter__(self):
        return iter(self._objects)

    def values(self):
        return list(self._objects.values())


def fake_pyslurm(mocker):
    mod = mocker.MagicMock(name="pyslurm")
    nodes = [SimpleNamespace(name="node1", state="ALLOCATED", last_busy_time=1795371816,
                             slurmd_start_time=1795371800, reason=None, partitions=["debug"]),
             SimpleNamespace(name="node2", state="IDLE+POWERED_DOWN", last_busy_time=None,
                             slurmd_start_time=1795371800, reason="", partitions=["debug"])]
    jobs = [SimpleNamespace(id=1, state="RUNNING", allocated_nodes="node1", scheduled_nodes=None,
                            required_nodes="node1", start_time=1795371816, state_reason="None",
                            partition="debug", comment=None),
            SimpleNamespace(id=2, state="PENDING", allocated_nodes=None,
                            scheduled_nodes="node[1-2]", required_nodes=None,
                            start_time=JOB2_START, state_reason="Resources", partition="debug",
                            comment="power_policy=Node-Low")]
    mod.Nodes.load.return_value = Collection(nodes)
    mod.Jobs.load.return_value = Collection(jobs)
    mod.Reservations.load.return_value = Collection([])
    mod.slurmctld.Config.load.return_value = SimpleNamespace(
        suspend_exclude_nodes="node1", suspend_exclude_partitions=[], resume_timeout=60,
        suspend_timeout=5)
    return mod


def test_pyslurm_client_reads_nodes_jobs_and_config(mocker):
    client = PyslurmClient(fake_pyslurm(mocker))
    nodes = by_name(client.nodes())
    assert nodes["node2"].flags == {"POWERED_DOWN"} and nodes["node1"].state == "ALLOCATED"
    jobs = {j.id: j for j in client.jobs()}
    assert jobs["1"].nodes == ("node1",) and jobs["2"].scheduled_nodes == ("node1", "node2")
    assert jobs["2"].nodes == () and jobs["2"].start_time == JOB2_START
    power = client.power_config()
    assert power.suspend_exc_nodes == {"node1"} and power.resume_timeout == 60


def test_pyslurm_list_collections_of_older_releases(mocker):
    mod = fake_pyslurm(mocker)
    mod.Nodes.load.return_value = list(mod.Nodes.load.return_value.values())
    assert [n.name for n in PyslurmClient(mod).nodes()] == ["node1", "node2"]


def test_pyslurm_update_and_errors(mocker):
    mod = fake_pyslurm(mocker)
    PyslurmClient(mod).update_nodes(["node3", "node2"], "power_up")
    mod.Node.assert_any_call(state="POWER_UP")
    mod.Node.assert_any_call("node[2-3]")
    mod.Node.return_value.modify.assert_called_once_with(mod.Node.return_value)
    mod.Jobs.load.side_effect = RuntimeError("Unable to contact slurm controller")
    with pytest.raises(SlurmError, match="pyslurm Jobs.load\\(\\) failed: Unable to contact"):
        PyslurmClient(mod).jobs()


def test_get_client_without_pyslurm_uses_the_commands(mocker):
    # pyslurm importable in-process is no longer enough: see test_slurm_versions.py
    assert isinstance(get_client("cli"), CliClient)
    mocker.patch.dict(sys.modules, {"pyslurm": None})      # not installed
    assert isinstance(get_client(), CliClient)
    with pytest.raises(SlurmError, match="pyslurm cannot be used: pyslurm is not installed"):
        get_client("pyslurm")


def test_cycle_over_pyslurm_asks_slurm_to_power_up(mocker, tmp_path):
    from pbs_power.slurm.cycle import run_cycle
    from pbs_power.states.store import Store
    mod = fake_pyslurm(mocker)
    config = parse_config({"power_on_off_enable": True, "node_boot_time": 60,
                           "cycle_interval": 120, "state_dir": str(tmp_path)})
    log = mocker.MagicMock()
    with Store.open(str(tmp_path)) as store:
        report = run_cycle(config, store, PyslurmClient(mod), log, JOB2_START - 100)
    assert report.powered_up == ["node2"] and report.powered_down == []
    mod.Node.assert_any_call(state="POWER_UP")
    mod.Node.assert_any_call("node2")
    assert os.path.exists(tmp_path / "slurm-cycle.lock")
