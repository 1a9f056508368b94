"""Helpers for tests that run PBS hook files under the stand-in harness.

Used by tests (never by a hook).  Typical use::

    cfg = write_hook_config(tmp_path / "hook.json",
                            {"python_path": hook_python_path(), ...})
    st = new_state(tmp_path, cfg, vnodes={"n01": {"last_used_time": 0}})
    rec = run_hook(HOOK, st, now=1_700_000_000)
    assert load_state(st)["vnodes"]["n01"]["state"] == ["sleep"]

STATE.json is documented in README.md next to this file.
"""

import json
import os
import site
import subprocess
import sys
from pathlib import Path

STANDIN_DIR = Path(__file__).resolve().parent
REPO_ROOT = STANDIN_DIR.parent.parent
RUN_HOOK = STANDIN_DIR / "run_hook.py"
QSTAT_IMPL = STANDIN_DIR / "qstat"
DEFAULT_SERVER = "pbssvr"


class HarnessError(RuntimeError):
    """run_hook.py itself failed (a harness bug or a bad STATE.json)."""


def make_vnode(name, state=("free",), **attrs):
    """A STATE.json vnode record with PBS-like defaults."""
    host = attrs.pop("host", name)
    res = {"host": host, "vnode": name, "ncpus": 1}
    res.update(attrs.pop("resources_available", None) or {})
    rec = {"state": [state] if isinstance(state, str) else list(state),
           "host": host, "ntype": 0, "poweroff_eligible": None,
           "last_used_time": None, "last_state_change_time": None,
           "jobs": None, "resv": None, "comment": None,
           "resources_available": res}
    rec.update(attrs)
    return rec


def make_job(job_state="Q", queue="workq", start_time=None, exec_vnode=None,
             **attrs):
    """A STATE.json job record; start_time/exec_vnode fill `estimated`."""
    rec = {"job_state": job_state, "queue": queue}
    if start_time is not None or exec_vnode is not None:
        est = {}
        if exec_vnode is not None:
            est["exec_vnode"] = exec_vnode
        if start_time is not None:
            est["start_time"] = int(start_time)
        rec["estimated"] = est
    rec.update(attrs)
    return rec


def make_resv(reserve_start, reserve_end, resv_nodes="",
              reserve_state="RESV_STATE_CONFIRMED", **attrs):
    rec = {"reserve_start": int(reserve_start), "reserve_end": int(reserve_end),
           "reserve_duration": int(reserve_end) - int(reserve_start),
           "resv_nodes": resv_nodes, "reserve_state": reserve_state}
    rec.update(attrs)
    return rec


def _as_records(items, maker):
    if items is None:
        return {}
    if isinstance(items, dict):
        return {k: (maker(k, **v) if maker is make_vnode else dict(v))
                for k, v in items.items()}
    return {n: make_vnode(n) for n in items}  # a list of vnode names


def new_state(tmpdir, hook_config_file=None, vnodes=None, jobs=None,
              resvs=None, *, server=DEFAULT_SERVER, hook_name=None,
              hook_freq=120, hook_alarm=30, event=None,
              state_name="state.json"):
    """Create a PBS_HOME/PBS_EXEC tree and STATE.json under `tmpdir`.

    vnodes: {name: {attr: value}} (defaults from make_vnode) or [names].
    jobs:   {jobid: record} (see make_job); resvs: {resvid: record}.
    event:  parameters for non-periodic events: {"job": id, "vnode": name,
            "aoe": name, "resv": id}.
    Also writes <pbs_exec>/bin/qstat (the fake qstat).  Returns the path.
    """
    tmpdir = Path(tmpdir)
    pbs_home = tmpdir / "pbs_home"
    pbs_exec = tmpdir / "pbs_exec"
    (pbs_home / "server_priv" / "hooks" / "tmp").mkdir(parents=True,
                                                       exist_ok=True)
    (pbs_exec / "bin").mkdir(parents=True, exist_ok=True)
    state_path = tmpdir / state_name
    state = {
        "server": server, "server_host": server,
        "pbs_home": str(pbs_home), "pbs_exec": str(pbs_exec),
        "hook_config_file": str(hook_config_file) if hook_config_file
        else None,
        "hook_name": hook_name, "hook_freq": hook_freq,
        "hook_alarm": hook_alarm, "event": event or {},
        "vnodes": _as_records(vnodes, make_vnode),
        "jobs": _as_records(jobs, None), "resvs": _as_records(resvs, None),
    }
    state["resource_defs"] = list(INSTALLED_RESOURCES)
    save_state(state_path, state)
    _write_qstat(pbs_exec / "bin" / "qstat", state_path)
    _write_qmgr(pbs_exec / "bin" / "qmgr", state_path)
    return state_path


#: Custom resources `pbs-power pbs install` creates (the stand-in's defaults).
INSTALLED_RESOURCES = ("power_policy", "power_mgmt")


def _write_qmgr(path, state_path):
    """A fake qmgr that only records its argv (one JSON line per call)."""
    path.write_text(
        "#!%s -I\n"
        "# fake qmgr written by tests/pbs_standin/cluster.py\n"
        "import json, sys, time\n"
        "with open(%r, 'a') as f:\n"
        "    f.write(json.dumps({'argv': sys.argv[1:], 'at': time.time()}) + '\\n')\n"
        % (sys.executable, str(state_path) + ".qmgr_calls"))
    path.chmod(0o755)


def qmgr_calls(state_path):
    """{"argv": [...], "at": epoch} of every fake-qmgr call so far."""
    try:
        lines = Path(str(state_path) + ".qmgr_calls").read_text()
    except OSError:
        return []
    return [json.loads(line) for line in lines.splitlines() if line]


def restart_server(state_path, moms_gone=()):
    """What a pbs_server restart does to vnodes: the sleep mark is not kept;
    each MoM registers again and the server clears SLEEP (and UNKNOWN) on
    its vnodes (is_request(), IS_REGISTERMOM, src/server/node_manager.c).
    The vnodes of ``moms_gone`` (hosts off: no MoM to register) show
    ``state-unknown,down`` instead. Both seen on OpenPBS 23.06."""
    state = load_state(state_path)
    for name, rec in state["vnodes"].items():
        if name in moms_gone:
            rec["state"] = ["down", "state-unknown"]
            continue
        rec["state"] = [s for s in rec["state"]
                        if s not in ("sleep", "state-unknown", "down")] or ["free"]
    save_state(state_path, state)


def _write_qstat(path, state_path):
    path.write_text(
        "#!%s -I\n"
        "# fake qstat written by tests/pbs_standin/cluster.py\n"
        "import runpy, sys\n"
        "sys.argv[0] = 'qstat'\n"
        "runpy.run_path(%r, init_globals={'STATE_PATH': %r},\n"
        "               run_name='__main__')\n"
        % (sys.executable, str(QSTAT_IMPL), str(state_path)))
    path.chmod(0o755)


def load_state(path):
    with open(path) as f:
        return json.load(f)


def save_state(path, state):
    tmp = str(path) + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=2, sort_keys=True)
    os.replace(tmp, str(path))


def write_hook_config(path, config):
    """Write a hook config (the file `qmgr import hook ... x-config`
    installs and PBS_HOOK_CONFIG_FILE names).  Returns the path."""
    save_state(path, config)
    return Path(path)


def hook_python_path():
    """Directories a site would list in the hook config's `python_path` so
    the hook can import pbs_power: the repo root and this Python's
    site-packages (for pbs_power's dependencies)."""
    dirs = [str(REPO_ROOT)]
    dirs.extend(p for p in site.getsitepackages() if p not in dirs)
    return dirs


def log_path(state_path):
    return Path(str(state_path) + ".log")


def read_log(state_path):
    """All lines that pbs.logmsg wrote for this STATE.json, oldest first."""
    try:
        return log_path(state_path).read_text().splitlines()
    except OSError:
        return []


def qstat_calls(state_path):
    """argv (without 'qstat') of every fake-qstat call so far."""
    try:
        lines = Path(str(state_path) + ".qstat_calls").read_text()
    except OSError:
        return []
    return [json.loads(line) for line in lines.splitlines() if line]


def run_hook(hook_path, state_path, event="periodic", now=None,
             extra_sys_path=(), timeout=120, env=None):
    """Run `hook_path` once via run_hook.py in `python -I -OO`, as PBS would.

    Returns STATE.json's new "last_run" record, plus "stdout"/"stderr" of
    the run.  Raises HarnessError if the harness itself fails.
    extra_sys_path is a TEST-ONLY shortcut; real sites use python_path.
    """
    cmd = [sys.executable, "-I", "-OO", str(RUN_HOOK), "--hook",
           str(hook_path), "--event", event, "--state", str(state_path)]
    if now is not None:
        cmd += ["--now", repr(now)]
    for p in extra_sys_path:
        cmd += ["--sys-path", str(p)]
    run_env = {"PATH": "/bin:/usr/bin",
               "PBS_STANDIN_LOG": str(log_path(state_path))}
    run_env.update(env or {})
    proc = subprocess.run(cmd, env=run_env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise HarnessError("run_hook.py exited %d\n%s%s" % (
            proc.returncode, proc.stdout, proc.stderr))
    rec = load_state(state_path)["last_run"]
    rec["stdout"], rec["stderr"] = proc.stdout, proc.stderr
    return rec
