"""hooks/pbs_power_job.py, hooks/pbs_power_provision.py and the periodic
hook's leaked-group cleanup, end to end, run the way pbs_server runs them.

Each run executes the real hook file in a fresh ``python -I -OO`` under the
stand-in ``pbs`` module (tests/pbs_standin), against a real resource-group
state (the sample topology, activated) and the simulated devices. The
harness plays the server around the hook: an accepted runjob starts the job,
a rejected one leaves it queued with the scheduler's comment, jobobit ends
it, provisioning sets the vnode's current_aoe.
"""
import json
import time

import pytest

from pbs_power.devices.simulated import SimulatedBackend
from pbs_power.states.model import PowerState, TransitionKind
from pbs_power.groups.service import ResourceGroupService
from pbs_power.groups.topology import load_topology
from pbs_standin import cluster as c

JOB_HOOK = c.REPO_ROOT / "hooks" / "pbs_power_job.py"
PROV_HOOK = c.REPO_ROOT / "hooks" / "pbs_power_provision.py"
PERIODIC_HOOK = c.REPO_ROOT / "hooks" / "PBS_power.py"
T0 = 1_800_000_000
FAST = {"simulated": {"latency_ms": 0}}
BACKEND = {"type": "simulated", "wake_seconds": 1, "sleep_seconds": 1}
HOSTS = ["gpu001", "gpu002", "gpu003", "gpu005", "login1"]


def hook_config(tmp_path, **job_policies):
    jp = {"device_options": FAST, "eoe_policies": {"power-low": "Node-Low"}}
    jp.update(job_policies)
    return c.write_hook_config(tmp_path / "pbs_power.json", {
        "python_path": c.hook_python_path(), "state_dir": str(tmp_path / "state"),
        "power_backend": BACKEND, "node_boot_time": 30, "boot_timeout": 60,
        "job_policies": jp})


def activate_topology(tmp_path):
    svc = ResourceGroupService(str(tmp_path / "state"), FAST)
    svc.import_topology(load_topology(str(c.REPO_ROOT / "config" / "topology.json")))
    assert svc.set_topology_active(True).status.ok
    svc.close()


def job(exec_vnode, queue="workq", **resources):
    return {"job_state": "Q", "queue": queue, "exec_vnode": exec_vnode,
            "Resource_List": dict(resources, ncpus=1)}


@pytest.fixture
def site(tmp_path):
    """A PBS server with five vnodes, an active topology and a hook config."""
    activate_topology(tmp_path)
    cfg = hook_config(tmp_path)
    return c.new_state(tmp_path, cfg, vnodes=HOSTS)


def add_job(state_path, jid, record, **event):
    state = c.load_state(state_path)
    state["jobs"][jid] = record
    state["event"] = dict(event, job=jid)
    c.save_state(state_path, state)


def run_job_hook(state_path, jid, event, now=T0):
    state = c.load_state(state_path)
    state["event"] = {"job": jid}
    c.save_state(state_path, state)
    rec = c.run_hook(JOB_HOOK, state_path, event=event, now=now)
    assert rec["exception"] is None, rec
    return rec


def groups(tmp_path):
    svc = ResourceGroupService(str(tmp_path / "state"), FAST)
    try:
        return {g.group_name: g for g in svc.list().resource_groups}
    finally:
        svc.close()


def applied(group):
    return {p.resource_name: p.applied_policy_name for p in group.resource_policies}


def job_log(rec, jid):
    return [l.split(";", 2)[2] for l in rec["log"] if l.split(";")[1] == jid]


def test_a_leaked_group_of_an_ended_job_does_not_block_the_next_job(site, tmp_path):
    svc = ResourceGroupService(str(tmp_path / "state"), FAST)
    assert svc.create("rg_41.pbssvr", 41, "Node-Low").status.ok      # job 41's jobobit was missed
    assert svc.add_resources("rg_41.pbssvr", ["gpu001"]).status.ok
    assert svc.activate("rg_41.pbssvr").status.ok
    svc.close()
    add_job(site, "42.pbssvr", job("(gpu001:ncpus=1)", power_policy="Node-Low"))
    rec = run_job_hook(site, "42.pbssvr", "runjob")
    assert rec["accepted"] and set(groups(tmp_path)) == {"rg_42.pbssvr"}
    assert any("deleted rg_41.pbssvr: job 41.pbssvr has ended" in l
               for l in job_log(rec, "42.pbssvr"))


def test_a_group_of_a_live_job_is_never_taken(site, tmp_path):
    add_job(site, "41.pbssvr", job("(gpu001:ncpus=1)", power_policy="Node-Low"))
    assert run_job_hook(site, "41.pbssvr", "runjob")["accepted"]
    add_job(site, "42.pbssvr", job("(gpu001:ncpus=1)", power_policy="Node-High"))
    rec = run_job_hook(site, "42.pbssvr", "runjob")
    # PBS packs jobs onto shared hosts by default: the second job runs, under
    # the policy the host has; the first job's group keeps the host.
    assert rec["accepted"] and set(groups(tmp_path)) == {"rg_41.pbssvr"}
    assert c.load_state(site)["jobs"]["42.pbssvr"]["job_state"] == "R"
    assert applied(groups(tmp_path)["rg_41.pbssvr"]) == {"gpu001": "Node-Low"}
    assert any("shares gpu001 with other jobs" in line and "rg_41.pbssvr" in line
               and "Node-High applies only to hosts it holds alone" in line
               for line in job_log(rec, "42.pbssvr"))


def test_a_job_packed_beside_a_running_job_leaves_the_host_as_it_is(site, tmp_path):
    state = c.load_state(site)
    state["vnodes"]["gpu001"]["jobs"] = ["30.pbssvr/0"]      # started before the topology
    c.save_state(site, state)
    add_job(site, "31.pbssvr", job("(gpu001:ncpus=1)+(gpu002:ncpus=1)", power_policy="Node-Low"))
    rec = run_job_hook(site, "31.pbssvr", "runjob")
    assert rec["accepted"]
    assert applied(groups(tmp_path)["rg_31.pbssvr"]) == {"gpu002": "Node-Low"}


def test_subjobs_packed_on_one_host_all_run(site, tmp_path):
    for i in (1, 2, 3):
        jid = "50[%d].pbssvr" % i
        add_job(site, jid, job("(gpu003:ncpus=1)"))
        rec = run_job_hook(site, jid, "runjob")
        assert rec["accepted"], rec
        assert c.load_state(site)["jobs"][jid]["job_state"] == "R"
    assert set(groups(tmp_path)) == {"rg_50_1_.pbssvr"}
    assert "runjob_retries" not in c.load_state(site)


# -- a job's life ------------------------------------------------------------------
def test_job_under_budget_gets_its_policy_until_it_ends(site, tmp_path):
    add_job(site, "42.pbssvr", job("(gpu001:ncpus=1)+(gpu002:ncpus=1)", power_policy="Node-Low"))
    rec = run_job_hook(site, "42.pbssvr", "runjob")
    assert rec["accepted"] and c.load_state(site)["jobs"]["42.pbssvr"]["job_state"] == "R"
    g = groups(tmp_path)["rg_42.pbssvr"]
    assert g.activation_status == "active" and g.external_id == 42
    assert applied(g) == {"gpu001": "Node-Low", "gpu002": "Node-Low"}
    assert any("rg_42.pbssvr active on gpu001,gpu002: policy Node-Low" in l
               for l in job_log(rec, "42.pbssvr"))
    rec = run_job_hook(site, "42.pbssvr", "jobobit", now=T0 + 600)
    assert rec["accepted"] and groups(tmp_path) == {}
    assert any("deleted; topology policies restored" in l for l in job_log(rec, "42.pbssvr"))


def test_over_budget_falls_back_to_a_lower_policy_and_says_so(site, tmp_path):
    add_job(site, "43.pbssvr", job("(gpu001:ncpus=1)", power_policy="Node-High"))
    rec = run_job_hook(site, "43.pbssvr", "runjob")
    assert rec["accepted"]
    assert applied(groups(tmp_path)["rg_43.pbssvr"]) == {"gpu001": "Node-Med"}
    line, = job_log(rec, "43.pbssvr")
    assert "requested Node-High does not fit (rack-01 needs" in line
    assert "applied Node-Med" in line


def test_over_budget_strict_is_rejected_and_leaves_nothing(site, tmp_path):
    hook_config(tmp_path, strict=True)
    add_job(site, "44.pbssvr", job("(gpu001:ncpus=1)", power_policy="Node-High"))
    rec = run_job_hook(site, "44.pbssvr", "runjob")
    assert not rec["accepted"] and rec["reject_msg"].startswith("pbs_power: job 44.pbssvr")
    j = c.load_state(site)["jobs"]["44.pbssvr"]
    # not left queued (the scheduler would ask again at once, in a loop): it waits a cycle
    assert j["job_state"] == "W" and j["Execution_Time"] >= T0 + 60
    assert "runjob_retries" not in c.load_state(site)
    assert j["comment"].startswith("Not Running: PBS Error: pbs_power: job 44.pbssvr cannot "
                                   "get policy Node-High on gpu001: does not fit")
    assert groups(tmp_path) == {}


def test_fail_open_starts_the_job_anyway(site, tmp_path):
    hook_config(tmp_path, strict=True, fail_open=True)
    add_job(site, "45.pbssvr", job("(gpu001:ncpus=1)", power_policy="Node-High"))
    rec = run_job_hook(site, "45.pbssvr", "runjob")
    assert rec["accepted"] and groups(tmp_path) == {}
    assert any("fail_open" in l for l in job_log(rec, "45.pbssvr"))


def test_eoe_and_queue_defaults_and_array_subjobs(site, tmp_path):
    hook_config(tmp_path, queue_defaults={"gpuq": "Node-Min"})
    add_job(site, "46[2].pbssvr", job("(gpu002:ncpus=1)", select="1:ncpus=1:eoe=power-low"))
    add_job(site, "47.pbssvr", job("(gpu003:ncpus=1)", queue="gpuq"))
    run_job_hook(site, "46[2].pbssvr", "runjob")
    run_job_hook(site, "47.pbssvr", "runjob")
    got = groups(tmp_path)
    assert applied(got["rg_46_2_.pbssvr"]) == {"gpu002": "Node-Low"}
    assert got["rg_46_2_.pbssvr"].external_id == 46
    assert applied(got["rg_47.pbssvr"]) == {"gpu003": "Node-Min"}


def test_unmanaged_hosts_and_missing_state_never_block(site, tmp_path):
    add_job(site, "48.pbssvr", job("(login1:ncpus=1)", power_policy="Node-Low"))
    rec = run_job_hook(site, "48.pbssvr", "runjob")
    assert rec["accepted"] and groups(tmp_path) == {}
    assert any("not in topology" in l for l in job_log(rec, "48.pbssvr"))
    (tmp_path / "state" / "resource_groups.db").unlink()
    add_job(site, "49.pbssvr", job("(gpu001:ncpus=1)", power_policy="Node-Low"))
    rec = run_job_hook(site, "49.pbssvr", "runjob")
    assert rec["accepted"] and any("no resource-group state" in l for l in rec["log"])
    assert not (tmp_path / "state" / "resource_groups.db").exists()


def test_internal_error_is_logged_and_accepted(site, tmp_path):
    cfg = json.loads((tmp_path / "pbs_power.json").read_text())
    c.write_hook_config(tmp_path / "pbs_power.json", dict(cfg, python_path=["/nowhere"]))
    add_job(site, "50.pbssvr", job("(gpu001:ncpus=1)"))
    rec = run_job_hook(site, "50.pbssvr", "runjob")
    assert rec["accepted"] and any("internal error, event accepted" in l for l in rec["log"])


def test_a_runjob_hook_cannot_set_the_job_comment(site, tmp_path):
    hook = tmp_path / "comment.py"
    hook.write_text("import pbs\npbs.event().job.comment = 'x'\n")
    add_job(site, "55.pbssvr", job("(gpu001:ncpus=1)"))
    rec = c.run_hook(hook, site, event="runjob", now=T0)
    assert not rec["accepted"] and "AssertionError" in rec["exception"]
    assert c.load_state(site)["jobs"]["55.pbssvr"]["comment"] == (
        "Not Running: PBS Error: request rejected as filter hook 'comment' encountered "
        "an exception. Please inform Admin")


# -- leaked groups -------------------------------------------------------------------
def test_periodic_hook_deletes_the_group_of_a_vanished_job(site, tmp_path):
    for jid, vn in (("51.pbssvr", "(gpu001:ncpus=1)"), ("52.pbssvr", "(gpu002:ncpus=1)")):
        add_job(site, jid, job(vn, power_policy="Node-Low"))
        assert run_job_hook(site, jid, "runjob")["accepted"]
    state = c.load_state(site)
    del state["jobs"]["51.pbssvr"]  # gone without its jobobit (server was down)
    c.save_state(site, state)
    rec = c.run_hook(PERIODIC_HOOK, site, now=T0 + 300)
    assert rec["accepted"] and rec["exception"] is None and rec["qstat_calls"] == 1
    assert sorted(groups(tmp_path)) == ["rg_52.pbssvr"]
    assert any("rg_51.pbssvr: its job is gone (missed jobobit): deleted" in l
               for l in rec["log"])


def test_no_cleanup_when_qstat_fails(site, tmp_path):
    add_job(site, "53.pbssvr", job("(gpu001:ncpus=1)"))
    run_job_hook(site, "53.pbssvr", "runjob")
    state = c.load_state(site)
    state["jobs"] = {}
    c.save_state(site, state)
    (tmp_path / "pbs_exec" / "bin" / "qstat").write_text("#!/bin/sh\nexit 15010\n")
    rec = c.run_hook(PERIODIC_HOOK, site, now=T0 + 300)
    assert rec["accepted"] and sorted(groups(tmp_path)) == ["rg_53.pbssvr"]


# -- provisioning ----------------------------------------------------------------------
SITE_PROVISION_HOOK = '''
import json, sys
import pbs
e = pbs.event()
for p in json.load(open(pbs.hook_config_filename))["python_path"]:
    if p not in sys.path:
        sys.path.insert(0, p)
from pbs_power.pbs.jobs import on_provision
out = on_provision(pbs, pbs.hook_config_filename)
if out is None:
    pbs.logmsg(pbs.LOG_DEBUG, "site: reimaging %s with %s" % (e.vnode, e.aoe))
    e.accept(0)
if not out.accept:
    e.reject(out.message)
e.accept(out.code)
'''


def provision(state_path, vnode, aoe, hook=PROV_HOOK):
    state = c.load_state(state_path)
    state["event"] = {"vnode": vnode, "aoe": aoe}
    c.save_state(state_path, state)
    rec = c.run_hook(hook, state_path, event="provision")
    assert rec["exception"] is None, rec
    return rec


def device_policy(tmp_path, host):
    svc = ResourceGroupService(str(tmp_path / "state"), FAST)
    try:
        return json.loads(svc.store.get_device_state(host) or "{}").get("policy")
    finally:
        svc.close()


def put_to_sleep(tmp_path, host):
    fleet = SimulatedBackend({k: v for k, v in BACKEND.items() if k != "type"},
                             str(tmp_path / "state"))
    fleet.request(TransitionKind.SLEEP, [host], time.time() - 60)
    assert fleet.status([host], time.time())[host].state is PowerState.ASLEEP
    return fleet


def test_an_aoe_we_do_not_own_is_left_alone(site, tmp_path):
    before = device_policy(tmp_path, "gpu003")
    rec = provision(site, "gpu003", "rhel9-cuda")
    assert rec["accepted"] and rec["exit_code"] == 1
    assert device_policy(tmp_path, "gpu003") == before == "Node-Med"
    assert any("aoe rhel9-cuda is not a pbs_power eoe policy" in l for l in rec["log"])


def test_our_aoe_wakes_a_sleeping_host_and_applies_the_policy(site, tmp_path):
    fleet = put_to_sleep(tmp_path, "gpu005")
    rec = provision(site, "gpu005", "power-low")
    assert rec["accepted"] and rec["exit_code"] == 1, rec["log"]
    assert fleet.status(["gpu005"], time.time())["gpu005"].state is PowerState.ON
    assert device_policy(tmp_path, "gpu005") == "Node-Low"
    assert c.load_state(site)["vnodes"]["gpu005"]["current_aoe"] == "power-low"
    assert any("gpu005: was asleep: wake sent" in l for l in rec["log"])
    fleet.close()


def test_our_aoe_in_the_jobs_group_and_a_refusal(site, tmp_path):
    add_job(site, "60.pbssvr", job("(gpu001:ncpus=1)"))
    run_job_hook(site, "60.pbssvr", "runjob")
    rec = provision(site, "gpu001", "power-low")
    assert rec["exit_code"] == 1
    assert applied(groups(tmp_path)["rg_60.pbssvr"]) == {"gpu001": "Node-Low"}
    hook_config(tmp_path, eoe_policies={"power-max": "Node-High"})
    rec = provision(site, "gpu002", "power-max")
    assert not rec["accepted"] and "above its topology policy" in rec["reject_msg"]
    vn = c.load_state(site)["vnodes"]["gpu002"]
    assert "offline" in vn["state"] and vn["current_aoe"] is None


def test_a_site_provisioning_hook_chains_to_ours(site, tmp_path):
    hook = tmp_path / "site_provision.py"
    hook.write_text(SITE_PROVISION_HOOK)
    rec = provision(site, "gpu003", "rhel9-cuda", hook=hook)
    assert rec["exit_code"] == 0 and any("site: reimaging gpu003" in l for l in rec["log"])
    assert device_policy(tmp_path, "gpu003") == "Node-Med"
    rec = provision(site, "gpu003", "power-low", hook=hook)
    assert rec["exit_code"] == 1 and device_policy(tmp_path, "gpu003") == "Node-Low"


def test_a_subjob_is_never_refused(site, tmp_path):
    hook_config(tmp_path, strict=True)
    add_job(site, "51[2].pbssvr", job("(gpu001:ncpus=1)", power_policy="Node-High"))
    rec = run_job_hook(site, "51[2].pbssvr", "runjob")
    state = c.load_state(site)
    assert rec["accepted"] and state["jobs"]["51[2].pbssvr"]["job_state"] == "R"
    assert "runjob_retries" not in state and groups(tmp_path) == {}
    assert any(line.endswith("array subjob started without its policy (refusing a subjob "
                             "makes the scheduler retry its array in a tight loop)")
               for line in job_log(rec, "51[2].pbssvr"))


def test_runjob_bounds_each_device_request():
    from pbs_power.config.hook_config import parse_config
    from pbs_power.pbs.jobs import RUNJOB_DEVICE_TIMEOUT_S, with_device_cap
    slow = parse_config({"job_policies": {"device_options": {"timeout_seconds": 30}}})
    assert with_device_cap(slow, RUNJOB_DEVICE_TIMEOUT_S).job_policies.device_options[
        "timeout_seconds"] == RUNJOB_DEVICE_TIMEOUT_S <= 10
    quick = parse_config({"job_policies": {"device_options": {"timeout_seconds": 2}}})
    assert with_device_cap(quick, 5).job_policies.device_options["timeout_seconds"] == 2
    assert with_device_cap(parse_config({}), 5).job_policies.device_options == {
        "timeout_seconds": 5}
