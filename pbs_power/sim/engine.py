"""A discrete-event SIMULATED batch cluster: FCFS + EASY backfilling, node power, energy.

The engine replays jobs (submit time, nodes, run time, requested walltime)
on ``len(nodes)`` nodes and asks a power `Manager` (see ``managers.py``)
what to do with idle nodes. Two scheduler flavours, as in the real systems:

* ``pbs``: jobs start only on nodes that are up and not marked asleep. A
  node marked asleep, or down while it boots, is neither free nor busy to
  the scheduler: a job that needs one gets no start estimate and holds
  nothing, so later jobs pass it, unless the manager's server has
  power_provisioning (``Manager.calendar_sleep``): then such nodes come up
  in the calendar at now + 600 s and the top job holds the free nodes
  against jobs that would run past that. The power hook fits queued jobs
  onto free plus sleeping nodes itself (``pbs_power.pbs.forecast``).
* ``slurm``: a job may be allocated powered-down nodes; allocating one
  resumes it, and the job starts once all its nodes are up.

EASY backfilling uses requested walltimes: the first job that cannot start
gets a reservation (shadow time and spare nodes from the walltimes of the
running jobs), later jobs start only if they do not delay it. Energy is
integrated exactly between events from the node counts per state.
"""
from __future__ import annotations

import bisect
import heapq
import random
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

from .nodes import (BOOTING, BUSY, DOWN, HELD, IDLE, SHUTTING, Node, NodeModel,
                    watts_by_state)
from .power_events import BOOT_DONE, CYCLE, DOWN_DONE, END, TIMER, PowerEvents
from .scheduling import INF, Scheduling
from .workload import SimJob

#: A node moving only between these states was up before and after.
_JOB_STATES = frozenset({IDLE, BUSY})


class Engine(Scheduling, PowerEvents):
    """One replay of ``jobs`` on ``nodes`` under one power manager."""

    def __init__(self, jobs: Sequence[SimJob], nodes: List[Node], model: NodeModel,
                 manager, sample_every: float = 300.0, seed: int = 1):
        self.nodes = nodes
        self.model = model
        self.manager = manager
        self.slurm = manager.scheduler == "slurm"
        self.sleep_mode = bool(getattr(manager, "sleep_mode", False))
        self.watts = watts_by_state(model, self.sleep_mode)
        self.count = [0] * 6
        self.count[IDLE] = len(nodes)
        self.failed = 0
        self.unstarted = 0
        self._jobs(jobs)
        start = self.submit[0] if self.submit else 0.0
        for node in nodes:          # every manager: nodes up and idle since the first job
            node.idle_since = node.changed = start
        #: Slurm: nodes powering down and when SuspendTimeout frees them.
        self.shutting_until: Dict[int, float] = {}
        self.queue: List[int] = []
        self.ends: List[Tuple[float, int]] = []      # (expected end, job), sorted
        self._pool: List[int] = list(range(len(nodes)))   # heap of usable idle nodes
        self._in_pool = [True] * len(nodes)
        self.pool_size = len(nodes)
        #: Node indexes per state (`state_index`): made when first asked for, then kept
        #: as states change, so a manager visits the few nodes that matter, not every
        #: node; managers that never ask pay nothing.
        self._in_state: Optional[List[Set[int]]] = None
        self.failed_nodes: Set[int] = set()
        #: The calendar's jobless nodes, each list in index order: free, coming up,
        #: asleep; made when first asked for (`_calendar_pool`), then kept up to date.
        self._calendar_lists: Optional[Tuple[List[Node], List[Node], List[Node]]] = None
        self._calendar_of: List[int] = []
        self._calendar_moved: Set[int] = set()
        self._down: List[int] = []                    # heap of powered-down nodes (slurm)
        self._in_down = [False] * len(nodes)
        self.down_free = 0
        self._events: List[tuple] = []
        self._seq = 0
        #: Periodic runs: a generation (a superseded run event is dropped) and,
        #: while the manager sleeps, (version, next run time, period).
        self._cycle_gen = 0
        self._asleep: Optional[Tuple[int, float, float]] = None
        self.now = 0.0
        self.energy_j = 0.0
        #: The end of the energy interval (see energy_kwh) and the joules up to it.
        self.cut = INF
        self.energy_cut_j: Optional[float] = None
        self._last_t: Optional[float] = None
        self.samples: List[Tuple[float, float, int, int, int]] = []
        self._sample_every = float(sample_every)
        self._next_sample = 0.0
        self.ramp_up: Dict[int, float] = {}
        self.ramp_down: Dict[int, float] = {}
        self._rng = random.Random(seed)
        self._dirty = True
        self._new: List[int] = []
        self._shadow: Tuple[float, int] = (INF, 0)
        #: PBS with power_provisioning: seconds from now at which the calendar
        #: has a sleeping vnode up (None: never), and whether the top job's
        #: reservation waits for that moving time.
        self.calendar_sleep: Optional[float] = manager.calendar_sleep
        self._shadow_moves = False
        self._top_width = 0
        self.done = 0
        #: Bumped by every change a power manager could see (node states,
        #: marks, failures, arrivals); lets a manager know nothing moved.
        self.version = 0
        #: Bumped only by node power changes, marks and failures: what stays
        #: the same while jobs merely start and end on nodes that are up.
        self.power_version = 0
        self._estimated: Optional[tuple] = None     # ((version, t, limit), estimates)

    def _jobs(self, jobs: Sequence[SimJob]) -> None:
        order = sorted(range(len(jobs)), key=lambda i: jobs[i].submit)
        self.job_ids = [jobs[i].id for i in order]
        self.submit = [float(jobs[i].submit) for i in order]
        self.width = [min(int(jobs[i].nodes), len(self.nodes)) for i in order]
        self.runtime = [float(jobs[i].runtime) for i in order]
        self.wall = [max(float(jobs[i].walltime), float(jobs[i].runtime)) for i in order]
        self.start: List[Optional[float]] = [None] * len(order)
        self.alloc: List[Tuple[int, ...]] = [()] * len(order)
        self.power_since: List[Optional[float]] = [None] * len(order)
        self.power_wait = [0.0] * len(order)
        self._waiting: Dict[int, int] = {}          # job -> nodes still booting (slurm)
        self._provisional: Dict[int, Tuple[float, int]] = {}   # its guessed end

    # -- the clock -----------------------------------------------------------
    def run(self, progress: Optional[Callable[[float], None]] = None,
            give_up: float = INF) -> "Engine":
        """Replay every job; returns self with energy, samples and job starts filled.

        ``progress(fraction_done)`` is called now and then when given. A
        manager that keeps jobs from ever starting (a livelock of power-offs
        and wakes) is given up on once the clock passes ``give_up``: the jobs
        not started by then count as starting then (``unstarted`` says how many).
        """
        self.manager.attach(self)
        submit, total, ptr = self.submit, len(self.submit), 0
        events = self._events
        loops = 0
        while self.done < total:
            loops += 1
            if progress is not None and not loops & 0x3FFF:
                progress(self.done / total)
            t_ev = events[0][0] if events else INF
            t_sub = submit[ptr] if ptr < total else INF
            t = t_ev if t_ev < t_sub else t_sub
            if t > give_up:
                self._advance(give_up)
                self.unstarted = sum(1 for s in self.start if s is None)
                self.start = [give_up if s is None else s for s in self.start]
                break
            if t == INF:
                raise RuntimeError("simulation stalled with %d jobs unfinished "
                                   "(%d queued)" % (total - self.done, len(self.queue)))
            self._advance(t)
            while ptr < total and submit[ptr] <= t:
                self.queue.append(ptr)
                self.version += 1
                self._new.append(ptr)
                ptr += 1
            cycles = []
            while events and events[0][0] <= t:
                _, _, kind, arg = heapq.heappop(events)
                if kind == END:
                    self._end_job(arg, t)
                elif kind == BOOT_DONE:
                    self._boot_done(arg, t)
                elif kind == DOWN_DONE:
                    self._down_done(arg, t)
                else:
                    cycles.append((kind, arg))
            self._schedule(t)
            if self._asleep is not None and self._asleep[0] != self.version:
                self._wake(t, cycles)
            for kind, arg in cycles:
                if kind == CYCLE:
                    self._cycle(t, arg)
                else:
                    self.manager.on_timer(t, arg)
            if cycles:
                self._schedule(t)
            if self._asleep is not None and self._asleep[0] != self.version:
                self._wake(t, None)
        return self

    def _cycle(self, t: float, arg: Tuple[float, int]) -> None:
        """A periodic run; then the next one, or, while the manager says its runs
        would do nothing (`Manager.idle_until`), the first after that, unless
        the cluster changes first (`_wake`)."""
        period, gen = arg
        if gen != self._cycle_gen:
            return                              # superseded by `_wake`
        self._asleep = None
        self.manager.on_cycle(t)
        at = t + period
        until = self.manager.idle_until(t)
        if until > at:
            self._asleep = (self.version, at, period)
            if until == INF:
                return                          # only a change wakes it
            while at < until:
                at += period
        self.push(at, CYCLE, arg)

    def _wake(self, t: float, cycles: Optional[list]) -> None:
        """The cluster changed while the manager slept: its next run is the first
        on its schedule from ``t`` (now, before ``cycles`` are run, when given)."""
        _version, at, period = self._asleep
        self._asleep = None
        self._cycle_gen += 1
        while at < t or (cycles is None and at == t):
            at += period
        arg = (period, self._cycle_gen)
        if at == t:
            cycles.append((CYCLE, arg))
        else:
            self.push(at, CYCLE, arg)

    def push(self, at: float, kind: int, arg=None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at, self._seq, kind, arg))

    def every(self, seconds: float, first: float = 0.0) -> None:
        """Call ``manager.on_cycle`` every ``seconds`` from ``first``."""
        self.push(first, CYCLE, (float(seconds), self._cycle_gen))

    def timer(self, at: float, arg) -> None:
        """Call ``manager.on_timer(at, arg)`` at ``at``."""
        self.push(at, TIMER, arg)

    def _advance(self, t: float) -> None:
        if self._last_t is None:
            self._last_t = self._next_sample = t
        if t <= self._last_t:
            return
        while self._next_sample <= t:
            self._sample(self._next_sample)
            self._next_sample += self._sample_every
        if self._last_t < self.cut <= t:
            self.energy_cut_j = self.energy_j + self.power() * (self.cut - self._last_t)
        self.energy_j += self.power() * (t - self._last_t)
        self._last_t = self.now = t

    def power(self) -> float:
        """Cluster watts now."""
        c, w = self.count, self.watts
        return c[0] * w[0] + c[1] * w[1] + c[2] * w[2] + c[3] * w[3] + c[4] * w[4] + c[5] * w[5]

    def _sample(self, t: float) -> None:
        c = self.count
        self.samples.append((t, self.power(), c[IDLE] + c[BUSY] + c[HELD], c[DOWN],
                             c[BOOTING] + c[SHUTTING]))

    def _set(self, node: Node, state: int) -> None:
        self.version += 1
        if node.state not in _JOB_STATES or state not in _JOB_STATES:
            self.power_version += 1
        self.count[node.state] -= 1
        self.count[state] += 1
        if self._in_state is not None:
            self._in_state[node.state].discard(node.idx)
            self._in_state[state].add(node.idx)
        node.state = state
        if self._calendar_lists is not None:
            self._calendar_moved.add(node.idx)

    def state_index(self) -> List[Set[int]]:
        """The indexes of the nodes in each state (read them, do not change them)."""
        if self._in_state is None:
            self._in_state = [set() for _ in range(6)]
            for node in self.nodes:
                self._in_state[node.state].add(node.idx)
        return self._in_state

    def _recalendar(self, node: Node) -> None:
        """Note that ``node``'s place in the calendar may have changed (`_calendar_pool`
        moves it when next asked)."""
        if self._calendar_lists is not None:
            self._calendar_moved.add(node.idx)

    def nodes_except(self, states: Sequence[int], keep: Iterable[int] = ()) -> List[Node]:
        """Nodes in none of ``states``, failed ones and those indexed in ``keep``,
        in index order: a manager that passes over most nodes visits only these."""
        chosen = set(keep)
        chosen.update(self.failed_nodes)
        for state, members in enumerate(self.state_index()):
            if state not in states:
                chosen.update(members)
        nodes = self.nodes
        return [nodes[i] for i in sorted(chosen)]

    # -- jobs ----------------------------------------------------------------
    def _end_job(self, j: int, t: float) -> None:
        self.done += 1
        i = bisect.bisect_left(self.ends, (self.start[j] + self.wall[j], j))
        if i < len(self.ends) and self.ends[i][1] == j:
            del self.ends[i]
        freed = []
        for idx in self.alloc[j]:
            node = self.nodes[idx]
            node.job = None
            self._set(node, IDLE)
            node.idle_since = node.changed = t
            self._to_pool(node)
            freed.append(node)
        self._dirty = True
        self.manager.on_idle(freed, t)

    def _to_pool(self, node: Node) -> None:
        if not node.marked and not node.failed and not self._in_pool[node.idx]:
            self._in_pool[node.idx] = True
            self.pool_size += 1
            heapq.heappush(self._pool, node.idx)

    def _from_pool(self, node: Node) -> None:
        if self._in_pool[node.idx]:
            self._in_pool[node.idx] = False
            self.pool_size -= 1

    def _take(self, heap: List[int], flags: List[bool]) -> Node:
        while True:
            idx = heapq.heappop(heap)
            if flags[idx]:
                flags[idx] = False
                return self.nodes[idx]

    def _allocate(self, j: int, t: float) -> None:
        self.version += 1           # the queue changes even if no node state does
        need = self.width[j]
        got, booting = [], []
        while len(got) < need and self.pool_size:
            self.pool_size -= 1
            got.append(self._take(self._pool, self._in_pool))
        while len(got) < need:
            self.down_free -= 1
            node = self._take(self._down, self._in_down)
            got.append(node)
            booting.append(node)
        self.alloc[j] = tuple(n.idx for n in got)
        for node in got:
            node.job = j
            self._recalendar(node)
        if not booting:
            self._run_job(j, t)
            return
        for node in got:
            if node.state == IDLE:
                self._set(node, HELD)
        self._waiting[j] = len(booting)
        if self.power_since[j] is None:
            self.power_since[j] = t
        key = (t + self.model.boot_seconds * 2 + self.wall[j], j)
        self._provisional[j] = key
        bisect.insort(self.ends, key)
        self.manager.on_allocated_down(booting, t)

    def _run_job(self, j: int, t: float) -> None:
        self.start[j] = t
        if self.power_since[j] is not None:
            self.power_wait[j] = t - self.power_since[j]
        for idx in self.alloc[j]:
            node = self.nodes[idx]
            self._set(node, BUSY)
            node.changed = t
        bisect.insort(self.ends, (t + self.wall[j], j))
        self.push(t + self.runtime[j], END, j)

    # -- after the run -------------------------------------------------------------
    def energy_kwh(self, until: Optional[float] = None) -> float:
        """Energy used up to ``until``: cut there if the run went on past it
        (``until`` must then be the ``cut`` set before the run), else extended
        at the final power level."""
        joules = self.energy_j
        if until is not None and self._last_t is not None:
            if until > self._last_t:
                joules += self.power() * (until - self._last_t)
            elif until < self._last_t:
                if until != self.cut or self.energy_cut_j is None:
                    raise ValueError("energy up to %s needs cut set to it before the run"
                                     % until)
                joules = self.energy_cut_j
        return joules / 3.6e6

    def node_cycles(self) -> int:
        return sum(n.downs for n in self.nodes)
