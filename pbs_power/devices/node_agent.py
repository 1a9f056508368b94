"""The node agent, ``pbs-power node gpu-caps OPERATION [DEVICE]``, run on a GPU node.

It reads a device request as JSON on stdin and prints the device response as
JSON on stdout: the contract of the ``command`` device backend, which runs it
on each node through the site's remote shell. OPERATION is a device-controller
kind (``ping``, ``resource_group_activate``, ``gpu_policies_update``, ...) or,
for an admin at the node: ``show`` (inventory and saved limits; no stdin),
``set`` (stdin: a device request, or only a GPU policies request such as
``{"gpu_policies": [{"gpu_id": 0, "power_limit": {"watts": 300}}]}``) and
``restore`` (stdin: nothing for every saved GPU, or ``{"gpu_ids": [0, 1]}``).
Exit status: 0 done, 1 answered but failed (the JSON says why), 2 bad input.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Dict, Mapping

from .command import response_to_json
from .controller import KINDS, DeviceRequest, DeviceResponse
from .gpu_cap_state import CapStateError
from .nvml import NvmlDevices, NvmlUnavailable, inventory_dicts

OPERATIONS = ("show", "set", "restore") + KINDS
EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


@dataclass(frozen=True)
class AgentAnswer:
    """The exit status and the JSON document to print."""

    code: int
    doc: Dict[str, Any]


def gpu_caps(operation: str, device: str, stdin_text: str, devices: NvmlDevices) -> AgentAnswer:
    """Carry out one agent call on this node's GPUs."""
    if operation not in OPERATIONS:
        return _invalid(device, "unknown operation %r (known: %s)"
                        % (operation, ", ".join(OPERATIONS)))
    try:
        doc = _stdin_object(stdin_text)
    except ValueError as exc:
        return _invalid(device, "stdin: %s" % exc)
    if operation == "show":
        return _show(device, devices)
    if operation == "restore":
        return _restore(device, doc, devices)
    try:
        request = request_from_json(doc, operation, device)
    except ValueError as exc:
        return _invalid(device, "stdin: %s" % exc)
    return _answer(devices.handle(request))


def request_from_json(doc: Mapping[str, Any], operation: str, device: str) -> DeviceRequest:
    """The device request on stdin; ``set`` also takes a bare GPU policies request."""
    kind = doc.get("kind")
    if operation == "set":
        if kind is None:
            return DeviceRequest(device, "gpu_policies_update", doc, "{}", None, uuid.uuid4().hex)
        operation = kind
    if kind is not None and kind != operation:
        raise ValueError("kind %r does not match the operation %r" % (kind, operation))
    if operation not in KINDS:
        raise ValueError("kind must be one of %s, not %r" % (", ".join(KINDS), operation))
    payload = doc.get("payload", {})
    if not isinstance(payload, Mapping):
        raise ValueError("payload must be an object")
    model = doc.get("device_model_json") or "{}"
    state = doc.get("device_state_json")
    timeout = doc.get("timeout_seconds")
    if not isinstance(model, str) or not (state is None or isinstance(state, str)):
        raise ValueError("device_model_json and device_state_json must be JSON text")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))):
        raise ValueError("timeout_seconds must be a number")
    return DeviceRequest(doc.get("device") or device, operation, payload, model, state,
                         str(doc.get("request_id") or uuid.uuid4().hex),
                         None if timeout is None else float(timeout))


def _stdin_object(text: str) -> Dict[str, Any]:
    if not text.strip():
        return {}
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError("not JSON: %s" % exc) from None
    if not isinstance(doc, dict):
        raise ValueError("must be a JSON object")
    return doc


def _show(device: str, devices: NvmlDevices) -> AgentAnswer:
    try:
        gpus = devices.caps.inventory()
        saved = devices.caps.saved()
    except (NvmlUnavailable, CapStateError) as exc:
        return _failed(device, str(exc))
    return AgentAnswer(EXIT_OK, {"device": device, "success": True, "error": "",
                                 "gpus": inventory_dicts(gpus), "saved": saved})


def _restore(device: str, doc: Mapping[str, Any], devices: NvmlDevices) -> AgentAnswer:
    ids = doc.get("gpu_ids")
    if ids is not None and not (isinstance(ids, list) and all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)):
        return _invalid(device, "stdin: gpu_ids must be a list of GPU indices")
    try:
        results = devices.caps.restore(ids)
    except (NvmlUnavailable, CapStateError) as exc:
        return _failed(device, str(exc))
    errors = ["GPU %d: %s" % (r.gpu_id, r.diag_msg) for r in results if not r.ok]
    return _answer(DeviceResponse(device, "", not errors, "; ".join(errors),
                                  gpu_results=tuple(results)))


def _answer(resp: DeviceResponse) -> AgentAnswer:
    return AgentAnswer(EXIT_OK if resp.success else EXIT_FAILED, response_to_json(resp))


def _failed(device: str, error: str) -> AgentAnswer:
    return AgentAnswer(EXIT_FAILED, {"device": device, "success": False, "error": error})


def _invalid(device: str, error: str) -> AgentAnswer:
    return AgentAnswer(EXIT_INVALID, {"device": device, "success": False, "error": error})


def default_device() -> str:
    """This node's short host name, the device name when none is given."""
    import socket
    return socket.gethostname().split(".")[0]


__all__ = ["AgentAnswer", "OPERATIONS", "gpu_caps", "request_from_json", "default_device"]
