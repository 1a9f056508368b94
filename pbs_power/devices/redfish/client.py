"""One Redfish service (a BMC): its HTTP session, authentication, retries, diagnostics.

`RedfishClient` keeps one ``requests.Session`` per BMC so connections are
reused, and authenticates with HTTP basic auth or a Redfish session
(``POST /redfish/v1/SessionService/Sessions``, then ``X-Auth-Token``; the
session is deleted by `close`). TLS verification is what the options say and
nothing else: ``verify=`` is passed on every call, because requests lets
``REQUESTS_CA_BUNDLE``/``CURL_CA_BUNDLE`` override a Session's own setting,
and the session ignores the environment (``trust_env`` off: no proxy
variables, no ``~/.netrc`` credentials). Only the configured origin is ever
sent a request (see `origin`): a link to another scheme, host or port is
refused, redirects are followed only within the origin, and the session is
deleted only there. An ``ETag`` the BMC gives only as a header is put into
the resource as ``@odata.etag``, for ``If-Match``. Every failure is a `RedfishError`
whose text is one line naming the BMC, the method and path, the HTTP status
and the Redfish error messages (``error.@Message.ExtendedInfo[].Message``).
"""
from __future__ import annotations

import logging
import re
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Union
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.exceptions import InsecureRequestWarning

from pbs_power.devices.credentials import Credential
from .origin import OriginError, resolve

LOG = logging.getLogger(__name__)

SESSIONS_PATH = "/redfish/v1/SessionService/Sessions"
#: Statuses that mean "not done, try again later".
RETRY_STATUSES = (429, 503)
#: Methods that may be sent again after a timeout (the first may have been done).
IDEMPOTENT = ("GET", "PATCH", "DELETE")
MAX_MESSAGE = 300
#: Redirects followed per call (same origin only).
MAX_REDIRECTS = 3
REDIRECTS = (301, 302, 303, 307, 308)


class RedfishError(Exception):
    """A failed Redfish call; ``str()`` is the one-line diagnostic."""

    def __init__(self, message: str, status: Optional[int] = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class ClientSettings:
    """How to reach and authenticate to one BMC."""

    url: str                          # scheme://host[:port], no path
    verify: Union[bool, str]          # True, False, or a CA bundle file
    auth: str = "basic"               # basic | session | none
    credential: Optional[Credential] = None
    credentials_source: str = ""      # where the credential came from, for diagnostics
    timeout: float = 10.0             # seconds per HTTP attempt
    retries: int = 2                  # extra attempts after a retryable failure
    backoff: float = 0.5              # first pause between attempts; doubles each time
    pool_size: int = 32               # connections kept to this BMC


class RedfishClient:
    """Calls one BMC's Redfish API; thread-safe, one per BMC URL."""

    def __init__(self, settings: ClientSettings) -> None:
        self.settings = settings
        self.http = requests.Session()
        self.http.trust_env = False
        self.http.headers.update({"Accept": "application/json", "OData-Version": "4.0"})
        adapter = HTTPAdapter(pool_connections=1, pool_maxsize=max(1, settings.pool_size))
        self.http.mount("https://", adapter)
        self.http.mount("http://", adapter)
        self._lock = threading.Lock()
        self._token: Optional[str] = None
        self._session_uri: Optional[str] = None
        self._closed = False
        #: A rejected login: later calls fail with it instead of trying the BMC again,
        #: so a wrong password does not lock the BMC account out.
        self._auth_failure: Optional[str] = None
        self._auth_ok = False
        self._auth_gate = threading.Lock()
        if settings.verify is False:
            _quiet_unverified(settings.url)

    # -- public calls -----------------------------------------------------------
    def get(self, path: str, deadline: Optional[float] = None) -> Dict[str, Any]:
        """The JSON resource at ``path`` (an object)."""
        doc = self.call("GET", path, None, deadline)
        if not isinstance(doc, dict):
            raise RedfishError("%s: GET %s answered no JSON object" % (self.name, path))
        return doc

    def post(self, path: str, body: Mapping[str, Any],
             deadline: Optional[float] = None) -> Optional[Dict[str, Any]]:
        return self.call("POST", path, body, deadline)

    def patch(self, path: str, body: Mapping[str, Any], deadline: Optional[float] = None,
              etag: Optional[str] = None) -> Optional[Dict[str, Any]]:
        return self.call("PATCH", path, body, deadline, {"If-Match": etag} if etag else None)

    @property
    def name(self) -> str:
        return "redfish %s" % self.settings.url

    def call(self, method: str, path: str, body: Optional[Mapping[str, Any]],
             deadline: Optional[float] = None,
             headers: Optional[Dict[str, str]] = None) -> Optional[Dict[str, Any]]:
        """Send with retries (see RETRY_STATUSES, IDEMPOTENT) until ``deadline`` (monotonic).

        Until the BMC has accepted our credentials once, calls go one at a time,
        so that a wrong password costs one failed login, not one per host.
        """
        if self._auth_ok or self.settings.credential is None:
            return self._call(method, path, body, deadline, headers)
        s = self.settings
        wait = s.timeout * (s.retries + 1) + s.backoff * (2 ** s.retries)
        if deadline is not None:
            wait = min(wait, max(0.0, deadline - time.monotonic()))
        if not self._auth_gate.acquire(timeout=wait):
            raise RedfishError("%s: %s %s: not sent: the BMC's first answer did not come "
                               "within %gs" % (self.name, method, path, round(wait, 1)))
        try:
            return self._call(method, path, body, deadline, headers)
        finally:
            self._auth_gate.release()

    def _call(self, method: str, path: str, body: Optional[Mapping[str, Any]],
              deadline: Optional[float], headers: Optional[Dict[str, str]]
              ) -> Optional[Dict[str, Any]]:
        s = self.settings
        relogged = False
        attempt = 0
        while True:
            self._check_auth(method, path)
            timeout = self._timeout(method, path, deadline)
            try:
                resp = self._send(method, path, body, timeout, headers)
            except requests.RequestException as exc:
                if attempt < s.retries and _may_retry(method, exc) and \
                        self._pause(attempt, deadline):
                    attempt += 1
                    continue
                raise RedfishError(self._transport_diag(method, path, exc, timeout,
                                                        attempt + 1)) from None
            if resp.status_code != 401:
                self._auth_ok = True
            if resp.status_code == 401 and s.auth == "session" and not relogged:
                relogged = True  # the session may have expired: log in again, once
                self._forget_session()
                continue
            if resp.status_code in RETRY_STATUSES and attempt < s.retries and \
                    self._pause(attempt, deadline):
                attempt += 1
                continue
            try:
                return self._decode(method, path, resp)
            except RedfishError as exc:
                if exc.status == 401 and s.credential is not None:
                    self._auth_failure = "HTTP 401: %s%s" % (_error_text(resp),
                                                             self._auth_hint(401))
                raise

    def _check_auth(self, method: str, path: str) -> None:
        """RedfishError when the BMC already rejected our credentials."""
        if self._auth_failure is not None:
            raise RedfishError("%s: %s %s: not sent: the BMC rejected the credentials earlier "
                               "(%s)" % (self.name, method, path, self._auth_failure), 401)

    def close(self) -> None:
        """Delete the Redfish session (if any) and close the connections."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            token, uri = self._token, self._session_uri
            self._token = self._session_uri = None
        if token and uri:
            try:
                self.http.delete(resolve(self.settings.url, uri),
                                 headers={"X-Auth-Token": token},
                                 timeout=min(self.settings.timeout, 5.0),
                                 verify=self.settings.verify, allow_redirects=False)
            except (requests.RequestException, OriginError):
                pass  # the BMC expires it on its own
        self.http.close()

    # -- internals --------------------------------------------------------------
    def _timeout(self, method: str, path: str, deadline: Optional[float]) -> float:
        timeout = self.settings.timeout
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0.05:
                raise RedfishError("%s: %s %s: out of time before it could be sent"
                                   % (self.name, method, path))
            timeout = min(timeout, left)
        return timeout

    def _pause(self, attempt: int, deadline: Optional[float]) -> bool:
        """Sleep before the next attempt; False when that would pass the deadline."""
        delay = self.settings.backoff * (2 ** attempt)
        if deadline is not None and time.monotonic() + delay >= deadline - 0.05:
            return False
        time.sleep(delay)
        return True

    def _send(self, method: str, path: str, body: Optional[Mapping[str, Any]],
              timeout: float, headers: Optional[Dict[str, str]]) -> requests.Response:
        s = self.settings
        extra = dict(headers or {})
        auth = None
        if s.auth == "basic" and s.credential is not None:
            auth = (s.credential.username, s.credential.password)
        elif s.auth == "session":
            extra["X-Auth-Token"] = self._session_token(timeout)
        url = self._url(method, path)
        for _hop in range(MAX_REDIRECTS + 1):
            resp = self.http.request(method, url, json=body, headers=extra, auth=auth,
                                     timeout=timeout, verify=s.verify, allow_redirects=False)
            if resp.status_code not in REDIRECTS or not resp.headers.get("Location"):
                return resp
            target = resp.headers["Location"]
            try:
                url = resolve(url, target)
                resolve(s.url, url)
            except OriginError as exc:
                raise RedfishError("%s: %s %s: redirected, and not followed: %s"
                                   % (self.name, method, path, exc), resp.status_code) from None
            if resp.status_code == 303:
                method, body = "GET", None
        raise RedfishError("%s: %s %s: more than %d redirects" % (self.name, method, path,
                                                                   MAX_REDIRECTS))

    def _url(self, method: str, path: str) -> str:
        """The absolute URL of ``path``; RedfishError when it leaves the configured origin."""
        try:
            return resolve(self.settings.url, path)
        except OriginError as exc:
            raise RedfishError("%s: %s refused: %s" % (self.name, method, exc)) from None

    def _session_token(self, timeout: float) -> str:
        """The current session's token, logging in first when there is none."""
        with self._lock:
            if self._closed:
                raise RedfishError("%s: the client is closed" % self.name)
            self._check_auth("POST", SESSIONS_PATH)
            if self._token is None:
                self._login(timeout)
            return self._token  # type: ignore[return-value]

    def _login(self, timeout: float) -> None:
        s = self.settings
        if s.credential is None:
            raise RedfishError("%s: session authentication needs credentials" % self.name)
        body = {"UserName": s.credential.username, "Password": s.credential.password}
        try:
            resp = self.http.post(self._url("POST", SESSIONS_PATH), json=body, timeout=timeout,
                                  verify=s.verify, allow_redirects=False)
        except requests.RequestException as exc:
            raise RedfishError(self._transport_diag("POST", SESSIONS_PATH, exc, timeout, 1)) \
                from None
        if resp.status_code not in (200, 201) or not resp.headers.get("X-Auth-Token"):
            detail = _error_text(resp) if resp.status_code >= 400 else "no X-Auth-Token"
            error = RedfishError("%s: session login failed: HTTP %d on POST %s: %s%s"
                                 % (self.name, resp.status_code, SESSIONS_PATH, detail,
                                    self._auth_hint(resp.status_code)), resp.status_code)
            if resp.status_code in (400, 401, 403):
                self._auth_failure = "session login: HTTP %d: %s%s" % (
                    resp.status_code, detail, self._auth_hint(resp.status_code))
            raise error
        self._token = resp.headers["X-Auth-Token"]
        self._session_uri = self._session_location(resp)

    def _session_location(self, resp: requests.Response) -> Optional[str]:
        """Where to DELETE the new session: ``Location``, else ``@odata.id``, on our origin."""
        for where in (resp.headers.get("Location"), _odata_id(resp)):
            if not where:
                continue
            try:
                return resolve(self.settings.url, where)
            except OriginError as exc:
                LOG.warning("%s: session location not used: %s", self.name, exc)
        return None

    def _forget_session(self) -> None:
        with self._lock:
            self._token = self._session_uri = None

    def _decode(self, method: str, path: str, resp: requests.Response) -> Optional[Dict]:
        if resp.status_code >= 400:
            raise RedfishError("%s: HTTP %d on %s %s: %s%s"
                               % (self.name, resp.status_code, method, path, _error_text(resp),
                                  self._auth_hint(resp.status_code)), resp.status_code)
        if resp.status_code == 204 or not resp.content:
            return None
        try:
            doc = resp.json()
        except ValueError:
            if method == "GET":
                raise RedfishError("%s: %s %s answered HTTP %d with a body that is not JSON"
                                   % (self.name, method, path, resp.status_code),
                                   resp.status_code) from None
            return None
        etag = resp.headers.get("ETag")
        if method == "GET" and etag and isinstance(doc, dict) and not doc.get("@odata.etag"):
            doc["@odata.etag"] = etag
        return doc

    def _auth_hint(self, status: int) -> str:
        s = self.settings
        if status != 401:
            return ""
        if s.credential is None:
            return " (no credentials configured: set credentials_file)"
        return " (authentication failed for user %r; check %s)" % (
            s.credential.username, s.credentials_source or "the credentials")

    def _transport_diag(self, method: str, path: str, exc: Exception, timeout: float,
                        tries: int) -> str:
        where = "%s: %s %s" % (self.name, method, path)
        after = "" if tries == 1 else " (%d tries)" % tries
        if isinstance(exc, requests.exceptions.SSLError):
            return "%s: TLS failed: %s%s" % (where, _tls_reason(exc, self.settings.url), after)
        if isinstance(exc, requests.exceptions.ConnectTimeout):
            return "%s: cannot connect within %gs%s" % (where, round(timeout, 1), after)
        if isinstance(exc, requests.exceptions.Timeout):
            return "%s: no answer within %gs%s" % (where, round(timeout, 1), after)
        if isinstance(exc, requests.exceptions.ConnectionError):
            return "%s: cannot connect (%s)%s" % (where, _root_reason(exc), after)
        return "%s: %s: %s%s" % (where, type(exc).__name__, _one_line(str(exc)), after)


def _may_retry(method: str, exc: Exception) -> bool:
    """Whether sending again is safe and may help."""
    if isinstance(exc, requests.exceptions.SSLError):
        return False  # a certificate problem does not go away
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return True   # nothing reached the BMC
    if isinstance(exc, requests.exceptions.ConnectionError) and "NewConnectionError" in repr(exc):
        return True   # refused: nothing reached the BMC
    return method in IDEMPOTENT and isinstance(exc, (requests.exceptions.Timeout,
                                                     requests.exceptions.ConnectionError))


def _tls_reason(exc: Exception, url: str) -> str:
    """Why TLS failed, with the advice that fits: a wrong name is not a CA problem."""
    text = str(exc)
    host = urlsplit(url).hostname or url
    if "mismatch" in text or "doesn't match" in text or "not valid for" in text:
        return ("certificate does not name %s (hostname mismatch); put the name or address "
                "the certificate was issued for in the BMC URL" % host)
    found = re.search(r"certificate verify failed: ([^(\]]+)", text)
    if found:
        return ("certificate not trusted (%s); give the BMC's CA certificate in ca_file, or "
                "set verify false" % found.group(1).strip().strip("'\"").rstrip(",."))
    return _root_reason(exc)


_QUIETED: set = set()


def _quiet_unverified(url: str) -> None:
    """One log line instead of urllib3's warning on every request to ``url``'s host."""
    host = urlsplit(url).hostname or ""
    warnings.filterwarnings("ignore", message=r"Unverified HTTPS request is being made to "
                            r"host '%s'" % re.escape(host), category=InsecureRequestWarning)
    if host not in _QUIETED:
        _QUIETED.add(host)
        LOG.warning("redfish %s: TLS certificate not verified (verify false)", url)


def _root_reason(exc: Exception) -> str:
    """The innermost readable reason of a requests/urllib3 error."""
    text = str(exc)
    for pattern in (r"\[Errno -?\d+\] ([^'\")\]]+)", r"\[SSL: [A-Z_]+\] ([^(']+)",
                    r"Caused by \w+\(['\"]?(.*?)['\"]?\)\)?$"):
        found = re.search(pattern, text)
        if found:
            return _one_line(found.group(1).strip().rstrip(",."))
    return _one_line(text)


def _odata_id(resp: requests.Response) -> Optional[str]:
    try:
        doc = resp.json()
    except ValueError:
        return None
    return doc.get("@odata.id") if isinstance(doc, dict) else None


def _error_text(resp: requests.Response) -> str:
    """The Redfish error messages of an error response, on one line."""
    try:
        doc = resp.json()
    except ValueError:
        return _one_line(resp.text) or resp.reason or "no message"
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict):
        return _one_line(str(doc)) if doc else (resp.reason or "no message")
    infos = err.get("@Message.ExtendedInfo")
    messages = [i.get("Message") for i in infos or [] if isinstance(i, dict)] \
        if isinstance(infos, list) else []
    messages = [str(m) for m in messages if m]
    if messages:
        return _one_line("; ".join(messages))
    return _one_line(str(err.get("message") or err.get("code") or resp.reason or "no message"))


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."


def base_url(url: str) -> str:
    """``scheme://host[:port]`` of ``url``; ValueError when it is not http(s) with a host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError("%r is not an http:// or https:// URL with a host" % (url,))
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError("%r: give the BMC's address only (scheme://host[:port]), no path"
                         % (url,))
    return "%s://%s" % (parts.scheme, parts.netloc)
