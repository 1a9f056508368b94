"""OUR extensions to sushy-tools' Redfish emulator, for the redfish backend tests.

sushy-tools (the OpenStack Redfish emulator) has no power-limit resources,
no SessionService and no way to make a BMC fail on purpose. Everything in
this module is written for pbs_power's tests and is NOT part of sushy-tools;
it is installed into the emulator's Flask app by ``sushy_launcher.py``:

* DMTF Chassis ``Power`` (``PowerControl[0].PowerLimit.LimitInWatts``,
  ``PowerCapacityWatts``), ``EnvironmentMetrics`` (``PowerLimitWatts``
  ``SetPoint``/``AllowableMin``/``AllowableMax``) and ``Controls`` (a
  collection with a temperature control and a ``ControlType: Power`` control,
  ``SetPoint``/``AllowableMin``/``AllowableMax``) resources, per chassis, that
  keep their state in memory, round a new limit to whole watts (as many BMCs
  do) and answer 400 with a Redfish error body outside [min, max];
* one chassis per system (the system's ``Links.Chassis`` names its own);
* a SessionService (POST/DELETE ``/redfish/v1/SessionService/Sessions``,
  ``X-Auth-Token``) checking the emulator's htpasswd file, optionally the
  only accepted authentication (``PBS_TEST_SESSION_ONLY``);
* systems that accept GracefulShutdown and ignore it (a hung OS);
* injected faults: a method and path suffix answered with an HTTP status and
  a Redfish error body carrying ``@Message.ExtendedInfo``;
* an added delay per request, as slow as real BMCs (``PBS_TEST_LATENCY_MS``).

Config keys (in the emulator's config file, next to sushy's own):
``PBS_TEST_CAPS`` {chassis id: {style: power|environment|both|controls,
min, max, limit, mode}} (``controls``: the Controls collection only;
``mode``: the ControlMode of EnvironmentMetrics/Controls, default Automatic), ``PBS_TEST_SYSTEM_CHASSIS`` {system uuid: chassis id},
``PBS_TEST_IGNORE_GRACEFUL`` [system uuid], ``PBS_TEST_FAULTS`` [{method,
path_suffix, status, message}], ``PBS_TEST_SESSION_ONLY`` bool,
``PBS_TEST_LATENCY_MS`` number.
"""
from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Optional

import flask
import webob

SESSIONS = "/redfish/v1/SessionService/Sessions"
#: Control.ControlMode values (DMTF Control schema).
CONTROL_MODES = ("Automatic", "Override", "Manual", "Disabled")


def redfish_error(status: int, message: str, message_id: str = "Base.1.0.GeneralError") -> Dict:
    """A Redfish error body with one ExtendedInfo message."""
    return {"error": {"code": message_id, "message": "See @Message.ExtendedInfo for details.",
                      "@Message.ExtendedInfo": [{
                          "@odata.type": "#Message.v1_1_1.Message", "MessageId": message_id,
                          "Message": message, "Severity": "Critical" if status >= 500 else "Warning",
                          "Resolution": "None."}]}}


def _json_response(status: int, doc: Any, headers: Optional[Dict[str, str]] = None):
    resp = webob.Response(status=status, content_type="application/json",
                          body=json.dumps(doc).encode())
    for key, value in (headers or {}).items():
        resp.headers[key] = value
    return resp


class PowerLimits:
    """Per-chassis power limit state (thread-safe: the emulator serves threads)."""

    def __init__(self, caps: Dict[str, Dict[str, Any]]) -> None:
        self._lock = threading.Lock()
        self.caps = {cid: dict(c, limit=float(c.get("limit", c["max"])),
                               mode=c.get("mode", "Automatic"))
                     for cid, c in caps.items()}

    def get(self, chassis: str) -> Optional[Dict[str, Any]]:
        with self._lock:
            cap = self.caps.get(chassis)
            return dict(cap) if cap else None

    def set(self, chassis: str, watts: Any, mode: Optional[str] = None) -> Optional[Dict]:
        """Store a new limit (and ControlMode); a Redfish error body when refused."""
        if mode is not None and mode not in CONTROL_MODES:
            return redfish_error(400, "The value %r for the property ControlMode is not in the "
                                 "list of acceptable values." % (mode,),
                                 "Base.1.0.PropertyValueNotInList")
        if watts is None:  # null: no limit (DMTF Power: "null disables power capping")
            with self._lock:
                if mode is None:
                    self.caps[chassis]["limit"] = None
                else:
                    self.caps[chassis]["mode"] = mode
            return None
        if isinstance(watts, bool) or not isinstance(watts, (int, float)):
            return redfish_error(400, "The value %r for the power limit is of a different type "
                                 "than the property can accept." % (watts,),
                                 "Base.1.0.PropertyValueTypeError")
        with self._lock:
            cap = self.caps[chassis]
            if not cap["min"] <= watts <= cap["max"]:
                return redfish_error(400, "The value %s for the power limit is out of range "
                                     "%s to %s." % (watts, cap["min"], cap["max"]),
                                     "Base.1.0.PropertyValueOutOfRange")
            cap["limit"] = float(round(watts))
            if mode is not None:
                cap["mode"] = mode
        return None


def install(app: flask.Flask) -> None:
    """Register our resources on sushy's app; middleware goes on at ``app.run``."""
    limits = PowerLimits(app.config.get("PBS_TEST_CAPS", {}))
    _add_power_routes(app, limits)
    _wrap_view(app, "chassis_resource", lambda doc, kw: _link_power(app, limits, doc, kw))
    _wrap_view(app, "system_resource", lambda doc, kw: _link_chassis(app, doc, kw))
    original_reset = app.view_functions["system_reset_action"]

    def reset(**kw: Any):
        body = flask.request.get_json(silent=True) or {}
        ignored = app.config.get("PBS_TEST_IGNORE_GRACEFUL", [])
        if body.get("ResetType") == "GracefulShutdown" and kw.get("identity") in ignored:
            return flask.Response(status=204)  # accepted, and the OS never shuts down
        return original_reset(**kw)
    app.view_functions["system_reset_action"] = reset

    original_run = app.run

    def run(*args: Any, **kwargs: Any):
        _install_middleware(app)
        return original_run(*args, **kwargs)
    app.run = run  # type: ignore[method-assign]


def _wrap_view(app: flask.Flask, name: str, edit: Callable[[Dict, Dict], None]) -> None:
    """Let ``edit`` change the JSON a GET on view ``name`` answers."""
    original = app.view_functions[name]

    def view(**kw: Any):
        resp = original(**kw)
        if flask.request.method == "GET" and getattr(resp, "status_code", 0) == 200:
            doc = json.loads(resp.get_data())
            edit(doc, kw)
            resp.set_data(json.dumps(doc))
        return resp
    app.view_functions[name] = view


def _link_chassis(app: flask.Flask, doc: Dict, kw: Dict) -> None:
    chassis = app.config.get("PBS_TEST_SYSTEM_CHASSIS", {}).get(doc.get("UUID"))
    if chassis:
        doc.setdefault("Links", {})["Chassis"] = [{"@odata.id": "/redfish/v1/Chassis/" + chassis}]


def _link_power(app: flask.Flask, limits: PowerLimits, doc: Dict, kw: Dict) -> None:
    name = doc.get("Name", "")  # sushy answers at the chassis UUID; ours are keyed by name
    cap = limits.get(name)
    if cap is None:
        return
    base = "/redfish/v1/Chassis/%s" % name
    if cap["style"] in ("power", "both"):
        doc["Power"] = {"@odata.id": base + "/Power"}
    if cap["style"] in ("environment", "both"):
        doc["EnvironmentMetrics"] = {"@odata.id": base + "/EnvironmentMetrics"}
    if cap["style"] == "controls":
        doc["Controls"] = {"@odata.id": base + "/Controls"}


def _reading(app: flask.Flask, chassis: str, cap: Dict[str, Any]) -> float:
    """A plausible draw: some of the limit when the chassis' system is on, standby else."""
    systems = [s for s, c in app.config.get("PBS_TEST_SYSTEM_CHASSIS", {}).items()
               if c == chassis]
    try:
        on = bool(systems) and app.systems.get_power_state(systems[0]) == "On"
    except Exception:
        on = False
    limit = cap["max"] if cap["limit"] is None else cap["limit"]
    return round(min(limit, 0.6 * cap["max"]), 1) if on else 8.0


def _add_power_routes(app: flask.Flask, limits: PowerLimits) -> None:
    def power(identity: str):
        cap = limits.get(identity)
        if cap is None or cap["style"] not in ("power", "both"):
            return flask.jsonify(redfish_error(404, "No Power resource.")), 404
        path = "/redfish/v1/Chassis/%s/Power" % identity
        if flask.request.method == "PATCH":
            body = flask.request.get_json(silent=True) or {}
            try:
                watts = body["PowerControl"][0]["PowerLimit"]["LimitInWatts"]
            except (KeyError, IndexError, TypeError):
                return flask.jsonify(redfish_error(400, "Only PowerControl[0].PowerLimit."
                                                   "LimitInWatts can be changed.")), 400
            return _patched(limits, identity, watts)
        return flask.jsonify({
            "@odata.type": "#Power.v1_7_0.Power", "@odata.id": path, "Id": "Power",
            "Name": "Power", "PowerControl": [{
                "@odata.id": path + "#/PowerControl/0", "MemberId": "0",
                "Name": "Chassis Power Control",
                "PowerConsumedWatts": _reading(app, identity, cap),
                "PowerCapacityWatts": cap["max"],
                "PowerLimit": {"LimitInWatts": cap["limit"], "LimitException": "LogEventOnly"}}]})

    def environment(identity: str):
        cap = limits.get(identity)
        if cap is None or cap["style"] not in ("environment", "both"):
            return flask.jsonify(redfish_error(404, "No EnvironmentMetrics resource.")), 404
        path = "/redfish/v1/Chassis/%s/EnvironmentMetrics" % identity
        if flask.request.method == "PATCH":
            body = flask.request.get_json(silent=True) or {}
            point = (body.get("PowerLimitWatts") or {})
            if not point or not set(point) <= {"SetPoint", "ControlMode"}:
                return flask.jsonify(redfish_error(400, "Only PowerLimitWatts/SetPoint and "
                                                   "ControlMode can be changed.")), 400
            return _patched(limits, identity, point.get("SetPoint"), point.get("ControlMode"))
        return flask.jsonify({
            "@odata.type": "#EnvironmentMetrics.v1_3_0.EnvironmentMetrics",
            "@odata.id": path, "Id": "EnvironmentMetrics", "Name": "Chassis Environment Metrics",
            "PowerWatts": {"Reading": _reading(app, identity, cap)},
            "PowerLimitWatts": {"SetPoint": cap["limit"], "AllowableMin": cap["min"],
                                "AllowableMax": cap["max"], "ControlMode": cap["mode"]}})

    _add_control_routes(app, limits)
    app.add_url_rule("/redfish/v1/Chassis/<identity>/Power", "pbs_test_power", power,
                     methods=["GET", "PATCH"])
    app.add_url_rule("/redfish/v1/Chassis/<identity>/EnvironmentMetrics",
                     "pbs_test_environment", environment, methods=["GET", "PATCH"])


def _patched(limits: PowerLimits, identity: str, watts, mode: Optional[str] = None):
    """The answer to a cap PATCH: 204 once held, 400 with the Redfish error if refused."""
    refused = limits.set(identity, watts, mode)
    if refused:
        return flask.jsonify(refused), 400
    return flask.Response(status=204)


def _add_control_routes(app: flask.Flask, limits: PowerLimits) -> None:
    """A Controls collection: a temperature control first, then the power limit."""
    def cap_of(identity: str):
        cap = limits.get(identity)
        return cap if cap is not None and cap["style"] == "controls" else None

    def collection(identity: str):
        if cap_of(identity) is None:
            return flask.jsonify(redfish_error(404, "No Controls resource.")), 404
        base = "/redfish/v1/Chassis/%s/Controls" % identity
        return flask.jsonify({
            "@odata.type": "#ControlCollection.ControlCollection", "@odata.id": base,
            "Name": "Controls", "Members@odata.count": 2,
            "Members": [{"@odata.id": base + "/CPUTemp"}, {"@odata.id": base + "/PowerLimit"}]})

    def control(identity: str, control_id: str):
        cap = cap_of(identity)
        if cap is None or control_id not in ("CPUTemp", "PowerLimit"):
            return flask.jsonify(redfish_error(404, "No such control.")), 404
        path = "/redfish/v1/Chassis/%s/Controls/%s" % (identity, control_id)
        if flask.request.method == "PATCH":
            body = flask.request.get_json(silent=True) or {}
            if control_id != "PowerLimit" or not body \
                    or not set(body) <= {"SetPoint", "ControlMode"}:
                return flask.jsonify(redfish_error(400, "Only SetPoint and ControlMode of "
                                                   "PowerLimit can be changed.")), 400
            return _patched(limits, identity, body.get("SetPoint"), body.get("ControlMode"))
        doc = {"@odata.type": "#Control.v1_3_0.Control", "@odata.id": path, "Id": control_id,
               "PhysicalContext": "Chassis",
               "ControlMode": cap["mode"] if control_id == "PowerLimit" else "Automatic"}
        if control_id == "CPUTemp":
            doc.update(Name="CPU temperature target", ControlType="Temperature",
                       SetPoint=85, SetPointUnits="Cel", AllowableMin=60, AllowableMax=95)
        else:
            doc.update(Name="Chassis power limit", ControlType="Power", SetPoint=cap["limit"],
                       SetPointUnits="W", AllowableMin=cap["min"], AllowableMax=cap["max"],
                       Sensor={"Reading": _reading(app, identity, cap)})
        return flask.jsonify(doc)

    app.add_url_rule("/redfish/v1/Chassis/<identity>/Controls", "pbs_test_controls",
                     collection, methods=["GET"])
    app.add_url_rule("/redfish/v1/Chassis/<identity>/Controls/<control_id>",
                     "pbs_test_control", control, methods=["GET", "PATCH"])


# -- WSGI middleware: sessions and faults --------------------------------------
def _install_middleware(app: flask.Flask) -> None:
    """Sessions outside sushy's basic auth, faults inside it."""
    authed = app.wsgi_app
    inner = getattr(authed, "app", None)
    faults = app.config.get("PBS_TEST_FAULTS", [])
    latency = float(app.config.get("PBS_TEST_LATENCY_MS", 0)) / 1000.0
    if inner is not None:  # sushy's RedfishAuthMiddleware wraps the Flask app
        authed.app = Faults(inner, faults, latency)
        inner = authed.app
    else:
        authed = inner = Faults(authed, faults, latency)
    app.wsgi_app = Sessions(inner, authed, app.config.get("SUSHY_EMULATOR_AUTH_FILE"),
                            bool(app.config.get("PBS_TEST_SESSION_ONLY")))


class Faults:
    """Delays every request, and answers matching ones with an injected error (OURS)."""

    def __init__(self, app: Any, faults: List[Dict[str, Any]], latency: float = 0.0) -> None:
        self.app, self.faults, self.latency = app, faults, latency

    def __call__(self, env: Dict, start_response: Any):
        if self.latency > 0:
            time.sleep(self.latency)
        for fault in self.faults:
            if (env.get("REQUEST_METHOD") == fault.get("method", "GET")
                    and env.get("PATH_INFO", "").rstrip("/").endswith(fault["path_suffix"])):
                status = int(fault.get("status", 500))
                return _json_response(status, redfish_error(status, fault["message"]))(
                    env, start_response)
        return self.app(env, start_response)


class Sessions:
    """A Redfish SessionService (OUR addition; sushy-tools has none)."""

    def __init__(self, inner: Any, authed: Any, auth_file: Optional[str],
                 session_only: bool) -> None:
        self.inner, self.authed = inner, authed
        self.auth_file, self.session_only = auth_file, session_only
        self.tokens: Dict[str, str] = {}  # token -> session id
        self.lock = threading.Lock()

    def __call__(self, env: Dict, start_response: Any):
        req = webob.Request(env)
        path = req.path_info.rstrip("/")
        token = req.headers.get("X-Auth-Token")
        if path == SESSIONS and req.method == "POST":
            return self._login(req)(env, start_response)
        if token is not None:
            with self.lock:
                session = self.tokens.get(token)
            if session is None:
                return _json_response(401, redfish_error(401, "The session token is not "
                                                         "valid."))(env, start_response)
            if path.startswith(SESSIONS) or path == "/redfish/v1/SessionService":
                return self._sessions(req, session)(env, start_response)
            return self.inner(env, start_response)
        if path.startswith(SESSIONS) or path == "/redfish/v1/SessionService":
            # Basic auth may read the sessions, even when session-only (tests inspect them).
            if not self._basic_ok(env):
                return _json_response(401, redfish_error(401, "Authentication required."))(
                    env, start_response)
            return self._sessions(req, None)(env, start_response)
        if self.session_only and path not in ("", "/redfish", "/redfish/v1"):
            return _json_response(401, redfish_error(401, "Log in through the SessionService "
                                                     "first."))(env, start_response)
        return self.authed(env, start_response)

    def _check(self, user: str, password: str) -> bool:
        """Whether the emulator's htpasswd file (if any) accepts these credentials."""
        if not self.auth_file:
            return True
        from sushy_tools import error
        from sushy_tools.emulator import auth_basic
        try:
            auth_basic.authenticate(self.auth_file, user, password.encode())
        except error.FishyError:
            return False
        return True

    def _basic_ok(self, env: Dict) -> bool:
        if not self.auth_file:
            return True
        from sushy_tools import error
        from sushy_tools.emulator import auth_basic
        try:
            user, password = auth_basic.parse_token(auth_basic.parse_header(env))
        except error.FishyError:
            return False
        return self._check(user, password.decode() if isinstance(password, bytes) else password)

    def _login(self, req: Any):
        try:
            body = json.loads(req.body or b"{}")
            user, password = str(body["UserName"]), str(body["Password"])
        except (ValueError, KeyError, TypeError):
            return _json_response(400, redfish_error(400, "UserName and Password are required.",
                                                     "Base.1.0.PropertyMissing"))
        if not self._check(user, password):
            return _json_response(401, redfish_error(401, "Invalid username or password.",
                                                     "Base.1.0.NoValidSession"))
        sid, token = uuid.uuid4().hex[:12], uuid.uuid4().hex
        with self.lock:
            self.tokens[token] = sid
        where = "%s/%s" % (SESSIONS, sid)
        return _json_response(201, {"@odata.id": where, "Id": sid, "UserName": user},
                              {"X-Auth-Token": token, "Location": where})

    def _sessions(self, req: Any, own: Optional[str]):
        path = req.path_info.rstrip("/")
        if path == "/redfish/v1/SessionService":
            return _json_response(200, {"@odata.id": "/redfish/v1/SessionService",
                                        "Sessions": {"@odata.id": SESSIONS}})
        if path == SESSIONS:
            with self.lock:
                members = sorted(self.tokens.values())
            return _json_response(200, {"@odata.id": SESSIONS, "Members@odata.count": len(members),
                                        "Members": [{"@odata.id": "%s/%s" % (SESSIONS, m)}
                                                    for m in members]})
        sid = path.rsplit("/", 1)[-1]
        with self.lock:
            found = [t for t, s in self.tokens.items() if s == sid]
            if req.method == "DELETE" and found:
                del self.tokens[found[0]]
                return webob.Response(status=204)
        if not found:
            return _json_response(404, redfish_error(404, "No session %s." % sid))
        return _json_response(200, {"@odata.id": path, "Id": sid})
