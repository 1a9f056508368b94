"""Slurm through its commands: ``sinfo --json``, ``squeue --json``, ``scontrol``.

Every command is an argv list run with a timeout, never through a shell;
the programs are found once, by absolute path, in ``bin_dir`` or PATH (a
safe default PATH when slurmctld gave none). Slurm 22.05's JSON is read, and
newer releases' shapes (state lists, ``{"set", "number"}`` numbers,
``scheduled_nodes``) are accepted too. Failures raise `SlurmError` with the
command and its first line of stderr.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from typing import Any, Dict, Iterable, List, Optional, Sequence

from .client import (SlurmClient, SlurmError, SlurmJob, SlurmNode, SlurmPowerConfig,
                    SlurmReservation, epoch, expand, fold, local_time, split_state,
                    state_words)

DEFAULT_TIMEOUT_S = 30.0
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_FIELD = re.compile(r"(\w+)=(.*?)(?=\s+\w+=|\s*$)")
_NO_VALUE = ("", "(null)", "N/A", "None")
#: scontrol appends who set a node's reason, and when: ``Reason=x [root@2026-11-22T18:23:37]``.
_REASON_BY = re.compile(r"\s*\[[^\]\s]*@[^\]\s]*\]$")


class CliClient(SlurmClient):
    """`SlurmClient` over sinfo, squeue and scontrol."""

    name = "cli"

    def __init__(self, bin_dir: Optional[str] = None, timeout: float = DEFAULT_TIMEOUT_S,
                 env: Optional[Dict[str, str]] = None):
        self.bin_dir = bin_dir
        self.timeout = timeout
        self.env = dict(os.environ if env is None else env)
        self._paths: Dict[str, str] = {}

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

    # -- the interface ----------------------------------------------------------------
    def nodes(self) -> List[SlurmNode]:
        try:
            return nodes_from_sinfo(self.run_json("sinfo", "--json"))
        except SlurmError as json_error:
            try:   # Slurm before 21.08 has no --json
                return nodes_from_scontrol(self.run("scontrol", "show", "node", "-o"))
            except SlurmError:
                raise json_error from None

    def jobs(self) -> List[SlurmJob]:
        doc = self.run_json("squeue", "--json")
        planned = None
        if any(j.get("job_state") == "PENDING" or j.get("job_state") == ["PENDING"]
               for j in doc.get("jobs") or ()) \
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


# -- parsers (pure; tested on outputs recorded from Slurm 22.05) ---------------------
def nodes_from_sinfo(doc: Dict[str, Any]) -> List[SlurmNode]:
    """Nodes of ``sinfo --json`` (22.05: ``state`` + ``state_flags``; later: a state list)."""
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
        state = j.get("job_state")
        state = str(state[0] if isinstance(state, list) and state else state or "").upper()
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
