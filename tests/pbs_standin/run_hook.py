"""Run one PBS hook file the way pbs_server does, against STATE.json.

    python -I -OO tests/pbs_standin/run_hook.py --hook FILE --event periodic \
        --state STATE.json [--now EPOCH] [--sys-path DIR ...]

Test-only.  What it mimics and where that comes from: README.md here.
Exits 0 whatever the hook did; non-zero only for a harness bug or bad input.
"""

import argparse
import json
import os
import sys
import time
import traceback

_HERE = os.path.dirname(os.path.abspath(__file__))
_STDLIB_FINDER_MODULES = ("_frozen_importlib", "_frozen_importlib_external",
                          "importlib._bootstrap",
                          "importlib._bootstrap_external", "zipimport")


class _HookAlarm(BaseException):
    pass


def _parse_args(argv):
    p = argparse.ArgumentParser(prog="run_hook.py")
    p.add_argument("--hook", required=True)
    p.add_argument("--event", default="periodic")
    p.add_argument("--state", required=True)
    p.add_argument("--now", type=float, default=None,
                   help="TEST-ONLY fake clock: time.time() returns this")
    p.add_argument("--sys-path", action="append", default=[],
                   help="TEST-ONLY: extra sys.path entry for the hook")
    return p.parse_args(argv)


def _install_fake_clock(now):
    """Replace time.time (and time_ns) before anything of the hook's runs.
    datetime.now() and time.monotonic() are NOT faked."""
    time.time = lambda: float(now)
    time.time_ns = lambda: int(now * 1000000000)


def _strip_site_packages():
    """The PBS hook interpreter has no site-packages (DESIGN.md); `python -I`
    still adds the venv's site-packages and runs its .pth files, so undo
    that: drop those sys.path entries, their import hooks and modules."""
    dirs = set()
    try:
        import site
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except Exception:
        pass
    dirs = set(os.path.realpath(d) for d in dirs)

    def foreign(p):
        rp = os.path.realpath(p) if p else p
        return (rp in dirs or os.path.basename(rp) in ("site-packages",
                                                       "dist-packages")
                or str(p).startswith("__editable__"))
    sys.path[:] = [p for p in sys.path if not foreign(p)]
    sys.meta_path[:] = [f for f in sys.meta_path if getattr(
        f, "__module__", type(f).__module__) in _STDLIB_FINDER_MODULES]
    sys.path_hooks[:] = [h for h in sys.path_hooks if getattr(
        h, "__module__", "") in _STDLIB_FINDER_MODULES]
    sys.path_importer_cache.clear()
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None) or ""
        if any(os.path.realpath(f).startswith(d + os.sep) for d in dirs):
            del sys.modules[name]


def _load_pbs(hook_config_file):
    """Make `import pbs` find the stand-in, as if built in."""
    if hook_config_file:
        os.environ["PBS_HOOK_CONFIG_FILE"] = hook_config_file
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "pbs", os.path.join(_HERE, "pbs.py"))
    pbs = importlib.util.module_from_spec(spec)
    sys.modules["pbs"] = pbs
    spec.loader.exec_module(pbs)
    return pbs


def _fill(pbs, obj, raw, skip=()):
    for k, v in raw.items():
        if k in skip:
            continue
        if k not in obj._ATTRS:
            raise SystemExit("STATE.json: %s %s: unknown attribute %r"
                             % (obj._KIND, obj, k))
        if obj._ATTRS[k] == pbs._RESC:
            getattr(obj, k)._values.update(v or {})
        else:
            setattr(obj, k, v)


def _state_bits(pbs, names):
    if isinstance(names, int):
        return names
    return pbs._names_to_state([names] if isinstance(names, str) else
                               (names or ["free"]))


def _make_vnode(pbs, name, raw):
    v = pbs._vnode(name)
    raw = dict(raw)
    v.state = _state_bits(pbs, raw.pop("state", ["free"]))
    for k in ("jobs", "resv"):  # PBS shows these as "a, b" strings
        if isinstance(raw.get(k), list):
            raw[k] = ", ".join(raw[k]) or None
    _fill(pbs, v, raw, skip=("host",))
    ra = v.resources_available
    ra._values.setdefault("vnode", name)
    ra._values.setdefault("host", raw.get("host", name))
    return v


def _make_job(pbs, jobid, raw):
    j = pbs._job(jobid)
    raw = dict(raw)
    st = raw.pop("job_state", "Q")
    j.job_state = pbs._JOB_STATE_LETTERS[st] if isinstance(st, str) else st
    _fill(pbs, j, raw)
    if j.queue is not None:  # a queue object in server events
        object.__setattr__(j, "queue", pbs._queue(j.queue))
    return j


def _make_resv(pbs, resvid, raw):
    r = pbs._resv(resvid)
    raw = dict(raw)
    st = raw.pop("reserve_state", "RESV_CONFIRMED")
    if isinstance(st, str):
        st = getattr(pbs, st if st.startswith("RESV_STATE_")
                     else "RESV_STATE_" + st.replace("RESV_", "", 1))
    r.reserve_state = st
    _fill(pbs, r, raw)
    return r


def _build(pbs, state, args, hook_name):
    makers = {"vnode": ("vnodes", _make_vnode), "job": ("jobs", _make_job),
              "resv": ("resvs", _make_resv)}

    def source(kind, key):
        section, make = makers[kind]
        items = state.get(section) or {}
        keys = [key] if key is not None else list(items)
        return [make(pbs, k, items[k]) for k in keys if k in items]

    etype = pbs._EVENT_TYPES.get(args.event)
    if etype is None:
        raise SystemExit("unknown --event %r" % args.event)
    evcfg = state.get("event") or {}
    vnodes = dict((v.name, v) for v in source("vnode", None))
    params = {}
    if etype in (pbs.PERIODIC, pbs.EXECHOST_PERIODIC, pbs.EXECHOST_STARTUP) \
            or etype & pbs.MOM_EVENTS:
        params["vnode_list"] = vnodes
    if etype == pbs.PERIODIC:
        params["resv_list"] = dict((r.resvid, r) for r in source("resv", None))
    if etype == pbs.EXECHOST_PERIODIC:
        params["job_list"] = dict((j.id, j) for j in source("job", None))
    if evcfg.get("job"):
        params["job"] = (source("job", evcfg["job"]) or [None])[0]
    if evcfg.get("resv"):
        params["resv"] = (source("resv", evcfg["resv"]) or [None])[0]
    if etype in (pbs.PROVISION, pbs.MODIFYVNODE):
        params["vnode"] = evcfg.get("vnode")
        params["aoe"] = evcfg.get("aoe")
    server = state.get("server", "pbssvr")
    ev = pbs._event(etype, hook_name, params, freq=state.get("hook_freq", 120),
                    requestor_host=server)
    conf = {"PBS_EXEC": state.get("pbs_exec", ""),
            "PBS_HOME": state.get("pbs_home", ""), "PBS_SERVER": server}
    conf.update(state.get("pbs_conf") or {})
    pbs.defined_resources.update(state.get("resource_defs") or ())
    srv = state.get("server_attrs") or {}
    pbs._install(ev, pbs._server(server, source, srv.get("scheduling", True),
                                 srv.get("power_provisioning", False)), conf,
                 state.get("server_host", server))
    return ev


def _run(code, alarm):
    """Returns (exception text or None, True if it was the alarm)."""
    import signal

    def on_alarm(signum, frame):
        raise _HookAlarm()
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(alarm))
    try:
        exec(code, {"__name__": "builtins", "__builtins__": __builtins__})
    except SystemExit:
        return None, False
    except _HookAlarm:
        return "alarm", True
    except BaseException:
        return traceback.format_exc(), False
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return None, False


def _apply_vnode(pbs, v, rec, now, errors):
    """What pbs_server does with a vnode's hook-set attributes (README)."""
    changes = {}
    for attr in v._modified:
        val = getattr(v, attr)
        if attr == "state":
            old = _state_bits(pbs, rec.get("state"))
            settable = pbs.ND_DOWN | pbs.ND_OFFLINE | pbs.ND_OFFLINE_BY_MOM \
                | pbs.ND_SLEEP
            if val is None or int(val) & ~settable:
                errors.append("%s: state %s refused: the server takes only "
                              "free/offline/down/sleep" % (
                                  v.name, pbs._state_to_names(int(val or 0))))
                continue
            if old & (pbs.ND_STALE | pbs.ND_PROV):
                errors.append("%s: state not changed: node is %s"
                              % (v.name, pbs._state_to_names(old)))
                continue
            new = (old & ~settable) | int(val)
            changes["state"] = pbs._state_to_names(new)
            if new != old:
                changes["last_state_change_time"] = int(now)
        elif attr in ("resources_available", "resources_assigned"):
            continue
        elif isinstance(val, pbs.pbs_bool):
            changes[attr] = bool(val)
        else:
            changes.setdefault(attr, val if val is None else
                               (int(val) if isinstance(val, int) else val))
    for attr in ("resources_available", "resources_assigned"):
        res = getattr(v, attr)
        for k in res._modified:
            changes.setdefault(attr, dict(rec.get(attr) or {}))[k] = res[k]
    return changes


def _write_back(pbs, state, ev, now, outcome):
    applied, errors = {}, []
    if outcome["accepted"]:
        for name, v in (getattr(ev, "_param", {}).get("vnode_list") or {}).items():
            if not v._modified and not any(
                    getattr(v, a)._modified for a in ("resources_available",
                                                      "resources_assigned")):
                continue
            rec = (state.get("vnodes") or {}).get(name)
            if rec is None:
                errors.append("%s: no such vnode; changes dropped" % name)
                continue
            ch = _apply_vnode(pbs, v, rec, now, errors)
            rec.update(ch)
            if ch:
                applied[name] = ch
    job = getattr(ev, "_param", {}).get("job")
    if ev.type != pbs.PERIODIC and job is not None and job._modified:
        # accept: every settable attribute goes back; a runjob reject sends
        # back only runjob_reject_attrlist (src/server/hook_func.c)
        keep = None if outcome["accepted"] else (
            _RUNJOB_REJECT_ATTRS if ev.type == pbs.RUNJOB else ())
        rec = state["jobs"][job.id]
        for attr in job._modified:
            if keep is not None and attr not in keep:
                continue
            val = getattr(job, attr)
            rec[attr] = val._values if isinstance(val, pbs.pbs_resource) \
                else val
    return applied, errors


_RUNJOB_REJECT_ATTRS = ("Execution_Time", "Hold_Types", "project", "depend",
                        "Variable_List", "Resource_List")


def _server_effects(pbs, state, ev, outcome, hook_msg, now):
    """What the server (and scheduler) do after a runjob, jobobit or provision
    hook, as far as STATE.json shows it (README.md, "Job events")."""
    params = getattr(ev, "_param", {})
    job = params.get("job")
    rec = (state.get("jobs") or {}).get(job.id) if job is not None else None
    if ev.type == pbs.RUNJOB and rec is not None:
        if outcome["accepted"]:
            rec.update(job_state="R", stime=int(now))
            return
        # The scheduler quotes the reply text. A job whose Execution_Time the
        # hook set into the future waits (state W), else it stays queued and
        # is tried again next cycle. A refused array subjob makes the
        # scheduler retry the array at once, in the same cycle, and one left
        # in W is retried for good ("Request invalid for state of job"): a
        # tight loop either way (seen on OpenPBS 23.06).
        rec["comment"] = "Not Running: PBS Error: %s" % hook_msg
        rec["job_state"] = "W" if (rec.get("Execution_Time") or 0) > now else "Q"
        if "[" in job.id:
            state.setdefault("runjob_retries", []).append(job.id)
    elif ev.type in (pbs.QUEUEJOB, pbs.MODIFYJOB) and rec is not None:
        # A rejected qsub creates no job and qsub prints "qsub: <message>",
        # exit 32 (seen on OpenPBS 23.06); a rejected qalter changes nothing.
        if not outcome["accepted"] and ev.type == pbs.QUEUEJOB:
            del state["jobs"][job.id]
            state["qsub_error"] = "qsub: %s" % hook_msg
    elif ev.type == pbs.JOBOBIT and rec is not None:
        rec.update(job_state="F", obittime=int(now))
    elif ev.type == pbs.PROVISION:
        vn = (state.get("vnodes") or {}).get(params.get("vnode"))
        if vn is None:
            return
        if outcome["exit_code"] in (0, 1):  # prov_request_deferred()
            vn["current_aoe"] = params.get("aoe")
        else:  # fail_vnode(): offline, current_aoe unset
            vn["state"] = sorted(set(vn.get("state") or []) - {"free"}
                                 | {"offline"})
            vn["comment"] = "Vnode offlined since it failed provisioning"
            vn["current_aoe"] = None


def main(argv=None):
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    if args.now is not None:
        _install_fake_clock(args.now)
    with open(args.state) as f:
        state = json.load(f)
    hook_path = os.path.abspath(args.hook)
    hook_name = state.get("hook_name") or os.path.splitext(
        os.path.basename(hook_path))[0]
    cfg = state.get("hook_config_file") or os.environ.get(
        "PBS_HOOK_CONFIG_FILE")
    os.environ["PATH"] = "/bin:/usr/bin"
    if args.now is not None:
        os.environ["PBS_STANDIN_NOW"] = repr(args.now)
    calls_file = os.path.abspath(args.state) + ".qstat_calls"
    calls_before = _count_lines(calls_file)
    _strip_site_packages()
    pbs = _load_pbs(cfg)
    ev = _build(pbs, state, args, hook_name)
    workdir = os.path.join(state.get("pbs_home") or os.path.dirname(
        os.path.abspath(args.state)), "server_priv", "hooks", "tmp")
    os.makedirs(workdir, exist_ok=True)
    os.chdir(workdir)
    sys.path.extend(args.sys_path)
    sys.argv = [""]
    with open(hook_path) as f:
        code = compile(f.read(), hook_path, "exec")
    pbs._set_python_mode(True)
    exc, alarmed = _run(code, state.get("hook_alarm", 30))
    pbs._set_python_mode(False)
    now = time.time()
    outcome = {"accepted": pbs._state["accepted"] and exc is None,
               "reject_msg": pbs._state["reject_msg"],
               "exit_code": None if exc is not None else
               _exit_code(pbs._state["ecode"])}
    etext = args.event
    hook_msg = outcome["reject_msg"] or "%s request rejected by '%s'" % (
        etext, hook_name)
    if alarmed:
        pbs._server_log(pbs.LOG_ERROR, hook_name, "alarm call while running %s hook '%s', "
                   "request rejected" % (etext, hook_name))
        hook_msg = ("request rejected as filter hook '%s' got an alarm call. "
                    "Please inform Admin" % hook_name)
    elif exc is not None:
        pbs._server_log(pbs.LOG_ERROR, hook_name, "%s hook '%s' encountered an exception, "
                   "request rejected" % (etext, hook_name))
        hook_msg = ("request rejected as filter hook '%s' encountered an "
                    "exception. Please inform Admin" % hook_name)
    elif not outcome["accepted"]:
        pbs._server_log(pbs.LOG_ERROR, hook_name, "%s request rejected by '%s'"
                   % (etext, hook_name))
        if outcome["reject_msg"]:
            pbs._server_log(pbs.LOG_ERROR, hook_name, outcome["reject_msg"])
    with open(args.state) as f:  # re-read: only what the hook changed is ours
        state = json.load(f)
    applied, errors = _write_back(pbs, state, ev, now, outcome)
    _server_effects(pbs, state, ev, outcome, hook_msg, now)
    state["last_run"] = {
        "accepted": outcome["accepted"],
        "reject_msg": outcome["reject_msg"] if not outcome["accepted"]
        and exc is None else None,
        "exception": exc, "exit_code": outcome["exit_code"],
        "log": list(pbs._log), "event": args.event,
        "hook_name": hook_name, "now": now, "applied": applied,
        "apply_errors": errors,
        "scheduler_restart_cycle": pbs._state["scheduler_restart_cycle"],
        "qstat_calls": _count_lines(calls_file) - calls_before,
    }
    tmp = args.state + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=2, sort_keys=True)
    os.replace(tmp, args.state)
    return 0


def _exit_code(ecode):
    """The hook's exit status as the provisioning child reports it."""
    try:
        return int(ecode) & 0xff
    except (TypeError, ValueError):
        return 1  # SystemExit with a non-numeric code


def _count_lines(path):
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
