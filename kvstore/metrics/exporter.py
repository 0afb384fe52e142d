"""Serve ``/metrics`` over HTTP from a background thread (prometheus-client's own server).

The thread only formats what the registry yields; the store snapshot it needs is taken on the event loop by
the collector's snapshot function, so serving a scrape never races with a request.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from ..errors import ConfigError


class MetricsExporter:
    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> None:
        try:
            self._server, self._thread = start_http_server(self.port, self.host, self.registry)
        except OSError as exc:
            raise ConfigError(f"--metrics-port: cannot listen on {self.host}:{self.port}: {exc.strerror}; "
                              f"choose another port or 0 to turn metrics off") from None

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
