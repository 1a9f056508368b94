"""The package's shape: cheap imports, no import circles, modules of a readable size.

A PBS hook or a Slurm prolog runs once per event, so what a program imports is
part of its start-up time; these tests pin what each entry point may pull in.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pbs_power"
CIRCLES_TOOL = ROOT.parent / "shared" / "tools" / "import_circles.py"
HEAVY = ("jsonschema", "requests", "websockets", "urllib3", "matplotlib", "pynvml",
         "pyslurm", "sqlite3", "prometheus_client")


def loaded_after(statement: str) -> set:
    """Module names loaded in a fresh interpreter after running ``statement``."""
    code = ("import sys; before = set(sys.modules); %s; "
            "import json; print(json.dumps(sorted(set(sys.modules) - before)))" % statement)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=str(ROOT))
    return set(json.loads(out.stdout))


def test_importing_the_package_imports_none_of_its_modules():
    loaded = loaded_after("import pbs_power")
    assert sorted(m for m in loaded if m.startswith("pbs_power.")) == []


@pytest.mark.parametrize("package", ["config", "states", "groups", "devices.redfish",
                                     "devices.ipmi", "pbs", "slurm", "cli",
                                     "metrics"])
def test_a_subpackage_imports_its_modules_only_when_a_name_is_used(package):
    loaded = loaded_after("import pbs_power.%s" % package)
    own = {m for m in loaded if m.startswith("pbs_power.")}
    parents = {"pbs_power." + ".".join(package.split(".")[:i + 1])
               for i in range(package.count(".") + 1)}
    lower = {"pbs_power._lazy", "pbs_power.states", "pbs_power.states.model",
             "pbs_power.devices", "pbs_power.devices.base"}
    assert sorted(m for m in own - parents - lower
                  if not m.startswith("pbs_power.config")) == []
    assert not any(m.split(".")[0] in HEAVY for m in loaded)


def test_the_slurm_prolog_path_imports_neither_pbs_nor_heavy_libraries():
    loaded = loaded_after("import slurm_spank.prolog, slurm_spank.epilog, "
                          "pbs_power.slurm.env, pbs_power.slurm.jobs")
    assert not [m for m in loaded if m.startswith(("pbs_power.pbs", "pbs_power.sim",
                                                   "pbs_power.allocator", "pbs_power.cli"))]
    assert not any(m.split(".")[0] in HEAVY for m in loaded)


def test_no_hook_or_slurm_program_path_imports_the_metrics_side():
    """The hooks only write the journal; the exporter's libraries stay out of them."""
    loaded = loaded_after("import pbs_power.pbs.hook, pbs_power.pbs.jobs, "
                          "pbs_power.states.cycle, pbs_power.slurm.power, "
                          "pbs_power.slurm.cycle, pbs_power.groups.service, "
                          "slurm_spank.prolog, slurm_spank.epilog")
    assert not [m for m in loaded if m.startswith("pbs_power.metrics")]
    assert "prometheus_client" not in {m.split(".")[0] for m in loaded}


def test_no_module_is_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}


@pytest.mark.skipif(not CIRCLES_TOOL.is_file(), reason="import_circles.py is not beside the repo")
def test_no_import_circle():
    out = subprocess.run([sys.executable, str(CIRCLES_TOOL), str(PACKAGE)],
                         capture_output=True, text=True)
    assert (out.returncode, out.stdout) == (0, "")


RUN_AND_LIST = """
import json, sys
from slurm_spank.%s import main
status = main([])
print(json.dumps([status, sorted(sys.modules)]))
"""
#: Loaded only for a request some prologs make (an unknown policy, a first run, an
#: async activation, GPU policies) or never by the prolog.
NOT_ON_THE_PROLOG_PATH = ("argparse", "asyncio", "ssl", "socket", "uuid", "difflib",
                          "tempfile", "pbs_power.groups.limits_policy", "pbs_power.metrics",
                          "pbs_power.pbs", "pbs_power.sim", "pbs_power.cli")


def test_a_prolog_run_loads_only_what_its_path_needs(tmp_path):
    """Run the real prolog on a simulated topology; list the modules it ended with."""
    from pbs_power.groups.service import ResourceGroupService
    from pbs_power.groups.topology import parse_topology
    devices = {"simulated": {"latency_ms": 0}}
    state = tmp_path / "state"
    service = ResourceGroupService(str(state), devices)
    try:
        service.import_topology(parse_topology({
            "name": "t", "device_specs": {"n": {"type": "ComputerSystem", "backend": "simulated",
                                                "node": {"min_watts": 200, "idle_watts": 250,
                                                         "max_watts": 1000}}},
            "power_domains": [{"name": "rack-1", "kind": "rack", "budget_watts": 4000}],
            "policies": [{"name": "P", "limits": [{"element_type": "NODE",
                                                   "power_limit": {"watts": 600}}]}],
            "default_policy": "P",
            "entities": [{"names": "node[1-2]", "device": "n", "domain": "rack-1"}]}))
        service.set_topology_active(True)
    finally:
        service.close()
    config = tmp_path / "hook.json"
    config.write_text(json.dumps({"state_dir": str(state), "slurm_log_file": str(tmp_path / "log"),
                                  "job_policies": {"device_options": devices}}))
    runs = []
    for job, program in (("7", "prolog"), ("7", "epilog"), ("8", "prolog")):
        env = {"PBS_POWER_CONFIG": str(config), "SLURM_JOB_ID": job,
               "SLURM_JOB_NODELIST": "node[1-2]", "PATH": "/usr/bin:/bin"}
        runs.append(subprocess.run([sys.executable, "-c", RUN_AND_LIST % program], env=env,
                                   cwd=str(ROOT), capture_output=True, text=True, check=True))
    # the first run checks the config and writes its memo; the later ones are every job's case
    status, loaded = json.loads(runs[-1].stdout)
    assert status == 0 and "rg_8 active on node1,node2" in (tmp_path / "log").read_text()
    assert [m for m in loaded if m.startswith(NOT_ON_THE_PROLOG_PATH)] == []
    store_needs = {"sqlite3"}
    assert [m for m in loaded if m.split(".")[0] in set(HEAVY) - store_needs] == []
