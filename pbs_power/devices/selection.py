"""Which device backends the device controller gets, from the device options.

``device_options`` (``job_policies.device_options`` in the hook config, or
``--device-option`` on the command line) holds the controller's own
``max_workers`` and ``timeout_seconds`` and, under any other key, the options
of one device backend: ``{"simulated": {...}, "command": {"argv": [...]},
"bmc-rack2": {"type": "redfish", ...}}``. A key that is not a backend type
names an instance of the backend its ``type`` gives. A topology device spec's
``backend`` names one of these keys, so every node group (the entities of a
device spec) reaches its own backend with its own options. Only configured
backends are built, plus ``simulated``, the default, which costs nothing;
backend modules are imported only then, so their dependencies stay optional.
"""
from __future__ import annotations

import importlib
from typing import Any, Dict, Mapping, Optional, Tuple, Type

from .errors import BackendError
from .controller import DEFAULT_BACKEND, DeviceBackend

#: device_options keys that configure the controller, not a backend.
CONTROLLER_OPTIONS = ("max_workers", "timeout_seconds")


def backend_entries(device_options: Optional[Mapping[str, Any]]
                    ) -> Dict[str, Tuple[str, Dict[str, Any]]]:
    """Backend name -> (type, options without ``type``); BackendError for a bad entry."""
    from pbs_power.config.backends import DEVICE_BACKENDS
    options = dict(device_options or {})
    out: Dict[str, Tuple[str, Dict[str, Any]]] = {}
    for name, given in options.items():
        if name in CONTROLLER_OPTIONS:
            continue
        if not isinstance(given, Mapping):
            raise BackendError("device options %r must be an object of backend options, not %r"
                               % (name, given))
        spec = dict(given)
        kind = spec.pop("type", name)
        if kind not in DEVICE_BACKENDS:
            raise BackendError("device options %r: no device backend type %r (known: %s)"
                               % (name, kind, ", ".join(sorted(DEVICE_BACKENDS))))
        out[name] = (kind, spec)
    out.setdefault(DEFAULT_BACKEND, (DEFAULT_BACKEND, {}))
    return out


def device_backend_class(kind: str) -> Type[DeviceBackend]:
    """The class of device backend type ``kind``, its module imported now."""
    from pbs_power.config.backends import DEVICE_BACKENDS
    if kind not in DEVICE_BACKENDS:
        raise BackendError("no device backend type %r (known: %s)"
                           % (kind, ", ".join(sorted(DEVICE_BACKENDS))))
    module_name, class_name = DEVICE_BACKENDS[kind]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise BackendError("device backend %r is not available in this version"
                               % kind) from None
        raise BackendError("device backend %r cannot be loaded: %s" % (kind, exc)) from None
    if class_name:
        return getattr(module, class_name)
    found = list({obj for obj in vars(module).values()
                  if isinstance(obj, type) and issubclass(obj, DeviceBackend)
                  and getattr(obj, "name", "") == kind})
    if len(found) != 1:
        raise BackendError("device backend %r: module %s defines %d DeviceBackend classes "
                           "named %r (expected one)" % (kind, module_name, len(found), kind))
    return found[0]


def build_device_backend(kind: str, options: Mapping[str, Any]) -> DeviceBackend:
    """One device backend of type ``kind`` from its options."""
    cls = device_backend_class(kind)
    factory = getattr(cls, "from_options", None)
    try:
        return factory(dict(options)) if callable(factory) else cls(**dict(options))
    except TypeError as exc:  # cls(**options) with an option it does not take
        raise BackendError("device backend %r: bad options: %s" % (kind, exc)) from None


def build_device_backends(device_options: Optional[Mapping[str, Any]]
                          ) -> Dict[str, DeviceBackend]:
    """Every configured device backend by name; closes those built if one fails."""
    built: Dict[str, DeviceBackend] = {}
    try:
        for name, (kind, options) in backend_entries(device_options).items():
            try:
                built[name] = build_device_backend(kind, options)
            except BackendError as exc:
                raise BackendError("device options %r: %s" % (name, exc)
                                   if name != kind else str(exc)) from None
    except BaseException:
        for backend in built.values():
            backend.close()
        raise
    return built
