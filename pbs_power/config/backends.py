"""Where each backend type lives: the tables the config check and `pbs_power.devices` share.

Plain data (module and class names as strings) so that checking a config never
imports a backend, and `pbs_power.devices` imports the names from here.
"""
from __future__ import annotations

from typing import Dict, Tuple

#: type -> (module, class); the class is built as ``cls(options, state_dir)``.
BACKENDS: Dict[str, Tuple[str, str]] = {
    "simulated": ("pbs_power.devices.simulated", "SimulatedBackend"),
    "command": ("pbs_power.devices.command", "CommandBackend"),
    "groups": ("pbs_power.devices.routing", "GroupedBackend"),
    "ipmi": ("pbs_power.devices.ipmi.backend", "IpmiPowerBackend"),
    "redfish": ("pbs_power.devices.redfish.backend", "RedfishBackend"),
}

#: Device-controller backends: name -> (module, class). A class name of "" means
#: the module's `DeviceBackend` subclass whose ``name`` is the backend's name;
#: it is built with ``cls.from_options(options)`` (else ``cls(**options)``).
#: See `pbs_power.devices.selection`.
DEVICE_BACKENDS: Dict[str, Tuple[str, str]] = {
    "simulated": ("pbs_power.devices.simulated_devices", "SimulatedDevices"),
    "command": ("pbs_power.devices.command", "CommandDevices"),
    "nvml": ("pbs_power.devices.nvml", "NvmlDevices"),
    "redfish": ("pbs_power.devices.redfish.backend", ""),
    "ipmi": ("pbs_power.devices.ipmi.backend", ""),
}
