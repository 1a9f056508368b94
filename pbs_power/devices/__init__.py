"""Power backends: the device side of host power on/off and sleep/wake.

``get_backend`` picks one by ``power_backend.type``; each backend module is
imported only when chosen, so optional dependencies stay optional.
"""
from __future__ import annotations

import importlib
from typing import Dict, Tuple

from ..config import BackendConfig
from .base import BackendError, HostPower, PowerBackend, Result

__all__ = ["BackendError", "HostPower", "PowerBackend", "Result",
           "get_backend", "BACKENDS"]

#: type -> (module, class); the class is built as ``cls(options, state_dir)``.
BACKENDS: Dict[str, Tuple[str, str]] = {
    "simulated": ("pbs_power.devices.simulated", "SimulatedBackend"),
}


def get_backend(config: BackendConfig, state_dir: str) -> PowerBackend:
    """Build the backend named by ``config.type`` with ``config.options``."""
    entry = BACKENDS.get(config.type) if isinstance(config.type, str) else None
    if entry is None:
        raise BackendError(f"power backend '{config.type}' is not available "
                           f"in this version (available: "
                           f"{', '.join(sorted(BACKENDS))})")
    module = importlib.import_module(entry[0])
    return getattr(module, entry[1])(config.options, state_dir)
