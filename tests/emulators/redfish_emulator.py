"""Start and stop real sushy-tools Redfish emulators (plus OUR extensions) for tests.

`RedfishEmulator` writes a sushy config (fake systems driver, fresh state
directory, optional htpasswd and TLS), starts ``sushy_launcher.py`` on
127.0.0.1 at a free port, waits until it answers and kills it by PID.
`make_tls` makes a CA and a server certificate for 127.0.0.1 with the
``cryptography`` package; `HungBmc` is a socket that accepts and never answers.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import requests

LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sushy_launcher.py")
START_TIMEOUT_S = 90.0


def free_port() -> int:
    """A TCP port nobody listens on right now (the emulator binds it next)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class System:
    """One emulated ComputerSystem with its own chassis."""

    host: str
    uuid: str
    chassis: str
    power_state: str = "On"


def systems_for(hosts: Sequence[str], power_state: str = "On") -> List[System]:
    """A System per host, uuids and chassis ids derived from the names."""
    return [System(h, str(uuid.uuid5(uuid.NAMESPACE_DNS, h + ".bmc.test")), h + "-chassis",
                   power_state) for h in hosts]


@dataclass(frozen=True)
class Tls:
    """File paths of a CA certificate and of a server certificate/key it signed."""

    ca_file: str
    cert_file: str
    key_file: str


def make_tls(directory: str, name: str = "bmc") -> Tls:
    """A fresh CA, and a server certificate for 127.0.0.1 signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "%s test CA" % name)])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                       False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    os.makedirs(directory, exist_ok=True)
    tls = Tls(*(os.path.join(directory, "%s-%s.pem" % (name, part))
                for part in ("ca", "cert", "key")))
    with open(tls.ca_file, "wb") as f:
        f.write(ca.public_bytes(serialization.Encoding.PEM))
    with open(tls.cert_file, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(tls.key_file, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.TraditionalOpenSSL,
                                  serialization.NoEncryption()))
    return tls


def write_htpasswd(path: str, users: Dict[str, str]) -> None:
    """An Apache-style user file with bcrypt digests (cheap rounds: tests only)."""
    import bcrypt
    with open(path, "w") as f:
        for user, password in users.items():
            digest = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()
            f.write("%s:%s\n" % (user, digest))


@dataclass
class RedfishEmulator:
    """A sushy-emulator process serving ``systems`` (see the module doc)."""

    workdir: str
    systems: Sequence[System]
    users: Optional[Dict[str, str]] = None
    tls: Optional[Tls] = None
    caps: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    ignore_graceful: Sequence[str] = ()
    faults: Sequence[Dict[str, Any]] = ()
    session_only: bool = False
    power_delay: int = 1
    latency_ms: float = 0.0
    port: int = 0
    proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return "%s://127.0.0.1:%d" % ("https" if self.tls else "http", self.port)

    def _write_config(self) -> str:
        state = os.path.join(self.workdir, "state")
        os.makedirs(state, exist_ok=True)
        config: Dict[str, Any] = {
            "SUSHY_EMULATOR_FAKE_DRIVER": True,
            "SUSHY_EMULATOR_STATE_DIR": state,
            "SUSHY_EMULATOR_LISTEN_IP": "127.0.0.1",
            "SUSHY_EMULATOR_FAKE_SYSTEMS": [
                {"uuid": s.uuid, "name": s.host, "power_state": s.power_state, "nics": []}
                for s in self.systems],
            "SUSHY_EMULATOR_CHASSIS": [
                {"Id": s.chassis, "Name": s.chassis, "UUID": str(uuid.uuid5(uuid.NAMESPACE_DNS,
                                                                          s.chassis))}
                for s in self.systems],
            "PBS_TEST_SYSTEM_CHASSIS": {s.uuid: s.chassis for s in self.systems},
            "PBS_TEST_CAPS": self.caps,
            "PBS_TEST_IGNORE_GRACEFUL": list(self.ignore_graceful),
            "PBS_TEST_FAULTS": list(self.faults),
            "PBS_TEST_SESSION_ONLY": self.session_only,
            "PBS_TEST_LATENCY_MS": self.latency_ms,
        }
        if self.users is not None:
            auth = os.path.join(self.workdir, "htpasswd")
            write_htpasswd(auth, self.users)
            config["SUSHY_EMULATOR_AUTH_FILE"] = auth
        if self.tls is not None:
            config["SUSHY_EMULATOR_SSL_CERT"] = self.tls.cert_file
            config["SUSHY_EMULATOR_SSL_KEY"] = self.tls.key_file
        path = os.path.join(self.workdir, "sushy.conf")
        with open(path, "w") as f:
            for key, value in config.items():
                f.write("%s = %r\n" % (key, value))
        return path

    def start(self) -> "RedfishEmulator":
        """Start the process and wait until its service root answers."""
        os.makedirs(self.workdir, exist_ok=True)
        config = self._write_config()
        for _attempt in range(3):  # a free port can be taken before we bind it
            self.port = free_port()
            log = open(os.path.join(self.workdir, "emulator.log"), "wb")
            argv = [sys.executable, LAUNCHER, "--power-delay", str(self.power_delay),
                    "--config", config, "--interface", "127.0.0.1", "--port", str(self.port)]
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.workdir)
            log.close()
            if self._wait_ready():
                self._warm_up()
                return self
            self.stop()
        raise RuntimeError("sushy-emulator did not start; its log:\n" + self.log_tail())

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                requests.get(self.url + "/redfish/v1/", timeout=2,
                             verify=self.tls.ca_file if self.tls else True)
                return True
            except requests.RequestException:
                time.sleep(0.1)
        return False

    def _warm_up(self) -> None:
        """Build sushy's drivers with one request first: built by many requests at once,
        they contend for their SQLite files and stall for seconds (sushy retries)."""
        auth = next(iter(self.users.items())) if self.users else None
        verify = self.tls.ca_file if self.tls else True
        for path in ["/redfish/v1/Systems", "/redfish/v1/Chassis", "/redfish/v1/Managers"] + [
                "/redfish/v1/Systems/" + s.uuid for s in self.systems[:1]]:
            requests.get(self.url + path, auth=auth, verify=verify, timeout=30)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            with open(os.path.join(self.workdir, "emulator.log"), "rb") as f:
                return f.read().decode(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Kill the process by its PID and reap it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


class HungBmc:
    """A 127.0.0.1 socket that accepts connections and never answers (a hung BMC)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.held: List[socket.socket] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.port

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.held.append(conn)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(timeout=5)
        for conn in self.held:
            conn.close()
        self.sock.close()


def closed_port_url() -> str:
    """A 127.0.0.1 URL nobody listens on (connection refused)."""
    return "http://127.0.0.1:%d" % free_port()


def tls_pair(directory: str) -> Tuple[Tls, Tls]:
    """Two unrelated CAs with their server certificates (trusted vs untrusted)."""
    return make_tls(directory, "trusted"), make_tls(directory, "other")
