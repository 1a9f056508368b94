"""Tests of the hook config: loading, validation messages, samples and `pbs-power config`."""
from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from pbs_power.config import checks as config_check
from pbs_power.cli.main import main
from pbs_power.config.hook_config import (
    MODE_DISABLED, MODE_POWER_ON_OFF, MODE_RAMP_RATE, WARN_ANALYZE_LIMIT, WARN_BOTH_ENABLED,
    BackendConfig, ConfigError, ConfigProblem, HookConfig, NodePower, config_to_dict,
    load_config, parse_config,
)

ROOT = Path(__file__).resolve().parents[2]
HOOK_SAMPLE = ROOT / "hooks" / "PBS_power.json"
FULL_SAMPLE = ROOT / "config" / "pbs_power.json"
OPENPBS_CF = ROOT / "config" / "PBS_power.CF.openpbs"
OPENPBS_CF_TEXT = ('{"power_ramp_rate_enable": false, "power_on_off_enable": false, '
                   '"node_idle_limit": "1800", "min_node_down_delay": "1800", '
                   '"max_jobs_analyze_limit": "100", "max_concurrent_nodes": "5"}')
INTERNAL = {"excluded_hosts", "warnings"}


def problems_of(data):
    with pytest.raises(ConfigError) as info:
        parse_config(data, "test.json")
    return info.value


def write(tmp_path, text, name="cfg.json"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# --- defaults and accepted input --------------------------------------------

def test_empty_document_gives_the_dataclass_defaults():
    config = parse_config({})
    assert config == HookConfig()
    assert config.mode == MODE_DISABLED
    assert config.warnings == ()
    assert config.power_backend == BackendConfig()


def test_openpbs_default_cf_is_accepted_with_numbers_coerced():
    assert OPENPBS_CF.read_text().strip() == OPENPBS_CF_TEXT
    config = load_config(OPENPBS_CF)
    assert (config.node_idle_limit, config.min_node_down_delay, config.max_concurrent_nodes,
            config.max_jobs_analyze_limit) == (1800, 1800, 5, 100)
    assert all(isinstance(v, int) for v in (config.node_idle_limit, config.max_concurrent_nodes))
    assert config.mode == MODE_DISABLED
    assert config.warnings == (WARN_ANALYZE_LIMIT,)
    assert "ignored" in WARN_ANALYZE_LIMIT


def test_both_enables_warn_in_pbs_words_and_power_on_off_wins():
    config = parse_config({"power_ramp_rate_enable": True, "power_on_off_enable": True})
    assert config.warnings == ("power_on_off_enable is over-riding power_ramp_rate_enable",)
    assert WARN_BOTH_ENABLED in config.warnings
    assert config.mode == MODE_POWER_ON_OFF
    assert parse_config({"power_ramp_rate_enable": True}).mode == MODE_RAMP_RATE


@pytest.mark.parametrize("text,value", [
    ("true", True), ("false", False), ("True", True), ("False", False), (" TRUE ", True),
])
def test_boolean_strings_from_a_naive_cf(text, value):
    assert parse_config({"power_on_off_enable": text}).power_on_off_enable is value


@pytest.mark.parametrize("key,given,expected", [
    ("node_idle_limit", "1800", 1800),
    ("node_idle_limit", " 30 ", 30),
    ("node_idle_limit", 1800.0, 1800),
    ("min_node_down_delay", "0", 0),
    ("max_concurrent_nodes", "+7", 7),
    ("cycle_interval", "600.0", 600),
    ("min_idle_nodes", 0, 0),
    ("max_ramp_watts_per_minute", " 2.5e3 ", 2500.0),
    ("max_ramp_watts_per_minute", 100, 100.0),
])
def test_numbers_and_numeric_strings(key, given, expected):
    data = {key: given}
    if key == "max_ramp_watts_per_minute":
        data["node_power"] = {}
    value = getattr(parse_config(data), key)
    assert value == expected and type(value) is type(expected)


def test_zero_is_legitimate_for_down_delay_and_warm_pool():
    config = parse_config({"min_node_down_delay": 0, "min_idle_nodes": 0})
    assert (config.min_node_down_delay, config.min_idle_nodes) == (0, 0)


def test_exclude_nodes_normalized_and_expanded():
    config = parse_config({"exclude_nodes": "n[003-004], login[1-2],n001,n002"})
    assert config.exclude_nodes == "login[1-2],n[001-004]"
    assert config.excluded_hosts == frozenset(
        ["login1", "login2", "n001", "n002", "n003", "n004"])
    listed = parse_config({"exclude_nodes": ["login[1-2]", "n[001-004]"]})
    assert listed.exclude_nodes == config.exclude_nodes
    assert parse_config({"exclude_nodes": ""}).excluded_hosts == frozenset()


def test_node_power_and_overrides_inherit_missing_watts():
    config = parse_config({
        "node_power": {"idle_watts": 200, "busy_watts": "500"},
        "node_power_overrides": [{"nodes": "gpu[2,1]", "busy_watts": 2800},
                                 {"nodes": "gpu1,big1", "off_watts": 0}],
    })
    assert config.node_power == NodePower(busy_watts=500.0, idle_watts=200.0)
    assert config.node_power_overrides == (
        ("gpu[1-2]", NodePower(busy_watts=2800.0, idle_watts=200.0)),
        ("big1,gpu1", NodePower(busy_watts=500.0, idle_watts=200.0, off_watts=0.0)),
    )
    assert config.power_of("gpu1").busy_watts == 2800.0  # the first match wins
    assert config.power_of("big1").off_watts == 0.0
    assert config.power_of("n1") == config.node_power
    without_base = parse_config({"node_power_overrides": [{"nodes": "x1", "busy_watts": 900}]})
    assert without_base.node_power is None
    assert without_base.power_of("x1") == NodePower(busy_watts=900.0)


def test_backend_options_are_coerced_and_normalized():
    config = parse_config({"power_backend": {"type": "simulated", "boot_seconds": "120",
                                             "fail_nodes": ["n2", "n1"], "seed": "7"}})
    assert config.power_backend == BackendConfig(
        "simulated", {"boot_seconds": 120, "fail_nodes": "n[1-2]", "seed": 7})
    assert parse_config({"power_backend": {}}).power_backend == BackendConfig()


def test_python_path_single_string_and_comment_ignored():
    config = parse_config({"_comment": "a note", "python_path": "/opt/pbs_power/lib",
                           "state_dir": "/tmp/pp", "log_level": "debug"})
    assert config.python_path == ("/opt/pbs_power/lib",)
    assert (config.state_dir, config.log_level) == ("/tmp/pp", "debug")


def test_max_jobs_analyze_limit_null_is_unset_without_warning():
    config = parse_config({"max_jobs_analyze_limit": None})
    assert config.max_jobs_analyze_limit is None and config.warnings == ()


def test_duplicate_keys_in_a_file_are_a_warning(tmp_path):
    path = write(tmp_path, '{"node_idle_limit": 60, "node_idle_limit": 90}')
    config = load_config(path)
    assert config.node_idle_limit == 90
    assert config.warnings == ("duplicate key 'node_idle_limit': JSON keeps only its last value",)


# --- samples -----------------------------------------------------------------

def test_shipped_hook_config_is_safe():
    config = load_config(HOOK_SAMPLE)
    assert config.mode == MODE_DISABLED
    assert config.warnings == ()
    assert config.power_backend.type == "simulated"
    assert config.state_dir == "/var/spool/pbs_power"


def test_full_sample_validates():
    config = load_config(FULL_SAMPLE)
    assert config.mode == MODE_POWER_ON_OFF
    assert config.warnings == ()
    assert config.excluded_hosts == frozenset(["login1", "login2"])
    assert config.min_idle_nodes == 2
    assert config.node_power is not None and config.max_ramp_watts_per_minute
    assert config.power_backend.type == "simulated" and config.power_backend.options


@pytest.mark.parametrize("path", [HOOK_SAMPLE, FULL_SAMPLE, OPENPBS_CF])
def test_cli_validates_samples(path, capsys):
    assert main(["config", "validate", str(path)]) == 0
    assert capsys.readouterr().out == "%s: OK\n" % path


# --- show ----------------------------------------------------------------------

def test_show_prints_every_key_with_defaults(capsys):
    assert main(["config", "show", str(FULL_SAMPLE)]) == 0
    shown = json.loads(capsys.readouterr().out)
    fields = [f.name for f in dataclasses.fields(HookConfig) if f.name not in INTERNAL]
    assert list(shown) == fields
    assert shown["exclude_nodes"] == "login[1-2]"
    assert shown["power_backend"]["type"] == "simulated"
    assert shown["node_power_overrides"][0]["nodes"] == "gpu[01-08]"
    assert shown["node_power_overrides"][0]["sleep_watts"] == 90.0  # inherited


def test_show_defaults(capsys):
    assert main(["config", "show", "--defaults"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["node_power"] is None
    assert shown["node_idle_limit"] == 1800 and shown["state_dir"] == "/var/spool/pbs_power"
    assert shown["power_backend"] == {"type": "simulated", "boot_seconds": 300,
                                      "boot_jitter_seconds": 0, "wake_seconds": 30,
                                      "shutdown_seconds": 60, "sleep_seconds": 10,
                                      "fail_nodes": "", "seed": 0}
    assert not INTERNAL & set(shown)


def test_show_output_is_a_valid_config_with_the_same_effect(tmp_path, capsys):
    assert main(["config", "show", str(OPENPBS_CF)]) == 0
    out, err = capsys.readouterr()
    assert err == "warning: %s\n" % WARN_ANALYZE_LIMIT
    again = load_config(write(tmp_path, out))
    assert config_to_dict(again) == json.loads(out)
    assert config_to_dict(load_config(FULL_SAMPLE)) == config_to_dict(
        parse_config(config_to_dict(load_config(FULL_SAMPLE))))


def test_schema_is_valid_and_matches_the_dataclass_defaults():
    from jsonschema import Draft7Validator
    schema = config_check.load_schema()
    Draft7Validator.check_schema(schema)
    fields = {f.name: f for f in dataclasses.fields(HookConfig)}
    for key, prop in schema["properties"].items():
        if key == "_comment":
            continue
        assert key in fields, key
        prop = config_check._resolve(prop, schema)
        if isinstance(fields[key].default, (int, str, type(None))) and "default" in prop:
            assert prop["default"] == fields[key].default, key
    assert set(fields) - set(schema["properties"]) == INTERNAL


# --- CLI -----------------------------------------------------------------------

def test_cli_validate_reports_problems_and_exits_2(tmp_path, capsys):
    path = write(tmp_path, '{"node_idle_limt": 5, "max_concurrent_nodes": 0}')
    assert main(["config", "validate", path]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "%s: max_concurrent_nodes must be greater than 0, got 0" % path,
        "%s: unknown key 'node_idle_limt' (did you mean 'node_idle_limit'?)" % path,
    ]


def test_cli_validate_prints_warnings_on_stderr(capsys):
    assert main(["config", "validate", str(OPENPBS_CF)]) == 0
    out, err = capsys.readouterr()
    assert out == "%s: OK\n" % OPENPBS_CF
    assert err == "warning: %s\n" % WARN_ANALYZE_LIMIT


@pytest.mark.parametrize("argv", [
    ["config", "validate", "/nonexistent/pbs_power.json"],
    ["config", "show", "/nonexistent/pbs_power.json"],
])
def test_cli_missing_file_exits_2(argv, capsys):
    assert main(argv) == 2
    assert "/nonexistent/pbs_power.json: file not found" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    [], ["config"], ["config", "show", "--defaults", "x.json"],
    ["config", "validate"], ["nosuchcommand"], ["config", "validate", "a", "b"],
])
def test_cli_usage_errors_exit_2(argv, capsys):
    assert main(argv) == 2
    assert "usage:" in capsys.readouterr().err


def test_cli_version_and_help(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("pbs-power ")
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "Power management for HPC batch clusters" in out and "config" in out
    for argv in (["config", "--help"], ["config", "validate", "--help"],
                 ["config", "show", "--help"]):
        assert main(argv) == 0
        assert "usage: pbs-power config" in capsys.readouterr().out


def test_cli_works_under_python_OO(tmp_path):
    code = ("import sys; from pbs_power.cli.main import main; "
            "sys.exit(main(['config', 'validate', sys.argv[1]]))")
    done = subprocess.run([sys.executable, "-OO", "-c", code, str(FULL_SAMPLE)],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "%s: OK\n" % FULL_SAMPLE), done.stderr
    done = subprocess.run([sys.executable, "-OO", "-c", code, write(tmp_path, '{"x": 1}')],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown key 'x'" in done.stderr
    helped = subprocess.run([sys.executable, "-OO", "-c",
                             "from pbs_power.cli.main import main; main(['--help'])"],
                            capture_output=True, text=True, timeout=60)
    assert "Power management" in helped.stdout


# --- bad configs ---------------------------------------------------------------

BAD = [
    # unknown keys, with and without a suggestion, at every level
    ("misspelt-key", {"node_idle_limt": 5},
     "node_idle_limt", "unknown key 'node_idle_limt' (did you mean 'node_idle_limit'?)"),
    ("unknown-key", {"frobnicate": 1}, "frobnicate", "unknown key 'frobnicate'"),
    ("comment-not-underscore", {"comment": "x"}, "comment", "(did you mean '_comment'?)"),
    ("unknown-nested-key", {"node_power": {"idle_watt": 5}},
     "node_power.idle_watt", "unknown key 'idle_watt' in node_power (did you mean 'idle_watts'?)"),
    ("unknown-override-key", {"node_power_overrides": [{"nodes": "n1", "busy": 5}]},
     "node_power_overrides[0].busy", "unknown key 'busy' in node_power_overrides[0]"),
    # wrong types
    ("bool-yes", {"power_on_off_enable": "yes"},
     "power_on_off_enable", "power_on_off_enable must be true or false, got 'yes'"),
    ("bool-list", {"power_ramp_rate_enable": [True]},
     "power_ramp_rate_enable", "must be true or false, got a list"),
    ("bool-number", {"power_on_off_enable": 1}, "power_on_off_enable", "got 1"),
    ("int-object", {"max_concurrent_nodes": {}},
     "max_concurrent_nodes", "max_concurrent_nodes must be an integer, got an object"),
    ("int-null", {"node_idle_limit": None}, "node_idle_limit", "must be an integer, got null"),
    ("int-bool", {"node_idle_limit": True}, "node_idle_limit", "must be an integer, got true"),
    ("comment-not-string", {"_comment": 5}, "_comment", "_comment must be a string, got 5"),
    # limits
    ("negative-limit", {"node_idle_limit": -5},
     "node_idle_limit", "node_idle_limit must be greater than 0, got -5"),
    ("zero-concurrent", {"max_concurrent_nodes": 0},
     "max_concurrent_nodes", "must be greater than 0, got 0"),
    ("zero-cycle-string", {"cycle_interval": "0"}, "cycle_interval", "must be greater than 0"),
    ("zero-boot-time", {"node_boot_time": 0}, "node_boot_time", "must be greater than 0"),
    ("zero-wake-time", {"node_wake_time": 0}, "node_wake_time", "must be greater than 0"),
    ("negative-shutdown", {"shutdown_timeout": -1}, "shutdown_timeout", "greater than 0"),
    ("negative-down-delay", {"min_node_down_delay": -1},
     "min_node_down_delay", "min_node_down_delay must be 0 or more, got -1"),
    ("negative-warm-pool", {"min_idle_nodes": "-2"}, "min_idle_nodes", "must be 0 or more"),
    ("zero-analyze-limit", {"max_jobs_analyze_limit": 0},
     "max_jobs_analyze_limit", "must be greater than 0"),
    ("zero-ramp", {"max_ramp_watts_per_minute": 0, "node_power": {}},
     "max_ramp_watts_per_minute", "must be greater than 0"),
    # numeric strings that are not numbers, and floats for integers
    ("non-numeric", {"node_idle_limit": "30m"}, "node_idle_limit",
     "node_idle_limit wants seconds as a number or a numeric string, got '30m'"),
    ("empty-numeric", {"shutdown_timeout": ""}, "shutdown_timeout", "got ''"),
    ("nan-string", {"boot_timeout": "nan"}, "boot_timeout", "wants seconds as a number"),
    ("infinite", {"boot_timeout": float("inf")}, "boot_timeout", "must be a finite number"),
    ("float-for-int", {"node_boot_time": 1.5},
     "node_boot_time", "node_boot_time must be an integer, got 1.5"),
    ("float-string-for-int", {"max_jobs_analyze_limit": "1.5"},
     "max_jobs_analyze_limit", "must be an integer or null, got 1.5"),
    # boot_timeout against node_boot_time
    ("timeout-equals-boot", {"node_boot_time": 900, "boot_timeout": 900}, "boot_timeout",
     "boot_timeout (900) must be greater than node_boot_time (900)"),
    ("boot-over-default-timeout", {"node_boot_time": 2000}, "boot_timeout",
     "boot_timeout (1800, the default) must be greater than node_boot_time (2000)"),
    # hostlists
    ("bad-hostlist", {"exclude_nodes": "n[1-"}, "exclude_nodes",
     "exclude_nodes is not a valid hostlist expression 'n[1-': missing bracket"),
    ("bad-hostlist-item", {"exclude_nodes": ["login1", "n[3-1]"]},
     "exclude_nodes[1]", "is not a valid hostlist expression 'n[3-1]': bad range"),
    ("hostlist-type", {"exclude_nodes": 5}, "exclude_nodes",
     "exclude_nodes must be a hostlist expression (string) or a list of them, got 5"),
    ("node-group", {"exclude_nodes": "@compute"}, "exclude_nodes",
     "names '@compute', which is not a host name"),
    ("huge-range", {"exclude_nodes": "n[1-100000000]"}, "exclude_nodes",
     "names about 100000000 hosts"),
    ("bad-override-hostlist", {"node_power_overrides": [{"nodes": "gpu[01-"}]},
     "node_power_overrides[0].nodes",
     "node_power_overrides[0].nodes is not a valid hostlist expression 'gpu[01-'"),
    ("override-without-nodes", {"node_power_overrides": [{"busy_watts": 5}]},
     "node_power_overrides[0]", "node_power_overrides[0] needs the key 'nodes'"),
    ("override-empty-nodes", {"node_power_overrides": [{"nodes": ""}]},
     "node_power_overrides[0].nodes", "must not be empty"),
    ("overrides-object", {"node_power_overrides": {"nodes": "n1"}},
     "node_power_overrides", "node_power_overrides must be a list, got an object"),
    # watts
    ("watts-order", {"node_power": {"idle_watts": 50}}, "node_power.idle_watts",
     "node_power.sleep_watts (90, the default) must not exceed node_power.idle_watts (50)"),
    ("override-watts-order",
     {"node_power": {"busy_watts": 500}, "node_power_overrides": [{"nodes": "n1", "idle_watts": 600}]},
     "node_power_overrides[0].idle_watts",
     "node_power_overrides[0].idle_watts (600) must not exceed "
     "node_power_overrides[0].busy_watts (500, from node_power)"),
    ("negative-watts", {"node_power": {"off_watts": -1}},
     "node_power.off_watts", "node_power.off_watts must be 0 or more, got -1"),
    ("watts-word", {"node_power": {"busy_watts": "a lot"}}, "node_power.busy_watts",
     "node_power.busy_watts wants watts as a number or a numeric string, got 'a lot'"),
    ("node-power-type", {"node_power": "lots"},
     "node_power", "node_power must be an object or null, got 'lots'"),
    ("ramp-without-watts", {"max_ramp_watts_per_minute": 5000}, "max_ramp_watts_per_minute",
     "max_ramp_watts_per_minute needs node watts: set node_power "
     "(a topology file will also provide them later)"),
    # backend
    ("backend-redfish", {"power_backend": {"type": "redfish"}}, "power_backend",
     "power_backend needs the key 'credentials_file'"),
    ("backend-ipmi", {"power_backend": {"type": "ipmi"}}, "power_backend",
     "power_backend needs the key 'credentials_file'"),
    ("backend-unknown", {"power_backend": {"type": "bmc"}}, "power_backend.type",
     "power_backend.type 'bmc' is not a known backend type (available: simulated"),
    ("backend-misspelt", {"power_backend": {"type": "simulate"}}, "power_backend.type",
     "(did you mean 'simulated'?)"),
    ("backend-option-unknown", {"power_backend": {"boot_secs": 1}}, "power_backend.boot_secs",
     "unknown key 'boot_secs' in power_backend (did you mean 'boot_seconds'?)"),
    ("backend-option-value", {"power_backend": {"boot_seconds": 0}}, "power_backend.boot_seconds",
     "power_backend.boot_seconds must be greater than 0, got 0"),
    ("backend-jitter", {"power_backend": {"boot_jitter_seconds": -1}},
     "power_backend.boot_jitter_seconds", "must be 0 or more"),
    ("backend-option-word", {"power_backend": {"wake_seconds": "soon"}},
     "power_backend.wake_seconds", "wants seconds as a number or a numeric string"),
    ("backend-fail-nodes", {"power_backend": {"fail_nodes": "n[1-"}}, "power_backend.fail_nodes",
     "power_backend.fail_nodes is not a valid hostlist expression"),
    ("backend-seed", {"power_backend": {"seed": 1.5}}, "power_backend.seed",
     "power_backend.seed must be an integer, got 1.5"),
    ("backend-jitter-over-boot", {"power_backend": {"boot_jitter_seconds": 400}},
     "power_backend.boot_jitter_seconds",
     "power_backend.boot_jitter_seconds (400) must not exceed power_backend.boot_seconds "
     "(300, the default)"),
    ("backend-string", {"power_backend": "simulated"}, "power_backend",
     "power_backend must be an object such as {\"type\": \"simulated\"}, got 'simulated'"),
    # document shape, paths, logging
    ("top-level-array", [1, 2], "", "the configuration must be a JSON object ({...}), got a list"),
    ("top-level-string", "node_idle_limit=5", "", "must be a JSON object"),
    ("empty-state-dir", {"state_dir": ""}, "state_dir", "state_dir must not be empty"),
    ("relative-state-dir", {"state_dir": "spool"}, "state_dir",
     "state_dir must be an absolute path, got 'spool'"),
    ("null-state-dir", {"state_dir": None}, "state_dir", "state_dir must be a string, got null"),
    ("bad-log-level", {"log_level": "verbose"}, "log_level",
     "log_level must be one of 'debug', 'info', 'warning', 'error', got 'verbose'"),
    ("log-level-near", {"log_level": "WARN"}, "log_level", "(did you mean 'warning'?)"),
    ("python-path-type", {"python_path": 5}, "python_path",
     "python_path must be a directory (string) or a list of directories, got 5"),
    ("python-path-item", {"python_path": ["/opt/lib", 3]}, "python_path[1]",
     "python_path[1] must be a string, got 3"),
    ("python-path-relative", {"python_path": ["lib"]}, "python_path[0]",
     "python_path[0] must be an absolute path, got 'lib'"),
]


@pytest.mark.parametrize("data,path,fragment", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_config(data, path, fragment):
    before = copy.deepcopy(data)
    err = problems_of(data)
    assert data == before  # parse_config does not touch its input
    assert any(p.path == path and fragment in p.message for p in err.problems), str(err)
    assert all(line.startswith("test.json: ") for line in str(err).splitlines())
    assert len(err.problems) == len(str(err).splitlines())


def test_bad_configs_are_distinct_and_many():
    assert len(BAD) >= 30
    assert len({json.dumps(b[1], sort_keys=True, default=str) for b in BAD}) == len(BAD)


def test_every_problem_is_collected_and_sorted_by_path():
    err = problems_of({
        "power_backend": {"type": "simulated", "boot_secs": 1, "fail_nodes": "x["},
        "node_idle_limit": "30m",
        "exclude_nodes": "n[1-",
        "node_power_overrides": [{"nodes": "a1"}, {"nodes": "b["}, {"nodes": "c1", "x": 1}],
        "cycle_interval": 0,
        "log_level": "loud",
    })
    assert [p.path for p in err.problems] == [
        "cycle_interval", "exclude_nodes", "log_level", "node_idle_limit",
        "node_power_overrides[1].nodes", "node_power_overrides[2].x",
        "power_backend.boot_secs", "power_backend.fail_nodes",
    ]


def test_one_mistake_gives_one_message():
    err = problems_of({"node_idle_limit": "30m", "node_power": {"busy_watts": "x"}})
    assert len(err.problems) == 2


# --- files -----------------------------------------------------------------------

@pytest.mark.parametrize("text,fragment", [
    ('{"node_idle_limit": 5,\n  "cycle_interval" 300}',
     "invalid JSON at line 2, column 20: Expecting ':' delimiter"),
    ('{"a": 1,}', "invalid JSON at line 1, column 9"),
    ("", "the file is empty"),
    ("[]", "the configuration must be a JSON object"),
])
def test_bad_files(tmp_path, text, fragment):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(path + ": ")
    assert fragment in str(info.value)


def test_missing_unreadable_and_binary_files(tmp_path):
    with pytest.raises(ConfigError, match="nope.json: file not found"):
        load_config(tmp_path / "nope.json")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)
    binary = tmp_path / "bin.json"
    binary.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(binary)


def test_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b'\xef\xbb\xbf{"node_idle_limit": 60}')
    assert load_config(path).node_idle_limit == 60


# --- purity and the error type --------------------------------------------------

def test_config_error_leaves_nothing_half_built():
    data = {"node_idle_limit": 600, "exclude_nodes": "n[1-4]", "cycle_interval": -1,
            "node_power": {"idle_watts": 200}}
    before = copy.deepcopy(data)
    result = None
    with pytest.raises(ConfigError):
        result = parse_config(data)
    assert result is None
    assert data == before
    assert HookConfig().node_idle_limit == 1800  # defaults untouched
    data["cycle_interval"] = 60
    first, second = parse_config(data), parse_config(data)
    assert first == second and first.node_idle_limit == 600
    assert first.excluded_hosts == frozenset(["n1", "n2", "n3", "n4"])


def test_config_error_shape():
    err = ConfigError([ConfigProblem("a.b", "a.b is wrong"), ConfigProblem("c", "c is bad")],
                      "cfg.json")
    assert isinstance(err, ValueError)
    assert str(err) == "cfg.json: a.b is wrong\ncfg.json: c is bad"
    assert str(ConfigError([ConfigProblem("c", "c is bad")])) == "c is bad"
    assert str(ConfigError("plain", "f.json")) == "f.json: plain"
    copied = pickle.loads(pickle.dumps(err))
    assert (copied.problems, copied.source, str(copied)) == (err.problems, err.source, str(err))


def test_job_policies_section():
    cfg = parse_config({"job_policies": {"fail_open": "true", "allow_reprovision": True,
                                         "queue_defaults": {"gpuq": "Node-High"},
                                         "eoe_policies": {"low": "Node-Low"}}})
    jp = cfg.job_policies
    assert jp.fail_open and jp.allow_reprovision and not jp.strict
    assert jp.queue_defaults == {"gpuq": "Node-High"} and jp.eoe_policies == {"low": "Node-Low"}
    assert parse_config({}).job_policies.queue_defaults == {}


@pytest.mark.parametrize("doc,message", [
    ({"job_policies": {"fail_opn": True}}, "unknown key 'fail_opn' in job_policies (did you mean 'fail_open'?)"),
    ({"job_policies": {"strict": 1}}, "job_policies.strict must be true or false"),
    ({"job_policies": {"queue_defaults": {"gpuq": ""}}}, "job_policies.queue_defaults.gpuq"),
])
def test_bad_job_policies(doc, message):
    with pytest.raises(ConfigError) as err:
        parse_config(doc)
    assert message in str(err.value)
