"""Tests of the PBS hook stand-in (tests/pbs_standin): the `pbs` module,
the run_hook.py harness that runs a hook like pbs_server, and fake qstat."""

import importlib.util
import json
import subprocess
import time

import pytest

from pbs_standin import cluster as c

NOW = 1_800_000_000
SLEEP_HOOK = c.STANDIN_DIR / "examples" / "sleep_idle.py"


@pytest.fixture
def pbsmod():
    """A private copy of the stand-in module (not registered as `pbs`)."""
    spec = importlib.util.spec_from_file_location(
        "pbs_standin_copy", str(c.STANDIN_DIR / "pbs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write_hook(tmp_path, body, name="probe.py"):
    path = tmp_path / name
    path.write_text(body)
    return path


def cluster(tmp_path, config=None, **kw):
    cfg = c.write_hook_config(tmp_path / "hook.json", config or {})
    return c.new_state(tmp_path, cfg, **kw)


# -- the module itself --------------------------------------------------------

def test_constants_have_openpbs_values(pbsmod):
    assert (pbsmod.ND_FREE, pbsmod.ND_OFFLINE, pbsmod.ND_DOWN) == (0, 1, 2)
    assert pbsmod.ND_JOBBUSY == 0x10 and pbsmod.ND_JOB_EXCLUSIVE == 0x40
    assert pbsmod.ND_SLEEP == 0x40000 and pbsmod.ND_MAINTENANCE == 0x20000
    assert pbsmod.ND_PROV == 0x800 and pbsmod.ND_WAIT_PROV == 0x1000
    assert not hasattr(pbsmod, "ND_JOB_BUSY")  # the real name is ND_JOBBUSY
    assert pbsmod.PERIODIC == 0x8000 and pbsmod.RUNJOB == 0x10
    assert pbsmod.EXECJOB_END == 0x200 and pbsmod.PROVISION == 0x20
    assert (pbsmod.LOG_DEBUG, pbsmod.LOG_WARNING, pbsmod.LOG_ERROR) == (5, 6, 7)
    assert pbsmod.EVENT_DEBUG == 0x80 and pbsmod.EVENT_DEBUG4 == 0x800
    assert pbsmod.RESV_STATE_CONFIRMED == 2 and pbsmod.RESV_STATE_RUNNING == 5


def test_state_names_round_trip(pbsmod):
    bits = pbsmod._names_to_state(["offline", "sleep"])
    assert bits == pbsmod.ND_OFFLINE | pbsmod.ND_SLEEP
    assert pbsmod._state_to_names(bits) == ["offline", "sleep"]
    assert pbsmod._state_to_names(0) == ["free"]
    assert pbsmod._state_to_names(pbsmod.ND_JOBBUSY) == ["job-busy"]
    with pytest.raises(ValueError):
        pbsmod._names_to_state(["asleep"])


def test_vnode_attribute_types_and_errors(pbsmod):
    v = pbsmod._vnode("n01")
    pbsmod._set_python_mode(True)
    v.state = pbsmod.ND_SLEEP
    assert isinstance(v.state, int) and v.state == pbsmod.ND_SLEEP
    assert (v.state & ~pbsmod.ND_SLEEP) == pbsmod.ND_FREE
    with pytest.raises(pbsmod.BadAttributeValueError):
        v.state = 0x100000  # not a vnode state bit
    with pytest.raises(pbsmod.BadAttributeValueTypeError):
        v.state = "sleep"
    with pytest.raises(pbsmod.UnsetAttributeNameError):
        v.no_such_attribute = 1
    v.poweroff_eligible = True
    assert v.poweroff_eligible and str(v.poweroff_eligible) == "1"
    assert (v.poweroff_eligible == True) is False  # noqa: E712 - as in PBS
    v.last_used_time = 12.7
    assert v.last_used_time == 12
    assert set(v._modified) == {"state", "poweroff_eligible", "last_used_time"}


def test_accept_and_reject_raise_systemexit(pbsmod):
    ev = pbsmod._event(pbsmod.PERIODIC, "h", {"vnode_list": {}})
    with pytest.raises(SystemExit) as e:
        ev.reject("no")
    assert e.value.code == "255" and pbsmod._state["accepted"] is False
    with pytest.raises(SystemExit) as e:
        ev.accept()
    assert e.value.code == "0" and pbsmod._state["accepted"] is True
    with pytest.raises(pbsmod.EventIncompatibleError):
        ev.job  # a periodic event has no job


def test_periodic_hook_may_only_set_vnodes(pbsmod):
    ev = pbsmod._event(pbsmod.PERIODIC, "h", {})
    pbsmod._install(ev, None, {}, "svr")
    job = pbsmod._job("1.svr")
    pbsmod._set_python_mode(True)
    with pytest.raises(AssertionError):
        job.comment = "x"


# -- the harness --------------------------------------------------------------

def test_sleep_is_applied_with_state_change_time(tmp_path):
    st = cluster(tmp_path, {"node_idle_limit": 100}, vnodes={
        "n01": {"poweroff_eligible": True, "last_used_time": NOW - 1000,
                "last_state_change_time": 5},
        "n02": {"poweroff_eligible": False, "last_used_time": 0},
        "n03": {"state": ["job-busy"], "poweroff_eligible": True,
                "last_used_time": 0}})
    rec = c.run_hook(SLEEP_HOOK, st, now=NOW)
    assert rec["accepted"] and rec["exception"] is None
    vn = c.load_state(st)["vnodes"]
    assert vn["n01"]["state"] == ["sleep"]
    assert vn["n01"]["last_state_change_time"] == NOW
    assert vn["n01"]["comment"].startswith("sleep_idle: idle since")
    assert vn["n02"]["state"] == ["free"] and vn["n03"]["state"] == ["job-busy"]
    assert set(rec["applied"]) == {"n01"}


def test_multi_cycle_with_fake_clock_and_one_qstat_per_cycle(tmp_path):
    st = cluster(tmp_path, {"node_idle_limit": 600, "wake_horizon": 900},
                 vnodes={"n01": {"poweroff_eligible": True,
                                 "last_used_time": NOW}},
                 jobs={"%d.pbssvr" % i: c.make_job(start_time=NOW + 10_000)
                       for i in range(3)})
    c.run_hook(SLEEP_HOOK, st, now=NOW + 60)
    assert c.load_state(st)["vnodes"]["n01"]["state"] == ["free"]
    c.run_hook(SLEEP_HOOK, st, now=NOW + 700)
    assert c.load_state(st)["vnodes"]["n01"]["state"] == ["sleep"]
    s = c.load_state(st)
    s["jobs"]["9.pbssvr"] = c.make_job(start_time=NOW + 1200,
                                       exec_vnode="(n01:ncpus=1)")
    c.save_state(st, s)
    rec = c.run_hook(SLEEP_HOOK, st, now=NOW + 800)
    vn = c.load_state(st)["vnodes"]["n01"]
    assert vn["state"] == ["free"] and vn["last_state_change_time"] == NOW + 800
    assert rec["qstat_calls"] == 1 and len(c.qstat_calls(st)) == 3


def test_reject_applies_nothing(tmp_path):
    hook = write_hook(tmp_path, (
        "import pbs\n"
        "e = pbs.event()\n"
        "e.vnode_list['n01'].state = pbs.ND_SLEEP\n"
        "e.reject('not today')\n"))
    st = cluster(tmp_path, vnodes=["n01"])
    before = c.load_state(st)["vnodes"]
    rec = c.run_hook(hook, st)
    assert rec["accepted"] is False and rec["reject_msg"] == "not today"
    assert c.load_state(st)["vnodes"] == before
    assert "LOG_ERROR;probe;periodic request rejected by 'probe'" in rec["log"]


def test_exception_applies_nothing_and_is_recorded(tmp_path):
    hook = write_hook(tmp_path, (
        "import pbs\n"
        "pbs.event().vnode_list['n01'].comment = 'half done'\n"
        "raise RuntimeError('boom')\n"))
    st = cluster(tmp_path, vnodes=["n01"])
    rec = c.run_hook(hook, st)
    assert rec["accepted"] is False and "RuntimeError: boom" in rec["exception"]
    assert c.load_state(st)["vnodes"]["n01"]["comment"] is None
    assert any("encountered an exception" in line for line in rec["log"])


def test_falling_off_the_end_accepts(tmp_path):
    hook = write_hook(tmp_path, (
        "import pbs\n"
        "pbs.event().vnode_list['n01'].comment = 'hello'\n"))
    st = cluster(tmp_path, vnodes=["n01"])
    assert c.run_hook(hook, st)["accepted"] is True
    assert c.load_state(st)["vnodes"]["n01"]["comment"] == "hello"


def test_server_combines_state_like_pbs(tmp_path):
    hook = write_hook(tmp_path, (
        "import pbs\n"
        "vl = pbs.event().vnode_list\n"
        "vl['a'].state = vl['a'].state & ~pbs.ND_SLEEP\n"
        "vl['b'].state = pbs.ND_FREE\n"
        "vl['c'].state = vl['c'].state | pbs.ND_SLEEP\n"
        "pbs.event().accept()\n"))
    st = cluster(tmp_path, vnodes={"a": {"state": ["sleep"]},
                                   "b": {"state": ["offline", "sleep"]},
                                   "c": {"state": ["job-busy"]}})
    rec = c.run_hook(hook, st)
    vn = c.load_state(st)["vnodes"]
    assert vn["a"]["state"] == ["free"] and vn["b"]["state"] == ["free"]
    assert vn["c"]["state"] == ["job-busy"]  # "job-busy,sleep" is refused
    assert rec["apply_errors"] and "c: state" in rec["apply_errors"][0]


def test_runs_like_pbs_server(tmp_path):
    out = tmp_path / "probe.json"
    hook = write_hook(tmp_path, (
        "import json, os, sys, time\n"
        "import pbs\n"
        "def f():\n"
        "    'doc'\n"
        "assert False, 'asserts are stripped under -OO'\n"
        "cfg = json.load(open(pbs.hook_config_filename))\n"
        "try:\n"
        "    import pbs_power\n"
        "    found = True\n"
        "except ImportError:\n"
        "    found = False\n"
        "for p in cfg.get('python_path', []):\n"
        "    if p not in sys.path:\n"
        "        sys.path.insert(0, p)\n"
        "import pbs_power\n"
        "json.dump({'name': __name__, 'optimize': sys.flags.optimize,\n"
        "           'isolated': sys.flags.isolated, 'doc': f.__doc__,\n"
        "           'cwd': os.getcwd(), 'path': os.environ['PATH'],\n"
        "           'cfg_env': os.environ.get('PBS_HOOK_CONFIG_FILE'),\n"
        "           'cfg': pbs.hook_config_filename, 'found_first': found,\n"
        "           'now': time.time(), 'conf': pbs.get_pbs_conf(),\n"
        "           'type': pbs.event().type, 'hook': pbs.event().hook_name},\n"
        "          open(cfg['out'], 'w'))\n"
        "pbs.logmsg(pbs.LOG_DEBUG, 'probe done')\n"))
    st = cluster(tmp_path, {"out": str(out),
                            "python_path": c.hook_python_path()},
                 vnodes=["n01"])
    rec = c.run_hook(hook, st, now=NOW)
    assert rec["exception"] is None, rec["exception"]
    p = json.loads(out.read_text())
    assert p["name"] == "builtins" and p["doc"] is None
    assert p["optimize"] == 2 and p["isolated"] == 1
    assert p["cwd"] == str(tmp_path / "pbs_home" / "server_priv" / "hooks"
                           / "tmp")
    assert p["path"] == "/bin:/usr/bin"
    assert p["cfg"] == p["cfg_env"] == str(tmp_path / "hook.json")
    assert p["found_first"] is False  # no site-packages without python_path
    assert p["now"] == NOW and p["type"] == 0x8000 and p["hook"] == "probe"
    assert p["conf"]["PBS_EXEC"] == str(tmp_path / "pbs_exec")
    assert p["conf"]["PBS_HOME"] == str(tmp_path / "pbs_home")
    assert p["conf"]["PBS_SERVER"] == "pbssvr"
    # hook lines are tagged with the daemon, not the hook (OpenPBS 23.06 server_logs)
    assert rec["log"] == ["LOG_DEBUG;Server@pbssvr;probe done"]
    assert c.read_log(st) == rec["log"]


def test_alarm_stops_a_slow_hook(tmp_path):
    hook = write_hook(tmp_path, (
        "import time, pbs\n"
        "pbs.event().vnode_list['n01'].comment = 'slow'\n"
        "time.sleep(30)\n"))
    st = cluster(tmp_path, vnodes=["n01"], hook_alarm=1)
    rec = c.run_hook(hook, st)
    assert rec["accepted"] is False and rec["exception"] == "alarm"
    assert c.load_state(st)["vnodes"]["n01"]["comment"] is None


# -- fake qstat ---------------------------------------------------------------

def qstat(state_path, *args):
    exe = c.load_state(state_path)["pbs_exec"] + "/bin/qstat"
    return subprocess.run([exe] + list(args), capture_output=True, text=True,
                          env={"PATH": "/bin:/usr/bin"})


def test_fake_qstat_prints_pbs_json(tmp_path):
    st = cluster(tmp_path, jobs={
        "12.pbssvr": c.make_job(start_time=NOW, exec_vnode="(n01:ncpus=8)",
                                Resource_List={"ncpus": 8, "nodect": 1}),
        "13.pbssvr": c.make_job(job_state="F")})
    p = qstat(st, "-f", "-F", "json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert set(out) == {"timestamp", "pbs_version", "pbs_server", "Jobs"}
    assert out["pbs_server"] == "pbssvr" and list(out["Jobs"]) == ["12.pbssvr"]
    job = out["Jobs"]["12.pbssvr"]
    assert job["job_state"] == "Q" and job["Resource_List"]["ncpus"] == 8
    start = job["estimated"]["start_time"]
    assert time.mktime(time.strptime(start, "%a %b %d %H:%M:%S %Y")) == NOW
    assert job["estimated"]["exec_vnode"] == "(n01:ncpus=8)"
    assert '"pbs_server":"pbssvr"' in p.stdout  # PBS style: no space


def test_fake_qstat_job_ids_and_errors(tmp_path):
    st = cluster(tmp_path, jobs={"12.pbssvr": c.make_job()})
    p = qstat(st, "-f", "-F", "json", "12")
    assert p.returncode == 0 and list(json.loads(p.stdout)["Jobs"]) == [
        "12.pbssvr"]
    p = qstat(st, "-f", "-F", "json", "99.pbssvr")
    assert p.returncode == 153
    assert p.stderr == "qstat: Unknown Job Id 99.pbssvr\n"
    assert qstat(st, "-Q").returncode == 2
    assert c.qstat_calls(st) == [["-f", "-F", "json", "12"],
                                 ["-f", "-F", "json", "99.pbssvr"], ["-Q"]]
