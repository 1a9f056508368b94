"""IPMI BMCs through ``ipmitool`` (argv lists): chassis power and DCMI power limits."""
from pbs_power._lazy import exports, names

_PUBLIC = {"IpmiPowerBackend": ".backend"}
__all__ = names(_PUBLIC)
__getattr__ = exports(__name__, _PUBLIC)
