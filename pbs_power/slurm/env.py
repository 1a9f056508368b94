"""The process environment slurmctld gives its programs, made safe to work in.

slurmctld starts SuspendProgram, ResumeProgram, PrologSlurmctld and
EpilogSlurmctld with fds 0-2 closed (so ``sys.stdout`` is None and the first
file opened would land on fd 0), no PATH (the prologs get no SLURM_CONF
either) and the signal mask of a slurmctld thread (HUP INT QUIT ABRT USR1
USR2 PIPE ALRM TERM TSTP XCPU blocked), which every child inherits: a daemon
started from there would ignore SIGTERM. `prepare_program_env` undoes that,
and gives the programs slurmctld's own SLURM_CONF so that their ``scontrol``
reads the slurm.conf slurmctld does;
`program_logger` logs one line per event to syslog and, if the hook config
names one, to ``slurm_log_file``.
"""
from __future__ import annotations

import io
import os
import signal
import sys
import time

TYPE_CHECKING = False  # typing is not imported at run time: every job's prolog starts here
if TYPE_CHECKING:
    import logging
    from typing import Any, Mapping, Optional

#: PATH given to child processes when slurmctld gave none.
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Where the Slurm programs read the hook config unless $PBS_POWER_CONFIG says otherwise.
DEFAULT_CONFIG = "/etc/pbs_power.json"
CONFIG_ENV = "PBS_POWER_CONFIG"
SYSLOG_SOCKET = "/dev/log"
LOG_FORMAT = "%(asctime)s %(name)s[%(process)d]: %(levelname)s %(message)s"


def prepare_program_env() -> None:
    """Reopen closed fds 0-2 on /dev/null, unblock signals, set a PATH if missing.

    Call it first thing in a program slurmctld starts, before opening any file.
    """
    for fd in (0, 1, 2):
        if not _fd_open(fd):
            new = os.open(os.devnull, os.O_RDWR)
            if new != fd:  # a lower fd was closed too and got it: move it into place
                os.dup2(new, fd)
                os.close(new)
    if sys.stdin is None:
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    if sys.stdout is None:
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True)
    if sys.stderr is None:
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
    if not os.environ.get("PATH"):
        os.environ["PATH"] = SAFE_PATH
    if not os.environ.get("SLURM_CONF"):
        found = slurmctld_conf(os.getppid())
        if found:
            os.environ["SLURM_CONF"] = found


def slurmctld_conf(pid: int, proc: str = "/proc") -> Optional[str]:
    """The slurm.conf that slurmctld runs with, when it is not Slurm's built-in path.

    PrologSlurmctld and EpilogSlurmctld get no SLURM_CONF, so their ``scontrol``
    would read the compiled-in path; a slurmctld started with ``-f FILE`` or with
    SLURM_CONF in its environment uses another. ``pid`` is the program's parent:
    slurmctld, or its ``slurmscriptd`` (Slurm 21.08+, which runs the prologs and
    keeps slurmctld's environment but not its argv). Read from /proc (the program
    runs as SlurmUser, like them); None if neither shows one or ``pid`` is neither.
    """
    comm = _proc_read(proc, pid, "comm").strip()
    if comm == b"slurmscriptd":
        ctld = _parent(proc, pid)
        chain = [pid] + ([ctld] if ctld and _proc_read(proc, ctld, "comm").strip()
                         == b"slurmctld" else [])
    elif comm == b"slurmctld":
        chain = [pid]
    else:
        return None
    for node in chain:
        argv = _proc_read(proc, node, "cmdline").split(b"\0")
        for i, arg in enumerate(argv):
            if arg == b"-f" and i + 1 < len(argv) and argv[i + 1]:
                return os.fsdecode(argv[i + 1])
            if arg.startswith(b"-f") and len(arg) > 2:
                return os.fsdecode(arg[2:])
    for node in chain:
        for entry in _proc_read(proc, node, "environ").split(b"\0"):
            if entry.startswith(b"SLURM_CONF=") and len(entry) > len(b"SLURM_CONF="):
                return os.fsdecode(entry[len(b"SLURM_CONF="):])
    return None


def _proc_read(proc: str, pid: int, name: str) -> bytes:
    try:
        with open(os.path.join(proc, str(pid), name), "rb") as f:
            return f.read()
    except OSError:
        return b""


def _parent(proc: str, pid: int) -> Optional[int]:
    for line in _proc_read(proc, pid, "status").splitlines():
        if line.startswith(b"PPid:"):
            return int(line.split()[1])
    return None


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def config_path(environ: Optional[Mapping[str, str]] = None) -> str:
    """The hook config file: ``$PBS_POWER_CONFIG``, else /etc/pbs_power.json."""
    env = os.environ if environ is None else environ
    return env.get(CONFIG_ENV) or DEFAULT_CONFIG


def program_logger(name: str, config: Any = None) -> logging.Logger:
    """A logger writing one line per event to syslog (/dev/log) and ``slurm_log_file``.

    ``config`` is a HookConfig (or None when it could not be loaded: syslog
    only, or stderr when there is no syslog socket either). Calling it again
    for the same name replaces the handlers rather than adding more.
    """
    import logging
    logger = logging.getLogger("pbs_power." + name)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.propagate = False
    level = getattr(config, "log_level", "info") or "info"
    logger.setLevel(getattr(logging, str(level).upper(), logging.INFO))
    if os.path.exists(SYSLOG_SOCKET):
        try:
            from logging.handlers import SysLogHandler  # only with a syslog socket
            syslog = SysLogHandler(address=SYSLOG_SOCKET, facility=SysLogHandler.LOG_DAEMON)
            syslog.setFormatter(logging.Formatter(
                "pbs-power-%s[%%(process)d]: %%(levelname)s %%(message)s" % name))
            logger.addHandler(syslog)
        except OSError:
            pass
    log_file = getattr(config, "slurm_log_file", None)
    if log_file:
        try:
            handler = logging.FileHandler(log_file, encoding="utf-8")
        except OSError as exc:
            logger.addHandler(_stderr_handler())
            logger.error("cannot open slurm_log_file %s: %s", log_file, exc.strerror or exc)
        else:
            handler.setFormatter(logging.Formatter(LOG_FORMAT.replace("%(name)s", name)))
            logger.addHandler(handler)
    if not logger.handlers:
        logger.addHandler(_stderr_handler())
    return logger


def _stderr_handler() -> logging.Handler:
    import logging
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    return handler


def process_age() -> Optional[float]:
    """Seconds since this process started (interpreter start-up included), None if unknown."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        ticks = int(stat[stat.rindex(b")") + 2:].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def process_started() -> float:
    """This process's start on the ``time.monotonic`` clock (now, if unknown)."""
    return time.monotonic() - (process_age() or 0.0)
