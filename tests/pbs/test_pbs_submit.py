"""An unknown or malformed power_policy is refused at qsub/qalter, not at every cycle."""
import pytest

from pbs_power.pbs.submit import policy_refusal
from pbs_standin import cluster as c
from test_pbs_job_hooks import activate_topology, hook_config, job  # noqa: F401 (fixtures' helpers)

HOOK = c.REPO_ROOT / "hooks" / "pbs_power_job.py"


@pytest.fixture
def site(tmp_path):
    cfg = hook_config(tmp_path)
    activate_topology(tmp_path)
    return c.new_state(tmp_path, cfg, vnodes=["gpu001"])


def submit(site, jid, event="queuejob", **resources):
    state = c.load_state(site)
    state["jobs"][jid] = {"job_state": "Q", "queue": "workq",
                          "Resource_List": dict(resources, ncpus=1)}
    state["event"] = {"job": jid}
    c.save_state(site, state)
    return c.run_hook(HOOK, site, event=event)


def test_form_and_names():
    assert policy_refusal(None, {"Node-Low"}) is None
    assert policy_refusal("Node-Low", {"Node-Low"}) is None
    assert "unknown power_policy NoSuch; known: A, B" in policy_refusal("NoSuch", {"B", "A"})
    assert "malformed" in policy_refusal("a b", None)
    assert "malformed" in policy_refusal("x=y", None)
    assert policy_refusal("anything", None) is None     # no topology: form only


def test_qsub_with_an_unknown_policy_fails_and_creates_no_job(site):
    rec = submit(site, "60.pbssvr", power_policy="NoSuch")
    state = c.load_state(site)
    assert not rec["accepted"] and "60.pbssvr" not in state["jobs"]
    assert state["qsub_error"].startswith("qsub: pbs_power: unknown power_policy NoSuch; known: ")
    assert "Node-Low" in state["qsub_error"]


def test_known_policy_and_no_policy_are_accepted(site):
    assert submit(site, "61.pbssvr", power_policy="Node-Low")["accepted"]
    assert submit(site, "62.pbssvr")["accepted"]
    assert set(c.load_state(site)["jobs"]) == {"61.pbssvr", "62.pbssvr"}


def test_qalter_to_an_unknown_policy_is_refused(site):
    rec = submit(site, "63.pbssvr", event="modifyjob", power_policy="Node-Nope")
    assert not rec["accepted"] and "unknown power_policy Node-Nope" in rec["reject_msg"]
