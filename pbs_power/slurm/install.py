"""What ``pbs-power slurm install`` prints: slurm.conf and plugstack.conf lines from the hook config.

slurmctld passes its programs no environment but SLURM_CONF, so they read
the hook config at /etc/pbs_power.json (or ``$PBS_POWER_CONFIG``). For a
config elsewhere, ``--program-dir DIR`` writes one two-line wrapper per
program into DIR with the config path set, and the lines point at those.
"""
from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from pbs_power.config.hook_config import MODE_DISABLED, HookConfig
from .env import CONFIG_ENV, DEFAULT_CONFIG

#: slurm.conf parameter -> console script.
PROGRAMS: Tuple[Tuple[str, str], ...] = (
    ("PrologSlurmctld", "pbs-power-slurm-prolog"),
    ("EpilogSlurmctld", "pbs-power-slurm-epilog"),
    ("SuspendProgram", "pbs-power-slurm-suspend"),
    ("ResumeProgram", "pbs-power-slurm-resume"),
    ("ResumeFailProgram", "pbs-power-slurm-resume-fail"),
)
DEFAULT_SPANK_PLUGIN = "/usr/local/lib/slurm/power_policy.so"


@dataclass(frozen=True)
class InstallPlan:
    """The lines for each file, and the notes an admin should read."""

    slurm_conf: Tuple[str, ...]
    plugstack_conf: Tuple[str, ...]
    notes: Tuple[str, ...] = ()
    wrappers: Tuple[Tuple[str, str], ...] = ()   # (path, content) to write

    def text(self) -> str:
        out = ["# --- slurm.conf (pbs_power) ---"] + list(self.slurm_conf)
        out += ["", "# --- plugstack.conf (pbs_power --power-policy option) ---"]
        out += list(self.plugstack_conf)
        out += ["# note: " + n for n in self.notes]
        return "\n".join(out) + "\n"


def default_bin_dir() -> str:
    """Where the console scripts are: next to pbs-power-slurm-resume, else this Python's bin."""
    found = shutil.which("pbs-power-slurm-resume")
    return os.path.dirname(os.path.abspath(found)) if found else \
        os.path.dirname(os.path.abspath(sys.executable))


def rate_per_minute(config: HookConfig) -> int:
    """SuspendRate/ResumeRate: at most ``max_concurrent_nodes`` nodes started per minute."""
    return max(1, config.max_concurrent_nodes)


def plan_install(config: HookConfig, config_path: str, bin_dir: Optional[str] = None,
                 program_dir: Optional[str] = None,
                 spank_plugin: str = DEFAULT_SPANK_PLUGIN) -> InstallPlan:
    """The slurm.conf/plugstack.conf lines for ``config`` read from ``config_path``."""
    bin_dir = os.path.abspath(bin_dir or default_bin_dir())
    config_path = os.path.abspath(config_path)
    programs: Dict[str, str] = {}
    wrappers: List[Tuple[str, str]] = []
    for key, script in PROGRAMS:
        target = os.path.join(bin_dir, script)
        if program_dir:
            path = os.path.join(os.path.abspath(program_dir), script)
            wrappers.append((path, wrapper_text(target, config_path)))
            programs[key] = path
        else:
            programs[key] = target
    lines = ["%s=%s" % (key, programs[key]) for key, _ in PROGRAMS]
    lines += [
        "# idle this long before Slurm powers a node down (node_idle_limit)",
        "SuspendTime=%d" % config.node_idle_limit,
        "# a node not down by then counts as powered down anyway (shutdown_timeout)",
        "SuspendTimeout=%d" % config.shutdown_timeout,
        "# a node not up by then is DOWN and goes to ResumeFailProgram (boot_timeout)",
        "ResumeTimeout=%d" % config.boot_timeout,
        "# nodes started per minute; the programs also keep max_concurrent_nodes=%d in flight"
        % config.max_concurrent_nodes,
        "SuspendRate=%d" % rate_per_minute(config),
        "ResumeRate=%d" % rate_per_minute(config),
    ]
    if config.exclude_nodes:
        lines += ["# never powered down (exclude_nodes)", "SuspendExcNodes=%s" % config.exclude_nodes]
    return InstallPlan(tuple(lines), ("optional %s" % spank_plugin,),
                       tuple(_notes(config, config_path, program_dir)), tuple(wrappers))


def wrapper_text(target: str, config_path: str) -> str:
    """A /bin/sh wrapper running ``target`` with the hook config path set."""
    return ("#!/bin/sh\n# written by pbs-power slurm install\n"
            "%s=%s exec %s \"$@\"\n" % (CONFIG_ENV, _sh_quote(config_path), _sh_quote(target)))


def write_wrappers(plan: InstallPlan) -> List[str]:
    """Write the wrappers (mode 0755: slurmctld ignores group/world-writable programs)."""
    written = []
    for path, text in plan.wrappers:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
        written.append(path)
    return written


def _notes(config: HookConfig, config_path: str, program_dir: Optional[str]) -> List[str]:
    notes = []
    if not program_dir and config_path != DEFAULT_CONFIG:
        notes.append("slurmctld gives its programs no environment: they read %s unless "
                     "%s is set; copy %s there or rerun with --program-dir DIR to write "
                     "wrappers that name it" % (DEFAULT_CONFIG, CONFIG_ENV, config_path))
    if config.mode == MODE_DISABLED:
        notes.append("power_on_off_enable and power_ramp_rate_enable are both false: "
                     "SuspendProgram will refuse to power nodes down")
    notes.append("state_dir %s must be writable by SlurmUser (slurmctld runs the programs "
                 "as SlurmUser)" % config.state_dir)
    notes.append("scontrol reconfigure (or restart slurmctld) after editing slurm.conf; "
                 "plugstack.conf is read by sbatch/salloc/srun and slurmstepd")
    notes.append("optional, for many job starts: run pbs-power-slurm-jobd as SlurmUser "
                 "(config/pbs-power-slurm-jobd.service); the prolog and epilog then skip "
                 "Python's start-up, and run by themselves whenever it is not there")
    return notes


def _sh_quote(value: str) -> str:
    return "'" + value.replace("'", "'\\''") + "'"
