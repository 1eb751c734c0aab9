"""One HTTP port per process: Prometheus metrics and the kubelet's liveness and readiness probes.

``/metrics`` is the registry's exposition; ``/healthz`` answers 200 while ``live()`` is true
(the process's loops are running: a kubelet restarts the container otherwise) and ``/readyz``
while ``ready()`` is true (for the controller: its cache has synced, so it plans on the whole
cluster and not on whatever watch events happened to arrive first). Anything else is 404.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

__all__ = ["HealthServer"]

Probe = Callable[[], bool]


class HealthServer:
    """Serve ``/metrics``, ``/healthz`` and ``/readyz`` on ``port`` (0: any free port) in a
    daemon thread; :attr:`port` is the bound one."""

    def __init__(self, port: int, registry: CollectorRegistry, *, live: Probe,
                 ready: Probe, address: str = "0.0.0.0") -> None:
        probes = {"/healthz": live, "/readyz": ready}

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._answer(200, generate_latest(registry), CONTENT_TYPE_LATEST)
                elif path in probes:
                    ok = _safely(probes[path])
                    self._answer(200 if ok else 503, b"ok\n" if ok else b"not ok\n",
                                 "text/plain")
                else:
                    self._answer(404, b"not found\n", "text/plain")

            def _answer(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would drown the structured log

        self._server = ThreadingHTTPServer((address, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="health-http", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _safely(probe: Probe) -> bool:
    try:
        return bool(probe())
    except Exception:
        return False
