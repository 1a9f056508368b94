"""``pbs-power devices check``: ask every node's backends whether they answer.

The work is in `pbs_power.devices.check`; this module parses and prints.
Exit codes: 0 every backend answered, 1 some did not, 2 bad input.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any, List, Optional

EXIT_OK, EXIT_UNREACHABLE, EXIT_INVALID = 0, 1, 2
STATE_DIR_ENV = "PBS_POWER_STATE_DIR"
COLUMNS = ("NODE", "BACKEND", "REACHABLE", "POWER", "CAP", "LATENCY_MS", "DIAGNOSTIC")


def add_parser(subparsers: Any) -> None:
    """Register ``devices check``."""
    parser = subparsers.add_parser(
        "devices", help="check the power and device backends of the nodes",
        description="Check the backends that power nodes on and off and cap their power.")
    actions = parser.add_subparsers(dest="devices_command", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check", help="ping every node's BMC / GPU backends and print a table",
        description="Ask each node's power backend (the hook config's power_backend) and, "
                    "with an imported topology, its device backend (a ping) whether they "
                    "answer, concurrently. Exit 0 if every one did, 1 if not, 2 bad input.")
    check.add_argument("nodes", metavar="NODES", nargs="?",
                       help="hostlist expression (default: every node of the power_backend "
                            "groups and the topology)")
    check.add_argument("--config", metavar="HOOKCONFIG",
                       help="hook config JSON (default: the built-in defaults)")
    check.add_argument("--state-dir", metavar="DIR",
                       help="state directory (default: the config's state_dir, else "
                            "$PBS_POWER_STATE_DIR)")
    check.add_argument("--timeout", metavar="SECONDS", type=float, default=30.0,
                       help="per-node time limit (default 30)")
    check.add_argument("--json", action="store_true", help="print the rows as JSON")
    check.set_defaults(func=run_check)


def run_check(args: argparse.Namespace) -> int:
    """``devices check``."""
    from pbs_power.config.hook_config import ConfigError, HookConfig, load_config
    from pbs_power.devices.check import CheckError, run_check as check
    nodes = _nodes(args.nodes)
    if nodes is None:
        return EXIT_INVALID
    if not args.timeout > 0:
        print("pbs-power devices check: --timeout must be > 0", file=sys.stderr)
        return EXIT_INVALID
    try:
        config = load_config(args.config) if args.config else HookConfig()
        state_dir = args.state_dir or (config.state_dir if args.config else None) \
            or os.environ.get(STATE_DIR_ENV) or config.state_dir
        report = check(config, nodes, state_dir, args.timeout)
    except (ConfigError, CheckError) as exc:
        print("pbs-power devices check: %s" % exc, file=sys.stderr)
        return EXIT_INVALID
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in report.rows], indent=1))
    else:
        print(format_table(report.rows))
    if not report.ok:
        print("%d of %d check(s) failed" % (report.unreachable, len(report.rows)),
              file=sys.stderr)
    return EXIT_OK if report.ok else EXIT_UNREACHABLE


def _nodes(expr: Optional[str]) -> Optional[List[str]]:
    """The hosts of ``expr`` ([] when not given); None after printing why it is bad."""
    if not expr:
        return []
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException
    from ClusterShell.RangeSet import RangeSetException
    try:
        return list(NodeSet(expr, resolver=RESOLVER_NOGROUP))
    except (NodeSetException, RangeSetException) as exc:
        print("pbs-power devices check: bad hostlist %r: %s" % (expr, exc), file=sys.stderr)
        return None


def format_table(rows: Any) -> str:
    """The rows as an aligned table, one line per node and backend."""
    lines = [COLUMNS]
    for r in rows:
        cap = "-" if r.cap_watts is None else "%g W" % r.cap_watts
        if r.gpu_caps:
            gpus = "/".join("?" if w is None else "%g" % w for w in r.gpu_caps)
            cap = "gpu %s W" % gpus if cap == "-" else "%s, gpu %s W" % (cap, gpus)
        lines.append((r.node, r.backend, "yes" if r.reachable else "NO", r.power_state or "-",
                      cap, "-" if r.latency_ms is None else "%.0f" % r.latency_ms,
                      r.diag or "-"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)) + "  " + line[-1]
                     for line in lines)
