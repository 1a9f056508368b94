"""A server of "another origin" for tests: it records every request and answers JSON.

It stands for a host a BMC's links or redirects might point at; a client
that keeps its credentials to the configured BMC sends it nothing, and the
tests check exactly that with `Recorder.seen`.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional

from .mock_bmc import Seen


class Recorder:
    """A 127.0.0.1 HTTP server of another origin: records every request, answers ``doc``."""

    def __init__(self, doc: Optional[Dict[str, Any]] = None) -> None:
        self.seen: List[Seen] = []
        self.doc = doc or {"@odata.id": "/elsewhere", "PowerState": "On", "Members": []}
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                recorder.seen.append(Seen(self.command, self.path, dict(self.headers.items()),
                                          raw.decode("utf-8", "replace")))
                data = json.dumps(recorder.doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-Auth-Token", "recorder-token")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.server.server_address[1]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
