"""Decide which hosts to power down and which to bring up. Pure: no I/O.

``plan(snapshot, config, now)`` looks at every vnode, every queued job's
estimated start and nodes, every reservation and the transitions already in
flight, and returns the transitions to start now, each with its reason, plus
those it held back and why. The rules, in the words an admin would use:

* A host goes down only when every vnode on it is free, empty, eligible
  (``poweroff_eligible``), not excluded, and idle (since its last use or
  last state change, whichever is later) longer than ``node_idle_limit``;
  longest idle first.
* A host is kept up when a queued job or a reservation needs it before it
  could shut down, rest ``min_node_down_delay`` and boot again.
* A sleeping host is brought up once waiting one more cycle would make it
  late for the first job or reservation that needs it (its boot time is the
  one measured from its past boots when known, else ``node_boot_time``,
  plus one cycle for the run that hands it back); earliest needed first.
* A host that went down less than ``min_node_down_delay`` ago stays down
  unless work needs it before it could otherwise be up.
* ``min_idle_nodes`` spare hosts are kept awake (waking some if needed).
* At most ``max_concurrent_nodes`` hosts are in transition at once, counting
  those still in flight from earlier cycles (a host its backend reports on
  and that only waits for the scheduler to see it holds no slot); with
  ``max_ramp_watts_per_minute`` the watts switched within any minute stay
  under that limit. Bringing hosts up goes before taking hosts down.
"""
from __future__ import annotations

import functools
import operator
import time as _time
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple, Union

from pbs_power.config.hook_config import MODE_DISABLED, MODE_RAMP_RATE, HookConfig
from .model import (FREE, SLEEP, Action, BootTimes, Deferral, Phase, Plan, Snapshot,
                    TransitionKind, Vnode, evolve, hosts_of)

_FREE_ONLY = frozenset({FREE})
_NO_TIMES: Mapping[str, float] = {}
_BY_TIME_AND_HOST = operator.itemgetter(0, 1)

#: Seconds over which ``max_ramp_watts_per_minute`` is measured.
RAMP_WINDOW = 60.0
#: Key in ``Snapshot.boot_times`` for the fleet-wide estimate.
FLEET = "*"


@dataclass(frozen=True)
class Need:
    """The earliest moment some work needs a host, and which work."""

    at: float
    what: str


class _Host:
    """A host's vnodes and the facts the rules ask about, computed once."""

    __slots__ = ("name", "vnodes", "asleep", "idle", "eligible", "in_reservation")

    def __init__(self, name: str, vnodes: Tuple[Vnode, ...]):
        self.name = name
        self.vnodes = vnodes
        if len(vnodes) == 1:                  # the common case, kept cheap
            v = vnodes[0]
            self.asleep = SLEEP in v.states
            self.idle = v.states == _FREE_ONLY and not v.jobs
            self.eligible = v.poweroff_eligible
            self.in_reservation = bool(v.resvs)
            return
        self.asleep = any(v.asleep for v in vnodes)
        self.idle = all(v.idle for v in vnodes)
        self.eligible = all(v.poweroff_eligible for v in vnodes)
        self.in_reservation = any(v.resvs for v in vnodes)

    def idle_since(self) -> Optional[float]:
        """The later of the last use and the last state change of any vnode.

        A host that just came back up (state change) counts as idle only
        from then, so a host woken for the warm pool is not sent straight
        back down because its last job ended hours ago.
        """
        if len(self.vnodes) == 1:             # the common case, kept cheap
            v = self.vnodes[0]
            used, changed = v.last_used_time, v.last_state_change_time
            if used is None:
                return changed
            return used if changed is None or used > changed else changed
        times = [max(t for t in (v.last_used_time, v.last_state_change_time)
                     if t is not None)
                 for v in self.vnodes
                 if v.last_used_time is not None or v.last_state_change_time is not None]
        if len(times) < len(self.vnodes):
            return None
        return max(times)


def longest_lead(cfg: HookConfig, boot_times: Mapping[str, Mapping[str, float]]) -> float:
    """The longest boot or wake any host may take: the config's and every measured one."""
    if isinstance(boot_times, BootTimes):
        measured = boot_times.longest
    else:
        measured = max((secs for per_kind in boot_times.values() for secs in per_kind.values()),
                       default=None)
    if measured is None:
        return max(cfg.node_boot_time, cfg.node_wake_time)
    return max(cfg.node_boot_time, cfg.node_wake_time, measured)


def up_kind(cfg: HookConfig) -> TransitionKind:
    """The transition that brings a host back in ``cfg``'s mode: wake in ramp-rate
    mode, power-on otherwise."""
    return TransitionKind.WAKE if cfg.mode == MODE_RAMP_RATE else TransitionKind.POWER_ON


def lead_time(snap: Snapshot, cfg: HookConfig, host: str, kind: TransitionKind) -> float:
    """Seconds ``host`` takes to complete ``kind``: measured, fleet, default."""
    for key in (host, FLEET):
        measured = snap.boot_times.get(key, {}).get(kind.value)
        if measured is not None:
            return float(measured)
    if kind is TransitionKind.POWER_ON:
        return float(cfg.node_boot_time)
    if kind is TransitionKind.WAKE:
        return float(cfg.node_wake_time)
    return 0.0


def needed_back(snapshot: Snapshot, config: HookConfig, now: float,
                hosts: List[str]) -> Dict[str, Need]:
    """Of ``hosts`` (drained, about to go down), those work needs before they
    could go down, rest and be back: the rule that keeps an idle host up,
    applied once more as the power command is about to be sent."""
    wanted = set(hosts)
    ctx = _Context(evolve(snapshot, vnodes=tuple(v for v in snapshot.vnodes
                                                  if v.host in wanted)),
                   config, now, watch_all=True)
    return {h: need for h, need in ctx.needs.items() if need.at <= ctx.back_by(h)}


def plan(snapshot: Snapshot, config: HookConfig, now: float) -> Plan:
    """Return the transitions to start at ``now``; see the module docstring."""
    ctx = _Context(snapshot, config, now)
    wakes, deferred = ctx.wanted_wakes()
    downs, notes = ctx.wanted_downs()
    actions, limited = ctx.apply_limits(wakes, downs)
    return Plan(actions=tuple(actions), deferred=tuple(deferred + limited + ctx.held),
                notes=tuple(notes))


class _Context:
    """One planning pass: the snapshot indexed for the rules above."""

    def __init__(self, snapshot: Snapshot, config: HookConfig, now: float,
                 watch_all: bool = False):
        self.snap = snapshot
        self.cfg = config
        self.now = now
        self.hosts = {h: _Host(h, vs) for h, vs in hosts_of(snapshot.vnodes).items()}
        self.in_flight = {} if watch_all else {t.host: t for t in snapshot.transitions}
        self.watch_all = watch_all
        self.up_kind = up_kind(config)
        self.down_kind = self.up_kind.reverse
        self._fallback: Dict[TransitionKind, float] = {}
        self.needs = self._needs()
        # A host its backend already reports on (BOOTING: waiting for the
        # scheduler to see it) no longer draws a power step; it holds no slot.
        self.busy = sum(1 for t in snapshot.transitions if t.phase is not Phase.BOOTING)
        self.held: List[Deferral] = []

    # -- estimates ---------------------------------------------------------
    def lead_time(self, host: str, kind: TransitionKind) -> float:
        """Seconds ``host`` takes to complete ``kind``: measured, fleet, default
        (`lead_time`, with the fleet-or-default answer worked out once per kind)."""
        measured = self.snap.boot_times.get(host, _NO_TIMES).get(kind)
        if measured is not None:
            return float(measured)
        fallback = self._fallback.get(kind)
        if fallback is None:
            fallback = self._fallback[kind] = lead_time(self.snap, self.cfg, FLEET, kind)
        return fallback

    def back_by(self, host: str) -> float:
        """When ``host`` could be up again if it went down now and rested."""
        return (self.now + self.cfg.cycle_interval + self.lead_time(host, self.down_kind)
                + self.cfg.min_node_down_delay + self.lead_time(host, self.up_kind))

    def _horizon(self) -> float:
        """Work starting later than this cannot affect this cycle's decisions."""
        longest = longest_lead(self.cfg, self.snap.boot_times)
        return (self.now + 2 * longest + self.cfg.min_node_down_delay
                + 2 * self.cfg.cycle_interval)

    def _needs(self) -> Dict[str, Need]:
        """Earliest need per host from queued jobs and reservations.

        Only hosts that could change state (asleep or idle, not in flight)
        are tracked, and work is visited in start order so each host's first
        need is its earliest: this keeps a 100,000-job queue cheap.
        """
        horizon = self._horizon()
        watched = {v.name: h.name for h in self.hosts.values()
                   if self.watch_all or ((h.asleep or h.idle) and h.name not in self.in_flight)
                   for v in h.vnodes}
        work = [(max(r.start, self.now), "reservation " + r.id, r.vnodes)
                for r in self.snap.reservations
                if r.end > self.now and r.start <= horizon]
        work += [(self.now if j.estimated_start is None else j.estimated_start,
                  "job " + j.id, j.vnodes)
                 for j in self.snap.queued_jobs
                 if j.vnodes and (j.estimated_start is None or j.estimated_start <= horizon)]
        work.sort(key=lambda item: item[0])
        needs: Dict[str, Need] = {}
        for at, what, vnodes in work:
            if not watched:
                break
            for vnode in watched.keys() & set(vnodes) if len(vnodes) > 8 else \
                    [x for x in vnodes if x in watched]:
                host = watched.pop(vnode, None)
                if host is not None and host not in needs:
                    needs[host] = Need(at, what)
        return needs

    # -- coming up ---------------------------------------------------------
    def wanted_wakes(self) -> Tuple[List[Action], List[Deferral]]:
        """Sleeping hosts to bring up, most urgent first."""
        wakes: List[Tuple[float, str, Action]] = []
        deferred: List[Deferral] = []
        up_kind, in_flight, needs = self.up_kind, self.in_flight, self.needs
        soon = self.now + self.cfg.cycle_interval
        for name, host in self.hosts.items():
            if not host.asleep or name in in_flight:
                continue
            need = needs.get(name)
            if need is None:
                continue
            lead = self.lead_time(name, up_kind)
            # A host that is up takes work only once a later cycle hands it
            # back (clears its sleep mark): up to one cycle after its boot.
            latest = need.at - lead - self.cfg.cycle_interval
            if latest > soon:
                continue                      # the next cycle is early enough
            held = self._resting(name, need.at, lead)
            if held:
                deferred.append(Deferral(name, up_kind, held))
                continue
            reason = "%s needs it at %s; boot takes ~%ds" % (
                need.what, _clock(need.at), lead)
            wakes.append((latest, name, Action(name, up_kind, reason, need_by=need.at)))
        wakes.sort(key=_BY_TIME_AND_HOST)
        return [a for _, _, a in wakes] + self._warm_pool_wakes(deferred), deferred

    def _resting(self, host: str, need_at: Optional[float], lead: float) -> str:
        """Why ``host`` must stay down for ``min_node_down_delay``, or ''."""
        since = self.snap.down_since.get(host)
        if since is None:
            return ""
        rest_end = since + self.cfg.min_node_down_delay
        if rest_end <= self.now:
            return ""
        if need_at is not None and rest_end + lead > need_at:
            return ""                         # waiting would make work late
        return "down since %s; min_node_down_delay keeps it down until %s" % (
            _clock(since), _clock(rest_end))

    def _spare_awake(self) -> List[str]:
        return [n for n, h in self.hosts.items()
                if h.idle and n not in self.in_flight and n not in self.needs]

    def _warm_pool_wakes(self, deferred: List[Deferral]) -> List[Action]:
        """Wake sleeping hosts while fewer than ``min_idle_nodes`` spares are up."""
        coming = sum(1 for t in self.snap.transitions if not t.kind.is_down)
        missing = self.cfg.min_idle_nodes - len(self._spare_awake()) - coming
        if missing <= 0:
            return []
        asleep = sorted((self.snap.down_since.get(n, 0.0), n)
                        for n, h in self.hosts.items()
                        if h.asleep and n not in self.in_flight and n not in self.needs)
        actions = []
        for _since, name in asleep:
            if len(actions) >= missing:
                break
            held = self._resting(name, None, 0.0)
            if held:
                deferred.append(Deferral(name, self.up_kind, "warm pool: " + held))
                continue
            actions.append(Action(name, self.up_kind,
                                  "warm pool below min_idle_nodes=%d"
                                  % self.cfg.min_idle_nodes))
        return actions

    # -- going down --------------------------------------------------------
    def wanted_downs(self) -> Tuple[List[Action], List[str]]:
        """Idle hosts to take down, longest idle first, warm pool kept."""
        notes: List[str] = []
        if self.cfg.mode == MODE_DISABLED:
            return [], ["power management disabled: no host is taken down"]
        candidates: List[Tuple[float, str, float]] = []
        for name, host in self.hosts.items():
            why = self._down_reason(name, host)
            if why is None:
                continue
            if isinstance(why, str):
                notes.append("%s: %s" % (name, why))
                continue
            candidates.append((self.now - why, name, why))
        candidates.sort()
        spare = set(self._spare_awake())
        may_go = len(spare) - self.cfg.min_idle_nodes
        downs: List[Action] = []
        kept = 0
        # Without a ramp limit no more downs than free slots can start: the
        # rest are held here, without building an Action for each.
        room = (None if self.cfg.max_ramp_watts_per_minute is not None
                else max(0, self.cfg.max_concurrent_nodes - self.busy))
        held = ("max_concurrent_nodes=%d hosts already in transition"
                % self.cfg.max_concurrent_nodes)
        for _since, name, idle_for in candidates:
            if name in spare:
                if may_go <= 0:
                    kept += 1
                    continue
                may_go -= 1
            if room is not None and len(downs) >= room:
                self.held.append(Deferral(name, self.down_kind, held))
                continue
            downs.append(Action(name, self.down_kind, "idle for %ds (node_idle_limit %ds)"
                                % (idle_for, self.cfg.node_idle_limit)))
        if kept:
            notes.append("keeping %d idle hosts up for min_idle_nodes=%d"
                         % (kept, self.cfg.min_idle_nodes))
        return downs, notes

    def _down_reason(self, name: str, host: _Host) -> Union[None, str, float]:
        """Seconds ``host`` has been idle if it may go down now; None if it may
        not; a string when that is worth a note."""
        if (name in self.in_flight or host.asleep or not host.idle
                or not host.eligible or name in self.cfg.excluded_hosts
                or host.in_reservation):
            return None
        since = host.idle_since()
        if since is None:
            return "no last_used_time or last_state_change_time; not powered down"
        idle_for = self.now - since
        if idle_for < self.cfg.node_idle_limit:
            return None
        need = self.needs.get(name)
        if need is not None and need.at <= self.back_by(name):
            return None
        return idle_for

    # -- limits ------------------------------------------------------------
    def apply_limits(self, wakes: List[Action], downs: List[Action]
                     ) -> Tuple[List[Action], List[Deferral]]:
        """Enforce ``max_concurrent_nodes`` and the ramp limit, ups first."""
        slots = self.cfg.max_concurrent_nodes - self.busy
        ramp = _RampBudget.start(self.snap, self.cfg, self.now)
        chosen: List[Action] = []
        held: List[Deferral] = []
        no_slot = ("max_concurrent_nodes=%d hosts already in transition"
                   % self.cfg.max_concurrent_nodes)
        no_ramp = ("max_ramp_watts_per_minute=%g would be exceeded"
                   % (self.cfg.max_ramp_watts_per_minute or 0))
        for action in wakes + downs:
            if slots <= 0:
                held.append(Deferral(action.host, action.kind, no_slot))
                continue
            watts = self._step_watts(action)
            if not ramp.take(watts):
                held.append(Deferral(action.host, action.kind, no_ramp))
                continue
            slots -= 1
            chosen.append(Action(action.host, action.kind, action.reason,
                                 action.need_by, watts))
        return chosen, held

    def _step_watts(self, action: Action) -> float:
        power = self.cfg.power_of(action.host)
        if power is None:
            return 0.0
        low = power.sleep_watts if action.kind in (
            TransitionKind.SLEEP, TransitionKind.WAKE) else power.off_watts
        step = power.idle_watts - low
        return -step if action.kind.is_down else step


@dataclass
class _RampBudget:
    """Watts still allowed up and down in the current one-minute window."""

    limit: Optional[float]
    up_used: float
    down_used: float

    @classmethod
    def start(cls, snap: Snapshot, cfg: HookConfig, now: float) -> "_RampBudget":
        recent = [s.watts for s in snap.recent_steps if s.time > now - RAMP_WINDOW]
        return cls(cfg.max_ramp_watts_per_minute,
                   sum(w for w in recent if w > 0), -sum(w for w in recent if w < 0))

    def take(self, watts: float) -> bool:
        """Reserve ``watts``; a lone step larger than the limit still goes alone."""
        if self.limit is None:
            return True
        used = self.up_used if watts >= 0 else self.down_used
        if used > 0 and used + abs(watts) > self.limit:
            return False
        if watts >= 0:
            self.up_used += watts
        else:
            self.down_used -= watts
        return True


def _clock(epoch: float) -> str:
    """Local time for a reason or a note."""
    return _local_clock(epoch, _time.tzname, _time.timezone)


@functools.lru_cache(maxsize=1024)
def _local_clock(epoch: float, _zone: Tuple[str, str], _offset: int) -> str:
    """`_clock`, remembered per time zone: a large cluster's many wakes for one
    job give the same moment again and again."""
    return _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(epoch))


__all__ = ["plan", "needed_back", "lead_time", "longest_lead", "up_kind", "Need"]
