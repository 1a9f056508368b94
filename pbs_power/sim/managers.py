"""The power managers the simulator compares, each as its system behaves.

* ``always-on``: nothing is ever powered down (the baseline).
* ``pbs-power``: our `Cycle` (reconcile, planner, backend, marks) run every
  ``cycle`` seconds over the snapshot a PBS server would show, with an
  in-memory store and a backend that drives the simulated nodes.
* ``slurm``: slurmctld's power save (src/slurmctld/power_save.c): 10 s
  passes, SuspendRate/ResumeRate token buckets, resume on allocation,
  SuspendExcNodes (with a count when pbs-power keeps a warm pool),
  ResumeTimeout.
* ``openpbs``: OpenPBS's PBS_power periodic hook with its shipped
  PBS_power.CF and .HK: every 300 s at most 5 power-offs and 5 power-ons.

The baselines follow their systems' sources (cited where they are modelled);
no code of theirs is copied.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from pbs_power.config.hook_config import MODE_RAMP_RATE, HookConfig
from pbs_power.states.cycle import Cycle, boot_times
from pbs_power.states.planner import lead_time, longest_lead, up_kind
from ..devices.base import HostPower, PowerBackend, Result
from pbs_power.states.model import Phase, PowerState, QueuedJob, Snapshot, TransitionKind, Vnode
from .hook_view import HookView
from .memstore import MemoryStore
from .scheduling import INF
from .manager import AlwaysOn, Manager  # noqa: F401  (re-exported)
from .slurm_power_save import (SLURM_RESUME_RATE, SLURM_SUSPEND_RATE,  # noqa: F401
                               SlurmPowerSave)
from .nodes import BOOTING, BUSY, DOWN, HELD, IDLE, SHUTTING, Node

MANAGERS = ("always-on", "pbs-power", "slurm", "openpbs", "pbs-power-forecast")
#: OpenPBS PBS_power as shipped: its fixed boot assumption (PBS_power.PY), nodes
#: powered off and on per run (max_concurrent_nodes in PBS_power.CF) and the
#: seconds between runs (freq in PBS_power.HK).
OPENPBS_BOOT = 900.0
OPENPBS_MAX_CONCURRENT = 5
OPENPBS_FREQ = 300.0


class OpenPBSPower(Manager):
    """OpenPBS's PBS_power periodic hook as shipped (src/modules/python/pbs_hooks).

    Every ``freq`` (300 s, PBS_power.HK) it powers off up to
    max_concurrent_nodes (5, PBS_power.CF) free nodes whose last_used_time
    is more than node_idle_limit ago, and powers on, counted apart, up to 5
    sleeping nodes that a queued job's estimated exec_vnode needs within
    its fixed 900 s boot, unless they went down less than
    min_node_down_delay ago. Power-offs look at state, idle time and
    reservations only (none here), never at the queue.
    """

    name = "openpbs"
    #: A hook named PBS_power turns the server's power_provisioning on, so the
    #: calendar has sleeping vnodes up at now + PROVISION_DURATION
    #: (src/scheduler/config.h, 600 s; src/server/svr_func.c
    #: set_srv_pwr_prov_attribute).
    calendar_sleep = 600.0

    def __init__(self, config: HookConfig, freq: float = OPENPBS_FREQ,
                 max_concurrent: int = OPENPBS_MAX_CONCURRENT):
        self.cfg = config
        self.cycle = float(freq)
        self.max_concurrent = int(max_concurrent)
        self.sleep_mode = config.mode == MODE_RAMP_RATE

    def attach(self, engine) -> None:
        super().attach(engine)
        engine.every(self.cycle, engine.submit[0] if engine.submit else 0.0)

    def on_cycle(self, now: float) -> None:
        engine, cfg = self.engine, self.cfg
        for node in engine.nodes:                  # the MoM is back: clear sleep
            if node.marked and node.state == IDLE:
                engine.mark(node, False)
        needed_by: Dict[int, float] = {}
        for _j, start, nodes in engine.estimates(now):
            for node in nodes:
                if start < needed_by.get(node.idx, INF):
                    needed_by[node.idx] = start
        offs, ons = [], []
        for node in engine.nodes:
            if len(offs) >= self.max_concurrent and len(ons) >= self.max_concurrent:
                break
            if node.state == IDLE and not node.marked:
                if (len(offs) < self.max_concurrent and node.job is None
                        and node.name not in cfg.excluded_hosts
                        and now - node.idle_since > cfg.node_idle_limit):
                    offs.append(node)
            elif (len(ons) < self.max_concurrent and node.state == DOWN and not node.failed
                  and needed_by.get(node.idx, INF) < now + OPENPBS_BOOT
                  and now - node.changed >= cfg.min_node_down_delay):
                ons.append(node)
        for node in offs:
            engine.mark(node, True)
            engine.power_down(node, now)
        for node in ons:
            engine.power_up(node, now)


class SimBackend(PowerBackend):
    """A power backend whose hosts are the engine's simulated nodes."""

    name = "simulator"

    def __init__(self, engine, by_name: Dict[str, Node]):
        self.engine = engine
        self.by_name = by_name

    def request(self, kind: TransitionKind, hosts: Sequence[str], now: float):
        go = self.engine.power_down if kind.is_down else self.engine.power_up
        out = {}
        for host in hosts:
            ok = go(self.by_name[host], now)
            out[host] = Result(ok, "" if ok else "node not in a state for %s" % kind.value)
        return out

    def status(self, hosts: Sequence[str], now: float):
        """As a BMC reports it: a booting node is on ``power_on_seconds`` after
        its command (`powered_on_at`), long before its system is up."""
        down = PowerState.ASLEEP if self.engine.sleep_mode else PowerState.OFF
        out = {}
        for host in hosts:
            node = self.by_name[host]
            s = node.state
            if s == BOOTING:
                state = (PowerState.ON if now >= self.powered_on_at(node)
                         else PowerState.TRANSITIONING)
            else:
                state = (down if s == DOWN else PowerState.TRANSITIONING
                         if s == SHUTTING else PowerState.ON)
            out[host] = HostPower(state)
        return out

    def powered_on_at(self, node: Node) -> float:
        """When the BMC of a booting ``node`` reports it on."""
        return node.changed + self.engine.model.power_on_seconds


_DOWN_ASLEEP = frozenset({"down", "sleep"})
_DOWN = frozenset({"down"})
_ASLEEP = frozenset({"sleep"})
_BUSY = frozenset({"job-exclusive"})
_FREE = frozenset({"free"})


class PbsPower(Manager):
    """Our own hook's cycle, fed the snapshot a PBS server would show.

    A cycle that provably changes nothing is skipped (``skip_quiet``): after
    a run that started, held back and marked nothing, with nothing in
    flight but power commands waiting for their nodes, the runs that follow
    see the same snapshot until the cluster changes, and the planner's
    answer can only change once some host's idle time reaches
    node_idle_limit, a rest ends, a job's start comes within the longest
    boot plus one cycle (`quiet_until`) or a command in flight times out.
    After any run that held nothing back, and as long as no node changes
    power state, the runs are also skipped while every command in flight
    only waits for its node, no idle host is past node_idle_limit (so none
    could go down) and the forecast puts every sleeping node it names far
    enough ahead (`_quiet_after_jobs`), whatever jobs arrived, started or
    ended.
    """

    name = "pbs-power"
    #: ``pbs-power pbs install`` turns the server's power_provisioning on, so
    #: the calendar has sleeping vnodes up at now + 600 s; the hook keeps a
    #: booting host's sleep mark until its MoM registers.
    calendar_sleep = 600.0

    def __init__(self, config: HookConfig, cycle: float, log=None, skip_quiet: bool = True,
                 prune: bool = True, forecast: bool = False):
        self.cfg = config
        #: ``forecast``: the what-if fed the simulator's own EASY calendar
        #: instead of the hook's forecast from what PBS shows
        self.forecast = forecast
        if forecast:
            self.name = "pbs-power-forecast"
        self.cycle = float(cycle)
        self.sleep_mode = config.mode == MODE_RAMP_RATE
        self.store = MemoryStore()
        self.log = log or (lambda level, message: None)
        self._vnodes: Dict[int, tuple] = {}
        self.skip_quiet = skip_quiet
        self.prune = prune
        self._quiet: Optional[tuple] = None     # (engine versions, until)
        self._last_run = 0.0
        self.runs = self.skipped = 0

    def attach(self, engine) -> None:
        super().attach(engine)
        self.by_name = {n.name: n for n in engine.nodes}
        self.runner = Cycle(self.cfg, self.store, SimBackend(engine, self.by_name), self.log,
                            journaled=False)   # a replay needs no status or metrics
        self.view = HookView(engine)
        engine.every(self.cycle, engine.submit[0] if engine.submit else 0.0)

    def queued(self, now: float) -> List[Tuple[int, float, List[Node]]]:
        """The queued jobs' starts and nodes as the hook forecasts them from what
        PBS shows (or, for the what-if, the simulator's calendar)."""
        if self.forecast:
            return self.engine.estimates(now, "calendar")
        waking = [t.host for t in self.store.transitions() if not t.kind.is_down]
        return self.view.forecast(now, waking, self.store.measured(up_kind(self.cfg)),
                                  self.store.measured_version)

    def on_cycle(self, now: float) -> None:
        engine, by_name = self.engine, self.by_name
        if self._quiet is not None:
            if now < self._still_quiet_until(now):
                self.skipped += 1
                return
            self._quiet = None
        self.runs += 1
        self._last_run = now
        report = self.runner.run(self.snapshot(now), now)
        for mark in report.marks:
            node = by_name[mark.host]
            if mark.offline:
                engine.fail(node, now)
            if mark.sleep is not None:
                engine.mark(node, mark.sleep)
        if self.skip_quiet and report.ran and not report.plan.deferred:
            waiting = self._waiting_until(now)
            if waiting <= now:
                return
            if not report.marks and not report.plan.actions:
                self._quiet = (engine.version, engine.power_version,
                               min(waiting, self.quiet_until(now)), waiting)
            else:
                # It acted: the next cycle runs unless what it left is quiet.
                self._quiet = (None, engine.power_version, float("-inf"), waiting)

    def idle_until(self, now: float) -> float:
        quiet = self._quiet
        if not self.skip_quiet or quiet is None or quiet[0] != self.engine.version:
            return now
        return quiet[2]

    def _waiting_until(self, now: float) -> float:
        """Until when every transition in flight only waits for its node (inf: none).

        A power command whose node the backend does not yet report done, and
        a boot the backend reports on but the scheduler still shows down, are
        left waiting by the next runs (`states.transitions`) until the node
        changes power state (the engine's power version moves), its BMC
        reports it on, or it times out. Anything else in flight (a drain, a
        sleep mark still to clear): now.
        """
        transitions = self.store.transitions()
        if not transitions:
            return float("inf")
        backend = self.runner.backend
        statuses = backend.status([t.host for t in transitions], now)
        until = float("inf")
        for t in transitions:
            state = statuses[t.host].state
            node = self.by_name[t.host]
            if t.phase is Phase.POWERING_UP and state is not PowerState.ON:
                until = min(until, t.started + self.cfg.boot_timeout)
                if node.state == BOOTING:        # its BMC reports it on then
                    until = min(until, backend.powered_on_at(node))
            elif (t.phase is Phase.BOOTING and node.state == BOOTING
                  and not node.failed):          # the scheduler shows it down until up
                until = min(until, t.started + self.cfg.boot_timeout)
            elif t.phase is Phase.POWERING_DOWN and state is not (
                    PowerState.ASLEEP if t.kind is TransitionKind.SLEEP else PowerState.OFF):
                until = min(until, t.phase_since + self.cfg.shutdown_timeout)
            else:
                return now
        return until

    def _still_quiet_until(self, now: float) -> float:
        """Until when the last run's answer holds, given what changed since.

        Jobs that only started or ended on nodes that were up, after a run
        that did nothing, with nothing queued now and no warm pool to keep,
        change nothing the planner acts on but the idle hosts; a host idle
        since then reaches node_idle_limit no sooner than that long after
        the last run. Otherwise, see `_quiet_after_jobs`.
        """
        engine = self.engine
        version, power_version, until, waiting = self._quiet
        if version == engine.version:
            return until
        if (power_version != engine.power_version or self.cfg.min_idle_nodes
                or self.store.failed()):
            return float("-inf")
        if version is None or engine.queue or self.store.transitions():
            until = self._quiet_after_jobs(now, waiting)
        else:
            until = min(until, self._last_run + self.cfg.node_idle_limit)
        self._quiet = (engine.version, power_version, until, waiting)
        return until

    def _quiet_after_jobs(self, now: float, waiting: float) -> float:
        """Until when a run would do nothing, with no node changed in power
        state since the last run (whatever that run did, and whatever jobs
        arrived, started or ended since).

        The commands in flight still only wait for their nodes (until
        ``waiting``). No host can go down while none idle is past
        node_idle_limit, and no sleeping host comes up before the forecast's
        starts come within reach (`quiet_until`); with a host past the limit
        the planner must weigh the needs: -inf.
        """
        return min(waiting, self.quiet_until(now, none_past_limit=True))

    def quiet_until(self, now: float, none_past_limit: bool = False) -> float:
        """The first moment the planner could act on an unchanged cluster.

        Conservative: an idle host reaching node_idle_limit, or the earliest
        wake any of a job's sleeping nodes could need (with the boot the
        planner reckons for it). A sleeping node already in
        flight is left out: the planner does not act on it until its command
        ends, which changes its power state or times out (`_waiting_until`).
        A job that names only awake nodes can only keep idle hosts up,
        and a rest that ends can only release a wake the planner wanted and
        held back, which a quiet run did not: both count only for the warm
        pool (a queued job entering the planner's horizon, a rest ending).
        ``none_past_limit``: -inf if an idle host is past node_idle_limit.
        """
        cfg, store, until = self.cfg, self.store, float("inf")
        for node in map(self.engine.nodes.__getitem__, self.engine.state_index()[IDLE]):
            if (node.state == IDLE and not node.marked and node.job is None
                    and not node.failed and node.name not in cfg.excluded_hosts):
                t = max(node.idle_since, node.changed) + cfg.node_idle_limit
                if t > now:
                    until = min(until, t)
                elif none_past_limit:
                    return float("-inf")
        pool = cfg.min_idle_nodes > 0
        if pool:
            for since in store.down_since().values():
                if since + cfg.min_node_down_delay > now:
                    until = min(until, since + cfg.min_node_down_delay)
        longest = longest_lead(cfg, boot_times(store))
        horizon = 2 * longest + cfg.min_node_down_delay + 2 * cfg.cycle_interval
        queued = self.queued(now)
        if not self.forecast:                   # the forecast may change with time alone
            until = min(until, max(self.view.valid_until(), now))
        in_flight = {t.host for t in store.transitions()}
        leads = Snapshot((), boot_times=boot_times(store))
        for _j, start, nodes in queued:
            if pool and start - horizon > now:
                until = min(until, start - horizon)
            elif start - longest - 2 * cfg.cycle_interval < until:
                lead = self._slowest_sleeper(nodes, in_flight, leads, longest)
                if lead is not None:
                    until = min(until, start - lead - 2 * cfg.cycle_interval)
        return until

    def _slowest_sleeper(self, nodes: Sequence[Node], in_flight, leads: Snapshot,
                         longest: float) -> Optional[float]:
        """The longest boot, as the planner reckons it (`planner.lead_time`), of
        ``nodes``' sleeping ones not in flight: the planner wakes each that long,
        plus a cycle, before the job's start (None: no such node)."""
        slowest, kind = None, up_kind(self.cfg)
        for n in nodes:
            if n.name not in in_flight and (n.marked or n.state in (DOWN, SHUTTING, BOOTING)):
                lead = lead_time(leads, self.cfg, n.name, kind)
                if lead >= longest:
                    return longest
                if slowest is None or lead > slowest:
                    slowest = lead
        return slowest

    def snapshot(self, now: float) -> Snapshot:
        """Vnodes the planner can act on, and the calendar.

        Hosts that cannot change the plan are left out (``prune``): busy
        ones; and, with no warm pool to count, idle ones short of
        node_idle_limit and powered-down ones no queued job's nodes name.
        Hosts in flight or failed are always in.
        """
        in_flight = {t.host for t in self.store.transitions()}
        estimates = self.queued(now)
        jobs = tuple(QueuedJob(self.engine.job_ids[j], start, tuple(n.name for n in nodes))
                     for j, start, nodes in estimates)
        flying = [self.by_name[h].idx for h in in_flight]
        if not self.prune or self.cfg.min_idle_nodes:
            vnodes = [self._vnode(n) for n in self.engine.nodes_except((BUSY, HELD), flying)
                      if n.state not in (BUSY, HELD) or n.name in in_flight]
            return Snapshot(tuple(vnodes), jobs)
        named = {n.idx for _j, _start, nodes in estimates for n in nodes}
        limit = self.cfg.node_idle_limit
        vnodes = []
        for n in self.engine.nodes_except((BUSY, HELD, DOWN), named.union(flying)):
            if n.name not in in_flight and not n.failed:
                state = n.state
                if state in (BUSY, HELD) or (state == DOWN and n.idx not in named):
                    continue
                if (state == IDLE and not n.marked
                        and now - max(n.idle_since, n.changed) < limit):
                    continue
            vnodes.append(self._vnode(n))
        return Snapshot(tuple(vnodes), jobs)

    def _vnode(self, node: Node) -> Vnode:
        key = (node.state, node.marked, node.failed, node.idle_since, node.changed, node.job)
        cached = self._vnodes.get(node.idx)
        if cached is not None and cached[0] == key:
            return cached[1]
        if node.failed:
            states = frozenset({"offline"})
        elif node.state in (DOWN, BOOTING):       # its MoM is gone: pbs_server shows it down
            states = _DOWN_ASLEEP if node.marked else _DOWN
        elif node.marked or node.state == SHUTTING:
            states = _ASLEEP
        else:
            states = _BUSY if node.state in (BUSY, HELD) else _FREE
        jobs = (self.engine.job_ids[node.job],) if node.job is not None else ()
        vnode = Vnode(node.name, node.name, states, poweroff_eligible=True,
                      last_used_time=node.idle_since, last_state_change_time=node.changed,
                      jobs=jobs)
        self._vnodes[node.idx] = (key, vnode)
        return vnode


def build(name: str, config: HookConfig, cycle: float, log=None) -> Manager:
    """The manager called ``name`` (one of MANAGERS)."""
    if name == "always-on":
        return AlwaysOn()
    if name == "pbs-power":
        return PbsPower(config, cycle, log)
    if name == "pbs-power-forecast":
        return PbsPower(config, cycle, log, forecast=True)
    if name == "slurm":
        return SlurmPowerSave(config)
    if name == "openpbs":
        return OpenPBSPower(config)
    raise ValueError("unknown manager %r (known: %s)" % (name, ", ".join(MANAGERS)))
