"""The exporter over HTTP: exact values on a simulated run, read-only, and its failures."""
import os
import sys
import socket
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from metrics.simrun import run_cycles, run_groups
from pbs_power.metrics.exporter import (ExporterError, address, make_exporter, parse_listen,
                                        serve_in_thread)
from pbs_power.metrics.families import METRICS, PREFIX, exported_names

T0 = 1_800_000_000.0


def scrape(state_dir, clock=None):
    """{(sample name, sorted labels): value} from one HTTP scrape."""
    server = make_exporter(state_dir, "127.0.0.1:0", clock)
    serve_in_thread(server)
    try:
        with urllib.request.urlopen(address(server), timeout=5) as answer:
            assert answer.status == 200
            text = answer.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def files(path):
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in Path(path).rglob("*")}


@pytest.fixture(scope="module")
def sim_dir(tmp_path_factory):
    state = str(tmp_path_factory.mktemp("state"))
    run_cycles(state, T0, cycles=14)
    run_groups(state)
    return state


def test_a_simulated_run_exports_exact_values(sim_dir):
    end = T0 + 13 * 300
    got = scrape(sim_dir, clock=lambda: end + 100)
    assert got[("pbs_power_nodes", (("state", "failed"),))] == 1
    assert got[("pbs_power_nodes", (("state", "off"),))] == 3
    assert got[("pbs_power_transitions_failed_total", (("kind", "power_on"),))] == 1
    assert got[("pbs_power_last_cycle_timestamp_seconds", ())] == end
    # n1, n2 down 1200 s, n3 2400 s (closed); n4 since T0+600, n5, n6 since T0+1200
    now = end + 100
    expected = 240.0 * (1200 + 1200 + 2400 + (now - T0 - 600) + 2 * (now - T0 - 1200))
    assert got[("pbs_power_energy_saved_joules_total", ())] == pytest.approx(expected)
    assert got[("pbs_power_power_saved_watts", ())] == 720.0
    assert got[("pbs_power_wake_wait_seconds_bucket", (("le", "300.0"),))] == 2
    assert got[("pbs_power_wake_wait_seconds_bucket", (("le", "120.0"),))] == 0
    assert got[("pbs_power_domain_reserved_watts", (("domain", "rack-a"),))] == 3000
    # b4 fails its activation, then the restore of the failed group's nodes (which
    # also goes to b4, since it may hold the new cap): two failed device requests
    assert got[("pbs_power_device_request_errors_total",
                (("backend", "simulated"), ("reason", "other")))] == 2
    assert got[("pbs_power_store_up", (("store", "states"),))] == 1


def test_every_listed_metric_is_exported_and_only_those(sim_dir):
    got = {name for name, _labels in scrape(sim_dir)}
    assert got <= set(exported_names())
    bases = {n[len(PREFIX):] for n in got}
    for name, (kind, _doc) in METRICS.items():
        suffix = {"counter": "_total", "histogram": "_count"}.get(kind, "")
        assert name + suffix in bases, name


def test_a_scrape_changes_no_database(sim_dir):
    """Read-only: the databases are untouched (SQLite readers may add -wal/-shm files)."""
    def databases():
        return {p: v for p, v in files(sim_dir).items()
                if not p.name.endswith(("-wal", "-shm"))}
    before = databases()
    scrape(sim_dir)
    assert databases() == before


def test_nothing_recorded_yet_reads_as_stores_down_and_zeros(tmp_path):
    got = scrape(str(tmp_path))
    assert got[("pbs_power_store_up", (("store", "states"),))] == 0
    assert got[("pbs_power_store_up", (("store", "groups"),))] == 0
    assert got[("pbs_power_nodes", (("state", "on"),))] == 0
    assert list(tmp_path.iterdir()) == []


def test_listen_addresses():
    assert parse_listen("127.0.0.1:9850") == ("127.0.0.1", 9850)
    assert parse_listen("[::1]:0") == ("::1", 0)
    assert parse_listen("9999") == ("127.0.0.1", 9999)
    for bad in ("host:http", "127.0.0.1:70000"):
        with pytest.raises(ExporterError, match="port"):
            parse_listen(bad)


def test_a_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ExporterError, match="cannot listen on 127.0.0.1:%d" % port):
            make_exporter(str(tmp_path), "127.0.0.1:%d" % port)


def test_every_metric_is_documented():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    for name, (kind, _help) in METRICS.items():
        shown = PREFIX + name + ("_total" if kind == "counter" else "")
        assert "`%s`" % shown in doc, shown
    assert os.path.basename(__file__)


def test_without_prometheus_client_the_exporter_says_what_to_install(tmp_path, monkeypatch,
                                                                     capsys):
    from pbs_power.cli.main import main
    monkeypatch.setitem(sys.modules, "prometheus_client", None)    # import fails
    assert main(["exporter", "--state-dir", str(tmp_path), "--listen", "127.0.0.1:0"]) == 1
    assert "pip install prometheus_client" in capsys.readouterr().err


def test_domain_budget_matches_the_services_budget_arithmetic():
    from metrics.simrun import TOPOLOGY
    from pbs_power.groups.budget import usage
    from pbs_power.groups.topology import parse_topology
    from pbs_power.metrics.readers import DomainBudget
    topo = parse_topology(TOPOLOGY)
    alloc = {"a1": 1000.0, "a2": 700.0, "b4": 500.0, "gone": 900.0}
    expected = usage(topo, alloc)
    got = DomainBudget(topo).usage(alloc.items())
    assert {name: watts for name, watts, _limit in got} == expected
    assert {name: limit for name, _w, limit in got} == {
        "feed": 10000.0, "rack-a": 3000.0, "rack-b": 3000.0}
