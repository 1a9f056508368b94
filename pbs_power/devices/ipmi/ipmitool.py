"""ipmitool, run against one BMC at a time, and its output turned into facts and diagnostics.

Every call is an argv list (never a shell) of the form ``ipmitool -v -I
lanplus -H ADDRESS -p PORT -U USER -E -C SUITE -N SECONDS -R RETRIES ...``:
the password travels only in the child's environment (``IPMI_PASSWORD``,
read by ``-E``), never in argv, which any local user can read with ``ps``.
``-v`` makes ipmitool say why a session failed (wrong password, unknown
user, refused cipher suite, no answer), which becomes a one-line diagnostic
for admins. Each call is killed after ``call_timeout`` seconds.

ipmitool's own no-answer time grows with ``-N`` and ``-R`` (measured with
ipmitool 1.8.19 against a closed port: -N 1 -R 1 gives up after 2 s, -N 2
-R 1 after 4 s, -N 1 -R 2 after 6 s, -N 3 -R 2 after 14 s; -R 0 means its
default and takes 20 s, so retries must be >= 1).

A DCMI power limit is set with one raw Set Power Limit carrying every field
(exception action, limit, correction time, sampling period): ipmitool's
``dcmi power set_limit`` changes one field and sends back the others as the
BMC stored them, so a stored "hard power off" action or an out-of-range
correction time would stay, or make every limit fail. Completion codes the
DCMI specification gives Set Power Limit (0x84 limit, 0x85 correction time,
0x89 sampling period out of range) are explained, not just shown.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from pbs_power.states.model import PowerState

CHASSIS_ACTIONS = ("on", "off", "soft", "cycle", "reset")
INTERFACES = ("lanplus", "lan")
PRIVILEGES = ("CALLBACK", "USER", "OPERATOR", "ADMINISTRATOR")

#: IPMI completion codes ipmitool names in words instead of hex.
_CODES_BY_TEXT = {
    "node busy": 0xC0, "invalid command": 0xC1, "timeout": 0xC3,
    "parameter out of range": 0xC9, "invalid data field in request": 0xCC,
    "insufficient privilege level": 0xD4,
    "command not supported in present state": 0xD5,
    "cannot execute command, command disabled": 0xD6,
}
#: Lines ``-v`` adds to every lanplus session; not errors.
_NOISE = re.compile(r"^(Loading IANA PEN Registry|Running Get VSO Capabilities|"
                    r"Discovered IPMB address|Get VSO Capabilities)")
_VSO_ANSWER = re.compile(r"^Invalid completion code received: ")
_DCMI_FAILED = re.compile(r"DCMI request failed because: (.*?) \(([0-9a-fA-F]{1,2})\)")
_FAILED_WITH_TEXT = re.compile(r"failed: (.+)$")
_POWER = re.compile(r"Chassis Power is (on|off)\b")
_LIMIT_STATE = re.compile(r"Current Limit State:\s*(.+)")
_LIMIT_WATTS = re.compile(r"Power Limit:\s*(\d+)\s*Watts")
_LIMIT_SAMPLE = re.compile(r"Sampling period:\s*(\d+)")
_RAW_FAILED = re.compile(r"Unable to send RAW command \(.*rsp=0x([0-9a-fA-F]{1,2})\)")
#: DCMI exception actions (Set Power Limit byte 5) by option value.
EXCEPTION_ACTIONS = {"none": 0x00, "hard_off": 0x01, "log": 0x11}
#: What Set Power Limit's own completion codes mean (DCMI 1.5, Set Power Limit).
SET_LIMIT_CODES = {
    0x84: "power limit %(watts)d W is out of the range this BMC accepts (it enforces a "
          "minimum or maximum limit): raise the cap, or set the node's min_watts to the "
          "BMC's minimum",
    0x85: "correction time %(correction)d ms is out of the range this BMC accepts: set "
          "option dcmi_correction_ms to one it accepts",
    0x89: "sampling period %(sample)d s is out of the range this BMC accepts",
}


@dataclass(frozen=True)
class Bmc:
    """Where a host's BMC answers IPMI over LAN."""

    host: str
    address: str
    port: int = 623
    username: str = ""
    password: str = field(default="", repr=False)

    @property
    def label(self) -> str:
        """``ipmi ADDRESS:PORT``, the prefix of every diagnostic about this BMC."""
        address = "[%s]" % self.address if ":" in self.address else self.address
        return "ipmi %s:%d" % (address, self.port)


@dataclass(frozen=True)
class Settings:
    """How to open IPMI sessions: interface, cipher suite, privilege, timeouts, program."""

    interface: str = "lanplus"
    cipher_suite: int = 17
    privilege: Optional[str] = None
    timeout: int = 2
    retries: int = 1
    call_timeout: float = 30.0
    ipmitool: str = "ipmitool"


@dataclass(frozen=True)
class Answer:
    """The outcome of one ipmitool call; ``diag`` is one line for admins, without the BMC."""

    ok: bool
    out: str = ""
    diag: str = ""
    reason: str = "ok"  # ok, auth, cipher, unreachable, unsupported, refused, error
    code: Optional[int] = None
    seconds: float = 0.0


@dataclass(frozen=True)
class LimitReading:
    """A BMC's DCMI power limit: the watts it holds and whether limiting is active."""

    watts: int
    active: bool
    sample: int = 0        # statistics sampling period (seconds) the BMC holds


class IpmiTool:
    """Runs ipmitool for one BMC per call (thread-safe: it keeps no state)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def argv(self, bmc: Bmc, args: Sequence[str]) -> List[str]:
        """The full ipmitool command line for ``args`` on ``bmc`` (no password in it)."""
        s = self.settings
        argv = [s.ipmitool, "-v", "-I", s.interface, "-H", bmc.address, "-p", str(bmc.port),
                "-U", bmc.username, "-E"]
        if s.interface == "lanplus":
            argv += ["-C", str(s.cipher_suite)]
        if s.privilege:
            argv += ["-L", s.privilege]
        return argv + ["-N", str(s.timeout), "-R", str(s.retries)] + list(args)

    def call(self, bmc: Bmc, args: Sequence[str], timeout: Optional[float] = None) -> Answer:
        """Run ipmitool ``args`` on ``bmc``, killed after ``timeout`` (call_timeout)."""
        limit = self.settings.call_timeout if timeout is None else min(
            timeout, self.settings.call_timeout)
        if limit <= 0:
            return Answer(False, diag="no time left for the call", reason="unreachable")
        env = dict(os.environ, IPMI_PASSWORD=bmc.password)
        start = time.monotonic()
        try:
            proc = subprocess.run(self.argv(bmc, args), env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  timeout=limit, check=False)
        except subprocess.TimeoutExpired:
            return Answer(False, diag="no answer within %gs (ipmitool killed): BMC unreachable "
                          "or too slow" % limit, reason="unreachable",
                          seconds=time.monotonic() - start)
        except OSError as exc:
            return Answer(False, diag="cannot run %s: %s (install the ipmitool package)"
                          % (self.settings.ipmitool, exc.strerror or exc), reason="error")
        seconds = time.monotonic() - start
        out = proc.stdout.decode("utf-8", "replace")
        err = proc.stderr.decode("utf-8", "replace")
        if proc.returncode == 0:
            return Answer(True, out, seconds=seconds)
        reason, diag, code = classify(out + "\n" + err, self.settings, bmc.username)
        return Answer(False, out, diag, reason, code, seconds)

    # -- chassis ---------------------------------------------------------------
    def power_state(self, bmc: Bmc, timeout: Optional[float] = None
                    ) -> Tuple[Optional[PowerState], Answer]:
        """The chassis power (ON/OFF), or None with the failed Answer."""
        return _read(self.call(bmc, ["chassis", "power", "status"], timeout),
                     parse_power, "chassis power status")

    def chassis(self, bmc: Bmc, action: str, timeout: Optional[float] = None) -> Answer:
        """``chassis power ACTION`` (on, off, soft, cycle, reset)."""
        if action not in CHASSIS_ACTIONS:
            raise ValueError("chassis action must be one of %s, not %r"
                             % (", ".join(CHASSIS_ACTIONS), action))
        return self.call(bmc, ["chassis", "power", action], timeout)

    # -- DCMI power limiting ------------------------------------------------------
    def get_limit(self, bmc: Bmc, timeout: Optional[float] = None
                  ) -> Tuple[Optional[LimitReading], Answer]:
        """The DCMI power limit, or None with the failed Answer."""
        return _read(_dcmi(self.call(bmc, ["dcmi", "power", "get_limit"], timeout)),
                     parse_limit, "dcmi power get_limit")

    def set_limit(self, bmc: Bmc, watts: int, deadline: Optional[float] = None,
                  correction_ms: int = 1000, action: str = "log") -> Answer:
        """Set the DCMI power limit to ``watts`` with our correction time and exception
        action (one raw Set Power Limit), and activate it."""
        reading, _answer = self.get_limit(bmc, _left(deadline))
        sample = reading.sample if reading is not None and reading.sample > 0 else 1
        args = ["raw", "0x2c", "0x04", "0xdc", "0x00", "0x00", "0x00",
                "0x%02x" % EXCEPTION_ACTIONS[action]]
        args += _bytes(int(watts), 2) + _bytes(int(correction_ms), 4) + ["0x00", "0x00"]
        args += _bytes(sample, 2)
        answer = _dcmi(self.call(bmc, args, _left(deadline)))
        if not answer.ok:
            return _explain(answer, {"watts": int(watts), "correction": int(correction_ms),
                                     "sample": sample})
        activated = _dcmi(self.call(bmc, ["dcmi", "power", "activate"], _left(deadline)))
        if not activated.ok and activated.code == 0x8A:  # "power limit already active"
            return Answer(True, activated.out, seconds=activated.seconds)
        return activated

    def deactivate_limit(self, bmc: Bmc, timeout: Optional[float] = None) -> Answer:
        """Deactivate DCMI power limiting (the node runs uncapped)."""
        return _dcmi(self.call(bmc, ["dcmi", "power", "deactivate"], timeout))


def _bytes(value: int, count: int) -> List[str]:
    """``value`` as ``count`` little-endian bytes in ipmitool raw's ``0x..`` form."""
    return ["0x%02x" % ((value >> (8 * i)) & 0xFF) for i in range(count)]


def _explain(answer: Answer, values: dict) -> Answer:
    """A refused Set Power Limit with what its completion code means."""
    text = SET_LIMIT_CODES.get(answer.code or -1)
    if answer.reason != "refused" or text is None:
        return answer
    return Answer(False, answer.out, "BMC refused the power limit: %s (DCMI completion code "
                  "0x%02x)" % (text % values, answer.code), "refused", answer.code,
                  answer.seconds)


def _left(deadline: Optional[float]) -> Optional[float]:
    return None if deadline is None else deadline - time.monotonic()


def _dcmi(answer: Answer) -> Answer:
    """Name an unsupported DCMI power-limit command as such."""
    if answer.ok or answer.reason != "refused" or answer.code not in (0xC1, 0xD6):
        return answer
    what = "does not support" if answer.code == 0xC1 else "has disabled"
    return Answer(False, answer.out, "BMC %s DCMI power limiting (completion code 0x%02x)"
                  % (what, answer.code), "unsupported", answer.code, answer.seconds)


def classify(text: str, settings: Settings, username: str) -> Tuple[str, str, Optional[int]]:
    """(reason, one-line diagnostic, completion code) for a failed ipmitool run."""
    lines = _meaningful(text)
    joined = "\n".join(lines)
    if "RAKP 2 HMAC is invalid" in joined:
        return "auth", "authentication failed: wrong password for user %r" % username, None
    if "unauthorized name" in joined:
        return "auth", "authentication failed: user %r unknown to the BMC" % username, None
    if "insufficient resources for session" in joined:
        return "refused", "BMC has no free session slot (insufficient resources)", None
    for marker in ("invalid authentication algorithm", "invalid integrity algorithm",
                   "invalid confidentiality algorithm", "no matching cipher suite"):
        if marker in joined:
            return "cipher", ("cipher suite %d refused by the BMC (%s); set cipher_suite to "
                              "one it offers" % (settings.cipher_suite, marker)), None
    if "Activate Session command failed" in joined:  # IPMI 1.5 (interface lan)
        return "auth", ("authentication failed: wrong password or unknown user %r (IPMI 1.5 "
                        "Activate Session refused)" % username), None
    if "Get Auth Capabilities" in joined or "No response from remote controller" in joined:
        return "unreachable", ("no answer from the BMC (ipmitool -N %d -R %d): unreachable, "
                               "wrong port or no IPMI over LAN there"
                               % (settings.timeout, settings.retries)), None
    code, what = _completion_code(lines)
    if code is not None:
        diag = "BMC refused the command: %s (completion code 0x%02x)" % (what, code)
        return "refused", diag, code
    return "error", "ipmitool failed: " + (" / ".join(lines[-2:]) or "no output"), None


def _completion_code(lines: Sequence[str]) -> Tuple[Optional[int], str]:
    """The completion code a failure names, in hex (DCMI) or in ipmitool's words."""
    for line in lines:
        match = _DCMI_FAILED.search(line)
        if match:
            return int(match.group(2), 16), match.group(1)
        match = _RAW_FAILED.search(line)
        if match:
            code = int(match.group(1), 16)
            names = {v: k for k, v in _CODES_BY_TEXT.items()}
            return code, names.get(code, "completion code 0x%02x" % code)
    for line in lines:
        match = _FAILED_WITH_TEXT.search(line)
        if match and match.group(1).strip().lower() in _CODES_BY_TEXT:
            return _CODES_BY_TEXT[match.group(1).strip().lower()], match.group(1).strip()
    return None, ""


def _meaningful(text: str) -> List[str]:
    """Output lines minus what ``-v`` prints on every session (its VSO probe included)."""
    out: List[str] = []
    after_vso = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or _NOISE.match(line) or (after_vso and _VSO_ANSWER.match(line)):
            after_vso = line.startswith("Running Get VSO")
            continue
        after_vso = False
        out.append(line)
    return out


def _first_line(text: str) -> str:
    lines = _meaningful(text)
    return lines[0] if lines else "(no output)"


def parse_limit(text: str) -> Optional[LimitReading]:
    """The limit in ``ipmitool dcmi power get_limit`` output, or None."""
    state, watts = _LIMIT_STATE.search(text), _LIMIT_WATTS.search(text)
    if state is None or watts is None:
        return None
    sample = _LIMIT_SAMPLE.search(text)
    return LimitReading(int(watts.group(1)), state.group(1).strip() == "Power Limit Active",
                        int(sample.group(1)) if sample else 0)


def parse_power(text: str) -> Optional[PowerState]:
    """ON or OFF from ``ipmitool chassis power status`` output, or None."""
    match = _POWER.search(text)
    if match is None:
        return None
    return PowerState.ON if match.group(1) == "on" else PowerState.OFF


def _read(answer: Answer, parse, what: str):
    """``(parse(answer.out), answer)``; an answer ``parse`` cannot read is a failure."""
    if not answer.ok:
        return None, answer
    value = parse(answer.out)
    if value is None:
        return None, Answer(False, answer.out, "unexpected answer to %s: %s"
                            % (what, _first_line(answer.out)), "error", seconds=answer.seconds)
    return value, answer
