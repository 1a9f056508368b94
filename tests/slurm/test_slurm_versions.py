"""Reading Slurm 24.11 (outputs recorded on a real 24.11.5, tests/slurm/data/24.11), choosing
the node source by release, refusing an empty node list, and choosing pyslurm only where a
child process could import it (a real stand-in package that ends its process on import)."""
from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import pytest

from pbs_power.config.hook_config import parse_config
from pbs_power.slurm import commands as cli
from pbs_power.slurm.adapter import (SlurmError, SlurmView, get_client, jobs_per_node,
                                     queued_jobs_from, read_view, vnode_states)
from pbs_power.slurm.commands import CliClient
from pbs_power.slurm.power import jobs_by_host
from pbs_power.slurm.selection import MixedClient, check_lines, probe_pyslurm, served_by
from pbs_power.states.model import TransitionKind
from pbs_power.states.planner import plan

DATA = Path(__file__).parent / "data" / "24.11"
MOMENTS = ("powered_down", "powering_up", "drain_down")
JOB2_START = 1795612317.0          # squeue_mixed.json: backfill's estimate for job 2


def load(name: str):
    text = (DATA / name).read_text()
    return json.loads(text) if name.endswith(".json") else text


def by_name(nodes):
    return {n.name: n for n in nodes}


@pytest.fixture
def utc(monkeypatch):
    """scontrol prints local times; the files were recorded in UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_sinfo_json_of_24_11_is_grouped_and_still_read():
    doc = load("sinfo_drain_down.json")
    assert "nodes" not in doc and len(doc["sinfo"]) == 4
    nodes = by_name(cli.nodes_from_sinfo(doc))
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]
    assert nodes["node4"].reason == "pbs_power: power_on failed"
    assert nodes["node1"].last_busy is None          # the grouped records carry no times


@pytest.mark.parametrize("moment", MOMENTS)
def test_scontrol_json_sinfo_and_scontrol_text_agree(utc, moment):
    json_nodes = by_name(cli.nodes_from_sinfo(load("scontrol_json_show_node_%s.json" % moment)))
    text_nodes = by_name(cli.nodes_from_scontrol(load("scontrol_show_node_%s.txt" % moment)))
    grouped = by_name(cli.nodes_from_sinfo(load("sinfo_%s.json" % moment)))
    assert sorted(json_nodes) == sorted(text_nodes) == sorted(grouped) == \
        ["node1", "node2", "node3", "node4"]
    for name, a in json_nodes.items():
        b = text_nodes[name]
        assert (a.state, a.flags, a.reason, a.partitions, a.last_busy, a.slurmd_start_time) == \
            (b.state, b.flags, b.reason, b.partitions, b.last_busy, b.slurmd_start_time), name
        if not (moment == "powering_up" and name == "node4"):   # PLANNED came in between
            assert (grouped[name].state, grouped[name].flags) == (a.state, a.flags), name


def test_node_states_of_24_11():
    down = by_name(cli.nodes_from_sinfo(load("scontrol_json_show_node_powered_down.json")))
    assert vnode_states(down["node1"]) == {"free"} and down["node1"].last_busy > 1.7e9
    assert {vnode_states(down[n]) for n in ("node2", "node3", "node4")} == {frozenset({"sleep"})}
    up = by_name(cli.nodes_from_sinfo(load("scontrol_json_show_node_powering_up.json")))
    assert up["node3"].flags == {"NOT_RESPONDING", "POWERING_UP"}
    assert vnode_states(up["node3"]) == {"provisioning"}
    assert vnode_states(up["node1"]) == {"job-busy"}
    bad = by_name(cli.nodes_from_sinfo(load("scontrol_json_show_node_drain_down.json")))
    assert vnode_states(bad["node2"]) == {"down"}              # DOWN+POWERED_DOWN+PLANNED
    assert vnode_states(bad["node4"]) == {"offline"}           # IDLE+DRAIN+POWERED_DOWN


def test_squeue_24_11_job_state_lists():
    jobs = {j.id: j for j in cli.jobs_from_squeue(load("squeue_mixed.json"))}
    raw = {str(j["job_id"]): j["job_state"] for j in load("squeue_mixed.json")["jobs"]}
    assert raw["4"] == ["RUNNING", "CONFIGURING", "POWER_UP_NODE"]
    assert (jobs["4"].state, jobs["4"].nodes) == ("CONFIGURING", ("node3",))   # waiting
    assert (jobs["1"].state, jobs["1"].nodes) == ("RUNNING", ("node1",))
    two = jobs["2"]     # 24.11's JSON has the scheduled nodes: no second squeue needed
    assert (two.state, two.reason, two.start_time) == ("PENDING", "Resources", JOB2_START)
    assert two.scheduled_nodes == ("node1", "node2") and two.comment == "power_policy=Node-Low"
    assert (jobs["3"].state, jobs["3"].reason) == ("PENDING", "JobHeldUser")
    assert [(q.id, q.vnodes) for q in queued_jobs_from(jobs.values())] == \
        [("2", ("node1", "node2"))]
    assert jobs_per_node(jobs.values()) == {"node1": ("1",), "node3": ("4",)}


def test_reservation_and_power_config_text_unchanged_in_24_11(utc):
    (resv,) = cli.reservations_from_scontrol(load("scontrol_show_reservation.txt"))
    assert (resv.name, resv.nodes, resv.end - resv.start) == ("maint", ("node3", "node4"), 3600)
    power = cli.power_config_from_scontrol(load("scontrol_show_config.txt"))
    assert power.suspend_exc_nodes == {"node1"}
    assert (power.resume_timeout, power.suspend_timeout) == (60, 5)


def test_resume_file_of_24_11_names_the_job():
    path = DATA / "resume_file.json"
    assert "nodes" not in load("resume_file.json")["jobs"][0]
    assert jobs_by_host(str(path), logging.getLogger("t")) == {"node3": "for job 4"}


def test_recorded_24_11_view_plans_a_wake_for_the_pending_job():
    view = SlurmView(tuple(cli.nodes_from_sinfo(load("scontrol_json_show_node_powering_up.json"))),
                     tuple(cli.jobs_from_squeue(load("squeue_mixed.json"))),
                     power=cli.power_config_from_scontrol(load("scontrol_show_config.txt")))
    config = parse_config({"power_on_off_enable": True, "node_boot_time": 60,
                           "cycle_interval": 120})
    the_plan = plan(view.snapshot(now=JOB2_START - 100), config, JOB2_START - 100)
    assert [(a.host, a.kind) for a in the_plan.actions] == [("node2", TransitionKind.POWER_ON)]


# -- the node source by release, with stand-in commands -----------------------------------
def fake_slurm(directory: Path, version: str, node_json: str, listed: str = "") -> None:
    """scontrol/sinfo that print ``version``, ``node_json`` for JSON, ``listed`` for ``-o %N``."""
    (directory / "nodes.json").write_text(node_json)
    body = ('#!/bin/sh\ncase "$*" in\n  --version) echo "slurm %s" ;;\n'
            '  "--json show node"|--json) cat %s ;;\n'
            '  "-h -N -o %%N") printf "%s" ;;\n  *) echo "unexpected: $*" >&2; exit 1 ;;\nesac\n'
            % (version, directory / "nodes.json", listed))
    for name in ("scontrol", "sinfo"):
        (directory / name).write_text(body)
        (directory / name).chmod(0o755)


@pytest.mark.parametrize("version, source", [
    ("24.11.5", "scontrol --json show node"), ("23.02.1", "scontrol --json show node"),
    ("22.05.8", "sinfo --json"), ("20.11.9", "scontrol show node -o")])
def test_node_source_follows_the_release(tmp_path, version, source):
    fake_slurm(tmp_path, version, (DATA / "scontrol_json_show_node_powered_down.json").read_text())
    client = CliClient(bin_dir=str(tmp_path))
    assert client.node_source() == source
    if source != "scontrol show node -o":
        assert len(client.nodes()) == 4


def test_empty_node_list_from_a_cluster_with_nodes_is_an_error(tmp_path):
    fake_slurm(tmp_path, "25.05.0", json.dumps({"nodes": []}), "node1\nnode2\nnode2\n")
    with pytest.raises(SlurmError, match=r"scontrol --json show node listed no nodes, yet "
                                         r"sinfo lists 2 \(node\[1-2\]\)"):
        CliClient(bin_dir=str(tmp_path)).nodes()
    fake_slurm(tmp_path, "25.05.0", json.dumps({"nodes": []}), "")
    assert CliClient(bin_dir=str(tmp_path)).nodes() == []


def test_read_view_refuses_no_nodes_so_nothing_is_taken_down(tmp_path):
    fake_slurm(tmp_path, "24.11.5", json.dumps({"nodes": []}), "")
    with pytest.raises(SlurmError, match="reported no nodes at all; nothing is planned"):
        read_view(CliClient(bin_dir=str(tmp_path)))


# -- pyslurm: probed in a child process, used per capability --------------------------------
FATAL_PYSLURM = """\
import os, sys
sys.stderr.write("error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host\\n"
                 "fatal: Could not establish a configuration source\\n")
os._exit(1)
"""

PARTIAL_PYSLURM = """\
# What pyslurm 22.5 offers, for the probe: nodes and jobs, no Reservations, no slurmctld.Config.
__version__ = "22.5.3"


class Nodes:
    @staticmethod
    def load():
        return []


class Jobs:
    @staticmethod
    def load():
        return []


class Node:
    def modify(self, changes):
        pass
"""


def stand_in_pyslurm(monkeypatch, tmp_path: Path, text: str) -> None:
    """A pyslurm package on this process's path and the child's PYTHONPATH."""
    package = tmp_path / "site" / "pyslurm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    monkeypatch.setitem(sys.modules, "pyslurm", None)    # whatever is imported goes at the end
    monkeypatch.delitem(sys.modules, "pyslurm")


def test_pyslurm_that_ends_the_process_on_import_falls_back_to_the_commands(
        monkeypatch, tmp_path, caplog):
    stand_in_pyslurm(monkeypatch, tmp_path, FATAL_PYSLURM)
    probe = probe_pyslurm()
    assert not probe.usable
    assert probe.why == ("importing pyslurm ended its process with status 1: fatal: Could not "
                         "establish a configuration source")
    log = logging.getLogger("pbs_power.test.selection")
    with caplog.at_level(logging.WARNING, logger=log.name):
        client = get_client("auto", log=log)
    assert isinstance(client, CliClient) and "pyslurm" not in sys.modules
    assert "reading Slurm through its commands: importing pyslurm ended its process" \
        in caplog.text
    with pytest.raises(SlurmError, match="pyslurm cannot be used: importing pyslurm ended"):
        get_client("pyslurm")


def test_pyslurm_serves_what_it_has_and_the_commands_the_rest(monkeypatch, tmp_path):
    stand_in_pyslurm(monkeypatch, tmp_path, PARTIAL_PYSLURM)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_slurm(bin_dir, "22.05.8",
               (DATA / "scontrol_json_show_node_powered_down.json").read_text())
    scontrol = (bin_dir / "scontrol").read_text().replace(
        '  *) echo "unexpected', '  "show reservation -o") cat %s ;;\n  "show config") cat %s ;;\n'
        '  *) echo "unexpected' % (DATA / "scontrol_show_reservation.txt",
                                   DATA / "scontrol_show_config.txt"))
    (bin_dir / "scontrol").write_text(scontrol)
    probe = probe_pyslurm()
    assert probe.usable and probe.version == "22.5.3"
    assert probe.capabilities == {"nodes": True, "jobs": True, "reservations": False,
                                  "power_config": False, "update_nodes": True}
    client = get_client("auto", bin_dir=str(bin_dir))
    assert isinstance(client, MixedClient)
    assert client.jobs() == []                               # pyslurm's (empty) job list
    assert len(client.nodes()) == 4     # pyslurm listed no nodes: the commands' instead
    assert [r.name for r in client.reservations()] == ["maint"]
    assert client.power_config().resume_timeout == 60
    served = served_by(client)
    assert served["jobs"] == "pyslurm" and served["update_nodes"] == "pyslurm"
    assert served["nodes"] == "cli (pyslurm: Nodes.load() returned no nodes)"
    assert served["reservations"] == "cli (pyslurm has none)"
    assert served["power_config"] == "cli (pyslurm has none)"
    lines = check_lines(client, probe)
    assert lines[0] == "Slurm 22.05.8; nodes read with sinfo --json"
    assert "pyslurm 22.5.3: used for what it has" in lines
    assert "nodes: 4 (cli (pyslurm: Nodes.load() returned no nodes))" in lines


def test_pyslurm_client_says_what_its_release_lacks():
    from types import SimpleNamespace
    from pbs_power.slurm.client import Unsupported
    from pbs_power.slurm.pyslurm_client import PyslurmClient
    no_config = SimpleNamespace(load=lambda: SimpleNamespace(resume_timeout=None))
    old = SimpleNamespace(Nodes=SimpleNamespace(load=lambda: []),
                          slurmctld=SimpleNamespace(Config=no_config))
    client = PyslurmClient(old)
    with pytest.raises(Unsupported, match="no Reservations in this pyslurm"):
        client.reservations()
    with pytest.raises(Unsupported, match="its slurmctld.Config has no resume_timeout"):
        client.power_config()
    with pytest.raises(Unsupported, match=r"Nodes.load\(\) returned no nodes"):
        client.nodes()
