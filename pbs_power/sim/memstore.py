"""An in-memory stand-in for `pbs_power.states.store.Store`, for simulations.

The simulator drives the real `Cycle` tens of thousands of times per run;
this keeps the same methods and the same estimate rules (p90 of each host's
last boots, fleet p90 of latest boots) without touching disk. It holds only
what one process needs: there is no lock to share, so ``cycle_lock`` always
grants it.
"""
from __future__ import annotations

import bisect
import contextlib
import heapq
from collections import deque
from typing import Deque, Dict, Iterator, List, Optional, Tuple

from pbs_power.states.cycle import MeasuredBoots, fleet_estimates
from pbs_power.states.model import BootTimes, RampStep, Transition, TransitionKind
from pbs_power.states.planner import FLEET
from pbs_power.states.store import (DURATION_HISTORY, ESTIMATE_PERCENT, ESTIMATE_WINDOW,
                     FLEET_MIN_HOSTS, nearest_rank, nearest_rank_index)


class MemoryStore:
    """Transitions, measured durations, down times, ramp steps and failed hosts."""

    def __init__(self) -> None:
        self._transitions: Dict[str, Transition] = {}
        self._durations: Dict[Tuple[str, str], Deque[float]] = {}
        self._estimates: Dict[str, Dict[str, float]] = {}
        self._down_since: Dict[str, float] = {}
        self._steps: Deque[RampStep] = deque()
        self._failed: Dict[str, Tuple[str, float]] = {}
        #: Per kind, every host's latest duration, sorted: the fleet estimate is a rank in it.
        self._latest: Dict[str, List[float]] = {}
        #: (-estimate, host, kind) of every estimate ever made: a max-heap whose stale
        #: tops (an estimate since replaced) are dropped when the longest is asked.
        self._longest: List[Tuple[float, str, str]] = []
        self._boot_times: Optional[BootTimes] = None
        #: Per kind, every host's estimate as `cycle.up_seconds` gives it, kept up to
        #: date once asked for (`measured`); the version moves when one changes.
        self._measured: Dict[str, MeasuredBoots] = {}
        self.measured_version = 0

    @contextlib.contextmanager
    def cycle_lock(self, name: str = "cycle") -> Iterator[bool]:
        yield True

    def close(self) -> None:
        """Nothing to release."""

    def transitions(self) -> Tuple[Transition, ...]:
        return tuple(self._transitions.values())

    def put_transition(self, t: Transition) -> None:
        self._transitions[t.host] = t

    def drop_transition(self, host: str) -> None:
        self._transitions.pop(host, None)

    def record_duration(self, host: str, kind, started: float, seconds: float) -> None:
        kind_value = TransitionKind(kind).value
        history = self._durations.setdefault((host, kind_value),
                                             deque(maxlen=DURATION_HISTORY))
        latest = self._latest.setdefault(kind_value, [])
        if history:
            del latest[bisect.bisect_left(latest, history[0])]
        history.appendleft(float(seconds))
        bisect.insort(latest, history[0])
        estimate = nearest_rank(list(history)[:ESTIMATE_WINDOW], ESTIMATE_PERCENT)
        # A new inner dict, never an update: earlier answers stay as they were.
        self._estimates[host] = dict(self._estimates.get(host, {}), **{kind_value: estimate})
        self._boot_times = None
        measured = self._measured.get(kind_value)
        if measured is not None and measured.get(host) != estimate:
            measured[host] = estimate
            self.measured_version += 1
        heapq.heappush(self._longest, (-estimate, host, kind_value))
        if len(self._longest) > 4 * len(self._durations) + 64:
            self._longest = [(-v, h, k) for h, per in self._estimates.items()
                             for k, v in per.items()]
            heapq.heapify(self._longest)

    def durations(self, host: str, kind) -> Tuple[float, ...]:
        return tuple(self._durations.get((host, TransitionKind(kind).value), ()))

    def duration_estimates(self, kind=None) -> Dict[str, Dict[str, float]]:
        if kind is None:        # inner dicts are shared: read them, do not change them
            return dict(self._estimates)
        value = TransitionKind(kind).value
        return {h: {value: v[value]} for h, v in self._estimates.items() if value in v}

    def measured(self, kind) -> MeasuredBoots:
        """Each host's estimate for ``kind``, as `cycle.up_seconds` gives it, kept up
        to date in place from now on (read it, do not change it)."""
        value = TransitionKind(kind).value
        found = self._measured.get(value)
        if found is None:
            found = self._measured[value] = MeasuredBoots(
                (h, per[value]) for h, per in self._estimates.items() if value in per)
        return found

    def boot_times(self) -> BootTimes:
        """What `cycle.boot_times` makes of this store, kept until the next record
        (shared: read it, do not change it)."""
        if self._boot_times is None:
            times = BootTimes(self._estimates)
            times[FLEET] = fleet_estimates(self)
            found = [v for v in [self._longest_estimate()] + list(times[FLEET].values())
                     if v is not None]
            times.longest = max(found) if found else None
            self._boot_times = times
        return self._boot_times

    def _longest_estimate(self) -> Optional[float]:
        """The largest estimate of any host and kind (None before the first)."""
        heap, estimates = self._longest, self._estimates
        while heap and estimates[heap[0][1]].get(heap[0][2]) != -heap[0][0]:
            heapq.heappop(heap)
        return -heap[0][0] if heap else None

    def fleet_duration_estimate(self, kind) -> Optional[float]:
        """The nearest-rank percentile of every host's latest duration, as the
        store computes it (the sorted latest values are kept as they change)."""
        latest = self._latest.get(kind)     # a kind hashes and compares as its value
        if latest is None:
            TransitionKind(kind)                # refuses an unknown kind, as the store does
            return None
        if len(latest) < FLEET_MIN_HOSTS:
            return None
        return latest[nearest_rank_index(len(latest), ESTIMATE_PERCENT)]

    def set_down_since(self, host: str, since: Optional[float]) -> None:
        if since is None:
            self._down_since.pop(host, None)
        else:
            self._down_since[host] = float(since)

    def down_since(self) -> Dict[str, float]:
        return dict(self._down_since)

    def record_steps(self, steps) -> None:
        self._steps.extend(steps)

    def recent_steps(self, since: float) -> Tuple[RampStep, ...]:
        steps = self._steps
        while steps and steps[0].time < since - 3600.0:
            steps.popleft()
        return tuple(s for s in steps if s.time >= since)

    def mark_failed(self, host: str, reason: str, when: float) -> None:
        self._failed[host] = (reason, float(when))

    def failed(self) -> Dict[str, Tuple[str, float]]:
        return dict(self._failed)

    def clear_failed(self, host: str) -> None:
        self._failed.pop(host, None)


__all__ = ["MemoryStore"]
