"""A config is checked for what will be used, as it will be used: bounded numbers,
real ranges, usable paths and files, and a FIFO that never hangs the loader."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pbs_power.config.hook_config import ConfigError, load_config, parse_config


def problems(data) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "test.json")
    return str(info.value)


@pytest.mark.parametrize("key,value,bound", [
    ("node_idle_limit", 1e30, "31536000"),
    ("node_idle_limit", "99999999999999999999999999", "31536000"),
    ("min_node_down_delay", 2 ** 63, "31536000"),
    ("boot_timeout", 9223372036854775808, "65533"),
    ("shutdown_timeout", 70000, "65533"),
    ("max_concurrent_nodes", 2 ** 40, "65533"),
    ("cycle_interval", 10 ** 9, "86400"),
    ("node_boot_time", 10 ** 7, "86400"),
    ("min_idle_nodes", 10 ** 12, "1000000"),
    ("max_ramp_watts_per_minute", 1e30, "1000000000"),
])
def test_huge_numbers_are_refused_with_the_bound(key, value, bound):
    message = problems({key: value})
    assert "%s must be %s or less" % (key, bound) in message


def test_the_bound_says_why_where_slurm_sets_it():
    assert "Slurm's ResumeTimeout is a 16-bit" in problems({"boot_timeout": 65534})


def test_values_at_the_bound_are_accepted():
    config = parse_config({"node_idle_limit": 31536000, "boot_timeout": 65533,
                           "shutdown_timeout": 65533, "max_concurrent_nodes": 65533})
    assert config.boot_timeout == 65533


def test_a_hostlist_range_below_zero_is_refused():
    assert "range that starts below 0" in problems({"exclude_nodes": "n[-5-3]"})
    assert "range that starts below 0" in problems({"exclude_nodes": "n[1,-3]"})
    assert parse_config({"exclude_nodes": "n[1-3],m-1"}).exclude_nodes


def test_state_dir_must_be_a_usable_directory(tmp_path):
    assert "NUL byte" in problems({"state_dir": "/var/spool/pbs\x00power"})
    regular = tmp_path / "file"
    regular.write_text("x")
    assert "is not a directory" in problems({"state_dir": str(regular)})
    assert parse_config({"state_dir": str(tmp_path / "new")}).state_dir == str(tmp_path / "new")


@pytest.mark.parametrize("data,where", [
    ({"power_backend": {"type": "command", "argv": ["bin/capmc", "power"]}},
     "power_backend.argv[0]"),
    ({"job_policies": {"device_options": {"command": {"argv": ["./agent.sh", "x"]}}}},
     "job_policies.device_options.command.argv[0]"),
])
def test_a_site_program_is_not_a_relative_path(data, where):
    message = problems(data)
    assert where + " is a relative path" in message


def test_a_site_program_may_be_a_bare_name_or_absolute():
    for program in ("ssh", "/opt/site/bin/capmc"):
        config = parse_config({"power_backend": {"type": "command", "argv": [program]}})
        assert config.power_backend.options["argv"] == [program]


def test_credentials_open_to_others_are_refused_at_validation(tmp_path):
    creds = tmp_path / "bmc.json"
    creds.write_text(json.dumps({"username": "u", "password": "p"}))
    creds.chmod(0o644)
    data = {"power_backend": {"type": "ipmi", "credentials_file": str(creds)}}
    assert "has mode 0644" in problems(data)
    creds.chmod(0o600)
    assert parse_config(data).power_backend.type == "ipmi"


def test_a_fifo_with_no_writer_is_an_error_not_a_hang(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    code = "from pbs_power.cli.main import main; raise SystemExit(main(%r))" % (
        ["config", "validate", str(fifo)],)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2 and "is empty" in out.stderr


def test_a_fifo_with_a_writer_is_read(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    script = ("import os, sys, time; fd = os.open(%r, os.O_RDWR); os.write(fd, b'{}'); "
              "print('ready', flush=True); time.sleep(1); os.close(fd)" % str(fifo))
    writer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        assert load_config(str(fifo)).node_idle_limit == 1800
    finally:
        writer.wait(timeout=10)
        writer.stdout.close()


def test_a_url_template_the_redfish_backend_would_refuse_is_refused_at_validation():
    data = {"power_backend": {"type": "redfish", "auth": "none",
                              "url_template": "https://{host}-{rack}-bmc"}}
    assert "power_backend.url_template: only {host} may be used in braces" in problems(data)
    data["power_backend"]["url_template"] = "https://{host}-bmc"
    assert parse_config(data).power_backend.type == "redfish"
