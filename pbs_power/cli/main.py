"""The ``pbs-power`` command line: parses arguments, calls the library, prints.

Subcommands live in their own modules, listed in SUBCOMMANDS. Each module
defines ``add_parser(subparsers) -> None``, which adds its parser and sets
``func`` (``func(args) -> int``, the exit code) with ``set_defaults``.
"""
from __future__ import annotations

import argparse
import importlib
from typing import List, Optional, Sequence

#: Modules that contribute subcommands, in the order ``--help`` lists them.
#: To add one: write ``pbs_power/cli_NAME.py`` with ``add_parser`` and append it here.
SUBCOMMANDS: List[str] = [
    "pbs_power.cli.config",
    "pbs_power.cli.demo",
    "pbs_power.cli.simulate",
    "pbs_power.cli.topology",
    "pbs_power.cli.groups",
    "pbs_power.cli.pbs",
    "pbs_power.cli.devices",
    "pbs_power.cli.node",
    "pbs_power.cli.allocator",
    "pbs_power.cli.slurm",
    "pbs_power.cli.observe",
]

DESCRIPTION = (
    "Power management for HPC batch clusters, run from PBS Pro/OpenPBS and Slurm hooks.\n"
    "The hooks and Slurm programs do the periodic and per-job work; this command\n"
    "checks their config, installs them (pbs install, slurm install), manages the\n"
    "topology, policies and per-job resource groups, checks that every node's power\n"
    "and device backends answer, runs the GPU agent on a node, runs the Slurm\n"
    "wake-ahead cycle and the power-aware allocator server, runs the demo,\n"
    "replays real workload traces to compare power managers (simulate), and shows\n"
    "what the hooks did: status, history NODE, and a Prometheus exporter."
)


def version() -> str:
    """The installed distribution's version, or 'unknown' when run from a bare tree."""
    try:
        from importlib.metadata import version as dist_version
        return dist_version("pbs-power")
    except Exception:  # not installed as a distribution (e.g. a bare source tree)
        import pbs_power
        return getattr(pbs_power, "__version__", "unknown")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="pbs-power", description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version="%(prog)s " + version())
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(name).add_parser(subparsers)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``pbs-power``; returns the exit code (2 for usage errors, as argparse)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    try:
        return int(args.func(args))
    except BrokenPipeError:
        # the reader went away (`pbs-power topology show | head`): not an error of ours
        return _reader_gone()


def _reader_gone() -> int:
    """Point stdout at /dev/null so the interpreter's final flush does not fail too."""
    import os
    import sys
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141  # 128 + SIGPIPE, what a shell reports for a killed writer


if __name__ == "__main__":
    import sys
    sys.exit(main())
