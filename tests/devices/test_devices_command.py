"""The command backends: real site scripts (small Python programs written by each test)."""
from __future__ import annotations

import json
import os
import sys
import textwrap
import time

import pytest

from pbs_power.config.hook_config import BackendConfig
from pbs_power.devices import BackendError, HostPower, get_backend
from pbs_power.devices.command import CommandBackend, CommandDevices
from pbs_power.devices.controller import DeviceController, DeviceRequest
from pbs_power.devices.site_script import ScriptError, build_argv
from pbs_power.states.model import PowerState, TransitionKind

ON, OFF = PowerState.ON, PowerState.OFF

#: A capmc-like site script: keeps each host's state in its own file (calls for
#: several hosts run at once), logs every call.
FAKE_CAPMC = """
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
operation, host = sys.argv[-2], sys.argv[-1]
request = json.load(sys.stdin)
with open(os.path.join(here, "calls.log"), "a") as log:
    log.write(json.dumps({"argv": sys.argv[1:], "request": request}) + "\\n")
path = os.path.join(here, "state-" + host)
state = open(path).read() if os.path.exists(path) else "off"
if host.startswith("bad"):
    sys.stderr.write("capmc: node %s not found\\n" % host)
    sys.exit(3)
if operation == "status":
    print(json.dumps({"success": True, "power_state": state, "since": 5.0,
                      "power_cap_watts": 900}))
elif operation in ("power_on", "power_off"):
    if host.startswith("locked"):
        print(json.dumps({"success": False, "error": "node is locked by admin"}))
        sys.exit(1)
    with open(path, "w") as f:
        f.write("on" if operation == "power_on" else "off")
    print(json.dumps({"success": True}))
else:
    print(json.dumps({"success": False, "error": "unsupported " + operation}))
"""


def script(tmp_path, body: str, name: str = "site.py") -> list:
    """Write ``body`` as a Python script in ``tmp_path``; its argv."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path)]


def calls(tmp_path) -> list:
    with open(tmp_path / "calls.log") as f:
        return [json.loads(line) for line in f]


@pytest.fixture
def backends():
    made = []
    yield made
    for backend in made:
        backend.close()


def power(tmp_path, backends, argv, **options):
    backend = get_backend(BackendConfig("command", dict(options, argv=argv)), str(tmp_path))
    backends.append(backend)
    return backend


def test_power_requests_and_status_through_a_site_script(tmp_path, backends):
    backend = power(tmp_path, backends, script(tmp_path, FAKE_CAPMC) + ["--site", "x"])
    assert isinstance(backend, CommandBackend)
    results = backend.request(TransitionKind.POWER_ON, ["n1", "n2"], 100.0)
    assert {h: r.ok for h, r in results.items()} == {"n1": True, "n2": True}
    assert results["n1"].diag == "power_on sent"
    assert backend.status(["n1", "n3"], 200.0) == {"n1": HostPower(ON, 5.0),
                                                   "n3": HostPower(OFF, 5.0)}
    logged = calls(tmp_path)
    # operation and host are separate argv items after the configured ones
    assert sorted(c["argv"] for c in logged[:2]) == [["--site", "x", "power_on", "n1"],
                                                     ["--site", "x", "power_on", "n2"]]
    first = logged[0]["request"]
    assert first["kind"] == "power_on" and first["device"] in ("n1", "n2")
    assert first["timeout_seconds"] == 60 and len(first["request_id"]) == 32


def test_failures_are_one_line_per_host_with_the_stderr_tail(tmp_path, backends):
    backend = power(tmp_path, backends, script(tmp_path, FAKE_CAPMC))
    results = backend.request(TransitionKind.POWER_OFF, ["n1", "bad1", "locked1"], 0.0)
    assert results["n1"].ok
    assert not results["bad1"].ok
    assert results["bad1"].diag == ("%s power_off: exited with status 3; stderr: capmc: node "
                                    "bad1 not found" % os.path.basename(sys.executable))
    assert "\n" not in results["bad1"].diag
    # a non-zero exit that explains itself keeps its explanation
    assert not results["locked1"].ok
    assert "node is locked by admin (exit status 1)" in results["locked1"].diag
    status = backend.status(["bad1"], 0.0)
    assert status == {"bad1": HostPower(PowerState.UNKNOWN, None)}


def test_bad_json_answer(tmp_path, backends):
    argv = script(tmp_path, """
        import sys
        sys.stdin.read()
        print("Node power on issued")
        sys.stderr.write("warning: old capmc\\nusing defaults\\n")
    """)
    results = power(tmp_path, backends, argv).request(TransitionKind.POWER_ON, ["n1"], 0.0)
    diag = results["n1"].diag
    assert not results["n1"].ok
    assert "power_on: answered no JSON object (stdout 'Node power on issued')" in diag
    assert diag.endswith("stderr: warning: old capmc | using defaults")


def test_answer_without_success_is_refused(tmp_path, backends):
    argv = script(tmp_path, 'import json; print(json.dumps({"ok": True}))')
    result = power(tmp_path, backends, argv).request(TransitionKind.WAKE, ["n1"], 0.0)["n1"]
    assert (result.ok, result.diag) == (False, "wake: the answer has no boolean 'success'")


def test_timeout_kills_the_whole_process_group(tmp_path, backends):
    pidfile = tmp_path / "child.pid"
    argv = script(tmp_path, """
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open(sys.argv[1], "w").write(str(child.pid))
        sys.stderr.write("waiting for the BMC\\n"); sys.stderr.flush()
        time.sleep(120)
    """) + [str(pidfile)]
    # 4 s: time enough, even on a loaded machine, for the script to start its child
    backend = power(tmp_path, backends, argv, timeout_seconds=4)
    begin = time.monotonic()
    result = backend.request(TransitionKind.POWER_ON, ["n1"], 0.0)["n1"]
    elapsed = time.monotonic() - begin
    assert elapsed < 4 + 20  # the timeout plus a generous margin for a loaded machine
    assert not result.ok
    assert "power_on: timed out after 4s (process group killed)" in result.diag
    assert "stderr: waiting for the BMC" in result.diag
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the script's child outlived the timeout"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by init) counts as dead
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_missing_program_and_unsafe_host_names(tmp_path, backends):
    backend = power(tmp_path, backends, [str(tmp_path / "no-such-capmc")])
    result = backend.request(TransitionKind.POWER_ON, ["n1"], 0.0)["n1"]
    assert not result.ok and "cannot run" in result.diag and "no-such-capmc" in result.diag
    backend = power(tmp_path, backends, script(tmp_path, FAKE_CAPMC))
    result = backend.request(TransitionKind.POWER_ON, ["n1;reboot"], 0.0)["n1;reboot"]
    assert not result.ok and "refusing host 'n1;reboot'" in result.diag
    assert not (tmp_path / "calls.log").exists()  # the script never ran


def test_placeholders_put_host_and_operation_where_the_remote_shell_needs_them():
    template = ["ssh", "-oBatchMode=yes", "{host}", "pbs-power", "node", "gpu-caps",
                "{operation}"]
    assert build_argv(template, "ping", "gpu01") == [
        "ssh", "-oBatchMode=yes", "gpu01", "pbs-power", "node", "gpu-caps", "ping"]
    assert build_argv(["capmc"], "power_on", "n1") == ["capmc", "power_on", "n1"]
    with pytest.raises(ScriptError, match="refusing operation"):
        build_argv(["capmc"], "$(reboot)", "n1")


def test_check_reports_reachability_state_and_cap(tmp_path, backends):
    backend = power(tmp_path, backends, script(tmp_path, FAKE_CAPMC))
    assert backend.check("n1") == {"reachable": True, "power_state": "off",
                                   "power_cap_watts": 900, "diag": ""}
    bad = backend.check("bad7")
    assert bad["reachable"] is False and "node bad7 not found" in bad["diag"]


@pytest.mark.parametrize("options,fragment", [
    ({}, "option argv must be a non-empty list"),
    ({"argv": "capmc power_on"}, "option argv must be a non-empty list"),
    ({"argv": ["capmc", ""]}, "option argv must be a non-empty list"),
    ({"argv": ["capmc"], "timeout_seconds": 0}, "option timeout_seconds must be a number > 0"),
    ({"argv": ["capmc"], "max_workers": 0}, "option max_workers must be an integer >= 1"),
    ({"argv": ["capmc"], "shell": True}, "unknown option(s) 'shell'"),
])
def test_bad_options_are_refused(tmp_path, options, fragment):
    with pytest.raises(BackendError) as err:
        get_backend(BackendConfig("command", options), str(tmp_path))
    assert fragment in str(err.value) and "power backend 'command'" in str(err.value)


# -- device requests --------------------------------------------------------------
#: Answers a device request the way the contract says, from what it was sent.
FAKE_DEVICE = """
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
kind, device = sys.argv[-2], sys.argv[-1]
req = json.load(sys.stdin)
with open(os.path.join(here, "requests.log"), "a") as log:
    log.write(json.dumps({"argv": sys.argv[1:], "request": req}) + "\\n")
model = json.loads(req["device_model_json"])
if device == "slow":
    import time; time.sleep(60)
if device == "crash":
    sys.stderr.write("Traceback: KeyError 'Oem'\\n"); sys.exit(2)
if device == "liar":
    print(json.dumps({"success": True, "request_id": "not-yours"})); sys.exit(0)
if device == "garbled":
    print(json.dumps({"success": True, "gpu_results": [{"gpu_id": "0", "ok": True}]}))
    sys.exit(0)
answer = {"success": True, "device_state_json": {"seen": kind}}
if kind == "ping":
    answer.update(ping_time=123.0, power_cap_watts=model["node"]["max_watts"])
else:
    answer.update(power_cap_watts=500.0, gpu_results=[
        {"gpu_id": 0, "ok": True, "power_cap_watts": 250.0},
        {"gpu_id": 1, "ok": False, "power_cap_watts": None, "diag_msg": "no permission"}])
print(json.dumps(answer))
"""

MODEL = json.dumps({"backend": "command", "node": {"max_watts": 1000}})


def device_request(device, kind="ping", payload=None, timeout=None):
    return DeviceRequest(device, kind, payload or {}, MODEL, timeout_seconds=timeout)


@pytest.fixture
def controller(tmp_path):
    argv = script(tmp_path, FAKE_DEVICE, "device.py")
    ctl = DeviceController({"command": CommandDevices.from_options({"argv": argv})},
                           default_timeout=30.0)
    yield ctl
    ctl.close()


def test_device_requests_follow_the_contract(tmp_path, controller):
    payload = {"resource_group": "rg_1", "policy": None}
    out = controller.send([device_request("n1"),
                           device_request("n2", "resource_group_activate", payload)])
    ping, act = out["n1"], out["n2"]
    assert ping.success and ping.ping_time == 123.0 and ping.power_cap_watts == 1000
    assert json.loads(ping.device_state_json) == {"seen": "ping"}
    assert act.success and act.power_cap_watts == 500.0
    assert [(r.gpu_id, r.ok, r.power_cap_watts, r.diag_msg) for r in act.gpu_results] == [
        (0, True, 250.0, ""), (1, False, None, "no permission")]
    with open(tmp_path / "requests.log") as f:
        logged = {c["argv"][-1]: c for c in map(json.loads, f)}
    sent = logged["n2"]["request"]
    assert logged["n2"]["argv"][-2:] == ["resource_group_activate", "n2"]
    assert sent["payload"] == payload and sent["device_model_json"] == MODEL
    assert sent["device_state_json"] is None and sent["timeout_seconds"] == 30.0
    assert sent["request_id"] == act.request_id and sent["device"] == "n2"


def test_device_failures_are_clear(controller):
    out = controller.send([device_request("crash"), device_request("liar"),
                           device_request("garbled", "gpu_policies_update")])
    assert not out["crash"].success
    assert out["crash"].error.endswith("ping: exited with status 2; stderr: Traceback: "
                                       "KeyError 'Oem'")
    assert out["crash"].ping_error == out["crash"].error
    assert (out["liar"].success, out["liar"].error) == (
        False, "no matching response (request_id mismatch)")
    assert out["garbled"].error == ("gpu_policies_update: bad answer: gpu_results[0].gpu_id "
                                    "must be an integer >= 0, not '0'")


def test_device_timeout_kills_the_script(controller):
    begin = time.monotonic()
    out = controller.send([device_request("slow", timeout=1.0), device_request("n1")])
    assert time.monotonic() - begin < 1 + 20  # generous margin on a loaded machine
    assert out["n1"].success
    assert not out["slow"].success and "timed out after 1s" in out["slow"].error


def test_close_kills_scripts_still_running(tmp_path):
    argv = script(tmp_path, FAKE_DEVICE, "device.py")
    backend = CommandDevices.from_options({"argv": argv})
    import threading
    answers = []
    worker = threading.Thread(target=lambda: answers.append(
        backend.handle(DeviceRequest("slow", "ping", {}, MODEL, None, "r1", 60.0))))
    worker.start()
    deadline = time.monotonic() + 20
    while not (tmp_path / "requests.log").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    backend.close()
    worker.join(20)
    assert not worker.is_alive()
    assert not answers[0].success and "killed by signal 9" in answers[0].error


def test_device_options_are_checked():
    with pytest.raises(BackendError, match="device backend 'command': option argv"):
        CommandDevices.from_options({"argv": []})
    with pytest.raises(BackendError, match=r"unknown option\(s\) 'max_workers'"):
        CommandDevices.from_options({"argv": ["x"], "max_workers": 3})
