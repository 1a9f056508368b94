"""The hook config: what the admin writes in JSON, checked (schema + our rules) and loaded.

Public: `load_config`, `parse_config`, `HookConfig`, `ConfigError` and the
mode names. `backends` holds the backend type tables the check needs.
"""
from pbs_power._lazy import exports, names

_PUBLIC = {name: ".hook_config" for name in (
    "HookConfig", "BackendConfig", "JobPolicies", "NodePower", "ConfigError",
    "load_config", "parse_config", "MODE_POWER_ON_OFF", "MODE_RAMP_RATE", "MODE_DISABLED")}
__all__ = names(_PUBLIC)
__getattr__ = exports(__name__, _PUBLIC)
