"""`pbs-power topology | policy | resource-group | gpu-policy` over the sample topology."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pbs_power.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "config" / "topology.json"
FAST = ("--device-option", "simulated.latency_ms=0")


class Cli:
    """Runs ``pbs-power`` in-process against one state directory."""

    def __init__(self, state_dir, capsys):
        self.state_dir = str(state_dir)
        self.capsys = capsys

    def __call__(self, *argv, fast=True):
        self.capsys.readouterr()
        code = main(list(argv) + ["--state-dir", self.state_dir] + list(FAST if fast else ()))
        out, err = self.capsys.readouterr()
        return code, out, err

    def ok(self, *argv, **kw):
        code, out, err = self(*argv, **kw)
        assert code == 0, (argv, out, err)
        return out

    def json(self, *argv, **kw):
        code, out, err = self(*(argv + ("--json",)), **kw)
        return code, json.loads(out)


def prepare(cli):
    cli.ok("topology", "import", str(TOPOLOGY))
    cli.ok("topology", "activate")


@pytest.fixture
def cli(tmp_path, capsys):
    return Cli(tmp_path / "state", capsys)


@pytest.fixture
def active(cli):
    prepare(cli)
    return cli


def group(cli, name, hosts, *create_args):
    cli.ok("resource-group", "create", name, *create_args)
    cli.ok("resource-group", "add", name, "--entities", hosts)


def list_rows(cli):
    out = cli.ok("resource-group", "list")
    return {line.split()[0]: line.split() for line in out.splitlines()[1:]}


# -- the whole lifecycle ---------------------------------------------------------
def test_lifecycle_on_the_sample_topology(cli):
    assert cli.ok("topology", "import", str(TOPOLOGY)).strip() == \
        "topology gpu-cluster-a imported (68 entities); activate it next"
    assert "topology gpu-cluster-a: inactive, 68 entities" in cli.ok("topology", "show")
    assert cli.ok("topology", "activate").strip() == "topology gpu-cluster-a active"

    assert cli.ok("resource-group", "create", "rg_42", "--external-id", "42",
                  "--policy", "Node-High").strip() == "rg_42: created (inactive, policy Node-High)"
    assert cli.ok("resource-group", "add", "rg_42", "--entities", "gpu[001-016]").strip() == \
        "rg_42: added gpu[001-016]"
    out = cli.ok("resource-group", "activate", "rg_42")
    assert out.startswith("rg_42: active (policy Node-Med applied; requested Node-High does "
                          "not fit (")
    assert "rack-01 needs 163200 W of its 130000 W budget (33200 W over)" in out
    assert list_rows(cli)["rg_42"] == ["rg_42", "42", "active", "Node-High", "gpu[001-016]",
                                       "Node-Med:16"]
    show = cli.ok("topology", "show")
    assert "      rack-01 (rack, 16 entities): 128000 W / 130000 W" in show
    assert "  Node-Med (default): hgx-h100-8gpu 8000 W, cpu-2s 1100 W" in show

    assert cli.ok("resource-group", "update", "rg_42", "--policy", "Node-Low").strip() == \
        "rg_42: policy set to Node-Low (policy Node-Low applied)"
    assert "      rack-01 (rack, 16 entities): 96000 W / 130000 W" in cli.ok("topology", "show")
    out = cli.ok("resource-group", "update-resources", "rg_42", "--set", "gpu[001-002]=Node-Min",
                 "--entities", "gpu003", "--policy", "Node-High")
    assert out.strip() == ("rg_42: entity policies updated (applied: Node-Min on 2 host(s), "
                           "Node-High on 1 host(s), Node-Low on 13 host(s))")
    assert list_rows(cli)["rg_42"][-1] == "Node-Min:2,Node-High:1,Node-Low:13"
    cli.ok("resource-group", "update-resources", "rg_42", "--clear", "gpu[001-003]")
    assert list_rows(cli)["rg_42"][-1] == "Node-Low:16"

    assert cli.ok("resource-group", "delete", "rg_42").strip() == "rg_42: deleted"
    assert cli.ok("resource-group", "list").strip() == "no resource groups"
    assert "      rack-01 (rack, 16 entities): 128000 W / 130000 W" in cli.ok("topology", "show")
    assert cli.ok("topology", "deactivate").strip() == "topology gpu-cluster-a inactive"


def test_inactive_update_deactivate_and_remove(active):
    cli = active
    group(cli, "rg_1", "gpu[001-004]")
    assert cli.ok("resource-group", "remove", "rg_1", "--entities", "gpu004").strip() == \
        "rg_1: removed gpu004"
    assert cli.ok("resource-group", "update", "rg_1", "--policy", "Node-Low").strip() == \
        "rg_1: policy set to Node-Low"
    cli.ok("resource-group", "activate", "rg_1", "--sync")
    assert list_rows(cli)["rg_1"][-1] == "Node-Low:3"
    assert cli.ok("resource-group", "update", "rg_1", "--no-policy").strip() == \
        "rg_1: policy removed (topology policies) (policy Node-Med applied)"
    assert cli.ok("resource-group", "deactivate", "rg_1").strip() == \
        "rg_1: inactive (topology policies restored)"
    code, out, err = cli("resource-group", "deactivate", "rg_1")
    assert (code, out) == (2, "")
    assert "rg_1: resource group rg_1 is inactive, not active" in err
    assert list_rows(cli)["rg_1"] == ["rg_1", "-", "inactive", "-", "gpu[001-003]", "-"]


def test_strict_activation_that_does_not_fit_fails_naming_the_domain(active):
    cli = active
    group(cli, "rg_42", "gpu[001-016]", "--policy", "Node-High")
    code, out, err = cli("resource-group", "activate", "rg_42", "--strict")
    assert (code, out) == (1, "")
    assert err.startswith("rg_42: activation failed: does not fit the power budget (strict): ")
    assert "rack-01 needs 163200 W of its 130000 W budget" in err
    assert list_rows(cli)["rg_42"][2] == "inactive"


def test_no_dpm_group_is_strict(active):
    cli = active
    group(cli, "rg_42", "gpu[001-016]", "--policy", "Node-High", "--no-dpm")
    code, _out, err = cli("resource-group", "activate", "rg_42")
    assert code == 1 and "(strict)" in err and "rack-01" in err


def test_reprovision_lowers_another_group(active):
    cli = active
    group(cli, "rg_a", "gpu[001-008]", "--policy", "Node-Med")
    cli.ok("resource-group", "activate", "rg_a")
    group(cli, "rg_b", "gpu[009-016]", "--policy", "Node-High")
    code, _out, err = cli("resource-group", "activate", "rg_b", "--strict")
    assert code == 1 and "rack-01 needs 145600 W of its 130000 W budget" in err
    out = cli.ok("resource-group", "activate", "rg_b", "--strict", "--allow-reprovision")
    assert out.strip() == ("rg_b: active (policy Node-High applied; lowered rg_a to Node-Low "
                           "to make room)")
    rows = list_rows(cli)
    assert rows["rg_a"][-1] == "Node-Low:8" and rows["rg_b"][-1] == "Node-High:8"
    assert "      rack-01 (rack, 16 entities): 129600 W / 130000 W" in cli.ok("topology", "show")


def _until_completed(cli, *argv):
    deadline = time.time() + 30
    while True:
        out = cli.ok("resource-group", "status", *argv)
        if " completed, " in out:
            return out
        assert " in progress, " in out
        assert time.time() < deadline, out
        time.sleep(0.05)


def test_async_activation_and_status(active):
    cli = active
    group(cli, "rg_7", "gpu[017-024]")
    out = cli.ok("resource-group", "activate", "rg_7", "--async-wait", "0",
                 "--device-option", "simulated.latency_ms=50", fast=False)
    op_id = re.search(r"\(operation ([0-9a-f]+)\)", out).group(1)
    assert out.strip().endswith("follow it with: pbs-power resource-group status %s" % op_id)
    done = _until_completed(cli, op_id)
    assert done.strip() == ("operation %s (activate): completed, 8 of 8 host(s) done (8 ok, "
                            "0 failed)" % op_id)
    code, out, err = cli("resource-group", "status", op_id)
    assert (code, out) == (2, "")
    assert "no such operation (already read as completed" in err
    assert list_rows(cli)["rg_7"][-1] == "Node-Med:8"

    # the same by group and type, for an update returning after half the hosts
    out = cli.ok("resource-group", "update", "rg_7", "--policy", "Node-Low",
                 "--async-percent-hosts", "50")
    assert "update continues in the background" in out
    _until_completed(cli, "--group", "rg_7", "--type", "update")
    code, _out, err = cli("resource-group", "status", "--group", "rg_7", "--type", "update")
    assert code == 2 and "no such operation" in err
    assert list_rows(cli)["rg_7"][-1] == "Node-Low:8"


def test_partial_activation(active):
    cli = active
    group(cli, "rg_p", "gpu[001-016]")
    fail = ("--device-option", "simulated.fail_devices=gpu[003-004]")
    code, out, err = cli("resource-group", "activate", "rg_p", "--at-least-n-hosts", "15", *fail)
    assert code == 1
    assert err.strip() == ("rg_p: activation failed: only 14 of 16 hosts activated (need 15): "
                           "gpu003: simulated device failure, gpu004: simulated device failure")
    assert out.splitlines() == ["NODE          OK  POLICY  CAP W  DIAG",
                                "gpu[003-004]  NO  -       -      simulated device failure"]
    assert list_rows(cli)["rg_p"][2] == "inactive"

    out = cli.ok("resource-group", "activate", "rg_p", "--at-least-n-hosts", "14", *fail)
    assert out.splitlines()[0].startswith(
        "rg_p: active (applied: Node-Med on 14 host(s), failed on 2 host(s); failed: gpu003")
    assert "gpu[003-004]  NO" in out
    assert list_rows(cli)["rg_p"][-1] == "Node-Med:14,failed:2"


def test_partial_activation_by_percent_and_verbose_table(active):
    cli = active
    group(cli, "rg_q", "gpu[017-024]")
    out = cli.ok("resource-group", "activate", "rg_q", "--at-least-percent-hosts", "87.5",
                 "--host-timeout", "5", "-v", "--device-option",
                 "simulated.fail_devices=gpu024")
    assert "gpu[017-023]  yes  Node-Med  8000\n" in out
    assert "gpu024        NO   -         -      simulated device failure" in out


def test_gpu_policy(active):
    cli = active
    group(cli, "rg_g", "gpu[017-018]")
    cli.ok("resource-group", "activate", "rg_g")
    out = cli.ok("gpu-policy", "--node", "gpu017=300,300,300,300,300,300,80%,-")
    assert out.strip() == ("gpu017: GPU limits set: 0=300 W, 1=300 W, 2=300 W, 3=300 W, "
                           "4=300 W, 5=300 W, 6=560 W, 7=560 W")   # -: Node-Med's GPU 80%
    out = cli.ok("gpu-policy", "--node", "gpu017=" + ",".join(["900"] + ["250"] * 7))
    assert "GPU 0: requested 900 W, clamped to 700 W" in out
    out = cli.ok("gpu-policy", "--node", "gpu[017-018]=" + ",".join(["250"] * 8))
    assert out.count("GPU limits set") == 2
    code, out, err = cli("gpu-policy", "--node", "gpu018=300,300")
    assert (code, out) == (2, "")             # the request names too few GPUs: bad input
    assert err.strip() == ("gpu018: every GPU of gpu018 must be named (GPUs 0-7); missing "
                           "[2, 3, 4, 5, 6, 7]")
    code, out, err = cli("gpu-policy", "--node", "cpu01=100")
    assert code == 2 and "cpu01: has no GPUs" in err


def test_json_outputs_parse(active):
    cli = active
    group(cli, "rg_j", "gpu[001-002]", "--external-id", "7", "--property", "priority=5",
          "--property", "min_policy=Node-Low", "--workload-profile-ids", "1,2", "--no-prs")
    code, doc = cli.json("resource-group", "activate", "rg_j")
    assert code == 0 and doc["status"]["ok"] and doc["node_statuses"]["gpu001"]["policy"] == \
        "Node-Med"
    code, doc = cli.json("resource-group", "list", "--active-only")
    info = doc["resource_groups"][0]
    assert (info["group_name"], info["external_id"], info["properties"],
            info["workload_profile_ids"], info["prs_enabled"]) == \
        ("rg_j", 7, {"priority": 5, "min_policy": "Node-Low"}, [1, 2], False)
    code, doc = cli.json("topology", "show")
    rack = next(d for d in doc["domains"] if d["name"] == "rack-01")
    assert (doc["active"], rack["budget_watts"], rack["allocated_watts"]) == \
        (True, 130000.0, 128000.0)
    code, doc = cli.json("policy", "list")
    assert [p["name"] for p in doc["policies"]][:2] == ["Node-High", "Node-Med"]
    code, doc = cli.json("policy", "show", "Node-Low")
    assert doc["node_watts"] == {"hgx-h100-8gpu": 6000.0, "cpu-2s": 1100.0}
    code, doc = cli.json("gpu-policy", "--node", "gpu001=" + ",".join(["300"] * 8))
    assert code == 0 and len(doc["results"]) == 8
    code, doc = cli.json("resource-group", "activate", "rg_j", "--async-n-hosts", "1")
    assert code == 2 and doc["status"]["code"] == "invalid"
    code, doc = cli.json("resource-group", "status", "nope")
    assert code == 2 and doc["code"] == "not_found"
    code, doc = cli.json("resource-group", "list", "--device-option", "max_workers=0",
                         fast=False)
    assert code == 2 and doc["status"]["code"] == "invalid"
    code, doc = cli.json("resource-group", "delete", "rg_j")
    assert code == 0 and doc["status"]["diag_msg"] == "resource group rg_j deleted"


def test_policy_create(active, tmp_path):
    cli = active
    path = tmp_path / "eco.json"
    path.write_text(json.dumps({"name": "Node-Eco", "limits": [
        {"element_type": "NODE", "power_limit": {"percentage": 50}}]}))
    assert cli.ok("policy", "create", str(path)).strip() == "policy Node-Eco created"
    assert cli.ok("policy", "create", '{"name": "Node-Tiny", "limits": [{"element_type": '
                  '"NODE", "power_limit": {"watts": 3500}}]}').strip() == \
        "policy Node-Tiny created"
    out = cli.ok("policy", "show", "Node-Eco")
    assert "node watts: hgx-h100-8gpu 5100 W, cpu-2s 550 W" in out
    group(cli, "rg_e", "gpu001", "--policy", "Node-Eco")


def test_state_dir_from_environment(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PBS_POWER_STATE_DIR", str(tmp_path / "env"))
    assert main(["topology", "import", str(TOPOLOGY)]) == 0
    assert os.path.exists(tmp_path / "env" / "resource_groups.db")


def test_no_topology_yet(cli):
    for argv in (("topology", "show"), ("policy", "list"), ("topology", "activate"),
                 ("resource-group", "create", "rg_1")):
        code, _out, err = cli(*argv)
        assert code == 2 and "import" in err, argv


def test_help_works_under_OO():
    proc = subprocess.run([sys.executable, "-OO", "-m", "pbs_power.cli.main", "resource-group",
                           "activate", "--help"], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and "--at-least-percent-hosts" in proc.stdout


# -- bad input: exit 2, a message naming the problem, nothing changed -------------------
BAD = [
    (("frobnicate",), "invalid choice: 'frobnicate'"),
    (("resource-group", "frobnicate"), "invalid choice: 'frobnicate'"),
    (("resource-group", "add", "rg_1", "--entities", "gpu[001-"),
     "not a valid hostlist expression 'gpu[001-'"),
    (("resource-group", "add", "rg_1", "--entities", "@gpus"),
     "node groups such as @name are not supported"),
    (("resource-group", "add", "rg_1", "--entities", ""), "names no host"),
    (("resource-group", "add", "rg_1", "--entities", "gpu[100-200]"),
     "not in topology gpu-cluster-a: gpu100, gpu101"),
    (("resource-group", "add", "rg_1", "--entities", "gpu002", "--policy", "Nope"),
     "no policy 'Nope' in topology gpu-cluster-a"),
    (("resource-group", "create", "rg_2", "--policy", "Node-Hi"), "(did you mean 'Node-High'?)"),
    (("resource-group", "create", "rg_1"), "resource group rg_1 already exists"),
    (("resource-group", "create", "rg 1"), "must be 1-128 characters of letters"),
    (("resource-group", "create", "rg_2", "--external-id", "x"), "invalid int value: 'x'"),
    (("resource-group", "create", "rg_2", "--workload-profile-ids", "1,x"),
     "expected comma-separated integers"),
    (("resource-group", "create", "rg_2", "--property", "novalue"), "expected K=V"),
    (("resource-group", "create", "rg_2", "--property", "a=1", "--property", "a=2"),
     "--property a is given twice"),
    (("resource-group", "create", "rg_2", "--prs-enabled", "--no-prs"),
     "not allowed with argument --prs-enabled"),
    (("resource-group", "activate"), "the following arguments are required: NAME"),
    (("resource-group", "activate", "rg_nope"), "no resource group rg_nope"),
    (("resource-group", "delete", "rg_nope"), "no resource group rg_nope"),
    (("resource-group", "activate", "rg_1", "--async-percent-hosts", "150"),
     "must be a percentage from 0 to 100, got '150'"),
    (("resource-group", "activate", "rg_1", "--at-least-percent-hosts", "-5"),
     "must be a percentage from 0 to 100"),
    (("resource-group", "activate", "rg_1", "--at-least-n-hosts", "-1"),
     "must be an integer >= 0, got '-1'"),
    (("resource-group", "activate", "rg_1", "--async-wait", "1", "--async-n-hosts", "2"),
     "argument --async-n-hosts: not allowed with argument --async-wait"),
    (("resource-group", "activate", "rg_1", "--sync", "--async-wait", "0"),
     "argument --async-wait: not allowed with argument --sync"),
    (("resource-group", "activate", "rg_1", "--at-least-n-hosts", "1",
      "--at-least-percent-hosts", "50"), "not allowed with argument --at-least-n-hosts"),
    (("resource-group", "activate", "rg_1", "--host-timeout", "0"), "must be seconds > 0"),
    (("resource-group", "activate", "rg_1", "--async-wait", "nan"), "must be a finite number"),
    (("resource-group", "list", "--device-option", "bogus=1"), "unknown key 'bogus'"),
    (("resource-group", "list", "--device-option", "simulated.latency=1"),
     "unknown key 'simulated.latency'"),
    (("resource-group", "list", "--device-option", "nokey"), "expected KEY=VALUE"),
    (("resource-group", "list", "--device-option", "simulated.failure_rate=2"),
     "failure_rate must be a number from 0 to 1"),
    (("resource-group", "list", "--device-option", "max_workers=0"),
     "max_workers must be an integer >= 1"),
    (("resource-group", "list", "--device-option", "timeout_seconds=soon"),
     "timeout_seconds must be a number > 0"),
    (("resource-group", "list", "--device-option", "seed=1"), "unknown key 'seed'"),
    (("resource-group", "list", "--device-option", "simulated.seed=1",
      "--device-option", "simulated.seed=2"), "--device-option simulated.seed is given twice"),
    (("resource-group", "update", "rg_1"), "one of the arguments --policy --no-policy is required"),
    (("resource-group", "update", "rg_1", "--policy", "Node-Hi"), "did you mean 'Node-High'?"),
    (("resource-group", "update-resources", "rg_1"), "name what to change"),
    (("resource-group", "update-resources", "rg_1", "--entities", "gpu001"),
     "--entities and --policy go together"),
    (("resource-group", "update-resources", "rg_1", "--set", "gpu001=Node-Low",
      "--set", "gpu001=Node-Min"), "gpu001 is given two policies"),
    (("resource-group", "remove", "rg_1", "--entities", "gpu002"), "not in rg_1: gpu002"),
    (("resource-group", "status"), "one of the arguments OPERATION_ID --group is required"),
    (("resource-group", "status", "--type", "update", "abc"), "--type goes with --group"),
    (("resource-group", "status", "--group", "rg_1", "--type", "reboot"), "invalid choice"),
    (("resource-group", "status", "0123abcd"), "no such operation"),
    (("policy", "create", "{bad"), "the JSON given: invalid JSON"),
    (("policy", "create", '{"name": "X", "limits": [{"element_type": "GPU", '
      '"power_limit": {"watts": -1}}]}'), "policy.limits: must include a NODE limit"),
    (("policy", "create", '{"name": "Node-High", "limits": [{"element_type": "NODE", '
      '"power_limit": {"watts": 5000}}]}'), "already has a policy named 'Node-High'"),
    (("policy", "create", "/nonexistent/p.json"), "cannot read the policy file"),
    (("policy", "show", "Node-Hi"), "no policy 'Node-Hi' in topology gpu-cluster-a (did you "
                                    "mean 'Node-High'?)"),
    (("topology", "import", "/nonexistent/t.json"), "/nonexistent/t.json: file not found"),
    (("gpu-policy", "--node", "gpu001=300,abc"),
     "GPU 1 of gpu001: 'abc' is not watts (300), a percentage (80%) or - (remove"),
    (("gpu-policy", "--node", "gpu001=300,150%"),
     "gpu001[1].power_limit.percentage: must be greater than 0 and at most 100"),
    (("gpu-policy", "--node", "gpu001=0"), "gpu001[0].power_limit.watts: must be greater than 0"),
    (("gpu-policy", "--node", "gpu001"), "expected NAME=W0,W1,..."),
    (("gpu-policy", "--node", "gpu001=1", "--node", "gpu[001-002]=1"),
     "--node gpu001 is given twice"),
    (("gpu-policy",), "the following arguments are required: --node"),
]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    state = tmp_path_factory.mktemp("bad") / "state"
    base = ["--state-dir", str(state)] + list(FAST)
    for argv in (["topology", "import", str(TOPOLOGY)], ["topology", "activate"],
                 ["resource-group", "create", "rg_1"],
                 ["resource-group", "add", "rg_1", "--entities", "gpu001"]):
        assert main(argv + base) == 0
    return state, _snapshot(str(state))


def _snapshot(state):
    """Every row of the service's database."""
    import sqlite3
    conn = sqlite3.connect(os.path.join(state, "resource_groups.db"))
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a)[:60] for a, _m in BAD])
def test_bad_input_exits_2_with_a_message(prepared, capsys, argv, message):
    state, before = prepared
    code, out, err = Cli(state, capsys)(*argv, fast=False)
    assert code == 2, (out, err)
    assert message in err, err
    assert _snapshot(str(state)) == before


def test_there_are_many_distinct_bad_inputs():
    assert len({m for _a, m in BAD}) >= 15
