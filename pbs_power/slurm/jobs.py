"""Slurm job power policies: each job's resource group from PrologSlurmctld to EpilogSlurmctld.

PrologSlurmctld (on the controller, before the job starts) creates group
``rg_<SLURM_JOB_ID>`` (external id: the job id), adds the job's nodes that
are in the topology (``SLURM_JOB_NODELIST`` expanded with ClusterShell) and
activates it with the job's policy, chosen in this order:

1. ``--power-policy=NAME`` of sbatch/salloc/srun (the SPANK plugin
   ``slurm_spank/power_policy.c`` puts it in the job control environment,
   which reaches the prolog as ``SPANK_POWER_POLICY``; Slurm also forwards
   the option itself as ``SPANK__SLURM_SPANK_OPTION_power_policy_power_policy``);
2. ``power_policy=NAME`` in the job comment (``sbatch --comment``);
3. ``job_policies.partition_defaults[SLURM_JOB_PARTITION]`` of the hook config;
4. the topology default.

A refused activation (unknown policy, budget short under ``strict``, device
failures) exits 1: Slurm then requeues a batch job (eligible again after
cred_expire + 1 s, ``Restarts`` counts up) and cancels an srun/salloc job.
With ``job_policies.fail_open`` the job starts without a group instead.
Anything else that goes wrong (no config, no topology, an internal error) is
logged and exits 0: power management never holds a job back by mistake.

A node already in the group of another job that Slurm still runs (nodes
shared between jobs) keeps that job's policy, and this job's group leaves it
out; a group whose job has ended (a missed epilog) is deleted first.

EpilogSlurmctld (also run after a failed prolog) deletes the group, which
restores topology policies; a missing group is fine, so a second run is too.
Each run logs one line per job (syslog, and ``slurm_log_file`` if set).
"""
from __future__ import annotations

import logging
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

from pbs_power.groups.jobs import LogFn, group_name, start_job_group

#: Environment variables carrying ``--power-policy``, preferred first.
SPANK_POLICY_VARS = ("SPANK_POWER_POLICY",
                     "SPANK__SLURM_SPANK_OPTION_power_policy_power_policy")
#: A policy name a job may ask for (the SPANK plugin checks the same).
POLICY_NAME = re.compile(r"[A-Za-z0-9_.:+-]{1,64}")
_COMMENT_POLICY = re.compile(r"(?:^|[\s,;])power_policy=([^\s,;]*)")
_JOB_ID = re.compile(r"[0-9]{1,19}")
REFUSAL = "exit 1: Slurm requeues a batch job, cancels an srun/salloc job"
#: Job states in which a job still holds its nodes (and its group).
LIVE_STATES = frozenset(("RUNNING", "CONFIGURING", "SUSPENDED", "STOPPED", "RESIZING",
                         "SIGNALING", "STAGE_OUT"))
SCONTROL_TIMEOUT = 10.0
#: Tries at claiming the job's nodes when another job's group takes one meanwhile.
CLAIM_ATTEMPTS = 3
#: Seconds the epilog waits for a group another program is changing.
EPILOG_BUSY_WAIT = 10.0
_LEVELS = {"debug": 0, "info": 1, "warning": 2, "error": 3}

JobAlive = Callable[[str], Optional[bool]]


class JobEnvError(ValueError):
    """The environment is not that of a Slurm prolog/epilog; the message says why."""


@dataclass(frozen=True)
class SlurmJob:
    """What a PrologSlurmctld/EpilogSlurmctld learns of its job from the environment."""

    job_id: str
    nodelist: str = ""
    partition: Optional[str] = None
    comment: str = ""
    spank_policy: Optional[str] = None
    restarts: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "SlurmJob":
        """The job slurmctld describes in ``env``; JobEnvError without a job id."""
        job_id = (env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or "").strip()
        if not _JOB_ID.fullmatch(job_id):
            raise JobEnvError("SLURM_JOB_ID is %s: not run by slurmctld as PrologSlurmctld or "
                              "EpilogSlurmctld" % (repr(job_id) if job_id else "unset"))
        spank = next((env[v] for v in SPANK_POLICY_VARS if env.get(v)), None)
        restarts = env.get("SLURM_JOB_RESTART_COUNT", "0")
        return cls(job_id, env.get("SLURM_JOB_NODELIST", "").strip(),
                   env.get("SLURM_JOB_PARTITION") or None, env.get("SLURM_JOB_COMMENT", ""),
                   spank, int(restarts) if restarts.isdigit() else 0)

    def hosts(self) -> List[str]:
        """The job's nodes, expanded (``node[1-2]`` -> node1, node2); ValueError if malformed."""
        if not self.nodelist:
            return []
        from ClusterShell.NodeSet import NodeSet, NodeSetParseError
        try:
            return list(NodeSet(self.nodelist))
        except NodeSetParseError as exc:
            raise ValueError("SLURM_JOB_NODELIST %r: %s" % (self.nodelist, exc)) from None


# -- policy choice (pure) ----------------------------------------------------------
def comment_policy(comment: str) -> Tuple[Optional[str], str]:
    """(name, note): the first ``power_policy=NAME`` of a job comment; note if malformed."""
    match = _COMMENT_POLICY.search(comment or "")
    if match is None:
        return None, ""
    name = match.group(1)
    if POLICY_NAME.fullmatch(name):
        return name, ""
    return None, "comment power_policy=%r ignored (1-64 letters, digits, . _ : + -)" % name


def choose_policy(job: SlurmJob, job_policies) -> Tuple[Optional[str], str]:
    """(policy name or None, why) in the documented order; None = topology default."""
    notes = []
    if job.spank_policy:
        if POLICY_NAME.fullmatch(job.spank_policy):
            return job.spank_policy, "%s requested by --power-policy" % job.spank_policy
        notes.append("--power-policy=%r ignored (1-64 letters, digits, . _ : + -)"
                     % job.spank_policy)
    name, note = comment_policy(job.comment)
    if name:
        return name, "; ".join(notes + ["%s requested by the job comment" % name])
    notes += [note] if note else []
    partition_defaults = getattr(job_policies, "partition_defaults", {}) or {}
    if job.partition and job.partition in partition_defaults:
        return partition_defaults[job.partition], "; ".join(
            notes + ["partition %s default" % job.partition])
    notes.append("no policy requested: topology default")
    return None, "; ".join(notes)


# -- nodes shared with other jobs ------------------------------------------------------
def job_id_of_group(name: str) -> Optional[str]:
    """The Slurm job id of a group ``rg_<id>``, None for any other group."""
    key = name[3:] if name.startswith("rg_") else ""
    return key if _JOB_ID.fullmatch(key) else None


def claim_hosts(service, hosts: Sequence[str], own: str, job_alive: JobAlive,
                say: LogFn) -> List[str]:
    """The hosts this job's group may take: groups of ended jobs are deleted first.

    A host in the group of a job Slurm still runs, or may run (its state
    cannot be read), or in a group that belongs to no job, is left to that
    group.
    """
    taken = service.store.member_groups(list(hosts))
    skip = set()
    for group in sorted(set(taken.values()) - {own}):
        members = fold([h for h, g in taken.items() if g == group])
        job_id = job_id_of_group(group)
        alive = job_alive(job_id) if job_id else True
        if alive is False:
            resp = service.delete(group)
            if resp.status.ok or resp.status.code == "not_found":
                say("info", "deleted %s: job %s has ended but its group still held %s"
                    % (group, job_id, members))
                continue
        why = ("not a job's group" if job_id is None else "shared with job %s" % job_id
               if alive else "job %s may still run" % job_id)
        say("info", "%s left under %s (%s)" % (members, group, why))
        skip.update(h for h, g in taken.items() if g == group)
    return [h for h in hosts if h not in skip]


def scontrol_job_alive(job_id: str, env: Optional[Mapping[str, str]] = None,
                       timeout: float = SCONTROL_TIMEOUT, retry_after: float = 0.5
                       ) -> Optional[bool]:
    """Whether Slurm still runs job ``job_id``: True, False (ended or unknown), None (no answer).

    A quick failure (slurmctld busy with many prologs at once) is tried once more after
    ``retry_after`` seconds; a timeout is not.
    """
    import shutil
    import subprocess  # only when another job's group holds a node: not on every prolog
    scontrol = shutil.which("scontrol", path=(env or {}).get("PATH") or None)
    if scontrol is None:
        return None
    for attempt in (1, 2):
        try:
            proc = subprocess.run([scontrol, "--oneliner", "show", "job", job_id], env=env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, universal_newlines=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        except OSError:
            proc = None
        if proc is not None and proc.returncode == 0:
            return job_state_alive(proc.stdout)
        if proc is not None and "invalid job id" in proc.stderr.lower():
            return False
        if attempt == 1:
            time.sleep(retry_after)
    return None


def job_state_alive(scontrol_text: str) -> Optional[bool]:
    """From ``scontrol -o show job`` text: is the job in a state that holds its nodes?"""
    match = re.search(r"(?:^|\s)JobState=(\S+)", scontrol_text)
    return None if match is None else match.group(1) in LIVE_STATES


# -- prolog and epilog -------------------------------------------------------------
@dataclass
class JobLine:
    """Collects a job's messages into the one line logged per job; debug lines apart."""

    job_id: str
    program: str
    level: str = "info"

    def __post_init__(self) -> None:
        self.parts: List[str] = []
        self.debug: List[str] = []

    def __call__(self, level: str, message: str) -> None:
        if level == "debug":
            self.debug.append(message)
            return
        self.parts.append(" ".join(message.split()))
        if _LEVELS.get(level, 1) > _LEVELS[self.level]:
            self.level = level

    def line(self, seconds: float) -> str:
        text = "; ".join(self.parts) or "nothing to do"
        return "job %s %s: %s (%.3f s)" % (self.job_id, self.program, text, seconds)


def prolog(service, job: SlurmJob, job_policies, say: LogFn,
           job_alive: JobAlive = scontrol_job_alive) -> int:
    """Give the starting job its resource group; the exit status for slurmctld."""
    topo, _active = service.topology()
    hosts = job.hosts()
    managed = [h for h in hosts if h in topo.entities]
    skipped = [h for h in hosts if h not in topo.entities]
    if skipped:
        say("info", "not in topology %s, no policy: %s" % (topo.name, fold(skipped)))
    if job.restarts:
        say("info", "restart %d" % job.restarts)
    policy, why = choose_policy(job, job_policies)
    for attempt in range(1, CLAIM_ATTEMPTS + 1):
        notes: List[Tuple[str, str]] = []  # only the last try's messages are logged
        accept, claimed = _start(service, job, managed, policy, why, job_policies,
                                 lambda level, message: notes.append((level, message)),
                                 job_alive)
        if accept or attempt == CLAIM_ATTEMPTS or not _taken_meanwhile(service, claimed, job):
            break
    if attempt > 1:
        say("info", "attempt %d: nodes were taken by another job meanwhile" % attempt)
    for level, message in notes:
        say(level, message)
    return 0 if accept else 1


def _start(service, job: SlurmJob, managed: Sequence[str], policy: Optional[str], why: str,
           job_policies, say: LogFn, job_alive: JobAlive) -> Tuple[bool, List[str]]:
    """(accepted, hosts claimed): one try at creating and activating the job's group."""
    own = group_name(job.job_id)
    claimed = claim_hosts(service, managed, own, job_alive, say) if managed else []
    if not claimed:
        if service.delete(own).status.ok:  # a requeued job's group from its earlier run
            say("info", "deleted stale resource group %s (job requeued)" % own)
        say("info", "no node of the job to manage (%s)" % (fold(job.hosts()) or "no nodes"))
        return True, claimed
    outcome = start_job_group(service, job.job_id, claimed, policy, why, job_policies, say,
                              refusal=REFUSAL)
    return outcome.accept, claimed


def _taken_meanwhile(service, hosts: Sequence[str], job: SlurmJob) -> bool:
    """Whether another group took some of ``hosts`` (two jobs starting on a shared node)."""
    own = group_name(job.job_id)
    return any(g != own for g in service.store.member_groups(list(hosts)).values())


def epilog(service, job: SlurmJob, say: LogFn, busy_wait: float = EPILOG_BUSY_WAIT) -> int:
    """Delete the job's group (topology policies return); 0 also when there was none.

    A group another program is changing (the next job's prolog deleting it
    as stale, say) is waited for, up to ``busy_wait`` seconds.
    """
    name = group_name(job.job_id)
    deadline = time.monotonic() + busy_wait
    resp = service.delete(name)
    waited = False
    while resp.status.code == "busy" and time.monotonic() < deadline:
        waited = True
        time.sleep(0.2)
        resp = service.delete(name)
    if resp.status.ok:
        say("info", "job ended: %s; topology policies restored" % resp.status.diag_msg)
        return 0
    if resp.status.code == "not_found":
        if waited:
            say("info", "job ended: %s deleted by another program meanwhile; "
                        "topology policies restored" % name)
        else:
            say("info", "no resource group %s: nothing to do" % name)
        return 0
    say("warning", "%s not deleted (%s); the next job on its nodes deletes it"
        % (name, resp.status.diag_msg))
    return 1


def fold(hosts: Sequence[str]) -> str:
    """Hosts as one hostlist expression (``node[1-4]``)."""
    if not hosts:
        return ""
    from ClusterShell.NodeSet import NodeSet
    return str(NodeSet.fromlist(list(hosts)))


# -- the programs ------------------------------------------------------------------
def run(program: str, env: Mapping[str, str], config_file: str,
        clock: Callable[[], float] = time.monotonic, started: Optional[float] = None,
        origin: str = "") -> int:
    """PrologSlurmctld (``program`` "prolog") or EpilogSlurmctld ("epilog"); exit status.

    The time in its log line counts from ``started`` (a ``clock`` value),
    else from this call; ``origin`` (who ran it, if not the program) is logged at debug.
    """
    from pbs_power.config.hook_config import ConfigError, load_config
    from .env import program_logger
    start = clock() if started is None else started
    try:
        job = SlurmJob.from_env(env)
    except JobEnvError as exc:
        program_logger(program).error("%s", exc)
        return 2
    line = JobLine(job.job_id, program)
    if origin:
        line("debug", "run by %s" % origin)
    try:
        config = load_config(config_file)
    except ConfigError as exc:
        line("error", "hook config rejected, nothing done: %s" % exc)
        program_logger(program).error("%s", line.line(clock() - start))
        return 0
    logger = program_logger(program, config)
    try:
        status = _run_job(program, job, config, line, env)
    except Exception as exc:  # never hold a job back for a bug: log it and let the job go
        line("error", "internal error, nothing held back: %s: %s" % (type(exc).__name__, exc))
        logger.debug("job %s %s: traceback", job.job_id, program, exc_info=True)
        status = 0
    for message in line.debug:
        logger.debug("job %s %s: %s", job.job_id, program, message)
    logger.log(logging.getLevelName(line.level.upper()), "%s", line.line(clock() - start))
    return status


def _run_job(program: str, job: SlurmJob, config, say: LogFn, env: Mapping[str, str]) -> int:
    """Open the resource-group service (None: not set up, logged) and run the program."""
    from pbs_power.groups.jobs import open_service
    if program == "prolog":
        try:
            job.hosts()
        except ValueError as exc:
            say("error", "%s; nothing done" % exc)
            return 0
    service = open_service(config, say)
    if service is None:
        return 0
    try:
        if program == "prolog":
            return prolog(service, job, config.job_policies, say,
                          job_alive=lambda job_id: scontrol_job_alive(job_id, env))
        return epilog(service, job, say)
    finally:
        service.close()


def _parse_args(program: str, argv: Sequence[str]):
    import argparse
    parser = argparse.ArgumentParser(
        prog="pbs-power-slurm-" + program,
        description="Slurm %sSlurmctld of pbs_power: %s the job's resource group." % (
            program.capitalize(), "create and activate" if program == "prolog" else "delete"),
        epilog="With pbs-power-slurm-jobd listening ($PBS_POWER_JOB_SOCKET, else "
               "/run/pbs_power/slurm-jobs.sock) the run is done by its forked child; "
               "without it, here.")
    parser.add_argument("--config", help="hook config (default $PBS_POWER_CONFIG, else "
                                         "/etc/pbs_power.json)")
    return parser.parse_args(argv)


def main(program: str, argv: Optional[Sequence[str]] = None,
         env: Optional[Mapping[str, str]] = None) -> int:
    """Entry point of ``pbs-power-slurm-prolog`` / ``-epilog``: ``[--config FILE]``."""
    from .env import config_path, process_started
    argv = list(sys.argv[1:] if argv is None else argv)
    # slurmctld passes no arguments: argparse (and its gettext) only when there are some
    config_file = _parse_args(program, argv).config if argv else None
    environ = dict(os.environ if env is None else env)
    # the logged time is the program's whole wall time, interpreter start-up included
    return run(program, environ, config_file or config_path(environ), started=process_started())
