"""Redfish BMCs over HTTPS: power state, on/off and power caps (`backend`), over one
session per BMC (`client`) that talks to its configured origin only (`origin`), with
the caps' resources (`caps`), how caps are set and lifted (`cap_set`), what device
requests ask (`cap_requests`) and resets (`power`).
"""
from pbs_power._lazy import exports, names

_PUBLIC = {"RedfishBackend": ".backend", "RedfishError": ".client", "RedfishOptions": ".options"}
__all__ = names(_PUBLIC)
__getattr__ = exports(__name__, _PUBLIC)
