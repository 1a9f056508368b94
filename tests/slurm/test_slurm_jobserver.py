"""The job server (pbs-power-slurm-jobd) and the programs' client side.

The server runs as a real process on a socket in tmp_path; the prolog and
epilog are the installed console scripts, started as slurmctld starts them.
The state is real SQLite with the SIMULATED device backend.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pbs_power.slurm import jobclient as jc
from pbs_power.slurm import jobserver as js
from slurm_jobs_setup import groups, make_state, run_like_slurmctld, write_config

BIN = Path(sys.executable).parent
ENV = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_PARTITION": "debug"}


# -- the request format ------------------------------------------------------------
def test_a_request_round_trips_with_any_environment_value():
    env = {"A": "x=y=z", "EMPTY": "", "LATIN": "caf\xe9", "RAW": os.fsdecode(b"\xff\xfe")}
    data = jc.encode_request("epilog", "/etc/pbs_power.json", 12.5, env)
    assert jc.decode_request(data) == ("epilog", "/etc/pbs_power.json", 12.5, env)


@pytest.mark.parametrize("data, why", [
    (b"v1\0prolog\0/c\0001.0\0A=1", "not NUL-ended"),
    (b"v2\0prolog\0/c\0001.0\0", "not a v1 request"),
    (b"v1\0suspend\0/c\0001.0\0", "unknown program"),
    (b"v1\0prolog\0/c\0001.0\0NOEQUALS\0", "without '='"),
    (b"v1\0prolog\0/c\0soon\0", "could not convert"),
])
def test_a_malformed_request_is_refused(data, why):
    with pytest.raises(ValueError, match=why):
        jc.decode_request(data)


def test_only_the_servers_user_and_root_may_have_runs_done():
    assert js.peer_allowed(0, 64030) and js.peer_allowed(64030, 64030)
    assert not js.peer_allowed(1000, 64030)


def test_a_changed_or_removed_file_is_noticed(tmp_path):
    kept, touched, gone = (tmp_path / n for n in ("kept.py", "touched.py", "gone.py"))
    for f in (kept, touched, gone):
        f.write_text("x = 1\n")
    stamps = {str(f): os.stat(f).st_mtime_ns for f in (kept, touched, gone)}
    os.utime(touched, ns=(0, stamps[str(touched)] + 1))
    gone.unlink()
    assert sorted(js.changed_files(stamps)) == sorted([str(touched), str(gone)])


def test_code_stamps_cover_the_loaded_package():
    stamps = js.code_stamps()
    assert js.__file__ in stamps and jc.__file__ in stamps
    assert js.changed_files(stamps) == []


def test_a_server_whose_code_changed_answers_stale_and_stops(tmp_path):
    listener, client = socket.socketpair()
    server = js.JobServer(listener, str(tmp_path / "sock"))
    watched = tmp_path / "module.py"
    watched.write_text("x = 1\n")
    server.stamps = {str(watched): os.stat(watched).st_mtime_ns - 1}
    ours, theirs = socket.socketpair()
    server._handle(theirs)
    assert ours.recv(16) == jc.STALE and server.stopping and server.children == set()
    for s in (listener, client, ours):
        s.close()


# -- the client's fallbacks ------------------------------------------------------------
def test_no_socket_means_run_it_here(tmp_path):
    env = {jc.SOCKET_ENV: str(tmp_path / "none.sock")}
    assert jc.run_on_server("prolog", "/c", 0.0, env) is None


def test_a_dead_servers_socket_means_run_it_here(tmp_path):
    path = str(tmp_path / "dead.sock")
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(path)
    dead.close()  # the file stays, nobody listens: connect is refused
    assert jc.run_on_server("prolog", "/c", 0.0, {jc.SOCKET_ENV: path}) is None


def fake_server(path, script):
    """Accept one connection on ``path`` and play ``script`` (bytes to send, or None to read)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    received = []

    def serve():
        conn, _ = listener.accept()
        with conn:
            for step in script:
                if step is None:
                    received.append(b"".join(iter(lambda: conn.recv(65536), b"")))
                else:
                    conn.sendall(step)
        listener.close()
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread, received


@pytest.mark.parametrize("script, want", [
    ([jc.READY, None, b"1\n"], 1),        # the run's status comes back
    ([jc.STALE], None),                   # a server on old code: run it here
    ([jc.READY, None], None),             # the child died without an answer: run it here
    ([b"nonsense\n"], None),
])
def test_the_client_returns_the_status_or_none(tmp_path, script, want):
    path = str(tmp_path / "s.sock")
    thread, received = fake_server(path, script)
    env = {jc.SOCKET_ENV: path, "SLURM_JOB_ID": "7"}
    assert jc.run_on_server("prolog", "/etc/x.json", 3.0, env) == want
    thread.join(5)
    if received:  # a request is sent only after READY
        assert jc.decode_request(received[0]) == ("prolog", "/etc/x.json", 3.0, env)


# -- a real server ----------------------------------------------------------------------
@pytest.fixture
def server(tmp_path):
    path = tmp_path / "run" / "jobs.sock"
    proc = subprocess.Popen([str(BIN / "pbs-power-slurm-jobd"), "--socket", str(path)],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), proc.stderr.read() if proc.poll() is not None else "no socket"
    yield proc, path
    proc.terminate()
    proc.wait(10)


def logged_pids(log: Path):
    return [int(m.group(1)) for m in re.finditer(r"(?:prolog|epilog)\[(\d+)\]", log.read_text())]


def test_the_programs_run_on_the_server_and_give_its_statuses(server, tmp_path):
    proc, path = server
    state = tmp_path / "state"
    make_state(state)
    log = tmp_path / "slurm.log"
    config = write_config(tmp_path / "hook.json", state, log, strict=True)
    config.write_text(config.read_text().replace('{', '{"log_level": "debug", ', 1))
    env = dict(ENV, PBS_POWER_CONFIG=str(config), PBS_POWER_JOB_SOCKET=str(path),
               SLURM_JOB_COMMENT="power_policy=Node-Low")
    rc1, _ = run_like_slurmctld(str(BIN / "pbs-power-slurm-prolog"), env)
    assert rc1 == 0 and groups(state)["rg_42"][2] == {"node1": "Node-Low", "node2": "Node-Low"}
    refused = dict(env, SLURM_JOB_ID="43", SLURM_JOB_NODELIST="node[3-4]",
                   SLURM_JOB_COMMENT="power_policy=Node-High")
    rc2, _ = run_like_slurmctld(str(BIN / "pbs-power-slurm-prolog"), refused)
    rc3, _ = run_like_slurmctld(str(BIN / "pbs-power-slurm-epilog"), env)
    assert (rc2, rc3) == (1, 0) and groups(state) == {}
    lines = [x for x in log.read_text().splitlines() if " DEBUG " not in x]
    assert len(lines) == 3 and "exit 1: Slurm requeues a batch job" in lines[1]
    ran_by = re.findall(r"job (\d+) (\w+): run by pbs-power-slurm-jobd\[(\d+)\]", log.read_text())
    assert ran_by == [("42", "prolog", str(proc.pid)), ("43", "prolog", str(proc.pid)),
                      ("42", "epilog", str(proc.pid))]
    assert len(set(logged_pids(log))) == 3 and proc.pid not in logged_pids(log)
    assert proc.poll() is None


def test_without_the_server_the_programs_run_themselves(tmp_path):
    state = tmp_path / "state"
    make_state(state)
    log = tmp_path / "slurm.log"
    config = write_config(tmp_path / "hook.json", state, log)
    env = dict(ENV, PBS_POWER_CONFIG=str(config),
               PBS_POWER_JOB_SOCKET=str(tmp_path / "no-server.sock"))
    assert run_like_slurmctld(str(BIN / "pbs-power-slurm-prolog"), env)[0] == 0
    assert "rg_42 active on node1,node2" in log.read_text() and "run by" not in log.read_text()


def test_a_second_server_on_a_live_socket_refuses_to_start(server):
    _proc, path = server
    out = subprocess.run([str(BIN / "pbs-power-slurm-jobd"), "--socket", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "cannot listen on %s" % path in out.stderr


def test_sigterm_stops_the_server_and_removes_its_socket(server):
    proc, path = server
    proc.terminate()
    assert proc.wait(10) == 0 and not path.exists()


@pytest.mark.parametrize("args, want", [
    ([], "/etc/pbs_power.json"), (["--config", "/x.json"], "/x.json"),
    (["--config=/x.json"], "/x.json"), (["--help"], None), (["--config"], None),
    (["--config", ""], None), (["--config=/x", "extra"], None),
])
def test_only_a_config_argument_goes_to_the_server(args, want):
    assert jc.config_argument(args, "/etc/pbs_power.json") == want
