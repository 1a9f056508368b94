"""``pbs-power pbs install`` and ``pbs-power pbs nodes``: set PBS up, then look at it.

``install`` prints (or, with ``--apply``, runs through qmgr) what a PBS
server needs for pbs_power: the custom resources and the three hooks, with
the hook config imported. Running it twice changes nothing the second
time. ``nodes`` shows every vnode with its power-relevant attributes and
the resource group and policy pbs_power holds for it.
Exit codes: 0 ok, 1 a qmgr/pbsnodes command failed (its stderr shown),
2 bad input (no PBS_EXEC, invalid config, missing hook files).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass
from typing import Any, List, Optional, Sequence

from pbs_power.pbs import install as pi

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2


def add_parser(subparsers: Any) -> None:
    """Register ``pbs install`` and ``pbs nodes``."""
    parser = subparsers.add_parser(
        "pbs", help="install the hooks on a PBS server; show its nodes",
        description="Set a PBS server up for pbs_power, and show its nodes.")
    actions = parser.add_subparsers(dest="pbs_command", metavar="ACTION", required=True)

    install = actions.add_parser(
        "install", help="print (or run, with --apply) the qmgr commands that install the hooks",
        description="Print the qmgr commands that create pbs_power's custom resources "
                    "(power_policy, power_mgmt) and hooks (pbs_power, pbs_power_job, "
                    "pbs_power_prov) and import their scripts and config; with --apply, run "
                    "them (objects that exist are skipped, so running twice is harmless).")
    install.add_argument("--apply", action="store_true",
                         help="run the commands through PBS_EXEC/bin/qmgr (as root)")
    install.add_argument("--uninstall", action="store_true",
                         help="delete the hooks instead (custom resources are kept)")
    install.add_argument("--remove-resources", action="store_true",
                         help="with --uninstall: delete the custom resources too")
    install.add_argument("--no-power-provisioning", action="store_true",
                         help="leave the server's power_provisioning alone. By default an "
                              "install turns it on (OpenPBS's PBS_power hook enabled with no "
                              "events: it never runs) so that the scheduler keeps a top job's "
                              "reservation while its vnodes wake, and an uninstall turns it "
                              "off; it is left off when job_policies.eoe_policies is set, as "
                              "jobs that request an eoe then need vnodes with "
                              "power_provisioning")
    install.add_argument("--config", metavar="FILE",
                         help="hook config to import (default: HOOKS_DIR/PBS_power.json)")
    install.add_argument("--hooks-dir", metavar="DIR",
                         help="directory of the hook scripts (default: the hooks directory "
                              "beside the pbs_power package, if there is one)")
    install.add_argument("--python-path", metavar="DIR",
                         help="where PBS's Python finds pbs_power; the config imported is a "
                              "copy with DIR first in python_path")
    install.add_argument("--output-config", metavar="FILE",
                         help="write that copy of the config here (default: a temporary file)")
    install.add_argument("--pbs-exec", metavar="DIR",
                         help="PBS_EXEC (default: from $PBS_CONF_FILE, else /etc/pbs.conf)")
    install.set_defaults(func=run_install)

    nodes = actions.add_parser(
        "nodes", help="vnodes with power attributes, resource group and effective policy",
        description="Run 'pbsnodes -av -F json' once and show each vnode's state, "
                    "poweroff_eligible, power_mgmt, last used and last state change times, "
                    "and its resource group and effective power policy.")
    nodes.add_argument("--state-dir", metavar="DIR",
                       help="resource-group state (default: $PBS_POWER_STATE_DIR, else "
                            "/var/spool/pbs_power)")
    nodes.add_argument("--pbs-exec", metavar="DIR",
                       help="PBS_EXEC (default: from $PBS_CONF_FILE, else /etc/pbs.conf)")
    nodes.add_argument("--json", action="store_true", help="print a JSON list of objects")
    nodes.set_defaults(func=run_nodes)


# -- install -------------------------------------------------------------------------
@dataclass(frozen=True)
class Prepared:
    """The config file to import, notes for the admin, and a temp dir to remove after."""

    path: str
    notes: List[str]
    temp_dir: Optional[str] = None


def prepare_config(config: str, python_path: Optional[str],
                   output: Optional[str], keep: bool = False) -> Prepared:
    """Validate ``config`` and make sure what is imported carries a ``python_path``.

    With ``python_path`` (or when the config names none) a copy is written
    with that directory (default: where this pbs_power runs from) first in
    ``python_path``; a config that already names one is imported as it is.
    Without ``output`` the copy goes to a temporary directory removed after
    ``--apply``; with ``keep`` (a printing run) to one per-user directory that
    each run reuses, so the printed commands can be run and nothing piles up.
    """
    from pbs_power.config.hook_config import ConfigError, load_config
    loaded = load_config(config)
    notes = ["warning: %s" % w for w in loaded.warnings]
    if python_path is None and loaded.python_path:
        return Prepared(os.path.abspath(config), notes + [
            "hooks import pbs_power from the config's python_path: %s"
            % ", ".join(loaded.python_path)])
    directory = os.path.abspath(python_path or pi.package_parent())
    if python_path is None:
        notes.append("hooks will import pbs_power from %s (where this pbs-power runs from): "
                     "PBS runs hooks with its own Python, isolated from site-packages, and "
                     "that Python must be able to import pbs_power and its dependencies from "
                     "there (python3 -m pip install --target DIR pbs-power, with PBS's Python; "
                     "then give --python-path DIR)" % directory)
    with open(config, "rb") as handle:
        doc = json.loads(handle.read().decode("utf-8-sig"))
    temp_dir = None
    if output is None and keep:
        output = os.path.join(_own_dir(os.path.join(tempfile.gettempdir(), "pbs_power_install-%d"
                                                    % os.geteuid())), pi.DEFAULT_CONFIG_NAME)
    elif output is None:
        temp_dir = tempfile.mkdtemp(prefix="pbs_power_install.")
        output = os.path.join(temp_dir, pi.DEFAULT_CONFIG_NAME)
    with open(os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600),
              "w", encoding="utf-8") as handle:
        json.dump(pi.with_python_path(doc, directory), handle, indent=2)
        handle.write("\n")
    try:
        load_config(output)
    except ConfigError:
        if temp_dir:
            shutil.rmtree(temp_dir, ignore_errors=True)
        raise
    notes.append("config with python_path %s written to %s" % (directory, output))
    return Prepared(os.path.abspath(output), notes, temp_dir)


def _own_dir(path: str) -> str:
    """``path`` as a directory only we can use: made 0700, or refused if it is a link or
    anyone else's (a fixed name in /tmp must not let another user plant a file for root)."""
    import stat
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise pi.InstallError("%s is not a private directory of ours (a link, someone "
                              "else's, or open to others): remove it, or give "
                              "--output-config FILE" % path)
    return path


def _hooks_dir(given: Optional[str]) -> str:
    hooks_dir = given or pi.default_hooks_dir()
    if hooks_dir is None:
        raise pi.InstallError("no hooks directory beside the pbs_power package; "
                              "give --hooks-dir DIR (the directory holding PBS_power.py)")
    missing = pi.missing_hook_files(hooks_dir)
    if missing:
        raise pi.InstallError("hook script(s) missing: %s" % ", ".join(missing))
    return os.path.abspath(hooks_dir)


def _plan(args: argparse.Namespace) -> tuple:
    """(steps, Prepared or None, notes) for the arguments; InstallError/ConfigError if unusable."""
    if args.remove_resources and not args.uninstall:
        raise pi.InstallError("--remove-resources only goes with --uninstall")
    if args.uninstall:
        notes = [] if args.remove_resources else [
            "custom resources %s are kept: jobs and nodes may still reference them "
            "(--remove-resources deletes them)" % ", ".join(n for n, _ in pi.RESOURCES)]
        notes += _hosts_left_down(args.config)
        steps = pi.uninstall_steps(args.remove_resources)
        if not args.no_power_provisioning:
            steps += pi.provisioning_steps(False)
        return steps, None, notes
    hooks_dir = _hooks_dir(args.hooks_dir)
    config = args.config or os.path.join(hooks_dir, pi.DEFAULT_CONFIG_NAME)
    prepared = prepare_config(config, args.python_path, args.output_config, keep=not args.apply)
    try:
        from pbs_power.config.hook_config import load_config
        loaded = load_config(prepared.path)
        steps = pi.install_steps(hooks_dir, prepared.path, loaded.cycle_interval)
    except pi.InstallError:
        _cleanup(prepared)
        raise
    notes = list(prepared.notes)
    if args.no_power_provisioning:
        notes.append("power_provisioning left as it is: without it a job that needs a "
                     "sleeping vnode holds no reservation while its vnodes wake")
    elif loaded.job_policies.eoe_policies:
        notes.append("power_provisioning left off: job_policies.eoe_policies is set, and with "
                     "it on the scheduler runs a job that requests an eoe only on vnodes with "
                     "power_provisioning (src/scheduler/node_info.cpp is_powerok)")
    else:
        steps += pi.provisioning_steps(True)
    return steps, prepared, notes


def _hosts_left_down(config: Optional[str]) -> List[str]:
    """A note naming the hosts pbs_power has asleep or off: removing the hooks leaves them so."""
    from pbs_power.config.hook_config import ConfigError, load_config
    from pbs_power.states.store import DB_NAME, Store
    state_dir = os.environ.get("PBS_POWER_STATE_DIR") or "/var/spool/pbs_power"
    if config:
        try:
            state_dir = load_config(config).state_dir
        except (ConfigError, OSError, ValueError):
            pass
    if not os.path.exists(os.path.join(state_dir, DB_NAME)):
        return []
    try:
        with Store.open(state_dir) as store:
            down = sorted(set(store.down_since()) | {t.host for t in store.transitions()})
    except Exception as exc:  # a note only: the uninstall itself does not need the store
        return ["cannot tell which hosts pbs_power has down (%s): check them" % exc]
    if not down:
        return []
    return ["%d host(s) are asleep, powered off or changing state by pbs_power and stay so "
            "once the hooks are gone: %s; power them on (and clear their sleep mark) first"
            % (len(down), ",".join(down))]


def _cleanup(prepared: Optional[Prepared]) -> None:
    if prepared is not None and prepared.temp_dir:
        shutil.rmtree(prepared.temp_dir, ignore_errors=True)


def run_install(args: argparse.Namespace) -> int:
    """``pbs install``: print the commands, or run them with --apply."""
    from pbs_power.config.hook_config import ConfigError
    try:
        qmgr = _qmgr_path(args)
        steps, prepared, notes = _plan(args)
    except (pi.InstallError, ConfigError, OSError, ValueError) as exc:
        print("pbs-power pbs install: %s" % exc, file=sys.stderr)
        return EXIT_INVALID
    if qmgr == "qmgr":
        notes.insert(0, "PBS_EXEC unknown (no --pbs-exec, no readable pbs.conf): "
                        "run these with PBS_EXEC/bin/qmgr")
    elif not args.uninstall:
        mismatch = pi.python_mismatch(os.path.dirname(os.path.dirname(qmgr)),
                                      tuple(sys.version_info[:2]))
        if mismatch:
            notes.insert(0, mismatch)
    if args.apply and prepared is not None and prepared.temp_dir:
        notes.append("that copy is temporary: removed once qmgr has imported it")
    for note in notes:
        print("# %s" % note)
    if not args.apply:
        for step in steps:
            print(pi.shell_line(qmgr, step.command))
        return EXIT_OK
    try:
        ok = pi.run_steps(steps, pi.qmgr_runner(qmgr), _reporter(qmgr))
    finally:
        _cleanup(prepared)
    if ok:
        print("# %s" % ("pbs_power hooks removed" if args.uninstall else
                        "pbs_power installed: resources and hooks in place, hooks enabled"))
    return EXIT_OK if ok else EXIT_FAILED


def _qmgr_path(args: argparse.Namespace) -> str:
    """qmgr by full path; needed to --apply, merely nicer when printing (else plain 'qmgr')."""
    try:
        pbs_exec = pi.find_pbs_exec(args.pbs_exec, os.environ)
    except pi.InstallError:
        if args.apply:
            raise
        return "qmgr"
    if args.apply:
        return pi.pbs_command(pbs_exec, "qmgr")
    return os.path.join(pbs_exec, "bin", "qmgr")


def _reporter(qmgr: str) -> pi.Emit:
    """Print each step and its outcome; a failure's output goes to stderr."""
    def emit(step: pi.Step, status: str, result: Optional[pi.QmgrResult]) -> None:
        line = pi.shell_line(qmgr, step.command)
        if status != pi.FAILED:
            print("%s: %s" % (line, status))
            return
        code = "could not run" if result is None or result.returncode is None else \
            "exit %d" % result.returncode
        print("%s: %s (%s)" % (line, status, code))
        detail = (result.stderr or result.stdout).strip() if result else ""
        print(detail or "qmgr said nothing", file=sys.stderr)
    return emit


# -- nodes ---------------------------------------------------------------------------
def run_nodes(args: argparse.Namespace) -> int:
    """``pbs nodes``: the node table (or JSON list)."""
    try:
        result = pi.run_pbsnodes(pi.find_pbs_exec(args.pbs_exec, os.environ))
    except pi.InstallError as exc:
        print("pbs-power pbs nodes: %s" % exc, file=sys.stderr)
        return EXIT_INVALID
    if result.returncode != 0:
        print("pbsnodes failed (%s): %s" % (
            "could not run" if result.returncode is None else "exit %d" % result.returncode,
            (result.stderr or result.stdout).strip()), file=sys.stderr)
        return EXIT_FAILED
    try:
        rows = pi.parse_pbsnodes_json(result.stdout)
    except ValueError as exc:
        print("pbsnodes printed unusable JSON: %s" % exc, file=sys.stderr)
        return EXIT_FAILED
    rows = pi.with_policies(rows, _policy_view(args.state_dir, rows))
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
    else:
        for line in _table(rows):
            print(line)
    return EXIT_OK


def _policy_view(state_dir: Optional[str], rows: Sequence[pi.NodeRow]) -> pi.PolicyView:
    """What the resource-group state says about these nodes; empty without a database."""
    from pbs_power.cli.topology import DEFAULT_STATE_DIR, STATE_DIR_ENV
    from pbs_power.groups.store import DB_NAME
    empty = pi.PolicyView({}, {}, {})
    state_dir = state_dir or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
    if not os.path.isfile(os.path.join(state_dir, DB_NAME)):
        return empty
    from pbs_power.groups.service import ResourceGroupService
    from pbs_power.states.store import StoreError
    names = sorted({r.node for r in rows} | {r.host for r in rows})
    try:
        service = ResourceGroupService(state_dir)
    except StoreError as exc:
        print("warning: resource groups not shown: %s" % exc, file=sys.stderr)
        return empty
    try:
        topology, active = service.topology()
        return pi.policy_view(service.store.member_groups(names), service.list(),
                              topology, active, names)
    finally:
        service.close()


def _yes_no(value: Optional[bool]) -> str:
    return "-" if value is None else ("True" if value else "False")


def _table(rows: Sequence[pi.NodeRow]) -> List[str]:
    from pbs_power.cli.topology import table
    header = ("NODE", "STATE", "POWEROFF_ELIGIBLE", "POWER_MGMT", "LAST_USED",
              "LAST_STATE_CHANGE", "GROUP", "POLICY")
    return table(header, [(r.node, r.state or "-", _yes_no(r.poweroff_eligible),
                           _yes_no(r.power_mgmt), pi.local_time(r.last_used_time),
                           pi.local_time(r.last_state_change_time), r.group or "-",
                           r.policy or "-") for r in rows])
