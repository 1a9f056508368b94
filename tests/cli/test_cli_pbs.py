"""`pbs-power pbs install` against a fake qmgr, `pbs-power pbs nodes` against a fake pbsnodes."""
from __future__ import annotations

import json
import os
import re
import marshal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pbs_power.cli.main import main
from pbs_power.pbs import install as pi

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "config" / "topology.json"
SHIPPED_CONFIG = ROOT / "hooks" / "PBS_power.json"

# A stand-in for PBS's qmgr: keeps hooks and resources in a marshal file
# (json would import re: this runs ~30 times per install, so it starts
# lean) and parses attribute lists as qmgr does: an unquoted comma or blank
# ends a value, and what follows must be another "name = value".
FAKE_QMGR = r'''#!{python} -IS
import marshal, os, sys
STATE = {state!r}
EVENTS = {{"periodic", "runjob", "jobobit", "provision", "queuejob", "modifyjob", "execjob_begin",
          "execjob_prologue", "execjob_epilogue", "exechost_periodic", "exechost_startup",
          "execjob_end"}}
HOOK_ATTRS = {{"event", "freq", "alarm", "order", "enabled", "user", "fail_action", "type"}}

def die(msg, code=1):
    sys.stderr.write(msg + "\n")
    save(state)
    sys.exit(code)

def save(s):
    with open(STATE, "wb") as f:
        marshal.dump(s, f)

def attributes(text):
    out, i, n = {{}}, 0, len(text)
    while True:
        eq = text.find("=", i)
        name = text[i:eq].strip() if eq > 0 else ""
        if not name.replace("_", "").isalpha():
            die("qmgr: Syntax error")
        i = eq + 1
        while i < n and text[i] == " ":
            i += 1
        if i < n and text[i] in "\"'":
            end = text.find(text[i], i + 1)
            if end < 0:
                die("qmgr: Syntax error")
            value, i = text[i + 1:end], end + 1
        else:
            start = i
            while i < n and text[i] not in ", \t":
                i += 1
            value = text[start:i]
        if not value:
            die("qmgr: Syntax error")
        out[name] = value
        rest = text[i:].lstrip()
        if not rest:
            return out
        if rest[0] != ",":
            die("qmgr: Syntax error")
        i = n - len(rest) + 1

with open(STATE, "rb") as f:
    state = marshal.load(f)
if len(sys.argv) != 3 or sys.argv[1] != "-c":
    die("usage: qmgr -c command")
cmd = sys.argv[2]
state["log"].append(cmd)
if state.get("fail_on") and state["fail_on"] in cmd:
    die("qmgr obj=x svr=default: simulated failure", 7)
words = cmd.split(" ", 3)
if len(words) < 3 or words[0] not in ("list", "create", "set", "unset", "import", "delete") \
        or words[1] not in ("hook", "resource", "pbshook"):
    die("qmgr: Illegal operation")
verb, kind, name, rest = (words + [""])[:4]
if kind == "pbshook" and verb in ("create", "delete", "import"):
    die("qmgr: Illegal operation")
table = state[{{"hook": "hooks", "resource": "resources", "pbshook": "pbshooks"}}[kind]]
unknown = "qmgr obj=%s svr=default: Unknown %s" % (name, kind)
if verb == "list":
    if name not in table:
        die(unknown)
    print("%s %s" % (kind.capitalize(), name))
elif verb == "create":
    if name in table:
        die("qmgr obj=%s svr=default: %s already exists" % (name, kind), 2)
    table[name] = attributes(rest) if rest else {{}}
elif verb == "delete":
    if name not in table:
        die(unknown)
    del table[name]
elif name not in table:
    die(unknown)
elif verb == "unset":
    # `unset resource X flag` exits 0 whether or not a flag was set (OpenPBS 23.06)
    for key in rest.split(","):
        table[name].pop(key.strip(), None)
elif verb == "set":
    for key, value in attributes(rest).items():
        if key not in HOOK_ATTRS:
            die("qmgr obj=%s svr=default: Unknown attribute %s" % (name, key))
        if key == "event" and not set(value.split(",")) <= EVENTS:
            die("qmgr obj=%s svr=default: invalid event %s" % (name, value))
        table[name][key] = value
else:
    ctype, encoding, path = rest.split(" ", 2)
    if not os.path.isfile(path):
        die("%s - No such file or directory" % path)
    with open(path) as f:
        content = f.read()
    if ctype == "application/x-config":
        import json
        json.loads(content)
    table[name]["script" if ctype == "application/x-python" else "config"] = content
if kind == "pbshook" and verb in ("set", "unset") \
        and "periodic" in table[name].get("event", "").split(","):
    # power_provisioning follows PBS_power's enabled flag, recomputed only when
    # the hook has a periodic event (src/server/hook_func.c, svr_func.c)
    state["server"]["power_provisioning"] = table[name].get("enabled") == "true"
save(state)
'''

FAKE_PBSNODES = '''#!{python} -IS
import sys
with open({fixture!r}) as f:
    sys.stdout.write(f.read())
sys.exit({code})
'''

EPOCH_USED = 1763800000
EPOCH_CHANGE = 1763803600
CTIME = "Thu Nov 20 10:00:00 2025"


def write_exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


class FakePBS:
    """A PBS_EXEC with a fake qmgr (state in a JSON file) and hooks dir and config."""

    def __init__(self, tmp: Path):
        self.exec_dir = tmp / "pbs"
        (self.exec_dir / "bin").mkdir(parents=True)
        self.state = tmp / "qmgr_state.marshal"
        self.write({"hooks": {}, "resources": {}, "log": [], "server": {
            "power_provisioning": False}, "pbshooks": {"PBS_power": {
                "enabled": "false", "event": pi.PROVISIONING_HOOK_EVENTS}}})
        write_exe(self.exec_dir / "bin" / "qmgr",
                  FAKE_QMGR.format(python=sys.executable, state=str(self.state)))
        self.hooks = tmp / "hooks"
        self.hooks.mkdir()
        for spec in pi.HOOKS:
            (self.hooks / spec.file).write_text("# %s\n" % spec.name)
        doc = json.loads(SHIPPED_CONFIG.read_text())
        doc["python_path"] = ["/opt/pbs_power/lib"]
        self.config = tmp / "site.json"
        self.config.write_text(json.dumps(doc))

    def read(self) -> dict:
        return marshal.loads(self.state.read_bytes())

    def write(self, state: dict) -> None:
        self.state.write_bytes(marshal.dumps(state))

    def argv(self, *extra: str) -> list:
        return ["pbs", "install", "--pbs-exec", str(self.exec_dir), "--hooks-dir",
                str(self.hooks), "--config", str(self.config)] + list(extra)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.setenv("PBS_CONF_FILE", str(tmp_path / "no-pbs.conf"))
    return FakePBS(tmp_path)


def cli(capsys, *argv):
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def expected_commands(hooks: Path, config: Path) -> list:
    h, c = str(hooks), str(config)
    # power_policy is job-wide: qsub refuses a flag=h resource beside -l select/place
    # ("-lresource= cannot be used with select or place", OpenPBS 23.06)
    out = ["create resource power_policy type=string", "unset resource power_policy flag",
           "create resource power_mgmt type=boolean,flag=h"]
    for name, script, attrs in (
            ("pbs_power", "PBS_power.py",
             ["event = periodic", "freq = 30", "alarm = 240", "order = 1"]),
            ("pbs_power_job", "pbs_power_job.py",
             ['event = "queuejob,modifyjob,runjob,jobobit"', "alarm = 60", "order = 1"]),
            ("pbs_power_prov", "pbs_power_provision.py",
             ["event = provision", "alarm = 300", "order = 1"])):
        out.append("create hook %s" % name)
        out += ["set hook %s %s" % (name, a) for a in attrs]
        out.append("import hook %s application/x-python default %s/%s" % (name, h, script))
        out.append("import hook %s application/x-config default %s" % (name, c))
        out.append("set hook %s enabled = true" % name)
    return out


PROVISIONING_ON = ["unset pbshook PBS_power event", "set pbshook PBS_power enabled = true",
                   "set pbshook PBS_power event = periodic", "unset pbshook PBS_power event"]


# -- the plan --------------------------------------------------------------------
def test_install_commands_are_exactly_these(tmp_path):
    hooks, config = tmp_path / "hooks", tmp_path / "config.json"
    assert pi.install_commands(str(hooks), str(config)) == expected_commands(hooks, config)


def test_qmgr_values_are_quoted_only_when_needed():
    assert pi.qmgr_value("periodic") == "periodic"
    assert pi.qmgr_value("runjob,jobobit") == '"runjob,jobobit"'
    assert pi.qmgr_value("/my hooks/x.py") == '"/my hooks/x.py"'
    assert pi.qmgr_value('a"b') == "'a\"b'"
    for bad in ("", "a&b", "a\"b'c", "a\nb"):
        with pytest.raises(pi.InstallError):
            pi.qmgr_value(bad)


def test_pbs_conf_and_pbs_exec(tmp_path):
    conf = tmp_path / "pbs.conf"
    conf.write_text("# comment\nPBS_SERVER=svr\nPBS_EXEC = /opt/pbs \nPBS_HOME='/var/spool/pbs'\n")
    assert pi.parse_pbs_conf(conf.read_text()) == {
        "PBS_SERVER": "svr", "PBS_EXEC": "/opt/pbs", "PBS_HOME": "/var/spool/pbs"}
    assert pi.find_pbs_exec(None, {"PBS_CONF_FILE": str(conf)}) == "/opt/pbs"
    assert pi.find_pbs_exec("/x/pbs", {"PBS_CONF_FILE": str(conf)}) == "/x/pbs"
    conf.write_text("PBS_SERVER=svr\n")
    with pytest.raises(pi.InstallError, match="--pbs-exec"):
        pi.find_pbs_exec(None, {"PBS_CONF_FILE": str(conf)})


def test_a_probe_that_cannot_tell_stops_rather_than_guesses():
    R = pi.QmgrResult
    assert pi.probe_present(R(0, "Hook pbs_power")) is True
    assert pi.probe_present(R(1, "", "qmgr obj=pbs_power svr=default: Unknown hook")) is False
    assert pi.probe_present(R(3, "", "qmgr: cannot connect to server svr (errno=111)")) is None
    assert pi.probe_present(R(1, "", "qmgr obj=x svr=default: Unauthorized Request")) is None
    assert pi.probe_present(R(None, "", "cannot run /pbs/bin/qmgr: No such file")) is None
    runs = []

    def run(command):
        runs.append(command)
        return R(3, "", "qmgr: cannot connect to server svr")
    events = []
    steps = pi.uninstall_steps()
    assert not pi.run_steps(steps, run, lambda *e: events.append(e))
    assert runs == ["list hook pbs_power"]
    assert [(e[0].command, e[1]) for e in events] == [("list hook pbs_power", pi.FAILED)]


# -- print mode --------------------------------------------------------------------
def test_print_mode_prints_copyable_lines_and_runs_nothing(fake, capsys):
    code, out, err = cli(capsys, *fake.argv())
    assert code == 0, err
    qmgr = str(fake.exec_dir / "bin" / "qmgr")
    lines = [line for line in out.splitlines() if not line.startswith("#")]
    expected = expected_commands(fake.hooks, fake.config) + PROVISIONING_ON
    assert lines == ["%s -c '%s'" % (qmgr, c) for c in expected]
    assert "'set hook pbs_power_job event = \"queuejob,modifyjob,runjob,jobobit\"'" in out
    assert "python_path: /opt/pbs_power/lib" in out  # the config's own, imported as is
    assert fake.read()["log"] == []


def test_print_mode_without_pbs_exec_uses_plain_qmgr(fake, capsys):
    code, out, _ = cli(capsys, "pbs", "install", "--hooks-dir", str(fake.hooks),
                       "--config", str(fake.config))
    assert code == 0
    assert "PBS_EXEC unknown" in out
    assert "qmgr -c 'create hook pbs_power'" in out.splitlines()


def test_python_path_option_imports_a_copy(fake, tmp_path, capsys):
    copy = tmp_path / "out" / "PBS_power.json"
    copy.parent.mkdir()
    code, out, err = cli(capsys, *fake.argv("--python-path", "/srv/pbs_power",
                                            "--output-config", str(copy)))
    assert code == 0, err
    assert json.loads(copy.read_text())["python_path"] == ["/srv/pbs_power", "/opt/pbs_power/lib"]
    assert "application/x-config default %s'" % copy in out


def test_config_without_python_path_gets_where_pbs_power_runs_from(fake, capsys):
    doc = json.loads(fake.config.read_text())
    doc["python_path"] = []
    fake.config.write_text(json.dumps(doc))
    code, out, err = cli(capsys, *fake.argv("--apply"))
    assert code == 0, err
    assert "PBS runs hooks with its own Python" in out
    config = json.loads(fake.read()["hooks"]["pbs_power"]["config"])
    assert config["python_path"] == [pi.package_parent()]


# -- --apply -----------------------------------------------------------------------
def test_freq_follows_cycle_interval_and_an_old_host_flag_is_removed(fake, capsys):
    doc = json.loads(fake.config.read_text())
    fake.config.write_text(json.dumps(dict(doc, cycle_interval=120)))
    state = fake.read()
    state["resources"]["power_policy"] = {"type": "string", "flag": "h"}  # an earlier install
    fake.write(state)
    code, out, err = cli(capsys, *fake.argv("--apply"))
    assert code == 0, err
    after = fake.read()
    assert after["hooks"]["pbs_power"]["freq"] == "120"
    assert after["resources"]["power_policy"] == {"type": "string"}


def test_apply_twice_creates_nothing_the_second_time(fake, capsys):
    code, out, err = cli(capsys, *fake.argv("--apply"))
    assert code == 0, err
    first = fake.read()
    assert sorted(first["resources"]) == ["power_mgmt", "power_policy"]
    assert first["resources"]["power_policy"] == {"type": "string"}   # usable beside select
    assert first["resources"]["power_mgmt"] == {"type": "boolean", "flag": "h"}
    hooks = first["hooks"]
    assert sorted(hooks) == ["pbs_power", "pbs_power_job", "pbs_power_prov"]
    assert hooks["pbs_power"]["event"] == "periodic" and hooks["pbs_power"]["freq"] == "30"
    assert hooks["pbs_power_job"]["event"] == "queuejob,modifyjob,runjob,jobobit"
    assert hooks["pbs_power_prov"]["script"] == "# pbs_power_prov\n"
    assert all(h["enabled"] == "true" and h["order"] == "1" for h in hooks.values())
    assert json.loads(hooks["pbs_power_job"]["config"])["python_path"] == ["/opt/pbs_power/lib"]
    assert "'create hook pbs_power': done" in out

    code, out, err = cli(capsys, *fake.argv("--apply"))
    assert code == 0, err
    second = fake.read()
    new_log = second["log"][len(first["log"]):]
    assert not [c for c in new_log if c.startswith("create")]
    assert out.count("exists, skipped") == 5
    assert {k: v for k, v in second.items() if k != "log"} == \
        {k: v for k, v in first.items() if k != "log"}


def test_uninstall_keeps_resources_unless_asked(fake, capsys):
    assert cli(capsys, *fake.argv("--apply"))[0] == 0
    code, out, err = cli(capsys, *fake.argv("--apply", "--uninstall"))
    assert code == 0, err
    assert fake.read()["hooks"] == {}
    assert sorted(fake.read()["resources"]) == ["power_mgmt", "power_policy"]
    assert "kept: jobs and nodes may still reference them" in out

    code, out, err = cli(capsys, *fake.argv("--apply", "--uninstall", "--remove-resources"))
    assert code == 0, err
    assert out.count("not there, skipped") == 3
    assert fake.read()["resources"] == {}


def test_a_failing_command_stops_the_install(fake, capsys):
    state = fake.read()
    state["fail_on"] = "import hook pbs_power_job application/x-python"
    fake.write(state)
    code, out, err = cli(capsys, *fake.argv("--apply"))
    assert code == 1
    assert "simulated failure" in err
    assert "FAILED (exit 7)" in out
    assert "pbs_power_prov" not in fake.read()["hooks"]
    assert not any("pbs_power_prov" in c for c in fake.read()["log"])


def test_apply_needs_pbs_exec(fake, capsys):
    code, out, err = cli(capsys, "pbs", "install", "--apply", "--hooks-dir", str(fake.hooks),
                         "--config", str(fake.config))
    assert code == 2
    assert "--pbs-exec" in err and out == ""


def test_invalid_config_changes_nothing(fake, capsys):
    fake.config.write_text(json.dumps({"node_idle_limit": -5, "python_path": ["relative"]}))
    code, out, err = cli(capsys, *fake.argv("--apply"))
    assert code == 2
    assert "node_idle_limit" in err and "python_path" in err
    assert fake.read()["log"] == []


def test_missing_hook_scripts_are_named(fake, capsys):
    (fake.hooks / "pbs_power_provision.py").unlink()
    code, _, err = cli(capsys, *fake.argv("--apply"))
    assert code == 2 and "pbs_power_provision.py" in err
    assert fake.read()["log"] == []


def test_print_mode_works_under_OO(fake):
    proc = subprocess.run(
        [sys.executable, "-OO", "-m", "pbs_power.cli.main"] + fake.argv(), cwd=str(ROOT),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "'set hook pbs_power enabled = true'" in proc.stdout


# -- pbs nodes ---------------------------------------------------------------------
def pbsnodes_doc() -> dict:
    def node(state, eligible, mgmt, used, change, host=None):
        res = {"arch": "linux", "host": host, "ncpus": 8, "mem": "1048576kb"}
        if mgmt is not None:
            res["power_mgmt"] = mgmt
        doc = {"Mom": host, "Port": 15002, "state": state, "resources_available": res,
               "resources_assigned": {}, "resv_enable": "True", "sharing": "default_shared",
               "last_state_change_time": change}
        if eligible is not None:
            doc["poweroff_eligible"] = eligible
        if used is not None:
            doc["last_used_time"] = used
        return doc
    return {"timestamp": EPOCH_CHANGE, "pbs_version": "23.06.06", "pbs_server": "svr",
            "nodes": {"gpu001": node("job-busy", "True", "True", EPOCH_USED, EPOCH_CHANGE, "gpu001"),
                      "gpu003": node("sleep", "True", None, CTIME, EPOCH_CHANGE, "gpu003"),
                      "cpu01": node("free", "False", "False", None, EPOCH_CHANGE, "cpu01"),
                      "login1": node("free", None, None, None, EPOCH_CHANGE, "login1")}}


@pytest.fixture
def nodes_env(tmp_path, monkeypatch):
    monkeypatch.setenv("PBS_CONF_FILE", str(tmp_path / "no-pbs.conf"))
    exec_dir = tmp_path / "pbs"
    (exec_dir / "bin").mkdir(parents=True)
    fixture = tmp_path / "pbsnodes.json"
    fixture.write_text(json.dumps(pbsnodes_doc(), indent=4))
    write_exe(exec_dir / "bin" / "pbsnodes",
              FAKE_PBSNODES.format(python=sys.executable, fixture=str(fixture), code=0))
    return exec_dir


@pytest.fixture(scope="module")
def group_state(tmp_path_factory):
    """A state dir with the sample topology active and rg_42 (gpu001, gpu002) active at Node-Low."""
    from pbs_power.groups.service import ResourceGroupService
    from pbs_power.groups.topology import load_topology
    state = tmp_path_factory.mktemp("rg_state")
    svc = ResourceGroupService(str(state), {"simulated": {"latency_ms": 0}})
    try:
        assert svc.import_topology(load_topology(str(TOPOLOGY))).ok
        assert svc.set_topology_active(True).status.ok
        assert svc.create("rg_42", external_id=42, policy_name="Node-Low").status.ok
        assert svc.add_resources("rg_42", ["gpu001", "gpu002"]).status.ok
        assert svc.activate("rg_42").status.ok
    finally:
        svc.close()
    return state


def test_nodes_table_shows_groups_and_effective_policies(nodes_env, group_state, capsys):
    code, out, err = cli(capsys, "pbs", "nodes", "--pbs-exec", str(nodes_env),
                         "--state-dir", str(group_state))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["NODE", "STATE", "POWEROFF_ELIGIBLE", "POWER_MGMT", "LAST_USED",
                                "LAST_STATE_CHANGE", "GROUP", "POLICY"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert sorted(rows) == ["cpu01", "gpu001", "gpu003", "login1"]
    used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(EPOCH_USED)).split()
    change = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(EPOCH_CHANGE)).split()
    assert rows["gpu001"] == ["gpu001", "job-busy", "True", "True"] + used + change + \
        ["rg_42", "Node-Low"]
    assert rows["gpu003"][-2:] == ["-", "Node-Med"]          # topology default policy
    assert rows["gpu003"][4:6] == ["2025-11-20", "10:00:00"]  # ctime string read as local time
    assert rows["cpu01"][1:4] == ["free", "False", "False"]
    assert rows["cpu01"][-2:] == ["-", "CPU-Capped"]
    assert rows["login1"] == ["login1", "free", "-", "-", "-"] + change + ["-", "-"]


def test_nodes_json(nodes_env, group_state, capsys):
    code, out, err = cli(capsys, "pbs", "nodes", "--pbs-exec", str(nodes_env),
                         "--state-dir", str(group_state), "--json")
    assert code == 0, err
    by_name = {row["node"]: row for row in json.loads(out)}
    assert by_name["gpu001"] == {
        "node": "gpu001", "host": "gpu001", "state": "job-busy", "poweroff_eligible": True,
        "power_mgmt": True, "last_used_time": EPOCH_USED, "last_state_change_time": EPOCH_CHANGE,
        "group": "rg_42", "policy": "Node-Low"}
    assert by_name["login1"]["poweroff_eligible"] is None and by_name["login1"]["policy"] is None


def test_nodes_without_a_resource_group_database(nodes_env, tmp_path, capsys):
    state = tmp_path / "empty_state"
    state.mkdir()
    code, out, err = cli(capsys, "pbs", "nodes", "--pbs-exec", str(nodes_env),
                         "--state-dir", str(state))
    assert code == 0, err
    assert all(line.split()[-2:] == ["-", "-"] for line in out.splitlines()[1:])
    assert list(state.iterdir()) == []  # nothing created


def test_nodes_failures(nodes_env, tmp_path, capsys):
    code, _, err = cli(capsys, "pbs", "nodes")
    assert code == 2 and "--pbs-exec" in err
    fixture = tmp_path / "err.txt"
    fixture.write_text("")
    write_exe(nodes_env / "bin" / "pbsnodes",
              FAKE_PBSNODES.format(python=sys.executable, fixture=str(fixture), code=1))
    code, _, err = cli(capsys, "pbs", "nodes", "--pbs-exec", str(nodes_env))
    assert code == 1 and "exit 1" in err


def test_parse_pbsnodes_json_edge_cases():
    assert pi.parse_pbsnodes_json("") == []
    rows = pi.parse_pbsnodes_json(json.dumps({"nodes": {"n[0]": {
        "state": "free", "poweroff_eligible": "False", "last_used_time": "1700000000",
        "resources_available": {"host": "n", "power_mgmt": "1"}}}}))
    assert rows == [pi.NodeRow("n[0]", "n", "free", False, True, 1700000000.0, None)]
    with pytest.raises(ValueError):
        pi.parse_pbsnodes_json("[1, 2]")
    assert pi.parse_bool("maybe") is None and pi.parse_bool(True) is True


def test_default_hooks_dir_finds_the_source_tree_or_the_installed_copy(monkeypatch, tmp_path):
    from pbs_power.pbs import install as pbs_install
    assert pbs_install.default_hooks_dir() == str(pbs_install.package_parent()) + "/hooks"
    shared = tmp_path / "share" / "pbs-power" / "hooks"
    shared.mkdir(parents=True)
    (shared / "PBS_power.py").write_text("# hook")
    monkeypatch.setattr(pbs_install, "package_parent", lambda: str(tmp_path))
    assert pbs_install.default_hooks_dir() == str(shared)


def test_install_page_lists_exactly_the_install_commands():
    import re
    from pathlib import Path
    from pbs_power.pbs import install as pbs_install
    page = (Path(__file__).resolve().parents[2] / "docs" / "install-pbs.md").read_text()
    listed = re.findall(r"^qmgr -c '(.*)'$", page, re.M)
    expected = pbs_install.install_commands("/opt/pbs_power/lib/share/pbs-power/hooks",
                                            "/etc/pbs_power.json")
    expected += [step.command for step in pbs_install.provisioning_steps(True)]
    assert listed == expected


def test_every_hook_ships_an_hk_file_that_agrees_with_install():
    from pathlib import Path
    from pbs_power.pbs import install as pbs_install
    hooks = Path(__file__).resolve().parents[2] / "hooks"
    for hook in pbs_install.HOOKS:
        hk = hooks / (Path(hook.file).stem + ".HK")
        attrs = dict(line.split("=", 1) for line in hk.read_text().split())
        assert attrs["type"] == "site" and attrs["enabled"] == "false"
        for key, value in hook.attributes:
            assert attrs[key] == value, (hk.name, key)


def test_printing_runs_reuse_one_private_copy(fake, tmp_path, capsys, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    doc = json.loads(fake.config.read_text())
    doc["python_path"] = []
    fake.config.write_text(json.dumps(doc))
    paths = []
    for _ in range(3):
        code, out, err = cli(capsys, "pbs", "install", "--hooks-dir", str(fake.hooks),
                             "--config", str(fake.config))
        assert code == 0, err
        paths.append(re.search(r"application/x-config default (\S+)'", out).group(1))
    assert len(set(paths)) == 1 and os.path.isfile(paths[0])
    assert os.stat(os.path.dirname(paths[0])).st_mode & 0o777 == 0o700
    assert len(os.listdir(tmp_path / "tmp")) == 1


def test_a_planted_copy_directory_is_refused(fake, tmp_path, capsys, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", tmp_path / ("pbs_power_install-%d" % os.geteuid()))
    doc = json.loads(fake.config.read_text())
    doc["python_path"] = []
    fake.config.write_text(json.dumps(doc))
    code, out, err = cli(capsys, "pbs", "install", "--hooks-dir", str(fake.hooks),
                         "--config", str(fake.config))
    assert code == 2 and "is not a private directory of ours" in err
    assert os.listdir(tmp_path / "elsewhere") == []


def test_pbs_hook_python_is_read_from_pbs_server(tmp_path):
    (tmp_path / "sbin").mkdir()
    (tmp_path / "sbin" / "pbs_server.bin").write_bytes(
        b"\x7fELF...\x00libpthread.so.0\x00libpython3.11.so.1.0\x00libc.so.6\x00")
    assert pi.hook_python_version(str(tmp_path)) == "3.11"
    assert pi.python_mismatch(str(tmp_path), (3, 11)) is None
    note = pi.python_mismatch(str(tmp_path), (3, 12))
    assert "PBS runs hooks with Python 3.11" in note and "python3.11 -m pip install" in note
    assert pi.hook_python_version(str(tmp_path / "nowhere")) is None


def test_install_names_the_python_pbs_runs_hooks_with(fake, capsys):
    (fake.exec_dir / "sbin").mkdir()
    (fake.exec_dir / "sbin" / "pbs_server.bin").write_bytes(b"\x00libpython3.9.so.1.0\x00")
    code, out, _err = cli(capsys, *fake.argv())
    assert code == 0 and "# PBS runs hooks with Python 3.9" in out


def test_uninstall_names_hosts_pbs_power_left_down(fake, capsys, tmp_path, monkeypatch):
    from pbs_power.states.store import Store
    state_dir = tmp_path / "state"
    with Store.open(str(state_dir)) as store:
        store.set_down_since("gpu004", 1_800_000_000)
    monkeypatch.setenv("PBS_POWER_STATE_DIR", str(state_dir))
    code, out, _err = cli(capsys, "pbs", "install", "--pbs-exec", str(fake.exec_dir), "--uninstall")
    assert code == 0
    assert "1 host(s) are asleep, powered off or changing state by pbs_power" in out
    assert "gpu004" in out
