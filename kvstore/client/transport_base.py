"""What the ZeroMQ transport (``transport.py``) and the stream transport (``stream_transport.py``) share: request
ids, the table of replies filed for their waiters, the ids still waited on, and how a reply becomes a result or
the error it names. Each subclass sends and reads its own socket."""

from __future__ import annotations

import itertools
import threading
from typing import Any

from ..errors import DaemonUnavailable, error_from_code


class ConnectionLost(DaemonUnavailable):
    """The connection a request went out on closed before its reply came: the request may or may not have reached
    the daemon, and the daemon has dropped the session it held (``connection.py`` says hello again)."""


class RequestTransport:
    """Many requests in flight on one socket, replies matched by id (a base class: ``send``, ``wait`` and
    ``close`` are the socket's own)."""

    def __init__(self, address: str, timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._pending: dict[int, list[Any]] = {}   # replies received for an id someone still waits on
        self._outstanding: set[int] = set()         # ids sent and not yet given up on

    def send(self, header: dict[str, Any], payloads: list[Any] | None = None, timeout: float | None = None,
             want_reply: bool = True, hold: bool = False) -> int:
        """Send a request; return its id (a subclass's)."""
        raise NotImplementedError

    def wait(self, rid: int, timeout: float | None = None) -> tuple[dict[str, Any], list[Any]]:
        """Block until the reply to ``rid`` arrives; raise its error if it is an error reply (a subclass's)."""
        raise NotImplementedError

    def close(self) -> None:
        """Close the socket; idempotent (a subclass's)."""
        raise NotImplementedError

    def call(self, header: dict[str, Any], payloads: list[Any] | None = None,
             timeout: float | None = None) -> tuple[dict[str, Any], list[Any]]:
        """Send one request and wait for its reply."""
        return self.wait(self.send(header, payloads, timeout), timeout)

    def alive(self) -> bool:
        """Whether the daemon's end looks open; a transport that cannot tell says True."""
        return True

    @property
    def holding(self) -> bool:
        """Whether a held request waits for the next one to go out with (``send(hold=True)``)."""
        return False

    @staticmethod
    def _answer(reply: list[Any]) -> tuple[dict[str, Any], list[Any]]:
        """A reply's header and payloads, or the error it names (raised)."""
        header, payload = reply[0], reply[1:]
        if not header.get("ok"):
            raise error_from_code(int(header.get("code", 0)), str(header.get("msg", "")))
        return header, payload
