"""An in-memory stand-in for `pbs_power.states.store.Store`, for simulations.

The simulator drives the real `Cycle` tens of thousands of times per run;
this keeps the same methods and the same estimate rules (p90 of each host's
last boots, fleet p90 of latest boots) without touching disk. It holds only
what one process needs: there is no lock to share, so ``cycle_lock`` always
grants it.
"""
from __future__ import annotations

import contextlib
from collections import deque
from typing import Deque, Dict, Iterator, Optional, Tuple

from pbs_power.states.model import RampStep, Transition, TransitionKind
from pbs_power.states.store import (DURATION_HISTORY, ESTIMATE_PERCENT, ESTIMATE_WINDOW,
                     FLEET_MIN_HOSTS, nearest_rank)


class MemoryStore:
    """Transitions, measured durations, down times, ramp steps and failed hosts."""

    def __init__(self) -> None:
        self._transitions: Dict[str, Transition] = {}
        self._durations: Dict[Tuple[str, str], Deque[float]] = {}
        self._estimates: Dict[str, Dict[str, float]] = {}
        self._down_since: Dict[str, float] = {}
        self._steps: Deque[RampStep] = deque()
        self._failed: Dict[str, Tuple[str, float]] = {}
        self._fleet: Dict[str, Optional[float]] = {}

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
        history.appendleft(float(seconds))
        self._fleet.pop(kind_value, None)
        # A new inner dict, never an update: earlier answers stay as they were.
        self._estimates[host] = dict(self._estimates.get(host, {}), **{kind_value: nearest_rank(
            list(history)[:ESTIMATE_WINDOW], ESTIMATE_PERCENT)})

    def durations(self, host: str, kind) -> Tuple[float, ...]:
        return tuple(self._durations.get((host, TransitionKind(kind).value), ()))

    def duration_estimates(self, kind=None) -> Dict[str, Dict[str, float]]:
        if kind is None:        # inner dicts are shared: read them, do not change them
            return dict(self._estimates)
        value = TransitionKind(kind).value
        return {h: {value: v[value]} for h, v in self._estimates.items() if value in v}

    def fleet_duration_estimate(self, kind) -> Optional[float]:
        value = TransitionKind(kind).value
        if value not in self._fleet:
            latest = [d[0] for (h, k), d in self._durations.items() if k == value and d]
            self._fleet[value] = (nearest_rank(latest, ESTIMATE_PERCENT)
                                  if len(latest) >= FLEET_MIN_HOSTS else None)
        return self._fleet[value]

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
