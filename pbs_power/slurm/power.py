"""Slurm's SuspendProgram, ResumeProgram and ResumeFailProgram, over our power backends.

slurmctld decides which nodes to power down (idle for SuspendTime, or
``scontrol update state=power_down``) and up (a job needs them, or
``state=power_up``) and runs these programs with the hostlist in argv[1].
Each run applies the hook config, records every transition in the state
store (so concurrent runs and the periodic ``pbs-power slurm cycle`` see the
same hosts in flight), calls the configured ``power_backend``, and follows its
own hosts until they are done or its deadline comes:

* ``max_concurrent_nodes`` and ``max_ramp_watts_per_minute`` are checked and
  taken atomically (one ``BEGIN IMMEDIATE`` transaction) across concurrent
  runs; hosts over a limit wait in the run until a slot frees (each run's
  own hosts finishing free theirs), at most until the deadline.
* ``exclude_nodes`` are never powered down (set SuspendExcNodes to the same
  list, as ``pbs-power slurm install`` prints, so that Slurm never asks).
* A resumed host is done when Slurm shows it usable; the time from the
  command to then is its measured boot time (``pbs-power`` and the planner
  use the 90th percentile of the last ten). A suspended host is done when
  the backend reports it off (or asleep).
* Deadlines: ResumeTimeout (and ``boot_timeout``) for resume, SuspendTimeout
  (and ``shutdown_timeout``) for suspend, minus a margin. A host still in
  flight then stays recorded; records older than the timeouts are dropped
  by later runs.
* ResumeFailProgram (hosts that missed ResumeTimeout): the host is recorded
  as failed, powered off and drained with a ``pbs_power:`` reason, so it is
  not retried until an admin runs ``scontrol update nodename=H state=resume``.

Nothing here raises for one host: each host's outcome is one log line.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from pbs_power.config.hook_config import MODE_DISABLED, HookConfig
from pbs_power.states import journal
from pbs_power.states.model import Phase, PowerState, RampStep, Snapshot, Transition, TransitionKind
from pbs_power.states.planner import RAMP_WINDOW, _RampBudget, up_kind  # the planner's own ramp accounting, reused
from .adapter import DRAIN_FLAGS, SlurmClient, SlurmError, SlurmView, fold, usable

#: Seconds kept between our deadline and Slurm's own timeout.
DEADLINE_MARGIN_S = 5.0
POLL_INTERVAL_S = 2.0
FAIL_REASON_PREFIX = "pbs_power: "


@dataclass
class PowerRun:
    """What one program run works with; clock and sleep are injectable for tests."""

    config: HookConfig
    store: object            # pbs_power.states.store.Store
    backend: object          # pbs_power.devices.PowerBackend
    client: SlurmClient
    log: object              # logging.Logger
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    poll_interval: float = POLL_INTERVAL_S
    #: host -> (kind, started) of the transitions this run owns.
    owned: Dict[str, Tuple[TransitionKind, float]] = field(default_factory=dict)
    failures: int = 0


# -- limits ------------------------------------------------------------------------
def step_watts(config: HookConfig, host: str, kind: TransitionKind) -> float:
    """The power step ``kind`` causes on ``host`` (0 without node watts)."""
    power = config.power_of(host)
    if power is None:
        return 0.0
    low = power.sleep_watts if kind in (TransitionKind.SLEEP, TransitionKind.WAKE) \
        else power.off_watts
    step = power.idle_watts - low
    return -step if kind.is_down else step


def admit(run: PowerRun, hosts: Sequence[str], kinds: Mapping[str, TransitionKind],
          reasons: Mapping[str, str]) -> Tuple[List[str], Dict[str, str]]:
    """Record transitions for the hosts the limits allow now; (admitted, held: why)."""
    now = run.clock()
    cfg, store = run.config, run.store
    admitted: List[str] = []
    held: Dict[str, str] = {}
    with store.transaction():
        flights = {t.host: t for t in store.transitions()}
        busy = sum(1 for h, t in flights.items()
                   if t.phase is not Phase.BOOTING and h not in hosts)
        ramp = _RampBudget.start(Snapshot(vnodes=(), recent_steps=store.recent_steps(
            now - RAMP_WINDOW)), cfg, now)
        steps = []
        for host in hosts:
            kind = kinds[host]
            if busy >= cfg.max_concurrent_nodes:
                held[host] = ("max_concurrent_nodes=%d hosts already in transition"
                              % cfg.max_concurrent_nodes)
                continue
            watts = step_watts(cfg, host, kind)
            if not ramp.take(watts):
                held[host] = ("max_ramp_watts_per_minute=%g would be exceeded"
                              % (cfg.max_ramp_watts_per_minute or 0))
                continue
            busy += 1
            phase = Phase.POWERING_DOWN if kind.is_down else Phase.POWERING_UP
            t = Transition(host, kind, phase, now, now, reasons[host])
            store.put_transition(t)
            # Slurm resumes a host for a job it already placed there: the job waits
            # from now until the host is usable.
            journal.started(store, t, now if reasons[host].startswith("for job") else None)
            run.owned[host] = (kind, now)
            if watts:
                steps.append(RampStep(now, host, watts))
            admitted.append(host)
        store.record_steps(steps)
    return admitted, held


def send(run: PowerRun, hosts: Sequence[str], kinds: Mapping[str, TransitionKind],
         reasons: Mapping[str, str]) -> None:
    """Call the backend for admitted hosts; a refusal drops the host's record."""
    by_kind: Dict[TransitionKind, List[str]] = {}
    for host in hosts:
        by_kind.setdefault(kinds[host], []).append(host)
    for kind, group in by_kind.items():
        try:
            results = run.backend.request(kind, group, run.clock())
        except Exception as exc:   # BackendError or a bug: every host of the group failed
            results = {h: None for h in group}
            run.log.error("%s: power backend failed: %s", fold(group), exc)
        for host in group:
            result = results.get(host)
            if result is not None and result.ok:
                run.log.info("%s: %s sent (%s)", host, kind.value, reasons[host])
                continue
            diag = result.diag if result is not None else "no answer from the backend"
            run.store.drop_transition(host)
            journal.ended(run.store, Transition(host, kind, Phase.POWERING_UP, run.clock(),
                                                run.clock()), "backend refused: " + diag,
                          run.clock())
            run.owned.pop(host, None)
            run.failures += 1
            run.log.error("%s: %s refused by the power backend: %s%s", host, kind.value, diag,
                          "; Slurm marks it DOWN at ResumeTimeout" if not kind.is_down else
                          "; the host stays on although Slurm counts it powered down")


# -- following transitions -----------------------------------------------------------
def still_owned(run: PowerRun) -> Dict[str, Transition]:
    """This run's transitions still in the store (another run may have taken a host over)."""
    current = {t.host: t for t in run.store.transitions()}
    out = {}
    for host, (kind, started) in list(run.owned.items()):
        t = current.get(host)
        if t is not None and t.kind is kind and t.started == started:
            out[host] = t
        else:
            run.owned.pop(host)
            run.log.info("%s: %s handed over to a later request", host, kind.value)
    return out


def follow(run: PowerRun) -> None:
    """Advance this run's transitions: backend state for downs, Slurm's view for ups."""
    flights = still_owned(run)
    if not flights:
        return
    now = run.clock()
    try:
        statuses = run.backend.status(sorted(flights), now)
    except Exception as exc:
        statuses = {}
        run.log.warning("%s: power backend status failed: %s", fold(flights), exc)
    view = None
    if any(not t.kind.is_down for t in flights.values()):
        try:
            view = SlurmView(tuple(run.client.nodes()), ())
        except SlurmError as exc:
            run.log.warning("cannot read Slurm's nodes: %s", exc)
    for host, t in flights.items():
        status = statuses.get(host)
        if t.kind.is_down:
            target = PowerState.ASLEEP if t.kind is TransitionKind.SLEEP else PowerState.OFF
            if status is not None and status.state is target:
                done_at = status.since if status.since is not None else now
                finish(run, t, max(0.0, done_at - t.started), now,
                       "backend reports it %s" % target.value)
            continue
        node = view.node(host) if view is not None else None
        if usable(node):
            finish(run, t, max(0.0, now - t.started), now,
                   "Slurm shows it %s" % node.state_string.lower())
        elif t.phase is Phase.POWERING_UP and status is not None \
                and status.state is PowerState.ON:
            run.store.put_transition(t.advanced(Phase.BOOTING, now))
            run.log.info("%s: backend reports it on; waiting for slurmd to register", host)


def finish(run: PowerRun, t: Transition, seconds: float, now: float, why: str) -> None:
    """Record a completed transition: duration, down-since, failure mark cleared."""
    store = run.store
    with store.transaction():
        store.drop_transition(t.host)
        store.record_duration(t.host, t.kind, t.started, seconds)
        store.set_down_since(t.host, now if t.kind.is_down else None)
        if not t.kind.is_down:
            store.clear_failed(t.host)
        journal.completed(store, t, seconds, now, journal.saved_watts(
            run.config.power_of(t.host), t.kind) if t.kind.is_down else 0.0)
    run.owned.pop(t.host, None)
    run.log.info("%s: %s done in %ds (%s)", t.host, t.kind.value, round(seconds), why)


def forget_stale(store, config: HookConfig, now: float, log) -> None:
    """Drop records of transitions older than their timeout (their run was killed)."""
    for t in store.transitions():
        limit = config.shutdown_timeout if t.kind.is_down else config.boot_timeout
        if now - t.started > limit + DEADLINE_MARGIN_S:
            store.drop_transition(t.host)
            log.warning("%s: %s started %ds ago never finished; record dropped",
                        t.host, t.kind.value, now - t.started)


def work(run: PowerRun, hosts: Sequence[str], kinds: Mapping[str, TransitionKind],
         reasons: Mapping[str, str], deadline: float) -> int:
    """Admit, send and follow ``hosts`` until all are done or ``deadline``; the exit code."""
    waiting = list(hosts)
    said: Dict[str, str] = {}
    while True:
        if waiting:
            admitted, held = admit(run, waiting, kinds, reasons)
            send(run, admitted, kinds, reasons)
            for host, why in held.items():
                if said.get(host) != why:
                    run.log.info("%s: %s held back: %s", host, kinds[host].value, why)
                    said[host] = why
            waiting = [h for h in waiting if h in held]
        follow(run)
        if not waiting and not run.owned:
            break
        if run.clock() + run.poll_interval > deadline:
            for host in waiting:
                run.failures += 1
                run.log.error("%s: %s not sent: %s until this run's deadline", host,
                              kinds[host].value, said.get(host, "held back"))
            for host, (kind, _started) in run.owned.items():
                run.log.warning("%s: %s still in progress at this run's deadline; "
                                "left recorded", host, kind.value)
            break
        run.sleep(run.poll_interval)
    return 1 if run.failures else 0


# -- the three programs ----------------------------------------------------------------
def _deadline(run: PowerRun, ours: int, slurm_timeout: Optional[int]) -> float:
    limit = ours if slurm_timeout is None else min(ours, slurm_timeout)
    return run.clock() + max(run.poll_interval, limit - DEADLINE_MARGIN_S)


def _slurm_timeouts(run: PowerRun) -> Tuple[Optional[int], Optional[int]]:
    try:
        power = run.client.power_config()
    except SlurmError as exc:
        run.log.warning("cannot read ResumeTimeout/SuspendTimeout from Slurm: %s", exc)
        return None, None
    return power.resume_timeout, power.suspend_timeout


def suspend(run: PowerRun, hosts: Sequence[str]) -> int:
    """SuspendProgram: power ``hosts`` off (or put them to sleep in ramp-rate mode)."""
    cfg = run.config
    forget_stale(run.store, cfg, run.clock(), run.log)
    if cfg.mode == MODE_DISABLED:
        run.log.warning("%s: not powered down: power_on_off_enable and power_ramp_rate_enable "
                        "are both false in the hook config", fold(hosts))
        return 1
    refused = [h for h in hosts if h in cfg.excluded_hosts]
    for host in refused:
        run.log.warning("%s: not powered down: listed in exclude_nodes (add it to "
                        "SuspendExcNodes)", host)
    hosts = [h for h in hosts if h not in cfg.excluded_hosts]
    kind = up_kind(cfg).reverse
    resume_timeout, suspend_timeout = _slurm_timeouts(run)
    slurm_limit = max(t for t in (resume_timeout, suspend_timeout, 0) if t is not None) or None
    deadline = _deadline(run, cfg.shutdown_timeout, slurm_limit)
    rc = work(run, hosts, {h: kind for h in hosts}, {h: "Slurm suspends it" for h in hosts},
              deadline) if hosts else 0
    return 1 if refused else rc


def resume(run: PowerRun, hosts: Sequence[str], resume_file: Optional[str] = None) -> int:
    """ResumeProgram: power ``hosts`` on (or wake them) and wait until Slurm sees them up."""
    cfg = run.config
    forget_stale(run.store, cfg, run.clock(), run.log)
    jobs = jobs_by_host(resume_file, run.log)
    resume_timeout, _ = _slurm_timeouts(run)
    deadline = _deadline(run, cfg.boot_timeout, resume_timeout)
    kinds = up_kinds(run, hosts, deadline)
    reasons = {h: jobs.get(h) or "Slurm resumes it" for h in kinds}
    rc = work(run, list(kinds), kinds, reasons, deadline)
    return 1 if rc or len(kinds) < len(hosts) else 0


def up_kinds(run: PowerRun, hosts: Sequence[str], deadline: float) -> Dict[str, TransitionKind]:
    """Power on hosts that are off, wake sleeping ones; power-cycle hosts still on.

    A host Slurm resumes must boot afresh (slurmd registers a new boot time);
    one the backend reports on (its power-down was held back or failed) is
    powered off first. Hosts that do not go off by the deadline are left out.
    """
    default = up_kind(run.config)
    try:
        powers = run.backend.status(list(hosts), run.clock())
    except Exception as exc:
        run.log.warning("%s: power backend status failed (%s); powering on anyway",
                        fold(hosts), exc)
        powers = {}
    kinds: Dict[str, TransitionKind] = {}
    still_on = []
    for host in hosts:
        state = getattr(powers.get(host), "state", None)
        if state is PowerState.ASLEEP:
            kinds[host] = TransitionKind.WAKE
        elif state is PowerState.OFF:
            kinds[host] = TransitionKind.POWER_ON
        elif state is PowerState.ON:
            still_on.append(host)
        else:
            kinds[host] = default
    if still_on:
        run.log.warning("%s: backend reports it on although Slurm resumes it; powering it "
                        "off first so that it boots afresh", fold(still_on))
        down = {h: TransitionKind.POWER_OFF for h in still_on}
        work(run, still_on, down, {h: "power cycle before resume" for h in still_on}, deadline)
        off = run.backend.status(still_on, run.clock())
        for host in still_on:
            if getattr(off.get(host), "state", None) is PowerState.OFF:
                kinds[host] = TransitionKind.POWER_ON
            else:
                run.log.error("%s: did not power off for the power cycle; not resumed", host)
    return kinds


def resume_fail(run: PowerRun, hosts: Sequence[str]) -> int:
    """ResumeFailProgram: record the failure, power the host off, drain it with a reason."""
    now = run.clock()
    rc = 0
    for host in hosts:
        t = next((x for x in run.store.transitions() if x.host == host), None)
        what = t.kind.value if t is not None and not t.kind.is_down else "power_on"
        reason = "%s failed: not usable in Slurm within ResumeTimeout" % what
        run.store.drop_transition(host)
        run.store.mark_failed(host, reason, now)
        journal.failed(run.store, t or Transition(host, TransitionKind.POWER_ON,
                                                  Phase.POWERING_UP, now, now), reason, now)
        try:
            result = run.backend.request(TransitionKind.POWER_OFF, [host], now).get(host)
            off = "powered off" if result is not None and result.ok else \
                "power off refused (%s)" % (result.diag if result is not None else "no answer")
        except Exception as exc:
            off = "power off failed (%s)" % exc
        try:
            run.client.update_nodes([host], "DRAIN", FAIL_REASON_PREFIX + reason)
            drained = "drained"
        except SlurmError as exc:
            drained = "not drained (%s)" % exc
            rc = 1
        run.log.error("%s: %s; %s, %s; not retried until an admin runs 'scontrol update "
                      "nodename=%s state=resume'", host, reason, off, drained, host)
    return rc


def jobs_by_host(resume_file: Optional[str], log) -> Dict[str, str]:
    """host -> ``for job N`` from SLURM_RESUME_FILE.

    Each of its ``jobs`` names the nodes resumed for it: ``nodes`` in 22.05,
    ``nodes_resume`` (beside ``nodes_alloc``, the whole allocation) in 24.11.
    """
    if not resume_file:
        return {}
    from .adapter import expand
    try:
        with open(resume_file) as f:
            doc = json.load(f)
        out: Dict[str, List[str]] = {}
        for job in doc.get("jobs") or ():
            resumed = job.get("nodes_resume", job.get("nodes")) or ""
            for host in expand(resumed):
                out.setdefault(host, []).append(str(job.get("job_id")))
    except (OSError, ValueError, AttributeError, SlurmError) as exc:
        log.warning("cannot read SLURM_RESUME_FILE %s: %s", resume_file, exc)
        return {}
    return {h: "for job %s" % ",".join(ids) for h, ids in out.items()}


def failed_hosts_back(store, view: SlurmView, log) -> Iterable[str]:
    """Forget failures of hosts an admin returned to service (no longer drained/down)."""
    back = []
    for host in store.failed():
        node = view.node(host)
        if node is not None and not (DRAIN_FLAGS & node.flags) and node.state != "DOWN":
            store.clear_failed(host)
            log.info("%s: back in service (drain cleared)", host)
            back.append(host)
    return back




# -- entry point ----------------------------------------------------------------------
PROGRAMS = ("suspend", "resume", "resume-fail")


def program_main(name: str, argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """Everything ``pbs-power-slurm-NAME HOSTLIST`` does; returns its exit status.

    Call `pbs_power.slurm.env.prepare_program_env` first. The hook config is
    ``$PBS_POWER_CONFIG`` or /etc/pbs_power.json; status 2 is a usage or
    config error, 1 a host that failed, 0 all done.
    """
    from pbs_power.config.hook_config import ConfigError, load_config
    from pbs_power.devices import BackendError, get_backend
    from .adapter import expand, get_client
    from .env import config_path, program_logger
    from pbs_power.states.store import Store, StoreError

    if name not in PROGRAMS:
        raise ValueError("unknown program %r" % name)
    path = config_path(environ)
    try:
        config = load_config(path)
    except ConfigError as exc:
        program_logger(name, None).error("hook config rejected, nothing done: %s",
                                         str(exc).replace("\n", "; "))
        return 2
    log = program_logger(name, config)
    for warning in config.warnings:
        log.warning("config: %s", warning)
    if len(argv) < 2 or not argv[1]:
        log.error("usage: %s HOSTLIST (slurmctld passes the nodes in argv[1])", name)
        return 2
    try:
        hosts = list(expand(argv[1]))
    except SlurmError as exc:
        log.error("nothing done: %s", exc)
        return 2
    try:
        with Store.open(config.state_dir) as store, \
                get_backend(config.power_backend, config.state_dir) as backend:
            run = PowerRun(config, store, backend, get_client(log=log), log)
            if name == "suspend":
                return suspend(run, hosts)
            if name == "resume":
                return resume(run, hosts, environ.get("SLURM_RESUME_FILE"))
            return resume_fail(run, hosts)
    except (StoreError, BackendError, SlurmError) as exc:
        log.error("%s: nothing done: %s", argv[1], exc)
        return 1
