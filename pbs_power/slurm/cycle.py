"""``pbs-power slurm cycle``: the PBS hook's planner over Slurm's view, acted on through Slurm.

Run periodically (a systemd timer or scrontrol, every ``cycle_interval``
seconds). It reads nodes, jobs with their start estimates and reservations
(`pbs_power.slurm.adapter`), adds what the state store knows (transitions
in flight, measured boot times, when hosts went down, recent power steps)
and runs the same `planner.plan` as the PBS hook. The plan is carried out
by asking slurmctld, never the hardware: ``scontrol update nodename=H
state=power_up`` to wake a node ahead of the job that will need it, and
``state=power_down`` for idle ones, so Slurm stays the owner of node state
and calls our ResumeProgram/SuspendProgram (`pbs_power.slurm.power`), which
apply the limits again and record the transitions.

Nodes Slurm is already powering up or down without a record of ours yet
count as in flight, so the planner's ``max_concurrent_nodes`` sees them.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Tuple

from pbs_power.config.hook_config import HookConfig
from pbs_power.states import journal
from pbs_power.states.cycle import boot_times, deferral_lines
from pbs_power.states.model import Phase, Plan, Snapshot, Transition, TransitionKind
from pbs_power.states.planner import RAMP_WINDOW, plan
from .adapter import (COMING_UP_FLAGS, SlurmClient, SlurmError, SlurmView,
                               read_view)
from .power import failed_hosts_back, forget_stale

LOCK_NAME = "slurm-cycle"
#: Slurm node state set for each kind of action.
SLURM_STATE = {True: "POWER_DOWN", False: "POWER_UP"}


@dataclass
class SlurmCycleReport:
    """What one cycle asked of Slurm, for the caller and the tests."""

    ran: bool = True
    plan: Plan = field(default_factory=Plan)
    powered_down: List[str] = field(default_factory=list)
    powered_up: List[str] = field(default_factory=list)
    refused: Dict[str, str] = field(default_factory=dict)


def slurm_in_flight(view: SlurmView, known: Tuple[Transition, ...],
                    now: float) -> Tuple[Transition, ...]:
    """Transitions Slurm has under way that no run of ours has recorded yet."""
    recorded = {t.host for t in known}
    out = []
    for node in view.nodes:
        if node.name in recorded:
            continue
        if node.flags & {"POWER_DOWN", "POWERING_DOWN"}:
            out.append(Transition(node.name, TransitionKind.POWER_OFF, Phase.POWERING_DOWN,
                                  now, now, "Slurm is powering it down"))
        elif node.flags & COMING_UP_FLAGS:
            out.append(Transition(node.name, TransitionKind.POWER_ON, Phase.POWERING_UP,
                                  now, now, "Slurm is powering it up"))
    return tuple(out)


def with_history(snapshot: Snapshot, store, view: SlurmView, now: float) -> Snapshot:
    """The snapshot plus the store's transitions, boot times, down times and power steps."""
    known = store.transitions()
    return replace(snapshot, transitions=known + slurm_in_flight(view, known, now),
                   boot_times=boot_times(store), down_since=store.down_since(),
                   recent_steps=store.recent_steps(now - RAMP_WINDOW))


def run_cycle(config: HookConfig, store, client: SlurmClient, log: logging.Logger,
              now: float, dry_run: bool = False) -> SlurmCycleReport:
    """One periodic pass; ``dry_run`` plans and logs but asks Slurm for nothing."""
    clock = time.monotonic()
    with store.cycle_lock(LOCK_NAME) as acquired:
        if not acquired:
            log.warning("previous slurm cycle still running; this run does nothing")
            journal.record_cycle(store, journal.CycleRecord(
                now, time.monotonic() - clock, "skipped"))
            return SlurmCycleReport(ran=False)
        try:
            view = read_view(client)
        except SlurmError:
            journal.record_cycle(store, journal.CycleRecord(
                now, time.monotonic() - clock, "query_failed"))
            raise
        forget_stale(store, config, now, log)
        failed_hosts_back(store, view, log)
        snapshot = with_history(view.snapshot(now), store, view, now)
        report = SlurmCycleReport(plan=plan(snapshot, config, now))
        for note in report.plan.notes:
            log.debug(note)
        for action in report.plan.actions:
            _ask_slurm(client, action, report, log, dry_run)
        _log_deferrals(report.plan, log)
        journal.record_pass(store, snapshot.vnodes, report.plan.deferred, now,
                            time.monotonic() - clock, "ran")
        return report


def _ask_slurm(client: SlurmClient, action, report: SlurmCycleReport,
               log: logging.Logger, dry_run: bool) -> None:
    down = action.kind.is_down
    state = SLURM_STATE[down]
    if dry_run:
        log.info("%s: would set state=%s (%s)", action.host, state.lower(), action.reason)
        return
    try:
        client.update_nodes([action.host], state)
    except SlurmError as exc:
        report.refused[action.host] = str(exc)
        log.error("%s: state=%s refused by Slurm: %s", action.host, state.lower(), exc)
        return
    (report.powered_down if down else report.powered_up).append(action.host)
    log.info("%s: state=%s requested from Slurm (%s)", action.host, state.lower(), action.reason)


def _log_deferrals(the_plan: Plan, log: logging.Logger) -> None:
    for level, message in deferral_lines(the_plan):
        getattr(log, level)("%s", message)


def cycle_main(config: HookConfig, client: Optional[SlurmClient] = None,
               log: Optional[logging.Logger] = None, dry_run: bool = False,
               clock: Optional[Callable[[], float]] = None
               ) -> Tuple[int, Optional[SlurmCycleReport]]:
    """Open the store, run one cycle; (exit code, report). Errors are logged, not raised."""
    import time
    from .adapter import get_client
    from .env import program_logger
    from pbs_power.states.store import Store, StoreError
    log = log or program_logger("cycle", config)
    try:
        client = client or get_client(log=log)
        with Store.open(config.state_dir) as store:
            report = run_cycle(config, store, client, log, (clock or time.time)(), dry_run)
    except (SlurmError, StoreError) as exc:
        log.error("slurm cycle: nothing done: %s", exc)
        return 1, None
    if report.ran:
        collect_job_groups(config, client, log, dry_run)
    return (1 if report.refused else 0), report


def collect_job_groups(config: HookConfig, client: SlurmClient, log: logging.Logger,
                       dry_run: bool = False) -> None:
    """Repair interrupted groups and delete those of jobs Slurm no longer runs (an epilog
    that never came); errors are logged, nothing else."""
    import time
    from pbs_power.groups.collect import collect
    from pbs_power.groups.jobs import open_service
    from pbs_power.states.sqlite import StoreError
    from .jobs import LIVE_STATES, job_id_of_group
    say = (lambda level, message: getattr(log, level)(message))
    try:
        service = open_service(config, say, quiet=True)
        if service is None:
            return
        try:
            before = time.time()
            states = {job.id: job.state for job in client.jobs()}
            done = collect(service, job_id_of_group,
                           lambda job: states.get(job) in LIVE_STATES, dry_run, before)
        finally:
            service.close()
    except (SlurmError, StoreError) as exc:
        log.warning("resource groups not collected: %s", exc)
        return
    for c in done:
        log.info("%s: %s%s (%s)", c.group, "would be " if dry_run else "", c.action, c.why)
