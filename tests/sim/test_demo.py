"""`pbs-power demo`: the main job runs end to end and reports honestly."""
import json

from pbs_power.cli.main import main
from pbs_power.sim.demo import run_demo


def test_demo_saves_energy_and_prints_each_cycle():
    lines = []
    summary = run_demo(hosts=16, hours=8, seed=3, out=lines.append)
    cycles = [l for l in lines if "| queued" in l]
    assert len(cycles) == 8 * 12                      # one line per 300 s cycle
    assert lines[-1].startswith("energy: ") and "always-on" in lines[-1]
    assert 0 < summary["kwh"] < summary["baseline_kwh"]
    assert summary["power_downs"] > 0 and summary["failed"] == 0
    assert summary["started"] == summary["jobs"]


def test_demo_cli_json_summary(capsys):
    assert main(["demo", "--hosts", "8", "--hours", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"kwh", "baseline_kwh", "saved_pct", "added_wait_p95"}


def test_demo_cli_rejects_bad_config(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"node_idle_limt": 5}')
    assert main(["demo", "--config", str(bad)]) == 2
    assert "did you mean 'node_idle_limit'" in capsys.readouterr().err


def test_demo_counts_hosts_going_down_apart_from_hosts_coming_up():
    import re
    lines = []
    run_demo(hosts=16, hours=8, seed=3, out=lines.append)
    assert "max_ramp_watts_per_minute" in lines[1]
    rows = [re.search(r"booting +(\d+) shutting down +(\d+)", line) for line in lines]
    rows = [(int(m.group(1)), int(m.group(2))) for m in rows if m]
    assert rows and any(down > 0 for _, down in rows)
    for line in lines:
        m = re.search(r"busy +(\d+) idle +(\d+) asleep/off +(\d+) booting +(\d+) "
                      r"shutting down +(\d+)", line)
        if m:
            assert sum(int(g) for g in m.groups()) == 16, line
