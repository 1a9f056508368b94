"""Power backends: the device side of host power on/off and sleep/wake, and the device
controller that sends resource-group and topology requests to each node's backend.

``get_backend`` picks a power backend by ``power_backend.type``; each backend
module is imported only when chosen, so optional dependencies stay optional.
Names here load on first use: importing the package costs nothing.
"""
from pbs_power._lazy import exports, names

_PUBLIC = {
    **{n: ".base" for n in ("BackendError", "HostPower", "PowerBackend", "Result")},
    "get_backend": ".registry",
    **{n: "pbs_power.config.backends" for n in ("BACKENDS", "DEVICE_BACKENDS")},
}
__all__ = names(_PUBLIC)
__getattr__ = exports(__name__, _PUBLIC)
