"""Wall time of the Slurm prolog and epilog programs: in-process with and without
the checked-config memo (``state_dir/checked-configs``), and on the job server.

Builds a 4-node SIMULATED topology in a temp state dir, then runs the
installed ``pbs-power-slurm-prolog`` and ``-epilog`` as slurmctld would
(empty environment but the job's variables), --runs times per mode, in turn:
"memo" (every job's case), "no_memo" (the memo deleted first, so the config
goes through jsonschema) and "job_server" (``pbs-power-slurm-jobd`` running:
its forked child does the run). Times are process start to exit. Prints
JSON, with the interpreter the programs run on and its bare start-up time
(``-c pass``, the floor no program on it can beat). CPU times are the
programs' own (getrusage); a run on the job server also costs the server's
child ``job_server_cpu_seconds_per_run``.

    python benchmarks/prolog_time.py [--runs 40]
    PROLOG_BIN=/opt/pbs_power/venv/bin python benchmarks/prolog_time.py   # another install
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pbs_power.config.memo import MEMO_NAME  # noqa: E402
from pbs_power.groups.service import ResourceGroupService  # noqa: E402
from pbs_power.groups.topology import parse_topology  # noqa: E402

BIN = Path(os.environ.get("PROLOG_BIN") or Path(sys.executable).parent)
DEVICES = {"simulated": {"latency_ms": 0}}
TOPOLOGY = {
    "name": "bench",
    "device_specs": {"cpu-node": {"type": "ComputerSystem", "backend": "simulated",
                                  "node": {"min_watts": 200, "idle_watts": 250,
                                           "max_watts": 1000}}},
    "power_domains": [{"name": "rack-1", "kind": "rack", "budget_watts": 4000}],
    "policies": [{"name": "Node-Med",
                  "limits": [{"element_type": "NODE", "power_limit": {"watts": 600}}]}],
    "default_policy": "Node-Med",
    "entities": [{"names": "node[1-4]", "device": "cpu-node", "domain": "rack-1"}],
}


def setup(base: Path) -> Path:
    """State dir with the topology active, and the hook config naming it."""
    state = base / "state"
    service = ResourceGroupService(str(state), DEVICES)
    try:
        service.import_topology(parse_topology(TOPOLOGY))
        service.set_topology_active(True)
    finally:
        service.close()
    config = base / "hook.json"
    config.write_text(json.dumps({"state_dir": str(state), "slurm_log_file": str(base / "log"),
                                  "job_policies": {"device_options": DEVICES}}))
    return config


def timed(program: str, env: dict) -> tuple:
    """(wall seconds, CPU seconds) of one run; CPU time is what a busy machine inflates least."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)  # microseconds, not os.times' ticks
    began = time.perf_counter()
    subprocess.run([str(BIN / program)], env=env, check=True)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)


def interpreter() -> str:
    """The Python the programs start (their #! line)."""
    with open(BIN / "pbs-power-slurm-prolog") as f:
        return f.readline()[2:].strip()


def startup_seconds(python: str, runs: int) -> float:
    """Median wall time of ``python -c pass`` with an empty environment."""
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        subprocess.run([python, "-c", "pass"], env={}, check=True)
        times.append(time.perf_counter() - began)
    return round(statistics.median(times), 3)


class JobServer:
    """``pbs-power-slurm-jobd`` of the timed install, on a socket in ``base``."""

    def __init__(self, base: Path):
        self.path = base / "jobs.sock"
        self.proc = subprocess.Popen([str(BIN / "pbs-power-slurm-jobd"), "--socket",
                                      str(self.path)], stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while not self.path.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("pbs-power-slurm-jobd did not start")
            time.sleep(0.05)

    def children_cpu(self) -> float:
        """CPU seconds of the server's ended children (their runs), from /proc."""
        fields = Path("/proc/%d/stat" % self.proc.pid).read_text().rsplit(")", 1)[1].split()
        return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40,
                        help="prolog+epilog pairs per mode (default 40)")
    args = parser.parse_args()
    # an install from before the job server existed is timed in-process only
    has_server = (BIN / "pbs-power-slurm-jobd").exists()
    modes = ("memo", "no_memo", "job_server") if has_server else ("memo", "no_memo")
    times = {mode: {"prolog": [], "epilog": []} for mode in modes}
    cpu = {mode: {"prolog": [], "epilog": []} for mode in modes}
    server_cpu = None
    with tempfile.TemporaryDirectory() as tmp:
        config = setup(Path(tmp))
        memo = Path(tmp) / "state" / MEMO_NAME
        server = JobServer(Path(tmp)) if has_server else None
        try:
            server_cpu = server.children_cpu() if server else None
            for i in range(args.runs * len(modes)):
                mode = modes[i % len(modes)]
                env = {"PBS_POWER_CONFIG": str(config), "SLURM_JOB_ID": str(1000 + i),
                       "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_PARTITION": "debug",
                       "PBS_POWER_JOB_SOCKET": str(server.path if mode == "job_server"
                                                   else Path(tmp) / "no-server.sock")}
                for program in ("prolog", "epilog"):
                    if mode == "no_memo" and memo.exists():
                        os.unlink(memo)
                    wall, used = timed("pbs-power-slurm-" + program, env)
                    times[mode][program].append(wall)
                    cpu[mode][program].append(used)
            if server:
                runs_on_server = len(times["job_server"]["prolog"]) * 2
                server_cpu = (server.children_cpu() - server_cpu) / runs_on_server
        finally:
            if server:
                server.stop()
    medians = {mode: {p: round(statistics.median(v), 3) for p, v in per.items()}
               for mode, per in times.items()}
    cpu_medians = {mode: {p: round(statistics.median(v), 3) for p, v in per.items()}
                   for mode, per in cpu.items()}
    python = interpreter()
    print(json.dumps({"runs": len(times["memo"]["prolog"]), "interpreter": python,
                      "interpreter_startup_seconds": startup_seconds(python, args.runs),
                      "median_seconds": medians,
                      "median_cpu_seconds": cpu_medians,
                      "job_server_cpu_seconds_per_run": None if server_cpu is None
                      else round(server_cpu, 3),
                      "prolog_ratio_no_memo_over_memo": round(
                          medians["no_memo"]["prolog"] / medians["memo"]["prolog"], 2)}))


if __name__ == "__main__":
    main()
