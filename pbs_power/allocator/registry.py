"""The policy registry: which code a ``policy_rule_uri`` runs.

Policies come only from places the admin controls: the built-in ones
(``power-aware``, ``first-fit``) and ``NAME.py`` files in the policy
directory (``--policy-dir``), which win over a built-in of the same name. A
request names a policy, never a path or URL: ``..``, ``/``, absolute paths
and ``scheme://`` are refused. A policy file must be a regular file owned by
root or the server's user and not writable by group or others, since the
server runs its code. ``NAME.json`` next to it may hold default
``settings`` and ``parameters``. The module's class is ``POLICY_CLASS``, else
``AIOSv1PolicyRule``, else its only class with an ``eval`` method. A file is
reloaded when it changes; each rule's ``context`` lives as long as the server.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import re
import stat
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .schema import INVALID_REQUEST, POLICY_ERROR, UNKNOWN_POLICY, AllocatorError

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
BUILTIN: Dict[str, Tuple[str, str]] = {
    "power-aware": ("pbs_power.allocator.policies.power_aware", "PowerAwarePolicy"),
    "first-fit": ("pbs_power.allocator.policies.first_fit", "FirstFitPolicy"),
}


@dataclass(frozen=True)
class PolicyEntry:
    """A loadable policy: its class, default settings and parameters, where it came from."""

    name: str
    cls: Any
    origin: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    parameters: Mapping[str, Any] = field(default_factory=dict)


def check_uri(uri: str, default: str) -> str:
    """The policy name a request's ``policy_rule_uri`` means (empty: ``default``, checked alike)."""
    if uri == "":
        if not default:
            raise AllocatorError(INVALID_REQUEST, "policy_rule_uri is empty and the server has "
                                 "no default policy")
        uri = default
    if "://" in uri or re.match(r"[A-Za-z][A-Za-z0-9+.-]*:", uri):
        raise AllocatorError(INVALID_REQUEST, "policy_rule_uri %r: a URL is not accepted; "
                             "name a policy of the server's registry" % uri)
    if uri.startswith(("/", "~", "\\")) or "/" in uri or "\\" in uri or ".." in uri:
        raise AllocatorError(INVALID_REQUEST, "policy_rule_uri %r: a path is not accepted; "
                             "name a policy of the server's registry" % uri)
    if not NAME_RE.fullmatch(uri):
        raise AllocatorError(INVALID_REQUEST, "policy_rule_uri %r: a policy name has letters, "
                             "digits, '.', '_' and '-' only (128 at most)" % uri)
    return uri


class PolicyRegistry:
    """Resolves policy names to classes; thread-safe; keeps each rule's context."""

    def __init__(self, policy_dir: Optional[str] = None, default: str = "power-aware"):
        self.policy_dir = os.path.abspath(policy_dir) if policy_dir else None
        self.default = default
        self._lock = threading.Lock()
        self._loaded: Dict[str, Tuple[Tuple[int, int, int], PolicyEntry]] = {}
        self._contexts: Dict[str, Dict[str, Any]] = {}

    def names(self) -> List[str]:
        """Every policy a request may name."""
        found = set(BUILTIN)
        if self.policy_dir and os.path.isdir(self.policy_dir):
            found.update(f[:-3] for f in os.listdir(self.policy_dir)
                         if f.endswith(".py") and NAME_RE.fullmatch(f[:-3]))
        return sorted(found)

    def resolve(self, uri: str) -> PolicyEntry:
        """The policy ``uri`` names; AllocatorError when unknown or unloadable."""
        name = check_uri(uri, self.default)
        path = os.path.join(self.policy_dir, name + ".py") if self.policy_dir else None
        if path is not None and os.path.lexists(path):
            return self._from_file(name, path)
        if name in BUILTIN:
            module, cls = BUILTIN[name]
            found = getattr(importlib.import_module(module), cls)
            return PolicyEntry(name, found, "built-in",
                               parameters=dict(getattr(found, "DEFAULT_PARAMETERS", {})))
        raise AllocatorError(UNKNOWN_POLICY, "no policy %r in the registry (known: %s)"
                             % (name, ", ".join(self.names())))

    def context(self, name: str) -> Dict[str, Any]:
        """The context of rule ``name``: the same dict for every run while the server lives."""
        with self._lock:
            return self._contexts.setdefault(name, {})

    def _from_file(self, name: str, path: str) -> PolicyEntry:
        st = _checked_stat(name, path)
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        with self._lock:
            cached = self._loaded.get(name)
            if cached is not None and cached[0] == key:
                return cached[1]
            entry = _load_file(name, path)
            self._loaded[name] = (key, entry)
            return entry


def _checked_stat(name: str, path: str) -> os.stat_result:
    """The policy file's stat, if it is safe to run; AllocatorError says why not."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise AllocatorError(POLICY_ERROR, "policy %s: cannot read %s (%s)"
                             % (name, path, exc.strerror)) from None
    if not stat.S_ISREG(st.st_mode):
        raise AllocatorError(POLICY_ERROR, "policy %s: %s is not a regular file" % (name, path))
    if st.st_mode & 0o022:
        raise AllocatorError(POLICY_ERROR, "policy %s: %s is writable by group or others; "
                             "refused (chmod go-w %s)" % (name, path, path))
    if st.st_uid not in (0, os.getuid()):
        raise AllocatorError(POLICY_ERROR, "policy %s: %s is owned by uid %d, neither root nor "
                             "the server's user; refused" % (name, path, st.st_uid))
    return st


def _load_file(name: str, path: str) -> PolicyEntry:
    """Import ``path`` as a fresh module and find its policy class and defaults."""
    module_name = "pbs_power_policy_" + re.sub(r"[^A-Za-z0-9_]", "_", name)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise AllocatorError(POLICY_ERROR, "policy %s: %s cannot be imported" % (name, path))
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the admin's code: any error is a load failure
        raise AllocatorError(POLICY_ERROR, "policy %s: loading %s failed: %s: %s"
                             % (name, path, type(exc).__name__, exc)) from None
    sys.modules.pop(module_name, None)
    cls = _policy_class(name, path, module)
    settings, parameters = _defaults(name, path[:-3] + ".json")
    return PolicyEntry(name, cls, path, settings, parameters)


def _policy_class(name: str, path: str, module: Any) -> Any:
    cls = getattr(module, "POLICY_CLASS", None) or getattr(module, "AIOSv1PolicyRule", None)
    if cls is None:
        found = [c for _n, c in inspect.getmembers(module, inspect.isclass)
                 if c.__module__ == module.__name__ and callable(getattr(c, "eval", None))]
        if len(found) != 1:
            raise AllocatorError(POLICY_ERROR, "policy %s: %s defines %d classes with an eval "
                                 "method; set POLICY_CLASS to the policy's class"
                                 % (name, path, len(found)))
        cls = found[0]
    if not inspect.isclass(cls) or not callable(getattr(cls, "eval", None)):
        raise AllocatorError(POLICY_ERROR, "policy %s: %s: the policy class has no eval method"
                             % (name, path))
    return cls


def _defaults(name: str, path: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Default settings and parameters from ``NAME.json`` (both empty without one)."""
    if not os.path.exists(path):
        return {}, {}
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise AllocatorError(POLICY_ERROR, "policy %s: defaults %s unusable: %s"
                             % (name, path, exc)) from None
    if not isinstance(doc, dict) or set(doc) - {"settings", "parameters"} or \
            not all(isinstance(doc.get(k, {}), dict) for k in ("settings", "parameters")):
        raise AllocatorError(POLICY_ERROR, "policy %s: defaults %s must be an object with "
                             "\"settings\" and \"parameters\" objects only" % (name, path))
    return dict(doc.get("settings", {})), dict(doc.get("parameters", {}))
