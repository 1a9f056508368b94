"""The one origin a BMC client may talk to: links and redirects are checked against it.

A Redfish service hands out links (``@odata.id``, action targets, ActionInfo,
a session's ``Location``, redirects). A link that names another scheme, host
or port would carry our credentials (Basic auth or the session token) to a
server we were never configured to trust, possibly over plain http. So a
link is resolved against the configured ``scheme://host[:port]`` and
refused unless it stays on it.
"""
from __future__ import annotations

from typing import Tuple
from urllib.parse import urljoin, urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


class OriginError(ValueError):
    """A link or redirect that leaves the configured origin."""


def origin_of(url: str) -> Tuple[str, str, int]:
    """(scheme, host, port) of an absolute URL, the port filled in for http/https."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        raise OriginError("%r has an invalid port" % (url,)) from None
    return scheme, (parts.hostname or "").lower(), port or DEFAULT_PORTS.get(scheme, 0)


def same_origin(url: str, base: str) -> bool:
    """Whether absolute ``url`` is on ``base``'s scheme, host and port."""
    return origin_of(url) == origin_of(base)


def resolve(base: str, link: str) -> str:
    """The absolute URL of ``link`` on ``base``; OriginError if it names another origin."""
    if not isinstance(link, str) or not link:
        raise OriginError("empty link")
    url = urljoin(base.rstrip("/") + "/", link)
    if not same_origin(url, base):
        scheme, host, port = origin_of(url)
        raise OriginError("%s points to %s://%s:%d, not the configured %s; not followed, so "
                          "no credentials leave it" % (link, scheme, host, port, base))
    return url


def path_of(url: str) -> str:
    """The path (and query) of a same-origin absolute URL, for messages and lookups."""
    parts = urlsplit(url)
    return parts.path + ("?" + parts.query if parts.query else "")
