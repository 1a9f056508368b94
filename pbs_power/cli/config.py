"""``pbs-power config``: validate a hook config file or show the effective one."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pbs_power.config.hook_config import ConfigError, HookConfig, config_to_dict, load_config

EXIT_OK = 0
EXIT_INVALID = 2  # same as a usage error: the input given is not usable


def add_parser(subparsers: Any) -> None:
    """Register ``config validate`` and ``config show``."""
    parser = subparsers.add_parser(
        "config", help="check or show a hook configuration file",
        description="Check a pbs_power hook configuration file (JSON, a superset of "
                    "OpenPBS's PBS_power.CF) or print the configuration it gives.")
    actions = parser.add_subparsers(dest="config_command", metavar="ACTION", required=True)

    validate = actions.add_parser(
        "validate", help="check FILE: print 'FILE: OK', or its problems and exit 2",
        description="Check FILE; print 'FILE: OK' (warnings on stderr) or every problem "
                    "found (on stderr) and exit 2.")
    validate.add_argument("file", metavar="FILE", help="hook config JSON file")
    validate.set_defaults(func=run_validate)

    show = actions.add_parser(
        "show", help="print the effective configuration (file over defaults) as JSON",
        description="Print the effective configuration as JSON: every key, defaults "
                    "filled, hostlists normalized.")
    source = show.add_mutually_exclusive_group()
    source.add_argument("file", metavar="FILE", nargs="?",
                        help="hook config JSON file (default: $PBS_POWER_CONFIG, else "
                             "/etc/pbs_power.json, as the Slurm programs find it)")
    source.add_argument("--defaults", action="store_true",
                        help="show the defaults instead of a file's configuration")
    show.set_defaults(func=run_show)


def _load(path: str) -> HookConfig:
    """Load ``path``, printing its warnings on stderr."""
    config = load_config(path)
    for warning in config.warnings:
        print("warning: %s" % warning, file=sys.stderr)
    return config


def run_validate(args: argparse.Namespace) -> int:
    """``config validate FILE``."""
    try:
        _load(args.file)
    except ConfigError as err:
        print(err, file=sys.stderr)
        return EXIT_INVALID
    print("%s: OK" % args.file)
    return EXIT_OK


def run_show(args: argparse.Namespace) -> int:
    """``config show [FILE]`` / ``config show --defaults``."""
    from pbs_power.slurm.env import config_path
    try:
        config = HookConfig() if args.defaults else _load(args.file or config_path())
    except ConfigError as err:
        print(err, file=sys.stderr)
        return EXIT_INVALID
    print(json.dumps(config_to_dict(config), indent=2))
    return EXIT_OK
