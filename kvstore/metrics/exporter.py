"""Serve ``/metrics`` over HTTP from a background thread (prometheus-client's own server).

The thread only formats what the registry yields; the store snapshot it needs is taken on the event loop by
the collector's snapshot function, so serving a scrape never races with a request.
"""

from __future__ import annotations

import errno
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
            raise ConfigError(self._bind_failure(exc)) from None

    def _bind_failure(self, exc: OSError) -> str:
        """One line naming the flag to change: the address (not on this host) or the port (in use, refused)."""
        where = f"{self.host}:{self.port}"
        if exc.errno == errno.EADDRNOTAVAIL:
            return (f"--metrics-host: {self.host} is not an address of this host, so /metrics cannot listen on "
                    f"{where}; give one of its addresses (127.0.0.1 by default)")
        if exc.errno == errno.EADDRINUSE:
            return (f"--metrics-port: cannot listen on {where}: another process listens there; choose another "
                    f"port, or 0 to turn metrics off")
        return (f"--metrics-port: cannot listen on {where}: {exc.strerror}; choose another port, or 0 to turn "
                f"metrics off")

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
