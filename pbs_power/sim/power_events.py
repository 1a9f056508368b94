"""Node power in the SIMULATED cluster: shutdowns, boots, failures and sleep marks.

`Engine` inherits this; it works on the engine's nodes, node pool, event
queue and counts (see ``engine.py``). A power manager calls ``power_down``,
``power_up``, ``mark``, ``fail`` and (Slurm) ``requeue``; the engine's
clock calls ``_down_done`` and ``_boot_done`` when a transition ends.
"""
from __future__ import annotations

import bisect
import heapq

from .nodes import BOOTING, DOWN, HELD, IDLE, SHUTTING, Node

#: The engine's event kinds: a job ends, a boot or a shutdown is done, a
#: manager's periodic run, a manager's timer.
END, BOOT_DONE, DOWN_DONE, CYCLE, TIMER = range(5)


class PowerEvents:
    """Node power methods of `Engine`."""

    def power_down(self, node: Node, t: float) -> bool:
        """Start taking an idle, jobless node down; False if it is not idle."""
        if node.state != IDLE or node.job is not None or node.failed:
            return False
        self._from_pool(node)
        self._set(node, SHUTTING)
        node.downs += 1
        node.changed = t
        low = self.watts[DOWN]
        self._step(t, -(self.model.idle_watts - low))
        secs = self.model.sleep_seconds if self.sleep_mode else self.model.shutdown_seconds
        if self.slurm:
            self.shutting_until[node.idx] = t + secs
        self.push(t + secs, DOWN_DONE, node.idx)
        self._dirty = True
        return True

    def power_up(self, node: Node, t: float) -> bool:
        """Start bringing a down node up (after its shutdown if one is running)."""
        if node.state == SHUTTING:
            node.pending_up = True
            return True
        if node.state != DOWN:
            return False
        if self._in_down[node.idx]:
            self._in_down[node.idx] = False
            self.down_free -= 1
        self._set(node, BOOTING)
        node.changed = t
        self._step(t, self.model.idle_watts - self.watts[DOWN])
        self.push(t + self.boot_duration(node), BOOT_DONE, node.idx)
        return True

    def boot_duration(self, node: Node) -> float:
        """This boot's seconds: the node's own mean plus a little noise (seeded)."""
        noise = self.model.boot_noise * self._rng.uniform(-1.0, 1.0)
        base = node.boot_s
        if self.sleep_mode:
            base = self.model.wake_seconds * node.boot_s / self.model.boot_seconds
        return max(1.0, base * (1.0 + noise))

    def _down_done(self, idx: int, t: float) -> None:
        node = self.nodes[idx]
        self._set(node, DOWN)
        node.down_since = t
        self.shutting_until.pop(idx, None)
        if node.pending_up:
            node.pending_up = False
            self.power_up(node, t)
            return
        if self.slurm and not node.failed:
            self._in_down[idx] = True
            self.down_free += 1
            heapq.heappush(self._down, idx)
            self._dirty = True
        self.manager.on_down(node, t)

    def _boot_done(self, idx: int, t: float) -> None:
        node = self.nodes[idx]
        node.down_since = None
        node.changed = t
        j = node.job
        if j is not None:                       # slurm: allocated while down
            self._set(node, HELD)
            self._waiting[j] -= 1
            if not self._waiting[j]:
                del self._waiting[j]
                key = self._provisional.pop(j)
                i = bisect.bisect_left(self.ends, key)
                if i < len(self.ends) and self.ends[i] == key:
                    del self.ends[i]
                self._run_job(j, t)
        else:
            self._set(node, IDLE)
            node.idle_since = t
            if node.marked and not self.slurm:
                # Its MoM registers: pbs_server clears the sleep mark itself
                # (src/server/node_manager.c, IS_REGISTERMOM).
                self.mark(node, False)
            self._to_pool(node)
            self._dirty = True
        self.manager.on_up(node, t)

    def fail(self, node: Node, t: float) -> None:
        """Take a node out of service for good (a boot that timed out)."""
        if not node.failed:
            self.version += 1
            self.power_version += 1
            node.failed = True
            self.failed += 1
            self.failed_nodes.add(node.idx)
            self._recalendar(node)
            self._from_pool(node)
            if self._in_down[node.idx]:
                self._in_down[node.idx] = False
                self.down_free -= 1

    def requeue(self, j: int, t: float) -> None:
        """Slurm: give a job waiting for its nodes back to the queue (a resume timed out)."""
        self.version += 1
        for idx in self.alloc[j]:
            node = self.nodes[idx]
            node.job = None
            self._recalendar(node)
            if node.state == HELD:
                self._set(node, IDLE)
                node.idle_since = node.changed = t
                self._to_pool(node)
            elif node.state == DOWN and not node.failed and not self._in_down[idx]:
                self._in_down[idx] = True          # allocated, never resumed
                self.down_free += 1
                heapq.heappush(self._down, idx)
        self.alloc[j] = ()
        self._waiting.pop(j, None)
        key = self._provisional.pop(j, None)
        if key is not None:
            i = bisect.bisect_left(self.ends, key)
            if i < len(self.ends) and self.ends[i] == key:
                del self.ends[i]
        bisect.insort(self.queue, j)
        self._dirty = True

    def mark(self, node: Node, asleep: bool) -> None:
        """Set or clear the PBS sleep mark (a marked node takes no new job)."""
        if node.marked == asleep:
            return
        self.version += 1
        self.power_version += 1
        node.marked = asleep
        self._recalendar(node)
        if asleep:
            self._from_pool(node)
            self._dirty = True                  # the calendar lost a free node
        elif node.state == IDLE and node.job is None and not node.failed:
            self._to_pool(node)
            self._dirty = True

    def _step(self, t: float, watts: float) -> None:
        minute = int(t // 60)
        book = self.ramp_up if watts > 0 else self.ramp_down
        book[minute] = book.get(minute, 0.0) + abs(watts)
