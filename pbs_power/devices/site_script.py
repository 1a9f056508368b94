"""Running a site script: an argv list, a JSON request on stdin, a JSON answer on stdout.

The ``command`` backends call site tools this way (a capmc wrapper, or
``ssh NODE pbs-power node gpu-caps``). Never through a shell: the program and
its arguments are a list from the config, and the operation and host are
separate argv items (an item that is exactly ``{operation}`` or ``{host}`` is
replaced by it; without such items both are appended). Host names are checked
against a strict pattern first, since a remote shell (ssh) joins its arguments.
Each run is its own process group, so a timeout kills the script and whatever
it started. Failures come back as one line: exit status or signal, timeout,
or a bad answer, with the tail of the script's stderr.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Set

HOST_PLACEHOLDER = "{host}"
OPERATION_PLACEHOLDER = "{operation}"
#: Host and operation words a script may be given (no shell metacharacters).
SAFE_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}")
STDERR_TAIL = 240       # characters of stderr quoted in a diagnostic
STDOUT_QUOTE = 80       # characters of a bad answer quoted in a diagnostic
REAP_S = 5.0            # after killing a group, how long to wait for its pipes to close


class ScriptError(Exception):
    """A script run that gave no usable answer; the message is one line for the log."""


@dataclass(frozen=True)
class ScriptRun:
    """What one run of a script did."""

    returncode: Optional[int]   # None: it timed out and was killed
    stdout: bytes
    stderr: bytes
    elapsed: float


def build_argv(template: Sequence[str], operation: str, host: str) -> List[str]:
    """The argv for ``operation`` on ``host``; ScriptError if either is not a safe word."""
    for what, word in (("operation", operation), ("host", host)):
        if not isinstance(word, str) or not SAFE_WORD.fullmatch(word):
            raise ScriptError("refusing %s %r: only letters, digits, '.', '-' and '_' are "
                              "passed to a site script" % (what, word))
    if HOST_PLACEHOLDER not in template and OPERATION_PLACEHOLDER not in template:
        return list(template) + [operation, host]
    swap = {HOST_PLACEHOLDER: host, OPERATION_PLACEHOLDER: operation}
    return [swap.get(item, item) for item in template]


def stderr_tail(raw: bytes) -> str:
    """The last characters of stderr on one line ('' when it is empty)."""
    text = " | ".join(line.strip() for line in raw.decode("utf-8", "replace").splitlines()
                      if line.strip())
    if len(text) > STDERR_TAIL:
        text = "..." + text[-STDERR_TAIL:]
    return text


class ScriptRunner:
    """Runs scripts and kills those still running when it is closed."""

    def __init__(self, env: Optional[Dict[str, str]] = None) -> None:
        self.env = env
        self._live: Set[subprocess.Popen] = set()
        self._lock = threading.Lock()
        self._closed = False

    def run(self, argv: Sequence[str], request: Any, timeout: float) -> ScriptRun:
        """Run ``argv`` with ``request`` as JSON on stdin; ScriptError if it cannot start."""
        data = json.dumps(request, sort_keys=True).encode("utf-8")
        begin = time.monotonic()
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True,
                                    close_fds=True, env=self.env)
        except OSError as exc:
            raise ScriptError("cannot run %s: %s" % (argv[0], exc.strerror or exc)) from None
        with self._lock:
            if self._closed:
                _kill_group(proc)
            self._live.add(proc)
        try:
            out, err = proc.communicate(data, timeout=timeout)
            code: Optional[int] = proc.returncode
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = _reap(proc)
            code = None
        finally:
            with self._lock:
                self._live.discard(proc)
        return ScriptRun(code, out, err, time.monotonic() - begin)

    def close(self) -> None:
        """Kill the process group of every script still running; later runs are killed at once."""
        with self._lock:
            self._closed = True
            live = list(self._live)
        for proc in live:
            _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the script's process group (it leads its own session)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(proc: subprocess.Popen):
    """Collect a killed script's output; give up on pipes a runaway child keeps open."""
    try:
        return proc.communicate(timeout=REAP_S)
    except subprocess.TimeoutExpired:
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()
        return b"", b""


def json_answer(run: ScriptRun, timeout: float, label: str) -> Dict[str, Any]:
    """The script's JSON object; ScriptError (one line, stderr tail) for anything else.

    A non-zero exit with a ``{"success": false, ...}`` answer is a failure the
    script explained: its answer is kept, its error gains the exit status.
    """
    tail = stderr_tail(run.stderr)
    suffix = "; stderr: %s" % tail if tail else ""
    if run.returncode is None:
        raise ScriptError("%s: timed out after %gs (process group killed)%s"
                          % (label, timeout, suffix))
    if run.returncode < 0:
        raise ScriptError("%s: killed by signal %d%s" % (label, -run.returncode, suffix))
    if run.returncode != 0:
        answer = _decode(run.stdout)
        if isinstance(answer, dict) and answer.get("success") is False:
            said = answer.get("error") if isinstance(answer.get("error"), str) else ""
            answer["error"] = "%s: %s (exit status %d)%s" % (
                label, said or "failed", run.returncode, suffix)
            return answer  # a failure the script explained: keep its details
        raise ScriptError("%s: exited with status %d%s" % (label, run.returncode, suffix))
    answer = _decode(run.stdout)
    if not isinstance(answer, dict):
        text = run.stdout.decode("utf-8", "replace").strip()
        quoted = repr(text[:STDOUT_QUOTE] + ("..." if len(text) > STDOUT_QUOTE else ""))
        raise ScriptError("%s: answered no JSON object (stdout %s)%s"
                          % (label, quoted if text else "empty", suffix))
    return answer


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
