"""``pbs-power resource-group gc``: repair interrupted groups, delete groups of ended jobs."""
from __future__ import annotations

import argparse
import json
import os
import shutil
from typing import Any

from pbs_power.cli.topology import EXIT_FAILED, EXIT_OK, leaf


def add_gc(actions: Any) -> None:
    """Register ``resource-group gc`` under the resource-group actions."""
    p = leaf(actions, "gc", "repair interrupted groups; delete groups of ended jobs",
             "Collect resource groups nothing else will end: a group whose activation or "
             "deletion was killed midway is repaired (topology policies restored, within "
             "the budget), and a job's group rg_<jobid> whose job the scheduler no longer "
             "runs is deleted. A job whose state cannot be read keeps its group. The PBS "
             "periodic hook and `pbs-power slurm cycle` do this every run; use gc where "
             "neither runs, or by hand. Exit 1 if a delete failed.", run_gc)
    p.add_argument("--scheduler", choices=("auto", "slurm", "pbs", "none"), default="auto",
                   help="who says which jobs still run (auto: slurm if scontrol is on PATH, "
                        "else pbs if qstat is, else none: repairs only)")
    p.add_argument("--dry-run", action="store_true", help="say what would be done, do nothing")


def run_gc(service: Any, args: argparse.Namespace) -> int:
    from pbs_power.groups.collect import Collected, collect
    which = _which(args.scheduler)
    job_of = job_alive = None
    if which == "slurm":
        from pbs_power.slurm.jobs import job_id_of_group, scontrol_job_alive
        job_of, job_alive = job_id_of_group, scontrol_job_alive
    done = collect(service, job_of, job_alive, dry_run=args.dry_run)
    if which == "pbs" and not args.dry_run:
        done += [Collected(name, "deleted", "its job is no longer in qstat")
                 for name in _pbs_leaked(service)]
    if args.json:
        print(json.dumps({"scheduler": which, "dry_run": args.dry_run, "groups": [
            {"group_name": c.group, "action": c.action, "why": c.why} for c in done]}))
    else:
        for c in done:
            print("%s: %s%s (%s)" % (c.group, "would be " if args.dry_run and c.action in (
                "repaired", "deleted") else "", c.action, c.why))
        if not done:
            print("nothing to collect (jobs asked of: %s)" % which)
    return EXIT_FAILED if any(c.action == "failed" for c in done) else EXIT_OK


def _which(given: str) -> str:
    if given != "auto":
        return given
    return "slurm" if shutil.which("scontrol") else "pbs" if shutil.which("qstat") else "none"


def _pbs_leaked(service: Any) -> list:
    """Groups of jobs ``qstat -f -F json`` no longer lists, deleted as the PBS hook does."""
    import time
    from pbs_power.pbs.hook import live_job_ids_from, query_jobs_json
    from pbs_power.cli.topology import CliError
    from pbs_power.pbs.hook import QueryError
    from pbs_power.pbs.install import InstallError, find_pbs_exec
    from pbs_power.pbs.jobs import cleanup_leaked
    before = time.time()
    try:
        live = live_job_ids_from(query_jobs_json(find_pbs_exec(None, os.environ)))
    except (InstallError, QueryError) as exc:
        raise CliError("jobs unknown, nothing deleted: %s" % exc, EXIT_FAILED) from None
    return cleanup_leaked(service, live, lambda level, message: None, before)
