"""Hand a PrologSlurmctld/EpilogSlurmctld run to the job server, when one listens.

The programs call `run_on_server` first: with `pbs-power-slurm-jobd` running
(see `jobserver`), its forked child runs the program exactly as the program
would have, minus the seconds of imports, and this returns its exit status.
With no server, a refused connection, a server whose code changed on disk,
or a run that died without an answer, it returns None and the program runs
itself, as it does without a server: a server never decides a job's fate
by being absent.

The exchange on the Unix socket, one connection per run:

1. the server's child sends ``ready\\n`` (``stale\\n``: run it yourself);
2. the client sends ``v1``, the program, the hook config path, its start
   time (``time.monotonic``) and its environment (``KEY=VALUE``), each
   ended by a NUL byte, then shuts down its side;
3. the child runs the program and sends its exit status, ``<int>\\n``.

A request is only sent once a child is ready for it, so a run is never done
twice unless the child dies in the middle (a job start rerun is harmless:
the prolog deletes a stale group of its job first).
"""
from __future__ import annotations

import os

TYPE_CHECKING = False  # typing is not imported at run time: every job's prolog starts here
if TYPE_CHECKING:
    import socket
    from typing import Mapping, Optional, Sequence

#: Environment variable naming the server's socket; the path below otherwise.
SOCKET_ENV = "PBS_POWER_JOB_SOCKET"
DEFAULT_SOCKET = "/run/pbs_power/slurm-jobs.sock"
PROTOCOL = b"v1"
READY, STALE = b"ready\n", b"stale\n"
#: Seconds to wait for the server's child to be ready; the run itself is not timed out
#: here (slurmctld's PrologEpilogTimeout bounds it, as it bounds the program).
READY_TIMEOUT = 5.0
PROGRAMS = ("prolog", "epilog")


def socket_path(environ: Mapping[str, str]) -> str:
    """``$PBS_POWER_JOB_SOCKET``, else /run/pbs_power/slurm-jobs.sock."""
    return environ.get(SOCKET_ENV) or DEFAULT_SOCKET


def encode_request(program: str, config_file: str, started: float,
                   environ: Mapping[str, str]) -> bytes:
    """The request bytes: NUL-ended fields (environment entries cannot hold a NUL)."""
    fields = [PROTOCOL, program.encode(), os.fsencode(config_file), repr(started).encode()]
    fields += [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in environ.items()]
    return b"".join(f + b"\0" for f in fields)


def decode_request(data: bytes) -> tuple:
    """(program, config file, started, environment); ValueError if malformed."""
    if not data.endswith(b"\0"):
        raise ValueError("request not NUL-ended")
    fields = data[:-1].split(b"\0")
    if len(fields) < 4 or fields[0] != PROTOCOL:
        raise ValueError("not a %s request" % PROTOCOL.decode())
    program = fields[1].decode("ascii", "replace")
    if program not in PROGRAMS:
        raise ValueError("unknown program %r" % program)
    environ = {}
    for entry in fields[4:]:
        key, sep, value = entry.partition(b"=")
        if not sep or not key:
            raise ValueError("environment entry without '='")
        environ[os.fsdecode(key)] = os.fsdecode(value)
    return program, os.fsdecode(fields[2]), float(fields[3]), environ


def run_on_server(program: str, config_file: str, started: float,
                  environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """The exit status of ``program`` as the server's child ran it; None: run it here."""
    env = os.environ if environ is None else environ
    path = socket_path(env)
    if not os.path.exists(path):
        return None
    import socket  # only with a server: the in-process path does without
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(READY_TIMEOUT)
        sock.connect(path)
        if _read_line(sock) != READY:
            return None
        sock.settimeout(None)
        sock.sendall(encode_request(program, config_file, started, env))
        sock.shutdown(socket.SHUT_WR)
        answer = _read_line(sock)
        return int(answer) if answer.endswith(b"\n") else None
    except (OSError, ValueError):
        return None
    finally:
        sock.close()


def _read_line(sock: socket.socket, limit: int = 64) -> bytes:
    """Bytes up to and including the first newline (or EOF), at most ``limit``."""
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        chunk = sock.recv(limit - len(data))
        if not chunk:
            break
        data += chunk
    return data


def config_argument(args: Sequence[str], default: str) -> Optional[str]:
    """The config of ``[]``, ``[--config FILE]`` or ``[--config=FILE]``; None for other
    arguments (``--help``, a mistake: the program's own parser answers those)."""
    if not args:
        return default
    if len(args) == 2 and args[0] == "--config" and args[1]:
        return args[1]
    if len(args) == 1 and args[0].startswith("--config=") and len(args[0]) > 9:
        return args[0][9:]
    return None


def program_main(program: str, argv: Optional[Sequence[str]] = None) -> int:
    """PrologSlurmctld/EpilogSlurmctld: on the job server if one listens, else here."""
    import sys
    from .env import config_path, prepare_program_env, process_started
    prepare_program_env()
    args = list(sys.argv[1:] if argv is None else argv)
    config_file = config_argument(args, config_path(os.environ))
    if config_file is not None:
        status = run_on_server(program, config_file, process_started())
        if status is not None:
            return status
    from .jobs import main
    return main(program, args)
