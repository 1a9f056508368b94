"""The periodic hook wakes what queued jobs need, on a stock scheduler (no estimates).

Runs hooks/PBS_power.py under the stand-in as pbs_server would, with the
simulated power backend. The default sched_config gives a job that needs
sleeping vnodes no ``estimated`` attribute at all (seen on OpenPBS 23.06), so
the jobs below have none unless a test gives one.
"""
import time

import pytest

from pbs_power.devices.simulated import SimulatedBackend
from pbs_power.states.store import Store
from pbs_standin import cluster as c

HOOK = c.REPO_ROOT / "hooks" / "PBS_power.py"
T0 = 1_800_000_000
CYCLE = 60
HOSTS = ["n1", "n2", "n3", "n4"]
BACKEND = {"type": "simulated", "boot_seconds": 100, "shutdown_seconds": 20}


@pytest.fixture
def site(tmp_path):
    """Four 4-cpu hosts idle for two hours; the hook has powered them all off."""
    c.write_hook_config(tmp_path / "pbs_power.json", {
        "power_on_off_enable": True, "node_idle_limit": 1800, "min_node_down_delay": 0,
        "max_concurrent_nodes": 4, "node_boot_time": 100, "boot_timeout": 900,
        "cycle_interval": CYCLE, "power_backend": BACKEND,
        "state_dir": str(tmp_path / "state"), "python_path": c.hook_python_path()})
    vnodes = {h: {"poweroff_eligible": True, "last_used_time": T0 - 7200,
                  "last_state_change_time": T0 - 7200,
                  "resources_available": {"ncpus": 4, "mem": "8gb"}} for h in HOSTS}
    st = c.new_state(tmp_path, tmp_path / "pbs_power.json", vnodes=vnodes, hook_freq=CYCLE)
    for i in range(3):
        cycle(st, tmp_path, T0 + i * CYCLE)
    assert powered(tmp_path, T0 + 3 * CYCLE) == {h: "off" for h in HOSTS}
    server_between_runs(st, powered(tmp_path, T0 + 3 * CYCLE))
    assert states(st) == {h: ["down", "sleep"] for h in HOSTS}
    return st


def powered(tmp_path, now):
    fleet = SimulatedBackend({k: v for k, v in BACKEND.items() if k != "type"},
                             str(tmp_path / "state"))
    try:
        return {h: s.state.value for h, s in fleet.status(HOSTS, now).items()}
    finally:
        fleet.close()


def server_between_runs(st, power, moms_down=()):
    """What pbs_server does to the vnodes as hosts lose and regain power.

    Seen on OpenPBS 23.06 with its MoM killed and restarted: a host that is
    off has its MoM unreachable, so its vnodes show ``down``, a sleeping one
    ``down,sleep``; once the host is on, its MoM registers, which clears
    down and sleep alike (src/server/node_manager.c, IS_REGISTERMOM).
    ``moms_down``: hosts on whose MoM is not back yet (a BMC reports a host
    on long before its system is up).
    """
    state = c.load_state(st)
    for name, v in state["vnodes"].items():
        now_states = set(v["state"])
        if "job-busy" in now_states:
            continue
        if power[name] != "on" or name in moms_down:
            now_states = (now_states - {"free"}) | {"down"}
        elif "down" in now_states or "sleep" not in now_states:
            now_states = {"free"}
        v["state"] = sorted(now_states)
    c.save_state(st, state)


def cycle(st, tmp_path, now, moms_down=()):
    """pbs_server between runs (`server_between_runs`), then a run."""
    server_between_runs(st, powered(tmp_path, now), moms_down)
    rec = c.run_hook(HOOK, st, now=now)
    assert rec["accepted"] and rec["exception"] is None, rec
    return rec


def states(st):
    return {n: v["state"] for n, v in c.load_state(st)["vnodes"].items()}


def queue(st, jid, select, place="free", **attrs):
    state = c.load_state(st)
    state["jobs"][jid] = c.make_job(schedselect=select, qtime=T0, Resource_List={
        "select": select, "place": place}, **attrs)
    c.save_state(st, state)


def test_a_job_needing_two_sleeping_hosts_wakes_exactly_them(site, tmp_path):
    now = T0 + 10 * CYCLE
    queue(site, "10.pbssvr", "2:ncpus=4", "scatter")
    rec = cycle(site, tmp_path, now)
    sent = [l for l in rec["log"] if "power_on sent" in l]
    assert len(sent) == 2 and all("job 10.pbssvr needs it" in l for l in sent), rec["log"]
    # The backend reports them on at the third run (boot 100 s) while their
    # MoMs are not back: their sleep mark stays, so a scheduler with
    # power_provisioning keeps the job's reservation. The MoMs register a
    # run later, which clears the marks and starts a scheduling cycle
    # (pbs_server does both), and the boots are done.
    logs = cycle(site, tmp_path, now + CYCLE)["log"]
    logs += cycle(site, tmp_path, now + 2 * CYCLE, moms_down=("n1", "n2"))["log"]
    assert sum("sleep mark kept until its MoM is back" in l for l in logs) == 2, logs
    assert states(site)["n1"] == ["down", "sleep"]
    logs += cycle(site, tmp_path, now + 3 * CYCLE)["log"]
    assert sorted(h for h, s in states(site).items() if s == ["free"]) == ["n1", "n2"]
    assert sum("power_on done" in l for l in logs) == 2, logs
    # The registration started no scheduling cycle: the hook asks for one.
    assert "pbs_power: hosts up (n1, n2): scheduling cycle requested" in logs[-1], logs
    assert all(line.split(";", 2)[2].startswith("pbs_power: ") for line in logs)


def test_a_job_wakes_the_hosts_measured_to_boot_fastest(site, tmp_path):
    # Boots measured on earlier wakes: n3 and n4 come up in half the time of
    # n1 and n2, so a two-host job waits least on them.
    with Store.open(str(tmp_path / "state")) as store:
        for host, seconds in (("n1", 240), ("n2", 200), ("n3", 110), ("n4", 100)):
            store.record_duration(host, "power_on", T0 - 3600, seconds)
    queue(site, "10.pbssvr", "2:ncpus=4", "scatter")
    rec = cycle(site, tmp_path, T0 + 10 * CYCLE)
    sent = sorted(l.split("pbs_power: ", 1)[1].split(":")[0] for l in rec["log"]
                  if "power_on sent" in l)
    assert sent == ["n3", "n4"], rec["log"]


def test_a_run_that_changes_marks_asks_for_a_scheduling_cycle(tmp_path):
    c.write_hook_config(tmp_path / "pbs_power.json", {
        "power_on_off_enable": True, "node_idle_limit": 1800, "min_node_down_delay": 0,
        "cycle_interval": CYCLE, "power_backend": BACKEND,
        "state_dir": str(tmp_path / "state"), "python_path": c.hook_python_path()})
    st = c.new_state(tmp_path, tmp_path / "pbs_power.json", hook_freq=CYCLE, vnodes={
        "n1": {"poweroff_eligible": True, "last_used_time": T0 - 7200,
               "last_state_change_time": T0 - 7200}})
    rec = c.run_hook(HOOK, st, now=T0)                # drained: marked sleep
    assert any("scheduling cycle requested" in l for l in rec["log"]), rec["log"]
    deadline = time.time() + 15                 # the detached request comes a few s later
    while not c.qmgr_calls(st) and time.time() < deadline:
        time.sleep(0.5)
    assert [call["argv"] for call in c.qmgr_calls(st)][-1] == [
        "-c", "set server scheduling = True"]


def test_jobs_that_fit_each_other_wake_only_what_they_need(site, tmp_path):
    for jid in ("11.pbssvr", "12.pbssvr", "13.pbssvr"):
        queue(site, jid, "1:ncpus=2")                  # three 2-cpu jobs: two hosts
    rec = cycle(site, tmp_path, T0 + 10 * CYCLE)
    assert sum("power_on sent" in l for l in rec["log"]) == 2


def test_an_estimate_on_sleeping_vnodes_inside_the_provisioning_window_is_now(site, tmp_path):
    now = T0 + 10 * CYCLE
    queue(site, "14.pbssvr", "1:ncpus=64", start_time=now + 600,
          exec_vnode="(n3:ncpus=4)")                  # the fit cannot place it; PBS did
    rec = cycle(site, tmp_path, now)
    assert any(l.endswith("n3: power_on sent: job 14.pbssvr needs it at %s; boot takes ~100s"
                          % time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)))
               for l in rec["log"]), rec["log"]


def test_no_wake_for_a_job_that_cannot_run_even_with_every_host(site, tmp_path):
    queue(site, "15.pbssvr", "5:ncpus=4", "scatter")
    rec = cycle(site, tmp_path, T0 + 10 * CYCLE)
    assert not any("power_on sent" in l for l in rec["log"])


def test_sleep_marks_are_back_one_cycle_after_a_server_restart(site, tmp_path):
    c.restart_server(site, moms_gone=HOSTS)       # the hosts are off: no MoM registers
    assert states(site) == {h: ["down", "state-unknown"] for h in HOSTS}
    rec = c.run_hook(HOOK, site, now=T0 + 5 * CYCLE)
    assert {h: sorted(s) for h, s in states(site).items()} == {
        h: ["down", "sleep", "state-unknown"] for h in HOSTS}
    assert sum("sleep mark lost" in l for l in rec["log"]) == 4
    with Store.open(str(tmp_path / "state")) as store:
        assert set(store.down_since()) == set(HOSTS)
    # ... and they are still woken for work: a job needing one host.
    queue(site, "16.pbssvr", "1:ncpus=4")
    rec = c.run_hook(HOOK, site, now=T0 + 6 * CYCLE)
    assert sum("power_on sent: job 16.pbssvr" in l for l in rec["log"]) == 1, rec["log"]


def test_a_host_booting_through_a_server_restart_is_marked_again(site, tmp_path):
    now = T0 + 10 * CYCLE
    queue(site, "17.pbssvr", "1:ncpus=4")
    assert sum("power_on sent" in l for l in cycle(site, tmp_path, now)["log"]) == 1
    woken = sorted(h for h, s in states(site).items() if "sleep" in s and
                   powered(tmp_path, now + CYCLE)[h] == "transitioning")
    assert len(woken) == 1
    c.restart_server(site, moms_gone=HOSTS)          # all off or booting: no MoM back
    rec = cycle(site, tmp_path, now + CYCLE)
    assert any("%s: power_on: sleep mark lost while it comes up" % woken[0] in l
               for l in rec["log"]), rec["log"]
    assert sorted(states(site)[woken[0]]) == ["down", "sleep", "state-unknown"]


def test_sleep_marks_are_back_after_a_restart_while_moms_still_answer(site, tmp_path):
    c.restart_server(site)          # a site script that cuts power but leaves MoMs up
    assert states(site) == {h: ["free"] for h in HOSTS}
    rec = c.run_hook(HOOK, site, now=T0 + 5 * CYCLE)
    assert states(site) == {h: ["sleep"] for h in HOSTS}
    assert sum("sleep mark lost" in l for l in rec["log"]) == 4


def test_a_power_off_that_completes_after_a_restart_is_marked_again_at_once(tmp_path):
    c.write_hook_config(tmp_path / "pbs_power.json", {
        "power_on_off_enable": True, "node_idle_limit": 1800, "min_node_down_delay": 0,
        "max_concurrent_nodes": 4, "cycle_interval": CYCLE, "power_backend": BACKEND,
        "state_dir": str(tmp_path / "state"), "python_path": c.hook_python_path()})
    st = c.new_state(tmp_path, tmp_path / "pbs_power.json", hook_freq=CYCLE, vnodes={
        "n1": {"poweroff_eligible": True, "last_used_time": T0 - 7200,
               "last_state_change_time": T0 - 7200}})
    c.run_hook(HOOK, st, now=T0)                      # drained
    c.run_hook(HOOK, st, now=T0 + CYCLE)              # power_off sent
    c.restart_server(st)                              # the mark is lost while it powers off
    rec = c.run_hook(HOOK, st, now=T0 + 2 * CYCLE)    # backend reports it off
    assert any("n1: power_off done" in l for l in rec["log"])
    assert states(st)["n1"] == ["sleep"]
