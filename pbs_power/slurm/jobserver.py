"""The job server: PrologSlurmctld and EpilogSlurmctld runs without the import cost.

slurmctld runs a prolog and an epilog for every job, and most of a run is
Python loading the library (more with Redfish BMCs: ``requests`` and TLS).
``pbs-power-slurm-jobd`` loads it once, then forks one child per run; the
child does exactly what the program would do in its own process (its own
database connection, device calls and log line, with the program's
environment), and sends back the exit status. The programs use the server
when its socket exists (`jobclient`) and run by themselves otherwise.

The server holds no database connection and starts no thread, so a fork
copies nothing that could be shared by mistake. Only its own user and root
may connect. When a file of the code it loaded changes on disk (an upgrade),
it answers ``stale`` (the program then runs itself) and exits, for systemd
to start it again on the new code.
"""
from __future__ import annotations

import errno
import importlib
import logging
import os
import signal
import socket
import struct
import sys
from typing import Dict, List, Optional, Sequence

from pbs_power.config.backends import DEVICE_BACKENDS
from .jobclient import DEFAULT_SOCKET, READY, SOCKET_ENV, STALE, decode_request

#: What every run needs, loaded before the first fork.
PRELOAD = ("pbs_power.slurm.jobs", "pbs_power.groups.service", "pbs_power.groups.jobs",
           "pbs_power.groups.store", "pbs_power.config.hook_config", "pbs_power.config.memo",
           "pbs_power.devices.controller", "pbs_power.devices.selection",
           "ClusterShell.NodeSet", "logging.handlers", "sqlite3", "subprocess", "shutil")
#: Runs in flight at most; more connections wait in the listen backlog.
MAX_CHILDREN = 256
MAX_REQUEST = 1 << 20
REQUEST_TIMEOUT = 10.0
log = logging.getLogger("pbs_power.jobd")


def preload() -> List[str]:
    """Import what runs need, and every device backend whose libraries are installed.

    Returns the backends that could not be imported (their runs import them
    as the programs would).
    """
    for name in PRELOAD:
        importlib.import_module(name)
    missing = []
    for kind, (module, _cls) in sorted(DEVICE_BACKENDS.items()):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            missing.append("%s (%s)" % (kind, exc))
    return missing


def code_stamps(prefixes: Sequence[str] = ("pbs_power", "slurm_spank", "ClusterShell")
                ) -> Dict[str, int]:
    """{file: mtime_ns} of the loaded modules under ``prefixes``."""
    stamps = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and name.split(".")[0] in prefixes:
            try:
                stamps[path] = os.stat(path).st_mtime_ns
            except OSError:
                stamps[path] = -1
    return stamps


def changed_files(stamps: Dict[str, int]) -> List[str]:
    """The files of ``stamps`` changed or gone since they were taken."""
    changed = []
    for path, mtime in stamps.items():
        try:
            now = os.stat(path).st_mtime_ns
        except OSError:
            now = -1
        if now != mtime:
            changed.append(path)
    return changed


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end (SO_PEERCRED)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def peer_allowed(uid: int, own_uid: int) -> bool:
    """Only the server's own user (SlurmUser) and root may have runs done."""
    return uid in (0, own_uid)


def bind(path: str) -> socket.socket:
    """A listening socket at ``path`` (mode 0600); a dead server's socket is replaced."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        try:
            sock.bind(path)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or _listening(path):
                raise
            os.unlink(path)
            sock.bind(path)
    except BaseException:
        sock.close()
        raise
    finally:
        os.umask(old_umask)
    sock.listen(128)
    return sock


def _listening(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()


class JobServer:
    """Accepts runs on ``listener`` and forks a child for each."""

    def __init__(self, listener: socket.socket, path: str):
        self.listener = listener
        self.path = path
        self.own_uid = os.getuid()
        self.stamps = code_stamps()
        self.children = set()
        self.stopping = False

    def serve(self) -> None:
        """Until SIGTERM/SIGINT or changed code: accept, fork, reap."""
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        self.listener.settimeout(1.0)  # wake up to reap children and notice a stop
        try:
            while not self.stopping:
                self._reap()
                try:
                    conn, _addr = self.listener.accept()
                except (socket.timeout, InterruptedError):
                    continue
                self._handle(conn)
        finally:
            self.listener.close()
            if os.path.exists(self.path):
                os.unlink(self.path)

    def _stop(self, signum, _frame) -> None:
        log.info("signal %d: stopping; runs in flight finish on their own", signum)
        self.stopping = True

    def _handle(self, conn: socket.socket) -> None:
        try:
            uid = peer_uid(conn)
            if not peer_allowed(uid, self.own_uid):
                log.warning("connection from uid %d refused: only uid %d and root may "
                            "have runs done", uid, self.own_uid)
                return
            changed = changed_files(self.stamps)
            if changed:
                conn.sendall(STALE)
                log.warning("code changed on disk (%s%s): exiting, to be started again on "
                            "the new code", changed[0], " and %d more" % (len(changed) - 1)
                            if len(changed) > 1 else "")
                self.stopping = True
                return
            while len(self.children) >= MAX_CHILDREN:
                self._reap(block=True)
            pid = os.fork()
            if pid == 0:  # the child never returns into this loop
                code = 1
                try:
                    self.listener.close()
                    code = run_child(conn)
                finally:
                    os._exit(code)
            self.children.add(pid)
        except OSError as exc:
            log.warning("connection dropped: %s", exc)
        finally:
            conn.close()

    def _reap(self, block: bool = False) -> None:
        while self.children:
            try:
                pid, _status = os.waitpid(-1, 0 if block else os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                return
            self.children.discard(pid)
            block = False


def run_child(conn: socket.socket) -> int:
    """In the forked child: read the request, run the program, answer its status."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    try:
        conn.sendall(READY)
        conn.settimeout(REQUEST_TIMEOUT)
        data = b""
        while len(data) <= MAX_REQUEST:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        if not data:  # the client gave up waiting for READY: nothing to do
            return 0
        program, config_file, started, environ = decode_request(data)
    except (OSError, ValueError) as exc:
        log.warning("bad request: %s", exc)
        return 1
    os.environ.clear()
    os.environ.update(environ)
    from .jobs import run
    conn.settimeout(None)
    status = run(program, dict(environ), config_file, started=started,
                 origin="pbs-power-slurm-jobd[%d]" % os.getppid())
    logging.shutdown()
    try:
        conn.sendall(b"%d\n" % status)
    except OSError:
        pass
    return 0


def _parse_args(argv: Optional[Sequence[str]]):
    import argparse
    parser = argparse.ArgumentParser(
        prog="pbs-power-slurm-jobd",
        description="Job server for pbs_power's PrologSlurmctld and EpilogSlurmctld: loads "
                    "the library once and forks one child per run, so that a job start or "
                    "end does not pay Python's start-up. Optional: without it the programs "
                    "run by themselves. Run it as SlurmUser (systemd unit: "
                    "config/pbs-power-slurm-jobd.service).",
        epilog="The programs find the socket at $%s, else %s. Restart the server after "
               "changing the hook's code; it also exits by itself when a file it loaded "
               "changes." % (SOCKET_ENV, DEFAULT_SOCKET))
    parser.add_argument("--socket", default=os.environ.get(SOCKET_ENV) or DEFAULT_SOCKET,
                        help="Unix socket to listen on (default $%s, else %s)"
                             % (SOCKET_ENV, DEFAULT_SOCKET))
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``pbs-power-slurm-jobd``."""
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="pbs-power-slurm-jobd[%(process)d]: %(levelname)s %(message)s")
    missing = preload()
    try:
        listener = bind(args.socket)
    except OSError as exc:
        log.error("cannot listen on %s: %s", args.socket, exc.strerror or exc)
        return 1
    for item in missing:
        log.info("backend not preloaded: %s", item)
    log.info("listening on %s (uid %d and root may connect)", args.socket, os.getuid())
    JobServer(listener, args.socket).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
