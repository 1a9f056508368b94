"""A SIMULATED batch cluster: FCFS + EASY backfill scheduler, host power, energy.

It plays the scheduler's part for the power manager: it shows vnode states
(``free``, ``job-exclusive``, ``sleep``, ``down``, ``offline``), estimates
each queued job's start time and hosts the way PBS's calendar does (hosts
asleep count as available now, so the power manager must wake them), and
applies the sleep/offline marks the manager hands back. Host power comes
from a power backend (the simulated fleet); without one every host is on.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from pbs_power.config.hook_config import NodePower
from pbs_power.states.model import PowerState, QueuedJob, Snapshot, Vnode
from .workload import SimJob

INF = float("inf")


@dataclass
class Energy:
    """Joules integrated per host state, and job-wait bookkeeping."""

    joules: float = 0.0
    by_state: Dict[str, float] = field(default_factory=dict)

    def add(self, state: str, watts: float, seconds: float) -> None:
        self.joules += watts * seconds
        self.by_state[state] = self.by_state.get(state, 0.0) + watts * seconds

    @property
    def kwh(self) -> float:
        return self.joules / 3.6e6


class SimCluster:
    """Hosts, queue and running jobs, stepped forward by the caller."""

    def __init__(self, hosts: Sequence[str], power: NodePower, backend=None,
                 start: float = 0.0):
        self.hosts = list(hosts)
        self.power = power
        self.backend = backend
        self.queue: List[SimJob] = []
        self.running: Dict[str, SimJob] = {}
        self.finished: List[SimJob] = []
        self.job_on: Dict[str, str] = {}
        self.sleep_marked: Set[str] = set()
        self.offline: Set[str] = set()
        self.comments: Dict[str, str] = {}
        self.last_used: Dict[str, float] = {h: start for h in self.hosts}
        self.usable_since: Dict[str, float] = {h: start for h in self.hosts}
        self.last_change: Dict[str, float] = {h: start for h in self.hosts}
        self.energy = Energy()
        self._label: Dict[str, str] = {h: "free" for h in self.hosts}
        self._power: Dict[str, PowerState] = {}

    # -- time ----------------------------------------------------------------
    def step(self, now: float, arrivals: Iterable[SimJob]) -> None:
        """Finish jobs, enqueue arrivals, refresh host power, start what fits."""
        for job in [j for j in self.running.values() if j.end <= now]:
            self._finish(job)
        self.queue.extend(arrivals)
        self._refresh_power(now)
        self._schedule(now)

    def account(self, seconds: float) -> None:
        """Integrate energy over ``seconds`` at the current host states."""
        p = self.power
        for host in self.hosts:
            state = self._energy_state(host)
            watts = {"busy": p.busy_watts, "idle": p.idle_watts, "asleep": p.sleep_watts,
                     "off": p.off_watts, "transitioning": p.idle_watts}[state]
            self.energy.add(state, watts, seconds)

    # -- what the power manager sees -------------------------------------------
    def snapshot(self, now: float) -> Snapshot:
        """Vnodes and queued jobs with estimates, as PBS would show them."""
        vnodes = tuple(Vnode(h, h, frozenset(self._states(h)), True, self.last_used[h],
                             self.last_change[h], (self.job_on[h],) if h in self.job_on else ())
                       for h in self.hosts)
        estimates = self.estimates(now)
        queued = tuple(QueuedJob(j.id, estimates[j.id][0], estimates[j.id][1])
                       for j in self.queue)
        return Snapshot(vnodes, queued_jobs=queued)

    def apply(self, marks, now: float) -> None:
        """Apply the manager's marks the way the scheduler would."""
        for mark in marks:
            if mark.sleep is True:
                self.sleep_marked.add(mark.host)
            elif mark.sleep is False:
                self.sleep_marked.discard(mark.host)
            if mark.offline:
                self.offline.add(mark.host)
            if mark.comment:
                self.comments[mark.host] = mark.comment
        self._refresh_power(now)

    def counts(self, going_down: Iterable[str] = ()) -> Dict[str, int]:
        """How many hosts are in each energy state, for the per-cycle line; hosts changing
        state count as "shutting down" when in ``going_down``, else as "booting"."""
        down = set(going_down)
        out: Dict[str, int] = {}
        for host in self.hosts:
            state = self._energy_state(host)
            if state == "transitioning":
                state = "shutting down" if host in down else "booting"
            out[state] = out.get(state, 0) + 1
        return out

    # -- scheduling ------------------------------------------------------------
    def estimates(self, now: float) -> Dict[str, Tuple[float, Tuple[str, ...]]]:
        """Estimated start and hosts per queued job, in queue order.

        Like PBS's calendar: a busy host frees up at its job's requested end,
        any other host (asleep included) is available now; offline never.
        """
        avail = {h: (INF if h in self.offline else
                     max(now, self.running[self.job_on[h]].start
                         + self.running[self.job_on[h]].walltime) if h in self.job_on
                     else now) for h in self.hosts}
        out = {}
        for job in self.queue:
            ranked = sorted(self.hosts, key=lambda h: (avail[h], h in self.sleep_marked, h))
            chosen = ranked[:job.nodes]
            start = max(avail[h] for h in chosen)
            for h in chosen:
                avail[h] = start + job.walltime
            out[job.id] = (start, tuple(chosen))
        return out

    def _schedule(self, now: float) -> None:
        """FCFS with EASY backfill on the hosts usable right now."""
        free = [h for h in self.hosts if self._usable(h)]
        shadow: Optional[float] = None
        reserved: Set[str] = set()
        for job in list(self.queue):
            if shadow is None and len(free) >= job.nodes:
                self._start(job, free[:job.nodes], now)
                free = free[job.nodes:]
                continue
            if shadow is None:
                start, hosts = self.estimates(now)[job.id]
                shadow, reserved = start, set(hosts)
                continue
            if len(free) < job.nodes:
                continue
            outside = [h for h in free if h not in reserved]
            if now + job.walltime <= shadow:
                hosts = free[:job.nodes]
            elif len(outside) >= job.nodes:
                hosts = outside[:job.nodes]
            else:
                continue
            self._start(job, hosts, now)
            free = [h for h in free if h not in hosts]

    def _start(self, job: SimJob, hosts: List[str], now: float) -> None:
        job.start, job.hosts = now, tuple(hosts)
        self.queue.remove(job)
        self.running[job.id] = job
        for h in hosts:
            self.job_on[h] = job.id
            self._set_label(h, now)

    def _finish(self, job: SimJob) -> None:
        del self.running[job.id]
        self.finished.append(job)
        for h in job.hosts:
            del self.job_on[h]
            self.last_used[h] = job.end
            self._set_label(h, job.end)

    # -- host state --------------------------------------------------------------
    def _refresh_power(self, now: float) -> None:
        if self.backend is None:
            return
        for host, hp in self.backend.status(self.hosts, now).items():
            self._power[host] = hp.state
        for host in self.hosts:
            self._set_label(host, now)

    def _powered(self, host: str) -> PowerState:
        return self._power.get(host, PowerState.ON)

    def _usable(self, host: str) -> bool:
        return (host not in self.job_on and host not in self.sleep_marked
                and host not in self.offline and self._powered(host) is PowerState.ON)

    def _states(self, host: str) -> List[str]:
        states = []
        if host in self.offline:
            states.append("offline")
        if host in self.sleep_marked:
            states.append("sleep")
        if host in self.job_on:
            states.append("job-exclusive")
        elif host not in self.sleep_marked and self._powered(host) is not PowerState.ON:
            states.append("down")
        return states or ["free"]

    def _set_label(self, host: str, now: float) -> None:
        label = ",".join(self._states(host))
        if label != self._label[host]:
            self._label[host] = label
            self.last_change[host] = now

    def _energy_state(self, host: str) -> str:
        if host in self.job_on:
            return "busy"
        return {PowerState.ON: "idle", PowerState.ASLEEP: "asleep", PowerState.OFF: "off"
                }.get(self._powered(host), "transitioning")
