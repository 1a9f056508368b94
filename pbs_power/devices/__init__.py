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
           "get_backend", "BACKENDS", "DEVICE_BACKENDS"]

#: type -> (module, class); the class is built as ``cls(options, state_dir)``.
BACKENDS: Dict[str, Tuple[str, str]] = {
    "simulated": ("pbs_power.devices.simulated", "SimulatedBackend"),
    "command": ("pbs_power.devices.command", "CommandBackend"),
    "groups": ("pbs_power.devices.routing", "GroupedBackend"),
    "ipmi": ("pbs_power.devices.ipmi", "IpmiPowerBackend"),
    "redfish": ("pbs_power.devices.redfish", "RedfishBackend"),
}

#: Device-controller backends: name -> (module, class). A class name of "" means
#: the module's `DeviceBackend` subclass whose ``name`` is the backend's name;
#: it is built with ``cls.from_options(options)`` (else ``cls(**options)``).
#: See `pbs_power.devices.selection`.
DEVICE_BACKENDS: Dict[str, Tuple[str, str]] = {
    "simulated": ("pbs_power.devices.simulated_devices", "SimulatedDevices"),
    "command": ("pbs_power.devices.command", "CommandDevices"),
    "nvml": ("pbs_power.devices.nvml", "NvmlDevices"),
    "redfish": ("pbs_power.devices.redfish", ""),
    "ipmi": ("pbs_power.devices.ipmi", ""),
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
