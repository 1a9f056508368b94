"""The PBS adapter's translations, against the stand-in pbs module."""
import importlib.util
import time

import pytest

from pbs_power.states.cycle import Mark
from pbs_power.pbs import attributes
from pbs_power.pbs import hook as adapter
from pbs_standin import cluster as c


@pytest.fixture
def pbs():
    spec = importlib.util.spec_from_file_location("pbs_copy", str(c.STANDIN_DIR / "pbs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("text,names", [
    ("(n1:ncpus=2)+(n2:ncpus=2)", ("n1", "n2")),
    ("(n1:ncpus=1+n2:ncpus=1)+(n3:ncpus=4:mem=1gb)", ("n1", "n2", "n3")),
    ("(big[0]:ncpus=8)+(big[1]:ncpus=8)+(big[0]:ngpus=1)", ("big[0]", "big[1]")),
    ("", ()),
])
def test_parse_exec_vnode(text, names):
    assert attributes.parse_exec_vnode(text) == names


def test_parse_qstat_time_is_local_ctime_or_epoch():
    epoch = 1_800_000_000
    text = time.strftime(attributes.QSTAT_TIME_FORMAT, time.localtime(epoch))
    assert attributes.parse_qstat_time(text) == epoch
    assert attributes.parse_qstat_time(epoch) == epoch
    assert attributes.parse_qstat_time("soon") is None and attributes.parse_qstat_time(None) is None


def test_queued_jobs_take_only_queued_with_estimates():
    doc = {"Jobs": {
        "1.s": {"job_state": "Q", "estimated": {"start_time": "1800000000",
                                                "exec_vnode": "(n1:ncpus=1)"}},
        "2.s": {"job_state": "R", "estimated": {"exec_vnode": "(n2:ncpus=1)"}},
        "3.s": {"job_state": "Q"}}}
    jobs = {j.id: j for j in adapter.queued_jobs_from(doc)}
    assert set(jobs) == {"1.s", "3.s"}
    assert jobs["1.s"].vnodes == ("n1",) and jobs["1.s"].estimated_start == 1.8e9
    assert jobs["3.s"].vnodes == () and jobs["3.s"].estimated_start is None


def test_state_names_from_bits(pbs):
    assert adapter.state_names(pbs, 0) == {"free"}
    assert adapter.state_names(pbs, pbs.ND_SLEEP | pbs.ND_OFFLINE) == {"sleep", "offline"}
    assert adapter.state_names(pbs, pbs.ND_JOBBUSY) == {"job-busy"}


def test_job_ids_on_a_vnode_are_deduplicated():
    assert adapter._id_list("1.s/0, 1.s/1, 22.s/0") == ("1.s", "22.s")
    assert adapter._id_list(None) == ()


def test_apply_marks_builds_values_the_server_accepts(pbs):
    class V:
        def __init__(self, state, host):
            self.state, self.comment = state, None
            self.resources_available = {"host": host}
    vnodes = {"a[0]": V(0, "a"), "a[1]": V(0, "a"), "b": V(pbs.ND_SLEEP | pbs.ND_OFFLINE, "b"),
              "c": V(pbs.ND_SLEEP, "c")}
    logs = []
    adapter.apply_marks(pbs, vnodes, [Mark("a", sleep=True), Mark("b", sleep=False),
                                      Mark("c", sleep=False, offline=True, comment="why"),
                                      Mark("ghost", sleep=True)], lambda *a: logs.append(a))
    assert vnodes["a[0]"].state == vnodes["a[1]"].state == pbs.ND_SLEEP
    assert vnodes["b"].state == pbs.ND_OFFLINE           # admin's offline is kept
    assert vnodes["c"].state == pbs.ND_OFFLINE and vnodes["c"].comment == "why"
    assert logs and "ghost" in logs[0][1]


@pytest.mark.parametrize("eligible,mgmt,expected", [
    (True, None, True), (True, True, True), (True, False, False), (True, "False", False),
    (False, True, False), (None, None, False),
])
def test_power_managed_honours_poweroff_eligible_and_power_mgmt(eligible, mgmt, expected):
    class V:
        poweroff_eligible = eligible
        resources_available = {"host": "n1"} if mgmt is None else {"host": "n1",
                                                                    "power_mgmt": mgmt}
    assert adapter.power_managed(V()) is expected


def test_an_empty_vnode_without_cpus_is_no_host(pbs):
    class V:
        def __init__(self, ncpus, jobs=None):
            self.state, self.jobs, self.resv = 0, jobs, None
            self.poweroff_eligible, self.last_used_time, self.last_state_change_time = 0, 1, 1
            self.resources_available = {"host": "h", "ncpus": ncpus}
    names = [v.name for v in adapter.vnodes_from(pbs, {"mom": V(0), "h[0]": V(4),
                                                     "busy0": V(0, jobs="1.s/0")})]
    assert names == ["h[0]", "busy0"]
