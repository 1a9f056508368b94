"""``pbs-power node gpu-caps``: the agent run on a GPU node (see `pbs_power.devices.node_agent`)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

STATE_DIR_ENV = "PBS_POWER_STATE_DIR"
DEFAULT_STATE_DIR = "/var/spool/pbs_power"


def add_parser(subparsers: Any) -> None:
    """Register ``node gpu-caps``."""
    from pbs_power.devices.node_agent import OPERATIONS
    parser = subparsers.add_parser(
        "node", help="agent commands run on a compute node (GPU power limits)",
        description="Commands run on a compute node, usually by the head node through the "
                    "'command' device backend and the site's remote shell.")
    actions = parser.add_subparsers(dest="node_command", metavar="ACTION", required=True)
    caps = actions.add_parser(
        "gpu-caps", help="show, set or restore this node's GPU power limits (NVML)",
        description="Read a device request as JSON on stdin, apply it to this node's GPUs "
                    "through NVML, print the device response as JSON. OPERATION is show, "
                    "set, restore or a device-controller kind (ping, "
                    "resource_group_activate, ...). Exit 0 done, 1 failed, 2 bad input.")
    caps.add_argument("operation", metavar="OPERATION", choices=OPERATIONS,
                      help="show | set | restore | %s" % " | ".join(OPERATIONS[3:]))
    caps.add_argument("device", metavar="DEVICE", nargs="?",
                      help="this node's name in the topology (default: the short host name)")
    caps.add_argument("--state-dir", metavar="DIR",
                      help="where saved limits are kept (default: $PBS_POWER_STATE_DIR, else "
                           "/var/spool/pbs_power)")
    caps.add_argument("--out-of-range", choices=("clamp", "refuse"), default="clamp",
                      help="a limit outside the GPU's range is clamped into it (default) or "
                           "refused")
    caps.set_defaults(func=run_gpu_caps)


def run_gpu_caps(args: argparse.Namespace) -> int:
    """``node gpu-caps OPERATION [DEVICE]``: print the answer, return its exit status."""
    from pbs_power.devices.node_agent import EXIT_INVALID, default_device, gpu_caps
    from pbs_power.devices.nvml import NvmlDevices
    state_dir = args.state_dir or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
    stdin_text = ""
    if args.operation != "show" and sys.stdin is not None and not sys.stdin.isatty():
        stdin_text = sys.stdin.read()
    answer = gpu_caps(args.operation, args.device or default_device(), stdin_text,
                      NvmlDevices(state_dir, args.out_of_range))
    print(json.dumps(answer.doc, indent=1, sort_keys=True))
    if answer.code == EXIT_INVALID:  # other failures are in the JSON answer, read by callers
        print("pbs-power node gpu-caps %s: %s" % (args.operation, answer.doc["error"]),
              file=sys.stderr)
    return answer.code
