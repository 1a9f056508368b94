"""The simulated batch scheduler: FCFS + EASY backfilling and its calendar of estimates.

`Engine` inherits this; it works on the engine's node pool, job queue and
counts (see ``engine.py`` for the two scheduler flavours, ``pbs`` and ``slurm``).
"""
from __future__ import annotations

import bisect
import heapq
import operator
from typing import Iterable, List, Optional, Tuple

from .nodes import BOOTING, BUSY, DOWN, HELD, IDLE, SHUTTING, Node

INF = float("inf")
_INDEX = operator.attrgetter("idx")


def calendar_kind(node: Node) -> int:
    """Where the calendar counts ``node``: 0 free, 1 coming up, 2 asleep, -1 not at all
    (it has a job, failed, or is busy)."""
    if node.failed or node.job is not None:
        return -1
    state = node.state
    if state == IDLE:
        return 2 if node.marked else 0
    if state == BOOTING:
        return 1
    if state in (DOWN, SHUTTING):
        return 2
    return -1


class Scheduling:
    """Scheduler methods of `Engine`: which queued jobs start, and when the rest could."""

    # -- the scheduler --------------------------------------------------------------
    def startable(self) -> int:
        return self.pool_size + (self.down_free if self.slurm else 0)

    def potential(self) -> int:
        """Nodes the scheduler's calendar counts on now: free ones (and, Slurm,
        powered-down ones, which it allocates)."""
        return self.pool_size + (self.down_free if self.slurm else 0)

    def jobless(self) -> int:
        """Nodes with no job that have not failed: free, asleep or coming up."""
        c = self.count
        return len(self.nodes) - c[BUSY] - c[HELD] - self.failed

    def shadow(self, width: int, t: float) -> Tuple[float, int]:
        """When ``width`` nodes are expected free (walltimes), and the spare then.

        Slurm: a node powering down is out of the allocatable nodes until
        its SuspendTimeout ends, then allocatable while powered down
        (power_save.c clears it from avail_node_bitmap, "Don't allocate until
        after SuspendTimeout", and make_node_avail()s it once the timeout
        passed), so it counts from then on.

        PBS: a vnode marked asleep, or down while it boots, is neither free
        nor busy, so it never comes up in the calendar
        (src/scheduler/node_info.cpp set_node_info_state), unless the server
        has power_provisioning (only a hook named PBS_power turns it on):
        then every sleeping vnode comes up at now + PROVISION_DURATION
        (``calendar_sleep``; src/scheduler/simulate.cpp create_events).
        """
        have = self.potential()
        if width <= have:
            return t, have - width
        # (time, job) as nodes come free; job -1: one node; len(width), after
        # any job ending at the same time: every sleeping one
        ends: Iterable[Tuple[float, int]] = self.ends
        width_of, asleep_key, asleep = self.width, len(self.width), 0
        if self.slurm:
            if self.shutting_until:
                ends = heapq.merge(ends, sorted((u, -1) for u in self.shutting_until.values()))
        else:
            asleep = self.jobless() - have if self.calendar_sleep is not None else 0
            if width > have + self.count[BUSY] + asleep:
                return INF, 0                  # no start time estimate
            if asleep:
                ends = heapq.merge(ends, [(t + self.calendar_sleep, asleep_key)])
        for end, j in ends:
            have += 1 if j < 0 else (asleep if j == asleep_key else width_of[j])
            if have >= width:
                return max(end, t), have - width
        return INF, 0

    def _schedule(self, t: float) -> None:
        if not self._dirty:
            new, self._new = self._new, []
            if not (new and self._shadow_moves and not self._moved_alike(t)):
                if new and self.startable():
                    self._backfill_new(new, t)
                    return
                if not new or self._shadow[0] != INF:
                    return
            # Nothing can start, but a new job may be the new top job: the
            # full pass gives it its reservation (and notes a power wait).
            # Or the top job's reservation, which waits for sleeping vnodes
            # up at now + calendar_sleep, moved otherwise than in step.
        self._dirty = False
        self._new = []
        queue = self.queue
        if not queue:
            return
        avail = self.startable()
        shadow = extra = None
        started = top_width = 0
        for j in queue:
            if avail <= 0 and shadow is not None:
                break
            width = self.width[j]
            if shadow is None:
                if width <= avail:
                    self._allocate(j, t)
                    avail -= width
                    started += 1
                    continue
                shadow, extra = self.shadow(width, t)
                if self.power_since[j] is None and width <= self.jobless():
                    self.power_since[j] = t           # only power keeps it waiting
                if shadow == INF and not self.slurm:
                    # PBS: no start time estimate, so it is no top job and
                    # holds nothing; the next job that cannot run may be one
                    # (src/scheduler/fifo.cpp: add_job_to_calendar failed,
                    # "continue on", num_topjobs unchanged).
                    shadow = None
                top_width = width
                continue
            if width <= avail and (t + self.wall[j] <= shadow or width <= extra):
                self._allocate(j, t)
                avail -= width
                started += 1
                if t + self.wall[j] > shadow:
                    extra -= width
        self._shadow = (shadow if shadow is not None else INF, extra or 0)
        self._shadow_moves = (shadow is not None and self.calendar_sleep is not None
                              and not self.slurm and shadow == t + self.calendar_sleep)
        self._top_width = top_width
        if started:
            self._drop_started()

    def _moved_alike(self, t: float) -> bool:
        """Whether the top job's moving reservation is, at ``t``, the last pass's
        moved along: still at now + calendar_sleep with the same spare nodes.
        Then no queued job's chance changed (a job ends by then if its
        walltime is at most calendar_sleep, at any ``t``): only new jobs need
        trying, against it."""
        shadow, extra = self.shadow(self._top_width, t)
        if shadow != t + self.calendar_sleep or extra != self._shadow[1]:
            return False
        self._shadow = (shadow, extra)
        return True

    def _drop_started(self) -> None:
        """Take jobs that started or hold nodes out of the queue."""
        start, alloc = self.start, self.alloc
        self.queue = [j for j in self.queue if start[j] is None and not alloc[j]]

    def _backfill_new(self, new: List[int], t: float) -> None:
        """Only new jobs arrived since the last full pass: try them against it."""
        shadow, extra = self._shadow
        avail = self.startable()
        started = False
        for j in new:
            width = self.width[j]
            if shadow == INF:                       # no job waits: plain FCFS
                if width <= avail:
                    self._allocate(j, t)
                    avail -= width
                    started = True
                    continue
                self._dirty = True                  # it is the new top job
                break
            if width <= avail and (t + self.wall[j] <= shadow or width <= extra):
                self._allocate(j, t)
                avail -= width
                started = True
                if t + self.wall[j] > shadow:
                    extra -= width
        self._shadow = (shadow, extra)
        if started:
            self._drop_started()
        if self._dirty:
            self._schedule(t)

    # -- what the calendar tells a PBS power hook -----------------------------------
    def estimates(self, t: float, fit: object = False
                  ) -> List[Tuple[int, float, List[Node]]]:
        """The top job's estimated start and nodes, as a stock PBS scheduler gives it.

        PBS estimates only top jobs (strict_ordering or backfill, with
        backfill_depth 1): the first queued job. Sleeping and waking nodes
        count as available now, as the pbs-power hook's own fit counts them
        for its wake decision (a PBS_power server calendars them at
        now + 600 s, which leads OpenPBS's hook to the same wakes). A top job
        that fits now gets ``t`` and nodes, free first, then coming up, then
        asleep; one that does not, its shadow time and the nodes freed by
        then. With ``fit``, the later queued jobs that fit now in the nodes
        left follow, each with ``t``, as the pbs-power hook places them
        itself (queue order, free nodes first, a job that does not fit takes
        nothing); only those that need a node that is not up are listed.
        With ``fit="calendar"``, every queued job gets the start an EASY
        calendar of the running jobs' walltimes gives it (`_calendar`): a
        calendar of the simulator's own, to compare with the hook's forecast.
        The answer is shared until the cluster changes: do not modify it.
        """
        key = (self.version, t, fit)
        if self._estimated is not None and self._estimated[0] == key:
            return self._estimated[1]
        out = self._calendar(t) if fit == "calendar" else self._estimate(t, bool(fit))
        self._estimated = (key, out)
        return out

    def _estimate(self, t: float, fit: bool) -> List[Tuple[int, float, List[Node]]]:
        if not self.queue:
            return []
        pool, awake = self._calendar_pool()
        size = len(pool)
        top = self.queue[0]
        width = self.width[top]
        out: List[Tuple[int, float, List[Node]]] = []
        if width <= size:
            out.append((top, t, pool[:width]))
            front = width
        else:
            shadow, nodes = self._top_estimate(width, size, t)
            if nodes is None:             # can never fit: no estimate
                front = 0
            else:
                front = width - len(nodes)
                out.append((top, shadow, nodes + pool[:front]))
        if not fit:
            return out
        for j in self.queue[1:]:
            if front >= size:
                break
            width = self.width[j]
            if width <= size - front:
                if front + width > awake:
                    out.append((j, t, pool[front:front + width]))
                front += width
        return out

    def _calendar(self, t: float) -> List[Tuple[int, float, List[Node]]]:
        """Every queued job's start and nodes under EASY backfilling.

        Jobs that fit now in the free, waking or sleeping nodes get ``t``;
        the first that does not, its shadow time and the nodes freed by then
        plus what it needs of the rest. Later jobs get ``t`` when they fit
        without delaying it: one ending before the shadow time may use its
        nodes, one running past it only the nodes it leaves (from the back).
        """
        pool, _awake = self._calendar_pool()
        size = len(pool)
        out: List[Tuple[int, float, List[Node]]] = []
        front = back = held_to = 0
        shadow: Optional[float] = None
        for j in self.queue:
            width = self.width[j]
            if shadow is None:
                if width <= size - front - back:
                    out.append((j, t, pool[front:front + width]))
                    front += width
                    continue
                shadow, nodes = self._top_estimate(width, size - front - back, t)
                if nodes is None:
                    continue
                held_to = front + (width - len(nodes))
                out.append((j, shadow, nodes + pool[front:held_to]))
                continue
            if t + self.wall[j] <= shadow:
                if width <= size - front - back:
                    out.append((j, t, pool[front:front + width]))
                    front += width
            elif width <= size - max(front, held_to) - back:
                out.append((j, t, pool[size - back - width:size - back]))
                back += width
            if front + back >= size:
                break
        return out

    def _top_estimate(self, width: int, have: int, t: float
                      ) -> Tuple[float, Optional[List[Node]]]:
        """The top job's shadow time and the nodes running jobs free by then."""
        freed: List[Node] = []
        at = t
        for end, k in self.ends:
            if have >= width:
                break
            have += self.width[k]
            freed.extend(self.nodes[i] for i in self.alloc[k])
            at = end
        if have < width:
            return INF, None
        return max(at, t), freed[:width]

    def _calendar_pool(self) -> Tuple[List[Node], int]:
        """Nodes without a job: free, then coming up, then asleep; and how many are free.

        Each list is kept in index order: made by one pass over the nodes when
        first asked for, later only the nodes that changed since are moved
        (`Engine._recalendar`), unless so many changed that a pass costs less.
        """
        moved = self._calendar_moved
        if self._calendar_lists is None or len(moved) > len(self.nodes) // 16:
            self._calendar_of = kinds = [-1] * len(self.nodes)
            self._calendar_lists = lists = ([], [], [])
            for node in self.nodes:           # calendar_kind, inlined: a pass visits all
                if node.failed or node.job is not None:
                    continue
                state = node.state
                if state == IDLE:
                    kind = 2 if node.marked else 0
                elif state == BOOTING:
                    kind = 1
                elif state == DOWN or state == SHUTTING:
                    kind = 2
                else:
                    continue
                kinds[node.idx] = kind
                lists[kind].append(node)
        else:
            lists, kinds, nodes = self._calendar_lists, self._calendar_of, self.nodes
            for idx in moved:
                node = nodes[idx]
                kind, was = calendar_kind(node), kinds[idx]
                if kind == was:
                    continue
                if was >= 0:
                    del lists[was][bisect.bisect_left(lists[was], idx, key=_INDEX)]
                if kind >= 0:
                    bisect.insort(lists[kind], node, key=_INDEX)
                kinds[idx] = kind
        moved.clear()
        free, coming, asleep = self._calendar_lists
        return free + coming + asleep, len(free)
