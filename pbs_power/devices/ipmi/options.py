"""Options of the IPMI backends (one mapping for both), checked by name.

Options (both backends, one mapping):

* ``credentials_file`` (required, absolute path): JSON credentials, mode
  0600, see `pbs_power.devices.credentials` (per-host overrides allowed).
* ``bmcs``: host -> ``"address"`` or ``"address:port"`` (``"[v6]:port"``);
  ``bmc_template``: address for hosts not in ``bmcs``, ``{host}`` replaced by
  the host name (e.g. ``"{host}-ipmi"``); ``port`` (623).
* ``interface`` (``lanplus``; ``lan`` is IPMI 1.5), ``cipher_suite`` (17, the
  SHA-256 suite many sites now allow alone; a suite the BMC lacks costs seconds
  per call, so set the one it offers),
  ``privilege`` (ipmitool's default, ADMINISTRATOR), ``timeout`` (2: ipmitool
  ``-N`` seconds), ``retries`` (1: ``-R``, >= 1), ``call_timeout`` (30:
  seconds before one ipmitool run is killed), ``ipmitool`` (program path),
  ``max_workers`` (32: BMCs called at once), ``power_off`` (``soft`` or
  ``hard``; power backend only).
* ``soft_off_timeout`` (300): seconds after a soft off before a host still on
  gets a hard off (power backend);
* ``dcmi_correction_ms`` (1000): the DCMI correction time sent with every
  limit; ``dcmi_exception_action`` (``log``; ``none`` or ``hard_off``): what
  the BMC does when the limit cannot be held (never left as the BMC stored it).
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from pbs_power.devices.errors import BackendError
from .ipmitool import EXCEPTION_ACTIONS, INTERFACES, PRIVILEGES, Settings

OPTIONS = ("credentials_file", "bmcs", "bmc_template", "port", "interface", "cipher_suite",
           "privilege", "timeout", "retries", "call_timeout", "ipmitool", "max_workers",
           "power_off", "soft_off_timeout", "dcmi_correction_ms", "dcmi_exception_action")
ADDRESS = re.compile(r"^[A-Za-z0-9_.:%-]+$")


@dataclass(frozen=True)
class IpmiConfig:
    """Parsed options: how to reach each host's BMC and how to talk to it."""

    settings: Settings
    credentials_file: str
    bmcs: Mapping[str, Tuple[str, int]]
    bmc_template: Optional[str] = None
    port: int = 623
    max_workers: int = 32
    power_off: str = "soft"
    soft_off_timeout: float = 300.0
    dcmi_correction_ms: int = 1000
    dcmi_exception_action: str = "log"

    @classmethod
    def parse(cls, options: Optional[Mapping[str, Any]], who: str) -> "IpmiConfig":
        """Check every option; BackendError names the bad one (``who`` says which backend)."""
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise BackendError("%s: options must be an object, not %s"
                               % (who, type(options).__name__))
        bad = sorted(set(options) - set(OPTIONS), key=str)
        if bad:
            raise BackendError("%s: unknown option(s) %s (known: %s)"
                               % (who, ", ".join(map(repr, bad)), ", ".join(OPTIONS)))
        o = dict(options)
        port = _integer(who, "port", o.get("port", 623), 1, 65535)
        path = o.get("credentials_file")
        if not isinstance(path, str) or not os.path.isabs(path):
            raise BackendError("%s: option credentials_file must be the absolute path of a "
                               "JSON credentials file (mode 0600), not %r" % (who, path))
        settings = Settings(
            interface=_choice(who, "interface", o.get("interface", "lanplus"), INTERFACES),
            cipher_suite=_integer(who, "cipher_suite", o.get("cipher_suite", 17), 0, 255),
            privilege=_privilege(who, o.get("privilege")),
            timeout=_integer(who, "timeout", o.get("timeout", 2), 1, 3600),
            retries=_integer(who, "retries", o.get("retries", 1), 1, 100),
            call_timeout=_seconds(who, "call_timeout", o.get("call_timeout", 30)),
            ipmitool=_program(who, o.get("ipmitool", "ipmitool")))
        return cls(settings, path, _bmc_map(who, o.get("bmcs", {}), port),
                   _template(who, o.get("bmc_template")), port,
                   _integer(who, "max_workers", o.get("max_workers", 32), 1, 4096),
                   _choice(who, "power_off", o.get("power_off", "soft"), ("soft", "hard")),
                   _seconds(who, "soft_off_timeout", o.get("soft_off_timeout", 300)),
                   _integer(who, "dcmi_correction_ms", o.get("dcmi_correction_ms", 1000), 0,
                            0xFFFFFFFF),
                   _choice(who, "dcmi_exception_action", o.get("dcmi_exception_action", "log"),
                           tuple(EXCEPTION_ACTIONS)))



# -- option checks ---------------------------------------------------------------
def _integer(who: str, name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BackendError("%s: option %s must be an integer from %d to %d, not %r"
                           % (who, name, low, high, value))
    return value


def _seconds(who: str, name: str, value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and value > 0):
        raise BackendError("%s: option %s must be a number of seconds > 0, not %r"
                           % (who, name, value))
    return float(value)


def _choice(who: str, name: str, value: Any, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise BackendError("%s: option %s must be one of %s, not %r"
                           % (who, name, ", ".join(allowed), value))
    return value


def _privilege(who: str, value: Any) -> Optional[str]:
    if value is None:
        return None
    if value not in PRIVILEGES:
        raise BackendError("%s: option privilege must be one of %s, not %r"
                           % (who, ", ".join(PRIVILEGES), value))
    return value


def _program(who: str, value: Any) -> str:
    if not isinstance(value, str) or not value or value.startswith("-"):
        raise BackendError("%s: option ipmitool must be a program name or path, not %r"
                           % (who, value))
    return value


def _template(who: str, value: Any) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, str) or "{host}" not in value:
        raise BackendError("%s: option bmc_template must be a string containing {host}, "
                           "not %r" % (who, value))
    return value


def _bmc_map(who: str, value: Any, default_port: int) -> Dict[str, Tuple[str, int]]:
    if not isinstance(value, Mapping):
        raise BackendError("%s: option bmcs must map host names to \"address[:port]\", not %r"
                           % (who, value))
    return {host: _address(who, host, text, default_port) for host, text in value.items()}


def _address(who: str, host: Any, text: Any, default_port: int) -> Tuple[str, int]:
    """(address, port) from ``address``, ``address:port`` or ``[v6]:port``."""
    bad = BackendError("%s: option bmcs[%r] must be \"address\" or \"address:port\", not %r"
                       % (who, host, text))
    if not isinstance(host, str) or not isinstance(text, str) or not text:
        raise bad
    address, port = text, default_port
    match = re.match(r"^\[([0-9A-Fa-f:.%]+)\](?::(\d+))?$", text)
    if match:
        address, port = match.group(1), int(match.group(2) or default_port)
    elif text.count(":") == 1:
        address, _, digits = text.partition(":")
        if not digits.isdigit():
            raise bad
        port = int(digits)
    if not ADDRESS.match(address) or address.startswith("-") or not 1 <= port <= 65535:
        raise bad
    return address, port
