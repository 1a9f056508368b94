"""``pbs-power exporter``: serve the stores' metrics over HTTP for Prometheus to scrape.

The hooks and Slurm programs are short-lived and run no server; they write
what happened to the state stores, and this one long-running process reads
those (read-only) on every scrape. Only this module imports
prometheus_client's HTTP side, so nothing a hook imports pulls it in.
"""
from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from typing import Callable, Iterator, Optional, Tuple
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

DEFAULT_PORT = 9850
DEFAULT_LISTEN = "127.0.0.1:%d" % DEFAULT_PORT
MISSING = ("the exporter needs the Python package prometheus_client: "
           "pip install prometheus_client (a dependency of pbs-power since the exporter)")


class ExporterError(Exception):
    """The exporter cannot start; the message says why and what to do."""


def require_client() -> None:
    """Raise ExporterError with the install line when prometheus_client is missing."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise ExporterError(MISSING) from None


def parse_listen(text: str) -> Tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT``, or a bare ``PORT`` on 127.0.0.1) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise ExporterError("--listen %r: the port must be a number (HOST:PORT)" % text) from None
    if not 0 <= number <= 65535:
        raise ExporterError("--listen %r: the port must be 0-65535" % text)
    return host, number


class StoreCollector:
    """A prometheus_client collector: every scrape reads the state directory afresh."""

    def __init__(self, state_dir: str, clock: Optional[Callable[[], float]] = None) -> None:
        from .readers import Reader
        self.reader = Reader(state_dir)
        self.clock = clock

    def collect(self) -> Iterator:
        from .families import families
        yield from families(self.reader.read(self.clock() if self.clock else None))

    def describe(self) -> Iterator:
        return iter(())   # families vary with the stores; never collect at registration


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args) -> None:  # one line per scrape is noise
        pass


def make_exporter(state_dir: str, listen: str = DEFAULT_LISTEN,
                  clock: Optional[Callable[[], float]] = None) -> WSGIServer:
    """A bound (not yet serving) HTTP server whose ``/metrics`` shows ``state_dir``."""
    require_client()
    from prometheus_client import CollectorRegistry, make_wsgi_app
    host, port = parse_listen(listen)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(state_dir, clock))
    app = make_wsgi_app(registry)
    try:
        return make_server(host, port, app, _Server6 if ":" in host else _Server,
                           handler_class=_QuietHandler)
    except OSError as exc:
        raise ExporterError("cannot listen on %s: %s" % (listen, exc.strerror or exc)) from None


def serve_in_thread(server: WSGIServer) -> threading.Thread:
    """Serve ``server`` from a daemon thread (tests, benchmarks); stop with shutdown()."""
    thread = threading.Thread(target=server.serve_forever, name="pbs-power-exporter",
                              daemon=True)
    thread.start()
    return thread


def address(server: WSGIServer) -> str:
    """``http://HOST:PORT/metrics`` of a bound server."""
    host, port = server.server_address[:2]
    return "http://%s:%d/metrics" % ("[%s]" % host if ":" in host else host, port)
