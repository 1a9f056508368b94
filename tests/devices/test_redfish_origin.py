"""Credentials stay with the configured BMC; TLS and configuration problems say what they are.

A second server on 127.0.0.1 (`Recorder`) stands for "another origin": it
records every request it receives. The mock BMC hands out links, redirects
and session locations that point at it; the tests check that it receives
nothing at all (so neither Basic credentials nor a session token), and that
the backend says why it did not follow.
"""
from __future__ import annotations

import logging
import os
import sys
import warnings

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from redfish_vendor import cap_request, options  # noqa: E402
from emulators.mock_bmc import MockBmc, key, mockup_dir, mockup_names  # noqa: E402
from emulators.origin_recorder import Recorder  # noqa: E402
from emulators.redfish_emulator import make_tls  # noqa: E402

from pbs_power.devices.redfish.backend import RedfishBackend, RedfishDevices  # noqa: E402
from pbs_power.devices.redfish.origin import OriginError, resolve  # noqa: E402
from pbs_power.states.model import TransitionKind as K  # noqa: E402

pytestmark = pytest.mark.skipif(not mockup_names(), reason="../shared/redfish-mockups absent")
TREE = "dmtf-public-rackmount1"
SYSTEM = "/redfish/v1/Systems/437XR1138R2"


@pytest.fixture
def lab(tmp_path):
    started = []

    class Lab:
        def bmc(self, tree: str = TREE, **kw) -> MockBmc:
            bmc = MockBmc(mockup_dir(tree), users={"admin": "pw"}, **kw)
            started.append(bmc)
            return bmc.start()

        def recorder(self) -> Recorder:
            rec = Recorder()
            started.append(rec)
            return rec

        def backend(self, bmc: MockBmc, url=None, **kw) -> RedfishBackend:
            opts = options(bmc, "n1", str(tmp_path), **kw)
            if url:
                opts["bmcs"]["n1"]["url"] = url
            back = RedfishBackend(opts, str(tmp_path / "state"))
            started.append(back)
            return back

        def devices(self, bmc: MockBmc, **kw) -> RedfishDevices:
            dev = RedfishDevices(options(bmc, "n1", str(tmp_path), **kw))
            started.append(dev)
            return dev

    yield Lab()
    for thing in reversed(started):
        (thing.stop if isinstance(thing, (MockBmc, Recorder)) else thing.close)()


def test_links_to_another_origin_are_refused_and_get_nothing(lab):
    bmc, rec = lab.bmc(), lab.recorder()
    system = bmc.doc(SYSTEM)
    system["Links"]["Chassis"] = [{"@odata.id": rec.url + "/redfish/v1/Chassis/1U"}]
    system["Actions"]["#ComputerSystem.Reset"]["target"] = \
        rec.url + SYSTEM + "/Actions/ComputerSystem.Reset"
    devices = lab.devices(bmc)
    resp = devices.handle(cap_request("n1", 400, None))
    assert not resp.success
    assert "points to http://127.0.0.1:%d, not the configured %s" % (
        rec.server.server_address[1], bmc.url) in resp.error
    backend = lab.backend(bmc)
    sent = backend.request(K.POWER_OFF, ["n1"], 0)["n1"]
    assert not sent.ok and "not followed, so no credentials leave it" in sent.diag
    assert rec.seen == []
    assert bmc.power_state(SYSTEM) == "On"


@pytest.mark.parametrize("auth", ["basic", "session"])
def test_redirects_to_another_origin_are_not_followed(lab, auth):
    bmc, rec = lab.bmc(), lab.recorder()
    bmc.redirects[key(SYSTEM)] = rec.url + SYSTEM
    backend = lab.backend(bmc, auth=auth)
    assert backend.status(["n1"], 0)["n1"].state.value == "unknown"
    assert "redirected, and not followed" in backend.last_errors["n1"]
    assert rec.seen == []


def test_a_redirect_within_the_origin_is_followed(lab):
    bmc = lab.bmc()
    bmc.redirects[key("/redfish/v1/Systems/Old")] = SYSTEM
    backend = lab.backend(bmc, system_id="Old")
    assert backend.status(["n1"], 0)["n1"].state.value == "on", backend.last_errors


def test_https_bmc_links_to_plain_http_on_the_same_host_are_refused(lab, tmp_path):
    tls = make_tls(str(tmp_path / "tls"))
    bmc = MockBmc(mockup_dir(TREE), users={"admin": "pw"}, tls=tls).start()
    rec = lab.recorder()
    try:
        bmc.doc(SYSTEM)["Links"]["Chassis"] = [{"@odata.id": rec.url + "/redfish/v1/Chassis/1U"}]
        devices = RedfishDevices(dict(options(bmc, "n1", str(tmp_path)), ca_file=tls.ca_file,
                                      allow_http=False))
        resp = devices.handle(cap_request("n1", 400, None))
        devices.close()
    finally:
        bmc.stop()
    assert not resp.success and "not the configured https://127.0.0.1" in resp.error
    assert rec.seen == []


def test_session_location_on_another_origin_gets_no_delete(lab):
    bmc, rec = lab.bmc(), lab.recorder()
    real_login = bmc._login

    def login_elsewhere(body):
        reply = real_login(body)
        if reply.status == 201:
            reply.headers["Location"] = rec.url + reply.headers["Location"]
        return reply
    bmc._login = login_elsewhere
    backend = lab.backend(bmc, auth="session")
    assert backend.status(["n1"], 0)["n1"].state.value == "on", backend.last_errors
    backend.close()
    assert rec.seen == []
    assert len(bmc.deleted_sessions) == 1 and bmc.sessions == {}  # deleted where it lives


# -- TLS --------------------------------------------------------------------------------
def test_hostname_mismatch_is_reported_as_such(lab, tmp_path):
    tls = make_tls(str(tmp_path / "tls"))  # names 127.0.0.1 only
    bmc = MockBmc(mockup_dir(TREE), users={"admin": "pw"}, tls=tls).start()
    try:
        port = bmc.server.server_address[1]
        backend = lab.backend(bmc, url="https://localhost:%d" % port, ca_file=tls.ca_file,
                              allow_http=False)
        backend.status(["n1"], 0)
    finally:
        bmc.stop()
    error = backend.last_errors["n1"]
    assert "certificate does not name localhost (hostname mismatch)" in error
    assert "ca_file" not in error


def test_verify_false_gives_one_log_line_not_a_warning_per_request(lab, tmp_path, caplog):
    tls = make_tls(str(tmp_path / "tls"))
    bmc = MockBmc(mockup_dir(TREE), users={"admin": "pw"}, tls=tls).start()
    try:
        with warnings.catch_warnings(record=True) as seen, \
                caplog.at_level(logging.WARNING):
            warnings.simplefilter("always")
            backend = lab.backend(bmc, verify=False, allow_http=False)
            for _ in range(3):
                assert backend.status(["n1"], 0)["n1"].state.value == "on"
    finally:
        bmc.stop()
    assert [w for w in seen if "Unverified HTTPS" in str(w.message)] == []
    assert sum("TLS certificate not verified" in r.getMessage() for r in caplog.records) <= 1


# -- check: configuration is not reachability; a row without a cap says why ------------------
def test_check_reports_configuration_errors_as_such(lab):
    bmc = lab.bmc("dmtf-public-bladed")
    answer = lab.backend(bmc).check("n1")
    assert answer["reachable"] is True
    assert "configuration:" in answer["diag"] and "4 systems at /redfish/v1/Systems" \
        in answer["diag"] and "set system_id" in answer["diag"]


@pytest.mark.parametrize("tree,system_id,why", [
    ("dmtf-public-bladed", "529QB9450R6", "no power limit resource at chassis"),
    ("hpe-cray-ex425", "Node0", "capping disabled (ControlMode Disabled, SetPoint 0 W)"),
    ("hpe-ilo5-dl325", None, "no limit set (LimitInWatts null)"),
    ("openbmc-bmcweb", None, "no limit set (LimitInWatts null)"),
])
def test_check_explains_a_row_without_a_cap(lab, tree, system_id, why):
    bmc = lab.bmc(tree)
    answer = lab.backend(bmc, system_id=system_id).check("n1")
    assert answer["reachable"] is True and answer["power_cap_watts"] is None
    assert why in answer["diag"], answer["diag"]


# -- the origin rule itself ------------------------------------------------------------------
@pytest.mark.parametrize("link, allowed", [
    ("/redfish/v1/Systems/1", True),
    ("Systems/1", True),
    ("https://BMC.example:443/redfish/v1", True),          # case and default port
    ("https://bmc.example/redfish/v1?$expand=.", True),
    ("http://bmc.example/redfish/v1", False),              # downgrade to plain http
    ("https://bmc.example:8443/redfish/v1", False),        # another port
    ("https://other.example/redfish/v1", False),
    ("//other.example/redfish/v1", False),                 # scheme-relative
    ("https://bmc.example@other.example/redfish/v1", False),  # userinfo trick
])
def test_only_links_on_the_configured_origin_resolve(link, allowed):
    if allowed:
        assert resolve("https://bmc.example", link).startswith("https://")
    else:
        with pytest.raises(OriginError, match="not the configured https://bmc.example"):
            resolve("https://bmc.example", link)
