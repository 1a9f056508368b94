"""Redfish power-state reads and resets over many emulated BMCs: one by one vs fanned out.

Starts --emulators sushy-tools Redfish emulators (HTTPS, basic auth; our
test extensions add power-limit resources and an optional per-request
--bmc-latency-ms, see tests/emulators/) serving --systems systems between
them, then times:

* state reads: the redfish device backend's ``ping`` request (PowerState and
  power cap) for every system, handled one after another vs sent as one
  batch through the `DeviceController` (concurrent, ``--max-workers``);
* resets: `RedfishBackend.request` (GET the system, POST ComputerSystem.Reset)
  with ``max_workers`` 1 vs ``--max-workers``, ForceOff then On each time
  (only the request calls are timed, not the wait for the new state).

Every system's cap resource is discovered once before timing. The emulators
are Python processes sharing this machine's CPUs, so the speedup is bounded
by them; real BMCs answer independently (try --bmc-latency-ms 100). Prints JSON.

    python benchmarks/bmc_fanout.py [--systems 64] [--emulators 4] [--bmc-latency-ms 0]
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from emulators.redfish_emulator import RedfishEmulator, make_tls, systems_for  # noqa: E402

from pbs_power.devices.controller import DeviceController, DeviceRequest  # noqa: E402
from pbs_power.devices.redfish.backend import RedfishBackend, RedfishDevices  # noqa: E402
from pbs_power.states.model import PowerState, TransitionKind  # noqa: E402

MODEL = json.dumps({"backend": "redfish", "node": {"min_watts": 100, "max_watts": 1000}})


def start_lab(work: str, systems: int, emulators: int, latency_ms: float):
    """The emulators, and backend options naming every system's BMC."""
    tls = make_tls(os.path.join(work, "tls"))
    cred = os.path.join(work, "cred.json")
    with open(cred, "w") as f:
        json.dump({"username": "admin", "password": "bench-pw"}, f)
    os.chmod(cred, 0o600)
    hosts = systems_for(["b%03d" % i for i in range(systems)])
    emus, bmcs = [], {}
    for e in range(emulators):
        share = hosts[e::emulators]
        caps = {s.chassis: {"style": "environment", "min": 100, "max": 1000} for s in share}
        emu = RedfishEmulator(os.path.join(work, "emu%d" % e), share, users={"admin": "bench-pw"},
                              tls=tls, caps=caps, latency_ms=latency_ms).start()
        emus.append(emu)
        bmcs.update({s.host: {"url": emu.url, "system_id": s.uuid} for s in share})
    options = {"bmcs": bmcs, "credentials_file": cred, "ca_file": tls.ca_file,
               "off_mode": "ForceOff", "poll_seconds": 0.2}
    return emus, [s.host for s in hosts], options


def ping(host: str) -> DeviceRequest:
    return DeviceRequest(host, "ping", {"retry_count": 0}, MODEL, None, "p-" + host, 60.0)


def time_reads(options: dict, hosts: list, workers: int) -> dict:
    devices = RedfishDevices(options)
    for host in hosts:  # discover each system's cap resource, open connections
        devices.handle(ping(host))
    begin = time.perf_counter()
    seq = [devices.handle(ping(h)) for h in hosts]
    sequential = time.perf_counter() - begin
    with DeviceController({"redfish": devices}, max_workers=workers) as ctl:
        begin = time.perf_counter()
        fan = ctl.send([ping(h) for h in hosts])
        concurrent = time.perf_counter() - begin
    ok = sum(r.success for r in seq), sum(r.success for r in fan.values())
    return {"sequential_s": round(sequential, 3), "concurrent_s": round(concurrent, 3),
            "speedup": round(sequential / concurrent, 2), "ok": list(ok)}


def time_resets(options: dict, hosts: list, workers: int, state_dir: str) -> dict:
    out = {}
    for label, width in (("sequential_s", 1), ("concurrent_s", workers)):
        backend = RedfishBackend(dict(options, max_workers=width), state_dir)
        backend.ping(hosts)  # connections open, systems found
        spent, ok = 0.0, 0
        for kind, want in ((TransitionKind.POWER_OFF, PowerState.OFF),
                           (TransitionKind.POWER_ON, PowerState.ON)):
            begin = time.perf_counter()
            results = backend.request(kind, hosts, time.time())
            spent += time.perf_counter() - begin
            ok += sum(r.ok and "sent" in r.diag for r in results.values())
            backend.fleet.map(lambda h: backend.fleet.wait_for(h, want, 60.0), hosts)
        backend.close()
        out[label] = round(spent, 3)
        out[label.replace("_s", "_resets_sent")] = ok
    out["speedup"] = round(out["sequential_s"] / out["concurrent_s"], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description="Time Redfish fan-out over emulated BMCs.")
    ap.add_argument("--systems", type=int, default=64)
    ap.add_argument("--emulators", type=int, default=4)
    ap.add_argument("--bmc-latency-ms", type=float, default=0.0)
    ap.add_argument("--max-workers", type=int, default=64)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        emus, hosts, options = start_lab(work, args.systems, args.emulators, args.bmc_latency_ms)
        try:
            reads = time_reads(options, hosts, args.max_workers)
            resets = time_resets(options, hosts, args.max_workers, os.path.join(work, "state"))
        finally:
            for emu in emus:
                emu.stop()
    print(json.dumps({"systems": args.systems, "emulators": args.emulators,
                      "bmc_latency_ms": args.bmc_latency_ms, "max_workers": args.max_workers,
                      "transport": "https + basic auth", "cpus": os.cpu_count(),
                      "state_read_ping": reads, "reset_request": resets}, indent=2))


if __name__ == "__main__":
    main()
