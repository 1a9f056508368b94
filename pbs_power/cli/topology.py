"""``pbs-power topology`` and ``pbs-power policy``, and what every service command shares.

The topology comes first (import, activate), then resource groups
(``cli_rg``) build on it; both use the plumbing here: the common options
(``--state-dir``, ``--json``, ``--device-option``, ``--verbose``), opening
the service, exit codes and the compact per-node table.
Exit codes: 0 ok, 1 the operation failed (diagnostic on stderr), 2 bad usage
or input (argparse errors, unknown group or policy, bad hostlist, answers
coded ``invalid`` or ``not_found``).
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
STATE_DIR_ENV = "PBS_POWER_STATE_DIR"
DEFAULT_STATE_DIR = "/var/spool/pbs_power"
#: ``--device-option`` keys: top-level ones, and those under ``simulated.``.
DEVICE_OPTION_KEYS = ("simulated", "timeout_seconds", "max_workers")
INT_RE = re.compile(r"[+-]?[0-9]+")
FLOAT_RE = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


class CliError(Exception):
    """A problem found after parsing: its message and exit code."""

    def __init__(self, message: str, code: int = EXIT_INVALID):
        super().__init__(message)
        self.code = code


# -- argument types ------------------------------------------------------------
def scalar(text: str) -> Any:
    """``5`` -> 5, ``0.1`` -> 0.1, anything else stays a string."""
    if INT_RE.fullmatch(text):
        return int(text)
    if FLOAT_RE.fullmatch(text):
        return float(text)
    return text


def key_value(text: str, what: str) -> Tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError("expected %s, got %r" % (what, text))
    return key.strip(), value


def device_option(text: str) -> Tuple[Tuple[str, ...], Any]:
    """``simulated.latency_ms=5`` -> (('simulated', 'latency_ms'), 5)."""
    key, value = key_value(text, "KEY=VALUE (e.g. simulated.latency_ms=5)")
    path = tuple(key.split("."))
    if path[0] not in DEVICE_OPTION_KEYS:
        raise argparse.ArgumentTypeError("unknown key %r in %r (known: %s, simulated.OPTION)"
                                         % (path[0], text, ", ".join(DEVICE_OPTION_KEYS)))
    if path[0] == "simulated":
        from pbs_power.devices.simulated_devices import OPTIONS
        if len(path) != 2 or path[1] not in OPTIONS:
            raise argparse.ArgumentTypeError("unknown key %r in %r (simulated options: %s)"
                                             % (key, text, ", ".join(OPTIONS)))
    elif len(path) != 1:
        raise argparse.ArgumentTypeError("unknown key %r in %r" % (key, text))
    return path, scalar(value)


# -- shared plumbing -----------------------------------------------------------
def common_options() -> argparse.ArgumentParser:
    """The options every service command takes (a parent parser)."""
    parent = argparse.ArgumentParser(add_help=False)
    group = parent.add_argument_group("common options")
    group.add_argument("--state-dir", metavar="DIR",
                       help="service state directory (default: $PBS_POWER_STATE_DIR, "
                            "else /var/spool/pbs_power)")
    group.add_argument("--json", action="store_true", help="print the answer as JSON")
    group.add_argument("--device-option", metavar="KEY=VALUE", action="append",
                       type=device_option, default=None,
                       help="device controller option, repeatable: simulated.latency_ms=5, "
                            "simulated.failure_rate=0.1, simulated.fail_devices=gpu[001-002], "
                            "timeout_seconds=10, max_workers=64")
    group.add_argument("--verbose", "-v", action="store_true",
                       help="show every node's outcome, not only failures")
    return parent


def leaf(actions: Any, name: str, help_text: str, description: str,
         func: Callable[[Any, argparse.Namespace], int]) -> argparse.ArgumentParser:
    """A subcommand parser with the common options, running ``func(service, args)``."""
    parser = actions.add_parser(name, help=help_text, description=description,
                                parents=[common_options()])
    parser.set_defaults(func=service_command(func), prog_name=parser.prog)
    return parser


def device_options(pairs: Optional[Sequence[Tuple[Tuple[str, ...], Any]]]) -> Dict[str, Any]:
    """The nested ``device_options`` dict, checked; CliError names a bad option."""
    out: Dict[str, Any] = {}
    for path, value in pairs or ():
        key = ".".join(path)
        at = out
        for part in path[:-1]:
            at = at.setdefault(part, {})
        if path[-1] in at:
            raise CliError("--device-option %s is given twice" % key)
        at[path[-1]] = value
    workers = out.get("max_workers", 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise CliError("--device-option max_workers must be an integer >= 1, got %r" % (workers,))
    timeout = out.get("timeout_seconds", 1)
    if isinstance(timeout, str) or not timeout > 0:
        raise CliError("--device-option timeout_seconds must be a number > 0, got %r"
                       % (timeout,))
    from pbs_power.devices.base import BackendError
    from pbs_power.devices.simulated_devices import SimulatedDevices
    try:
        SimulatedDevices.from_options(out.get("simulated", {}))
    except BackendError as exc:
        raise CliError("--device-option: %s" % exc) from None
    return out


def service_command(func: Callable[[Any, argparse.Namespace], int]
                    ) -> Callable[[argparse.Namespace], int]:
    """Open the service for ``func``, close it after; CliError -> message and its code."""
    def run(args: argparse.Namespace) -> int:
        import sqlite3
        from pbs_power.states.sqlite import StoreError, database_error
        service = None
        try:
            options = device_options(args.device_option)
            from pbs_power.groups.service import ResourceGroupService
            state_dir = args.state_dir or os.environ.get(STATE_DIR_ENV) or DEFAULT_STATE_DIR
            try:
                service = ResourceGroupService(state_dir, options)
                return func(service, args)
            except StoreError as exc:
                raise CliError(str(exc), EXIT_FAILED) from None
            except sqlite3.DatabaseError as exc:   # damage found while reading or writing
                from pbs_power.groups.store import DB_NAME
                path = service.store.path if service is not None else \
                    os.path.join(state_dir, DB_NAME)
                raise CliError(str(database_error(path, exc)), EXIT_FAILED) from None
        except CliError as exc:
            if args.json:
                print(json.dumps({"status": {"ok": False, "diag_msg": str(exc), "code":
                                             "invalid" if exc.code == EXIT_INVALID
                                             else "failed"}}))
            print("%s: error: %s" % (args.prog_name, exc), file=sys.stderr)
            return exc.code
        finally:
            if service is not None:
                service.close()
    return run


def exit_code(ok: bool, code: str) -> int:
    if ok:
        return EXIT_OK
    return EXIT_INVALID if code in ("invalid", "not_found") else EXIT_FAILED


def finish(args: argparse.Namespace, answer: Any, ok: bool, code: str, line: str,
           error: str = "", table: Sequence[str] = ()) -> int:
    """Print an answer (JSON, or ``line`` and ``table``; ``error`` on stderr); exit code."""
    if args.json:
        data = answer.to_dict() if hasattr(answer, "to_dict") else answer
        print(json.dumps(data, indent=2, sort_keys=True, default=str))
    else:
        if line:
            print(line)
        for row in table:
            print(row)
    if not ok and error:
        print(error, file=sys.stderr)
    return exit_code(ok, code)


def node_table(statuses: Mapping[str, Any], verbose: bool) -> List[str]:
    """Node outcomes as a compact table (failures only unless verbose), alike rows folded."""
    rows: Dict[Tuple[str, str, str, str], List[str]] = {}
    for entity, out in sorted(statuses.items()):
        doc = out if isinstance(out, Mapping) else out.to_dict()
        if doc.get("ok") and not verbose:
            continue
        cap = doc.get("power_cap_watts")
        key = ("yes" if doc.get("ok") else "NO", doc.get("policy") or "-",
               "-" if cap is None else "%.0f" % cap, doc.get("diag_msg") or "")
        rows.setdefault(key, []).append(entity)
    if not rows:
        return []
    lines = [(fold(names),) + key for key, names in rows.items()]
    return table(("NODE", "OK", "POLICY", "CAP W", "DIAG"), lines)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    widths = [max(len(str(r[i])) for r in [header] + list(rows)) for i in range(len(header))]
    return ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()
            for r in [header] + list(rows)]


def fold(names: Sequence[str]) -> str:
    """Host names as one hostlist expression (``gpu[001-016]``)."""
    if not names:
        return "-"
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet
    return str(NodeSet.fromlist(list(names), resolver=RESOLVER_NOGROUP))


# -- topology ------------------------------------------------------------------
def add_parser(subparsers: Any) -> None:
    """Register ``topology`` and ``policy``."""
    parser = subparsers.add_parser(
        "topology", help="import, show, activate or deactivate the power topology",
        description="The topology: entities (nodes) with device specs, power domains with "
                    "budgets, and policies. Import it, then activate it (every node gets "
                    "its topology policy) before creating resource groups.")
    actions = parser.add_subparsers(dest="topology_command", metavar="ACTION", required=True)
    p = leaf(actions, "import", "store a topology file (inactive)",
             "Check a topology JSON file and store it, inactive. Refused while resource "
             "groups exist.", run_import)
    p.add_argument("file", metavar="FILE", help="topology JSON file")
    leaf(actions, "show", "print the topology: domains with budget and allocated watts",
         "Print the stored topology: whether it is active, its entity count, its power "
         "domains (budget and watts allocated now) and its policies (node watts for each "
         "device spec).", run_show)
    leaf(actions, "activate", "apply every node's topology policy",
         "Activate the stored topology: every node gets its topology policy.",
         lambda service, args: _set_active(service, args, True))
    leaf(actions, "deactivate", "unset every node's topology policy",
         "Deactivate the stored topology (refused while resource groups are active).",
         lambda service, args: _set_active(service, args, False))

    parser = subparsers.add_parser(
        "policy", help="list, show or create power policies",
        description="Power policies of the stored topology: named NODE (and GPU, CPU, "
                    "MEMORY) power limits in watts or percent of the device maximum.")
    actions = parser.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    leaf(actions, "list", "list the topology's policies",
         "List the topology's policies with their limits and node watts.", run_policy_list)
    p = leaf(actions, "show", "show one policy",
             "Show one policy: its limits and the node watts it gives each device spec.",
             run_policy_show)
    p.add_argument("name", metavar="NAME")
    p = leaf(actions, "create", "add a policy to the topology",
             "Add a policy to the stored topology, from a JSON file or an inline JSON "
             "object: {\"name\": \"Node-Eco\", \"limits\": [{\"element_type\": \"NODE\", "
             "\"power_limit\": {\"watts\": 5000}}]}.", run_policy_create)
    p.add_argument("source", metavar="FILE_OR_JSON")


def _stored(service: Any) -> Tuple[Any, bool]:
    topo, active = service.topology()
    if topo is None:
        raise CliError("no topology: import one first (pbs-power topology import FILE)")
    return topo, active


def run_import(service: Any, args: argparse.Namespace) -> int:
    from pbs_power.groups.topology import TopologyError, load_topology
    try:
        topo = load_topology(args.file)
    except TopologyError as exc:
        raise CliError(str(exc)) from None
    for warning in topo.warnings:
        print("warning: %s" % warning, file=sys.stderr)
    status = service.import_topology(topo)
    return finish(args, {"status": dataclasses.asdict(status)}, status.ok, status.code,
                  status.diag_msg if status.ok else "", status.diag_msg)


def _set_active(service: Any, args: argparse.Namespace, active: bool) -> int:
    r = service.set_topology_active(active)
    return finish(args, r, r.status.ok, r.status.code, r.status.diag_msg if r.status.ok else "",
                  r.status.diag_msg, node_table(r.node_statuses, args.verbose))


def _node_watts(topo: Any, policy: Any) -> Dict[str, float]:
    """Node watts under ``policy`` for each device spec some entity uses."""
    out: Dict[str, float] = {}
    for entity in topo.entities.values():
        if entity.device.name not in out:
            out[entity.device.name] = topo.node_watts(entity.name, policy)
    return out


def _limits(policy: Any) -> str:
    return ", ".join("%s %s" % (lim.element_type.name, "%g W" % lim.power_limit.watts
                                if lim.power_limit.watts is not None
                                else "%g%%" % lim.power_limit.percentage)
                     for lim in policy.limits)


def _policy_doc(topo: Any, policy: Any) -> Dict[str, Any]:
    return dict(policy.to_dict(), node_watts=_node_watts(topo, policy),
                default=policy.name == topo.default_policy)


def run_show(service: Any, args: argparse.Namespace) -> int:
    from pbs_power.groups import budget
    topo, active = _stored(service)
    alloc = {e: m.applied_watts for e, m in service.store.allocations().items()}
    used = budget.usage(topo, alloc)
    domains = []
    for name, dom in topo.domains.items():
        depth, at = 0, dom.parent
        while at is not None:
            depth, at = depth + 1, topo.domains[at].parent
        domains.append({"name": name, "kind": dom.kind, "parent": dom.parent, "depth": depth,
                        "budget_watts": dom.budget_watts, "allocated_watts": used[name],
                        "entities": len(topo.entities_under(name))})
    doc = {"name": topo.name, "active": active, "entities": len(topo.entities),
           "default_policy": topo.default_policy, "domains": domains,
           "policies": [_policy_doc(topo, p) for p in topo.policies.values()]}
    lines = ["power domains: allocated / budget"]
    for d in domains:
        budget_text = "unlimited" if d["budget_watts"] is None else "%.0f W" % d["budget_watts"]
        lines.append("%s%s (%s, %d entities): %.0f W / %s" % (
            "  " * (d["depth"] + 1), d["name"], d["kind"], d["entities"],
            d["allocated_watts"], budget_text))
    lines.append("policies: node watts per device spec")
    for p in doc["policies"]:
        lines.append("  %s%s: %s" % (p["name"], " (default)" if p["default"] else "", ", ".join(
            "%s %.0f W" % kv for kv in p["node_watts"].items())))
    head = "topology %s: %s, %d entities" % (topo.name, "active" if active else "inactive",
                                            len(topo.entities))
    return finish(args, doc, True, "ok", head, table=lines)


def run_policy_list(service: Any, args: argparse.Namespace) -> int:
    topo, _active = _stored(service)
    docs = [_policy_doc(topo, p) for p in topo.policies.values()]
    rows = [(p.name + (" (default)" if p.name == topo.default_policy else ""), _limits(p),
             ", ".join("%s %.0f W" % kv for kv in d["node_watts"].items()))
            for p, d in zip(topo.policies.values(), docs)]
    lines = table(("NAME", "LIMITS", "NODE WATTS"), rows) if rows else ["no policies"]
    return finish(args, {"policies": docs}, True, "ok", "", table=lines)


def run_policy_show(service: Any, args: argparse.Namespace) -> int:
    topo, _active = _stored(service)
    policy = topo.policies.get(args.name)
    if policy is None:
        close = difflib.get_close_matches(args.name, list(topo.policies), 1)
        raise CliError("no policy %r in topology %s%s" % (
            args.name, topo.name, " (did you mean %r?)" % close[0] if close else
            " (known: %s)" % ", ".join(topo.policies)))
    doc = _policy_doc(topo, policy)
    lines = ["  limits: " + _limits(policy),
             "  node watts: " + ", ".join("%s %.0f W" % kv for kv in doc["node_watts"].items())]
    if policy.properties:
        lines.append("  properties: " + json.dumps(dict(policy.properties), sort_keys=True))
    return finish(args, doc, True, "ok", policy.name + (" (default)" if doc["default"] else ""),
                  table=lines)


def run_policy_create(service: Any, args: argparse.Namespace) -> int:
    from pbs_power.groups.policy import PolicyError, parse_policy
    source = args.source
    where = "the JSON given"
    if not source.lstrip().startswith("{"):
        where = source
        try:
            with open(source, "rb") as f:
                source = f.read().decode("utf-8-sig")
        except (OSError, UnicodeDecodeError) as exc:
            raise CliError("%s: cannot read the policy file (%s)"
                           % (where, getattr(exc, "strerror", None) or exc)) from None
    try:
        doc = json.loads(source)
    except ValueError as exc:
        raise CliError("%s: invalid JSON: %s" % (where, exc)) from None
    try:
        policy = parse_policy(doc)
    except PolicyError as exc:
        raise CliError("%s: %s" % (where, "; ".join(exc.problems))) from None
    status = service.create_policy(policy)
    return finish(args, {"status": dataclasses.asdict(status)}, status.ok, status.code,
                  status.diag_msg if status.ok else "", status.diag_msg)
