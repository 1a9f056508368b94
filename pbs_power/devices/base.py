"""The power backend interface: start host power changes, report host power.

A backend turns the planner's decisions into commands (BMC, IPMI, a site
script, or the simulated fleet). One host's failure is a ``Result`` with
``ok=False``; only a failure of the whole backend raises ``BackendError``.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Dict, Optional, Sequence

from pbs_power.states.model import PowerState, TransitionKind
from .errors import BackendError  # noqa: F401  (part of the backends' API)


@dataclass(frozen=True)
class Result:
    """Outcome of starting one host's transition; ``diag`` says why, for the log."""

    ok: bool
    diag: str = ""


@dataclass(frozen=True)
class HostPower:
    """A host's power state and, if the backend knows, when it got there."""

    state: PowerState
    since: Optional[float] = None


class PowerBackend(abc.ABC):
    """Base of every power backend.

    Backends are built by ``pbs_power.devices.get_backend`` as
    ``Backend(options, state_dir)``; times are the caller's ``now`` so that
    the simulator can drive a simulated clock.
    """

    #: The ``power_backend.type`` that selects this backend.
    name: str = ""

    @abc.abstractmethod
    def request(self, kind: TransitionKind, hosts: Sequence[str],
                now: float) -> Dict[str, Result]:
        """Start ``kind`` on each host; one Result per host, never raises per host."""

    @abc.abstractmethod
    def status(self, hosts: Sequence[str], now: float) -> Dict[str, HostPower]:
        """Each host's power state at ``now``."""

    def close(self) -> None:
        """Release connections or files; the default has none."""

    def __enter__(self) -> "PowerBackend":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
