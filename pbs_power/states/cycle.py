"""One periodic pass: reconcile transitions, plan, command the backend.

This is the imperative shell around `transitions.reconcile` and
`planner.plan`. A scheduler adapter hands in a `Snapshot` of what the
scheduler shows and gets back `Mark`s to apply to its vnodes (set or clear
the sleep mark, take a host offline, comment). Everything that must outlive
the process goes to the `Store`; overlapping runs are serialised by the
store's cycle lock (a run that finds it taken does nothing).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from pbs_power.config.hook_config import HookConfig
from . import journal
from .model import (BootTimes, Phase, Plan, PowerState, RampStep, Snapshot, Transition,
                    TransitionKind, evolve, hosts_of)
from .planner import FLEET, RAMP_WINDOW, needed_back, plan, up_kind
from .transitions import Outcome, apply_marks, reconcile

#: ``log(level, message)``; levels: debug, info, warning, error.
LogFn = Callable[[str, str], None]

COMMENT_PREFIX = "pbs_power: "
#: Hosts per kind of hold-back that get a debug line of their own each cycle.
DEBUG_HOSTS_PER_GROUP = 20
#: Every transition kind with its value (asked for every run).
_KIND_VALUES = tuple((kind, kind.value) for kind in TransitionKind)


@dataclass(frozen=True)
class Mark:
    """A change to every vnode of ``host`` for the scheduler adapter to apply."""

    host: str
    sleep: Optional[bool] = None        # True: set the sleep mark; False: clear it
    offline: bool = False
    comment: Optional[str] = None


@dataclass
class CycleReport:
    """What one cycle did, for the adapter (marks) and for people (log)."""

    ran: bool = True
    plan: Plan = field(default_factory=Plan)
    marks: List[Mark] = field(default_factory=list)
    started: List[Transition] = field(default_factory=list)
    completed: List[Outcome] = field(default_factory=list)
    failed: List[Outcome] = field(default_factory=list)

    def marked(self, sleep: bool) -> List[str]:
        return [m.host for m in self.marks if m.sleep is sleep]


class Cycle:
    """Runs periodic passes for one cluster with one config, store and backend."""

    def __init__(self, config: HookConfig, store, backend, log: LogFn,
                 check_down_hosts: bool = False, journaled: bool = True):
        """``check_down_hosts``: the scheduler may forget sleep marks (PBS does on a
        restart): every run, hosts we put down but shown awake are checked.
        ``journaled``: also write the `journal` (events, cycle rows, tallies) that
        ``pbs-power status`` and the exporter read; the simulator turns it off."""
        self.config = config
        self.check_down_hosts = check_down_hosts
        self.store = store
        self.backend = backend
        self.log = log
        self.journaled = journaled
        self._boot_cache: Optional[Dict[str, Dict[str, float]]] = None

    def run(self, snapshot: Snapshot, now: float, query_failed: bool = False,
            boot_times: Optional[BootTimes] = None) -> CycleReport:
        """Run one pass over ``snapshot`` at ``now``; see the module docstring.

        ``query_failed``: the adapter could not read queued jobs, so this pass
        only moves transitions along; the journal records that outcome.
        ``boot_times``: the store's, when the adapter has just read them (its
        forecast orders sleeping hosts by them), so the pass need not again.
        """
        clock = time.monotonic()
        with self.store.cycle_lock() as acquired:
            if not acquired:
                self.log("warning", "previous cycle still running; this run does nothing")
                self._note(journal.record_cycle, journal.CycleRecord(
                    now, time.monotonic() - clock, "skipped"))
                return CycleReport(ran=False)
            report = self._run_locked(snapshot, now, boot_times)
            self._note(journal.record_pass, snapshot.vnodes, report.plan.deferred, now,
                       time.monotonic() - clock, "query_failed" if query_failed else "ran")
            return report

    def _run_locked(self, snapshot: Snapshot, now: float,
                    boot_times: Optional[BootTimes] = None) -> CycleReport:
        report = CycleReport()
        self._boot_cache = boot_times
        for warning in self.config.warnings:
            self.log("debug", "config: " + warning)
        snapshot = evolve(snapshot, transitions=self.store.transitions())
        self._forget_recovered(snapshot)
        self._advance(snapshot, now, report)
        if self.check_down_hosts:
            self._check_down_hosts(snapshot, now, report)
        snapshot = self._with_history(snapshot, report, now)
        report.plan = plan(snapshot, self.config, now)
        for note in report.plan.notes:
            self.log("debug", note)
        self._start(report.plan, now, report)
        self._log_deferrals(report.plan)
        return report

    def _note(self, record: Callable, *args) -> None:
        """Write to the journal (when this cycle keeps one)."""
        if self.journaled:
            record(self.store, *args)

    def _forget_recovered(self, snapshot: Snapshot) -> None:
        """Hosts an admin brought back from offline are no longer failed."""
        failed = self.store.failed()
        if not failed:
            return
        offline = {v.host for v in snapshot.vnodes if "offline" in v.states}
        known = {v.host for v in snapshot.vnodes}
        for host in failed:
            if host in known and host not in offline:
                self.store.clear_failed(host)
                self.log("info", "%s: back in service (offline cleared)" % host)

    def _check_down_hosts(self, snapshot: Snapshot, now: float, report: CycleReport) -> None:
        """Hosts we put down that the scheduler no longer shows asleep: ask the backend.

        A pbs_server restart clears every sleep mark while the hosts stay off.
        Still off (or asleep): mark them again before the scheduler uses them.
        On, or running jobs: they are back (someone powered them on); forget
        that they were down.
        """
        down = self.store.down_since()
        if not down:
            return
        flying = {t.host for t in self.store.transitions()} | set(self.store.failed())
        marked = {m.host for m in report.marks}
        lost = {}
        for host, vnodes in hosts_of([v for v in snapshot.vnodes if v.host in down]).items():
            if host in flying or host in marked or all(v.asleep for v in vnodes):
                continue
            if any("offline" in v.states for v in vnodes):
                continue
            lost[host] = vnodes
        if not lost:
            return
        statuses = self.backend.status(sorted(lost), now)
        for host in sorted(lost):
            status = statuses.get(host)
            state = status.state if status is not None else PowerState.UNKNOWN
            jobs = sorted({j for v in lost[host] for j in v.jobs})
            if state in (PowerState.OFF, PowerState.ASLEEP) and not jobs:
                report.marks.append(Mark(host, sleep=True))
                self.log("info", "%s: backend reports it %s but the scheduler shows it "
                                 "awake (sleep mark lost, e.g. a server restart): marked "
                                 "sleep again" % (host, state.value))
            elif state is PowerState.ON or jobs:
                self.store.set_down_since(host, None)
                self.log("warning" if jobs and state is not PowerState.ON else "info",
                         "%s: %s; no longer counted as down" % (host, (
                             "the scheduler runs %s on it (backend reports %s)"
                             % (",".join(jobs), state.value)) if jobs else
                             "backend reports it on (powered on outside pbs_power)"))
            else:
                self.log("debug", "%s: down since %s but the scheduler shows it awake "
                                  "and the backend reports %s; left as it is"
                         % (host, _clock(down[host]), state.value))

    # -- transitions already in flight -------------------------------------
    def _advance(self, snapshot: Snapshot, now: float, report: CycleReport) -> None:
        in_flight = [t.host for t in snapshot.transitions
                     if t.phase in (Phase.POWERING_DOWN, Phase.POWERING_UP)]
        statuses = self.backend.status(in_flight, now) if in_flight else {}
        rec = reconcile(snapshot, statuses, self.config, now)
        for o in rec.remark_sleep:
            report.marks.append(Mark(o.transition.host, sleep=True))
        for o in rec.mark_lost:
            report.marks.append(Mark(o.transition.host, sleep=True))
            self.log("info", "%s: %s: %s" % (o.transition.host, o.transition.kind.value,
                                             o.reason))
        for o in rec.cancelled:
            self._finish(o, report, now, "info", "%s: %s; handed back")
            report.marks.append(Mark(o.transition.host, sleep=False))
        for o in rec.vanished:
            self._finish(o, report, now, "warning", "%s: forgetting transition: %s")
        for o in rec.came_up:
            report.marks.append(Mark(o.transition.host, sleep=False))
        for o in rec.came_up + rec.booting:       # booting: the mark stays until its MoM is back
            self.store.put_transition(o.transition.advanced(Phase.BOOTING, now))
            self.log("info", "%s: %s: %s" % (o.transition.host, o.transition.kind.value,
                                             o.reason))
        for o in rec.completed:
            self._complete(o, now, report)
        for o in rec.timed_out:
            self._fail(o, now, report)
        self._send_down(self._still_unneeded(snapshot, rec.send_down, now, report),
                        now, report)

    def _still_unneeded(self, snapshot: Snapshot, ready: Sequence[Outcome], now: float,
                        report: CycleReport) -> List[Outcome]:
        """Drained hosts that may still go down; those work now needs are handed back.

        A job may have been queued for a host since its drain began; powering
        it off would only make that job wait for a boot.
        """
        if not ready:
            return []
        snap = evolve(snapshot, boot_times=self._boot_times())
        needed = needed_back(snap, self.config, now, [o.transition.host for o in ready])
        for o in ready:
            need = needed.get(o.transition.host)
            if need is not None:
                self.store.drop_transition(o.transition.host)
                self._note(journal.ended, o.transition,
                           "drain cancelled: %s needs it" % need.what, now)
                report.marks.append(Mark(o.transition.host, sleep=False))
                self.log("info", "%s: drain cancelled: %s needs it at %s; handed back"
                         % (o.transition.host, need.what, _clock(need.at)))
        return [o for o in ready if o.transition.host not in needed]

    def _finish(self, o: Outcome, report: CycleReport, now: float, level: str,
                fmt: str) -> None:
        self.store.drop_transition(o.transition.host)
        self._note(journal.ended, o.transition, o.reason, now)
        self.log(level, fmt % (o.transition.host, o.reason))

    def _complete(self, o: Outcome, now: float, report: CycleReport) -> None:
        t = o.transition
        self.store.drop_transition(t.host)
        self.store.record_duration(t.host, t.kind, t.started, o.seconds)
        self._boot_cache = None
        self.store.set_down_since(t.host, now if t.kind.is_down else None)
        self._note(journal.completed, t, o.seconds, now,
                   journal.saved_watts(self.config.power_of(t.host), t.kind)
                   if t.kind.is_down else 0.0)
        report.completed.append(o)
        self.log("info", "%s: %s done in %ds (%s)" % (t.host, t.kind.value,
                                                      o.seconds, o.reason))

    def _fail(self, o: Outcome, now: float, report: CycleReport) -> None:
        t = o.transition
        self.store.drop_transition(t.host)
        self.store.mark_failed(t.host, o.reason, now)
        self._note(journal.failed, t, o.reason, now)
        comment = "%s%s failed: %s; offline until an admin clears it" % (
            COMMENT_PREFIX, t.kind.value, o.reason)
        report.marks.append(Mark(t.host, sleep=False, offline=True, comment=comment))
        report.failed.append(o)
        self.log("error", "%s: %s failed: %s; marked offline, not retried"
                 % (t.host, t.kind.value, o.reason))

    def _send_down(self, ready: Sequence[Outcome], now: float,
                   report: CycleReport) -> None:
        by_kind: Dict[TransitionKind, List[Outcome]] = {}
        for o in ready:
            by_kind.setdefault(o.transition.kind, []).append(o)
        for kind, outcomes in by_kind.items():
            results = self.backend.request(kind, [o.transition.host for o in outcomes], now)
            for o in outcomes:
                t, result = o.transition, results.get(o.transition.host)
                if result is not None and result.ok:
                    self.store.put_transition(t.advanced(Phase.POWERING_DOWN, now))
                    self._record_step(t.host, kind, now)
                    self.log("info", "%s: %s sent (%s)" % (t.host, kind.value, t.reason))
                    continue
                diag = result.diag if result is not None else "no answer from backend"
                self.store.drop_transition(t.host)
                self._note(journal.ended, t, "backend refused: %s" % diag, now)
                report.marks.append(Mark(t.host, sleep=False))
                self.log("error", "%s: %s failed at the backend: %s; host handed back"
                         % (t.host, kind.value, diag))

    # -- new transitions ---------------------------------------------------
    def _boot_times(self) -> BootTimes:
        """The store's boot times, read once per run (until a duration is recorded)."""
        if self._boot_cache is None:
            self._boot_cache = boot_times(self.store)
        return self._boot_cache

    def _with_history(self, snapshot: Snapshot, report: CycleReport,
                      now: float) -> Snapshot:
        offline = [m.host for m in report.marks if m.offline]
        snapshot = apply_marks(snapshot, report.marked(True), report.marked(False), offline)
        return evolve(snapshot, transitions=self.store.transitions(),
                       boot_times=self._boot_times(), down_since=self.store.down_since(),
                       recent_steps=self.store.recent_steps(now - RAMP_WINDOW))

    def _start(self, the_plan: Plan, now: float, report: CycleReport) -> None:
        ups = [a for a in the_plan.actions if not a.kind.is_down]
        with self.store.transaction() if self.journaled else contextlib.nullcontext():
            # one commit for every drain (no backend call in this loop)
            for a in the_plan.actions:
                if a.kind.is_down:
                    t = Transition(a.host, a.kind, Phase.DRAINING, now, now, a.reason)
                    self.store.put_transition(t)
                    self._note(journal.started, t)
                    report.marks.append(Mark(a.host, sleep=True))
                    report.started.append(t)
                    self.log("info", "%s: draining for %s: %s"
                             % (a.host, a.kind.value, a.reason))
        powered = self.backend.status([a.host for a in ups], now) if ups else {}
        by_kind: Dict[TransitionKind, List] = {}
        for a in ups:
            by_kind.setdefault(_up_kind(a.kind, powered.get(a.host)), []).append(a)
        for kind, actions in by_kind.items():
            results = self.backend.request(kind, [a.host for a in actions], now)
            for a in actions:
                result = results.get(a.host)
                ok = result is not None and result.ok
                reason = a.reason if ok else "%s; backend refused: %s" % (
                    a.reason, result.diag if result is not None else "no answer")
                t = Transition(a.host, kind, Phase.POWERING_UP, now, now, reason)
                # A refused command still counts as in flight, so boot_timeout
                # ends it (host offline) instead of retrying it every cycle.
                self.store.put_transition(t)
                self._note(journal.started, t, a.need_by)
                report.started.append(t)
                if ok:
                    self._record_step(a.host, kind, now)
                    self.log("info", "%s: %s sent: %s" % (a.host, kind.value, a.reason))
                else:
                    self.log("error", "%s: %s" % (a.host, reason))

    def _record_step(self, host: str, kind: TransitionKind, now: float) -> None:
        power = self.config.power_of(host)
        if power is None:
            return
        low = power.off_watts if kind in (TransitionKind.POWER_ON,
                                          TransitionKind.POWER_OFF) else power.sleep_watts
        step = power.idle_watts - low
        self.store.record_steps([RampStep(now, host, -step if kind.is_down else step)])

    def _log_deferrals(self, the_plan: Plan) -> None:
        for level, message in deferral_lines(the_plan):
            self.log(level, message)


def boot_times(store) -> BootTimes:
    """The store's measured durations per host and kind, the fleet's under FLEET.

    A store that keeps them between records (``boot_times()``: the simulator's
    in-memory one, asked every cycle of a replay) answers itself.
    """
    own = getattr(store, "boot_times", None)
    if own is not None:
        return own()
    times = BootTimes(store.duration_estimates())
    times[FLEET] = fleet_estimates(store)
    times.longest = max((secs for per in times.values() for secs in per.values()),
                        default=None)
    return times


class MeasuredBoots(dict):
    """Host -> measured seconds to come back up; ``typical``: their median (low),
    worked out when first asked for and again after a value changes."""

    _typical: Optional[float] = None

    def __setitem__(self, host: str, seconds: float) -> None:
        super().__setitem__(host, seconds)
        self._typical = None

    @property
    def typical(self) -> Optional[float]:
        if self._typical is None and self:
            values = sorted(self.values())
            self._typical = values[(len(values) - 1) // 2]
        return self._typical


def up_seconds(times: Mapping[str, Mapping[str, float]], config: HookConfig) -> MeasuredBoots:
    """Each measured host's seconds to come back up in ``config``'s mode (power-on,
    or wake in ramp-rate mode); the fleet's estimate left out."""
    kind = up_kind(config).value
    return MeasuredBoots((host, per[kind]) for host, per in times.items()
                         if host != FLEET and kind in per)


def fleet_estimates(store) -> Dict[str, float]:
    """The store's fleet-wide estimate per transition kind, for kinds that have one."""
    fleet = {value: store.fleet_duration_estimate(kind) for kind, value in _KIND_VALUES}
    return {k: v for k, v in fleet.items() if v is not None}


def deferral_lines(the_plan: Plan) -> List[Tuple[str, str]]:
    """(level, message): one info line per kind of hold-back; the first hosts
    of each at debug.

    On a large idle cluster thousands of hosts may wait for a slot: a line
    for each, every cycle, would flood the log.
    """
    lines: List[Tuple[str, str]] = []
    groups: Dict[str, List] = {}
    keys: Dict[tuple, str] = {}
    for d in the_plan.deferred:
        key = keys.get((d.kind, d.reason))
        if key is None:
            key = keys[(d.kind, d.reason)] = "%s held back: %s" % (
                d.kind.value, d.reason.split(";")[0])
        group = groups.setdefault(key, [])
        if len(group) < DEBUG_HOSTS_PER_GROUP:
            lines.append(("debug", "%s: %s held back: %s" % (d.host, d.kind.value, d.reason)))
        group.append(d.host)
    for key, hosts in sorted(groups.items()):
        shown = ",".join(hosts[:8]) + (",..." if len(hosts) > 8 else "")
        lines.append(("info", "%d host(s) %s (%s)" % (len(hosts), key, shown)))
    return lines


def _clock(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def _up_kind(planned: TransitionKind, power) -> TransitionKind:
    """Wake a sleeping host, power on a host that is off, whatever the mode says.

    The mode may have changed since the host went down.
    """
    if power is not None and power.state is PowerState.OFF:
        return TransitionKind.POWER_ON
    if power is not None and power.state is PowerState.ASLEEP:
        return TransitionKind.WAKE
    return planned
