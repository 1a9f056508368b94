"""Every power operation of the redfish backends against one captured BMC tree.

`run_operations` serves a tree with the faithful `MockBmc` and goes through
find system, power state, on, off, read cap, set cap and uncap with the
real backends, checking each against what the mock BMC itself holds. Each
operation gives a `Outcome`: ok with a short note, or failed with the
backend's one-line diagnostic. ``python tests/devices/redfish_vendor.py``
prints the table (tree x operation -> result) for every shared tree.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from emulators.mock_bmc import MockBmc, key, mockup_dir, mockup_names  # noqa: E402

from pbs_power.devices.controller import DeviceRequest  # noqa: E402
from pbs_power.devices.redfish.backend import RedfishBackend, RedfishDevices  # noqa: E402
from pbs_power.states.model import PowerState, TransitionKind as K  # noqa: E402

OPERATIONS = ("find system", "power state", "on", "off", "read cap", "set cap", "uncap")
NODE = {"min_watts": 50, "idle_watts": 200, "max_watts": 1000}
CAP_W = 400
USER = ("admin", "pw")


@dataclass(frozen=True)
class Outcome:
    ok: bool
    text: str

    def cell(self) -> str:
        return ("ok: " if self.ok else "FAILS: ") + self.text


def credentials(directory: str) -> str:
    path = os.path.join(directory, "cred.json")
    with open(path, "w") as f:
        json.dump({"username": USER[0], "password": USER[1]}, f)
    os.chmod(path, 0o600)
    return path


def options(bmc: MockBmc, host: str, directory: str, system_id: Optional[str] = None,
            **extra: Any) -> Dict[str, Any]:
    entry: Dict[str, Any] = {"url": bmc.url}
    if system_id:
        entry["system_id"] = system_id
    out = {"bmcs": {host: entry}, "credentials_file": credentials(directory),
           "allow_http": True, "poll_seconds": 0.05, "timeout_seconds": 5, "retries": 0,
           "graceful_timeout_seconds": 1}
    out.update(extra)
    return out


def model() -> str:
    return json.dumps({"backend": "redfish", "device_spec": "n", "node": NODE})


def cap_request(host: str, watts: Optional[float], state: Optional[str],
                percentage: Optional[float] = None) -> DeviceRequest:
    if watts is None and percentage is None:
        return DeviceRequest(host, "resource_group_deactivate",
                             {"resource_group": "rg", "policy": {"policy_action": "unset",
                                                                 "policy": None}},
                             model(), state, "r-off", 20.0)
    limit = {"watts": watts} if watts is not None else {"percentage": percentage}
    policy = {"name": "cap", "limits": [{"element_type": "NODE", "power_limit": limit}]}
    return DeviceRequest(host, "resource_group_activate",
                         {"resource_group": "rg", "policy": {"policy_action": "set",
                                                             "policy": policy}},
                         model(), state, "r-on", 20.0)


def limit_held(bmc: MockBmc, path: str) -> Any:
    """What the mock BMC holds at a limit resource: (value, ControlMode), read from its docs."""
    doc = bmc.doc(path)
    if isinstance(doc.get("PowerLimitWatts"), dict):
        return doc["PowerLimitWatts"].get("SetPoint"), doc["PowerLimitWatts"].get("ControlMode")
    for member in doc.get("PowerControl") or []:
        if isinstance(member.get("PowerLimit"), dict):
            return member["PowerLimit"].get("LimitInWatts"), None
    return doc.get("SetPoint"), doc.get("ControlMode")


def patched(bmc: MockBmc) -> bool:
    return any(r.method == "PATCH" for r in bmc.requests)


def one_line(text: str) -> bool:
    return bool(text) and "\n" not in text


def run_operations(tree: str, directory: str) -> Dict[str, Outcome]:
    """Every operation on the first system of ``tree`` (see the module doc)."""
    bmc = MockBmc(tree, users={USER[0]: USER[1]}).start()
    out: Dict[str, Outcome] = {}
    backend = devices = None
    try:
        systems = bmc.systems()
        system = systems[0]
        ident = system.rstrip("/").rsplit("/", 1)[-1] if len(systems) > 1 else None
        opts = options(bmc, "n1", directory, ident)
        backend = RedfishBackend(opts, os.path.join(directory, "state"))
        devices = RedfishDevices(opts)
        try:
            _client, path = backend.fleet.system("n1", time.monotonic() + 10)
            found = key(path) == key(system)
            out["find system"] = Outcome(found, path if found else "found %s, not %s"
                                         % (path, system))
        except Exception as exc:  # noqa: BLE001 - reported in the table
            out["find system"] = Outcome(False, str(exc))
        state = backend.status(["n1"], 0)["n1"].state
        truth = bmc.power_state(system)
        out["power state"] = Outcome(state.value.lower() == truth.lower(), "%s (BMC: %s)"
                                     % (state.value, truth)) if state is not PowerState.UNKNOWN \
            else Outcome(False, backend.last_errors.get("n1", "unknown"))
        steps = [("on", K.POWER_ON, "On"), ("off", K.POWER_OFF, "Off")]
        for name, kind, want in (steps if truth == "Off" else steps[::-1]):
            out[name] = _power(backend, bmc, system, kind, want)
        out.update(_caps(bmc, devices))
    finally:
        for thing in (backend, devices):
            if thing is not None:
                thing.close()
        bmc.stop()
    return out


def _power(backend: RedfishBackend, bmc: MockBmc, system: str, kind: K,
           want: str) -> Outcome:
    sent = backend.request(kind, ["n1"], 0)["n1"]
    if not sent.ok:
        return Outcome(False, sent.diag)
    held = bmc.power_state(system)
    resets = [r for _s, r in bmc.resets]
    return Outcome(held == want, "%s; BMC %s; resets %s" % (sent.diag, held,
                                                          ",".join(resets) or "none"))


def _caps(bmc: MockBmc, devices: RedfishDevices) -> Dict[str, Outcome]:
    out: Dict[str, Outcome] = {}
    ping = devices.ping(["n1"])["n1"]
    if not ping.reachable or "no power limit resource" in ping.error or \
            ping.error.startswith("cap not readable"):
        out["read cap"] = Outcome(False, ping.error)
    else:
        out["read cap"] = Outcome(True, "%s W, %s%s" % (ping.cap_watts, ping.cap_resource,
                                                        "; " + ping.error if ping.error else ""))
    resp = devices.handle(cap_request("n1", CAP_W, None))
    if not resp.success:
        out["set cap"] = Outcome(False, resp.error)
        lifted = devices.handle(cap_request("n1", None, resp.device_state_json))
        note = json.loads(lifted.device_state_json).get("note", "") if lifted.success else ""
        out["uncap"] = Outcome(lifted.success and note.startswith("nothing to lift") and
                               not patched(bmc), note or lifted.error)
        return out
    cap = devices.fleet.read_cap("n1")
    before = json.loads(resp.device_state_json).get("bmc_before_cap") or {}
    held, mode = limit_held(bmc, cap.path)
    out["set cap"] = Outcome(resp.power_cap_watts == CAP_W and held == CAP_W and
                             mode in (None, "Automatic", "Override", "Manual"),
                             "%s W at %s%s" % (held, cap.describe(), "" if mode is None
                                               else " (%s)" % mode))
    resp = devices.handle(cap_request("n1", None, resp.device_state_json))
    held, mode = limit_held(bmc, cap.path)
    restored = before.get("mode") == "Disabled" and mode == "Disabled" or (
        held == before.get("raw") and mode == before.get("mode"))
    out["uncap"] = Outcome(resp.success and restored, (resp.error if not resp.success else
                                                       "restored %s%s" % (held, "" if mode is None
                                                                          else " " + mode)))
    return out


def table(names: List[str]) -> str:
    lines = ["| tree | " + " | ".join(OPERATIONS) + " |",
             "|---" * (len(OPERATIONS) + 1) + "|"]
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            found = run_operations(mockup_dir(name), tmp)
        lines.append("| %s | %s |" % (name, " | ".join(found[op].cell() for op in OPERATIONS)))
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(sys.argv[1:] or mockup_names()))
