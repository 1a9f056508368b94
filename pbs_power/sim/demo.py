"""`pbs-power demo`: the periodic logic over a SIMULATED cluster for a day.

The same synthetic job stream runs twice on a simulated 64-host cluster:
once with every host always on (the baseline), once with the power manager
driving the simulated power backend through the same `Cycle` the PBS hook
uses, with a real SQLite store. Each cycle prints what was done; the last
line compares energy and job waits with the baseline.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional

from pbs_power.config.hook_config import BackendConfig, HookConfig, NodePower
from pbs_power.states.cycle import Cycle
from ..devices import get_backend
from pbs_power.states.store import Store
from .cluster import SimCluster
from .workload import SimJob, synthetic_day

#: Monday 2026-01-05 00:00 UTC: the simulated clock starts here.
EPOCH = 1767571200.0
CPU_NODE = NodePower(busy_watts=450.0, idle_watts=250.0, sleep_watts=90.0, off_watts=10.0)


def demo_config(state_dir: str, seed: int) -> HookConfig:
    """The embedded default the demo runs: power on/off, simulated backend."""
    return HookConfig(
        power_on_off_enable=True, node_idle_limit=1800, min_node_down_delay=1800,
        max_concurrent_nodes=32, node_boot_time=900, boot_timeout=1800,
        cycle_interval=300, min_idle_nodes=6, node_power=CPU_NODE,
        max_ramp_watts_per_minute=4000.0,
        power_backend=BackendConfig("simulated", {
            "boot_seconds": 300, "boot_jitter_seconds": 120, "shutdown_seconds": 60,
            "seed": seed}),
        state_dir=state_dir)


@dataclass
class RunResult:
    """One run of the day: energy, jobs and power cycles."""

    kwh: float
    jobs: List[SimJob]
    power_cycles: int = 0
    failed: int = 0


def run_day(jobs: List[SimJob], hosts: List[str], hours: float, config: Optional[HookConfig],
            step: float = 60.0, out: Callable[[str], None] = lambda s: None,
            verbose: bool = False) -> RunResult:
    """Simulate ``hours`` of ``jobs``; with ``config`` the power manager runs too."""
    jobs = [replace(j) for j in jobs]
    pending = sorted(jobs, key=lambda j: j.submit)
    backend = store = cycle = None
    if config is not None:
        backend = get_backend(config.power_backend, config.state_dir)
        store = Store.open(config.state_dir)
        cycle = Cycle(config, store, backend, _logger(out, verbose))
    cluster = SimCluster(hosts, config.node_power if config else CPU_NODE, backend, EPOCH)
    now, end, next_cycle, cycles, failed = EPOCH, EPOCH + hours * 3600, EPOCH, 0, 0
    try:
        while now < end:
            arrivals = []
            while pending and pending[0].submit <= now:
                arrivals.append(pending.pop(0))
            cluster.step(now, arrivals)
            if cycle is not None and now >= next_cycle:
                report = cycle.run(cluster.snapshot(now), now)
                cluster.apply(report.marks, now)
                cluster.step(now, [])
                cycles += sum(1 for t in report.started if t.kind.is_down)
                failed += len(report.failed)
                out(_cycle_line(now, cluster, report, store.transitions()))
                next_cycle = now + config.cycle_interval
            cluster.account(step)
            now += step
    finally:
        if store is not None:
            store.close()
        if backend is not None:
            backend.close()
    return RunResult(cluster.energy.kwh, jobs, cycles, failed)


def run_demo(hosts: int = 64, hours: float = 24.0, seed: int = 1,
             out: Callable[[str], None] = print, verbose: bool = False,
             config: Optional[HookConfig] = None) -> Dict[str, float]:
    """Run baseline and managed days, print per-cycle lines and a summary.

    ``config`` (an admin's hook config) replaces the demo's limits; its
    backend and state_dir are always replaced by the simulated fleet and a
    temporary directory, so a demo never touches real hosts or state.
    """
    names = ["n%03d" % (i + 1) for i in range(hosts)]
    jobs = synthetic_day(hosts, seed=seed, hours=hours, start=EPOCH)
    out("pbs-power demo: SIMULATED cluster of %d hosts, %d synthetic jobs over %g h "
        "(seed %d)" % (hosts, len(jobs), hours, seed))
    baseline = run_day(jobs, names, hours, None)
    with tempfile.TemporaryDirectory(prefix="pbs-power-demo-") as state_dir:
        managed_config = demo_config(state_dir, seed)
        if config is not None:
            managed_config = replace(config, state_dir=state_dir,
                                     power_backend=managed_config.power_backend,
                                     node_power=config.node_power or CPU_NODE)
        ramp = managed_config.max_ramp_watts_per_minute
        out("config: mode %s, node_idle_limit %ds, max_concurrent_nodes %d, "
            "max_ramp_watts_per_minute %s, min_idle_nodes %d, cycle %ds" % (
                managed_config.mode, managed_config.node_idle_limit,
                managed_config.max_concurrent_nodes, "none" if ramp is None else "%g" % ramp,
                managed_config.min_idle_nodes, managed_config.cycle_interval))
        managed = run_day(jobs, names, hours, managed_config, out=out, verbose=verbose)
    summary = summarize(baseline, managed)
    out(summary_line(summary))
    return summary


def summarize(baseline: RunResult, managed: RunResult) -> Dict[str, float]:
    """Energy saved and added waits of the managed run against the baseline."""
    base = {j.id: j for j in baseline.jobs}
    added = [j.wait - base[j.id].wait for j in managed.jobs
             if j.wait is not None and base[j.id].wait is not None]
    added_sorted = sorted(added) or [0.0]
    return {
        "kwh": managed.kwh, "baseline_kwh": baseline.kwh,
        "saved_pct": 100.0 * (1 - managed.kwh / baseline.kwh) if baseline.kwh else 0.0,
        "jobs": len(managed.jobs),
        "started": sum(1 for j in managed.jobs if j.start is not None),
        "delayed": sum(1 for a in added if a > 0),
        "added_wait_mean": statistics.mean(added) if added else 0.0,
        "added_wait_p95": added_sorted[int(0.95 * (len(added_sorted) - 1))],
        "added_wait_max": max(added_sorted),
        "power_downs": managed.power_cycles, "failed": managed.failed,
    }


def summary_line(s: Dict[str, float]) -> str:
    return ("energy: %.1f kWh vs %.1f kWh always-on (%.1f%% saved); jobs started %d/%d; "
            "delayed by power: %d; added wait mean %.0f s, p95 %.0f s, max %.0f s; "
            "power-downs: %d; failed transitions: %d" % (
                s["kwh"], s["baseline_kwh"], s["saved_pct"], s["started"], s["jobs"],
                s["delayed"], s["added_wait_mean"], s["added_wait_p95"], s["added_wait_max"],
                s["power_downs"], s["failed"]))


def _cycle_line(now: float, cluster: SimCluster, report, in_flight) -> str:
    """One cycle: hosts by state (coming up and going down apart), queue, what started."""
    started: Dict[str, int] = {}
    for t in report.started:
        started[t.kind.value] = started.get(t.kind.value, 0) + 1
    done = ", ".join("%s %d" % kv for kv in sorted(started.items())) or "no change"
    counts = cluster.counts(t.host for t in in_flight if t.kind.is_down)
    return ("%s  busy %2d idle %2d asleep/off %2d booting %2d shutting down %2d | queued %3d "
            "| started: %s%s" % (
                time.strftime("%H:%M", time.gmtime(now)), counts.get("busy", 0),
                counts.get("idle", 0), counts.get("asleep", 0) + counts.get("off", 0),
                counts.get("booting", 0), counts.get("shutting down", 0), len(cluster.queue), done,
                "; held back %d (limits above)" % len(report.plan.deferred)
                if report.plan.deferred else ""))


def _logger(out: Callable[[str], None], verbose: bool):
    def log(level: str, message: str) -> None:
        if verbose or level in ("warning", "error"):
            out("    %s: %s" % (level, message))
    return log
