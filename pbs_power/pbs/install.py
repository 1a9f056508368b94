"""Putting pbs_power's hooks on a PBS server, and reading its nodes back.

What ``pbs-power pbs install`` and ``pbs-power pbs nodes`` need, kept apart
from the command line so it can be tested without PBS: the qmgr commands
(plain strings, each one ``qmgr -c`` argument), the idempotency rule, the
pbs.conf and ``pbsnodes -av -F json`` parsers, and the effective policy of a
node. The few functions that run qmgr or pbsnodes take argv lists only and
call the programs by full path under PBS_EXEC (hooks and admins alike may
have a PATH without them).

qmgr facts this relies on (OpenPBS ``src/cmds/qmgr.c``): a value containing
a comma or white space must be quoted (unquoted, the comma separates
attribute assignments), ``import hook`` takes ``content-type
content-encoding file``, and ``qmgr -c 'list hook X'`` / ``'list resource
X'`` exits 0 when X exists and non-zero when it does not (1 on the versions
read) or when qmgr cannot tell (3 and "cannot connect" when the server is
unreachable; "Unauthorized Request" without manager rights).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from pbs_power.config.hook_config import HookConfig

QMGR_TIMEOUT = 60.0
PBSNODES_TIMEOUT = 60.0
DEFAULT_PBS_CONF = "/etc/pbs.conf"
DEFAULT_CONFIG_NAME = "PBS_power.json"
#: Custom resources the hooks read: a job's requested policy (job-wide, no
#: ``flag=h``: qsub refuses a ``flag=h`` resource beside ``-l select``/``place``:
#: ``"-lresource=" cannot be used with "select" or "place", resource is: X``),
#: and a node's opt-out (host-level).
RESOURCES: Tuple[Tuple[str, str], ...] = (("power_policy", "string"), ("power_mgmt", "boolean"))
RESOURCE_FLAGS = {"power_policy": "", "power_mgmt": "h"}
#: The periodic hook's default ``freq``: the default ``cycle_interval`` (an install
#: uses the config's own).
DEFAULT_FREQ = HookConfig.__dataclass_fields__["cycle_interval"].default


class InstallError(ValueError):
    """Input that cannot give a usable install (exit 2); the message says what and how."""


@dataclass(frozen=True)
class HookSpec:
    """One hook: its name in PBS, its file in the hooks directory, its attributes in order."""

    name: str
    file: str
    attributes: Tuple[Tuple[str, str], ...]


HOOKS: Tuple[HookSpec, ...] = (
    HookSpec("pbs_power", "PBS_power.py",
             (("event", "periodic"), ("freq", str(DEFAULT_FREQ)), ("alarm", "240"),
              ("order", "1"))),
    HookSpec("pbs_power_job", "pbs_power_job.py",
             (("event", "queuejob,modifyjob,runjob,jobobit"), ("alarm", "60"),
              ("order", "1"))),
    HookSpec("pbs_power_prov", "pbs_power_provision.py",
             (("event", "provision"), ("alarm", "300"), ("order", "1"))),
)


#: OpenPBS's own power hook. Its ``enabled`` flag is the server's
#: power_provisioning (src/server/svr_func.c set_srv_pwr_prov_attribute), the
#: only way to make the scheduler calendar sleeping vnodes (at now + 600 s,
#: src/scheduler/simulate.cpp create_events). Without it a job that needs a
#: sleeping vnode gets no start estimate and holds nothing: narrower jobs
#: take the vnodes woken for it. An install enables it with no events, so it
#: never runs; the flag is recomputed only when the hook has a periodic event
#: (src/server/hook_func.c) or at server start, hence the event set and unset.
PROVISIONING_HOOK = "PBS_power"
#: Its events as shipped (PBS_power.HK), given back by an uninstall.
PROVISIONING_HOOK_EVENTS = ("periodic,execjob_prologue,execjob_epilogue,exechost_periodic,"
                            "exechost_startup,execjob_begin,execjob_end")


@dataclass(frozen=True)
class Step:
    """One qmgr command, maybe guarded by a ``list`` probe.

    ``when`` is ``always``, ``absent`` (run only if the probe finds nothing:
    creates) or ``present`` (run only if it finds the object: deletes).
    """

    command: str
    probe: Optional[str] = None
    when: str = "always"


@dataclass(frozen=True)
class QmgrResult:
    """What one qmgr run said; ``returncode`` None when it could not be started."""

    returncode: Optional[int]
    stdout: str = ""
    stderr: str = ""


# -- the plan (pure) -------------------------------------------------------------
def qmgr_value(text: str) -> str:
    """``text`` as one qmgr value: quoted when it holds a comma, blank, quote, ``#`` or ``;``."""
    if not text or any(not ch.isprintable() for ch in text) or "&" in text:
        raise InstallError("%r cannot be given to qmgr (empty, '&' or unprintable)" % text)
    if not any(ch in text for ch in " \t,\"'#;"):
        return text
    if '"' not in text:
        return '"%s"' % text
    if "'" not in text:
        return "'%s'" % text
    raise InstallError("%r holds both quote characters; qmgr cannot take it" % text)


def install_steps(hooks_dir: str, config_path: str, freq: int = DEFAULT_FREQ) -> List[Step]:
    """Every step of an install: resources first, then each hook, enabled last.

    ``freq`` (the config's ``cycle_interval``) replaces the periodic hook's
    shipped freq. ``power_policy`` loses a ``flag=h`` an earlier install gave
    it (``unset resource X flag`` exits 0 also when no flag is set).
    """
    steps = []
    for name, kind in RESOURCES:
        flag = RESOURCE_FLAGS.get(name, "")
        steps.append(Step("create resource %s type=%s%s" % (name, kind, ",flag=" + flag if flag
                                                           else ""),
                          "list resource %s" % name, "absent"))
        if not flag:
            steps.append(Step("unset resource %s flag" % name))
    config = qmgr_value(os.path.abspath(config_path))
    for hook in HOOKS:
        steps.append(Step("create hook %s" % hook.name, "list hook %s" % hook.name, "absent"))
        steps += [Step("set hook %s %s = %s" % (hook.name, attr, qmgr_value(
            str(int(freq)) if attr == "freq" else value)))
                  for attr, value in hook.attributes]
        script = qmgr_value(os.path.abspath(os.path.join(hooks_dir, hook.file)))
        steps.append(Step("import hook %s application/x-python default %s" % (hook.name, script)))
        steps.append(Step("import hook %s application/x-config default %s" % (hook.name, config)))
        steps.append(Step("set hook %s enabled = true" % hook.name))
    return steps


def provisioning_steps(on: bool) -> List[Step]:
    """Turn the server's power_provisioning on (OpenPBS's PBS_power hook enabled
    with no events, so it never runs) or back off (the hook as shipped, disabled)."""
    probe = "list pbshook %s" % PROVISIONING_HOOK
    if on:
        commands = ["unset pbshook %s event" % PROVISIONING_HOOK,
                    "set pbshook %s enabled = true" % PROVISIONING_HOOK,
                    "set pbshook %s event = periodic" % PROVISIONING_HOOK,
                    "unset pbshook %s event" % PROVISIONING_HOOK]
    else:
        commands = ["set pbshook %s enabled = false" % PROVISIONING_HOOK,
                    "set pbshook %s event = %s" % (PROVISIONING_HOOK,
                                                   qmgr_value(PROVISIONING_HOOK_EVENTS))]
    return [Step(command, probe, "present") for command in commands]


def install_commands(hooks_dir: str, config_path: str, freq: int = DEFAULT_FREQ) -> List[str]:
    """The qmgr commands of an install, in order (each one ``qmgr -c`` argument)."""
    return [step.command for step in install_steps(hooks_dir, config_path, freq)]


def uninstall_steps(remove_resources: bool = False) -> List[Step]:
    """Delete each hook that exists; the resources too only when asked."""
    steps = [Step("delete hook %s" % h.name, "list hook %s" % h.name, "present") for h in HOOKS]
    if remove_resources:
        steps += [Step("delete resource %s" % name, "list resource %s" % name, "present")
                  for name, _kind in RESOURCES]
    return steps


def shell_line(qmgr: str, command: str) -> str:
    """``qmgr -c '...'`` as a line a person can paste into a shell."""
    return " ".join(shlex.quote(arg) for arg in (qmgr, "-c", command))


def missing_hook_files(hooks_dir: str) -> List[str]:
    """Hook scripts that ``hooks_dir`` lacks (full paths)."""
    paths = [os.path.join(hooks_dir, hook.file) for hook in HOOKS]
    return [path for path in paths if not os.path.isfile(path)]


def default_hooks_dir() -> Optional[str]:
    """Where the hook scripts are: the source tree's ``hooks``, else where pip put them.

    The wheel installs them as data files under ``share/pbs-power/hooks``: in
    the ``--target`` directory for a PBS-side install, else under sys.prefix.
    """
    import sys
    parent = package_parent()
    for path in (os.path.join(parent, "hooks"),
                 os.path.join(parent, "share", "pbs-power", "hooks"),
                 os.path.join(sys.prefix, "share", "pbs-power", "hooks")):
        if os.path.isfile(os.path.join(path, HOOKS[0].file)):
            return path
    return None


def package_parent() -> str:
    """The directory the running ``pbs_power`` was imported from (its sys.path entry)."""
    import pbs_power
    return os.path.dirname(os.path.dirname(os.path.abspath(pbs_power.__file__)))


def with_python_path(doc: Mapping[str, Any], directory: str) -> Dict[str, Any]:
    """A copy of a config document whose ``python_path`` lists ``directory`` first."""
    out = dict(doc)
    given = doc.get("python_path") or []
    given = [given] if isinstance(given, str) else list(given)
    out["python_path"] = [directory] + [p for p in given if p != directory]
    return out


# -- running the plan ------------------------------------------------------------
#: stderr of a failed ``list`` that says nothing about the object (no server, no rights).
CANNOT_TELL = ("cannot connect", "unauthorized", "permission denied", "no such file")


def probe_present(result: QmgrResult) -> Optional[bool]:
    """True: the object exists; False: qmgr says it does not; None: qmgr could not tell."""
    if result.returncode == 0:
        return True
    err = result.stderr.lower()
    if result.returncode is None or any(marker in err for marker in CANNOT_TELL):
        return None
    return False


#: ``emit(step, status, result)`` reports each step; status is one of the words below.
Emit = Callable[[Step, str, Optional[QmgrResult]], None]
DONE, EXISTS, ABSENT, FAILED = "done", "exists, skipped", "not there, skipped", "FAILED"


def run_steps(steps: Sequence[Step], run: Callable[[str], QmgrResult], emit: Emit) -> bool:
    """Run ``steps`` in order through ``run``; stop at the first failure. True if all went."""
    for step in steps:
        if step.probe is not None and step.when != "always":
            probe = run(step.probe)
            present = probe_present(probe)
            if present is None:
                emit(replace(step, command=step.probe), FAILED, probe)
                return False
            if present == (step.when == "absent"):
                emit(step, EXISTS if present else ABSENT, probe)
                continue
        result = run(step.command)
        emit(step, DONE if result.returncode == 0 else FAILED, result)
        if result.returncode != 0:
            return False
    return True


def run_program(argv: Sequence[str], timeout: float) -> QmgrResult:
    """Run ``argv`` (no shell), returning its exit status and output as text."""
    try:
        proc = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return QmgrResult(None, "", "%s: no answer within %.0fs" % (argv[0], timeout))
    except OSError as exc:
        return QmgrResult(None, "", "cannot run %s: %s" % (argv[0], exc.strerror or exc))
    return QmgrResult(proc.returncode, proc.stdout.decode(errors="replace"),
                      proc.stderr.decode(errors="replace"))


def qmgr_runner(qmgr: str, timeout: float = QMGR_TIMEOUT) -> Callable[[str], QmgrResult]:
    """``run(command)``: one ``qmgr -c command`` by full path."""
    return lambda command: run_program([qmgr, "-c", command], timeout)


# -- PBS's own Python ---------------------------------------------------------------
_LIBPYTHON = re.compile(rb"libpython(3\.\d+)")
SERVER_BINARIES = ("sbin/pbs_server.bin", "sbin/pbs_server")


def hook_python_version(pbs_exec: str) -> Optional[str]:
    """The Python version PBS runs hooks with (``3.11``): the libpython pbs_server links.

    Read from the binary's dynamic section text (no ldd); None when not found.
    """
    for name in SERVER_BINARIES:
        try:
            with open(os.path.join(pbs_exec, name), "rb") as handle:
                found = _LIBPYTHON.search(handle.read())
        except OSError:
            continue
        if found:
            return found.group(1).decode()
    return None


def python_mismatch(pbs_exec: str, running: Tuple[int, int]) -> Optional[str]:
    """A note when this Python differs from PBS's hook Python, else None."""
    wanted = hook_python_version(pbs_exec)
    have = "%d.%d" % running
    if wanted is None or wanted == have:
        return None
    return ("PBS runs hooks with Python %s (%s/sbin/pbs_server.bin links libpython%s) but this "
            "pbs-power runs on %s: install pbs_power for PBS with python%s -m pip install "
            "--target DIR pbs-power, and give --python-path DIR"
            % (wanted, pbs_exec, wanted, have, wanted))


# -- PBS_EXEC ----------------------------------------------------------------------
def parse_pbs_conf(text: str) -> Dict[str, str]:
    """``KEY=VALUE`` lines of pbs.conf (comments and blank lines skipped)."""
    out: Dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def find_pbs_exec(given: Optional[str], environ: Mapping[str, str]) -> str:
    """PBS_EXEC: ``given``, else pbs.conf's (``$PBS_CONF_FILE`` or /etc/pbs.conf)."""
    if given:
        return os.path.abspath(given)
    conf = environ.get("PBS_CONF_FILE") or DEFAULT_PBS_CONF
    try:
        with open(conf, encoding="utf-8", errors="replace") as handle:
            value = parse_pbs_conf(handle.read()).get("PBS_EXEC")
    except OSError as exc:
        raise InstallError("PBS_EXEC unknown: cannot read %s (%s); give --pbs-exec DIR "
                           "(the directory holding bin/qmgr) or set PBS_CONF_FILE"
                           % (conf, exc.strerror or exc)) from None
    if not value:
        raise InstallError("PBS_EXEC unknown: %s has no PBS_EXEC= line; give --pbs-exec DIR "
                           "(the directory holding bin/qmgr)" % conf)
    return value


def pbs_command(pbs_exec: str, name: str) -> str:
    """Full path of PBS command ``name``; InstallError if it is not an executable there."""
    path = os.path.join(pbs_exec, "bin", name)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise InstallError("no executable %s (PBS_EXEC=%s); give --pbs-exec DIR" % (path, pbs_exec))
    return path


# -- pbsnodes -av -F json ------------------------------------------------------------
@dataclass(frozen=True)
class NodeRow:
    """One vnode as ``pbs-power pbs nodes`` shows it."""

    node: str
    host: str
    state: str
    poweroff_eligible: Optional[bool]
    power_mgmt: Optional[bool]
    last_used_time: Optional[float]
    last_state_change_time: Optional[float]
    group: Optional[str] = None
    policy: Optional[str] = None


def parse_bool(value: Any) -> Optional[bool]:
    """PBS booleans (``True``/``False``, ``1``/``0``, ``t``/``f``, ``y``/``n``) -> bool; else None."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if value is not None else ""
    if text in ("true", "t", "1", "yes", "y"):
        return True
    if text in ("false", "f", "0", "no", "n"):
        return False
    return None


def parse_pbsnodes_json(text: str) -> List[NodeRow]:
    """Rows from ``pbsnodes -av -F json`` (empty output: no nodes), sorted by name.

    pbsnodes prints numeric-looking values as JSON numbers (times are epoch
    seconds) and booleans as the strings ``True``/``False``; ctime strings,
    as its default format prints times, are read too.
    """
    from .attributes import parse_qstat_time
    if not text.strip():
        return []
    doc = json.loads(text, strict=False)
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, dict):
        raise ValueError("no 'nodes' object")
    rows = []
    for name, attrs in nodes.items():
        attrs = attrs if isinstance(attrs, dict) else {}
        res = attrs.get("resources_available")
        res = res if isinstance(res, dict) else {}
        rows.append(NodeRow(
            node=str(name), host=str(res.get("host") or name), state=str(attrs.get("state", "")),
            poweroff_eligible=parse_bool(attrs.get("poweroff_eligible")),
            power_mgmt=parse_bool(res.get("power_mgmt")),
            last_used_time=parse_qstat_time(attrs.get("last_used_time")),
            last_state_change_time=parse_qstat_time(attrs.get("last_state_change_time"))))
    return sorted(rows, key=lambda r: r.node)


@dataclass(frozen=True)
class PolicyView:
    """What the resource-group state says about entities, for a node table.

    ``groups``: entity -> its group; ``applied``: entity -> policy applied to
    it in an active group; ``topology``: entity -> its topology policy name
    (None: uncapped), only while the topology is active.
    """

    groups: Mapping[str, str]
    applied: Mapping[str, str]
    topology: Mapping[str, Optional[str]]


def entity_of(row: NodeRow, view: PolicyView) -> str:
    """The entity name for a row: the vnode name if the state knows it, else its host."""
    known = (view.groups, view.topology)
    return row.node if any(row.node in m for m in known) else row.host


def with_policies(rows: Sequence[NodeRow], view: PolicyView) -> List[NodeRow]:
    """Rows with group and effective policy: applied in an active group, else topology."""
    out = []
    for row in rows:
        entity = entity_of(row, view)
        policy = view.applied.get(entity) or view.topology.get(entity)
        out.append(replace(row, group=view.groups.get(entity), policy=policy))
    return out


def policy_view(groups: Mapping[str, str], answer: Any, topology: Any, active: bool,
                entities: Sequence[str]) -> PolicyView:
    """A `PolicyView` of ``entities`` from the service's answers.

    ``groups`` is ``store.member_groups``, ``answer`` is ``list()``,
    ``(topology, active)`` is ``topology()``.
    """
    applied: Dict[str, str] = {}
    for info in getattr(answer, "resource_groups", ()):
        if info.activation_status != "active":
            continue
        for member in info.resource_policies:
            if member.applied_policy_name:
                applied[member.resource_name] = member.applied_policy_name
    topo: Dict[str, Optional[str]] = {}
    if topology is not None and active:
        for entity in entities:
            if entity in topology.entities:
                policy = topology.topology_policy(entity)
                topo[entity] = policy.name if policy is not None else None
    return PolicyView(dict(groups), applied, topo)


def local_time(epoch: Optional[float]) -> str:
    """``2026-11-22 10:00:00`` in local time, or ``-``."""
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def run_pbsnodes(pbs_exec: str, timeout: float = PBSNODES_TIMEOUT) -> QmgrResult:
    """``pbsnodes -av -F json`` once, by full path."""
    return run_program([pbs_command(pbs_exec, "pbsnodes"), "-av", "-F", "json"], timeout)
