"""Test-only stand-in for the ``pbs`` module that PBS Pro / OpenPBS builds
into its hook interpreter.  Names, values and behaviour follow OpenPBS
sources; see README.md next to this file for where each fact comes from.
The harness (run_hook.py) fills it in; hooks only read and modify it.
Names starting with ``_`` are stand-in internals, not PBS API.
"""

import os


# -- exceptions: src/modules/python/pbs/v1/_exc_types.py ------------------
class EventIncompatibleError(Exception):
    pass


class UnsetAttributeNameError(Exception):
    pass


class BadAttributeValueTypeError(Exception):
    pass


class BadAttributeValueError(Exception):
    pass


class UnsetResourceNameError(Exception):
    pass


class BadResourceValueTypeError(Exception):
    pass


class BadResourceValueError(Exception):
    pass


# -- vnode state bits: INUSE_* in src/include/pbs_nodes.h ------------------
ND_FREE = 0x00
ND_OFFLINE = 0x01
ND_DOWN = 0x02
ND_DELETED = 0x04
ND_UNRESOLVABLE = 0x08
ND_JOBBUSY = 0x10
ND_STALE = 0x20
ND_JOB_EXCLUSIVE = 0x40
ND_BUSY = 0x80
ND_STATE_UNKNOWN = 0x100
ND_NEEDS_HELLOSVR = 0x200
ND_INIT = 0x400
ND_PROV = 0x800
ND_WAIT_PROV = 0x1000
ND_RESV_EXCLUSIVE = 0x2000
ND_RESVEXCL = ND_RESV_EXCLUSIVE
ND_OFFLINE_BY_MOM = 0x4000
ND_MARKEDDOWN = 0x8000
ND_NEED_ADDRS = 0x10000
ND_MAINTENANCE = 0x20000
ND_SLEEP = 0x40000
ND_NEED_CREDENTIALS = 0x80000
ND_VNODE_UNAVAILABLE = (ND_STALE | ND_OFFLINE | ND_DOWN | ND_DELETED
                        | ND_STATE_UNKNOWN | ND_UNRESOLVABLE
                        | ND_OFFLINE_BY_MOM | ND_MAINTENANCE | ND_SLEEP)
ND_PBS = 0x00  # NTYPE_PBS

# Names as qstat/pbsnodes print them: ns[] in src/lib/Libattr/attr_node_func.c
# (order matters: it is the order of names in "a,b" state strings).
_STATE_NAMES = (
    (ND_STATE_UNKNOWN, "state-unknown"), (ND_DOWN, "down"),
    (ND_STALE, "Stale"), (ND_OFFLINE, "offline"), (ND_JOBBUSY, "job-busy"),
    (ND_JOB_EXCLUSIVE, "job-exclusive"), (ND_BUSY, "busy"),
    (ND_INIT, "initializing"), (ND_PROV, "provisioning"),
    (ND_WAIT_PROV, "wait-provisioning"), (ND_RESV_EXCLUSIVE, "resv-exclusive"),
    (ND_UNRESOLVABLE, "unresolvable"), (ND_OFFLINE_BY_MOM, "offline_by_mom"),
    (ND_MAINTENANCE, "maintenance"), (ND_SLEEP, "sleep"),
)
_KNOWN_BITS = 0
for _b, _n in _STATE_NAMES:
    _KNOWN_BITS |= _b
_INTERNAL_BITS = ND_DELETED | ND_NEEDS_HELLOSVR | ND_INIT


def _state_is_valid(bits):
    """vnode_state_to_str(bits) != "" in attr_node_func.c."""
    return (bits & ~(_KNOWN_BITS | _INTERNAL_BITS)) == 0


def _state_to_names(bits):
    if not _state_is_valid(bits):
        raise ValueError("invalid vnode state value %r" % (bits,))
    names = [n for b, n in _STATE_NAMES if bits & b]
    return names or ["free"]


def _names_to_state(names):
    bits = 0
    table = dict((n, b) for b, n in _STATE_NAMES)
    for name in names:
        if name == "free":
            continue
        if name not in table:
            raise ValueError("unknown vnode state name %r (known: free, %s)"
                             % (name, ", ".join(n for _, n in _STATE_NAMES)))
        bits |= table[name]
    return bits


# -- hook event types: HOOK_EVENT_* in src/include/hook.h ------------------
QUEUEJOB = 0x01
MODIFYJOB = 0x02
RESVSUB = 0x04
MOVEJOB = 0x08
RUNJOB = 0x10
PROVISION = 0x20
EXECJOB_BEGIN = 0x40
EXECJOB_PROLOGUE = 0x80
EXECJOB_EPILOGUE = 0x100
EXECJOB_END = 0x200
EXECJOB_PRETERM = 0x400
EXECJOB_LAUNCH = 0x800
EXECHOST_PERIODIC = 0x1000
EXECHOST_STARTUP = 0x2000
EXECJOB_ATTACH = 0x4000
PERIODIC = 0x8000
RESV_END = 0x10000
EXECJOB_RESIZE = 0x20000
EXECJOB_ABORT = 0x40000
EXECJOB_POSTSUSPEND = 0x80000
EXECJOB_PRERESUME = 0x100000
MANAGEMENT = 0x200000
MODIFYVNODE = 0x400000
JOBOBIT = 0x800000
RESV_BEGIN = 0x1000000
RESV_CONFIRM = 0x2000000
MODIFYRESV = 0x4000000
MOM_EVENTS = (EXECJOB_BEGIN | EXECJOB_PROLOGUE | EXECJOB_EPILOGUE
              | EXECJOB_END | EXECJOB_PRETERM | EXECHOST_PERIODIC
              | EXECJOB_LAUNCH | EXECHOST_STARTUP | EXECJOB_ATTACH
              | EXECJOB_RESIZE | EXECJOB_ABORT | EXECJOB_POSTSUSPEND
              | EXECJOB_PRERESUME)
# event name (HOOKSTR_* in hook.h, as in `qmgr ... event=NAME`) -> type
_EVENT_TYPES = dict((n.lower(), globals()[n]) for n in (
    "QUEUEJOB", "MODIFYJOB", "RESVSUB", "MOVEJOB", "RUNJOB", "PROVISION",
    "EXECJOB_BEGIN", "EXECJOB_PROLOGUE", "EXECJOB_EPILOGUE", "EXECJOB_END",
    "EXECJOB_PRETERM", "EXECJOB_LAUNCH", "EXECHOST_PERIODIC",
    "EXECHOST_STARTUP", "EXECJOB_ATTACH", "PERIODIC", "RESV_END",
    "EXECJOB_RESIZE", "EXECJOB_ABORT", "EXECJOB_POSTSUSPEND",
    "EXECJOB_PRERESUME", "MANAGEMENT", "MODIFYVNODE", "JOBOBIT", "RESV_BEGIN",
    "RESV_CONFIRM", "MODIFYRESV"))

# -- log levels: SEVERITY_LOG_* in hook.h, PBSEVENT_* in src/include/log.h -
LOG_DEBUG = 0x0005
LOG_WARNING = 0x0006
LOG_ERROR = 0x0007
EVENT_ERROR = 0x0001
EVENT_SYSTEM = 0x0002
EVENT_ADMIN = 0x0004
EVENT_JOB = 0x0008
EVENT_JOB_USAGE = 0x0010
EVENT_SECURITY = 0x0020
EVENT_SCHED = 0x0040
EVENT_DEBUG = 0x0080
EVENT_DEBUG2 = 0x0100
EVENT_RESV = 0x0200
EVENT_DEBUG3 = 0x0400
EVENT_DEBUG4 = 0x0800
EVENT_FORCE = 0x8000
_LEVEL_NAMES = dict((v, k) for k, v in list(globals().items())
                    if k.startswith(("LOG_", "EVENT_")) and isinstance(v, int))

# -- job states: src/include/job.h + module_pbs_v1.c -----------------------
JOB_STATE_TRANSIT = 0
JOB_STATE_QUEUED = 1
JOB_STATE_HELD = 2
JOB_STATE_WAITING = 3
JOB_STATE_RUNNING = 4
JOB_STATE_EXITING = 5
JOB_STATE_EXPIRED = 6
JOB_STATE_BEGUN = 7
JOB_STATE_MOVED = 8
JOB_STATE_FINISHED = 9
JOB_STATE_SUSPEND = 400
JOB_STATE_SUSPEND_USERACTIVE = 410
_JOB_STATE_LETTERS = {"T": 0, "Q": 1, "H": 2, "W": 3, "R": 4, "E": 5, "X": 6,
                      "B": 7, "M": 8, "F": 9, "S": 400, "U": 410}

# -- reservation states: enum resv_states in src/include/pbs_ifl.h ---------
(RESV_STATE_NONE, RESV_STATE_UNCONFIRMED, RESV_STATE_CONFIRMED,
 RESV_STATE_WAIT, RESV_STATE_TIME_TO_RUN, RESV_STATE_RUNNING,
 RESV_STATE_FINISHED, RESV_STATE_BEING_DELETED, RESV_STATE_DELETED,
 RESV_STATE_DELETING_JOBS, RESV_STATE_DEGRADED, RESV_STATE_BEING_ALTERED,
 RESV_STATE_IN_CONFLICT) = range(13)


# -- value types: src/modules/python/pbs/v1/_base_types.py -----------------
class vnode_state(int):
    """An int; only valid state bit combinations are accepted."""

    def __new__(cls, value):
        v = int(value)
        if not _state_is_valid(v):
            raise BadAttributeValueError(
                "invalid vnode state value '%s'" % (value,))
        return int.__new__(cls, v)

    def __add__(self, val):
        if not _state_is_valid(val):
            raise BadAttributeValueError("invalid vnode state value '%d'" % val)
        return int(self) | val

    def __sub__(self, val):
        if not _state_is_valid(val):
            raise BadAttributeValueError("invalid vnode state value '%d'" % val)
        return int(self) & ~val


class pbs_bool(object):
    """Like the real one: truthiness and int() work, str() is "1"/"0", and
    there is no __eq__, so ``x == True`` is False: test truthiness."""

    def __init__(self, value):
        if isinstance(value, pbs_bool):
            value = value._value
        if value in ("true", "True", "TRUE", "t", "T", "y", "1", 1):
            v = 1
        elif value in ("false", "False", "FALSE", "f", "F", "n", "0", 0):
            v = 0
        else:
            raise BadAttributeValueError("invalid boolean value '%s'" % (value,))
        object.__setattr__(self, "_value", v)

    def __bool__(self):
        return self._value == 1

    def __int__(self):
        return self._value

    def __str__(self):
        return str(self._value)

    __repr__ = __str__


#: Resources every OpenPBS server defines (src/lib/Libattr/master_resc_def_all.xml).
BUILTIN_RESOURCES = frozenset((
    "cput", "mem", "walltime", "soft_walltime", "min_walltime", "max_walltime", "ncpus",
    "naccelerators", "select", "place", "nodes", "nodect", "arch", "nchunk", "vntype",
    "mpiprocs", "ompthreads", "cpupercent", "energy", "file", "pmem", "vmem", "pvmem",
    "nice", "pcput", "nodemask", "hpm", "ssinodes", "host", "vnode", "resc", "software",
    "site", "exec_vnode", "start_time", "pe_mask", "partition", "aoe", "eoe",
    "preempt_targets", "accelerator", "accelerator_model", "accelerator_memory",
    "accelerator_group", "pstate", "hbmem", "pgov", "pcap_node", "pcap_accelerator"))
#: Custom resources (``qmgr create resource``); the harness fills it from STATE.json.
defined_resources = set(BUILTIN_RESOURCES)


class pbs_resource(object):
    """Resource list (resources_available, Resource_List, ...): item and
    attribute access; an unset resource reads as None, one the server does
    not define raises AttributeError ("'pbs_resource' object has no
    attribute 'ngpus'", seen on OpenPBS 23.06)."""

    def __init__(self, name, values=None, owner=None):
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_values", dict(values or {}))
        object.__setattr__(self, "_owner", owner)
        object.__setattr__(self, "_modified", {})

    def __getitem__(self, key):
        if key not in self._values and key not in defined_resources:
            raise AttributeError("'pbs_resource' object has no attribute '%s'" % key)
        return self._values.get(key)

    def __setitem__(self, key, value):
        if _state["mod_disallowed"]:
            return
        if value is None:
            self._values.pop(key, None)
        else:
            self._values[key] = value
        if _state["python_mode"]:
            self._modified[key] = None

    def __getattr__(self, key):
        if key.startswith("_"):
            raise AttributeError(key)
        return self[key]

    def __setattr__(self, key, value):
        self[key] = value

    def __contains__(self, key):
        return key in self._values

    def keys(self):
        return list(self._values.keys())

    def __str__(self):
        return ",".join("%s=%s" % (k, v) for k, v in self._values.items()
                        if v is not None)

    __repr__ = __str__


# -- server objects ---------------------------------------------------------
_RO, _STR, _INT, _BOOL, _STATE, _RESC, _JSTATE = range(7)
_TYPE_TEXT = {_STR: "(<class 'str'>,)", _INT: "(<class 'int'>,),int,float",
              _BOOL: "(<class 'pbs.pbs_bool'>,),bool",
              _STATE: "(<class 'pbs.vnode_state'>,),int,float",
              _RESC: "(<class 'pbs.pbs_resource'>,)",
              _JSTATE: "(<class 'pbs.job_state'>,),int"}


def _coerce(obj, name, kind, value):
    if value is None or kind == _RO:
        return value
    ok = {_STR: (str,), _INT: (int, float), _BOOL: (bool, pbs_bool),
          _STATE: (int, float), _RESC: (pbs_resource,),
          _JSTATE: (int,)}[kind]
    if not isinstance(value, ok) or (kind == _INT and isinstance(value, bool)):
        raise BadAttributeValueTypeError(
            "value for class <%s> attribute <%s> must be 'None' or '%s'"
            % (type(obj).__name__, name, _TYPE_TEXT[kind]))
    if kind == _INT or kind == _JSTATE:
        return int(value)
    if kind == _BOOL:
        return pbs_bool(value)
    if kind == _STATE:
        return vnode_state(value)
    return value


class _PbsObject(object):
    _ATTRS = {}
    _KEY = "name"

    def __init__(self, key):
        object.__setattr__(self, "_modified", {})
        for attr, kind in self._ATTRS.items():
            object.__setattr__(self, attr, pbs_resource(attr, owner=self)
                               if kind == _RESC else None)
        object.__setattr__(self, self._KEY, key)

    def __str__(self):
        return str(getattr(self, self._KEY))

    def __setattr__(self, name, value):
        if name not in self._ATTRS:
            raise UnsetAttributeNameError(
                "%s attribute '%s' not found" % (self._KIND, name))
        kind = self._ATTRS[name]
        if _state["python_mode"]:
            if kind == _RO:
                raise BadAttributeValueError(
                    "%s attribute '%s' is readonly" % (self._KIND, name))
            _check_settable(self, name)
            if _state["mod_disallowed"]:
                return
        object.__setattr__(self, name, _coerce(self, name, kind, value))
        if _state["python_mode"]:
            self._modified[name] = None


_RUNJOB_JOB_ATTRS = ("Hold_Types", "Execution_Time", "project", "Error_Path",
                     "Output_Path", "Resource_List", "Variable_List", "depend",
                     "create_resv_from_job")


def _check_settable(obj, name):
    """is_attrib_val_settable() in pbs_python_svr_internal.c (subset)."""
    ev = _state["event"]
    etype = ev.type if ev is not None else None
    if etype == PERIODIC and not isinstance(obj, _vnode):
        raise AssertionError("Can only set node,resource attributes under "
                             "periodic event.")
    if etype in (JOBOBIT, PROVISION):  # no case in the switch: default
        raise AssertionError("Unexpected event")
    if etype == RUNJOB and not ((isinstance(obj, _job)
                                 and name in _RUNJOB_JOB_ATTRS)
                                or (isinstance(obj, _vnode)
                                    and name == "state")):
        raise AssertionError(
            "Can only set job's (%s) attribute, or a vnode's (state) attribute"
            " under RUNJOB event - got <%s>" % ("|".join(_RUNJOB_JOB_ATTRS),
                                                 name))


class _vnode(_PbsObject):
    _KIND = "vnode"
    _ATTRS = {
        "name": _RO, "Mom": _STR, "Port": _INT, "state": _STATE,
        "ntype": _INT, "jobs": _STR, "resv": _STR, "resv_enable": _BOOL,
        "pcpus": _INT, "no_multinode_jobs": _BOOL, "sharing": _INT,
        "provision_enable": _BOOL, "current_aoe": _STR,
        "in_multivnode_host": _INT, "license": _STR, "license_info": _INT,
        "topology_info": _STR, "maintenance_jobs": _STR, "vnode_pool": _INT,
        "current_eoe": _STR, "power_provisioning": _BOOL,
        "poweroff_eligible": _BOOL, "last_state_change_time": _INT,
        "last_used_time": _INT, "comment": _STR, "queue": _STR,
        "priority": _INT, "partition": _STR,
        "resources_available": _RESC, "resources_assigned": _RESC,
    }


vnode = _vnode


class _job(_PbsObject):
    _KIND = "job"
    _KEY = "id"
    _ATTRS = dict.fromkeys(
        ("Job_Name", "Job_Owner", "queue", "server", "comment", "exec_vnode",
         "exec_host", "schedselect", "euser", "egroup", "project",
         "Hold_Types", "Error_Path", "Output_Path", "depend", "Account_Name",
         "create_resv_from_job", "Variable_List", "array_id"), _STR)
    _ATTRS.update(dict.fromkeys(
        ("Priority", "ctime", "qtime", "mtime", "stime", "etime",
         "Execution_Time", "Exit_status", "run_count", "substate",
         "obittime", "array_index", "run_version"), _INT))
    _ATTRS.update(dict.fromkeys(("Resource_List", "resources_used",
                                 "estimated"), _RESC))
    _ATTRS.update({"id": _RO, "job_state": _JSTATE})


class _queue(object):
    """A job's ``queue`` in server events: the queue object
    (``_pps_helper_get_job`` sets it), not a string; ``str()`` is its name."""

    def __init__(self, name):
        self.name = name

    def __str__(self):
        return self.name

    __repr__ = __str__


class _resv(_PbsObject):
    _KIND = "resv"
    _KEY = "resvid"
    _ATTRS = dict.fromkeys(
        ("Reserve_Name", "Reserve_Owner", "resv_nodes", "queue", "partition",
         "Authorized_Users", "reserve_rrule", "server"), _STR)
    _ATTRS.update(dict.fromkeys(
        ("reserve_start", "reserve_end", "reserve_duration", "reserve_state",
         "reserve_substate", "reserve_index", "reserve_count", "ctime",
         "mtime", "reserve_retry"), _INT))
    _ATTRS.update({"resvid": _RO, "Resource_List": _RESC})


# -- event ------------------------------------------------------------------
class _event(object):
    """pbs.event(): accept()/reject() end the hook with SystemExit."""

    def __init__(self, type, hook_name, params, freq=None,
                 requestor="PBS_Server", requestor_host=""):
        for k, v in (("type", type), ("hook_name", hook_name),
                     ("hook_type", "site"), ("requestor", requestor),
                     ("requestor_host", requestor_host), ("freq", freq),
                     ("_param", dict(params))):
            object.__setattr__(self, k, v)

    def accept(self, ecode=0):
        _state.update(accepted=True, mod_disallowed=True, ecode=ecode)
        raise SystemExit(str(ecode))

    def reject(self, emsg="", ecode=255):
        _state.update(accepted=False, reject_msg=emsg, mod_disallowed=True,
                      ecode=ecode)
        raise SystemExit(str(ecode))

    def __getattr__(self, key):
        if key.startswith("_"):
            raise AttributeError(key)
        if key in self._param:
            return self._param[key]
        raise EventIncompatibleError

    def __setattr__(self, name, value):
        if name in self._param or name in self.__dict__:
            raise BadAttributeValueError(
                "event attribute '%s' is readonly" % (name,))
        raise UnsetAttributeNameError("event attribute '%s' not found" % name)


class _server(object):
    """pbs.server(): snapshots made by the harness; changes to them are not
    sent back (only pbs.event() objects are)."""

    def __init__(self, name, source, scheduling=True, power_provisioning=False):
        self.name = name
        self._source_fn = source
        # server attributes as a hook reads them (ints: scheduling=1,
        # power_provisioning=0 on a fresh OpenPBS 23.06)
        self.scheduling = int(bool(scheduling))
        self.power_provisioning = int(bool(power_provisioning))

    def __str__(self):
        return self.name

    def _source(self, kind, key):
        # the server builds these objects itself: not subject to what a hook may set
        mode = _state["python_mode"]
        _state["python_mode"] = False
        try:
            return self._source_fn(kind, key)
        finally:
            _state["python_mode"] = mode

    def _full_id(self, oid):
        return oid if "." in oid else oid + "." + self.name

    def vnodes(self):
        return iter(self._source("vnode", None))

    def jobs(self):
        return iter(self._source("job", None))

    def resvs(self):
        return iter(self._source("resv", None))

    def queues(self):
        return iter([])

    def vnode(self, name):
        return (self._source("vnode", name) or [None])[0]

    def job(self, jobid):
        return (self._source("job", self._full_id(jobid)) or [None])[0]

    def resv(self, resvid):
        return (self._source("resv", resvid) or [None])[0]

    def scheduler_restart_cycle(self):
        # Only a hook run inside pbs_server makes the server start a cycle; a
        # periodic hook runs in a fork()ed child whose flag the server never
        # reads (run_periodic_hook / post_server_periodic_hook in
        # src/server/hook_func.c; no cycle followed on OpenPBS 23.06).
        _state["scheduler_restart_cycle"] = True


# -- module state and functions ---------------------------------------------
hook_config_filename = os.environ.get("PBS_HOOK_CONFIG_FILE")
pbs_conf = {}
_log = []  # the lines written, in order
_state = {"event": None, "server": None, "python_mode": False,
          "mod_disallowed": False, "accepted": True, "reject_msg": None,
          "scheduler_restart_cycle": False, "local_node": "", "ecode": 0}


def _install(event_obj, server_obj, conf, local_node):
    """Called by the harness before the hook runs."""
    global pbs_conf
    pbs_conf = dict(conf)
    _state.update(event=event_obj, server=server_obj, local_node=local_node)


def _set_python_mode(on):
    _state["python_mode"] = bool(on)


def event():
    return _state["event"]


def server():
    return _state["server"]


def get_pbs_conf():
    return dict(pbs_conf)


def get_local_nodename():
    return _state["local_node"]


def reboot(reboot_cmd=""):
    raise NotImplementedError("reboot(): only for mom hooks")


def _write_log(line):
    line = line.replace("\n", "\\n")
    _log.append(line)
    path = os.environ.get("PBS_STANDIN_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def _level_name(level):
    return _LEVEL_NAMES.get(level, str(level))


def logmsg(level, msg):
    if not isinstance(level, int) or not isinstance(msg, str):
        raise TypeError("logmsg() argument types are (int, str)")
    # pbs_server tags a server hook's lines with the daemon, not the hook:
    # ";Hook;Server@<host>;<msg>" (log_event(..., pbs_python_daemon_name, emsg)
    # in pbsv1mod_meth_logmsg, src/lib/Libpython/common_python_utils.c; seen
    # on OpenPBS 23.06 as "...;0006;Server@pbshost;Hook;Server@pbshost;<msg>").
    server_obj = _state["server"]
    _write_log("%s;Server@%s;%s" % (_level_name(level),
                                    server_obj.name if server_obj is not None else "", msg))


def _server_log(level, hook_name, msg):
    """A line pbs_server itself writes about a hook: tagged with the hook's name
    (";Hook;<hook>;periodic request rejected by '<hook>'")."""
    _write_log("%s;%s;%s" % (_level_name(level), hook_name, msg))


def logjobmsg(jobid, msg, level=EVENT_JOB):
    if not isinstance(jobid, str) or not isinstance(msg, str):
        raise TypeError("logjobmsg() argument types are (str, str)")
    _write_log("%s;%s;%s" % (_level_name(level), jobid, msg))
