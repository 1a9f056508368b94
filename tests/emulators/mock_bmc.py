"""A mock BMC that serves a captured Redfish service tree the way real BMCs do.

`MockBmc` serves one folder of ``../shared/redfish-mockups`` (or any folder
laid out the same way: ``index.json`` is ``/redfish/v1``, every other
resource sits at its ``@odata.id`` path below it) on 127.0.0.1, plain HTTP
or TLS, from a thread of the test process. It enforces what real BMCs
enforce, so that a client that only works against a lenient emulator fails:

* GET by ``@odata.id`` (a trailing slash is the same resource); a path
  segment sent as ``%2F`` is one segment, as on real BMCs, so it is 404;
  a captured 404 body is answered with 404; ``ETag`` header when the
  resource has an ``@odata.etag`` (or only the header: ``etag_in_body=False``);
* authentication on everything but the service root: HTTP basic, or a
  Redfish session (POST to the Sessions collection, ``X-Auth-Token``,
  ``Location``; DELETE ends it);
* ``ComputerSystem.Reset``: a ``ResetType`` not in the action's inline
  ``AllowableValues`` or its ``@Redfish.ActionInfo`` is refused (400,
  ActionParameterNotSupported); an accepted one changes ``PowerState``.
  HPE iLO trees answer 200 with iLO's "success" body, the others 204;
* PATCH with Redfish merge rules on the power-limit properties the DMTF
  schemas make writable (``SetPoint``/``ControlMode`` of a Control and of
  ``EnvironmentMetrics.PowerLimitWatts``; ``PowerControl[].PowerLimit``'s
  ``LimitInWatts``, ``LimitException``, ``CorrectionInMs``): any other
  property is refused (400, PropertyUnknown or PropertyNotWritable), a
  SetPoint outside ``AllowableMin/Max`` or ``SettingRangeMin/Max`` too (400,
  PropertyValueOutOfRange); ``If-Match`` is honoured where the resource has
  an ETag (412 on a stale one; 428 without one when ``require_if_match``);
* every request is recorded (`requests`), and test code may edit a
  resource (`docs`) or redirect a path elsewhere (`redirects`).
"""
from __future__ import annotations

import base64
import copy
import json
import os
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import unquote, urlsplit

ROOT = "/redfish/v1"
#: The shared trees: ../shared/redfish-mockups beside the repository (or $REDFISH_MOCKUPS).
MOCKUPS = os.environ.get("REDFISH_MOCKUPS") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "shared", "redfish-mockups")
#: ResetType -> the PowerState it leaves (None: unchanged).
RESET_RESULT = {"On": "On", "ForceOn": "On", "ForceOff": "Off", "GracefulShutdown": "Off",
                "Off": "Off", "ForceRestart": "On", "GracefulRestart": "On",
                "PowerCycle": "On", "Nmi": None, "PushPowerButton": "toggle", "Pause": None,
                "Resume": None, "Suspend": None, "FullPowerCycle": "On"}
CONTROL_MODES = ("Automatic", "Override", "Manual", "Disabled")
LIMIT_EXCEPTIONS = ("NoAction", "HardPowerOff", "LogEventOnly", "Oem")


def mockup_dir(name: str) -> str:
    """The folder of the shared tree ``name``."""
    return os.path.normpath(os.path.join(MOCKUPS, name))


def mockup_names() -> List[str]:
    """Every tree in the shared folder, sorted (empty when the folder is absent)."""
    if not os.path.isdir(MOCKUPS):
        return []
    return sorted(d for d in os.listdir(MOCKUPS)
                  if os.path.isfile(os.path.join(MOCKUPS, d, "index.json")))


def key(path: str) -> Tuple[str, ...]:
    """A path's segments, each percent-decoded on its own (``%2F`` stays inside one)."""
    return tuple(unquote(s) for s in urlsplit(path).path.split("/") if s)


def error_body(message_id: str, message: str) -> Dict[str, Any]:
    """A Redfish error answer with one ``@Message.ExtendedInfo`` entry."""
    return {"error": {"code": "Base.1.8." + message_id, "message": message,
                      "@Message.ExtendedInfo": [{"MessageId": "Base.1.8." + message_id,
                                                 "Message": message, "Severity": "Warning"}]}}


@dataclass
class Seen:
    """One request as the BMC received it."""

    method: str
    path: str
    headers: Dict[str, str]
    body: Any = None


@dataclass
class Reply:
    status: int
    doc: Any = None
    headers: Dict[str, str] = field(default_factory=dict)


class MockBmc:
    """One captured BMC served on 127.0.0.1 (see the module doc)."""

    def __init__(self, tree: str, users: Optional[Mapping[str, str]] = None,
                 tls: Any = None, etag_in_body: bool = True,
                 require_if_match: bool = False, ignore_graceful: bool = False) -> None:
        self.tree = tree
        self.name = os.path.basename(os.path.normpath(tree))
        self.users = dict(users if users is not None else {"admin": "pw"})
        self.tls = tls
        self.etag_in_body = etag_in_body
        self.require_if_match = require_if_match
        self.ignore_graceful = ignore_graceful
        self.docs: Dict[Tuple[str, ...], Dict[str, Any]] = {}
        self.missing: Dict[Tuple[str, ...], Dict[str, Any]] = {}
        self.redirects: Dict[Tuple[str, ...], str] = {}
        self.sessions: Dict[str, str] = {}     # token -> session path
        self.deleted_sessions: List[str] = []
        self.requests: List[Seen] = []
        self.resets: List[Tuple[str, str]] = []  # (system path, ResetType) accepted
        self._lock = threading.Lock()
        self._version = 0
        self._load(tree)
        self.server: Optional[ThreadingHTTPServer] = None

    # -- the tree -------------------------------------------------------------------
    def _load(self, tree: str) -> None:
        for folder, _dirs, files in os.walk(tree):
            if "index.json" not in files:
                continue
            with open(os.path.join(folder, "index.json")) as f:
                doc = json.load(f)
            rel = os.path.relpath(folder, tree)
            where = ROOT if rel == "." else ROOT + "/" + rel.replace(os.sep, "/")
            if isinstance(doc, dict) and "error" in doc and "@odata.id" not in doc:
                self.missing[key(where)] = doc  # captured as a 404
                continue
            ident = doc.get("@odata.id") if isinstance(doc, dict) else None
            self.docs[key(ident or where)] = doc

    def doc(self, path: str) -> Dict[str, Any]:
        """The live resource at ``path`` (KeyError when there is none)."""
        return self.docs[key(path)]

    @property
    def url(self) -> str:
        if self.server is None:
            raise RuntimeError("not started")
        scheme = "https" if self.tls is not None else "http"
        return "%s://127.0.0.1:%d" % (scheme, self.server.server_address[1])

    def systems(self) -> List[str]:
        """The ``@odata.id`` of every ComputerSystem in the Systems collection."""
        root = self.doc(ROOT)
        members = self.doc(root["Systems"]["@odata.id"]).get("Members") or []
        return [m["@odata.id"] for m in members]

    def power_state(self, system: str) -> str:
        return self.doc(system).get("PowerState", "")

    # -- serving --------------------------------------------------------------------
    def start(self) -> "MockBmc":
        bmc = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = ValueError
                reply = bmc.handle(self.command, self.path, dict(self.headers.items()), body)
                data = b"" if reply.doc is None else json.dumps(reply.doc).encode()
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                if data:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if self.tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(self.tls.cert_file, self.tls.key_file)
            self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def handle(self, method: str, raw_path: str, headers: Dict[str, str], body: Any) -> Reply:
        """The answer to one request (thread-safe)."""
        with self._lock:
            self.requests.append(Seen(method, raw_path, headers, body))
            path = key(raw_path)
            if path in self.redirects:
                return Reply(302, None, {"Location": self.redirects[path]})
            if method == "GET" and path in (("redfish",), key(ROOT)):
                return self._get(path)
            sessions = self._sessions_path()
            if method == "POST" and sessions is not None and path == sessions:
                return self._login(body)
            who = self._authenticated(headers)
            if who is None:
                return Reply(401, error_body("NoValidSession", "Authentication required."),
                             {"WWW-Authenticate": 'Basic realm="BMC"'})
            if body is ValueError:
                return Reply(400, error_body("MalformedJSON", "The request body is not JSON."))
            if method == "GET":
                return self._get(path)
            if method == "DELETE" and sessions is not None and path[:-1] == sessions:
                return self._logout(path, headers)
            if method == "POST":
                return self._action(path, body)
            if method == "PATCH":
                return self._patch(path, headers, body)
            return Reply(405, error_body("OperationNotAllowed", "%s is not allowed here." % method))

    def _get(self, path: Tuple[str, ...]) -> Reply:
        if path == ("redfish",):
            return Reply(200, {"v1": ROOT + "/"})
        doc = self.docs.get(path)
        if doc is None:
            return Reply(404, self.missing.get(path) or error_body(
                "ResourceMissingAtURI", "The resource at the URI /%s was not found."
                % "/".join(path)))
        out = copy.deepcopy(doc)
        headers = {}
        etag = doc.get("@odata.etag")
        if etag:
            headers["ETag"] = etag
            if not self.etag_in_body:
                out.pop("@odata.etag")
        return Reply(200, out, headers)

    # -- authentication ---------------------------------------------------------------
    def _sessions_path(self) -> Optional[Tuple[str, ...]]:
        service = self.docs.get(key(ROOT + "/SessionService"))
        link = (service or {}).get("Sessions") or {}
        return key(link["@odata.id"]) if "@odata.id" in link else None

    def _authenticated(self, headers: Mapping[str, str]) -> Optional[str]:
        lower = {k.lower(): v for k, v in headers.items()}
        token = lower.get("x-auth-token")
        if token:
            return token if token in self.sessions else None
        auth = lower.get("authorization", "")
        if not auth.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(auth[6:]).decode().partition(":")
        except ValueError:
            return None
        return user if self.users.get(user) == password else None

    def _login(self, body: Any) -> Reply:
        if not isinstance(body, dict) or self.users.get(body.get("UserName")) != body.get(
                "Password") or body.get("UserName") is None:
            return Reply(401, error_body("NoValidSession", "Invalid username or password."))
        self._version += 1
        token = "tok%d-%s" % (self._version, base64.b16encode(os.urandom(8)).decode())
        where = "/" + "/".join(self._sessions_path() + ("s%d" % self._version,))
        self.sessions[token] = where
        doc = {"@odata.id": where, "Id": "s%d" % self._version, "UserName": body["UserName"]}
        return Reply(201, doc, {"X-Auth-Token": token, "Location": where})

    def _logout(self, path: Tuple[str, ...], headers: Mapping[str, str]) -> Reply:
        lower = {k.lower(): v for k, v in headers.items()}
        token = lower.get("x-auth-token")
        for tok, where in list(self.sessions.items()):
            if key(where) == path and (token is None or tok == token):
                del self.sessions[tok]
                self.deleted_sessions.append(where)
                return Reply(204)
        return Reply(404, error_body("ResourceMissingAtURI", "No such session."))

    # -- actions ----------------------------------------------------------------------
    def _action(self, path: Tuple[str, ...], body: Any) -> Reply:
        for doc in self.docs.values():
            action = (doc.get("Actions") or {}).get("#ComputerSystem.Reset") \
                if isinstance(doc, dict) else None
            if isinstance(action, dict) and key(action.get("target", "")) == path:
                return self._reset(doc, action, body)
        return Reply(405 if path in self.docs else 404,
                     error_body("ActionNotSupported", "No action at /%s." % "/".join(path)))

    def _allowed_resets(self, action: Mapping[str, Any]) -> Optional[List[str]]:
        inline = action.get("ResetType@Redfish.AllowableValues")
        if isinstance(inline, list):
            return inline
        info = self.docs.get(key(action.get("@Redfish.ActionInfo", "") or "/-"))
        for param in (info or {}).get("Parameters") or []:
            if param.get("Name") == "ResetType" and isinstance(param.get("AllowableValues"),
                                                              list):
                return param["AllowableValues"]
        return None

    def _reset(self, system: Dict[str, Any], action: Mapping[str, Any], body: Any) -> Reply:
        kind = body.get("ResetType") if isinstance(body, dict) else None
        if not isinstance(kind, str):
            return Reply(400, error_body("ActionParameterMissing",
                                         "The action requires the parameter ResetType."))
        allowed = self._allowed_resets(action)
        if kind not in RESET_RESULT or (allowed is not None and kind not in allowed):
            return Reply(400, error_body(
                "ActionParameterNotSupported", "The parameter ResetType with the value %s is "
                "not supported by the action ComputerSystem.Reset." % kind))
        self.resets.append((system["@odata.id"], kind))
        after = RESET_RESULT[kind]
        if after == "toggle":
            after = "Off" if system.get("PowerState") == "On" else "On"
        if after is not None and not (kind == "GracefulShutdown" and self.ignore_graceful):
            system["PowerState"] = after
            self._bump(system)
        if self.name.startswith("hpe-ilo"):  # iLO: 200 with a "success" message body
            return Reply(200, {"error": {"code": "iLO.0.10.ExtendedInfo", "message":
                                         "See @Message.ExtendedInfo for more information.",
                                         "@Message.ExtendedInfo": [
                                             {"MessageId": "Base.1.4.Success"}]}})
        return Reply(204)

    def _bump(self, doc: Dict[str, Any]) -> None:
        if "@odata.etag" in doc:
            self._version += 1
            doc["@odata.etag"] = 'W/"%08X"' % (0x10000000 + self._version)

    # -- PATCH ------------------------------------------------------------------------
    def _patch(self, path: Tuple[str, ...], headers: Mapping[str, str], body: Any) -> Reply:
        doc = self.docs.get(path)
        if doc is None:
            return self._get(path)
        if not isinstance(body, dict) or not body:
            return Reply(400, error_body("MalformedJSON", "PATCH needs a JSON object."))
        lower = {k.lower(): v for k, v in headers.items()}
        etag = doc.get("@odata.etag")
        if etag and "if-match" in lower and lower["if-match"] not in (etag, "*"):
            return Reply(412, error_body("PreconditionFailed", "The ETag %s does not match."
                                         % lower["if-match"]))
        if etag and self.require_if_match and "if-match" not in lower:
            return Reply(428, error_body("PreconditionRequired",
                                         "This resource needs If-Match."))
        work = copy.deepcopy(doc)
        problem = _merge(work, body, _writable(doc), ())
        if problem is not None:
            return Reply(400, problem)
        doc.clear()
        doc.update(work)
        self._bump(doc)
        self._mirror(doc)
        return Reply(204)

    def _mirror(self, doc: Dict[str, Any]) -> None:
        """Keep EnvironmentMetrics.PowerLimitWatts and the Control it excerpts in step."""
        excerpt = doc.get("PowerLimitWatts")
        if isinstance(excerpt, dict) and excerpt.get("DataSourceUri"):
            control = self.docs.get(key(excerpt["DataSourceUri"]))
            if control is not None:
                for prop in ("SetPoint", "ControlMode"):
                    if prop in excerpt:
                        control[prop] = excerpt[prop]
            return
        if doc.get("ControlType") == "Power":
            for other in self.docs.values():
                ex = other.get("PowerLimitWatts") if isinstance(other, dict) else None
                if isinstance(ex, dict) and key(ex.get("DataSourceUri", "/-")) == key(
                        doc["@odata.id"]):
                    for prop in ("SetPoint", "ControlMode"):
                        if prop in doc:
                            ex[prop] = doc[prop]


def _writable(doc: Mapping[str, Any]) -> Dict[str, Any]:
    """Which properties of ``doc`` the DMTF schemas let a client write (nested)."""
    limit_props = {"LimitInWatts": "watts", "LimitException": LIMIT_EXCEPTIONS,
                   "CorrectionInMs": "int"}
    control = {"SetPoint": "setpoint", "ControlMode": CONTROL_MODES}
    if doc.get("ControlType") is not None or "#Control." in str(doc.get("@odata.type")):
        return control
    out: Dict[str, Any] = {}
    if "PowerLimitWatts" in doc:
        out["PowerLimitWatts"] = control
    if "PowerControl" in doc:
        out["PowerControl"] = [{"PowerLimit": limit_props}]
    return out


def _merge(target: Dict[str, Any], patch: Mapping[str, Any], rules: Any,
           where: Tuple[str, ...]) -> Optional[Dict[str, Any]]:
    """Apply ``patch`` to ``target`` in place; an error body when a property is refused."""
    for name, value in patch.items():
        here = "/".join(where + (name,))
        rule = rules.get(name) if isinstance(rules, dict) else None
        if rule is None:
            known = name in target
            return error_body("PropertyNotWritable" if known else "PropertyUnknown",
                              "The property %s is %s." % (here, "a read only property"
                                                          if known else "not in the resource"))
        if isinstance(rule, list):
            current = target.get(name)
            if not isinstance(value, list) or not isinstance(current, list) \
                    or len(value) > len(current):
                return error_body("PropertyValueFormatError", "The value for %s must be an "
                                  "array of at most %d members." % (here, len(current or [])))
            for i, item in enumerate(value):
                if item == {}:
                    continue
                if not isinstance(item, dict):
                    return error_body("PropertyValueFormatError", "%s/%d must be an object."
                                      % (here, i))
                problem = _merge(current[i], item, rule[0], where + (name, str(i)))
                if problem is not None:
                    return problem
        elif isinstance(rule, dict):
            if not isinstance(value, dict):
                return error_body("PropertyValueTypeError", "%s must be an object." % here)
            sub = target.setdefault(name, {})
            problem = _merge(sub, value, rule, where + (name,))
            if problem is not None:
                return problem
        else:
            problem = _check_value(target, name, value, rule, here)
            if problem is not None:
                return problem
            target[name] = value
    return None


def _check_value(target: Mapping[str, Any], name: str, value: Any, rule: Any,
                 here: str) -> Optional[Dict[str, Any]]:
    if isinstance(rule, tuple):
        if value not in rule:
            return error_body("PropertyValueNotInList", "The value %r for %s is not in the "
                              "list of acceptable values." % (value, here))
        return None
    if value is None and rule in ("watts", "setpoint"):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            rule == "int" and not isinstance(value, int)):
        return error_body("PropertyValueTypeError", "The value %r for %s is of a different "
                          "type than the property can accept." % (value, here))
    if rule == "setpoint":
        for low_key, high_key in (("AllowableMin", "AllowableMax"),
                                  ("SettingRangeMin", "SettingRangeMax")):
            low, high = target.get(low_key), target.get(high_key)
            if (isinstance(low, (int, float)) and value < low) or (
                    isinstance(high, (int, float)) and value > high):
                return error_body("PropertyValueOutOfRange", "The value %s for %s is out of "
                                  "range %s to %s." % (value, here, low, high))
    return None
