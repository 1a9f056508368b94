"""The transition state machine: drain, command, boot, complete or time out."""
from collections import namedtuple

from pbs_power.config.hook_config import HookConfig
from pbs_power.states.model import (Phase, PowerState, Snapshot, Transition,
                             TransitionKind as K, Vnode)
from pbs_power.states.transitions import apply_marks, reconcile

NOW = 1_700_000_000.0
Status = namedtuple("Status", "state since")
CFG = HookConfig(power_on_off_enable=True, boot_timeout=1800, shutdown_timeout=600,
                 cycle_interval=300)


def v(name, *states, jobs=(), lsct=None):
    return Vnode(name, name, frozenset(states or {"free"}), True, NOW - 5000, lsct, jobs)


def t(host, kind, phase, started=NOW - 300, since=None):
    return Transition(host, kind, phase, started, since if since is not None else started)


def bucket(rec, host):
    for name in rec.__dataclass_fields__:
        if any(o.transition.host == host for o in getattr(rec, name)):
            return name
    return None


def test_drained_host_is_sent_down_only_when_scheduler_shows_it_asleep():
    snap = Snapshot((v("a", "sleep"), v("b", "free")),
                    transitions=(t("a", K.POWER_OFF, Phase.DRAINING),
                                 t("b", K.POWER_OFF, Phase.DRAINING)))
    rec = reconcile(snap, {}, CFG, NOW)
    assert bucket(rec, "a") == "send_down"
    assert bucket(rec, "b") == "remark_sleep"


def test_job_that_landed_while_draining_cancels_the_power_off():
    snap = Snapshot((v("a", "sleep", "job-busy", jobs=("7.s",)),),
                    transitions=(t("a", K.POWER_OFF, Phase.DRAINING),))
    rec = reconcile(snap, {}, CFG, NOW)
    assert bucket(rec, "a") == "cancelled" and "job 7.s landed" in rec.cancelled[0].reason


def test_drain_gives_up_when_the_sleep_mark_never_shows():
    snap = Snapshot((v("a"),), transitions=(t("a", K.POWER_OFF, Phase.DRAINING,
                                                started=NOW - 1000),))
    rec = reconcile(snap, {}, CFG, NOW)
    assert bucket(rec, "a") == "cancelled" and "never" in rec.cancelled[0].reason


def test_power_down_completes_when_backend_reports_off_and_measures_it():
    snap = Snapshot((v("a", "sleep"),),
                    transitions=(t("a", K.POWER_OFF, Phase.POWERING_DOWN, since=NOW - 200),))
    rec = reconcile(snap, {"a": Status(PowerState.OFF, NOW - 140)}, CFG, NOW)
    assert bucket(rec, "a") == "completed" and rec.completed[0].seconds == 60


def test_power_down_that_never_finishes_times_out():
    snap = Snapshot((v("a", "sleep"),),
                    transitions=(t("a", K.SLEEP, Phase.POWERING_DOWN, since=NOW - 601),))
    rec = reconcile(snap, {"a": Status(PowerState.ON, None)}, CFG, NOW)
    assert bucket(rec, "a") == "timed_out"
    assert "asleep within shutdown_timeout=600s (backend reports on)" in rec.timed_out[0].reason


def test_powering_up_host_comes_up_when_backend_says_on():
    snap = Snapshot((v("a", "sleep"),), transitions=(t("a", K.POWER_ON, Phase.POWERING_UP),))
    assert bucket(reconcile(snap, {"a": Status(PowerState.ON, NOW)}, CFG, NOW), "a") == "came_up"
    off = reconcile(snap, {"a": Status(PowerState.TRANSITIONING, None)}, CFG, NOW)
    assert bucket(off, "a") == "waiting"


def test_a_host_on_whose_mom_is_not_back_keeps_its_sleep_mark_while_it_boots():
    # pbs_server shows a host that is off down,sleep (state-unknown,down after
    # a restart); its MoM registering clears them. Until then the mark stays.
    on = {"a": Status(PowerState.ON, NOW)}
    for states in (("down", "sleep"), ("state-unknown", "down", "sleep")):
        snap = Snapshot((v("a", *states),),
                        transitions=(t("a", K.POWER_ON, Phase.POWERING_UP),))
        rec = reconcile(snap, on, CFG, NOW)
        assert bucket(rec, "a") == "booting" and "sleep mark kept" in rec.booting[0].reason
        booting = Snapshot(snap.vnodes, transitions=(t("a", K.POWER_ON, Phase.BOOTING),))
        assert bucket(reconcile(booting, {}, CFG, NOW), "a") == "waiting"


def test_a_host_coming_up_whose_mark_a_restart_dropped_is_marked_again():
    # A server restart forgets sleep marks; a host whose MoM is not back shows
    # state-unknown,down. While powering up or booting it is marked again.
    for phase in (Phase.POWERING_UP, Phase.BOOTING):
        snap = Snapshot((v("a", "state-unknown", "down"),),
                        transitions=(t("a", K.POWER_ON, phase),))
        rec = reconcile(snap, {"a": Status(PowerState.TRANSITIONING, None)}, CFG, NOW)
        assert bucket(rec, "a") == "mark_lost", phase
    # Not a host that shows up, nor one whose mark is there.
    for states in (("free",), ("down", "sleep")):
        snap = Snapshot((v("a", *states),), transitions=(t("a", K.POWER_ON, Phase.BOOTING),))
        assert bucket(reconcile(snap, {}, CFG, NOW), "a") in ("completed", "waiting")


def test_host_that_never_powers_on_times_out_after_boot_timeout():
    snap = Snapshot((v("a", "sleep"),),
                    transitions=(t("a", K.POWER_ON, Phase.POWERING_UP, started=NOW - 1801),))
    rec = reconcile(snap, {"a": Status(PowerState.TRANSITIONING, None)}, CFG, NOW)
    assert bucket(rec, "a") == "timed_out" and "boot_timeout=1800s" in rec.timed_out[0].reason


def test_booting_completes_when_scheduler_sees_it_usable_with_its_own_timestamp():
    snap = Snapshot((v("a", "free", lsct=NOW - 100),),
                    transitions=(t("a", K.POWER_ON, Phase.BOOTING, started=NOW - 500),))
    rec = reconcile(snap, {}, CFG, NOW)
    assert bucket(rec, "a") == "completed" and rec.completed[0].seconds == 400


def test_booting_host_still_down_waits_then_times_out():
    snap = Snapshot((v("a", "down", "sleep"),),
                    transitions=(t("a", K.POWER_ON, Phase.BOOTING, started=NOW - 500),))
    assert bucket(reconcile(snap, {}, CFG, NOW), "a") == "waiting"
    late = Snapshot(snap.vnodes, transitions=(t("a", K.POWER_ON, Phase.BOOTING,
                                                started=NOW - 2000),))
    rec = reconcile(late, {}, CFG, NOW)
    assert bucket(rec, "a") == "timed_out" and "shows it down" in rec.timed_out[0].reason


def test_booting_host_still_marked_asleep_gets_the_mark_cleared_again():
    snap = Snapshot((v("a", "sleep"),), transitions=(t("a", K.WAKE, Phase.BOOTING),))
    assert bucket(reconcile(snap, {}, CFG, NOW), "a") == "came_up"


def test_transition_of_a_host_gone_from_the_scheduler_is_forgotten():
    snap = Snapshot((), transitions=(t("gone", K.POWER_ON, Phase.POWERING_UP),))
    assert bucket(reconcile(snap, {}, CFG, NOW), "gone") == "vanished"


def test_apply_marks_reflects_sleep_wake_and_offline():
    snap = Snapshot((v("a"), v("b", "sleep"), v("c", "sleep")))
    out = {x.name: x.states for x in apply_marks(snap, ["a"], ["b"], ["c"]).vnodes}
    assert out == {"a": {"sleep"}, "b": {"free"}, "c": {"offline"}}
