"""``pbs-power slurm ...``: the periodic cycle, a check of how Slurm is read, slurm.conf lines."""
from __future__ import annotations

import argparse
import logging
import sys

from pbs_power.slurm.env import DEFAULT_CONFIG


def add_parser(subparsers) -> None:
    """Register ``slurm cycle``, ``slurm check`` and ``slurm install``."""
    parser = subparsers.add_parser(
        "slurm", help="Slurm: periodic wake-ahead cycle, slurm.conf lines",
        description="Slurm integration: run the planner over Slurm's view, or print the "
                    "slurm.conf/plugstack.conf lines for the hook config.")
    sub = parser.add_subparsers(dest="slurm_command", metavar="SUBCOMMAND", required=True)

    cycle = sub.add_parser(
        "cycle", help="one planning pass: wake nodes ahead of jobs, power idle ones down",
        description="Read nodes, jobs (with start estimates) and reservations from Slurm, run "
                    "the planner and ask slurmctld for state=power_up/power_down (Slurm then "
                    "runs the Suspend/ResumeProgram). Run it every cycle_interval seconds.")
    cycle.add_argument("--config", default=None,
                       help="hook config (default $PBS_POWER_CONFIG, else %s)" % DEFAULT_CONFIG)
    cycle.add_argument("--dry-run", action="store_true",
                       help="plan and print, change nothing")
    cycle.add_argument("--client", choices=("auto", "cli", "pyslurm"), default="auto",
                       help="how to read Slurm: pyslurm when importable (auto), or its commands")
    cycle.add_argument("--slurm-bin-dir", default=None,
                       help="directory of sinfo/squeue/scontrol (default: PATH)")
    cycle.set_defaults(func=cmd_cycle)

    check = sub.add_parser(
        "check", help="read Slurm once and say which client served what",
        description="Read nodes, jobs, reservations and the power settings once, and print "
                    "Slurm's version, the node source for it, and whether pyslurm or "
                    "Slurm's commands served each. Exit status 1 when Slurm cannot be read.")
    check.add_argument("--client", choices=("auto", "cli", "pyslurm"), default="auto",
                       help="how to read Slurm: pyslurm where it works (auto), or its commands")
    check.add_argument("--slurm-bin-dir", default=None,
                       help="directory of sinfo/squeue/scontrol (default: PATH)")
    check.set_defaults(func=cmd_check)

    install = sub.add_parser(
        "install", help="print the slurm.conf and plugstack.conf lines",
        description="Print slurm.conf lines (PrologSlurmctld, EpilogSlurmctld, SuspendProgram, "
                    "ResumeProgram, ResumeFailProgram, SuspendTime, SuspendTimeout, "
                    "ResumeTimeout, SuspendRate, ResumeRate, SuspendExcNodes) from the hook "
                    "config, and the plugstack.conf line for the --power-policy SPANK plugin.")
    install.add_argument("--config", default=None,
                         help="hook config (default $PBS_POWER_CONFIG, else %s)" % DEFAULT_CONFIG)
    install.add_argument("--bin-dir", default=None,
                         help="where the pbs-power-slurm-* programs are (default: found on "
                              "PATH, else next to this Python)")
    install.add_argument("--program-dir", default=None,
                         help="write wrappers naming --config into this directory and point "
                              "slurm.conf at them (for a config not at %s)" % DEFAULT_CONFIG)
    install.add_argument("--spank-plugin", default=None,
                         help="installed path of power_policy.so (default "
                              "/usr/local/lib/slurm/power_policy.so)")
    install.set_defaults(func=cmd_install)


def _load(path):
    from pbs_power.config.hook_config import ConfigError, load_config
    from pbs_power.slurm.env import config_path
    path = path or config_path()
    try:
        return path, load_config(path)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return path, None


def _console_logger(config) -> logging.Logger:
    """The programs' logger (syslog, slurm_log_file) plus stderr for the person running it."""
    from pbs_power.slurm.env import program_logger
    log = program_logger("cycle", config)
    if not any(isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is sys.stderr
               for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    return log


def cmd_cycle(args: argparse.Namespace) -> int:
    from pbs_power.slurm.adapter import SlurmError, get_client
    from pbs_power.slurm.cycle import cycle_main
    _path, config = _load(args.config)
    if config is None:
        return 2
    log = _console_logger(config)
    try:
        client = get_client(args.client, log=log, bin_dir=args.slurm_bin_dir)
    except SlurmError as exc:
        log.error("slurm cycle: %s", exc)
        return 1
    rc, report = cycle_main(config, client, log, dry_run=args.dry_run)
    if report is not None and report.ran:
        print("slurm cycle: %d power_up, %d power_down requested%s" % (
            len(report.powered_up), len(report.powered_down),
            " (dry run)" if args.dry_run else ""))
    return rc


def cmd_check(args: argparse.Namespace) -> int:
    from pbs_power.slurm.adapter import SlurmError
    from pbs_power.slurm.commands import CliClient
    from pbs_power.slurm.selection import check_lines, choose_client, probe_pyslurm
    probe = None if args.client == "cli" else probe_pyslurm(CliClient().env)
    try:
        client = choose_client(args.client, probe=probe, bin_dir=args.slurm_bin_dir)
        lines = check_lines(client, probe)
    except SlurmError as exc:
        print("slurm check: %s" % exc, file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


def cmd_install(args: argparse.Namespace) -> int:
    from pbs_power.slurm.install import DEFAULT_SPANK_PLUGIN, plan_install, write_wrappers
    path, config = _load(args.config)
    if config is None:
        return 2
    plan = plan_install(config, path, bin_dir=args.bin_dir, program_dir=args.program_dir,
                        spank_plugin=args.spank_plugin or DEFAULT_SPANK_PLUGIN)
    written = []
    if args.program_dir:
        try:
            written = write_wrappers(plan)
        except OSError as exc:
            print("cannot write wrappers in %s: %s" % (args.program_dir, exc), file=sys.stderr)
            return 1
    sys.stdout.write("".join("# wrote %s\n" % path for path in written) + plan.text())
    return 0
