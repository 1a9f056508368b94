"""The SQLite state store: round trips, estimates, locking, crashes, concurrency."""
from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from pbs_power.states.model import Phase, RampStep, Transition, TransitionKind
from pbs_power.states.store import (DB_NAME, SCHEMA_VERSION, Store, StoreError,
                             nearest_rank)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
P_ON, P_OFF = TransitionKind.POWER_ON, TransitionKind.POWER_OFF


@pytest.fixture
def state_dir(tmp_path):
    return str(tmp_path / "state")


@pytest.fixture
def store(state_dir):
    with Store.open(state_dir) as opened:
        yield opened


def trans(host, kind=P_OFF, phase=Phase.DRAINING, started=100.0, reason="idle"):
    return Transition(host, kind, phase, started, started + 1, reason)


def spawn(code, *args, flags=()):
    """A Python child running ``code`` with pbs_power importable."""
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.Popen([sys.executable, *flags, "-c", textwrap.dedent(code),
                             *map(str, args)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=60):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return out


def kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()


# -- opening ---------------------------------------------------------------

def test_open_creates_private_dir_and_wal_db(state_dir):
    with Store.open(os.path.join(state_dir, "deeper")) as store:
        assert store.path == os.path.join(state_dir, "deeper", DB_NAME)
        assert os.path.isfile(store.path)
        mode = stat.S_IMODE(os.stat(store.state_dir).st_mode)
        assert mode == 0o700
    conn = sqlite3.connect(os.path.join(state_dir, "deeper", DB_NAME))
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_reopen_keeps_data_and_schema(state_dir):
    with Store.open(state_dir) as store:
        store.put_transition(trans("n1"))
    with Store(os.path.join(state_dir, DB_NAME)) as store:
        assert store.transitions() == (trans("n1"),)
        rows = store._rows("SELECT version FROM schema_version")
        assert rows == [(1,)]


def _as_nobody(fn):
    """Run ``fn`` as an unprivileged user (root ignores permissions); its error."""
    if os.geteuid() != 0:
        try:
            fn()
        except StoreError as exc:
            return str(exc)
        return "no error"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            os.close(read_end)
            os.setgid(65534)
            os.setuid(65534)
            try:
                fn()
                message = "no error"
            except StoreError as exc:
                message = str(exc)
            except BaseException as exc:
                message = repr(exc)
            os.write(write_end, message.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        message = pipe.read().decode()
    os.waitpid(pid, 0)
    return message


@pytest.fixture
def readonly_dir():
    base = tempfile.mkdtemp()
    os.chmod(base, 0o755)  # reachable by the unprivileged user
    path = os.path.join(base, "ro")
    os.mkdir(path, 0o555)
    os.chmod(path, 0o555)
    yield path
    os.chmod(path, 0o755)
    shutil.rmtree(base)


def test_unwritable_dir_is_refused_with_its_name(readonly_dir):
    message = _as_nobody(lambda: Store.open(readonly_dir))
    assert message.startswith(f"state directory {readonly_dir} is not writable"), message
    assert not os.listdir(readonly_dir)


def test_uncreatable_dir_is_refused_with_its_name(readonly_dir):
    target = os.path.join(readonly_dir, "sub")
    message = _as_nobody(lambda: Store.open(target))
    assert message.startswith(f"cannot create state directory {target}"), message


def test_state_dir_that_is_a_file_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match=str(blocker)):
        Store.open(str(blocker))
    with pytest.raises(StoreError, match="not a directory"):
        Store(str(blocker / DB_NAME))


def test_newer_schema_is_refused(state_dir):
    Store.open(state_dir).close()
    path = os.path.join(state_dir, DB_NAME)
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO schema_version VALUES (?, 0)", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(StoreError) as info:
        Store.open(state_dir)
    text = str(info.value)
    assert path in text and "newer pbs_power" in text and "upgrade" in text


def test_corrupt_file_is_refused_with_advice(state_dir):
    os.makedirs(state_dir)
    path = os.path.join(state_dir, DB_NAME)
    with open(path, "wb") as junk:
        junk.write(b"definitely not sqlite\n" * 300)
    with pytest.raises(StoreError) as info:
        Store.open(state_dir)
    assert path in str(info.value) and "corrupt" in str(info.value)
    assert "move the file" in str(info.value)


def test_works_under_python_OO(state_dir):
    proc = spawn("""
        import sys
        from pbs_power.states.store import Store
        from pbs_power.states.model import TransitionKind
        with Store.open(sys.argv[1]) as s:
            s.record_duration("n1", TransitionKind.POWER_ON, 0.0, 5.0)
            print(s.duration_estimates())
    """, state_dir, flags=("-OO",))
    assert finish(proc).strip() == "{'n1': {'power_on': 5.0}}"


# -- round trips -----------------------------------------------------------

def test_transitions_round_trip(store):
    assert store.transitions() == ()
    a = trans("n2", P_ON, Phase.POWERING_UP, 5.0, "job 12 needs it")
    b = trans("n1")
    store.put_transition(a)
    store.put_transition(b)
    assert store.transitions() == (b, a)
    moved = b.advanced(Phase.POWERING_DOWN, 200.0)
    store.put_transition(moved)                      # replace, one row per host
    assert store.transitions() == (moved, a)
    assert isinstance(store.transitions()[0].kind, TransitionKind)
    store.drop_transition("n1")
    store.drop_transition("never")                   # absent: no error
    assert store.transitions() == (a,)


def test_down_since_round_trip(store):
    store.set_down_since("n1", 10.0)
    store.set_down_since("n2", 20.5)
    store.set_down_since("n1", 30.0)
    assert store.down_since() == {"n1": 30.0, "n2": 20.5}
    store.set_down_since("n1", None)
    store.set_down_since("n9", None)
    assert store.down_since() == {"n2": 20.5}


def test_failed_round_trip(store):
    store.mark_failed("n1", "not up after 1800 s", 50.0)
    store.mark_failed("n2", "bmc said no", 60.0)
    store.mark_failed("n1", "again", 70.0)
    assert store.failed() == {"n1": ("again", 70.0), "n2": ("bmc said no", 60.0)}
    store.clear_failed("n1")
    assert store.failed() == {"n2": ("bmc said no", 60.0)}


def test_steps_round_trip_and_pruning(store):
    store.record_steps([RampStep(0.0, "n1", 200.0), RampStep(10.0, "n2", -150.0)])
    store.record_steps([])
    assert store.recent_steps(0.0) == (RampStep(0.0, "n1", 200.0),
                                       RampStep(10.0, "n2", -150.0))
    assert store.recent_steps(5.0) == (RampStep(10.0, "n2", -150.0),)
    store.record_steps(iter([RampStep(3605.0, "n3", 100.0)]))  # an hour later
    assert store.recent_steps(-1e9) == (RampStep(10.0, "n2", -150.0),
                                        RampStep(3605.0, "n3", 100.0))


def test_durations_round_trip(store):
    store.record_duration("n1", P_ON, 10.0, 400.0)
    store.record_duration("n1", "power_on", 20.0, 410.0)
    store.record_duration("n1", P_OFF, 30.0, 60.0)
    assert store.durations("n1", P_ON) == (410.0, 400.0)
    assert store.duration_estimates() == {"n1": {"power_on": 410.0, "power_off": 60.0}}
    assert store.duration_estimates(P_OFF) == {"n1": {"power_off": 60.0}}
    assert store.duration_estimates(TransitionKind.WAKE) == {}


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_bad_duration_is_refused(store, bad):
    with pytest.raises(ValueError, match="n1"):
        store.record_duration("n1", P_ON, 0.0, bad)
    assert store.durations("n1", P_ON) == ()


def test_bad_kind_is_refused(store):
    with pytest.raises(ValueError):
        store.record_duration("n1", "reboot", 0.0, 1.0)


# -- estimates ---------------------------------------------------------------

@pytest.mark.parametrize("n, rank", [(1, 1), (2, 2), (9, 9), (10, 9), (11, 10),
                                     (20, 18), (70, 63), (100, 90)])
def test_nearest_rank_p90(n, rank):
    values = [float(v) for v in range(n, 0, -1)]    # unsorted on purpose
    assert nearest_rank(values, 90) == rank


def test_estimate_is_p90_of_last_ten(store):
    for i in range(1, 13):                          # 1..12; the last ten are 3..12
        store.record_duration("n1", P_ON, float(i), float(i) * 10)
    assert store.duration_estimates()["n1"]["power_on"] == 110.0  # 9th of 30..120


def test_last_means_newest_start_not_insertion_order(store):
    for i in range(12):                             # newest start first
        store.record_duration("n1", P_ON, 1000.0 - i, 1000.0 - i)
    # The ten newest starts are 991..1000; their p90 (9th smallest) is 999.
    assert store.duration_estimates()["n1"]["power_on"] == 999.0


def test_history_is_pruned_to_twenty_per_host_and_kind(store):
    for i in range(25):
        store.record_duration("n1", P_ON, float(i), float(i))
        store.record_duration("n2", P_ON, float(i), 1.0)
    store.record_duration("n1", P_OFF, 0.0, 7.0)
    assert store.durations("n1", P_ON) == tuple(float(i) for i in range(24, 4, -1))
    assert len(store.durations("n2", P_ON)) == 20
    assert store.durations("n1", P_OFF) == (7.0,)
    assert store._rows("SELECT COUNT(*) FROM durations") == [(41,)]


def test_fleet_estimate_needs_three_hosts(store):
    assert store.fleet_duration_estimate(P_ON) is None
    store.record_duration("a", P_ON, 0.0, 100.0)
    store.record_duration("b", P_ON, 0.0, 200.0)
    store.record_duration("x", P_OFF, 0.0, 999.0)   # other kind: not counted
    assert store.fleet_duration_estimate(P_ON) is None
    store.record_duration("c", P_ON, 0.0, 300.0)
    assert store.fleet_duration_estimate(P_ON) == 300.0


def test_fleet_estimate_uses_each_hosts_latest(store):
    for i in range(10):
        host = f"n{i}"
        store.record_duration(host, P_ON, 0.0, 5000.0)          # old, ignored
        store.record_duration(host, P_ON, 1.0, float(i + 1) * 10)
    assert store.fleet_duration_estimate(P_ON) == 90.0          # 9th of 10..100


# -- transactions ------------------------------------------------------------

def test_outer_transaction_rolls_back_inner_writes(store):
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.put_transition(trans("n1"))
            store.record_duration("n1", P_OFF, 0.0, 1.0)
            store.mark_failed("n1", "x", 0.0)
            raise RuntimeError("boom")
    assert store.transitions() == () and store.failed() == {}
    assert store.durations("n1", P_OFF) == ()


def test_failed_inner_block_rolls_back_only_itself(store):
    with store.transaction():
        store.put_transition(trans("n1"))
        with pytest.raises(KeyError):
            with store.transaction():
                store.put_transition(trans("n2"))
                raise KeyError("inner")
        store.set_down_since("n1", 5.0)
    assert [t.host for t in store.transitions()] == ["n1"]
    assert store.down_since() == {"n1": 5.0}


def test_writer_waits_then_times_out_with_clear_error(store):
    with Store(store.path, timeout=0.2) as other:
        with store.transaction():
            store.put_transition(trans("n1"))
            assert other.transitions() == ()            # readers never wait
            with pytest.raises(StoreError, match="locked"):
                other.put_transition(trans("n2"))
        assert [t.host for t in other.transitions()] == ["n1"]
        other.put_transition(trans("n2"))                # free again
    assert len(store.transitions()) == 2


# -- cycle lock ----------------------------------------------------------------

LOCK_HOLDER = """
    import sys, time
    from pbs_power.states.store import Store
    store = Store.open(sys.argv[1])
    with store.cycle_lock(sys.argv[2]) as got:
        print("got" if got else "busy", flush=True)
        if got and sys.argv[3] == "hold":
            time.sleep(120)
"""


def test_cycle_lock_is_exclusive_between_processes(store, state_dir):
    holder = spawn(LOCK_HOLDER, state_dir, "cycle", "hold")
    try:
        assert holder.stdout.readline().strip() == "got"
        with store.cycle_lock() as got:
            assert got is False
        other = spawn(LOCK_HOLDER, state_dir, "cycle", "quick")
        assert finish(other).strip() == "busy"
        other = spawn(LOCK_HOLDER, state_dir, "another", "quick")   # other name
        assert finish(other).strip() == "got"
    finally:
        kill(holder)                                    # SIGKILL: no cleanup runs
    with store.cycle_lock() as got:
        assert got is True
        again = spawn(LOCK_HOLDER, state_dir, "cycle", "quick")
        assert finish(again).strip() == "busy"
    with store.cycle_lock() as got:                     # released on exit
        assert got is True


def test_cycle_lock_name_is_checked(store):
    with pytest.raises(ValueError):
        with store.cycle_lock("../etc/x"):
            pass


# -- crashes and concurrency ---------------------------------------------------

def test_sigkill_mid_transaction_leaves_consistent_db(store, state_dir):
    store.put_transition(trans("keep"))
    child = spawn("""
        import sys, time
        from pbs_power.states.store import Store
        from pbs_power.states.model import Phase, Transition, TransitionKind as K
        store = Store.open(sys.argv[1])
        with store.transaction():
            store.put_transition(Transition("lost", K.POWER_ON, Phase.BOOTING, 1, 1))
            store.record_duration("lost", K.POWER_ON, 0.0, 1.0)
            store.drop_transition("keep")
            print("inside", flush=True)
            time.sleep(120)
    """, state_dir)
    try:
        assert child.stdout.readline().strip() == "inside"
        assert store.transitions() == (trans("keep"),)   # uncommitted: invisible
    finally:
        kill(child)
    with Store.open(state_dir, timeout=1.0) as reopened:
        assert reopened._rows("PRAGMA integrity_check") == [("ok",)]
        assert reopened.transitions() == (trans("keep"),)
        assert reopened.durations("lost", P_ON) == ()
        reopened.put_transition(trans("new"))            # the write lock is free
    assert len(store.transitions()) == 2


def test_sigkill_during_a_write_storm_keeps_pairs_together(store, state_dir):
    child = spawn("""
        import sys
        from pbs_power.states.store import Store
        from pbs_power.states.model import Phase, Transition, TransitionKind as K
        store = Store.open(sys.argv[1])
        print("go", flush=True)
        i = 0
        while True:
            i += 1
            host = "n%d" % (i % 50)
            with store.transaction():
                store.put_transition(Transition(host, K.POWER_OFF, Phase.DRAINING, i, i))
                store.set_down_since(host, float(i))
    """, state_dir)
    try:
        assert child.stdout.readline().strip() == "go"
        time.sleep(0.3)
    finally:
        kill(child)
    with Store.open(state_dir) as reopened:
        assert reopened._rows("PRAGMA integrity_check") == [("ok",)]
        pairs = {t.host: t.started for t in reopened.transitions()}
        assert pairs and pairs == reopened.down_since()


WORKER = """
    import os, sys, time
    from pbs_power.states.store import Store
    from pbs_power.states.model import Phase, RampStep, Transition, TransitionKind as K
    state_dir, me, rounds = sys.argv[1], "w" + sys.argv[2], int(sys.argv[3])
    store = Store.open(state_dir)
    print("ready", flush=True)
    while not os.path.exists(os.path.join(state_dir, "go")):
        time.sleep(0.002)
    for i in range(rounds):
        with store.transaction():
            current = {t.host: t for t in store.transitions()}
            count = current["counter"].started if "counter" in current else 0.0
            time.sleep(0.0005)      # widen the read-modify-write window
            store.put_transition(Transition("counter", K.POWER_ON, Phase.BOOTING,
                                            count + 1, 0.0))
            if me in current:
                store.drop_transition(me)
            else:
                store.put_transition(Transition(me, K.POWER_OFF, Phase.DRAINING, i, i))
            mine = store.down_since().get(me, 0.0)
            store.set_down_since(me, mine + 1)
            store.record_duration(me, K.POWER_ON, float(i), float(i))
            store.record_steps([RampStep(float(i), me, 1.0)])
    store.close()
"""


def test_concurrent_read_modify_write_loses_nothing(store, state_dir):
    workers, rounds = 8, 50
    procs = [spawn(WORKER, state_dir, k, rounds) for k in range(workers)]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        open(os.path.join(state_dir, "go"), "w").close()
        for proc in procs:
            finish(proc, timeout=120)
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill(proc)
    by_host = {t.host: t for t in store.transitions()}
    assert by_host["counter"].started == workers * rounds
    assert set(by_host) == {"counter"}               # 50 toggles each: all dropped
    assert store.down_since() == {f"w{k}": float(rounds) for k in range(workers)}
    estimates = store.duration_estimates()
    for k in range(workers):
        assert store.durations(f"w{k}", P_ON) == tuple(float(i) for i in range(49, 29, -1))
        assert estimates[f"w{k}"] == {"power_on": 48.0}   # 9th of 40..49
    assert len(store.recent_steps(0.0)) == workers * rounds
