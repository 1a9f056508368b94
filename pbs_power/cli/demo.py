"""``pbs-power demo``: the periodic power logic over a simulated cluster for a day."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pbs_power.config.hook_config import ConfigError, load_config


def add_parser(subparsers: Any) -> None:
    """Register ``demo``."""
    parser = subparsers.add_parser(
        "demo", help="run the power logic over a simulated cluster for a simulated day",
        description="Run the same periodic logic the PBS hook runs over a SIMULATED "
                    "cluster (simulated power backend, real SQLite state in a temporary "
                    "directory) fed a synthetic job stream, next to an always-on run of "
                    "the same jobs. Prints what was done each cycle and a one-line "
                    "energy summary. Touches no real host.")
    parser.add_argument("--hosts", type=_positive, default=64, help="simulated hosts (64)")
    parser.add_argument("--hours", type=_positive, default=24, help="simulated hours (24)")
    parser.add_argument("--seed", type=int, default=1, help="workload and boot-time seed (1)")
    parser.add_argument("--config", metavar="FILE",
                        help="use this hook config's limits (its backend and state_dir "
                             "are replaced by simulated ones)")
    parser.add_argument("--verbose", "-v", action="store_true",
                        help="also print every per-host decision, as the hook logs them")
    parser.add_argument("--json", action="store_true",
                        help="print only the summary, as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pbs_power.sim.demo import run_demo
    config = None
    if args.config:
        try:
            config = load_config(args.config)
        except ConfigError as exc:
            print(str(exc), file=sys.stderr)
            return 2
    out = (lambda line: None) if args.json else print
    summary = run_demo(hosts=int(args.hosts), hours=args.hours, seed=args.seed,
                       out=out, verbose=args.verbose, config=config)
    if args.json:
        print(json.dumps({k: round(v, 3) for k, v in summary.items()}))
    return 0


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number: %r" % text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be > 0: %r" % text)
    return value
