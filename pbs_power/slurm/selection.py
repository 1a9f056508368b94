"""Which client reads Slurm: pyslurm where it works, Slurm's commands for the rest.

pyslurm is never imported in-process before a child process has imported it
and answered: libslurm ends the process (``fatal: Could not establish a
configuration source``, exit 1) when it finds no slurm.conf, and a pyslurm
built for another Slurm may crash on load; neither raises ImportError. When
the child says it works, each capability (nodes, jobs, reservations, power
settings) is served by pyslurm if that pyslurm release has it, else by the
commands (pyslurm 22.5 has no reservations and no power settings, for one).
`MixedClient.served` says which client served what, for ``pbs-power slurm
check`` and the log.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from .client import (SlurmClient, SlurmError, SlurmJob, SlurmNode, SlurmPowerConfig,
                     SlurmReservation, Unsupported)

PROBE_TIMEOUT_S = 30.0
CAPABILITIES = ("nodes", "jobs", "reservations", "power_config", "update_nodes")
# Run by a child Python: import pyslurm, say what it has (one JSON line).
_PROBE = """\
import json, pyslurm
holder = getattr(pyslurm, "slurmctld", None)
print(json.dumps({"version": str(getattr(pyslurm, "__version__", "") or ""),
                  "nodes": hasattr(getattr(pyslurm, "Nodes", None), "load"),
                  "jobs": hasattr(getattr(pyslurm, "Jobs", None), "load"),
                  "reservations": hasattr(getattr(pyslurm, "Reservations", None), "load"),
                  "power_config": hasattr(getattr(holder, "Config", None), "load"),
                  "update_nodes": hasattr(getattr(pyslurm, "Node", None), "modify")}))
"""


@dataclass(frozen=True)
class PyslurmProbe:
    """What a child process found when it imported pyslurm."""

    usable: bool
    why: str = ""                                   # why not, one line
    version: str = ""
    capabilities: Mapping[str, bool] = None         # type: ignore[assignment]


def probe_pyslurm(env: Optional[Mapping[str, str]] = None,
                  timeout: float = PROBE_TIMEOUT_S,
                  python: str = sys.executable) -> PyslurmProbe:
    """Import pyslurm in a child process and report; nothing is imported here."""
    if importlib.util.find_spec("pyslurm") is None:
        return PyslurmProbe(False, "pyslurm is not installed")
    try:
        proc = subprocess.run([python, "-c", _PROBE], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                              env=dict(os.environ if env is None else env), check=False)
    except subprocess.TimeoutExpired:
        return PyslurmProbe(False, "importing pyslurm took over %gs" % timeout)
    except OSError as exc:
        return PyslurmProbe(False, "cannot run %s: %s" % (python, exc.strerror or exc))
    if proc.returncode != 0:
        lines = proc.stderr.decode(errors="replace").strip().splitlines()
        return PyslurmProbe(False, "importing pyslurm ended its process with status %d: %s"
                            % (proc.returncode, lines[-1] if lines else "(no message)"))
    try:
        found = json.loads(proc.stdout.decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return PyslurmProbe(False, "pyslurm's probe printed no answer")
    caps = {c: bool(found.get(c)) for c in CAPABILITIES}
    return PyslurmProbe(True, "", str(found.get("version") or ""), caps)


class MixedClient(SlurmClient):
    """pyslurm for what it can do, the commands for the rest; `served` says which did what."""

    name = "pyslurm+cli"

    def __init__(self, primary: SlurmClient, fallback: SlurmClient,
                 capabilities: Mapping[str, bool]):
        self.primary, self.fallback = primary, fallback
        #: capability -> (client name, why that one); filled as capabilities are used.
        self.served: Dict[str, str] = {}
        self._use_fallback = {c for c in CAPABILITIES if not capabilities.get(c, False)}
        for cap in self._use_fallback:
            self.served[cap] = "%s (%s has none)" % (fallback.name, primary.name)

    def _serve(self, capability: str, call: Callable[[SlurmClient], Any]) -> Any:
        if capability not in self._use_fallback:
            try:
                result = call(self.primary)
            except Unsupported as exc:
                self._use_fallback.add(capability)
                self.served[capability] = "%s (%s: %s)" % (self.fallback.name,
                                                           self.primary.name, exc)
            else:
                self.served[capability] = self.primary.name
                return result
        return call(self.fallback)

    def nodes(self) -> List[SlurmNode]:
        return self._serve("nodes", lambda c: c.nodes())

    def jobs(self) -> List[SlurmJob]:
        return self._serve("jobs", lambda c: c.jobs())

    def reservations(self) -> List[SlurmReservation]:
        return self._serve("reservations", lambda c: c.reservations())

    def power_config(self) -> SlurmPowerConfig:
        return self._serve("power_config", lambda c: c.power_config())

    def update_nodes(self, nodes: Sequence[str], state: str, reason: str = "") -> None:
        self._serve("update_nodes", lambda c: c.update_nodes(nodes, state, reason))


def choose_client(prefer: str = "auto", log: Any = None,
                  probe: Optional[PyslurmProbe] = None, **options) -> SlurmClient:
    """The client for ``prefer`` (auto, cli, pyslurm); ``options`` go to the CLI client.

    ``auto`` uses pyslurm (with the commands for what it lacks) only when a
    child process imported it; otherwise the commands, with the reason logged.
    ``pyslurm`` raises SlurmError instead of falling back.
    """
    if prefer not in ("auto", "cli", "pyslurm"):
        raise ValueError("prefer must be auto, cli or pyslurm, not %r" % prefer)
    from .commands import CliClient
    cli = CliClient(**options)
    if prefer == "cli":
        return cli
    probe = probe or probe_pyslurm(cli.env)
    if not probe.usable:
        if prefer == "pyslurm":
            raise SlurmError("pyslurm cannot be used: %s; install the pbs-power[slurm] extra "
                             "built against your Slurm, or use the CLI" % probe.why)
        if log is not None and probe.why != "pyslurm is not installed":
            log.warning("reading Slurm through its commands: %s", probe.why)
        return cli
    import pyslurm
    from .pyslurm_client import PyslurmClient
    return MixedClient(PyslurmClient(pyslurm), cli, probe.capabilities)


def served_by(client: SlurmClient) -> Dict[str, str]:
    """capability -> the client that serves it (after the capabilities were used once)."""
    if isinstance(client, MixedClient):
        return {c: client.served.get(c, client.primary.name) for c in CAPABILITIES}
    return {c: client.name for c in CAPABILITIES}


def version_text(version: Sequence[int]) -> str:
    """``(22, 5, 8)`` -> ``22.05.8``, as Slurm writes its releases."""
    head = "%d.%02d" % tuple(version[:2]) if len(version) >= 2 else "%d" % version[0]
    return head + "".join(".%d" % v for v in version[2:])


def check_lines(client: SlurmClient, probe: Optional[PyslurmProbe] = None) -> List[str]:
    """What ``pbs-power slurm check`` prints: each capability used once, and who served it.

    Raises SlurmError for a capability that no client could serve.
    """
    from .commands import CliClient
    lines = []
    cli = client.fallback if isinstance(client, MixedClient) else client
    if isinstance(cli, CliClient):
        lines.append("Slurm %s; nodes read with %s"
                     % (version_text(cli.version()), cli.node_source()))
    if probe is not None:
        lines.append("pyslurm %s" % ("%s: used for what it has" % (probe.version or "(version?)")
                                     if probe.usable else "not used: " + probe.why))
    nodes = client.nodes()
    jobs = client.jobs()
    resvs = client.reservations()
    power = client.power_config()
    served = served_by(client)
    lines.append("nodes: %d (%s)" % (len(nodes), served["nodes"]))
    lines.append("jobs: %d (%s)" % (len(jobs), served["jobs"]))
    lines.append("reservations: %d (%s)" % (len(resvs), served["reservations"]))
    lines.append("power settings: ResumeTimeout=%s SuspendTimeout=%s SuspendExcNodes=%s "
                 "SuspendExcParts=%s (%s)" % (
                     power.resume_timeout, power.suspend_timeout,
                     ",".join(sorted(power.suspend_exc_nodes)) or "-",
                     ",".join(sorted(power.suspend_exc_parts)) or "-", served["power_config"]))
    lines.append("node state changes: %s" % served["update_nodes"])
    return lines
