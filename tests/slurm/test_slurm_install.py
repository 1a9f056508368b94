"""`pbs-power slurm install`: slurm.conf lines from the hook config, wrappers for a config
outside /etc/pbs_power.json. (test_slurm_cycle.py runs a real cluster on this output.)"""
from __future__ import annotations

import json
import os
import stat
import subprocess

from pbs_power.cli.main import main
from pbs_power.config.hook_config import parse_config
from pbs_power.slurm.install import plan_install


def settings(text: str) -> dict:
    return dict(l.split("=", 1) for l in text.split("# --- plugstack")[0].splitlines()
                if l and not l.startswith("#"))


def test_lines_follow_the_hook_config():
    config = parse_config({"power_on_off_enable": True, "node_idle_limit": 900,
                           "boot_timeout": 1200, "node_boot_time": 600, "shutdown_timeout": 300,
                           "max_concurrent_nodes": 7, "exclude_nodes": "login[1-2],n001"})
    plan = plan_install(config, "/etc/pbs_power.json", bin_dir="/opt/pp/bin")
    conf = settings(plan.text())
    assert conf == {
        "PrologSlurmctld": "/opt/pp/bin/pbs-power-slurm-prolog",
        "EpilogSlurmctld": "/opt/pp/bin/pbs-power-slurm-epilog",
        "SuspendProgram": "/opt/pp/bin/pbs-power-slurm-suspend",
        "ResumeProgram": "/opt/pp/bin/pbs-power-slurm-resume",
        "ResumeFailProgram": "/opt/pp/bin/pbs-power-slurm-resume-fail",
        "SuspendTime": "900", "SuspendTimeout": "300", "ResumeTimeout": "1200",
        "SuspendRate": "7", "ResumeRate": "7", "SuspendExcNodes": "login[1-2],n001"}
    assert plan.plugstack_conf == ("optional /usr/local/lib/slurm/power_policy.so",)
    assert not any("PBS_POWER_CONFIG" in n for n in plan.notes)   # the default path


def test_defaults_disabled_mode_and_other_config_path_are_noted():
    plan = plan_install(parse_config({}), "/srv/hook.json", bin_dir="/b")
    conf = settings(plan.text())
    assert "SuspendExcNodes" not in conf and conf["SuspendTime"] == "1800"
    notes = " ".join(plan.notes)
    assert "they read /etc/pbs_power.json unless PBS_POWER_CONFIG is set" in notes
    assert "SuspendProgram will refuse to power nodes down" in notes


def test_program_dir_wrappers_name_the_config(tmp_path):
    hook = tmp_path / "my hook.json"
    hook.write_text(json.dumps({"power_on_off_enable": True}))
    progs = tmp_path / "programs"
    assert main(["slurm", "install", "--config", str(hook), "--program-dir", str(progs),
                 "--bin-dir", str(tmp_path / "bin"), "--spank-plugin", "/x/power_policy.so"]) == 0
    wrapper = progs / "pbs-power-slurm-resume"
    assert stat.S_IMODE(os.stat(wrapper).st_mode) == 0o755
    # the wrapper passes argv through and sets the config path; check it with a stand-in
    (tmp_path / "bin").mkdir()
    target = tmp_path / "bin" / "pbs-power-slurm-resume"
    target.write_text('#!/bin/sh\necho "$PBS_POWER_CONFIG|$1|$2"\n')
    target.chmod(0o755)
    out = subprocess.run([str(wrapper), "node[1-2]", "x y"], env={}, timeout=30,
                         stdout=subprocess.PIPE, universal_newlines=True).stdout
    assert out == "%s|node[1-2]|x y\n" % hook


def test_install_prints_and_bad_config_is_exit_2(tmp_path, capsys):
    hook = tmp_path / "hook.json"
    hook.write_text(json.dumps({"exclude_nodes": "gpu[01-04]"}))
    assert main(["slurm", "install", "--config", str(hook), "--bin-dir", "/b"]) == 0
    out = capsys.readouterr().out
    assert "SuspendExcNodes=gpu[01-04]\n" in out and "ResumeProgram=/b/pbs-power-slurm-resume\n" in out
    hook.write_text(json.dumps({"max_concurrent_nodes": "many"}))
    assert main(["slurm", "install", "--config", str(hook)]) == 2
    assert "max_concurrent_nodes" in capsys.readouterr().err
    assert main(["slurm", "cycle", "--config", str(hook)]) == 2


def test_docs_slurm_page_shows_exactly_what_install_prints():
    """docs/install-slurm.md's example: its slurm.conf and plugstack.conf lines are
    what `slurm install` prints for the hook config shown above them."""
    import re
    from pathlib import Path
    root = next(p for p in Path(__file__).resolve().parents if (p / "setup.cfg").is_file())
    page = (root / "docs" / "install-slurm.md").read_text()
    section = page.split("## What `slurm install` prints", 1)[1]
    shown_config = re.search(r"```json\n(.*?)```", section, re.S).group(1)
    shown = re.search(r"```\n(# --- slurm.conf \(pbs_power\) ---\n.*?)```", section, re.S).group(1)
    conf_part, plug_part = shown.split("# --- plugstack.conf", 1)
    shown_conf = dict(l.split("#", 1)[0].strip().split("=", 1) for l in conf_part.splitlines()
                      if l and not l.startswith("#"))
    plan = plan_install(parse_config(json.loads(shown_config)), "/etc/pbs_power.json",
                        bin_dir="/opt/pbs_power/venv/bin")
    assert shown_conf == settings(plan.text())
    assert tuple(plug_part.splitlines()[1:]) == plan.plugstack_conf
