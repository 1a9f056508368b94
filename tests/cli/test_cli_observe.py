"""`pbs-power status` and `pbs-power history` on a simulated run."""
from __future__ import annotations

import json
import time

import pytest

from metrics.simrun import run_cycles, run_groups
from pbs_power.cli.main import main
from pbs_power.metrics.status import parse_since


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    """A state directory after 14 simulated cycles ending now, and three groups."""
    d = str(tmp_path_factory.mktemp("state"))
    t0 = time.time() - 13 * 300 - 60
    run_cycles(d, t0, cycles=14)
    run_groups(d)
    return d, t0


def cli(capsys, *argv):
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_status_screen(state, capsys):
    d, _t0 = state
    code, out, _err = cli(capsys, "status", "--state-dir", d)
    assert code == 0
    assert "nodes: 6  on 2  asleep 0  off 3  powering_up 0  powering_down 0  failed 1" in out
    assert "last cycle: " in out and "ago, ran in" in out
    assert "saving 720 W now" in out
    assert "failed, need an admin: 1" in out and "clear once fixed: pbsnodes -r n1" in out
    assert "resource groups: active 1, inactive 2" in out
    assert "domain rack-a             3000 W of 3000 W (headroom 0 W)" in out
    assert len(out.splitlines()) <= 25


def test_status_json(state, capsys):
    d, t0 = state
    code, out, _err = cli(capsys, "status", "--json", "--state-dir", d)
    doc = json.loads(out)
    assert code == 0
    assert doc["nodes"] == {"on": 2, "asleep": 0, "off": 3, "powering_up": 0,
                            "powering_down": 0, "failed": 1}
    assert [f["host"] for f in doc["failed"]] == ["n1"]
    assert doc["last_cycle"]["started"] == t0 + 13 * 300
    assert doc["last_cycle"]["outcome"] == "ran"
    # n1, n2 down 1200 s, n3 2400 s, and n4, n5, n6 still off: at 240 W each
    now = doc["time"]
    joules = 240.0 * (1200 + 1200 + 2400 + (now - t0 - 600) + 2 * (now - t0 - 1200))
    assert doc["energy_saved_kwh"]["total"] == pytest.approx(joules / 3.6e6, abs=0.001)
    assert doc["energy_saved_kwh"]["last_7_days"] == pytest.approx(joules / 3.6e6, abs=0.001)
    assert {d["name"]: d["headroom_watts"] for d in doc["domains"]} == {
        "feed": 5000.0, "rack-a": 0.0, "rack-b": 1000.0}
    assert doc["groups"] == {"active": 1, "inactive": 2}


def test_history_of_a_failed_node(state, capsys):
    d, _t0 = state
    code, out, _err = cli(capsys, "history", "n1", "--state-dir", d)
    lines = out.splitlines()
    assert code == 0 and lines[0] == "history of n1"
    assert [line.split()[2:4] for line in lines[1:5]] == [
        ["power_off", "started"], ["power_off", "completed"], ["power_on", "started"],
        ["power_on", "failed"]]
    assert "completed in 30s" in lines[2] and "job 42.sim needs it" in lines[3]
    assert "did not power on within boot_timeout=600s" in lines[4]
    assert lines[5].startswith("now: failed since") and "pbsnodes -r n1" in lines[5]


def test_history_since_and_json(state, capsys):
    d, t0 = state
    code, out, _err = cli(capsys, "history", "n3", "--since", str(t0 + 1000), "--json",
                          "--state-dir", d)
    doc = json.loads(out)
    assert code == 0
    assert [(e["kind"], e["event"], e["seconds"]) for e in doc["events"]] == [
        ("power_on", "started", None), ("power_on", "completed", 300.0)]
    assert doc["now"]["state"].startswith("on")


def test_history_shows_the_groups_a_node_was_in(state, capsys):
    d, _t0 = state
    _code, out, _err = cli(capsys, "history", "b1", "--state-dir", d)
    assert "group rg_2 activated (policy Med)" in out
    assert "group rg_2 deactivated" in out
    assert out.index("rg_2 activated") < out.index("rg_2 deactivated")
    assert "now: on (as far as the store knows); group rg_2 (inactive" in out
    _code, out, _err = cli(capsys, "history", "b4", "--state-dir", d)
    assert "group rg_3 activation failed (policy Med)" in out


def test_history_of_an_unknown_node_and_a_bad_since(state, capsys):
    d, _t0 = state
    code, out, _err = cli(capsys, "history", "zz9", "--state-dir", d)
    assert code == 0 and "(no events recorded)" in out and "in no resource group" in out
    code, _out, err = cli(capsys, "history", "n1", "--since", "yesterday-ish",
                          "--state-dir", d)
    assert code == 2 and "--since 'yesterday-ish'" in err


def test_status_before_anything_was_recorded(tmp_path, capsys):
    code, out, _err = cli(capsys, "status", "--state-dir", str(tmp_path))
    assert code == 0 and "nodes: no cycle recorded yet" in out
    assert "note: states: " in out and list(tmp_path.iterdir()) == []


def test_since_forms():
    now = 1_800_000_000.0
    assert parse_since("90m", now) == now - 5400
    assert parse_since("2d", now) == now - 172800
    assert parse_since("1700000000", now) == 1_700_000_000.0
    assert parse_since("2026-11-25T08:00", now) == time.mktime(
        time.strptime("2026-11-25 08:00", "%Y-%m-%d %H:%M"))


def test_a_big_cluster_still_fits_one_screen():
    from pbs_power.metrics.status import SHOWN_DOMAINS, SHOWN_HOSTS, status_text
    doc = {"time": 1e9, "state_dir": "/s", "nodes": {"on": 9000, "off": 1000}, "eligible": 10000,
           "last_cycle": None, "energy_saved_kwh": {"today": 1, "last_7_days": 2, "total": 3},
           "power_saved_watts": 240000.0, "groups": {"active": 1000}, "errors": [],
           "in_transition": [{"host": "n%d" % i, "kind": "power_on", "phase": "booting",
                              "started": 1e9 - 60, "phase_since": 1e9 - 30, "reason": ""}
                             for i in range(40)],
           "failed": [{"host": "f%d" % i, "reason": "r", "since": 1e9, "clear": "pbsnodes -r"}
                      for i in range(30)],
           "domains": [{"name": "rack-%03d" % i, "reserved_watts": 1000.0 + i,
                        "budget_watts": 2000.0, "headroom_watts": 1000.0 - i}
                       for i in range(150)]}
    lines = status_text(doc).splitlines()
    assert len(lines) < 2 * SHOWN_HOSTS + SHOWN_HOSTS + SHOWN_DOMAINS + 12
    assert "  ... 25 more (--json lists all)" in lines
    assert "  ... 15 more (--json lists all)" in lines
    shown = [line.split()[1] for line in lines if line.startswith("  domain ")]
    assert shown == ["rack-%03d" % i for i in range(149, 149 - SHOWN_DOMAINS, -1)]
