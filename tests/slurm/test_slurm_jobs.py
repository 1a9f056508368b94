"""pbs_power.slurm.jobs without a Slurm cluster: environment, policy choice, prolog/epilog.

The resource-group service is real (SQLite state in tmp_path, the SIMULATED
device backend); the programs run in process and, once, as the installed
console scripts the way slurmctld starts them (fds 0-2 closed, no PATH,
signals blocked).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pbs_power.config.hook_config import ConfigError, JobPolicies, parse_config
from pbs_power.groups.service import ResourceGroupService
from pbs_power.slurm import jobs as sj
from slurm_jobs_setup import (FAST_DEVICES, groups, make_state, node_caps, run_like_slurmctld,
                              write_config)

ENV = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_PARTITION": "debug",
       "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld", "SLURM_JOB_RESTART_COUNT": "0"}


@pytest.fixture
def state(tmp_path):
    make_state(tmp_path / "state")
    return tmp_path / "state"


@pytest.fixture
def service(state):
    svc = ResourceGroupService(str(state), FAST_DEVICES)
    yield svc
    svc.close()


def collect():
    lines = []
    return lines, lambda level, msg: lines.append((level, msg))


def job(**env):
    return sj.SlurmJob.from_env(dict(ENV, **env))


# -- the environment --------------------------------------------------------------
def test_job_from_prolog_environment():
    got = job(SLURM_JOB_COMMENT="power_policy=Node-Low", SPANK_POWER_POLICY="Node-Min",
              SLURM_JOB_RESTART_COUNT="2")
    assert got == sj.SlurmJob("42", "node[1-2]", "debug", "power_policy=Node-Low", "Node-Min", 2)
    assert got.hosts() == ["node1", "node2"]


def test_spank_variable_set_by_the_plugin_wins_over_the_forwarded_option():
    forwarded = "SPANK__SLURM_SPANK_OPTION_power_policy_power_policy"
    assert job(**{forwarded: "Node-Low"}).spank_policy == "Node-Low"
    assert job(**{forwarded: "Node-Low", "SPANK_POWER_POLICY": "Node-Min"}).spank_policy \
        == "Node-Min"


@pytest.mark.parametrize("value", [None, "", "abc", "42.1"])
def test_without_a_numeric_job_id_it_is_not_a_slurm_program(value):
    env = dict(ENV)
    if value is None:
        del env["SLURM_JOB_ID"]
    else:
        env["SLURM_JOB_ID"] = value
    with pytest.raises(sj.JobEnvError, match="SLURM_JOB_ID"):
        sj.SlurmJob.from_env(env)


def test_nodelist_expansion_and_a_malformed_one():
    assert sorted(job(SLURM_JOB_NODELIST="n[01-03,7],gpu1").hosts()) == [
        "gpu1", "n01", "n02", "n03", "n7"]
    assert job(SLURM_JOB_NODELIST="").hosts() == []
    with pytest.raises(ValueError, match="SLURM_JOB_NODELIST"):
        job(SLURM_JOB_NODELIST="n[1-").hosts()


# -- policy choice -------------------------------------------------------------
@pytest.mark.parametrize("comment, want", [
    ("power_policy=Node-Low", "Node-Low"),
    ("run 3 power_policy=Node-Low keep", "Node-Low"),
    ("a,power_policy=Node-Low;b", "Node-Low"),
    ("power_policy=Node-Low power_policy=Node-Min", "Node-Low"),
    ("xpower_policy=Node-Low", None),
    ("power_policy=", None),
    ("nothing here", None),
    ("", None),
])
def test_comment_policy(comment, want):
    assert sj.comment_policy(comment)[0] == want


def test_malformed_comment_policy_is_noted():
    name, note = sj.comment_policy("power_policy=Node$Low")
    assert name is None and "Node$Low" in note and "ignored" in note


JP = JobPolicies(partition_defaults={"gpu": "Node-Low"})


@pytest.mark.parametrize("env, want, why", [
    ({"SPANK_POWER_POLICY": "Node-High", "SLURM_JOB_COMMENT": "power_policy=Node-Min",
      "SLURM_JOB_PARTITION": "gpu"}, "Node-High", "requested by --power-policy"),
    ({"SLURM_JOB_COMMENT": "power_policy=Node-Min", "SLURM_JOB_PARTITION": "gpu"},
     "Node-Min", "requested by the job comment"),
    ({"SLURM_JOB_PARTITION": "gpu"}, "Node-Low", "partition gpu default"),
    ({"SLURM_JOB_PARTITION": "debug"}, None, "topology default"),
    ({"SPANK_POWER_POLICY": "bad name", "SLURM_JOB_PARTITION": "gpu"}, "Node-Low",
     "--power-policy='bad name' ignored"),
    ({"SLURM_JOB_COMMENT": "power_policy=a/b", "SLURM_JOB_PARTITION": "gpu"}, "Node-Low",
     "comment power_policy='a/b' ignored"),
])
def test_policy_choice_order(env, want, why):
    got, reason = sj.choose_policy(job(**env), JP)
    assert got == want and why in reason


def test_partition_defaults_in_the_hook_config():
    config = parse_config({"job_policies": {"partition_defaults": {"gpu": "Node-Low"}}})
    assert config.job_policies.partition_defaults == {"gpu": "Node-Low"}
    for bad, message in [({"gpu": ""}, "partition_defaults.gpu must not be empty"),
                         ({"a b": "Node-Low"}, "'a b' is not a Slurm partition name"),
                         ([], "partition_defaults must be an object")]:
        with pytest.raises(ConfigError, match=message):
            parse_config({"job_policies": {"partition_defaults": bad}})


# -- prolog and epilog against the real service -----------------------------------
def never_asked(job_id):
    raise AssertionError("Slurm asked about job %s with no shared node" % job_id)


def test_prolog_activates_the_jobs_policy_and_epilog_restores_the_topology(service, state):
    lines, say = collect()
    assert sj.prolog(service, job(SPANK_POWER_POLICY="Node-Low"), JobPolicies(), say,
                     never_asked) == 0
    assert groups(state) == {"rg_42": ("active", 42, {"node1": "Node-Low", "node2": "Node-Low"})}
    caps = node_caps(state)
    assert caps["node1"] == ("Node-Low", 400) and caps["node3"] == ("Node-Med", 600)
    assert any("policy Node-Low (Node-Low requested by --power-policy)" in m for _, m in lines)
    assert sj.epilog(service, job(), say) == 0
    assert groups(state) == {} and node_caps(state)["node1"] == ("Node-Med", 600)


def test_epilog_is_idempotent(service, state):
    _, say = collect()
    sj.prolog(service, job(), JobPolicies(), say, never_asked)
    lines, say = collect()
    assert [sj.epilog(service, job(), say) for _ in range(2)] == [0, 0]
    assert "topology policies restored" in lines[0][1]
    assert lines[1] == ("info", "no resource group rg_42: nothing to do")
    assert sj.epilog(service, job(SLURM_JOB_ID="77"), say) == 0 and groups(state) == {}


def test_over_budget_falls_back_unless_strict(service, state):
    lines, say = collect()
    assert sj.prolog(service, job(SPANK_POWER_POLICY="Node-High"), JobPolicies(), say,
                     never_asked) == 0
    assert groups(state)["rg_42"][2] == {"node1": "Node-Med", "node2": "Node-Med"}
    assert any("requested Node-High does not fit" in m for _, m in lines)


def test_strict_failure_exits_1_says_requeue_and_leaves_nothing(service, state):
    lines, say = collect()
    rc = sj.prolog(service, job(SPANK_POWER_POLICY="Node-High"), JobPolicies(strict=True),
                   say, never_asked)
    assert rc == 1 and groups(state) == {}
    level, message = lines[-1]
    assert level == "warning" and "rack-1" in message
    assert message.endswith("exit 1: Slurm requeues a batch job, cancels an srun/salloc job")
    assert node_caps(state)["node1"] == ("Node-Med", 600)


def test_fail_open_lets_the_job_run_without_a_group(service, state):
    lines, say = collect()
    rc = sj.prolog(service, job(SLURM_JOB_COMMENT="power_policy=Nope"),
                   JobPolicies(fail_open=True), say, never_asked)
    assert rc == 0 and groups(state) == {}
    assert "no policy 'Nope'" in lines[-1][1] and "fail_open" in lines[-1][1]


def test_unknown_policy_without_fail_open_exits_1(service, state):
    lines, say = collect()
    assert sj.prolog(service, job(SPANK_POWER_POLICY="Node-Hgh"), JobPolicies(), say,
                     never_asked) == 1
    assert "did you mean 'Node-High'" in lines[-1][1]


def test_nodes_outside_the_topology_are_skipped(service, state):
    lines, say = collect()
    assert sj.prolog(service, job(SLURM_JOB_NODELIST="node[4-5],login1"), JobPolicies(), say,
                     never_asked) == 0
    assert groups(state)["rg_42"][2] == {"node4": "Node-Med"}
    assert ("info", "not in topology slurm-test, no policy: login1,node5") in lines
    lines, say = collect()
    assert sj.prolog(service, job(SLURM_JOB_ID="43", SLURM_JOB_NODELIST="login[1-2]"),
                     JobPolicies(), say, never_asked) == 0
    assert "rg_43" not in groups(state)
    assert "no node of the job to manage (login[1-2])" in lines[-1][1]


def test_requeued_job_replaces_its_group_from_the_earlier_run(service, state):
    _, say = collect()
    sj.prolog(service, job(), JobPolicies(), say, never_asked)
    lines, say = collect()
    assert sj.prolog(service, job(SLURM_JOB_NODELIST="node3", SLURM_JOB_RESTART_COUNT="1"),
                     JobPolicies(), say, never_asked) == 0
    assert groups(state) == {"rg_42": ("active", 42, {"node3": "Node-Med"})}
    assert ("info", "restart 1") in lines
    assert any("deleted stale resource group rg_42" in m for _, m in lines)


def test_shared_nodes_stay_with_a_running_job_and_ended_jobs_groups_go(service, state):
    _, say = collect()
    sj.prolog(service, job(SLURM_JOB_ID="7", SLURM_JOB_NODELIST="node1",
                           SPANK_POWER_POLICY="Node-Low"), JobPolicies(), say, never_asked)
    sj.prolog(service, job(SLURM_JOB_ID="8", SLURM_JOB_NODELIST="node2"), JobPolicies(), say,
              never_asked)
    assert service.create("site_group").status.ok
    assert service.add_resources("site_group", ["node4"]).status.ok
    asked = []

    def alive(job_id):
        asked.append(job_id)
        return {"7": True, "8": False}[job_id]
    lines, say = collect()
    assert sj.prolog(service, job(SLURM_JOB_ID="9", SLURM_JOB_NODELIST="node[1-4]",
                                  SPANK_POWER_POLICY="Node-Min"), JobPolicies(), say, alive) == 0
    assert sorted(asked) == ["7", "8"]
    got = groups(state)
    assert set(got) == {"rg_7", "rg_9", "site_group"}
    assert got["rg_7"][2] == {"node1": "Node-Low"}
    assert got["rg_9"][2] == {"node2": "Node-Min", "node3": "Node-Min"}
    text = " | ".join(m for _, m in lines)
    assert "deleted rg_8: job 8 has ended but its group still held node2" in text
    assert "node1 left under rg_7 (shared with job 7)" in text
    assert "node4 left under site_group (not a job's group)" in text


def test_a_job_whose_state_cannot_be_read_keeps_its_nodes(service, state):
    _, say = collect()
    sj.prolog(service, job(SLURM_JOB_ID="7", SLURM_JOB_NODELIST="node1"), JobPolicies(), say,
              never_asked)
    lines, say = collect()
    assert sj.prolog(service, job(SLURM_JOB_ID="9", SLURM_JOB_NODELIST="node1"), JobPolicies(),
                     say, lambda job_id: None) == 0
    assert set(groups(state)) == {"rg_7"}
    assert ("info", "node1 left under rg_7 (job 7 may still run)") in lines


def test_epilog_that_cannot_delete_exits_1_and_says_who_cleans_up(service, state):
    from pbs_power.groups.types import fail
    _, say = collect()
    sj.prolog(service, job(), JobPolicies(), say, never_asked)
    service.delete = lambda name: fail("resource group %s is busy (activating by pid 1)" % name,
                                       "busy")
    lines, say = collect()
    assert sj.epilog(service, job(), say, busy_wait=0.5) == 1
    assert lines == [("warning", "rg_42 not deleted (resource group rg_42 is busy (activating "
                                 "by pid 1)); the next job on its nodes deletes it")]


def test_epilog_waits_for_a_group_another_program_is_deleting(service, state):
    # The next job's prolog deletes this job's group as stale while the
    # epilog runs: the epilog waits, finds it gone, and says so (exit 0).
    from pbs_power.groups.types import fail
    _, say = collect()
    sj.prolog(service, job(), JobPolicies(), say, never_asked)
    real_delete, answers = service.delete, []

    def delete(name):
        answers.append(name)
        if len(answers) < 3:
            return fail("resource group %s is busy (deactivating by pid 7)" % name, "busy")
        return real_delete(name) if len(answers) == 3 else fail("gone", "not_found")
    service.delete = delete
    real_delete("rg_42")                      # the other program finished meanwhile
    lines, say = collect()
    assert sj.epilog(service, job(), say, busy_wait=5.0) == 0
    assert lines == [("info", "job ended: rg_42 deleted by another program meanwhile; "
                              "topology policies restored")]
    assert len(answers) == 3 and groups(state) == {}


def test_a_node_taken_by_a_job_starting_at_the_same_time_is_left_to_it(service, state):
    """Two prologs on a shared node: the one that loses the race retries without it."""
    add = service.add_resources
    calls = []

    def add_after_a_rival(name, nodes, policy=None):
        if not calls:  # the other job's prolog adds node2 between our check and our add
            rival = ResourceGroupService(str(state), FAST_DEVICES)
            assert rival.create("rg_99", 99).status.ok
            assert rival.add_resources("rg_99", ["node2"]).status.ok
            rival.close()
        calls.append(list(nodes))
        return add(name, nodes, policy)
    service.add_resources = add_after_a_rival
    lines, say = collect()
    assert sj.prolog(service, job(), JobPolicies(strict=True), say,
                     lambda job_id: job_id == "99") == 0
    assert calls == [["node1", "node2"], ["node1"]]
    assert groups(state)["rg_42"] == ("active", 42, {"node1": "Node-Med"})
    text = " | ".join(m for _, m in lines)
    assert "attempt 2: nodes were taken by another job meanwhile" in text
    assert "node2 left under rg_99 (shared with job 99)" in text
    assert "cannot get policy" not in text


@pytest.mark.parametrize("text, want", [
    ("JobId=7 JobName=x JobState=RUNNING Reason=None", True),
    ("JobId=7 JobState=CONFIGURING Reason=None", True),
    ("JobId=7 JobState=COMPLETING Reason=None", False),
    ("JobId=7 JobState=COMPLETED Reason=None", False),
    ("JobId=7 JobState=PENDING Reason=BeginTime", False),
    ("no state here", None),
])
def test_job_state_alive(text, want):
    assert sj.job_state_alive(text) is want


def test_group_job_ids():
    assert [sj.job_id_of_group(n) for n in ("rg_12", "rg_12_3_", "rg_x", "site", "rg_")] \
        == ["12", None, None, None, None]


# -- the programs ------------------------------------------------------------------
def test_run_logs_one_line_per_job(state, tmp_path):
    log = tmp_path / "slurm.log"
    config = write_config(tmp_path / "hook.json", state, log,
                          partition_defaults={"debug": "Node-Low"})
    assert sj.run("prolog", ENV, str(config)) == 0
    assert sj.run("epilog", ENV, str(config)) == 0
    assert sj.run("epilog", ENV, str(config)) == 0
    lines = log.read_text().splitlines()
    assert len(lines) == 3, lines
    assert "INFO job 42 prolog: rg_42 active on node1,node2: policy Node-Low (partition " \
           "debug default)" in lines[0]
    assert "job 42 epilog: job ended: resource group rg_42 deleted" in lines[1]
    assert "job 42 epilog: no resource group rg_42: nothing to do" in lines[2]


def test_run_without_state_or_with_a_bad_config_lets_the_job_go(tmp_path):
    log = tmp_path / "slurm.log"
    config = write_config(tmp_path / "hook.json", tmp_path / "nostate", log)
    assert sj.run("prolog", ENV, str(config)) == 0
    assert "no resource-group state in" in log.read_text()
    assert not (tmp_path / "nostate").exists()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"job_policies": {"strict": "yes"}}))
    assert sj.run("prolog", ENV, str(bad)) == 0
    assert sj.run("prolog", {}, str(bad)) == 2


def test_installed_prolog_runs_as_slurmctld_starts_it(state, tmp_path):
    """Closed fds 0-2, no PATH, blocked signals: the console script still works."""
    log = tmp_path / "slurm.log"
    config = write_config(tmp_path / "hook.json", state, log, strict=True)
    env = dict(ENV, PBS_POWER_CONFIG=str(config), SLURM_JOB_COMMENT="power_policy=Node-Low")
    bindir = Path(sys.executable).parent
    rc, seconds = run_like_slurmctld(str(bindir / "pbs-power-slurm-prolog"), env)
    assert rc == 0, log.read_text() if log.exists() else "no log"
    assert groups(state)["rg_42"][2] == {"node1": "Node-Low", "node2": "Node-Low"}
    rc2, _ = run_like_slurmctld(str(bindir / "pbs-power-slurm-prolog"),
                                dict(env, SLURM_JOB_ID="43", SLURM_JOB_NODELIST="node[3-4]",
                                     SLURM_JOB_COMMENT="power_policy=Node-High"))
    rc3, _ = run_like_slurmctld(str(bindir / "pbs-power-slurm-epilog"), env)
    assert (rc2, rc3) == (1, 0) and groups(state) == {}
    lines = log.read_text().splitlines()
    assert len(lines) == 3 and "exit 1: Slurm requeues a batch job" in lines[1]
    print("prolog wall time as a process: %.3f s" % seconds)


def test_scontrol_that_fails_once_is_asked_again(tmp_path):
    # slurmctld busy with many prologs at once: the first call fails at once, the next works
    script = tmp_path / "scontrol"
    count = tmp_path / "count"
    script.write_text("#!/bin/sh\nn=0; [ -f %s ] && read n < %s; echo $((n+1)) > %s\n"
                      "[ \"$n\" = 0 ] && { echo 'Unable to contact slurm controller' >&2; "
                      "exit 1; }\necho 'JobId=7 JobState=RUNNING'\n" % (count, count, count))
    script.chmod(0o755)
    env = {"PATH": str(tmp_path)}
    assert sj.scontrol_job_alive("7", env=env, retry_after=0.01) is True
    assert count.read_text().strip() == "2"
    count.write_text("5")
    script.write_text("#!/bin/sh\necho 'Unable to contact slurm controller' >&2\nexit 1\n")
    assert sj.scontrol_job_alive("7", env=env, retry_after=0.01) is None
