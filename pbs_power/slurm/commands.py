"""Slurm through its commands: ``scontrol --json``, ``sinfo --json``, ``squeue --json``.

Every command is an argv list run with a timeout, never through a shell;
the programs are found once, by absolute path, in ``bin_dir`` or PATH (a
safe default PATH when slurmctld gave none). Nodes come from the source the
release has: ``scontrol --json show node`` from 23.02 (whose ``sinfo --json``
groups nodes by state and drops their times), ``sinfo --json`` on 21.08 to
22.05, ``scontrol show node -o`` before. Slurm 22.05's JSON is read, and
newer releases' shapes (state lists, ``{"set", "number"}`` numbers,
``scheduled_nodes``) too. An empty node list from a cluster whose sinfo
lists nodes is an error, never "no nodes". Failures raise `SlurmError` with
the command and its first line of stderr.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .client import (SlurmClient, SlurmError, SlurmJob, SlurmNode, SlurmPowerConfig,
                    SlurmReservation, epoch, expand, fold, local_time, split_state,
                    state_words)

DEFAULT_TIMEOUT_S = 30.0
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_FIELD = re.compile(r"(\w+)=(.*?)(?=\s+\w+=|\s*$)")
_NO_VALUE = ("", "(null)", "N/A", "None")
#: scontrol appends who set a node's reason, and when: ``Reason=x [root@2026-11-22T18:23:37]``.
_REASON_BY = re.compile(r"\s*\[[^\]\s]*@[^\]\s]*\]$")
#: The first release whose ``scontrol`` prints JSON (and whose ``sinfo --json`` is grouped).
SCONTROL_JSON = (23, 2)
#: The first release whose ``sinfo`` and ``squeue`` print JSON.
SINFO_JSON = (21, 8)


class CliClient(SlurmClient):
    """`SlurmClient` over sinfo, squeue and scontrol."""

    name = "cli"

    def __init__(self, bin_dir: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT_S,
                 env: Optional[Dict[str, str]] = None):
        self.bin_dir = bin_dir
        self.timeout = timeout
        self.env = dict(os.environ if env is None else env)
        self._paths: Dict[str, str] = {}
        self._version: Optional[Tuple[int, ...]] = None

    # -- running commands -----------------------------------------------------------
    def program(self, name: str) -> str:
        """Absolute path of a Slurm command; SlurmError when it cannot be found."""
        if name not in self._paths:
            search = self.bin_dir or self.env.get("PATH") or SAFE_PATH
            found = shutil.which(name, path=search)
            if found is None:
                raise SlurmError("%s not found in %s; install the Slurm client commands or "
                                 "set the Slurm bin directory" % (name, search))
            self._paths[name] = os.path.abspath(found)
        return self._paths[name]

    def run(self, name: str, *args: str) -> str:
        """stdout of ``name args...``; SlurmError on a failure or timeout."""
        argv = [self.program(name)] + list(args)
        shown = " ".join([name] + list(args))
        try:
            proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, timeout=self.timeout,
                                  env=self.env, check=False)
        except subprocess.TimeoutExpired:
            raise SlurmError("%s: no answer within %gs (is slurmctld up?)"
                             % (shown, self.timeout)) from None
        except OSError as exc:
            raise SlurmError("%s: cannot run: %s" % (shown, exc.strerror or exc)) from None
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip().splitlines()
            raise SlurmError("%s exited %d: %s" % (shown, proc.returncode,
                                                   err[0] if err else "(no message)"))
        return proc.stdout.decode(errors="replace")

    def run_json(self, name: str, *args: str) -> Dict[str, Any]:
        text = self.run(name, *args)
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise SlurmError("%s %s printed invalid JSON: %s" % (name, " ".join(args), exc))
        if not isinstance(doc, dict):
            raise SlurmError("%s %s printed JSON that is not an object" % (name, " ".join(args)))
        return doc

    def version(self) -> Tuple[int, ...]:
        """Slurm's release as numbers, ``(24, 11, 5)``, from ``scontrol --version``."""
        if self._version is None:
            self._version = parse_version(self.run("scontrol", "--version"))
        return self._version

    def node_source(self) -> str:
        """The command nodes are read with on this release."""
        version = self.version()
        if version >= SCONTROL_JSON:
            return "scontrol --json show node"
        if version >= SINFO_JSON:
            return "sinfo --json"
        return "scontrol show node -o"

    # -- the interface ----------------------------------------------------------------
    def nodes(self) -> List[SlurmNode]:
        source = self.node_source()
        if source == "scontrol show node -o":
            nodes = nodes_from_scontrol(self.run("scontrol", "show", "node", "-o"))
        else:
            nodes = nodes_from_sinfo(self.run_json(*source.split()))
        if not nodes:
            listed = self.run("sinfo", "-h", "-N", "-o", "%N").split()
            if listed:
                raise SlurmError("%s listed no nodes, yet sinfo lists %d (%s): this Slurm's "
                                 "output is not understood; nothing is read as powered down"
                                 % (source, len(set(listed)), fold(sorted(set(listed)))))
        return nodes

    def jobs(self) -> List[SlurmJob]:
        doc = self.run_json("squeue", "--json")
        planned = None
        if any(job_state(j.get("job_state")) == "PENDING" for j in doc.get("jobs") or ()) \
                and not any("scheduled_nodes" in j for j in doc.get("jobs") or ()):
            # Slurm 22.05's JSON has no scheduled nodes: ask for them (SCHEDNODES).
            planned = scheduled_from_text(self.run("squeue", "-h", "-t", "PD", "-o", "%A|%Y"))
        return jobs_from_squeue(doc, planned)

    def reservations(self) -> List[SlurmReservation]:
        return reservations_from_scontrol(self.run("scontrol", "show", "reservation", "-o"))

    def power_config(self) -> SlurmPowerConfig:
        return power_config_from_scontrol(self.run("scontrol", "show", "config"))

    def update_nodes(self, nodes: Sequence[str], state: str, reason: str = "") -> None:
        args = ["update", "nodename=%s" % fold(nodes), "state=%s" % state]
        if reason:
            args.append("reason=%s" % reason)
        self.run("scontrol", *args)


# -- parsers (pure; tested on outputs recorded from Slurm 22.05 and 24.11) ------------
def parse_version(text: str) -> Tuple[int, ...]:
    """``slurm 24.11.5`` (or ``slurm-wlm 22.05.8``) -> ``(24, 11, 5)``; SlurmError if none."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    if not match:
        raise SlurmError("cannot tell Slurm's version from %r" % (text or "").strip()[:80])
    return tuple(int(g) for g in match.groups() if g is not None)


def nodes_from_sinfo(doc: Dict[str, Any]) -> List[SlurmNode]:
    """Nodes of ``scontrol --json show node`` or ``sinfo --json`` (any layout).

    22.05's sinfo: ``nodes`` with ``state`` + ``state_flags``; scontrol 23.02+:
    ``nodes`` with a state list; sinfo 23.02+: ``sinfo`` records grouped by state.
    """
    if "sinfo" in doc and not doc.get("nodes"):
        return nodes_from_sinfo_groups(doc)
    out: Dict[str, SlurmNode] = {}
    for n in doc.get("nodes") or ():
        name = str(n.get("name") or n.get("hostname") or "")
        if not name or name in out:
            continue
        words = n.get("state")
        words = list(words) if isinstance(words, list) else [str(words or "")]
        base, flags = split_state(words + list(n.get("state_flags") or ()))
        out[name] = SlurmNode(name, base, flags, epoch(n.get("last_busy")),
                              epoch(n.get("slurmd_start_time")), str(n.get("reason") or ""),
                              tuple(_as_list(n.get("partitions"))))
    return list(out.values())


def nodes_from_sinfo_groups(doc: Dict[str, Any]) -> List[SlurmNode]:
    """Nodes of 23.02+'s grouped ``sinfo --json``: states, reasons and partitions, no times."""
    out: Dict[str, SlurmNode] = {}
    for group in doc.get("sinfo") or ():
        base, flags = split_state(_as_list((group.get("node") or {}).get("state")))
        reason = group.get("reason")
        reason = str((reason.get("description") if isinstance(reason, dict) else reason) or "")
        partition = str((group.get("partition") or {}).get("name") or "")
        for name in expand((group.get("nodes") or {}).get("nodes")):
            node = out.get(name)
            parts = (node.partitions if node else ()) + ((partition,) if partition else ())
            out[name] = SlurmNode(name, base, flags, reason=reason,
                                  partitions=tuple(dict.fromkeys(parts)))
    return list(out.values())


def nodes_from_scontrol(text: str) -> List[SlurmNode]:
    """Nodes of ``scontrol show node -o`` (one line per node)."""
    out = []
    for line in text.splitlines():
        fields = dict(_FIELD.findall(line.strip()))
        if not fields.get("NodeName"):
            continue
        base, flags = split_state(state_words(fields.get("State", "")))
        out.append(SlurmNode(fields["NodeName"], base, flags,
                             local_time(fields.get("LastBusyTime", "")),
                             local_time(fields.get("SlurmdStartTime", "")),
                             _REASON_BY.sub("", _value(fields.get("Reason", ""))),
                             tuple(p for p in _value(fields.get("Partitions", "")).split(",") if p)))
    return out


def jobs_from_squeue(doc: Dict[str, Any],
                     planned: Optional[Dict[str, tuple]] = None) -> List[SlurmJob]:
    """Jobs of ``squeue --json``; ``planned`` adds scheduled nodes read separately."""
    out = []
    for j in doc.get("jobs") or ():
        jid = str(j.get("job_id", ""))
        if not jid:
            continue
        state = job_state(j.get("job_state"))
        nodes = j.get("nodes")
        if isinstance(nodes, dict):                      # not in 22.05
            nodes = nodes.get("allocation") or nodes.get("list")
        scheduled = expand(j.get("scheduled_nodes")) if "scheduled_nodes" in j else \
            (planned or {}).get(jid, ())
        out.append(SlurmJob(
            id=jid, state=state, nodes=expand(nodes) if state != "PENDING" else (),
            scheduled_nodes=tuple(scheduled), required_nodes=expand(j.get("required_nodes")),
            start_time=epoch(j.get("start_time")), reason=str(j.get("state_reason") or ""),
            partition=str(j.get("partition") or ""), comment=str(j.get("comment") or "")))
    return out


def job_state(value: Any) -> str:
    """One state of squeue's ``job_state``: a word, or 23.02+'s list of them.

    24.11 lists ``["RUNNING", "CONFIGURING", "POWER_UP_NODE"]`` for a job whose
    nodes are still booting: it waits for them, so it is CONFIGURING (as
    22.05 says), not RUNNING.
    """
    words = [str(w).upper() for w in (value if isinstance(value, list) else [value]) if w]
    if "CONFIGURING" in words or "POWER_UP_NODE" in words:
        return "CONFIGURING"
    return words[0] if words else ""


def scheduled_from_text(text: str) -> Dict[str, tuple]:
    """``JOBID|SCHEDNODES`` lines (``squeue -h -t PD -o %A|%Y``) -> {job id: nodes}."""
    out = {}
    for line in text.splitlines():
        jid, _, nodes = line.strip().partition("|")
        if jid and _value(nodes):
            out[jid] = expand(nodes)
    return out


def reservations_from_scontrol(text: str) -> List[SlurmReservation]:
    """Reservations of ``scontrol show reservation -o``."""
    out = []
    for line in text.splitlines():
        fields = dict(_FIELD.findall(line.strip()))
        start, end = local_time(fields.get("StartTime", "")), local_time(fields.get("EndTime", ""))
        if fields.get("ReservationName") and start is not None and end is not None:
            out.append(SlurmReservation(fields["ReservationName"], start, end,
                                        expand(_value(fields.get("Nodes", "")))))
    return out


def power_config_from_scontrol(text: str) -> SlurmPowerConfig:
    """SuspendExcNodes/Parts and Resume/SuspendTimeout of ``scontrol show config``."""
    conf: Dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            conf[key.strip()] = value.strip()
    return SlurmPowerConfig(
        suspend_exc_nodes=frozenset(expand(_value(conf.get("SuspendExcNodes", "")))),
        suspend_exc_parts=frozenset(p for p in _value(conf.get("SuspendExcParts", "")).split(",")
                                    if p),
        resume_timeout=_seconds(conf.get("ResumeTimeout")),
        suspend_timeout=_seconds(conf.get("SuspendTimeout")))


def _seconds(text: Optional[str]) -> Optional[int]:
    match = re.match(r"\s*(\d+)", text or "")
    return int(match.group(1)) if match else None


def _value(text: str) -> str:
    text = (text or "").strip()
    return "" if text in _NO_VALUE else text


def _as_list(value: Any) -> Iterable[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    return [p for p in str(value or "").split(",") if p]
