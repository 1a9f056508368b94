"""Options of the redfish backends, and which BMC answers for which host.

Options (all but one of ``bmcs``/``url_template`` optional):

* ``bmcs``: hostlist expression -> BMC URL (``https://10.1.0.12``; ``{host}``
  in it is replaced by the host name) or an object ``{"url", "system_id",
  "chassis_id", "ca_file", "verify"}`` for that BMC;
* ``url_template``: the URL of hosts not in ``bmcs``, e.g. ``https://{host}-bmc``;
* ``system_id`` / ``chassis_id``: the ComputerSystem / Chassis id at every BMC
  (``{host}`` allowed; an id may be nested, ``RackMount/Baseboard``); left
  out, the BMC's only system is used, and each of the system's
  ``Links.Chassis`` in turn;
* ``credentials_file`` (see `credentials`), ``auth``: ``basic`` (default),
  ``session`` (Redfish SessionService) or ``none``;
* ``verify`` (default true) and ``ca_file`` (a CA bundle to trust instead of
  the system's); ``allow_http`` (default false: plain-http BMC URLs are refused);
* ``timeout_seconds`` (10, per HTTP attempt), ``retries`` (2), ``backoff_seconds`` (0.5);
* ``off_mode``: ``GracefulShutdown`` (default) or ``ForceOff``;
  ``graceful_timeout_seconds`` (300): then ForceOff; ``poll_seconds`` (2);
* ``cap_out_of_range``: ``clamp`` (default: into the allowed range, and say
  so) or ``refuse`` (change nothing, fail); ``cap_resource``: ``auto``
  (EnvironmentMetrics if the chassis offers it, else Power, else a Power
  member of Controls), ``EnvironmentMetrics``, ``PowerControl`` or ``Controls``;
* ``max_workers`` (32): hosts handled at once by the power backend.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Union

from pbs_power.config.checks import host_template_problem
from pbs_power.devices.base import BackendError
from .client import base_url

OFF_MODES = ("GracefulShutdown", "ForceOff")
AUTH_MODES = ("basic", "session", "none")
CAP_MODES = ("clamp", "refuse")
CAP_RESOURCES = ("auto", "EnvironmentMetrics", "PowerControl", "Controls")
BMC_KEYS = ("url", "system_id", "chassis_id", "ca_file", "verify")
KNOWN = ("bmcs", "url_template", "system_id", "chassis_id", "credentials_file", "auth",
         "verify", "ca_file", "allow_http", "timeout_seconds", "retries", "backoff_seconds",
         "off_mode", "graceful_timeout_seconds", "poll_seconds", "cap_out_of_range",
         "cap_resource", "max_workers")


@dataclass(frozen=True)
class Bmc:
    """Where one host's BMC is and how to trust it."""

    host: str
    url: str
    system_id: Optional[str]
    chassis_id: Optional[str]
    verify: Union[bool, str]


@dataclass(frozen=True)
class RedfishOptions:
    """The parsed options (see the module doc)."""

    bmcs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    url_template: Optional[str] = None
    system_id: Optional[str] = None
    chassis_id: Optional[str] = None
    credentials_file: Optional[str] = None
    auth: str = "basic"
    verify: bool = True
    ca_file: Optional[str] = None
    allow_http: bool = False
    timeout_seconds: float = 10.0
    retries: int = 2
    backoff_seconds: float = 0.5
    off_mode: str = "GracefulShutdown"
    graceful_timeout_seconds: float = 300.0
    poll_seconds: float = 2.0
    cap_out_of_range: str = "clamp"
    cap_resource: str = "auto"
    max_workers: int = 32
    who: str = "redfish"

    @classmethod
    def parse(cls, options: Optional[Mapping[str, Any]], who: str = "redfish") -> "RedfishOptions":
        """Check every option; BackendError names the first bad one."""
        options = dict(options or {})
        err = _Errors(who)
        unknown = sorted(set(options) - set(KNOWN), key=str)
        if unknown:
            raise err("unknown option(s) %s (known: %s)"
                      % (", ".join(map(repr, unknown)), ", ".join(KNOWN)))
        values: Dict[str, Any] = {"who": who}
        for name in ("url_template", "system_id", "chassis_id", "credentials_file", "ca_file"):
            if options.get(name) is not None:
                values[name] = err.text(name, options[name])
        for name, choices in (("auth", AUTH_MODES), ("off_mode", OFF_MODES),
                              ("cap_out_of_range", CAP_MODES), ("cap_resource", CAP_RESOURCES)):
            if name in options:
                if options[name] not in choices:
                    raise err("option %s must be one of %s, not %r"
                              % (name, ", ".join(choices), options[name]))
                values[name] = options[name]
        for name in ("verify", "allow_http"):
            if name in options:
                values[name] = err.flag(name, options[name])
        for name, positive in (("timeout_seconds", True), ("backoff_seconds", False),
                               ("graceful_timeout_seconds", False), ("poll_seconds", True)):
            if name in options:
                values[name] = err.number(name, options[name], positive)
        for name, low in (("retries", 0), ("max_workers", 1)):
            if name in options:
                values[name] = err.integer(name, options[name], low)
        bmcs = _expand_bmcs(options.get("bmcs", {}), err)
        parsed = cls(**dict(values, bmcs=bmcs))
        if not bmcs and parsed.url_template is None:
            raise err("give the BMC of each host: option bmcs (host -> URL) or url_template")
        if parsed.auth != "none" and parsed.credentials_file is None:
            raise err("option credentials_file is required with auth %r (or set auth "
                      "\"none\")" % parsed.auth)
        for ca in [parsed.ca_file] + [b.get("ca_file") for b in bmcs.values()]:
            if ca is not None and not os.access(ca, os.R_OK):
                raise err("ca_file %s cannot be read" % ca)
        if parsed.url_template is not None:
            err.template("url_template", parsed.url_template)
        return parsed

    def bmc_of(self, host: str) -> Bmc:
        """The BMC of ``host``; BackendError when neither bmcs nor url_template names one."""
        entry = self.bmcs.get(host)
        if entry is None and self.url_template is None:
            raise BackendError("%s: no BMC configured for host %s (add it to bmcs, or set "
                               "url_template)" % (self.who, host))
        entry = entry or {"url": self.url_template}
        url = entry["url"].format(host=host)
        try:
            url = base_url(url)
        except ValueError as exc:
            raise BackendError("%s: host %s: BMC URL %s" % (self.who, host, exc)) from None
        if url.startswith("http://") and not self.allow_http:
            raise BackendError("%s: host %s: BMC URL %s is plain http (credentials would "
                               "travel in clear); use https, or set allow_http true"
                               % (self.who, host, url))
        return Bmc(host, url, _fmt(entry.get("system_id", self.system_id), host),
                   _fmt(entry.get("chassis_id", self.chassis_id), host),
                   self._verify(entry))

    def _verify(self, entry: Mapping[str, Any]) -> Union[bool, str]:
        """What requests' ``verify=`` gets: a CA file, True, or False."""
        verify = entry.get("verify", self.verify)
        if not verify:
            return False
        return entry.get("ca_file") or self.ca_file or True


def _fmt(value: Optional[str], host: str) -> Optional[str]:
    return None if value is None else value.format(host=host)


class _Errors:
    """Builds BackendErrors that name the backend and the option."""

    def __init__(self, who: str) -> None:
        self.who = who

    def __call__(self, msg: str) -> BackendError:
        return BackendError("%s: %s" % (self.who, msg))

    def text(self, name: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self("option %s must be a non-empty string, not %r" % (name, value))
        if name in ("system_id", "chassis_id", "url_template"):
            self.template(name, value)
        return value

    def template(self, name: str, value: str) -> None:
        """Only ``{host}`` may appear in braces (the rule `config validate` applies too)."""
        why = host_template_problem(value)
        if why is not None:
            raise self("option %s: %s" % (name, why))

    def flag(self, name: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self("option %s must be true or false, not %r" % (name, value))
        return value

    def number(self, name: str, value: Any, positive: bool) -> float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (ok and math.isfinite(value) and (value > 0 if positive else value >= 0)):
            raise self("option %s must be a finite number of seconds %s, not %r"
                       % (name, "> 0" if positive else ">= 0", value))
        return float(value)

    def integer(self, name: str, value: Any, low: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise self("option %s must be an integer >= %d, not %r" % (name, low, value))
        return value


def _expand_bmcs(value: Any, err: _Errors) -> Dict[str, Dict[str, Any]]:
    """host -> BMC entry, from hostlist expression -> URL or entry."""
    if not isinstance(value, Mapping):
        raise err("option bmcs must map hostlist expressions to BMC URLs or objects")
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException
    from ClusterShell.RangeSet import RangeSetException
    out: Dict[str, Dict[str, Any]] = {}
    for expression, entry in value.items():
        where = "bmcs[%r]" % (expression,)
        entry = {"url": entry} if isinstance(entry, str) else entry
        if not isinstance(entry, Mapping) or not isinstance(entry.get("url"), str):
            raise err("%s must be a URL or an object with url" % where)
        extra = sorted(set(entry) - set(BMC_KEYS), key=str)
        if extra:
            raise err("%s: unknown key(s) %s (known: %s)"
                      % (where, ", ".join(map(repr, extra)), ", ".join(BMC_KEYS)))
        for key in ("url", "system_id", "chassis_id"):
            if entry.get(key) is not None:
                err.text("%s.%s" % (where, key), entry[key])
                err.template("%s.%s" % (where, key), entry[key])
        if "verify" in entry:
            err.flag("%s.verify" % where, entry["verify"])
        try:
            hosts = NodeSet(expression, resolver=RESOLVER_NOGROUP)
        except (NodeSetException, RangeSetException, TypeError) as exc:
            raise err("%s: bad hostlist (%s)" % (where, exc)) from None
        for host in hosts:
            if host in out:
                raise err("%s: host %s is already named by another bmcs entry" % (where, host))
            out[host] = dict(entry)
    return out
