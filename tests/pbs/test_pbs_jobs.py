"""pbs_power.pbs.jobs against the stand-in ``pbs`` module, in process.

Policy choice, group naming (arrays too), vnode -> host mapping, the job
group's lifecycle, leaked-group cleanup, and provisioning: which aoe is
ours, waking a host, applying the policy with or without a group.
"""
import importlib.util
import json

import pytest

from pbs_power.config.hook_config import JobPolicies, parse_config
from pbs_power.states.model import PowerState, TransitionKind
from pbs_power.groups.service import GROUP_NAME, ResourceGroupService
from pbs_power.pbs import jobs as pj
from pbs_power.groups.topology import load_topology
from pbs_standin import cluster as c

FAST = {"simulated": {"latency_ms": 0}}
POLICIES = ("Node-High", "Node-Med", "Node-Low", "Node-Min", "CPU-Capped")


@pytest.fixture
def pbsmod():
    spec = importlib.util.spec_from_file_location("pbs_standin_copy",
                                                  str(c.STANDIN_DIR / "pbs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def service(tmp_path):
    svc = ResourceGroupService(str(tmp_path / "state"), FAST)
    svc.import_topology(load_topology(str(c.REPO_ROOT / "config" / "topology.json")))
    svc.set_topology_active(True)
    yield svc
    svc.close()


def logger():
    lines = []
    return lines, lambda level, msg: lines.append((level, msg))


# -- naming --------------------------------------------------------------------
@pytest.mark.parametrize("job_id, name, ext", [
    ("123.pbssvr", "rg_123.pbssvr", 123),
    ("123[4].pbssvr", "rg_123_4_.pbssvr", 123),
    ("7[].svr.example.org", "rg_7__.svr.example.org", 7),
])
def test_group_name_and_external_id(job_id, name, ext):
    assert pj.group_name(job_id) == name and pj.external_id(job_id) == ext
    assert GROUP_NAME.fullmatch(pj.group_name(job_id))


def test_external_id_of_a_malformed_id_is_none():
    assert pj.external_id("abc.svr") is None


# -- policy choice -------------------------------------------------------------
JP = JobPolicies(queue_defaults={"gpuq": "Node-Low"}, eoe_policies={"low": "Node-Min"})


@pytest.mark.parametrize("power_policy, eoe, queue, want, why", [
    ("Node-High", "low", "gpuq", "Node-High", "Resource_List.power_policy"),
    (None, "low", "gpuq", "Node-Min", "eoe low mapped"),
    (None, "Node-Med", "gpuq", "Node-Med", "names a topology policy"),
    (None, "bogus", "gpuq", "Node-Low", "queue gpuq default"),
    (None, None, "gpuq", "Node-Low", "queue gpuq default"),
    (None, None, "workq", None, "topology default"),
])
def test_policy_choice_order(power_policy, eoe, queue, want, why):
    got, reason = pj.choose_policy(power_policy, eoe, queue, JP, POLICIES)
    assert got == want and why in reason


def test_unknown_eoe_is_named_in_the_reason():
    _, reason = pj.choose_policy(None, "bogus", "workq", JP, POLICIES)
    assert "eoe bogus is neither" in reason


def make_job(pbsmod, jid="42.pbssvr", **attrs):
    job = pbsmod._job(jid)
    resources = attrs.pop("Resource_List", {})
    for k, v in attrs.items():
        setattr(job, k, v)
    job.Resource_List._values.update(resources)
    return job


@pytest.mark.parametrize("resources, schedselect, want", [
    ({"eoe": "low"}, None, "low"),
    ({"select": "2:ncpus=4:eoe=high"}, None, "high"),
    ({}, "1:eoe=med:ncpus=1+1:ncpus=2", "med"),
    ({"select": "1:ncpus=1"}, None, None),
])
def test_requested_eoe(pbsmod, resources, schedselect, want):
    job = make_job(pbsmod, Resource_List=resources, schedselect=schedselect)
    assert pj.requested_eoe(job) == want


# -- hosts ---------------------------------------------------------------------
def install_server(pbsmod, vnodes):
    def source(kind, key):
        if kind != "vnode":
            return []
        names = [key] if key is not None else list(vnodes)
        out = []
        for n in names:
            if n in vnodes:
                v = pbsmod._vnode(n)
                v.resources_available._values.update(vnodes[n])
                out.append(v)
        return out
    pbsmod._install(pbsmod._event(pbsmod.RUNJOB, "h", {}), pbsmod._server("pbssvr", source),
                    {}, "pbssvr")


def test_vnodes_map_to_hosts_through_the_server(pbsmod):
    install_server(pbsmod, {"big[0]": {"host": "big"}, "big[1]": {"host": "big"},
                            "n2": {"host": "gpu002"}})
    assert pj.job_hosts(pbsmod, "(big[0]:ncpus=8)+(big[1]:ncpus=8)+(n2:ncpus=1)") == [
        "big", "gpu002"]


def test_unknown_vnode_falls_back_to_its_name_without_index(pbsmod):
    install_server(pbsmod, {})
    assert pj.vnode_host(pbsmod, "cpu03[2]") == "cpu03"
    assert pj.job_hosts(pbsmod, "") == []


# -- the job's group -----------------------------------------------------------
def groups(svc):
    return {g.group_name: g for g in svc.list().resource_groups}


def test_group_activated_with_requested_policy(service):
    lines, say = logger()
    out = pj.start_job_group(service, "5.s", ["gpu001"], "Node-Low", "why", JobPolicies(), say)
    g = groups(service)["rg_5.s"]
    assert out.accept and g.activation_status == "active" and g.external_id == 5
    assert g.resource_policies[0].applied_policy_name == "Node-Low"
    assert any("policy Node-Low" in m for _, m in lines)


def test_over_budget_falls_back_and_says_so(service):
    lines, say = logger()
    out = pj.start_job_group(service, "6.s", ["gpu001"], "Node-High", "why", JobPolicies(), say)
    assert out.accept
    assert groups(service)["rg_6.s"].resource_policies[0].applied_policy_name == "Node-Med"
    assert any("requested Node-High does not fit" in m for _, m in lines)


def test_strict_failure_rejects_and_leaves_nothing(service):
    lines, say = logger()
    out = pj.start_job_group(service, "7.s", ["gpu001"], "Node-High", "why",
                             JobPolicies(strict=True), say)
    assert not out.accept and out.message.startswith("pbs_power: job 7.s cannot get policy")
    assert "\n" not in out.message and "rack-01" in out.message
    assert groups(service) == {}


def test_fail_open_accepts_and_leaves_nothing(service):
    lines, say = logger()
    out = pj.start_job_group(service, "8.s", ["gpu001"], "Nope", "why",
                             JobPolicies(fail_open=True), say)
    assert out.accept and groups(service) == {}
    assert any("fail_open" in m and "no policy 'Nope'" in m for _, m in lines)


def test_requeued_job_replaces_its_stale_group(service):
    _, say = logger()
    pj.start_job_group(service, "9.s", ["gpu001"], "Node-Low", "", JobPolicies(), say)
    lines, say = logger()
    out = pj.start_job_group(service, "9.s", ["gpu002"], "Node-Min", "", JobPolicies(), say)
    g = groups(service)["rg_9.s"]
    assert out.accept and [p.resource_name for p in g.resource_policies] == ["gpu002"]
    assert any("deleted stale resource group" in m for _, m in lines)


def test_end_job_group_and_missing_group(service):
    _, say = logger()
    pj.start_job_group(service, "10.s", ["gpu001"], None, "", JobPolicies(), say)
    lines, log = logger()
    assert pj.end_job_group(service, "10.s", log) is True
    assert pj.end_job_group(service, "10.s", log) is False
    assert [lvl for lvl, _ in lines] == ["info", "debug"]


# -- leaked groups -------------------------------------------------------------
def test_cleanup_leaked_keeps_live_arrays_and_foreign_groups(service):
    _, say = logger()
    for jid, host in (("1.s", "gpu001"), ("2.s", "gpu002"), ("5[3].s", "gpu003"),
                      ("6[1].s", "gpu004")):
        pj.start_job_group(service, jid, [host], None, "", JobPolicies(), say)
    service.create("site_group", 99)
    lines, log = logger()
    deleted = pj.cleanup_leaked(service, ["1.s", "5[].s", "77.s"], log)
    assert sorted(deleted) == ["rg_2.s", "rg_6_1_.s"]
    assert sorted(groups(service)) == ["rg_1.s", "rg_5_3_.s", "site_group"]
    assert all("missed jobobit" in m for _, m in lines)


def test_cleanup_spares_groups_newer_than_the_job_list(service):
    _, say = logger()
    pj.start_job_group(service, "3.s", ["gpu001"], None, "", JobPolicies(), say)
    created = service.store.group("rg_3.s").created
    assert pj.cleanup_leaked(service, [], logger()[1], before=created) == []
    assert pj.cleanup_leaked(service, [], logger()[1], before=created + 1) == ["rg_3.s"]


# -- provisioning --------------------------------------------------------------
class FakeBackend:
    """A host that goes on after `steps` status calls once woken."""

    def __init__(self, state, steps=1, ok=True):
        self.state, self.steps, self.ok, self.sent = state, steps, ok, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def request(self, kind, hosts, now):
        from pbs_power.devices import Result
        self.sent.append(kind)
        self.state = PowerState.TRANSITIONING
        return {h: Result(self.ok, "" if self.ok else "BMC says no") for h in hosts}

    def status(self, hosts, now):
        from pbs_power.devices import HostPower
        if self.state is PowerState.TRANSITIONING:
            self.steps -= 1
            if self.steps < 0:
                self.state = PowerState.ON
        return {h: HostPower(self.state) for h in hosts}


def config(tmp_path, **jp):
    return parse_config({"state_dir": str(tmp_path / "state"), "node_boot_time": 30,
                         "boot_timeout": 60,
                         "job_policies": dict({"eoe_policies": {"power-low": "Node-Low"}},
                                              **jp)})


@pytest.mark.parametrize("state, kind", [(PowerState.ASLEEP, TransitionKind.WAKE),
                                         (PowerState.OFF, TransitionKind.POWER_ON)])
def test_wake_host_wakes_and_waits(tmp_path, monkeypatch, state, kind):
    backend = FakeBackend(state, steps=2)
    monkeypatch.setattr("pbs_power.devices.get_backend", lambda cfg, d: backend)
    naps, (lines, log) = [], logger()
    pj.wake_host(config(tmp_path), "gpu001", log, sleep=naps.append)
    assert backend.sent == [kind] and backend.state is PowerState.ON
    assert naps == [pj.WAKE_POLL_SECONDS] * 2 and lines[-1] == ("info", "gpu001: on")


def test_wake_host_leaves_an_on_host_alone(tmp_path, monkeypatch):
    backend = FakeBackend(PowerState.ON)
    monkeypatch.setattr("pbs_power.devices.get_backend", lambda cfg, d: backend)
    pj.wake_host(config(tmp_path), "gpu001", logger()[1], sleep=pytest.fail)
    assert backend.sent == []


def test_wake_failure_is_a_provision_error(tmp_path, monkeypatch):
    monkeypatch.setattr("pbs_power.devices.get_backend",
                        lambda cfg, d: FakeBackend(PowerState.OFF, ok=False))
    with pytest.raises(pj.ProvisionError, match="power_on of gpu001 failed: BMC says no"):
        pj.wake_host(config(tmp_path), "gpu001", logger()[1], sleep=lambda s: None)


def install_provision(pbsmod, cfg_path, vnode, aoe):
    pbsmod._install(pbsmod._event(pbsmod.PROVISION, "prov", {"vnode": vnode, "aoe": aoe}),
                    pbsmod._server("pbssvr", lambda kind, key: []), {}, "pbssvr")


def test_an_aoe_that_is_not_ours_is_left_alone(pbsmod, tmp_path, monkeypatch):
    cfg = tmp_path / "h.json"
    cfg.write_text(json.dumps({"state_dir": str(tmp_path / "state"),
                               "job_policies": {"eoe_policies": {"power-low": "Node-Low"}}}))
    install_provision(pbsmod, cfg, "gpu001", "rhel9-cuda")
    monkeypatch.setattr(pj, "wake_host", pytest.fail)
    assert pj.on_provision(pbsmod, str(cfg)) is None
    assert any("aoe rhel9-cuda is not a pbs_power eoe policy" in l for l in pbsmod._log)


def test_policy_in_the_jobs_group_is_budget_checked(service):
    _, say = logger()
    pj.start_job_group(service, "11.s", ["gpu001"], None, "", JobPolicies(), say)
    assert "resource group rg_11.s" in pj.apply_host_policy(service, "gpu001", "Node-Low")
    assert groups(service)["rg_11.s"].resource_policies[0].applied_policy_name == "Node-Low"
    with pytest.raises(pj.ProvisionError, match="rack-01"):
        pj.apply_host_policy(service, "gpu001", "Node-High")


def test_policy_without_a_group_only_lowers(service):
    assert "no resource group" in pj.apply_host_policy(service, "gpu002", "Node-Low")
    assert json.loads(service.store.get_device_state("gpu002"))["policy"] == "Node-Low"
    with pytest.raises(pj.ProvisionError, match="above its topology policy"):
        pj.apply_host_policy(service, "gpu003", "Node-High")
    with pytest.raises(pj.ProvisionError, match="not a policy"):
        pj.apply_host_policy(service, "gpu003", "Bogus")
    assert "no policy applied" in pj.apply_host_policy(service, "login1", "Node-Low")


def test_wake_host_gives_up_after_boot_timeout(tmp_path, monkeypatch):
    backend = FakeBackend(PowerState.ASLEEP, steps=10 ** 6)
    monkeypatch.setattr("pbs_power.devices.get_backend", lambda cfg, d: backend)
    ticks = iter(range(0, 10 ** 6, 25))
    monkeypatch.setattr(pj.time, "monotonic", lambda: next(ticks))
    with pytest.raises(pj.ProvisionError, match="not on within boot_timeout=60s"):
        pj.wake_host(config(tmp_path), "gpu001", logger()[1], sleep=lambda s: None)
