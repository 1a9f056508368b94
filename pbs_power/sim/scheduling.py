"""The simulated batch scheduler: FCFS + EASY backfilling and its calendar of estimates.

`Engine` inherits this; it works on the engine's node pool, job queue and
counts (see ``engine.py`` for the two scheduler flavours, ``pbs`` and ``slurm``).
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from .nodes import BOOTING, BUSY, DOWN, HELD, IDLE, SHUTTING, Node

INF = float("inf")


class Scheduling:
    """Scheduler methods of `Engine`: which queued jobs start, and when the rest could."""

    # -- the scheduler --------------------------------------------------------------
    def startable(self) -> int:
        return self.pool_size + (self.down_free if self.slurm else 0)

    def potential(self) -> int:
        """Nodes the calendar may count on now (free, asleep or coming up)."""
        if self.slurm:
            return self.pool_size + self.down_free
        c = self.count
        return len(self.nodes) - c[BUSY] - c[HELD] - self.failed

    def shadow(self, width: int, t: float) -> Tuple[float, int]:
        """When ``width`` nodes are expected free (walltimes), and the spare then."""
        have = self.potential()
        if width <= have:
            return t, have - width
        for end, j in self.ends:
            have += self.width[j]
            if have >= width:
                return max(end, t), have - width
        return INF, 0

    def _schedule(self, t: float) -> None:
        if not self._dirty:
            new, self._new = self._new, []
            if new and self.startable():
                self._backfill_new(new, t)
                return
            if not new or self._shadow[0] != INF:
                return
            # Nothing can start, but a new job may be the new top job: the
            # full pass gives it its reservation (and notes a power wait).
        self._dirty = False
        self._new = []
        queue = self.queue
        if not queue:
            return
        avail = self.startable()
        shadow = extra = None
        started = 0
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
                if shadow <= t:
                    # It waits only for nodes to wake. PBS's calendar holds the
                    # free nodes for it (they come first in its exec_vnode), so
                    # backfilling must not eat the nodes woken for it.
                    extra = 0
                if self.power_since[j] is None and width <= self.potential():
                    self.power_since[j] = t           # only power keeps it waiting
                continue
            if width <= avail and (t + self.wall[j] <= shadow or width <= extra):
                self._allocate(j, t)
                avail -= width
                started += 1
                if t + self.wall[j] > shadow:
                    extra -= width
        self._shadow = (shadow if shadow is not None else INF, extra or 0)
        if started:
            self._drop_started()

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
    def estimates(self, t: float, limit: Optional[int] = None
                  ) -> List[Tuple[int, float, List[Node]]]:
        """Queued jobs' estimated start and nodes, as PBS's calendar shows them.

        Jobs that fit now in the nodes that are free, asleep or coming up get
        ``t`` and nodes from those (free first, then coming up, then asleep).
        The first job that does not fit gets its shadow time, the nodes freed
        by then plus what it needs of the rest. Later jobs get ``t`` when
        they fit without delaying it (EASY): a job that ends before the
        shadow time may use its nodes, one that runs past it only the nodes
        it leaves. Only the first ``limit`` queued jobs are looked at.
        The answer is shared until the cluster changes: do not modify it.
        """
        key = (self.version, t, limit)
        if self._estimated is not None and self._estimated[0] == key:
            return self._estimated[1]
        out = self._estimate(t, limit)
        self._estimated = (key, out)
        return out

    def _estimate(self, t: float, limit: Optional[int]
                  ) -> List[Tuple[int, float, List[Node]]]:
        pool = self._calendar_pool()
        size = len(pool)
        out: List[Tuple[int, float, List[Node]]] = []
        front = back = 0          # pool nodes taken from the front / the back
        shadow: Optional[float] = None
        held_to = 0               # the top job's pool nodes end at this index
        for n, j in enumerate(self.queue):
            if limit is not None and n >= limit:
                break
            width = self.width[j]
            if shadow is None:
                if width <= size - front - back:
                    out.append((j, t, pool[front:front + width]))
                    front += width
                    continue
                shadow, nodes = self._top_estimate(width, size - front - back, t)
                if nodes is None:             # can never fit: no estimate
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

    def _calendar_pool(self) -> List[Node]:
        free, coming, asleep = [], [], []
        for node in self.nodes:
            if node.failed or node.job is not None:
                continue
            s = node.state
            if s == IDLE:
                (asleep if node.marked else free).append(node)
            elif s == BOOTING:
                coming.append(node)
            elif s in (DOWN, SHUTTING):
                asleep.append(node)
        return free + coming + asleep
