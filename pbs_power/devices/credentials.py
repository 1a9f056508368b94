"""BMC credentials: one JSON file that only its owner may read.

The file holds a default ``{"username": ..., "password": ...}`` and,
optionally, ``"hosts"``: hostlist expression -> ``{"username", "password"}``
overrides (either field may be left out to inherit the default). A host
named by several expressions gets the one that names the fewest hosts
(ties: the first in the file). The file must be a regular file (not a
symbolic link), owned by the user running pbs_power, with mode 0600 or
stricter; anything else is refused with the command that fixes it.
Passwords never appear in a repr, a log line or an error message.
"""
from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, Mapping, Optional, Tuple

from .errors import BackendError

KEYS = ("username", "password")


class CredentialsError(BackendError):
    """The credentials file cannot be used; the message says why and how to fix it."""


@dataclass(frozen=True)
class Credential:
    """A user name and its password (the password is left out of repr)."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class Override:
    """Credentials for the hosts of one hostlist expression."""

    expression: str
    hosts: FrozenSet[str]
    credential: Credential


@dataclass(frozen=True)
class Credentials:
    """What a credentials file says, by host."""

    path: str
    default: Optional[Credential]
    overrides: Tuple[Override, ...] = ()

    def for_host(self, host: str) -> Credential:
        """The credential for ``host``; CredentialsError when the file has none."""
        for override in self.overrides:
            if host in override.hosts:
                return override.credential
        if self.default is None:
            raise CredentialsError("credentials file %s has no entry for host %s: add a "
                                   "default username/password or a \"hosts\" entry naming it"
                                   % (self.path, host))
        return self.default


def load_credentials(path: str) -> Credentials:
    """Read and check ``path`` (see the module doc); CredentialsError says what is wrong."""
    text = read_private_file(path, "credentials file")
    try:
        doc = json.loads(text)
    except ValueError as exc:  # the message names a position, never the content
        raise CredentialsError("credentials file %s is not valid JSON: %s" % (path, exc)) from None
    return parse_credentials(doc, path)


def read_private_file(path: str, what: str) -> str:
    """The text of ``path`` once it passed the owner/mode checks (opened once: no race)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CredentialsError("%s %s is a symbolic link: name the file itself"
                                   % (what, path)) from None
        raise CredentialsError("%s %s: cannot open it (%s)"
                               % (what, path, exc.strerror or exc)) from None
    try:
        check_private(os.fstat(fd), path, what)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read()
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise CredentialsError("%s %s is not UTF-8 text" % (what, path)) from None


def check_private(st: os.stat_result, path: str, what: str) -> None:
    """CredentialsError unless ``st`` is a regular file of ours with mode 0600 or stricter."""
    if not stat.S_ISREG(st.st_mode):
        raise CredentialsError("%s %s is not a regular file" % (what, path))
    me = os.geteuid()
    if st.st_uid != me:
        raise CredentialsError("%s %s is owned by %s, not by %s who runs pbs_power: run "
                               "`chown %s %s` (and `chmod 600 %s`)"
                               % (what, path, _user(st.st_uid), _user(me), _user(me), path, path))
    mode = stat.S_IMODE(st.st_mode)
    if mode & ~0o600:
        why = ("group or others can get at it" if mode & 0o077
               else "it has bits beyond owner read/write")
        raise CredentialsError("%s %s has mode %04o (%s); it must be 0600 or stricter: "
                               "run `chmod 600 %s`" % (what, path, mode, why, path))


def _user(uid: int) -> str:
    try:
        import pwd
        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return "uid %d" % uid


def parse_credentials(doc: Any, path: str) -> Credentials:
    """Credentials from the file's JSON document; CredentialsError names the bad field."""
    if not isinstance(doc, dict):
        raise CredentialsError("credentials file %s must hold a JSON object" % path)
    unknown = sorted(set(doc) - set(KEYS) - {"hosts"})
    if unknown:
        raise CredentialsError("credentials file %s: unknown key(s) %s (known: username, "
                               "password, hosts)" % (path, ", ".join(map(repr, unknown))))
    default = None
    if "username" in doc or "password" in doc:
        default = _credential(doc, None, path, "")
    hosts = doc.get("hosts", {})
    if not isinstance(hosts, dict):
        raise CredentialsError("credentials file %s: \"hosts\" must map hostlist expressions "
                               "to {\"username\", \"password\"}" % path)
    overrides = []
    for position, (expression, entry) in enumerate(hosts.items()):
        where = "hosts[%s]" % json.dumps(expression)
        if not isinstance(entry, dict):
            raise CredentialsError("credentials file %s: %s must be an object with username "
                                   "and/or password" % (path, where))
        extra = sorted(set(entry) - set(KEYS))
        if extra:
            raise CredentialsError("credentials file %s: %s: unknown key(s) %s"
                                   % (path, where, ", ".join(map(repr, extra))))
        names = _expand(expression, path, where)
        overrides.append((len(names), position, Override(expression, names,
                                                         _credential(entry, default, path,
                                                                     where + "."))))
    overrides.sort(key=lambda item: (item[0], item[1]))
    return Credentials(path, default, tuple(o for _n, _p, o in overrides))


def _credential(entry: Mapping[str, Any], default: Optional[Credential], path: str,
                where: str) -> Credential:
    values: Dict[str, str] = {}
    for key in KEYS:
        value = entry.get(key, getattr(default, key) if default else None)
        if not isinstance(value, str) or not value:
            raise CredentialsError("credentials file %s: %s%s must be a non-empty string"
                                   % (path, where, key))
        values[key] = value
    return Credential(values["username"], values["password"])


def _expand(expression: Any, path: str, where: str) -> FrozenSet[str]:
    from ClusterShell.NodeSet import RESOLVER_NOGROUP, NodeSet, NodeSetException
    from ClusterShell.RangeSet import RangeSetException
    try:
        names = frozenset(NodeSet(expression, resolver=RESOLVER_NOGROUP))
    except (NodeSetException, RangeSetException, TypeError) as exc:
        raise CredentialsError("credentials file %s: %s: bad hostlist (%s)"
                               % (path, where, exc)) from None
    if not names:
        raise CredentialsError("credentials file %s: %s names no host" % (path, where))
    return names
