"""Real IPMI BMCs for tests: OpenIPMI's ``ipmi_sim`` (Debian package openipmi) on 127.0.0.1.

`SimFleet.start` runs one ``ipmi_sim`` process per BMC on a free UDP port,
with its own directory holding ``lan.conf`` (one admin user, IPMI 2.0
lanplus, the listening address), ``bmc.emu`` (the emulator commands that
create and enable the BMC's management controller) and ipmi_sim's state
dir. Chassis power is handled by ``chassis_control``: ipmi_sim runs
``chassis.sh`` (written here) with ``get power`` / ``set power 0|1`` /
``set shutdown 1`` (the soft-off request), and the script keeps the power
state in ``power`` and appends every set to ``chassis.log``, so that power
commands really change what ``chassis power status`` reports and tests can
see which command a BMC received. A soft off takes effect at once (no OS
here to shut down), unless `SimBmc.ignore_soft_off` made the host one whose
OS ignores it. With ``dcmi=True`` the BMC also loads
``ipmi_sim_dcmi.so`` (built from ``ipmi_sim_dcmi.c`` by `build_dcmi_plugin`),
which adds DCMI power limiting that plain ipmi_sim lacks and writes the limit
it holds to ``dcmi.state``. `SimFleet.stop` kills every process by its PID.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
PLUGIN_SOURCE = HERE / "ipmi_sim_dcmi.c"
USERNAME, PASSWORD = "admin", "ipmi-secret"
START_TIMEOUT_S = 20.0

CHASSIS_SCRIPT = """\
#!/bin/sh
# ipmi_sim chassis_control: POWER_FILE LOG_FILE get|set|check PARAM [VALUE] ...
power=$1; log=$2; op=$3; shift 3
case "$op" in
get)
    for param in "$@"; do
        case "$param" in
        power) if [ "$(cat "$power")" = on ]; then echo "power:1"; else echo "power:0"; fi ;;
        boot) echo "boot:none" ;;
        *) echo "$param:0" ;;
        esac
    done ;;
set)
    while [ $# -ge 2 ]; do
        echo "$1 $2" >> "$log"
        case "$1" in
        power) if [ "$2" = 1 ]; then echo on > "$power"; else echo off > "$power"; fi ;;
        shutdown) if [ "$2" = 1 ] && [ ! -e "$power.ignore-soft" ]; then
                      echo off > "$power"; fi ;;
        esac
        shift 2
    done ;;
check) ;;
*) exit 1 ;;
esac
"""

LAN_CONF = """\
name "{name}"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 {port}
    priv_limit admin
    allowed_auths_callback md5
    allowed_auths_user md5
    allowed_auths_operator md5
    allowed_auths_admin md5
    guid a123456789abcdefa123456789abcdef
  endlan
  chassis_control "/bin/sh {script} {power} {log}"
  user 2 true "{user}" "{password}" admin 10 md5
"""

EMU = """\
mc_setbmc 0x20
mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02
mc_enable 0x20
"""

# An RMCP/ASF presence ping (DMTF ASF 2.0): any IPMI LAN BMC answers it with a pong.
PRESENCE_PING = bytes([0x06, 0x00, 0xFF, 0x06, 0x00, 0x00, 0x11, 0xBE, 0x80, 0x01, 0x00, 0x00])


def require_tools() -> None:
    """RuntimeError naming what to install when ipmi_sim or ipmitool is missing."""
    missing = [tool for tool in ("ipmi_sim", "ipmitool") if shutil.which(tool) is None]
    if missing:
        raise RuntimeError("%s not found: run `bash tests/setup.sh` as root (it installs the "
                           "Debian packages openipmi and ipmitool)" % " and ".join(missing))


def build_dcmi_plugin(out_dir: Path) -> Path:
    """Compile ipmi_sim_dcmi.c into ``out_dir``; RuntimeError with the compiler's output."""
    target = out_dir / "ipmi_sim_dcmi.so"
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler: run `bash tests/setup.sh` as root (it installs gcc "
                           "and libopenipmi-dev)")
    proc = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-o", str(target),
                           str(PLUGIN_SOURCE)], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=120, check=False)
    if proc.returncode != 0:
        raise RuntimeError("building %s failed (libopenipmi-dev installed? run "
                           "tests/setup.sh):\n%s" % (PLUGIN_SOURCE.name,
                                                      proc.stdout.decode(errors="replace")))
    return target


def free_udp_port() -> int:
    """A UDP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers_ping(port: int, wait: float = 0.3) -> bool:
    """Whether something on 127.0.0.1:port answers an RMCP presence ping."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(wait)
        try:
            sock.sendto(PRESENCE_PING, ("127.0.0.1", port))
            data = sock.recv(512)
        except OSError:  # timeout, or ICMP port unreachable reported as refused
            return False
    return len(data) >= 9 and data[8] == 0x40  # ASF message type: presence pong


@dataclass
class SimBmc:
    """One running ipmi_sim: where it listens and the files that show its state."""

    name: str
    port: int
    directory: Path
    process: subprocess.Popen
    dcmi: bool

    @property
    def address(self) -> str:
        return "127.0.0.1:%d" % self.port

    @property
    def power_file(self) -> Path:
        return self.directory / "power"

    def power(self) -> str:
        """``on`` or ``off``, as the chassis script holds it."""
        return self.power_file.read_text().strip()

    def set_power(self, on: bool) -> None:
        """Change the power state behind the BMC's back (a host switched by hand)."""
        self.power_file.write_text("on\n" if on else "off\n")

    def ignore_soft_off(self) -> None:
        """From now on a soft off is logged and ignored (an OS that does not shut down)."""
        (self.directory / "power.ignore-soft").write_text("")

    def chassis_log(self) -> List[str]:
        """Every ``set`` the BMC passed to its chassis script, e.g. ``shutdown 1``."""
        path = self.directory / "chassis.log"
        return path.read_text().split("\n")[:-1] if path.exists() else []

    def dcmi_state(self) -> Dict[str, int]:
        """The DCMI limit the BMC holds: active, limit, correction, sample, action."""
        text = (self.directory / "dcmi.state").read_text()
        return {k: int(v) for k, v in (item.split("=") for item in text.split())}


class SimFleet:
    """The ipmi_sim processes of one test; `stop` kills them all by PID."""

    def __init__(self, root: Path, plugin: Optional[Path] = None) -> None:
        require_tools()
        self.root = root
        self.plugin = plugin
        self.bmcs: List[SimBmc] = []

    def start(self, name: str, *, power_on: bool = True, dcmi: bool = False,
              dcmi_min: int = 50, dcmi_max: int = 2000) -> SimBmc:
        """A new BMC answering on a free port (a few tries if the port is taken meanwhile)."""
        directory = self.root / name
        (directory / "state").mkdir(parents=True)
        if any(c.isspace() or c in "\"'\\" for c in str(directory)):
            raise RuntimeError("ipmi_sim's chassis_control command line cannot hold %r"
                               % str(directory))
        (directory / "chassis.sh").write_text(CHASSIS_SCRIPT)
        (directory / "power").write_text("on\n" if power_on else "off\n")
        (directory / "bmc.emu").write_text(EMU)
        last = ""
        for _attempt in range(3):
            port = free_udp_port()
            self._write_conf(name, directory, port, dcmi, dcmi_min, dcmi_max)
            process = self._spawn(directory)
            if self._wait_ready(process, port):
                bmc = SimBmc(name, port, directory, process, dcmi)
                self.bmcs.append(bmc)
                return bmc
            last = self._kill(process, directory)
        raise RuntimeError("ipmi_sim %s did not start: %s" % (name, last))

    def _write_conf(self, name: str, directory: Path, port: int, dcmi: bool,
                    dcmi_min: int, dcmi_max: int) -> None:
        conf = LAN_CONF.format(name=name, port=port, script=directory / "chassis.sh",
                               power=directory / "power", log=directory / "chassis.log",
                               user=USERNAME, password=PASSWORD)
        if dcmi:
            if self.plugin is None:
                raise RuntimeError("dcmi=True needs the fleet built with the DCMI plugin")
            conf += '  loadlib "%s" "state=%s min=%d max=%d"\n' % (
                self.plugin, directory / "dcmi.state", dcmi_min, dcmi_max)
        (directory / "lan.conf").write_text(conf)

    @staticmethod
    def _spawn(directory: Path) -> subprocess.Popen:
        with open(directory / "ipmi_sim.out", "ab") as out:
            return subprocess.Popen(
                ["ipmi_sim", "-n", "-c", str(directory / "lan.conf"), "-f",
                 str(directory / "bmc.emu"), "-s", str(directory / "state")],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=str(directory))

    @staticmethod
    def _wait_ready(process: subprocess.Popen, port: int) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return False
            if answers_ping(port):
                return True
            time.sleep(0.05)
        return False

    @staticmethod
    def _kill(process: subprocess.Popen, directory: Path) -> str:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        out = directory / "ipmi_sim.out"
        return out.read_text(errors="replace")[-2000:] if out.exists() else ""

    def stop(self) -> None:
        """Kill every BMC this fleet started (by PID) and reap it."""
        for bmc in self.bmcs:
            self._kill(bmc.process, bmc.directory)
        self.bmcs.clear()


def write_credentials(path: Path, username: str = USERNAME, password: str = PASSWORD,
                      hosts: Optional[Dict[str, Dict[str, str]]] = None) -> Path:
    """A credentials file as pbs_power wants it: JSON, mode 0600."""
    import json
    doc: Dict[str, object] = {"username": username, "password": password}
    if hosts:
        doc["hosts"] = hosts
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    os.chmod(str(path), 0o600)
    return path
