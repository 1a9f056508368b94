"""The exported metrics: an `Observed` record turned into Prometheus metric families.

Names follow Prometheus' conventions: the ``pbs_power_`` prefix, base units
(seconds, joules, watts), ``_total`` on counters (prometheus_client adds it).
Label values come from fixed sets (transition kinds, power states, outcomes,
reasons) or from the operator's own names (power domains, device backends),
never from error text. `METRICS` lists every family, for the docs and for the
test that holds the dashboard to what is exported.
"""
from __future__ import annotations

from typing import Dict, Iterator, List, Sequence, Tuple

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, Metric)

from pbs_power.groups import records
from pbs_power.states import journal, tally
from pbs_power.states.model import TransitionKind
from .readers import Observed

PREFIX = "pbs_power_"
KINDS = tuple(k.value for k in TransitionKind)
UP_KINDS = tuple(k.value for k in TransitionKind if not k.is_down)
DOWN_KINDS = tuple(k.value for k in TransitionKind if k.is_down)
GROUP_STATUSES = ("inactive", "activating", "active", "deactivating")

#: name (without prefix or _total) -> (type, help); the exported set.
METRICS: Dict[str, Tuple[str, str]] = {
    "nodes": ("gauge", "Hosts by power state at the last cycle that ran"),
    "nodes_eligible": ("gauge", "Hosts by whether they may be powered down, at the last cycle"),
    "transitions_started": ("counter", "Power transitions started, by kind"),
    "transitions_completed": ("counter", "Power transitions completed, by kind"),
    "transitions_failed": ("counter", "Power transitions failed (host taken offline), by kind"),
    "boot_duration_seconds": ("histogram", "Time from the power-on/wake command until the "
                                           "scheduler saw the host usable"),
    "shutdown_duration_seconds": ("histogram", "Time from the power-off/sleep command until "
                                               "the backend reported the host down"),
    "cycles": ("counter", "Periodic cycles by outcome (ran, skipped, query_failed)"),
    "cycle_duration_seconds": ("histogram", "Duration of the periodic cycles that ran"),
    "last_cycle_timestamp_seconds": ("gauge", "When the last recorded cycle started (epoch)"),
    "hosts_held_back": ("gauge", "Transitions the last cycle that ran wanted but held back, by reason"),
    "energy_saved_joules": ("counter", "Estimated energy saved by hosts asleep or off "
                                       "(idle watts minus low watts, times the time down)"),
    "power_saved_watts": ("gauge", "Estimated watts saved now by hosts asleep or off"),
    "jobs_waited_for_wake": ("counter", "Wakes for a job that came after the job's "
                                        "estimated start"),
    "wake_wait_seconds": ("histogram", "For wakes asked for by a job: how long after the "
                                       "job's estimated start the host was usable (0: in time)"),
    "resource_groups": ("gauge", "Resource groups by status"),
    "domain_reserved_watts": ("gauge", "Watts the members of a power domain may draw under "
                                       "their applied policies"),
    "domain_budget_watts": ("gauge", "Power budget of a power domain"),
    "group_activations": ("counter", "Resource group activations by outcome"),
    "group_activation_duration_seconds": ("histogram", "Time from an activation request "
                                                       "until the group was active"),
    "device_request_errors": ("counter", "Failed device requests by backend and reason"),
    "store_up": ("gauge", "1 when the exporter could read the store, 0 when not"),
}


def families(seen: Observed) -> List[Metric]:
    """Every metric family for ``seen``, in METRICS order."""
    out = list(_node_families(seen)) + list(_transition_families(seen))
    out += list(_cycle_families(seen)) + list(_energy_families(seen))
    out += list(_group_families(seen))
    up = _family("store_up", ["store"])
    up.add_metric(["states"], 1.0 if seen.states_up else 0.0)
    up.add_metric(["groups"], 1.0 if seen.groups_up else 0.0)
    out.append(up)
    return out


def exported_names() -> List[str]:
    """Every series name a scrape can show (histograms' _bucket/_sum/_count, _total)."""
    names = []
    for name, (kind, _help) in METRICS.items():
        full = PREFIX + name
        if kind == "counter":
            names.append(full + "_total")
        elif kind == "histogram":
            names += [full + "_bucket", full + "_sum", full + "_count"]
        else:
            names.append(full)
    return names


def _family(name: str, labels: Sequence[str] = ()) -> Metric:
    kind, doc = METRICS[name]
    cls = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily,
           "histogram": HistogramMetricFamily}[kind]
    return cls(PREFIX + name, doc, labels=list(labels))


def _node_families(seen: Observed) -> Iterator[Metric]:
    cycle = seen.census
    nodes = _family("nodes", ["state"])
    for state in journal.NODE_STATES:
        nodes.add_metric([state], float(cycle.states.get(state, 0)) if cycle else 0.0)
    yield nodes
    eligible = _family("nodes_eligible", ["eligible"])
    hosts = cycle.hosts if cycle else 0
    yes = cycle.eligible if cycle else 0
    eligible.add_metric(["true"], float(yes))
    eligible.add_metric(["false"], float(hosts - yes))
    yield eligible


def _by_kind(name: str, rows, kinds: Sequence[str]) -> Metric:
    found = {dict(labels).get("kind"): v for labels, v in tally.counter(rows, name).items()}
    family = _family(name, ["kind"])
    for kind in kinds:
        family.add_metric([kind], found.get(kind, 0.0))
    return family


def _histogram(name: str, rows, stored: str, buckets: Sequence[float],
               labels: Sequence[str] = (), always: Sequence[Sequence[str]] = ((),)) -> Metric:
    """A histogram family; the label sets in ``always`` show (as zeros) before any count."""
    family = _family(name, labels)
    found = {tuple(tally.label_values(h.labels, labels)): h
             for h in tally.histogram(rows, stored, buckets)}
    empty = [(tally.le_text(b), 0.0) for b in list(buckets) + [tally.INF]]
    for values in [tuple(a) for a in always] + sorted(set(found) - {tuple(a) for a in always}):
        h = found.get(values)
        family.add_metric(list(values), list(h.buckets) if h else empty, h.sum if h else 0.0)
    return family


def _transition_families(seen: Observed) -> Iterator[Metric]:
    rows = seen.tallies
    yield _by_kind("transitions_started", rows, KINDS)
    yield _by_kind("transitions_completed", rows, KINDS)
    yield _by_kind("transitions_failed", rows, KINDS)
    yield _histogram("boot_duration_seconds", rows, "boot_seconds", journal.BOOT_BUCKETS,
                     ["kind"], [[k] for k in UP_KINDS])
    yield _histogram("shutdown_duration_seconds", rows, "shutdown_seconds",
                     journal.SHUTDOWN_BUCKETS, ["kind"], [[k] for k in DOWN_KINDS])


def _cycle_families(seen: Observed) -> Iterator[Metric]:
    rows = seen.tallies
    found = {dict(labels).get("outcome"): v for labels, v in tally.counter(rows, "cycles").items()}
    cycles = _family("cycles", ["outcome"])
    for outcome in journal.CYCLE_OUTCOMES:
        cycles.add_metric([outcome], found.get(outcome, 0.0))
    yield cycles
    yield _histogram("cycle_duration_seconds", rows, "cycle_seconds", journal.CYCLE_BUCKETS)
    if seen.last_cycle is not None:
        last = _family("last_cycle_timestamp_seconds")
        last.add_metric([], seen.last_cycle.started)
        yield last
    held = _family("hosts_held_back", ["reason"])
    counts = seen.census.held if seen.census else {}
    for reason in journal.HOLD_REASONS:
        held.add_metric([reason], float(counts.get(reason, 0)))
    yield held


def _energy_families(seen: Observed) -> Iterator[Metric]:
    energy = _family("energy_saved_joules")
    energy.add_metric([], seen.energy_saved_joules)
    yield energy
    watts = _family("power_saved_watts")
    watts.add_metric([], seen.watts_saved)
    yield watts
    waited = _family("jobs_waited_for_wake")
    waited.add_metric([], sum(tally.counter(seen.tallies, "jobs_waited_for_wake").values()))
    yield waited
    yield _histogram("wake_wait_seconds", seen.tallies, "wake_wait_seconds",
                     journal.WAIT_BUCKETS)


def _group_families(seen: Observed) -> Iterator[Metric]:
    groups = _family("resource_groups", ["status"])
    for status in GROUP_STATUSES + tuple(sorted(set(seen.groups_by_status) -
                                                set(GROUP_STATUSES))):
        groups.add_metric([status], float(seen.groups_by_status.get(status, 0)))
    yield groups
    reserved = _family("domain_reserved_watts", ["domain"])
    budget = _family("domain_budget_watts", ["domain"])
    for d in seen.domains:
        reserved.add_metric([d.name], d.reserved_watts)
        if d.budget_watts is not None:
            budget.add_metric([d.name], d.budget_watts)
    yield reserved
    yield budget
    rows = seen.group_tallies
    found = {dict(k).get("outcome"): v for k, v in
             tally.counter(rows, "group_activations").items()}
    activations = _family("group_activations", ["outcome"])
    for outcome in ("active", "failed"):
        activations.add_metric([outcome], found.get(outcome, 0.0))
    yield activations
    yield _histogram("group_activation_duration_seconds", rows, "group_activation_seconds",
                     records.ACTIVATION_BUCKETS)
    errors = _family("device_request_errors", ["backend", "reason"])
    for labels, value in sorted(tally.counter(rows, "device_request_errors").items()):
        errors.add_metric(tally.label_values(labels, ("backend", "reason")), value)
    yield errors
