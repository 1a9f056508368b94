"""Shared set-up of the allocator tests: clusters in state directories, servers, clients."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import websockets

from pbs_power.allocator.config import AllocatorConfig, ClusterSource
from pbs_power.allocator.server import AllocatorServer, ServerThread
from pbs_power.allocator.service import AllocatorService
from pbs_power.devices.simulated import SimulatedBackend
from pbs_power.states.model import TransitionKind
from pbs_power.groups.service import ResourceGroupService
from pbs_power.groups.topology import parse_topology

SEED_PAYLOAD = {"adhoc": True, "policy_rule_uri": "", "clusters": [], "inputs": {},
                "filter": {}, "search": {}, "parameters": {}, "settings": {}}

# rack-a holds 3 x 500 W (Low) of its 2000 W: 500 W headroom; rack-b 8500 W.
TOPOLOGY = {
    "name": "box-cluster",
    "device_specs": {"box": {"node": {"min_watts": 200, "idle_watts": 300, "max_watts": 1000},
                             "gpu": {"count": 4, "min_watts": 100, "max_watts": 300,
                                     "default_watts": 300}}},
    "power_domains": [{"name": "feed", "budget_watts": 100000, "children": [
        {"name": "rack-a", "budget_watts": 2000}, {"name": "rack-b", "budget_watts": 10000}]}],
    "policies": [{"name": "High", "limits": [{"element_type": "NODE", "power_limit": {"watts": 1000}}]},
                 {"name": "Low", "limits": [{"element_type": "NODE", "power_limit": {"watts": 500}},
                                            {"element_type": "GPU",
                                             "power_limit": {"percentage": 50}}]}],
    "default_policy": "Low",
    "entities": [{"names": "a[1-3]", "device": "box", "domain": "rack-a"},
                 {"names": "b[1-3]", "device": "box", "domain": "rack-b"}],
}


def make_cluster(state_dir: str, doc: Mapping[str, Any] = TOPOLOGY) -> str:
    """Import and activate ``doc`` in ``state_dir`` (simulated devices, no latency)."""
    svc = ResourceGroupService(state_dir, {"simulated": {"latency_ms": 0}})
    try:
        assert svc.import_topology(parse_topology(dict(doc))).ok
        assert svc.set_topology_active(True).status.ok
    finally:
        svc.close()
    return state_dir


def hook_config(path: str, hook_dir: str) -> str:
    """A hook config whose simulated power backend keeps its fleet in ``hook_dir``."""
    with open(path, "w") as f:
        json.dump({"state_dir": hook_dir, "power_backend": {"type": "simulated"}}, f)
    return path


def put_to_sleep(hook_dir: str, hosts: Sequence[str]) -> None:
    """Send hosts to sleep in the simulated fleet, long enough ago to be asleep now."""
    with SimulatedBackend({}, hook_dir) as backend:
        results = backend.request(TransitionKind.SLEEP, list(hosts), time.time() - 600)
    assert all(r.ok for r in results.values()), results


def write_policy(policy_dir: str, name: str, code: str, defaults: Optional[dict] = None) -> str:
    os.makedirs(policy_dir, exist_ok=True)
    path = os.path.join(policy_dir, name + ".py")
    with open(path, "w") as f:
        f.write(code)
    os.chmod(path, 0o644)
    if defaults is not None:
        with open(os.path.join(policy_dir, name + ".json"), "w") as f:
            json.dump(defaults, f)
    return path


def config(clusters: Sequence[ClusterSource], **kw: Any) -> AllocatorConfig:
    return AllocatorConfig(clusters=tuple(clusters), refresh_seconds=kw.pop("refresh_seconds", 0),
                           **kw)


@contextlib.contextmanager
def running(cfg: AllocatorConfig, eval_timeout: float = 60.0) -> Iterator[str]:
    """A server on a free local port; yields its ws:// URL."""
    server = AllocatorServer(AllocatorService(cfg), "127.0.0.1", 0, eval_timeout=eval_timeout)
    yield from _serving(server)


@contextlib.contextmanager
def serving(server: AllocatorServer) -> Iterator[str]:
    """``server`` on its own loop in a thread; yields its ws:// URL."""
    yield from _serving(server)


def _serving(server: AllocatorServer) -> Iterator[str]:
    thread = ServerThread(server)
    port = thread.start()
    try:
        yield "ws://127.0.0.1:%d" % port
    finally:
        thread.stop()


async def exchange(url: str, messages: Sequence[Any], timeout: float = 60.0) -> List[dict]:
    """Send each message on one connection (dicts as JSON), collecting each answer."""
    answers = []
    async with websockets.connect(url, open_timeout=30) as ws:
        for message in messages:
            await ws.send(json.dumps(message) if isinstance(message, dict) else message)
            answers.append(json.loads(await asyncio.wait_for(ws.recv(), timeout)))
    return answers


def ask(url: str, *messages: Any) -> List[dict]:
    return asyncio.run(exchange(url, messages))


def request(**fields: Any) -> Dict[str, Any]:
    """The seed's payload with some fields replaced."""
    return dict(SEED_PAYLOAD, **fields)


@contextlib.contextmanager
def http_service(routes: Dict[Tuple[str, str], Tuple[int, Any]],
                 delay: float = 0.0) -> Iterator[Tuple[str, list]]:
    """A JSON HTTP service on 127.0.0.1 answering ``(method, path) -> (status, body)``.

    Each answer comes after ``delay`` seconds.

    Yields (base URL, log of (method, path, body) received).
    """
    seen: list = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            path = self.path.split("?")[0]
            seen.append((method, self.path, body))
            time.sleep(delay)
            status, doc = routes.get((method, path), (404, {"error": "not found"}))
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._answer("GET")

        def do_POST(self) -> None:
            self._answer("POST")

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield "http://127.0.0.1:%d" % httpd.server_address[1], seen
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)
