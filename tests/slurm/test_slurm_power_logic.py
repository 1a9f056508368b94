"""Suspend/Resume/ResumeFail logic with the SIMULATED power backend, a stand-in for Slurm's
view and a fake clock: limits across runs, ramp windows, deadlines, power cycles.
(The same programs run under a real slurmctld in test_slurm_power.py.)"""
from __future__ import annotations

import json
import logging

import pytest

from pbs_power.config.hook_config import parse_config
from pbs_power.devices import get_backend
from pbs_power.states.model import PowerState, TransitionKind
from pbs_power.slurm.adapter import SlurmClient, SlurmNode, SlurmPowerConfig, SlurmView
from pbs_power.slurm.power import (PowerRun, admit, failed_hosts_back, forget_stale,
                                   jobs_by_host, resume, resume_fail, suspend)
from pbs_power.states.store import Store

T0 = 1_800_000_000.0
BOOT = 20.0          # simulated power-on time
REGISTER = 3.0       # then slurmd registers


class Clock:
    def __init__(self, t: float = T0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class FakeSlurm(SlurmClient):
    """Slurm's view of the simulated fleet: a node is usable REGISTER s after it is on."""

    name = "fake"

    def __init__(self, backend, clock, resume_timeout=60):
        self.backend, self.clock, self.resume_timeout = backend, clock, resume_timeout
        self.updates = []

    def nodes(self):
        out = []
        for host in ("n1", "n2", "n3", "n4"):
            power = self.backend.status([host], self.clock())[host]
            up = power.state is PowerState.ON and \
                (power.since is None or self.clock() - power.since >= REGISTER)
            out.append(SlurmNode(host, "IDLE", frozenset() if up else {"POWERING_UP"}))
        return out

    def jobs(self):
        return []

    def reservations(self):
        return []

    def power_config(self):
        return SlurmPowerConfig(resume_timeout=self.resume_timeout, suspend_timeout=30)

    def update_nodes(self, nodes, state, reason=""):
        self.updates.append((tuple(nodes), state, reason))


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append((record.levelname, record.getMessage()))


@pytest.fixture
def env(tmp_path):
    def make(**extra):
        doc = {"power_on_off_enable": True, "max_concurrent_nodes": 2, "node_boot_time": 30,
               "boot_timeout": 120, "shutdown_timeout": 60, "state_dir": str(tmp_path),
               "power_backend": {"type": "simulated", "boot_seconds": BOOT,
                                 "shutdown_seconds": 5}}
        doc.update(extra)
        config = parse_config(doc)
        clock = Clock()
        backend = get_backend(config.power_backend, config.state_dir)
        # every node starts powered off
        backend.request(TransitionKind.POWER_OFF, ["n1", "n2", "n3", "n4"], T0 - 1000)
        store = Store.open(config.state_dir)
        log = logging.getLogger("test.slurm_power.%d" % id(clock))
        log.setLevel(logging.DEBUG)
        lines = Lines()
        log.addHandler(lines)
        run = PowerRun(config, store, backend, FakeSlurm(backend, clock), log, clock=clock,
                       sleep=clock.sleep, poll_interval=1.0)
        run.lines = lines.lines
        made.append(run)
        return run
    made = []
    yield make
    for run in made:
        run.store.close()
        run.backend.close()


def peak_in_flight(messages, kind="power_on") -> int:
    """Most hosts holding a slot at once: from "sent" until the backend reports the host
    on ("waiting for slurmd": it holds no slot any more, as in the planner) or done."""
    holding, peak = set(), 0
    for m in messages:
        host = m.split(":")[0]
        if ": %s sent" % kind in m:
            holding.add(host)
        elif ": %s done in" % kind in m or "backend reports it on; waiting" in m:
            holding.discard(host)
        peak = max(peak, len(holding))
    return peak


def test_resume_keeps_max_concurrent_and_measures_boot_times(env):
    run = env()
    assert resume(run, ["n1", "n2", "n3"]) == 0
    messages = [m for _, m in run.lines]
    assert sum(": power_on sent" in m for m in messages) == 3
    assert peak_in_flight(messages) == 2
    assert ("INFO", "n3: power_on held back: max_concurrent_nodes=2 hosts already in "
                    "transition") in run.lines
    assert run.store.transitions() == ()
    for host in ("n1", "n2", "n3"):
        (seconds,) = run.store.durations(host, "power_on")
        assert BOOT + REGISTER <= seconds <= BOOT + REGISTER + 2   # polled every second
    assert run.clock() >= T0 + 2 * BOOT                          # n3 waited for a slot


def test_two_runs_share_the_slots(env):
    a, b = env(), env()
    kinds = {h: TransitionKind.POWER_ON for h in ("n1", "n2", "n3")}
    reasons = {h: "test" for h in kinds}
    assert admit(a, ["n1", "n2"], kinds, reasons) == (["n1", "n2"], {})
    admitted, held = admit(b, ["n3"], kinds, reasons)
    assert admitted == [] and "max_concurrent_nodes=2" in held["n3"]


def test_ramp_limit_spreads_power_ons_over_minutes(env):
    run = env(max_concurrent_nodes=10, max_ramp_watts_per_minute=500,
              node_power={"busy_watts": 400, "idle_watts": 250, "sleep_watts": 50,
                          "off_watts": 10})
    run.client.resume_timeout = 200
    assert resume(run, ["n1", "n2", "n3"]) == 0         # 240 W each: two per minute
    held = [m for _, m in run.lines if "held back: max_ramp_watts_per_minute=500" in m]
    assert held == ["n3: power_on held back: max_ramp_watts_per_minute=500 would be exceeded"]
    steps = run.store.recent_steps(T0)
    assert [s.host for s in steps] == ["n1", "n2", "n3"]
    assert steps[2].time - steps[0].time >= 60


def test_node_that_never_boots_is_left_to_resume_timeout(env):
    run = env(power_backend={"type": "simulated", "boot_seconds": BOOT, "fail_nodes": "n2"})
    run.client.resume_timeout = 40
    assert resume(run, ["n1", "n2"]) == 0              # nothing refused: n2 is still booting
    assert run.clock() <= T0 + 40                       # ResumeTimeout minus the margin
    assert [t.host for t in run.store.transitions()] == ["n2"]
    assert any(m == "n2: power_on still in progress at this run's deadline; left recorded"
               for _, m in run.lines)
    forget_stale(run.store, run.config, T0 + 200, run.log)
    assert run.store.transitions() == ()


def test_resume_power_cycles_a_node_that_is_still_on(env):
    run = env()
    run.backend.request(TransitionKind.POWER_ON, ["n4"], T0 - 500)   # on, e.g. suspend held back
    assert resume(run, ["n4"]) == 0
    messages = [m for _, m in run.lines]
    assert any("n4: backend reports it on although Slurm resumes it" in m for m in messages)
    assert len(run.store.durations("n4", "power_off")) == 1
    assert len(run.store.durations("n4", "power_on")) == 1
    order = [m.split(":")[1].split()[0] for m in messages if " sent" in m]
    assert order == ["power_off", "power_on"]


def test_suspend_in_disabled_mode_refuses(env):
    run = env(power_on_off_enable=False)
    assert suspend(run, ["n1"]) == 1
    assert run.store.transitions() == () and run.store.durations("n1", "power_off") == ()


def test_suspend_powers_off_and_records_down_since(env):
    run = env()
    run.backend.request(TransitionKind.POWER_ON, ["n1"], T0 - 500)
    assert suspend(run, ["n1"]) == 0
    assert run.store.down_since()["n1"] >= T0 + 5
    assert run.store.durations("n1", "power_off")[0] >= 5


def test_resume_fail_drains_and_is_forgotten_when_admin_resumes(env):
    run = env()
    assert resume_fail(run, ["n3"]) == 0
    ((nodes, state, reason),) = run.client.updates
    assert nodes == ("n3",) and state == "DRAIN"
    assert reason == "pbs_power: power_on failed: not usable in Slurm within ResumeTimeout"
    assert "n3" in run.store.failed()
    drained = SlurmView((SlurmNode("n3", "IDLE", frozenset({"DRAIN", "POWERED_DOWN"})),), ())
    assert failed_hosts_back(run.store, drained, run.log) == []
    back = SlurmView((SlurmNode("n3", "IDLE", frozenset({"POWERED_DOWN"})),), ())
    assert failed_hosts_back(run.store, back, run.log) == ["n3"] and run.store.failed() == {}


def test_resume_file_names_the_jobs(tmp_path):
    path = tmp_path / "resume.json"
    path.write_text(json.dumps({"all_nodes": "n[1-3]", "jobs": [
        {"job_id": 7, "nodes": "n[1-2]"}, {"job_id": 9, "nodes": "n2,n3"}]}))
    assert jobs_by_host(str(path), logging.getLogger("t")) == {
        "n1": "for job 7", "n2": "for job 7,9", "n3": "for job 9"}
    assert jobs_by_host(str(tmp_path / "missing.json"), logging.getLogger("t")) == {}


def test_the_programs_journal_what_they_did(env):
    """Suspend, resume and resume-fail leave what the exporter and `history` read."""
    from pbs_power.states import journal, tally
    run = env(node_power={"idle_watts": 250, "off_watts": 10})
    run.backend.request(TransitionKind.POWER_ON, ["n1"], T0 - 500)
    assert suspend(run, ["n1"]) == 0
    ((_kind, since, watts),) = journal.saving_now(run.store).values()
    assert watts == 250.0 - 10.0 and since == run.store.down_since()["n1"]
    resume_file = run.config.state_dir + "/resume.json"
    with open(resume_file, "w") as f:
        json.dump({"jobs": [{"job_id": 77, "nodes": "n1"}]}, f)
    assert resume(run, ["n1"], resume_file) == 0
    assert resume_fail(run, ["n2"]) == 0
    assert [(e.kind, e.event) for e in journal.events(run.store, "n1")] == [
        ("power_off", "started"), ("power_off", "completed"),
        ("power_on", "started"), ("power_on", "completed")]
    assert journal.events(run.store, "n2")[-1].reason.startswith("power_on failed")
    rows = journal.tallies(run.store)
    assert tally.counter(rows, "transitions_completed") == {
        (("kind", "power_off"),): 1.0, (("kind", "power_on"),): 1.0}
    assert tally.counter(rows, "transitions_failed") == {(("kind", "power_on"),): 1.0}
    assert journal.saving_now(run.store) == {}
    # job 77 waited for n1's whole boot
    (wait,) = tally.histogram(rows, "wake_wait_seconds", journal.WAIT_BUCKETS)
    assert wait.count == 1 and wait.sum == journal.events(run.store, "n1")[3].seconds > 0
    assert tally.counter(rows, "jobs_waited_for_wake") == {(): 1.0}
    (saved,) = tally.counter(rows, "energy_saved_joules").values()
    assert saved == pytest.approx(240.0 * (journal.events(run.store, "n1")[2].time - since))
