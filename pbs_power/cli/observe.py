"""``pbs-power exporter``, ``status`` and ``history``: what the hooks did, at a glance.

All three read the state directory the hooks write (``state_dir`` of the
hook config); none of them writes to it.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

STATE_DIR_ENV = "PBS_POWER_STATE_DIR"
DEFAULT_STATE_DIR = "/var/spool/pbs_power"


def _state_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", metavar="DIR",
                        help="the hooks' state_dir (default: $PBS_POWER_STATE_DIR, else "
                             "/var/spool/pbs_power)")


def _state_dir(args: argparse.Namespace) -> str:
    return args.state_dir or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR


def add_parser(subparsers: Any) -> None:
    """Register ``exporter``, ``status`` and ``history``."""
    exporter = subparsers.add_parser(
        "exporter", help="serve Prometheus metrics read from the state stores",
        description="Serve /metrics for Prometheus: nodes by power state, transitions, "
                    "cycles, energy saved, wake waits, resource groups and budgets, read "
                    "(read-only) from the state directory on every scrape. Runs until "
                    "stopped; see docs/observability.md for a systemd unit.")
    exporter.add_argument("--listen", metavar="HOST:PORT", default="127.0.0.1:9850",
                          help="address to serve on (default 127.0.0.1:9850; port 0 picks "
                               "a free one and prints it)")
    _state_dir_option(exporter)
    exporter.set_defaults(func=run_exporter)

    status = subparsers.add_parser(
        "status", help="one screen: nodes by state, transitions, failures, energy, budgets",
        description="Nodes by power state, hosts in transition and since when, failed hosts "
                    "and the command that clears them, the last cycle, energy saved today "
                    "and this week, resource groups and each power domain's headroom.")
    _state_dir_option(status)
    status.add_argument("--json", action="store_true", help="print it as JSON")
    status.set_defaults(func=run_status)

    history = subparsers.add_parser(
        "history", help="one node's power transitions and resource groups",
        description="NODE's power transitions (start, end, duration, reason, outcome) and "
                    "the resource groups it was in, oldest first, then where it is now.")
    history.add_argument("node", metavar="NODE", help="host name as the scheduler shows it")
    history.add_argument("--since", metavar="WHEN",
                         help="only events from WHEN: an epoch, 2026-11-25[T08:00] or an "
                              "age (30m, 2h, 7d)")
    _state_dir_option(history)
    history.add_argument("--json", action="store_true", help="print it as JSON")
    history.set_defaults(func=run_history)


def run_exporter(args: argparse.Namespace) -> int:
    """Serve until interrupted; 1 when it cannot start."""
    from pbs_power.metrics.exporter import ExporterError, address, make_exporter
    try:
        server = make_exporter(_state_dir(args), args.listen)
    except ExporterError as exc:
        print("pbs-power exporter: %s" % exc, file=sys.stderr)
        return 1
    print("pbs-power exporter: serving %s from %s" % (address(server), _state_dir(args)),
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def run_status(args: argparse.Namespace) -> int:
    """Print the status screen (or JSON)."""
    from pbs_power.metrics.status import status, status_text
    doc = status(_state_dir(args))
    print(json.dumps(doc, indent=1, sort_keys=True) if args.json else status_text(doc))
    return 0


def run_history(args: argparse.Namespace) -> int:
    """Print NODE's history; 2 for a bad --since."""
    from pbs_power.metrics.status import history, history_text, parse_since
    now = time.time()
    try:
        since = parse_since(args.since, now) if args.since else None
    except ValueError as exc:
        print("pbs-power history: %s" % exc, file=sys.stderr)
        return 2
    doc = history(_state_dir(args), args.node, since, now)
    print(json.dumps(doc, indent=1, sort_keys=True) if args.json else history_text(doc))
    return 0
