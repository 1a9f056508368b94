"""Record what a real Slurm prints, for the parsers' tests: ``python record_slurm_outputs.py DIR``.

Runs the cluster of `slurm_cluster` on the Slurm 24.11 chroot (``--host``:
the host's Slurm) through the moments tests/slurm/data's READMEs list, and
writes each command's output to DIR under the README's file names. Root only.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from slurm_cluster import SlurmCluster
from slurm_installs import CHROOT_INSTALL, HOST

CAPTURE_RESUME = """#!/bin/bash
# keep a copy of what slurmctld hands the ResumeProgram, then power the nodes on
cp "$SLURM_RESUME_FILE" "{out}/resume_file_$(date +%s%N).json"
exec "{bin}/node-power-on" "$1"
"""


def record(out: Path, host: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="slurm-record.", dir="/tmp"))
    capture = base / "capture-resume"
    cluster = SlurmCluster(base / "cluster", num_nodes=4, resume_timeout=60, suspend_timeout=5,
                           resume_program=str(capture), install=HOST if host else CHROOT_INSTALL)
    capture.write_text(CAPTURE_RESUME.format(out=base, bin=cluster.bin_dir))
    capture.chmod(0o755)
    node_json = not host

    def save(name: str, *argv: str) -> None:
        text = cluster.run(*argv).stdout
        if name.endswith(".json"):
            text = json.dumps(json.loads(text), indent=2) + "\n"
        (out / name).write_text(text)

    def nodes(moment: str) -> None:
        save("sinfo_%s.json" % moment, "sinfo", "--json")
        save("scontrol_show_node_%s.txt" % moment, "scontrol", "show", "node", "-o")
        if node_json:
            save("scontrol_json_show_node_%s.json" % moment, "scontrol", "--json", "show", "node")

    cluster.start()
    try:
        nodes("powered_down")
        save("scontrol_show_config.txt", "scontrol", "show", "config")
        first = cluster.sbatch("-w", "node1", "-t", "10", script="#!/bin/sh\nsleep 300\n")
        cluster.wait_job(first, ("RUNNING",), 60)
        cluster.sbatch("-N", "2", "-w", "node[1-2]", "-t", "10",
                       "--comment=power_policy=Node-Low", script="#!/bin/sh\nsleep 1\n")
        cluster.sbatch("-H", "-w", "node2", script="#!/bin/sh\nsleep 1\n")
        cluster.never_boots("node3")
        cluster.sbatch("-w", "node3", script="#!/bin/sh\nsleep 1\n")
        cluster.wait_nodes(lambda s: s.get("node3", "").endswith("#"), 60)
        time.sleep(6)        # backfill gives the pending job its start estimate
        nodes("powering_up")
        save("squeue_mixed.json", "squeue", "--json")
        save("squeue_schednodes.txt", "squeue", "-h", "-t", "PD", "-o", "%A|%Y")
        cluster.run("scontrol", "create", "reservation", "reservationname=maint",
                    "nodes=node[3-4]", "starttime=now+1hour", "duration=60", "users=root",
                    "flags=IGNORE_JOBS")
        save("scontrol_show_reservation.txt", "scontrol", "show", "reservation", "-o")
        cluster.run("scancel", "--user=root")
        cluster.never_boots("node3", False)
        cluster.run("scontrol", "delete", "reservationname=maint")
        cluster.run("scontrol", "update", "nodename=node2", "state=down", "reason=test")
        cluster.run("scontrol", "update", "nodename=node4", "state=drain",
                    "reason=pbs_power: power_on failed")
        time.sleep(2)
        nodes("drain_down")
    finally:
        cluster.stop()
    captured = sorted(base.glob("resume_file_*.json"))
    if captured:
        doc = json.loads(captured[0].read_text())
        (out / "resume_file.json").write_text(json.dumps(doc, indent=2) + "\n")
    shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--host", action="store_true", help="the host's Slurm, not the chroot's")
    args = parser.parse_args()
    record(args.out.resolve(), args.host)


if __name__ == "__main__":
    main()
