"""``pbs-power resource-group`` and ``pbs-power gpu-policy``: a job's power policy by hand.

What a prolog runs at job start (create, add, activate) and an epilog at job
end (delete), plus update, status and list for admins. The common options,
service opening and exit codes come from `pbs_power.cli.topology`: 0 ok,
1 the operation failed (diagnostic on stderr), 2 bad usage or input.
"""
from __future__ import annotations

import argparse
import json
import math
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from pbs_power.cli.topology import (
    FLOAT_RE, INT_RE, CliError, common_options, finish, fold, key_value, leaf, node_table,
    service_command, table,
)

_HOSTS_DONE = re.compile(r"\d+ host\(s\) done")


# -- argument types ------------------------------------------------------------
def group_name(text: str) -> str:
    from pbs_power.groups.service import GROUP_NAME
    if not GROUP_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            "resource group name must be 1-128 characters of letters, digits and "
            "_ . : @ + -, got %r" % text)
    return text


def hostlist(text: str) -> List[str]:
    """A hostlist expression (``gpu[001-016]``) as host names; node groups refused."""
    from pbs_power.config.checks import parse_hostlist
    problems: List[Any] = []
    nodes = parse_hostlist(text, ("the hostlist",), problems)
    if problems:
        raise argparse.ArgumentTypeError("; ".join(str(p) for p in problems))
    if nodes is None or len(nodes) == 0:
        raise argparse.ArgumentTypeError("the hostlist %r names no host" % text)
    return list(nodes)


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be an integer >= 0, got %r" % text) from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be an integer >= 0, got %r" % text)
    return value


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be an integer >= 1, got %r" % text)
    return value


def percent(text: str) -> float:
    value = finite_float(text)
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError("must be a percentage from 0 to 100, got %r" % text)
    return value


def seconds(text: str) -> float:
    value = finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be seconds >= 0, got %r" % text)
    return value


def positive_seconds(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be seconds > 0, got %r" % text)
    return value


def finite_float(text: str) -> float:
    """An argparse type: a finite number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number: %r" % text) from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError("must be a finite number, got %r" % text)
    return value


def int_list(text: str) -> List[int]:
    """``1,2,3`` -> [1, 2, 3] (32-bit integers)."""
    out = []
    for item in text.split(","):
        if not INT_RE.fullmatch(item.strip()) or not -2 ** 31 <= int(item) < 2 ** 31:
            raise argparse.ArgumentTypeError("expected comma-separated integers, got %r" % text)
        out.append(int(item))
    return out


def prop(text: str) -> Tuple[str, Any]:
    """``K=V``: V as JSON when it parses (5, true, "x"), else the plain string.

    JSON's own rules hold: NaN and Infinity (which Python's reader accepts) are refused,
    since ``list --json`` must print JSON; so is a value nested too deeply to read.
    """
    key, value = key_value(text, "K=V (e.g. priority=5)")
    constants: List[str] = []

    def note(word: str) -> float:
        constants.append(word)
        return 0.0
    try:
        parsed = json.loads(value, parse_constant=note)
    except RecursionError:
        raise argparse.ArgumentTypeError("--property %s: the value is nested too deeply"
                                         % key) from None
    except ValueError:
        return key, value
    if constants:
        raise argparse.ArgumentTypeError("--property %s: %s is not a JSON number"
                                         % (key, constants[0]))
    return key, parsed


def entity_policy(text: str) -> Tuple[List[str], str]:
    """``ENTITY=POLICY`` (ENTITY may be a hostlist); an empty POLICY clears."""
    key, value = key_value(text, "ENTITY=POLICY (e.g. gpu001=Node-Low)")
    return hostlist(key), value.strip()


def gpu_node(text: str) -> Tuple[List[str], Any]:
    """``NAME=W0,W1,...``: watts, ``P%`` or ``-`` (remove) per GPU, in GPU order."""
    from pbs_power.groups.gpu_policy import parse_gpu_policies
    from pbs_power.groups.policy import PolicyError
    key, value = key_value(text, "NAME=W0,W1,... (e.g. gpu001=300,300,80%,-)")
    items = []
    for gpu_id, raw in enumerate(value.split(",")):
        raw = raw.strip()
        if raw == "-":
            limit = None
        elif raw.endswith("%") and FLOAT_RE.fullmatch(raw[:-1].strip()):
            limit = {"percentage": float(raw[:-1])}
        elif FLOAT_RE.fullmatch(raw):
            limit = {"watts": float(raw)}
        else:
            raise argparse.ArgumentTypeError(
                "GPU %d of %s: %r is not watts (300), a percentage (80%%) or - (remove its "
                "policy)" % (gpu_id, key, raw))
        items.append({"gpu_id": gpu_id, "power_limit": limit})
    try:
        return hostlist(key), parse_gpu_policies(items, key)
    except PolicyError as exc:
        raise argparse.ArgumentTypeError("; ".join(exc.problems)) from None


# -- resource-group ------------------------------------------------------------
def add_parser(subparsers: Any) -> None:
    """Register ``resource-group`` (its lifecycle commands) and ``gpu-policy``."""
    parser = subparsers.add_parser(
        "resource-group", help="create, fill, activate, update and delete resource groups",
        description="A resource group is a job's nodes and power policy: create it, add its "
                    "nodes, activate it within the power budget, update it, delete it "
                    "(topology policies return). Exit 0 ok, 1 the operation failed, 2 bad "
                    "input (unknown group, policy or host included).")
    actions = parser.add_subparsers(dest="rg_command", metavar="ACTION", required=True)

    p = leaf(actions, "create", "create an empty, inactive group",
             "Create an empty, inactive resource group.", run_create)
    p.add_argument("name", metavar="NAME", type=group_name, help="group name, e.g. rg_$JOBID")
    p.add_argument("--external-id", type=int, metavar="N", help="scheduler job id")
    p.add_argument("--policy", metavar="P", help="group policy (default: topology policies)")
    p.add_argument("--workload-profile-ids", type=int_list, default=[], metavar="1,2")
    prs = p.add_mutually_exclusive_group()
    prs.add_argument("--prs-enabled", dest="prs_enabled", action="store_const", const=True,
                     default=None, help="enable power reservation steering")
    prs.add_argument("--no-prs", dest="prs_enabled", action="store_const", const=False,
                     help="disable power reservation steering")
    p.add_argument("--no-dpm", dest="dpm_enable", action="store_false",
                   help="no dynamic power management: strict activation, never lowered")
    p.add_argument("--property", dest="properties", type=prop, action="append", default=[],
                   metavar="K=V", help="group property (V as JSON if it parses), repeatable")

    p = leaf(actions, "add", "add nodes to an inactive group",
             "Add nodes (a hostlist expression) to an inactive resource group.", run_add)
    p.add_argument("name", metavar="NAME", type=group_name)
    p.add_argument("--entities", type=hostlist, required=True, metavar="HOSTLIST")
    p.add_argument("--policy", metavar="P", help="entity-level policy for these nodes")

    p = leaf(actions, "remove", "remove nodes from an inactive group",
             "Remove nodes (a hostlist expression) from an inactive resource group.", run_remove)
    p.add_argument("name", metavar="NAME", type=group_name)
    p.add_argument("--entities", type=hostlist, required=True, metavar="HOSTLIST")

    p = leaf(actions, "activate", "apply the group's policies within the power budget",
             "Activate a resource group: apply its policies within the power budget, "
             "falling back to lower policies unless --strict. Synchronous unless an "
             "--async-* option is given.", run_activate)
    p.add_argument("name", metavar="NAME", type=group_name)
    p.add_argument("--strict", action="store_true", help="fail rather than fall back")
    p.add_argument("--allow-reprovision", action="store_true",
                   help="lower other groups' policies to make room (never a group of "
                        "higher priority; they are raised back as room frees up)")
    _async_partial_options(p)

    p = leaf(actions, "deactivate", "return the group's nodes to topology policies",
             "Deactivate a resource group: its nodes return to topology policies.",
             run_deactivate)
    p.add_argument("name", metavar="NAME", type=group_name)

    p = leaf(actions, "update", "change (or remove) the group policy",
             "Change the group policy (--no-policy: topology policies); applied at once "
             "when the group is active.", run_update)
    p.add_argument("name", metavar="NAME", type=group_name)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--policy", metavar="P")
    which.add_argument("--no-policy", action="store_true", help="remove the group policy")
    p.add_argument("--strict", action="store_true", help="fail rather than fall back")
    p.add_argument("--workload-profile-ids", type=int_list, default=None, metavar="1,2")
    _async_partial_options(p)

    p = leaf(actions, "update-resources", "set or clear entity-level policies",
             "Set (--set ENTITY=POLICY, or --entities HOSTLIST --policy P) or clear "
             "(--clear HOSTLIST) entity-level policies; ENTITY may be a hostlist.",
             run_update_resources)
    p.add_argument("name", metavar="NAME", type=group_name)
    p.add_argument("--set", dest="sets", type=entity_policy, action="append", default=[],
                   metavar="ENTITY=POLICY")
    p.add_argument("--clear", type=hostlist, action="append", default=[], metavar="HOSTLIST")
    p.add_argument("--entities", type=hostlist, metavar="HOSTLIST")
    p.add_argument("--policy", metavar="P", help="policy for --entities")
    _async_partial_options(p, sync=False)

    p = leaf(actions, "delete", "deactivate if active, then delete",
             "Delete a resource group (deactivated first if active).", run_delete)
    p.add_argument("name", metavar="NAME", type=group_name)

    from pbs_power.cli.collect import add_gc
    add_gc(actions)

    p = leaf(actions, "list", "list resource groups",
             "List resource groups: name, external id, status, policy, nodes, applied "
             "policies.", run_list)
    p.add_argument("--active-only", action="store_true")

    p = leaf(actions, "status", "progress of an asynchronous operation",
             "Progress of an asynchronous operation, by id or by group (and type). Once "
             "read as completed it is forgotten. Exit 0 in progress or completed ok, 1 "
             "completed and failed, 2 no such operation.", run_status)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("operation_id", metavar="OPERATION_ID", nargs="?")
    which.add_argument("--group", type=group_name, metavar="NAME")
    p.add_argument("--type", dest="op_type", choices=("activate", "update"),
                   help="with --group: which operation (default activate)")

    parser = subparsers.add_parser(
        "gpu-policy", help="set per-GPU power limits on nodes of active groups",
        description="Set per-GPU power limits (UpdateGPUPolicies) on nodes of active "
                    "resource groups; every GPU of a node must be named, in GPU order. Each "
                    "value is watts (300), a percentage of the GPU maximum (80%) or - "
                    "(remove that GPU's policy). The node limit rises to fit when the "
                    "power budget allows.", parents=[common_options()])
    parser.add_argument("--node", dest="nodes", type=gpu_node, action="append", required=True,
                        metavar="NAME=W0,W1,...",
                        help="a node (or hostlist) and its GPUs' limits, repeatable")
    parser.set_defaults(func=service_command(run_gpu_policy), prog_name=parser.prog)


def _async_partial_options(p: argparse.ArgumentParser, sync: bool = True) -> None:
    how = p.add_mutually_exclusive_group()
    if sync:
        how.add_argument("--sync", action="store_true",
                         help="synchronous (the default; for symmetry with dpsctl)")
    how.add_argument("--async-n-hosts", type=non_negative_int, metavar="N",
                     help="return once N hosts are done; the rest goes on in the background")
    how.add_argument("--async-percent-hosts", type=percent, metavar="P",
                     help="return once P%% of the hosts are done")
    how.add_argument("--async-wait", type=seconds, metavar="SECONDS",
                     help="return after SECONDS (0: at once)")
    least = p.add_mutually_exclusive_group()
    least.add_argument("--at-least-n-hosts", type=positive_int, metavar="N",
                       help="succeed when at least N hosts activate")
    least.add_argument("--at-least-percent-hosts", type=percent, metavar="P",
                       help="succeed when at least P%% of the hosts activate")
    p.add_argument("--host-timeout", type=positive_seconds, metavar="SECONDS",
                   help="a host not done by then counts as failed")


def _strategies(args: argparse.Namespace) -> Tuple[Any, Any]:
    from pbs_power.groups.types import AsyncStrategy, PartialActivation
    strategy = None
    if args.async_n_hosts is not None:
        strategy = AsyncStrategy(n_hosts=args.async_n_hosts)
    elif args.async_percent_hosts is not None:
        strategy = AsyncStrategy(frac_hosts=args.async_percent_hosts / 100.0)
    elif args.async_wait is not None:
        strategy = AsyncStrategy(wait_seconds=args.async_wait)
    partial = None
    if (args.at_least_n_hosts, args.at_least_percent_hosts, args.host_timeout) != (None,) * 3:
        frac = args.at_least_percent_hosts
        partial = PartialActivation(args.at_least_n_hosts,
                                    None if frac is None else frac / 100.0, args.host_timeout)
    return strategy, partial


def _simple(args: argparse.Namespace, response: Any, ok_line: str) -> int:
    status = response.status
    return finish(args, response, status.ok, status.code, ok_line if status.ok else "",
                  "%s: %s" % (args.name, status.diag_msg),
                  node_table(response.node_statuses, args.verbose))


def run_create(service: Any, args: argparse.Namespace) -> int:
    props: Dict[str, Any] = {}
    for key, value in args.properties:
        if key in props:
            raise CliError("--property %s is given twice" % key)
        props[key] = value
    r = service.create(args.name, args.external_id, args.policy, args.workload_profile_ids,
                       args.prs_enabled, args.dpm_enable, props)
    return _simple(args, r, "%s: created (inactive%s)" % (
        args.name, ", policy " + args.policy if args.policy else ""))


def run_add(service: Any, args: argparse.Namespace) -> int:
    r = service.add_resources(args.name, args.entities, args.policy)
    return _simple(args, r, "%s: added %s" % (args.name, fold(args.entities)))


def run_remove(service: Any, args: argparse.Namespace) -> int:
    r = service.remove_resources(args.name, args.entities)
    return _simple(args, r, "%s: removed %s" % (args.name, fold(args.entities)))


def applied(service: Any, name: str) -> str:
    """What the group's nodes run now: 'policy Node-Med applied' or a breakdown."""
    counts: Dict[str, int] = {}
    failed = 0
    members = service.store.members(name)
    for m in members:
        if m.state == "failed":
            failed += 1
        elif m.state == "active":
            label = m.applied_policy or "uncapped"
            counts[label] = counts.get(label, 0) + 1
    if len(counts) == 1 and not failed:
        return "policy %s applied" % next(iter(counts))
    parts = ["%s on %d host(s)" % kv for kv in counts.items()]
    if failed:
        parts.append("failed on %d host(s)" % failed)
    return "applied: " + (", ".join(parts) or "nothing")


def _outcome(service: Any, args: argparse.Namespace, response: Any, verb: str,
             state: str) -> int:
    """``NAME: STATE (applied policies; diagnostic)``, or the async operation id."""
    status = response.status
    line = ""
    if status.ok and response.operation_id:
        line = ("%s: %s continues in the background (operation %s); follow it with: "
                "pbs-power resource-group status %s" % (args.name, verb, response.operation_id,
                                                      response.operation_id))
    elif status.ok:
        group = service.store.group(args.name)
        detail = [applied(service, args.name) if group and group.status == "active" else ""]
        if status.diag_msg and not _HOSTS_DONE.fullmatch(status.diag_msg):
            detail.append(status.diag_msg)
        detail = [d for d in detail if d]
        line = "%s: %s%s" % (args.name, state, " (%s)" % "; ".join(detail) if detail else "")
    return finish(args, response, status.ok, status.code, line,
                  "%s: %s failed: %s" % (args.name, verb, status.diag_msg),
                  node_table(response.node_statuses, args.verbose))


def run_activate(service: Any, args: argparse.Namespace) -> int:
    strategy, partial = _strategies(args)
    r = service.activate(args.name, args.strict, strategy, partial, args.allow_reprovision)
    return _outcome(service, args, r, "activation", "active")


def run_deactivate(service: Any, args: argparse.Namespace) -> int:
    r = service.deactivate(args.name)
    return _simple(args, r, "%s: inactive (topology policies restored)" % args.name)


def run_update(service: Any, args: argparse.Namespace) -> int:
    strategy, partial = _strategies(args)
    policy = None if args.no_policy else args.policy
    r = service.update(args.name, policy, args.strict, strategy, partial,
                       args.workload_profile_ids)
    state = "policy %s" % ("set to " + policy if policy else "removed (topology policies)")
    if r.status.ok and not r.operation_id and r.status.diag_msg.startswith("policy of "):
        r.status.diag_msg = ""   # inactive group: nothing applied, nothing more to say
    return _outcome(service, args, r, "update", state)


def run_update_resources(service: Any, args: argparse.Namespace) -> int:
    updates: Dict[str, Optional[str]] = {}

    def put(names: Sequence[str], policy: Optional[str]) -> None:
        for n in names:
            if n in updates and updates[n] != policy:
                raise CliError("%s is given two policies (%s and %s)"
                               % (n, updates[n] or "none", policy or "none"))
            updates[n] = policy
    if (args.entities is None) != (args.policy is None):
        raise CliError("--entities and --policy go together")
    for names, policy in args.sets:
        put(names, policy or None)
    for names in args.clear:
        put(names, None)
    if args.entities is not None:
        put(args.entities, args.policy)
    if not updates:
        raise CliError("name what to change: --set ENTITY=POLICY, --clear HOSTLIST or "
                       "--entities HOSTLIST --policy P")
    strategy, partial = _strategies(args)
    r = service.update_resources(args.name, updates, strategy, partial)
    return _outcome(service, args, r, "update", "entity policies updated")


def run_delete(service: Any, args: argparse.Namespace) -> int:
    r = service.delete(args.name)
    note = r.status.diag_msg.partition(" deleted")[2]
    return _simple(args, r, "%s: deleted%s" % (args.name, note))


def run_list(service: Any, args: argparse.Namespace) -> int:
    answer = service.list(args.active_only or None)
    rows = []
    for g in answer.resource_groups:
        counts: Dict[str, int] = {}
        for rp in g.resource_policies:
            label = ("failed" if rp.state == "failed" else
                     (rp.applied_policy_name or "uncapped") if rp.state == "active" else None)
            if label:
                counts[label] = counts.get(label, 0) + 1
        rows.append((g.group_name, "-" if g.external_id is None else str(g.external_id),
                     g.activation_status, g.policy_name or "-", fold(g.resource_names),
                     ",".join("%s:%d" % kv for kv in counts.items()) or "-"))
    lines = (table(("NAME", "EXTERNAL ID", "STATUS", "POLICY", "NODES", "APPLIED"), rows)
             if rows else ["no resource groups" + (" active" if args.active_only else "")])
    return finish(args, answer, answer.ok, answer.code, "", answer.diag_msg, lines)


def run_status(service: Any, args: argparse.Namespace) -> int:
    if args.op_type and not args.group:
        raise CliError("--type goes with --group")
    answer = service.async_status(args.operation_id, args.group, args.op_type)
    op = answer.operation
    if op is None:
        return finish(args, answer, False, answer.code or "not_found", "",
                      "%s: %s" % (args.operation_id or args.group, answer.diag_msg))
    done = "%d of %d host(s) done (%d ok, %d failed)" % (
        op.n_success + op.n_failed, op.n_hosts, op.n_success, op.n_failed)
    result = op.result or {}
    status = result.get("status") or {"ok": True, "code": "ok", "diag_msg": ""}
    ok = status.get("ok", False) or not op.completed
    diag = status.get("diag_msg") or ""
    line = "operation %s (%s): %s, %s%s" % (
        op.operation_id, op.operation_type, "completed" if op.completed else "in progress",
        done, "; " + diag if ok and diag and not _HOSTS_DONE.fullmatch(diag) else "")
    table_rows = node_table(result.get("node_statuses") or {}, args.verbose)
    return finish(args, answer, ok, status.get("code", "failed"), line,
                  "operation %s (%s) failed: %s" % (op.operation_id, op.operation_type, diag),
                  table_rows)



def run_gpu_policy(service: Any, args: argparse.Namespace) -> int:
    wanted: Dict[str, Any] = {}
    for names, policies in args.nodes:
        for name in names:
            if name in wanted:
                raise CliError("--node %s is given twice" % name)
            wanted[name] = policies
    answer = service.update_gpu_policies(wanted)
    by_node: Dict[str, List[Any]] = {}
    for r in answer.results:
        by_node.setdefault(r.resource_name, []).append(r)
    lines, errors = [], []
    for node, results in by_node.items():
        if all(r.ok for r in results):
            notes = ["GPU %d: %s" % (r.gpu_id, r.diag_msg) for r in results if r.diag_msg]
            lines.append("%s: GPU limits set: %s%s" % (node, ", ".join(
                "%d=%.0f W" % (r.gpu_id, r.set_limit) for r in results),
                " (%s)" % "; ".join(notes) if notes else ""))
        else:
            diags = list(dict.fromkeys(r.diag_msg for r in results if not r.ok))
            errors.append("%s: %s" % (node, "; ".join(diags)) if not all(
                d.startswith(node + ":") for d in diags) else "; ".join(diags))
    return finish(args, answer, answer.ok, answer.code, "", "\n".join(errors), lines)
