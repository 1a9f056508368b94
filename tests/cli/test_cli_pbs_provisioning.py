"""`pbs-power pbs install` and the server's power_provisioning, against the fake qmgr.

The fake follows OpenPBS 23.06 as seen on a real server: power_provisioning
is PBS_power's ``enabled`` flag, recomputed only when that hook has a
periodic event, so enabling it with no events leaves the attribute as it
was until the event is set and unset again (the hook never runs).
"""
from __future__ import annotations

import json

from pbs_power.pbs import install as pi

from test_cli_pbs import cli, fake  # noqa: F401  (fixture)


def test_an_install_turns_power_provisioning_on_with_pbs_power_never_running(fake, capsys):
    code, out, err = cli(capsys, *fake.argv("--apply"))
    assert code == 0, err
    state = fake.read()
    assert state["server"]["power_provisioning"] is True
    assert state["pbshooks"]["PBS_power"] == {"enabled": "true"}      # no event left


def test_an_uninstall_gives_pbs_power_back_as_shipped(fake, capsys):
    assert cli(capsys, *fake.argv("--apply"))[0] == 0
    code, out, err = cli(capsys, *fake.argv("--apply", "--uninstall"))
    assert code == 0, err
    state = fake.read()
    assert state["server"]["power_provisioning"] is False
    assert state["pbshooks"]["PBS_power"] == {
        "enabled": "false", "event": pi.PROVISIONING_HOOK_EVENTS}


def test_no_power_provisioning_leaves_the_server_alone(fake, capsys):
    code, out, err = cli(capsys, *fake.argv("--apply", "--no-power-provisioning"))
    assert code == 0, err
    assert "power_provisioning left as it is" in out
    state = fake.read()
    assert state["server"]["power_provisioning"] is False
    assert not [c for c in state["log"] if "pbshook" in c]


def test_eoe_policies_keep_power_provisioning_off(fake, capsys):
    doc = json.loads(fake.config.read_text())
    doc.setdefault("job_policies", {})["eoe_policies"] = {"eco": "Node-Low"}
    fake.config.write_text(json.dumps(doc))
    code, out, err = cli(capsys, *fake.argv("--apply"))
    assert code == 0, err
    assert "power_provisioning left off: job_policies.eoe_policies is set" in out
    assert fake.read()["server"]["power_provisioning"] is False


def test_a_server_without_the_pbs_power_hook_skips_those_steps(fake, capsys):
    state = fake.read()
    state["pbshooks"] = {}
    fake.write(state)
    code, out, err = cli(capsys, *fake.argv("--apply"))
    assert code == 0, err
    assert out.count("not there, skipped") == 4
    assert fake.read()["server"]["power_provisioning"] is False
