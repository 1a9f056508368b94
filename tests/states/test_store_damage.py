"""A damaged state database is reported as damaged, never silently replaced."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pbs_power.cli.main import main
from pbs_power.states.sqlite import SQLITE_HEADER, connect
from pbs_power.states.store import Store, StoreError

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = ROOT / "config" / "topology.json"


def groups_state(tmp_path) -> Path:
    state = tmp_path / "state"
    assert main(["topology", "import", "--state-dir", str(state), str(TOPOLOGY)]) == 0
    assert main(["topology", "activate", "--state-dir", str(state)]) == 0
    assert main(["resource-group", "create", "--state-dir", str(state), "g1"]) == 0
    return state


def test_an_empty_hook_database_is_refused_and_left_as_it_is(tmp_path):
    db = tmp_path / "pbs_power.db"
    db.write_bytes(b"")
    with pytest.raises(StoreError, match=r"is empty \(0 bytes\).*restore it from a backup"):
        Store(str(db))
    assert db.read_bytes() == b""


def test_a_file_that_is_not_sqlite_is_refused(tmp_path):
    db = tmp_path / "pbs_power.db"
    db.write_text("these are not the bytes you are looking for\n")
    with pytest.raises(StoreError, match="not an SQLite database"):
        Store(str(db))


def test_an_empty_group_database_fails_the_cli_with_one_line(tmp_path, capsys):
    state = groups_state(tmp_path)
    db = state / "resource_groups.db"
    for extra in state.glob("resource_groups.db-*"):
        extra.unlink()
    db.write_bytes(b"")
    capsys.readouterr()
    assert main(["resource-group", "list", "--state-dir", str(state)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(db) in err and "is empty (0 bytes)" in err
    assert db.read_bytes() == b""


def test_garbage_inside_the_group_database_is_reported_as_damage(tmp_path):
    state = groups_state(tmp_path)
    db = state / "resource_groups.db"
    main(["resource-group", "list", "--state-dir", str(state)])   # checkpoint into the file
    for extra in state.glob("resource_groups.db-*"):
        extra.unlink()
    with open(db, "r+b") as f:
        f.seek(4096)
        f.write(os.urandom(db.stat().st_size - 4096))
    out = subprocess.run([sys.executable, "-m", "pbs_power.cli", "resource-group", "list",
                          "--state-dir", str(state)], capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr and "is damaged" in out.stderr


def test_a_new_database_appears_whole_even_when_created_at_once(tmp_path):
    db = tmp_path / "shared.db"
    code = ("import sys; from pbs_power.states.sqlite import connect; "
            "c = connect(sys.argv[1]); c.execute('CREATE TABLE IF NOT EXISTS t (x)'); c.close()")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(db)], stderr=subprocess.PIPE)
             for _ in range(8)]
    errors = [p.communicate(timeout=60)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, errors
    assert db.read_bytes()[:16] == SQLITE_HEADER
    assert not list(tmp_path.glob(".new-*"))


def test_a_full_disk_is_named_as_such(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                          capture_output=True)
    if made.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root): %s" % made.stderr.decode())
    try:
        conn = connect(str(mount / "pbs_power.db"))
        conn.execute("CREATE TABLE t (x)")
        with pytest.raises(Exception) as info:
            for _ in range(1000):
                conn.execute("INSERT INTO t VALUES (?)", (os.urandom(4096),))
        from pbs_power.states.sqlite import database_error
        message = str(database_error(str(mount / "pbs_power.db"), info.value))
        assert "the disk holding it is full" in message
        conn.close()
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
