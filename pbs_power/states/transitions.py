"""Move power transitions along from cycle to cycle. Pure: no I/O.

A transition started in one cycle is checked in the next ones against what
the scheduler and the power backend now report (see `model.Phase`):

* DRAINING: once the scheduler shows the host asleep and still empty, the
  backend command is sent; if a job landed on it meanwhile, the drain is
  cancelled and the host handed back.
* POWERING_DOWN: done when the backend reports the host off (or asleep).
* POWERING_UP: once the backend reports it on, the host is booting. Its
  sleep mark is kept while the scheduler shows it down (its MoM is not
  back): pbs_server clears sleep and down together when the MoM registers,
  and a scheduler with power_provisioning keeps counting a sleeping vnode
  (at now + 600 s) but never a down one, so a job waiting for the host
  keeps its reservation. A host not shown down (its MoM never went away)
  has its mark cleared at once.
* BOOTING: done when the scheduler sees every vnode usable; the time from
  the command to that moment is the host's measured boot time. A mark
  still there once the host is no longer down is cleared.

A transition that overruns ``boot_timeout`` (up) or ``shutdown_timeout``
(down) fails: the host is taken offline with a comment, not retried.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from pbs_power.config.hook_config import HookConfig
from .model import (FREE, SLEEP, Phase, PowerState, Snapshot, Transition,
                    TransitionKind, Vnode, evolve, hosts_of)

#: Cycles a drain may wait for the scheduler to show the sleep mark.
DRAIN_PATIENCE_CYCLES = 3


@dataclass(frozen=True)
class Outcome:
    """What to do about one transition this cycle."""

    transition: Transition
    reason: str = ""
    seconds: Optional[float] = None     # measured duration, for completions


@dataclass(frozen=True)
class Reconciliation:
    """Every in-flight transition sorted by what must happen to it now."""

    send_down: Tuple[Outcome, ...] = ()      # drained: send the backend command
    remark_sleep: Tuple[Outcome, ...] = ()   # sleep mark not visible yet: set again
    cancelled: Tuple[Outcome, ...] = ()      # drain aborted: clear the sleep mark
    came_up: Tuple[Outcome, ...] = ()        # backend says on: clear the sleep mark
    booting: Tuple[Outcome, ...] = ()        # backend says on, MoM not back: keep the mark
    mark_lost: Tuple[Outcome, ...] = ()      # coming up, mark gone, MoM not back: set again
    completed: Tuple[Outcome, ...] = ()      # finished; seconds = measured duration
    timed_out: Tuple[Outcome, ...] = ()      # failed: take the host offline
    vanished: Tuple[Outcome, ...] = ()       # host no longer known to the scheduler
    waiting: Tuple[Outcome, ...] = ()        # nothing to do yet


def reconcile(snapshot: Snapshot, statuses: Mapping[str, Any],
              config: HookConfig, now: float) -> Reconciliation:
    """Sort ``snapshot.transitions`` by what must happen to each at ``now``.

    ``statuses`` maps host to an object with ``state`` (`PowerState`) and
    ``since`` (epoch or None), as the power backend reports it.
    """
    flying = {t.host for t in snapshot.transitions}
    hosts = hosts_of([v for v in snapshot.vnodes if v.host in flying]) if flying else {}
    buckets = {name: [] for name in Reconciliation.__dataclass_fields__}
    for t in snapshot.transitions:
        vnodes = hosts.get(t.host)
        if vnodes is None:
            buckets["vanished"].append(Outcome(t, "host is no longer in the scheduler"))
            continue
        bucket, outcome = _step(t, vnodes, statuses.get(t.host), config, now)
        buckets[bucket].append(outcome)
    return Reconciliation(**{k: tuple(v) for k, v in buckets.items()})


def _step(t: Transition, vnodes: Sequence[Vnode], status, config: HookConfig,
          now: float) -> Tuple[str, Outcome]:
    if t.phase is Phase.DRAINING:
        return _draining(t, vnodes, config, now)
    if t.phase is Phase.POWERING_DOWN:
        return _powering_down(t, status, config, now)
    if t.phase is Phase.POWERING_UP:
        return _powering_up(t, vnodes, status, config, now)
    return _booting(t, vnodes, config, now)


def _draining(t, vnodes, config, now):
    jobs = sorted({j for v in vnodes for j in v.jobs})
    busy = [v.name for v in vnodes if v.states - {FREE, SLEEP}]
    if jobs or busy:
        what = ("job %s landed on it" % ", ".join(jobs)) if jobs else \
            ("vnode %s is %s" % (busy[0], ",".join(sorted(
                next(v for v in vnodes if v.name == busy[0]).states))))
        return "cancelled", Outcome(t, "drain cancelled: " + what)
    if all(v.asleep for v in vnodes):
        return "send_down", Outcome(t, "drained: scheduler shows it asleep and empty")
    if now - t.phase_since > DRAIN_PATIENCE_CYCLES * config.cycle_interval:
        return "cancelled", Outcome(t, "drain cancelled: the scheduler never "
                                       "showed the sleep mark")
    return "remark_sleep", Outcome(t, "sleep mark not visible yet")


def _powering_down(t, status, config, now):
    target = PowerState.ASLEEP if t.kind is TransitionKind.SLEEP else PowerState.OFF
    if status is not None and status.state is target:
        done_at = status.since if status.since is not None else now
        return "completed", Outcome(t, "backend reports it %s" % target.value,
                                    max(0.0, done_at - t.phase_since))
    if now - t.phase_since > config.shutdown_timeout:
        return "timed_out", Outcome(t, "did not reach %s within shutdown_timeout=%ds%s"
                                    % (target.value, config.shutdown_timeout,
                                       _reported(status)))
    return "waiting", Outcome(t)


def _mark_lost(t, vnodes) -> Optional[Tuple[str, Outcome]]:
    """A host coming up whose sleep mark is gone while its MoM is not back
    (a server restart shows it state-unknown,down): marked again, so that a
    scheduler with power_provisioning keeps counting it for its job."""
    if all(not v.asleep and v.mom_gone and not v.jobs for v in vnodes):
        return "mark_lost", Outcome(t, "sleep mark lost while it comes up (e.g. a server "
                                       "restart): marked sleep again")
    return None


def _powering_up(t, vnodes, status, config, now):
    if status is not None and status.state is PowerState.ON:
        if any(v.asleep and v.mom_gone for v in vnodes):
            return "booting", Outcome(t, "backend reports it on; sleep mark kept "
                                         "until its MoM is back")
        return "came_up", Outcome(t, "backend reports it on")
    if now - t.started > config.boot_timeout:
        return "timed_out", Outcome(t, "did not power on within boot_timeout=%ds%s"
                                    % (config.boot_timeout, _reported(status)))
    return _mark_lost(t, vnodes) or ("waiting", Outcome(t))


def _booting(t, vnodes, config, now):
    if all(v.usable for v in vnodes):
        changes = [v.last_state_change_time for v in vnodes
                   if v.last_state_change_time is not None
                   and v.last_state_change_time >= t.started]
        done_at = max(changes) if changes else now
        return "completed", Outcome(t, "scheduler sees it usable",
                                    max(0.0, done_at - t.started))
    if now - t.started > config.boot_timeout:
        states = ",".join(sorted({s for v in vnodes for s in v.states}))
        return "timed_out", Outcome(t, "powered on but the scheduler still shows "
                                       "it %s after boot_timeout=%ds"
                                    % (states, config.boot_timeout))
    if any(v.asleep for v in vnodes) and not any(v.mom_gone for v in vnodes):
        return "came_up", Outcome(t, "sleep mark still visible; clearing it")
    return _mark_lost(t, vnodes) or ("waiting", Outcome(t))


def _reported(status) -> str:
    if status is None:
        return ""
    return " (backend reports %s)" % status.state.value


def apply_marks(snapshot: Snapshot, sleep: List[str], wake: List[str],
                offline: List[str]) -> Snapshot:
    """The snapshot as it will look once the cycle's marks are applied."""
    if not (sleep or wake or offline):
        return snapshot
    sleep_s, wake_s, off_s = set(sleep), set(wake), set(offline)
    vnodes = []
    for v in snapshot.vnodes:
        if v.states and v.host not in sleep_s and v.host not in wake_s and v.host not in off_s:
            vnodes.append(v)        # unchanged: the many hosts no mark touches
            continue
        states = set(v.states)
        if v.host in wake_s or v.host in off_s:
            states.discard(SLEEP)
        if v.host in sleep_s:
            states.discard(FREE)
            states.add(SLEEP)
        if v.host in off_s:
            states.add("offline")
        if not states:
            states.add(FREE)
        vnodes.append(Vnode(v.name, v.host, frozenset(states), v.poweroff_eligible,
                            v.last_used_time, v.last_state_change_time, v.jobs, v.resvs))
    return evolve(snapshot, vnodes=tuple(vnodes))
