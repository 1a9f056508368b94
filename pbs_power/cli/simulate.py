"""``pbs-power simulate``: replay a workload trace under several power managers."""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Dict, Optional

from pbs_power.config.hook_config import ConfigError, load_config
from .groups import finite_float, positive_seconds

MANAGER_HELP = ("always-on (the baseline: never powers down), pbs-power (this "
                "package's hook logic, on a PBS server with power_provisioning on, as "
                "pbs install sets it), slurm (slurmctld's power save: SuspendTime = "
                "node_idle_limit, SuspendRate 60 and ResumeRate 300 per minute as tokens "
                "refilled every 10 s pass, resume on allocation, ResumeTimeout 600 s, "
                "SuspendExcNodes=ALL:min_idle_nodes), openpbs (OpenPBS's PBS_power hook "
                "as shipped: every 300 s, at most 5 power-offs and 5 power-ons, fixed "
                "900 s boot), pbs-power-forecast (a check, not in the default list: "
                "pbs-power fed the simulator's own EASY calendar of every queued job "
                "instead of the hook's forecast from what PBS shows)")
NODE_POWER_KEYS = ("busy", "idle", "sleep", "off", "boot")


def positive_int(text: str) -> int:
    """An argparse type: a whole number of 1 or more (0 would silently mean "the default")."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a whole number, got %r" % text) from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be 1 or more, got %d" % value)
    return value


def add_parser(subparsers: Any) -> None:
    """Register ``simulate``."""
    p = subparsers.add_parser(
        "simulate", help="replay a real workload trace: energy saved vs job delay per manager",
        description="Replay a Standard Workload Format trace (.swf or .swf.gz, e.g. from the "
                    "Parallel Workloads Archive) on a SIMULATED cluster (FCFS + EASY "
                    "backfilling on requested walltimes; per-node boot times) once per "
                    "power manager, and compare energy and job waits against always-on. "
                    "Without --trace, a window of the KTH-SP2 trace bundled with "
                    "the package is used (927 jobs submitted over 14 days, Nov 18 to Dec 2, 1996). A .csv or .csv.gz "
                    "trace is read as a GPU-cluster "
                    "pod list (Alibaba cluster-trace-gpu-v2023 columns; one pod = one "
                    "whole-node job; cluster size from the node_list_all_node CSV next to "
                    "it): use --node-type gpu with it. Managers: " + MANAGER_HELP + ".")
    p.add_argument("--trace", metavar="FILE",
                   help="SWF trace, or a .csv/.csv.gz GPU pod list (default: the bundled "
                        "KTH-SP2 window)")
    p.add_argument("--managers", default="always-on,pbs-power,slurm,openpbs",
                   help="comma-separated managers to compare (always-on always runs)")
    p.add_argument("--config", metavar="HOOKCONFIG",
                   help="hook config whose limits pbs-power, slurm and openpbs use "
                        "(default: the shipped defaults with power_on_off_enable)")
    p.add_argument("--nodes", type=positive_int, help="simulated nodes (default: the trace's MaxNodes, "
                                               "or the pod list's node list)")
    p.add_argument("--cores-per-node", type=positive_int,
                   help="processors per node, to turn a job's processors into nodes "
                        "(default: MaxProcs / MaxNodes, rounded up); GPUs per node for a "
                        "pod list (default: the node list's most common, else 8)")
    p.add_argument("--window", metavar="START:END",
                   help="only jobs submitted in this window of the trace, e.g. 30d:60d, 0:86400")
    p.add_argument("--cycle", type=positive_int,
                   help="seconds between periodic hook runs (default: the config's "
                        "cycle_interval); also what the planner is told")
    p.add_argument("--node-type", choices=("cpu", "gpu"), default="cpu",
                   help="watts and boot times of a typical CPU or 4-GPU node (cpu; "
                        "use gpu for a GPU pod list)")
    p.add_argument("--node-power", metavar="STATE=W,...",
                   help="node watts by state, overriding --node-type and the config's "
                        "node_power, e.g. busy=450,idle=250,off=10 (states: %s)"
                        % ", ".join(NODE_POWER_KEYS))
    p.add_argument("--boot-seconds", type=positive_seconds, metavar="S",
                   help="mean seconds a simulated node takes to boot (default: the node "
                        "type's ASSUMED 300 s for cpu, 420 s for gpu); set your nodes' own")
    p.add_argument("--boot-spread", type=spread_fraction, metavar="F",
                   help="how far each node's own mean boot may lie from --boot-seconds, as "
                        "a fraction: 0.5 means from half to one and a half times it (default "
                        "0.5, ASSUMED); 0 gives every node the same boot")
    p.add_argument("--seed", type=int, default=1, help="seed for per-node boot times (1)")
    p.add_argument("--json", action="store_true", help="print one JSON object, no table")
    p.add_argument("--plot", metavar="OUT.png",
                   help="write cluster power and nodes on/asleep/off over time (matplotlib)")
    p.set_defaults(func=run)


def spread_fraction(text: str) -> float:
    """An argparse type: a fraction in [0, 1)."""
    value = finite_float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError("must be at least 0 and below 1, got %r" % text)
    return value


def run(args: argparse.Namespace) -> int:
    from pbs_power.sim import report
    from pbs_power.sim.managers import MANAGERS
    from pbs_power.sim.simulate import simulate
    managers = [m.strip() for m in args.managers.split(",") if m.strip()]
    unknown = [m for m in managers if m not in MANAGERS]
    if unknown:
        return _fail("unknown manager(s): %s (known: %s)" % (", ".join(unknown), ", ".join(MANAGERS)))
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return _fail("--plot needs matplotlib: pip install 'pbs-power[plot]'")
    try:
        trace, jobs, nodes, per_node = _workload(args)
        config = _config(args.config)
        model = _model(args.node_type, config, args.node_power)
        boots = {k: v for k, v in (("boot_seconds", args.boot_seconds),
                                   ("boot_spread", args.boot_spread)) if v is not None}
        model = model.with_overrides(boots) if boots else model
    except (OSError, ValueError, ConfigError) as exc:
        return _fail(str(exc))
    if not jobs:
        return _fail("%s: no jobs to simulate" % trace.report.summary())
    print(trace.report.summary(), file=sys.stderr)
    print("simulating %s jobs on %d nodes (%d %s per node), managers: %s"
          % (format(len(jobs), ","), nodes, per_node, _unit(trace), ", ".join(managers)),
          file=sys.stderr)
    cycle = args.cycle or config.cycle_interval
    result = simulate(jobs, nodes, model, config, managers, cycle=cycle,
                      seed=args.seed, progress=_progress_bar())
    if sys.stderr.isatty():
        sys.stderr.write("\r" + " " * 60 + "\r")
    if args.plot:
        report.plot(result, args.plot, title="%s, %d nodes (SIMULATED)" % (trace.name, nodes))
        print("plot written to %s" % args.plot, file=sys.stderr)
    if args.json:
        print(json.dumps(report.as_json(result, trace=trace.name, cycle=cycle,
                                        node_type=args.node_type,
                                        boot_seconds=model.boot_seconds,
                                        boot_spread=model.boot_spread)))
    else:
        submitted = max(j.submit for j in jobs) - min(j.submit for j in jobs) if jobs else 0.0
        print("%s: %s jobs, %d nodes, %.1f days simulated (jobs submitted over %.1f days, "
              "then until the last ends; SIMULATED: saved and added wait are vs always-on)"
              % (trace.name, format(result.jobs, ","), nodes, result.span_s / 86400,
                 submitted / 86400))
        print(report.table(result))
        print(LEGEND % ("none set" if config.max_ramp_watts_per_minute is None else
                        "%g W/min" % config.max_ramp_watts_per_minute), file=sys.stderr)
    return 0


LEGEND = """
added wait: how much later than under always-on a job started (mean, 95th percentile, worst).
start change mean: the plain mean of start changes (earlier starts offset later ones).
delayed: jobs that started later than under always-on. cycles/node-day: power-downs
per node per day. peak ramp: the largest change of cluster power within one minute; min over
ramp: minutes whose change exceeded max_ramp_watts_per_minute (%s).
Next: --trace YOUR.swf (your own workload; --window 30d:60d for part of it), --config
YOUR.json (your limits, as the hooks would use them), --plot out.png, --json."""


def _workload(args: argparse.Namespace):
    from pbs_power.sim.pods import is_pod_csv, read_pods
    from pbs_power.sim.swf import parse_window, read_sample, read_swf
    if args.trace:
        window = parse_window(args.window) if args.window else None
        reader = read_pods if is_pod_csv(args.trace) else read_swf
        trace = reader(args.trace, window=window)
    elif args.window:
        raise ValueError("--window needs --trace (the bundled sample is already a window)")
    else:
        trace = read_sample()
    header = trace.header
    nodes = args.nodes or header.max_nodes
    pods = _unit(trace) == "GPUs"
    if not nodes or nodes < 1:
        raise ValueError("%s has no %s: give --nodes" % (
            trace.name, "node list next to it" if pods else "MaxNodes header"))
    per_node = args.cores_per_node
    if per_node is None and pods:
        per_node = header.gpus_per_node
    elif per_node is None:
        per_node = -(-header.max_procs // nodes) if header.max_procs else 1
    if per_node < 1:
        raise ValueError("--cores-per-node must be >= 1")
    return trace, trace.sim_jobs(cores_per_node=per_node, nodes=nodes), nodes, per_node


def _unit(trace) -> str:
    """What a job's width counts: GPUs for a pod list, processors for SWF."""
    from pbs_power.sim.pods import PodTrace
    return "GPUs" if isinstance(trace, PodTrace) else "processors"


def _config(path: Optional[str]):
    from pbs_power.sim.simulate import default_config
    if not path:
        return default_config()
    config = load_config(path)
    if config.mode == "disabled":
        print("warning: %s enables neither power_on_off_enable nor "
              "power_ramp_rate_enable: pbs-power and openpbs will power nothing down"
              % path, file=sys.stderr)
    return config


def _model(node_type: str, config, node_power: Optional[str] = None):
    """The node model: the type's ASSUMED watts, then the config's node_power, then --node-power."""
    from pbs_power.sim.nodes import NODE_MODELS
    model = NODE_MODELS[node_type]
    if config.node_power is not None:
        p = config.node_power
        model = model.with_overrides(dict(busy_watts=p.busy_watts, idle_watts=p.idle_watts,
                                          sleep_watts=p.sleep_watts, off_watts=p.off_watts))
    if node_power:
        model = model.with_overrides(parse_node_power(node_power))
    return model


def parse_node_power(text: str) -> Dict[str, float]:
    """``busy=450,idle=250`` -> NodeModel fields; ValueError on anything else."""
    values: Dict[str, float] = {}
    for item in text.split(","):
        key, eq, value = item.strip().partition("=")
        key = key.strip().lower()
        if not eq or key not in NODE_POWER_KEYS:
            raise ValueError("--node-power: %r is not STATE=WATTS (states: %s)"
                             % (item.strip(), ", ".join(NODE_POWER_KEYS)))
        try:
            watts = float(value)
        except ValueError:
            raise ValueError("--node-power: %r is not a number of watts" % value) from None
        if not watts >= 0 or watts == float("inf"):
            raise ValueError("--node-power: %s must be a finite number of watts >= 0" % key)
        values[key + "_watts"] = watts
    return values


def _progress_bar():
    """A progress callback drawing on stderr (a terminal only), after 2 s."""
    began = time.monotonic()
    if not sys.stderr.isatty():
        return None

    def show(manager: str, fraction: float) -> None:
        if time.monotonic() - began < 2.0:
            return
        filled = int(30 * fraction)
        sys.stderr.write("\r%-10s [%s%s] %3d%%" % (manager, "#" * filled, "." * (30 - filled),
                                                  int(100 * fraction)))
        sys.stderr.flush()
    return show


def _fail(message: str) -> int:
    print("pbs-power simulate: " + message, file=sys.stderr)
    return 2
