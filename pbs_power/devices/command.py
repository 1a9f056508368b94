"""The ``command`` backends: site scripts do the work (a capmc wrapper, a node agent).

`CommandBackend` (``power_backend.type = "command"``) powers hosts on and off
and asks their power state; `CommandDevices` (device backend ``command``)
carries device-controller requests. Both run the configured ``argv`` once per
host, with the operation and the host as two more argv items (or in place of
``{operation}`` / ``{host}`` items), a JSON request on stdin and a JSON
answer expected on stdout; see `pbs_power.devices.site_script` for timeouts,
process groups and diagnostics.

Host power, ``argv ... OPERATION HOST``, stdin
``{"device": HOST, "kind": OPERATION, "request_id": ID, "timeout_seconds": T}``:

* power_on, power_off, sleep, wake -> ``{"success": true|false, "error": "..."}``
  (the change is started; the planner follows it through ``status``);
* status -> ``{"success": true, "power_state": "on"|"off"|"asleep"|"transitioning"|
  "unknown", "since": EPOCH_SECONDS|null, "power_cap_watts": W|null}``.

Device requests, ``argv ... KIND DEVICE``, stdin: the `DeviceRequest` fields as
JSON (device, kind, payload, device_model_json, device_state_json, request_id,
timeout_seconds); answer: the `DeviceResponse` fields (success, error,
device_state_json, power_cap_watts, policy, gpu_results [{gpu_id, ok,
power_cap_watts, diag_msg}], ping_time, ping_error); device and request_id may
be left out (they default to the request's), everything else but success too.
The node agent ``pbs-power node gpu-caps`` answers exactly this, so
``"argv": ["ssh", "-oBatchMode=yes", "{host}", "pbs-power", "node", "gpu-caps",
"{operation}"]`` reaches the GPUs of every node.
"""
from __future__ import annotations

import json
import math
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from pbs_power.states.model import PowerState, TransitionKind
from .base import BackendError, HostPower, PowerBackend, Result
from .controller import DeviceBackend, DeviceRequest, DeviceResponse, GPUPolicyResult, failure
from .site_script import ScriptError, ScriptRunner, build_argv, json_answer

POWER_OPTIONS = ("argv", "timeout_seconds", "max_workers")
DEVICE_OPTIONS = ("argv", "timeout_seconds")
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_WORKERS = 16

Answer = Union[Dict[str, Any], str]  # the script's JSON object, or why there is none


@dataclass(frozen=True)
class CommandOptions:
    """A site script and how long one run may take."""

    argv: Tuple[str, ...]
    timeout_seconds: Optional[float] = None
    max_workers: int = DEFAULT_MAX_WORKERS

    @classmethod
    def parse(cls, options: Optional[Mapping[str, Any]], who: str,
              known: Sequence[str]) -> "CommandOptions":
        """Checked options; BackendError names ``who`` and the bad option."""
        if not isinstance(options, Mapping):
            raise BackendError("%s: options must be an object, not %s"
                               % (who, type(options).__name__))
        unknown = sorted(set(options) - set(known) - {"type"}, key=str)
        if unknown:
            raise BackendError("%s: unknown option(s) %s (known: %s)"
                               % (who, ", ".join(map(repr, unknown)), ", ".join(known)))
        argv = options.get("argv")
        if not (isinstance(argv, (list, tuple)) and argv
                and all(isinstance(a, str) and a for a in argv)):
            raise BackendError("%s: option argv must be a non-empty list of non-empty strings "
                               "(the program and its arguments), not %r" % (who, argv))
        timeout = options.get("timeout_seconds")
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, (int, float))
                                    or not math.isfinite(timeout) or timeout <= 0):
            raise BackendError("%s: option timeout_seconds must be a number > 0, not %r"
                               % (who, timeout))
        workers = options.get("max_workers", DEFAULT_MAX_WORKERS)
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise BackendError("%s: option max_workers must be an integer >= 1, not %r"
                               % (who, workers))
        return cls(tuple(argv), None if timeout is None else float(timeout), workers)


def call_script(runner: ScriptRunner, argv: Sequence[str], operation: str, host: str,
                request: Mapping[str, Any], timeout: float) -> Answer:
    """One run for ``host``: its JSON object, or a one-line diagnostic."""
    label = "%s %s" % (argv[0].rsplit("/", 1)[-1], operation)
    try:
        run = runner.run(build_argv(argv, operation, host), request, timeout)
        return json_answer(run, timeout, label)
    except ScriptError as exc:
        return str(exc)


# -- host power ----------------------------------------------------------------
class CommandBackend(PowerBackend):
    """Host power through a site script, one run per host, ``max_workers`` at once."""

    name = "command"

    def __init__(self, options: Optional[Mapping[str, Any]], state_dir: str) -> None:
        self.options = CommandOptions.parse(options or {}, "power backend 'command'",
                                            POWER_OPTIONS)
        self.timeout = self.options.timeout_seconds or DEFAULT_TIMEOUT_S
        self.runner = ScriptRunner()

    def request(self, kind: TransitionKind, hosts: Sequence[str],
                now: float) -> Dict[str, Result]:
        kind = TransitionKind(kind)
        answers = self._fan_out(kind.value, hosts)
        return {host: _result(kind, answers[host]) for host in hosts}

    def status(self, hosts: Sequence[str], now: float) -> Dict[str, HostPower]:
        answers = self._fan_out("status", hosts)
        return {host: _host_power(answers[host])[0] for host in hosts}

    def check(self, host: str) -> Dict[str, Any]:
        """Ask ``host``'s state once: reachable, power state, cap, diagnostic."""
        answer = self._call("status", host)
        power, diag = _host_power(answer)
        cap = answer.get("power_cap_watts") if isinstance(answer, dict) else None
        ok = isinstance(answer, dict) and not diag
        return {"reachable": ok, "power_state": power.state.value if ok else None,
                "power_cap_watts": cap if _is_number(cap) else None, "diag": diag}

    def _fan_out(self, operation: str, hosts: Sequence[str]) -> Dict[str, Answer]:
        unique = list(dict.fromkeys(hosts))
        if not unique:
            return {}
        workers = min(len(unique), self.options.max_workers)
        with ThreadPoolExecutor(max_workers=workers,
                                thread_name_prefix="pbs_power-command") as pool:
            answers = list(pool.map(lambda h: self._call(operation, h), unique))
        return dict(zip(unique, answers))

    def _call(self, operation: str, host: str) -> Answer:
        request = {"device": host, "kind": operation, "request_id": uuid.uuid4().hex,
                   "timeout_seconds": self.timeout}
        return call_script(self.runner, self.options.argv, operation, host, request,
                           self.timeout)

    def close(self) -> None:
        self.runner.close()


def _result(kind: TransitionKind, answer: Answer) -> Result:
    if isinstance(answer, str):
        return Result(False, answer)
    ok = answer.get("success")
    error = answer.get("error") if isinstance(answer.get("error"), str) else ""
    if not isinstance(ok, bool):
        return Result(False, "%s: the answer has no boolean 'success'" % kind.value)
    if not ok:
        return Result(False, error or "%s refused (no error given)" % kind.value)
    return Result(True, error or "%s sent" % kind.value)


def _host_power(answer: Answer) -> Tuple[HostPower, str]:
    """The host's power from a status answer, and a diagnostic when it is unusable."""
    unknown = HostPower(PowerState.UNKNOWN, None)
    if isinstance(answer, str):
        return unknown, answer
    if answer.get("success") is not True:
        error = answer.get("error")
        return unknown, "status: %s" % (error if isinstance(error, str) and error
                                        else "the answer has no 'success': true")
    try:
        state = PowerState(answer.get("power_state"))
    except ValueError:
        return unknown, "status: power_state must be one of %s, not %r" % (
            ", ".join(s.value for s in PowerState), answer.get("power_state"))
    since = answer.get("since")
    return HostPower(state, float(since) if _is_number(since) else None), ""


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


# -- device requests -------------------------------------------------------------
class CommandDevices(DeviceBackend):
    """Device-controller requests through a site script, one run per device."""

    name = "command"

    def __init__(self, argv: Sequence[str], timeout_seconds: Optional[float] = None) -> None:
        self.options = CommandOptions(tuple(argv), timeout_seconds)
        self.runner = ScriptRunner()

    @classmethod
    def from_options(cls, options: Optional[Mapping[str, Any]]) -> "CommandDevices":
        """Built from config options (argv, timeout_seconds); BackendError names a bad one."""
        parsed = CommandOptions.parse(options if options is not None else {},
                                      "device backend 'command'", DEVICE_OPTIONS)
        return cls(parsed.argv, parsed.timeout_seconds)

    def handle(self, request: DeviceRequest) -> DeviceResponse:
        """Run the script for ``request``; its answer, or a failure saying why not."""
        timeout = request.timeout_seconds or DEFAULT_TIMEOUT_S
        if self.options.timeout_seconds is not None:
            timeout = min(timeout, self.options.timeout_seconds)
        doc = {"device": request.device, "kind": request.kind, "payload": request.payload,
               "device_model_json": request.device_model_json,
               "device_state_json": request.device_state_json,
               "request_id": request.request_id, "timeout_seconds": timeout}
        started = time.time()
        answer = call_script(self.runner, self.options.argv, request.kind, request.device,
                             doc, timeout)
        if isinstance(answer, str):
            return failure(request, answer, ping_time=started if request.kind == "ping"
                           else None)
        try:
            return response_from_json(answer, request)
        except ValueError as exc:
            return failure(request, "%s: bad answer: %s" % (request.kind, exc))

    def close(self) -> None:
        self.runner.close()


def response_from_json(doc: Mapping[str, Any], request: DeviceRequest) -> DeviceResponse:
    """A DeviceResponse from its JSON fields; ValueError names a malformed field."""
    success = doc.get("success")
    if not isinstance(success, bool):
        raise ValueError("'success' must be true or false, not %r" % (success,))
    state = doc.get("device_state_json")
    if state is not None and not isinstance(state, str):
        state = _dumps(state, "device_state_json")
    policy = doc.get("policy")
    if policy is not None and not isinstance(policy, dict):
        raise ValueError("'policy' must be an object or null")
    return DeviceResponse(
        device=_text(doc, "device", request.device),
        request_id=_text(doc, "request_id", request.request_id),
        success=success, error=_text(doc, "error", ""), device_state_json=state,
        power_cap_watts=_optional_number(doc.get("power_cap_watts"), "power_cap_watts"),
        policy=policy, gpu_results=_gpu_results(doc.get("gpu_results")),
        ping_time=_optional_number(doc.get("ping_time"), "ping_time"),
        ping_error=_text(doc, "ping_error", ""))


def response_to_json(resp: DeviceResponse) -> Dict[str, Any]:
    """A DeviceResponse as the JSON fields `response_from_json` reads."""
    return {"device": resp.device, "request_id": resp.request_id, "success": resp.success,
            "error": resp.error, "device_state_json": resp.device_state_json,
            "power_cap_watts": resp.power_cap_watts,
            "policy": None if resp.policy is None else dict(resp.policy),
            "gpu_results": [{"gpu_id": r.gpu_id, "ok": r.ok, "power_cap_watts": r.power_cap_watts,
                             "diag_msg": r.diag_msg} for r in resp.gpu_results],
            "ping_time": resp.ping_time, "ping_error": resp.ping_error}


def _gpu_results(items: Any) -> Tuple[GPUPolicyResult, ...]:
    if items is None:
        return ()
    if not isinstance(items, list):
        raise ValueError("'gpu_results' must be a list")
    out: List[GPUPolicyResult] = []
    for i, item in enumerate(items):
        where = "gpu_results[%d]" % i
        if not isinstance(item, dict):
            raise ValueError("%s must be an object" % where)
        gid, ok = item.get("gpu_id"), item.get("ok")
        if isinstance(gid, bool) or not isinstance(gid, int) or gid < 0:
            raise ValueError("%s.gpu_id must be an integer >= 0, not %r" % (where, gid))
        if not isinstance(ok, bool):
            raise ValueError("%s.ok must be true or false, not %r" % (where, ok))
        out.append(GPUPolicyResult(gid, ok, _optional_number(item.get("power_cap_watts"),
                                                   where + ".power_cap_watts"),
                                   _text(item, "diag_msg", "", where + ".")))
    return tuple(out)


def _text(doc: Mapping[str, Any], key: str, default: str, prefix: str = "") -> str:
    value = doc.get(key, default)
    value = default if value is None else value
    if not isinstance(value, str):
        raise ValueError("'%s%s' must be a string, not %r" % (prefix, key, value))
    return value


def _optional_number(value: Any, name: str) -> Optional[float]:
    if value is None:
        return None
    if not _is_number(value):
        raise ValueError("'%s' must be a finite number or null, not %r" % (name, value))
    return float(value)


def _dumps(value: Any, name: str) -> str:
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise ValueError("'%s' is not JSON data: %s" % (name, exc)) from None
