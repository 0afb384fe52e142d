"""What the client's helpers use of the connection they serve: the one interface between ``connection.py`` and
``credit.py``, ``lease.py`` and ``verify.py``.

A protocol rather than an import of ``connection.py``, which imports the credit writer. ``Connection``
implements it (``connection.py`` proves so to the type checker); the helpers touch nothing else of it, and nothing of
the Client.
"""

from __future__ import annotations

from typing import Any, Protocol

from .mappings import Mappings


class ConnectionPort(Protocol):
    """The connection's mappings, its request path and the raw one below it."""

    server_info: dict[str, Any]
    mapped: Mappings   # the arena (another object after a restart), its views and populators, the shared index

    @property
    def transport(self) -> Any:
        """Where requests go now (the stream socket, else ZeroMQ), bypassing the connection's retry and notes."""
        ...

    def request(self, header: dict[str, Any], payloads: list[Any] | None = None,
                retry: bool = True) -> tuple[dict[str, Any], list[Any]]:
        """Send one request once the queued put is settled, and wait for its reply, saying hello again (and
        retrying once when ``retry``) after a daemon restart."""
        ...

    def call(self, header: dict[str, Any], payloads: list[Any] | None = None,
             retry: bool = True) -> tuple[dict[str, Any], list[Any]]:
        """``request`` without settling the queued put first: for the credit writer, which settles it itself."""
        ...

    def send(self, header: dict[str, Any]) -> int:
        """Send one request of a pipelined batch without waiting; ``reply`` collects its answer."""
        ...

    def reply(self, rid: int) -> dict[str, Any]:
        """The reply header to the request ``rid`` sent by ``send``."""
        ...
