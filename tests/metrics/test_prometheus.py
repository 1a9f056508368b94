"""A real Prometheus scrapes ``pbs-power exporter`` while simulated cycles and groups run.

Debian's ``prometheus`` (tests/setup.sh installs it) is started on 127.0.0.1
with a free port, its own data directory and a one-second scrape of the
exporter, itself started as ``python -m pbs_power.cli exporter``. The test
asserts through Prometheus' HTTP query API, so what is checked is what a
site's Prometheus would store.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

from metrics.simrun import HOSTS, run_cycles, run_groups
from metrics.test_dashboard import concrete, expressions as dashboard_expressions

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed "
                                                           "(tests/setup.sh installs it)")
WAIT_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return answer.read()


@pytest.fixture
def exporter(tmp_path):
    """``pbs-power exporter`` on a free port over tmp_path/state; yields (state_dir, url)."""
    state = tmp_path / "state"
    state.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "pbs_power.cli", "exporter", "--listen",
                             "127.0.0.1:0", "--state-dir", str(state)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "serving http://127.0.0.1:" in line, line + proc.stderr.read()
        url = line.split("serving ")[1].split()[0]
        yield str(state), url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def prometheus(tmp_path, exporter):
    """Prometheus scraping the exporter every second; yields its query function."""
    target = urllib.parse.urlparse(exporter[1]).netloc
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({        # YAML is a superset of JSON
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "pbs_power", "scrape_interval": "1s",
                            "static_configs": [{"targets": [target]}]}]}))
    port = free_port()
    log = open(tmp_path / "prometheus.log", "w")
    proc = subprocess.Popen([PROMETHEUS, "--config.file=%s" % config,
                             "--storage.tsdb.path=%s" % (tmp_path / "tsdb"),
                             "--web.listen-address=127.0.0.1:%d" % port,
                             "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
    base = "http://127.0.0.1:%d" % port

    def query(expr: str):
        doc = json.loads(get(base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
        assert doc["status"] == "success", doc
        return doc["data"]["result"]

    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                if get(base + "/-/ready").strip():
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.2)
        yield query
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def wait_for(query, expr: str, expected, label: str = None):
    """Poll ``expr`` until its value(s) equal ``expected``; the last answer on timeout.

    ``expected`` is a number (one series) or {label value: number}.
    """
    deadline = time.monotonic() + WAIT_S
    while True:
        result = query(expr)
        if label is None:
            got = float(result[0]["value"][1]) if len(result) == 1 else result
        else:
            got = {r["metric"].get(label, ""): float(r["value"][1]) for r in result}
        if got == expected or time.monotonic() > deadline:
            return got
        time.sleep(0.25)


def test_series_reach_prometheus_with_the_stores_values(exporter, prometheus):
    state_dir, _url = exporter
    query = prometheus
    assert wait_for(query, 'up{job="pbs_power"}', 1.0) == 1.0
    # Nothing recorded yet: the store is not there, and the exporter says so.
    assert wait_for(query, "pbs_power_store_up", {"states": 0.0, "groups": 0.0},
                    "store") == {"states": 0.0, "groups": 0.0}

    t0 = time.time() - 14 * 300
    run_cycles(state_dir, t0, cycles=1)      # 4 drain, 2 wait for a slot
    assert wait_for(query, "pbs_power_hosts_held_back", {"ramp": 0.0, "other": 0.0,
                    "max_concurrent_nodes": 2.0, "delay": 0.0}, "reason") == {
        "ramp": 0.0, "max_concurrent_nodes": 2.0, "delay": 0.0, "other": 0.0}
    assert wait_for(query, "pbs_power_nodes", {"on": 2.0, "powering_down": 4.0, "asleep": 0.0,
                    "off": 0.0, "powering_up": 0.0, "failed": 0.0}, "state")["powering_down"] == 4

    shutil.rmtree(state_dir)                  # the full run, from a fresh store
    os.mkdir(state_dir)
    sim = run_cycles(state_dir, t0, cycles=14)
    run_groups(state_dir)
    assert wait_for(query, "pbs_power_cycles_total", {"ran": 14.0, "skipped": 0.0,
                    "query_failed": 0.0}, "outcome") == {"ran": 14.0, "skipped": 0.0,
                                                         "query_failed": 0.0}
    assert wait_for(query, "pbs_power_nodes", {"on": 2.0, "off": 3.0, "failed": 1.0,
                    "asleep": 0.0, "powering_up": 0.0, "powering_down": 0.0}, "state") == {
        "on": 2.0, "off": 3.0, "failed": 1.0, "asleep": 0.0, "powering_up": 0.0,
        "powering_down": 0.0}
    assert sorted(sim.cluster.offline) == ["n1"]
    assert wait_for(query, 'pbs_power_nodes_eligible{eligible="true"}', 6.0) == 6.0
    assert wait_for(query, "pbs_power_transitions_started_total", {
        "power_off": 6.0, "power_on": 3.0, "sleep": 0.0, "wake": 0.0}, "kind") == {
        "power_off": 6.0, "power_on": 3.0, "sleep": 0.0, "wake": 0.0}
    assert wait_for(query, 'pbs_power_transitions_completed_total{kind="power_on"}', 2.0) == 2.0
    assert wait_for(query, 'pbs_power_transitions_failed_total{kind="power_on"}', 1.0) == 1.0
    # Boots took 300 s (200 s to power on, seen usable at the next cycle), shutdowns 30 s.
    assert wait_for(query, 'pbs_power_boot_duration_seconds_sum{kind="power_on"}'
                           ' / pbs_power_boot_duration_seconds_count{kind="power_on"}',
                    300.0) == 300.0
    assert wait_for(query, 'pbs_power_shutdown_duration_seconds_bucket{kind="power_off",'
                           'le="30.0"}', 6.0) == 6.0
    # Three hosts are off now (n4, n5, n6), each saving idle 250 W - off 10 W.
    assert wait_for(query, "pbs_power_power_saved_watts", 720.0) == 720.0
    # Energy: n1..n4 off from t0+600, n5 and n6 from t0+1200; n1 and n2 woken at
    # t0+1800, n3 (in n1's place) at t0+3000; n4, n5, n6 still off, saving now.
    result = query("pbs_power_energy_saved_joules_total")[0]["value"]
    at, value = float(result[0]), float(result[1])
    expected = 240.0 * (1200 + 1200 + 2400 + (at - t0 - 600) + 2 * (at - t0 - 1200))
    assert abs(value - expected) <= 720.0 * 3    # the sample is up to ~2 scrapes old
    # The job's two wakes both came 300 s after its estimated start.
    assert wait_for(query, "pbs_power_jobs_waited_for_wake_total", 2.0) == 2.0
    assert wait_for(query, "pbs_power_wake_wait_seconds_sum", 600.0) == 600.0
    # Resource groups: rg_1 active, rg_2 deactivated, rg_3 failed on device b4.
    assert wait_for(query, "pbs_power_resource_groups", {"active": 1.0, "inactive": 2.0,
                    "activating": 0.0, "deactivating": 0.0}, "status") == {
        "active": 1.0, "inactive": 2.0, "activating": 0.0, "deactivating": 0.0}
    assert wait_for(query, "pbs_power_domain_budget_watts - pbs_power_domain_reserved_watts",
                    {"feed": 5000.0, "rack-a": 0.0, "rack-b": 1000.0}, "domain") == {
        "feed": 5000.0, "rack-a": 0.0, "rack-b": 1000.0}
    assert wait_for(query, "pbs_power_group_activations_total", {"active": 2.0, "failed": 1.0},
                    "outcome") == {"active": 2.0, "failed": 1.0}
    assert wait_for(query, "pbs_power_group_activation_duration_seconds_count", 2.0) == 2.0
    # the failing device is asked twice: its activation, then its group's restore
    assert wait_for(query, 'sum(pbs_power_device_request_errors_total{backend="simulated"})',
                    2.0) == 2.0
    assert len(HOSTS) == 6
    # Every query of the shipped dashboard runs on this Prometheus and finds series.
    # (A series born mid-run needs a second sample before increase() sees it.)
    for title, expr in dashboard_expressions():
        deadline = time.monotonic() + WAIT_S
        while not query(concrete(expr)) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert query(concrete(expr)), (title, expr)
